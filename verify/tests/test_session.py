"""The long-lived GPU worker: one process, one answer per request; a crash or a hang is reported
against the probe that was running and the later session probes are skipped."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from doctor_testlib import run_doctor
from mlstack_doctor import engine, runner
from mlstack_doctor.context import Context, Options
from mlstack_doctor.probes import gpu
from mlstack_doctor.record import Result, Stage, Status, passed

FAKE = """
import json, os, sys, time
sys.stderr.write("@@MLSTACK_DOCTOR_PROGRESS@@started\\n"); sys.stderr.flush()
for line in sys.stdin:
    req = json.loads(line)
    op = req["op"]
    if op == "exit":
        break
    if op == "crash":
        sys.stderr.write("Segmentation fault in the stack\\n"); sys.stderr.flush()
        os._exit(139)
    if op == "hang":
        time.sleep(60)
    answer = {"id": req["id"], "ok": True, "op": op, "pid": os.getpid()}
    sys.stdout.write("\\n@@MLSTACK_DOCTOR_RESULT@@" + json.dumps(answer) + "\\n")
    sys.stdout.flush()
"""


@pytest.fixture
def fake(tmp_path: Path) -> str:
    script = tmp_path / "fake_session.py"
    script.write_text(FAKE)
    return str(script)  # absolute: WORKERS_DIR / script is then the script itself


def test_one_process_answers_every_request(fake: str) -> None:
    notes: list[str] = []
    s = runner.Session(on_progress=notes.append, script=fake)
    s.start(imports_timeout=30)
    a = s.call("torch_cuda", {}, probe="torch_cuda", timeout=30)
    b = s.call("fla_kernel", {}, probe="fla_kernel", timeout=30)
    assert a.ok and b.ok and a.data["op"] == "torch_cuda" and b.data["op"] == "fla_kernel"
    assert a.data["pid"] == b.data["pid"] == s.pid and s.imports["op"] == "imports"
    assert notes == ["started"]
    s.close()
    assert s.proc is not None and s.proc.returncode == 0


def test_crash_is_reported_against_the_running_probe(fake: str) -> None:
    s = runner.Session(script=fake)
    assert s.call("torch_cuda", {}, probe="torch_cuda", timeout=30).ok  # starts it lazily
    r = s.call("crash", {}, probe="fla_kernel", timeout=30)
    assert not r.answered and r.run.rc == 139 and "Segmentation fault" in r.run.stderr
    assert s.dead and s.died_in == "fla_kernel"
    later = s.call("torch_cuda", {}, probe="model_forward", timeout=30)
    assert not later.answered and s.died_in == "model_forward"


def test_a_crash_s_last_words_are_kept_when_stderr_is_read_late(
    fake: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a loaded machine the worker's exit can be seen (stdout's EOF) before its last stderr line is read:
    the segfault's message is the evidence, so the report waits for it."""
    read = runner.Session._read_stderr

    def late(self: runner.Session) -> None:
        time.sleep(0.5)
        read(self)

    monkeypatch.setattr(runner.Session, "_read_stderr", late)
    s = runner.Session(script=fake)
    r = s.call("crash", {}, probe="fla_kernel", timeout=30)
    assert r.run.rc == 139 and "Segmentation fault in the stack" in r.run.stderr


def test_hang_is_a_timeout_and_the_worker_is_killed(fake: str) -> None:
    s = runner.Session(script=fake)
    r = s.call("hang", {}, probe="gdn_backward", timeout=1.5)
    assert r.run.timed_out and r.run.rc == runner.RC_TIMEOUT and s.died_in == "gdn_backward"
    assert s.proc is not None and s.proc.poll() is not None


def test_engine_skips_the_session_probes_after_a_crash(fake: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def crashing(c: Context) -> Result:
        res = c.session.call("crash", {}, probe="a", timeout=30)  # type: ignore[union-attr]
        return gpu._fail("a", Stage.FLA, c, res, "FLA_KERNEL_FAILED", "crashed")

    probes = (
        engine.Probe("a", Stage.FLA, crashing, session=True),
        engine.Probe("b", Stage.MODEL, lambda c: passed("b", Stage.MODEL, "ok"), session=True),
        engine.Probe("c", Stage.TOOLCHAIN, lambda c: passed("c", Stage.TOOLCHAIN, "ok")),
    )
    monkeypatch.setattr(engine, "PROBES", probes)
    real = runner.Session
    monkeypatch.setattr(runner, "Session", lambda on_progress=None: real(script=fake))
    results = {r.name: r for r in engine.run(Context(Options()))}
    assert results["a"].status is Status.FAIL and results["a"].code == "PROBE_CRASHED"
    assert results["b"].status is Status.SKIP and results["b"].skipped_by == "a"
    assert "died in a (PROBE_CRASHED)" in results["b"].summary
    assert results["c"].status is Status.PASS


def test_background_worker_answers_later() -> None:
    bg = runner.Background("w_nvml.py", {}, timeout=60)
    res = bg.result()
    assert res.answered and res.run.duration_s >= 0
    missing = runner.Background("does_not_exist.py", {}, timeout=30).result()
    assert not missing.answered and missing.run.rc != 0


@pytest.mark.slow
def test_gpu_probes_run_in_the_session_for_real(torch_venv: Path) -> None:
    """torch (a CPU build here) in the real session worker: the probe fails with its code, and says
    which process and imports it used; model_config runs in the same session."""
    run = run_doctor("--only", "torch_cuda,model_config", python=str(torch_venv))
    p = run.probe("torch_cuda")
    assert p["code"] == "TORCH_NO_CUDA", p
    assert p["evidence"]["session"]["pid"] and p["evidence"]["session"]["imports_s"]["torch"] >= 0
    assert run.probe("model_config")["status"] == "pass"
