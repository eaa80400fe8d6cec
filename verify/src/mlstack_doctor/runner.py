"""The one subprocess runner. It never raises: every outcome is a RunResult.

Every external call of the doctor goes through this module: `run()` for a command, `run_worker()` for a
worker script run once, `Background` for one started now and answered later, and `Session` for the
long-lived GPU worker that imports torch, Triton, transformers and FLA once and answers one request per
probe. A crash, a hang or a missing package in the stack under test can never take the doctor down.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WORKERS_DIR = Path(__file__).resolve().parent / "workers"
RESULT_MARKER = "@@MLSTACK_DOCTOR_RESULT@@"
PROGRESS_MARKER = "@@MLSTACK_DOCTOR_PROGRESS@@"

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
    preexec: Callable[[], None] | None = None,
) -> RunResult:
    """Run argv; map a missing binary, an OS error or a timeout to a RunResult instead of raising.
    `preexec` runs in the child before the program (the experiment raises resource limits there)."""
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
            preexec_fn=preexec,
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
        if self.run.rc < 0 and not self.run.not_found:
            try:
                name = signal.Signals(-self.run.rc).name
            except ValueError:
                name = f"signal {-self.run.rc}"
            last = [ln for ln in self.run.tail().splitlines() if ln.strip()][-3:]
            return f"worker killed by {name}" + (": " + " | ".join(last) if last else "")
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
    replace_env: bool = False,
    preexec: Callable[[], None] | None = None,
) -> WorkerResult:
    """Run workers/<script> with the interpreter under test; parse the one result line it prints.
    `env` is added to this process's environment, or is the whole environment with `replace_env`;
    `preexec` runs in the child first (see `run`)."""
    argv = [python or sys.executable, str(WORKERS_DIR / script), json.dumps(args)]
    full = {**env, "PYTHONUNBUFFERED": "1"} if replace_env and env is not None else _worker_env(env)
    res = run(argv, timeout=timeout, env=full, preexec=preexec)
    return WorkerResult(res, _answer(res.stdout))


def _worker_env(env: dict[str, str] | None) -> dict[str, str]:
    full_env = dict(os.environ)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    if env:
        full_env.update(env)
    return full_env


def _spawn(argv: list[str], env: dict[str, str] | None, *, stdin: int) -> subprocess.Popen:
    """A worker process: line-buffered text pipes (undecodable bytes replaced), the worker environment,
    and its own process group, so `_kill` also ends what it started."""
    return subprocess.Popen(
        argv,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        bufsize=1,
        env=_worker_env(env),
        start_new_session=True,
    )


def _answer(stdout: str) -> dict[str, Any]:
    """The last result line a worker printed, parsed; {} when there is none (it crashed first)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_MARKER):
            try:
                return json.loads(line[len(RESULT_MARKER) :])
            except json.JSONDecodeError:
                return {}
    return {}


def _kill(proc: subprocess.Popen) -> None:
    """Kill a worker and whatever it started (gcc, ptxas): it leads its own process group."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        try:
            proc.kill()
        except OSError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


class Background:
    """A worker script started now and answered later (triton_target runs beside the session's imports).

    `result()` waits until the worker's own deadline (counted from its start), then kills it.
    """

    def __init__(
        self, script: str, args: dict[str, Any], *, timeout: float, env: dict[str, str] | None = None
    ) -> None:
        self.argv = [sys.executable, str(WORKERS_DIR / script), json.dumps(args)]
        self.timeout = timeout
        self.start = time.monotonic()
        self._done: WorkerResult | None = None
        self.proc: subprocess.Popen | None = None
        try:
            self.proc = _spawn(self.argv, env, stdin=subprocess.DEVNULL)
        except FileNotFoundError as exc:
            self._done = WorkerResult(RunResult(self.argv, RC_NOT_FOUND, "", str(exc), 0.0, not_found=True))
        except OSError as exc:
            self._done = WorkerResult(RunResult(self.argv, RC_OS_ERROR, "", str(exc), 0.0, os_error=str(exc)))

    def result(self) -> WorkerResult:
        if self._done is not None or self.proc is None:
            return self._done or WorkerResult(RunResult(self.argv, RC_OS_ERROR, "", "not started", 0.0))
        left = max(0.0, self.timeout - (time.monotonic() - self.start))
        try:
            out, err = self.proc.communicate(timeout=left)
            res = RunResult(self.argv, self.proc.returncode, out, err, time.monotonic() - self.start)
        except subprocess.TimeoutExpired:
            _kill(self.proc)
            out, err = self.proc.communicate()
            res = RunResult(self.argv, RC_TIMEOUT, out or "", err or "", time.monotonic() - self.start, True)
        self._done = WorkerResult(res, _answer(res.stdout))
        return self._done

    def cancel(self) -> None:
        if self._done is None and self.proc is not None:
            _kill(self.proc)
            self.proc.communicate()
            self._done = WorkerResult(RunResult(self.argv, RC_OS_ERROR, "", "cancelled", 0.0))


class Session:
    """The long-lived GPU worker (workers/w_session.py): one JSON request per line on its stdin, one
    result line per request on its stdout, progress lines on its stderr.

    It starts with an `imports` request, so torch, Triton, transformers and FLA are imported once, while
    the doctor runs its CPU probes. Requests run one after the other; `call()` waits for the ones before
    it. A hang (past the request's deadline) or a death ends the session: `dead` says why and `died_in`
    which probe it was running, so the doctor can report that probe and skip the rest. Never raises.
    """

    STDERR_KEEP = 400_000  # characters of the worker's stderr kept for evidence

    def __init__(
        self,
        on_progress: Callable[[str], None] | None = None,
        env: dict[str, str] | None = None,
        *,
        python: str | None = None,
        script: str = "w_session.py",
    ):
        self.on_progress = on_progress
        self.env = env
        self.argv = [python or sys.executable, str(WORKERS_DIR / script)]
        self.proc: subprocess.Popen | None = None
        self.dead: str | None = None
        self.died_in: str | None = None
        self.imports: dict[str, Any] = {}
        self.started_at: float | None = None
        self._ids = itertools.count(1)
        self._answers: queue.Queue = queue.Queue()
        self._pending: list[tuple[int, str, float]] = []  # (id, probe, timeout) submitted, not yet answered
        self._got: dict[int, dict[str, Any]] = {}
        self._stdout: list[str] = []
        self._stderr: list[str] = []
        self._stderr_len = 0
        self._stderr_dropped = 0  # lines trimmed from the front
        self._lock = threading.Lock()
        self._stderr_reader: threading.Thread | None = None

    @property
    def started(self) -> bool:
        return self.proc is not None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self, imports_timeout: float) -> None:
        if self.proc is not None or self.dead:
            return
        self.started_at = time.monotonic()
        try:
            self.proc = _spawn(self.argv, self.env, stdin=subprocess.PIPE)
        except OSError as exc:
            self.dead = f"cannot start the GPU worker: {exc}"
            return
        threading.Thread(target=self._read_stdout, daemon=True).start()
        self._stderr_reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._stderr_reader.start()
        self.submit("imports", {}, probe="imports", timeout=imports_timeout)

    def _read_stdout(self) -> None:
        assert self.proc and self.proc.stdout
        for line in self.proc.stdout:
            if line.startswith(RESULT_MARKER):
                try:
                    data = json.loads(line[len(RESULT_MARKER) :])
                except json.JSONDecodeError:
                    data = {"ok": False, "error": "unreadable result line", "id": None}
                self._answers.put(data)
            elif line.strip():
                with self._lock:
                    self._stdout.append(line)
        self._answers.put(None)  # EOF: the worker is gone

    def _read_stderr(self) -> None:
        assert self.proc and self.proc.stderr
        for line in self.proc.stderr:
            if line.startswith(PROGRESS_MARKER):
                if self.on_progress:
                    self.on_progress(line[len(PROGRESS_MARKER) :].rstrip("\n"))
                continue
            with self._lock:
                self._stderr.append(line)
                self._stderr_len += len(line)
                while self._stderr_len > self.STDERR_KEEP and len(self._stderr) > 1:
                    self._stderr_len -= len(self._stderr.pop(0))
                    self._stderr_dropped += 1

    def _mark(self) -> tuple[int, int]:
        with self._lock:
            return len(self._stdout), self._stderr_dropped + len(self._stderr)

    def _since(self, mark: tuple[int, int]) -> tuple[str, str]:
        """What the worker printed since `mark` (stderr: what is left of it after trimming the front)."""
        with self._lock:
            err = self._stderr[max(0, mark[1] - self._stderr_dropped) :]
            return "".join(self._stdout[mark[0] :]), "".join(err)

    def submit(self, op: str, args: dict[str, Any], *, probe: str, timeout: float) -> int | None:
        if self.dead or self.proc is None or self.proc.stdin is None:
            return None
        rid = next(self._ids)
        try:
            self.proc.stdin.write(json.dumps({"id": rid, "op": op, "args": args}) + "\n")
            self.proc.stdin.flush()
        except (OSError, ValueError) as exc:
            self.dead = f"the GPU worker stopped reading requests: {exc}"
            return None
        self._pending.append((rid, probe, timeout))
        return rid

    def _wait(self, rid: int, deadline: float) -> dict[str, Any] | None:
        """The answer to request rid; None on EOF or when the deadline passes (then self.dead is set)."""
        while rid not in self._got:
            left = deadline - time.monotonic()
            if left <= 0:
                self.dead = "timeout"
                return None
            try:
                data = self._answers.get(timeout=left)
            except queue.Empty:
                self.dead = "timeout"
                return None
            if data is None:
                self.dead = "exited"
                return None
            self._got[data.get("id")] = data
        return self._got.pop(rid)

    def call(self, op: str, args: dict[str, Any], *, probe: str, timeout: float) -> WorkerResult:
        """Run one probe's request; wait for the requests before it (the imports) first."""
        if self.proc is None and not self.dead:
            self.start(imports_timeout=max(timeout, 300.0))
        t0 = time.monotonic()
        mark = self._mark()
        for rid, owner, limit in list(self._pending):  # earlier requests (the imports) first
            data = self._wait(rid, time.monotonic() + limit)
            self._pending.remove((rid, owner, limit))
            if data is None:
                return self._failed(probe, mark, t0, f"while the GPU worker ran {owner!r}")
            if owner == "imports":
                self.imports = data
        rid = self.submit(op, args, probe=probe, timeout=timeout)
        if rid is None:
            return self._failed(probe, mark, t0, "")
        t1 = time.monotonic()
        data = self._wait(rid, t1 + timeout)
        self._pending = [p for p in self._pending if p[0] != rid]
        if data is None:
            return self._failed(probe, mark, t0, "")
        out, err = self._since(mark)
        return WorkerResult(RunResult(self.argv, 0, out, err, time.monotonic() - t1), data)

    def _failed(self, probe: str, mark: tuple[int, int], t0: float, during: str) -> WorkerResult:
        self.died_in = probe
        timed_out = self.dead == "timeout"
        rc = RC_TIMEOUT
        if self.proc is not None:
            if timed_out:
                _kill(self.proc)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _kill(self.proc)
            code = self.proc.returncode
            rc = RC_TIMEOUT if timed_out else (code if code is not None else -1)
            # Its last words (a segfault's message) may still be in the pipe: read them before the
            # evidence is taken. A child that inherited the pipe may hold it open, hence the limit.
            if self._stderr_reader is not None:
                self._stderr_reader.join(timeout=5)
        out, err = self._since(mark)
        if during:
            err += f"\n[mlstack-doctor] {'timed out' if timed_out else 'died'} {during}\n"
        if self.dead and self.dead not in ("timeout", "exited"):
            err += f"\n[mlstack-doctor] {self.dead}\n"
        if self.dead in (None, "exited"):
            self.dead = f"exited with rc {rc}"
        run = RunResult(self.argv, rc, out, err, time.monotonic() - t0, timed_out=timed_out)
        return WorkerResult(run, {})

    def close(self) -> None:
        """Ask an idle worker to exit; kill a busy one (its answer is no longer wanted)."""
        if self.proc is None:
            return
        if self.proc.poll() is None and self._pending:
            _kill(self.proc)
        elif self.proc.poll() is None:
            try:
                if self.proc.stdin:
                    self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
                    self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                _kill(self.proc)
