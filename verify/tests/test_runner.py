from __future__ import annotations

import sys

from mlstack_doctor import runner


def test_missing_binary_never_raises() -> None:
    res = runner.run(["/nonexistent/binary-xyz"])
    assert res.not_found and res.rc == runner.RC_NOT_FOUND and not res.ok


def test_timeout_never_raises() -> None:
    res = runner.run([sys.executable, "-c", "import time; time.sleep(5)"], timeout=0.5)
    assert res.timed_out and res.rc == runner.RC_TIMEOUT


def test_rc_and_streams() -> None:
    res = runner.run([sys.executable, "-c", "import sys; print('out'); sys.stderr.write('err'); sys.exit(3)"])
    assert (res.rc, res.stdout.strip(), res.stderr) == (3, "out", "err")
    assert res.tail() == "err"


def test_permission_denied_binary(tmp_path) -> None:
    script = tmp_path / "x.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    res = runner.run([str(script)])
    assert res.rc == runner.RC_OS_ERROR and not res.ok


def test_worker_answer_and_crash() -> None:
    ok = runner.run_worker("w_nvml.py", {}, timeout=60)
    assert ok.answered  # the worker always answers: ok, or its error (no NVML here)
    assert ok.ok or "nvml" in ok.error_text.lower() or "libnvidia-ml" in ok.error_text
    crash = runner.run_worker("does_not_exist.py", {}, timeout=30)
    assert not crash.answered and crash.run.rc != 0 and crash.error_text
