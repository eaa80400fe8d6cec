"""One subprocess runner for the testbed: bounded in time, never raises for a failed command."""

import subprocess
import sys
from collections.abc import Sequence
from typing import NamedTuple


# A NamedTuple, not a dataclass: `pct exec` imports this on every call, and dataclasses costs it ~10 ms.
class Result(NamedTuple):
    rc: int
    out: str
    err: str

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def detail(self) -> str:
        """The last lines of stderr, else stdout: the evidence of a failure."""
        text = (self.err or self.out).strip().splitlines()
        return "\n".join(text[-8:])


def run(
    argv: Sequence[str],
    timeout: float = 120,
    input_text: str | None = None,
    env: dict[str, str] | None = None,
) -> Result:
    """Run argv; rc 124 on timeout, 127 when the program is missing."""
    try:
        p = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input_text,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        return Result(124, _text(e.stdout), _text(e.stderr) + f"\ntimed out after {timeout}s: {argv[0]}")
    except FileNotFoundError:
        return Result(127, "", f"{argv[0]}: command not found")
    return Result(p.returncode, p.stdout, p.stderr)


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode(errors="replace")


def say(msg: str) -> None:
    """Progress for the human running the testbed (stderr, unbuffered)."""
    print(f"testbed: {msg}", file=sys.stderr, flush=True)


def report_up(already: list[str], done: list[str], summary: str) -> None:
    """What an idempotent `up` found in place and what it started or made, then its one-line summary."""
    for item in already:
        print(f"already up: {item}")
    for item in done:
        print(f"started/made: {item}")
    print(summary)
