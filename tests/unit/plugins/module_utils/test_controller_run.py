"""module_utils/controller_run: a controller command's result, never an exception."""

from __future__ import annotations

import sys

from ansible_collections.mlstack.pve.plugins.module_utils.controller_run import run_command


def test_the_output_and_the_given_environment_reach_the_caller() -> None:
    code = "import os, sys; print(os.environ['MLSTACK_X']); sys.stderr.write('e'); sys.exit(3)"
    assert run_command([sys.executable, "-c", code], {"MLSTACK_X": "seen"}) == (3, "seen\n", "e")


def test_a_missing_tool_is_rc_127_with_its_name() -> None:
    rc, out, err = run_command(["/nonexistent/uv", "build"])
    assert (rc, out) == (127, "") and err.startswith("/nonexistent/uv: ") and "No such file" in err


def test_a_hung_tool_is_rc_124_after_the_timeout() -> None:
    assert run_command([sys.executable, "-c", "import time; time.sleep(5)"], timeout=1) == (
        124,
        "",
        f"{sys.executable}: timed out after 1 s",
    )
