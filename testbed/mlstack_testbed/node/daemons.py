"""The testbed's own processes: started detached, tracked by pidfile, stopped only by that PID."""

import os
import signal
import subprocess
import time
from pathlib import Path

from .. import paths


def pid_of(pidfile: Path, marker: str) -> int | None:
    """The PID in pidfile if that process is alive and its command line contains marker."""
    try:
        pid = int(pidfile.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, ValueError):
        return None
    return pid if marker in cmdline else None


def spawn(argv: list[str], pidfile: Path, log: Path, env: dict[str, str] | None = None) -> int:
    paths.RUN_DIR.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        p = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            cwd="/",
        )
    pidfile.write_text(f"{p.pid}\n")
    return p.pid


def stop(pidfile: Path, marker: str, timeout: float = 15) -> int | None:
    """SIGTERM the recorded process (SIGKILL after timeout); returns the PID stopped, if any."""
    pid = pid_of(pidfile, marker)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists() and not is_zombie(pid):
            time.sleep(0.1)
        if Path(f"/proc/{pid}").exists() and not is_zombie(pid):
            os.kill(pid, signal.SIGKILL)
    pidfile.unlink(missing_ok=True)
    return pid


def is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return True
