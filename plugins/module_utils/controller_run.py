"""A command on the controller, as the command module would run it, for action plugins that run tools
there in process (uv builds and lock checks): the result as (rc, stdout, stderr), never an exception."""

from __future__ import annotations

import os
import subprocess


def run_command(
    argv: list[str], env: dict[str, str] | None = None, timeout: int = 300
) -> tuple[int, str, str]:
    """Run `argv` with the controller's environment plus `env`; a missing tool is rc 127, a timeout 124."""
    try:
        p = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env={**os.environ, **(env or {})},
            timeout=timeout,
            check=False,
        )
    except OSError as e:
        return 127, "", f"{argv[0]}: {e.strerror or e}"
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]}: timed out after {timeout} s"
    return p.returncode, p.stdout, p.stderr
