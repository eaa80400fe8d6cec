"""The one subprocess runner. It never raises: every outcome is an RunResult.

Every external call of the doctor goes through `run()`; the GPU work runs as worker scripts through
`run_worker()`, so a crash, a hang or a missing package in the stack under test can never take the
doctor down with it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WORKERS_DIR = Path(__file__).resolve().parent / "workers"
RESULT_MARKER = "@@MLSTACK_DOCTOR_RESULT@@"

# rc values for outcomes that are not an exit status of the program itself.
RC_NOT_FOUND = 127
RC_TIMEOUT = 124
RC_OS_ERROR = 126


@dataclass
class RunResult:
    argv: list[str]
    rc: int
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    not_found: bool = False
    os_error: str | None = None

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.timed_out

    def tail(self, limit: int = 4000) -> str:
        """The last part of stderr (then stdout), where the real error text sits."""
        text = (self.stderr or "").strip() or (self.stdout or "").strip()
        return text[-limit:]


def run(
    argv: list[str],
    *,
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    stdin_text: str | None = None,
) -> RunResult:
    """Run argv; map a missing binary, an OS error or a timeout to a RunResult instead of raising."""
    start = time.monotonic()
    try:
        proc = subprocess.run(
            argv,
            input=stdin_text,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            env=env,
            cwd=cwd,
        )
    except FileNotFoundError as exc:
        return RunResult(argv, RC_NOT_FOUND, "", str(exc), time.monotonic() - start, not_found=True)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return RunResult(argv, RC_TIMEOUT, out, err, time.monotonic() - start, timed_out=True)
    except OSError as exc:  # permission denied on the binary, exec format error, ...
        return RunResult(argv, RC_OS_ERROR, "", str(exc), time.monotonic() - start, os_error=str(exc))
    return RunResult(argv, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)


@dataclass
class WorkerResult:
    """A worker script's outcome: its own JSON answer when it got that far, plus the raw run."""

    run: RunResult
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def answered(self) -> bool:
        return bool(self.data)

    @property
    def ok(self) -> bool:
        return self.answered and bool(self.data.get("ok"))

    @property
    def error_text(self) -> str:
        """The exception the worker caught (type: message), else the tail of its stderr."""
        if self.data.get("error"):
            return str(self.data["error"])
        if self.run.timed_out:
            return f"timed out after {self.run.duration_s:.0f} s"
        return self.run.tail()

    def evidence(self) -> dict[str, Any]:
        ev: dict[str, Any] = {"worker_rc": self.run.rc, "worker_s": round(self.run.duration_s, 2)}
        if self.run.timed_out:
            ev["timed_out"] = True
        if self.data.get("error"):
            ev["exception"] = self.data["error"]
        if not self.ok:
            tail = self.run.tail(2500)
            if tail:
                ev["stderr_tail"] = tail
        return ev


def run_worker(
    script: str,
    args: dict[str, Any],
    *,
    timeout: float,
    python: str | None = None,
    env: dict[str, str] | None = None,
) -> WorkerResult:
    """Run workers/<script> with the interpreter under test; parse the one result line it prints."""
    argv = [python or sys.executable, str(WORKERS_DIR / script), json.dumps(args)]
    full_env = dict(os.environ)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    if env:
        full_env.update(env)
    res = run(argv, timeout=timeout, env=full_env)
    data: dict[str, Any] = {}
    for line in reversed(res.stdout.splitlines()):
        if line.startswith(RESULT_MARKER):
            try:
                data = json.loads(line[len(RESULT_MARKER) :])
            except json.JSONDecodeError:
                data = {}
            break
    return WorkerResult(res, data)
