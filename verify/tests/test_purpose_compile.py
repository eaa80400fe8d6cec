"""The container's purpose decides what a refused backward means, and torch.compile is checked against
eager: its probe's codes from the worker's answers (the stubbed boundary; the refusal text is FLA's own,
as raised on an H200), and the worker itself compiling for real with inductor on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from doctor_testlib import SRC, run_doctor
from mlstack_doctor import runner
from mlstack_doctor.context import Context, Options
from mlstack_doctor.probes import gpu
from mlstack_doctor.record import Result, Stage, Status, passed
from mlstack_doctor.workers._common import RESULT_MARKER

# FLA 0.5.1 over triton 3.6.0 on an H200, 2026-11-30 (0.5.2 and 0.6.0 say "< 3.7.1" in the same place).
HOPPER_REFUSAL = (
    "RuntimeError: Triton >= 3.4.0 on Hopper GPUs produces incorrect results for gated chunk_bwd_dqkwg "
    "(see #640). Please install tilelang: pip install tilelang"
)


def _probe_with(monkeypatch: pytest.MonkeyPatch, fn: Any, answer: dict[str, Any], **opts: Any) -> Result:
    run = runner.RunResult(["w_session.py"], 0, "", "", 0.4)
    monkeypatch.setattr(gpu, "call", lambda *a, **k: runner.WorkerResult(run, dict(answer)))
    ctx = Context(Options(**opts))
    ctx.results["torch_triton_pin"] = passed(
        "torch_triton_pin", Stage.PACKAGES, "pinned", torch_pins_triton="3.6.0"
    )
    result: Result = fn(ctx)
    return result


@pytest.mark.parametrize(
    ("purpose", "status"), [("training", Status.FAIL), ("inference", Status.WARN), (None, Status.FAIL)]
)
def test_refused_backward_follows_the_purpose(
    monkeypatch: pytest.MonkeyPatch, purpose: str | None, status: Status
) -> None:
    opts = {"purpose": purpose} if purpose else {}  # None: the default, training
    result = _probe_with(monkeypatch, gpu.gdn_backward, {"ok": False, "error": HOPPER_REFUSAL}, **opts)
    assert result.status is status
    assert result.code == "FLA_BACKWARD_NEEDS_TILELANG"


def test_refused_backward_fix_names_both_cures_and_their_profiles(monkeypatch: pytest.MonkeyPatch) -> None:
    fix = _probe_with(monkeypatch, gpu.gdn_backward, {"ok": False, "error": HOPPER_REFUSAL}).fix or ""
    assert "triton >= 3.7.1" in fix and "FLA >= 0.5.2" in fix
    assert "torch211-triton37-fla06" in fix  # the profile that gives the first cure
    assert "tilelang" in fix and "extras: [hopper]" in fix  # the second, and where it comes from


def test_other_backward_errors_are_not_excused_by_inference(monkeypatch: pytest.MonkeyPatch) -> None:
    answer = {"ok": False, "error": "RuntimeError: CUDA error: misaligned address"}
    result = _probe_with(monkeypatch, gpu.gdn_backward, answer, purpose="inference")
    assert (result.status, result.code) == (Status.FAIL, "FLA_KERNEL_FAILED")


def test_compile_mismatch_is_its_own_code(monkeypatch: pytest.MonkeyPatch) -> None:
    answer = {"ok": True, "mismatch": True, "rel_err": 0.4, "tol": 0.02, "triton": "3.7.1"}
    result = _probe_with(monkeypatch, gpu.torch_compile, answer)
    assert (result.status, result.code) == (Status.FAIL, "TORCH_COMPILE_MISMATCH")
    assert "triton==3.6.0" in (result.fix or "")  # torch's own pin, as the packages probe read it


def test_compile_error_names_torch_pin(monkeypatch: pytest.MonkeyPatch) -> None:
    answer = {"ok": False, "error": "BackendCompilerFailed: backend='inductor' raised: AttributeError: x"}
    result = _probe_with(monkeypatch, gpu.torch_compile, answer)
    assert (result.status, result.code) == (Status.FAIL, "TORCH_COMPILE_FAILED")
    assert "triton==3.6.0" in (result.fix or "")


def _compile_worker(python: Path, env: dict[str, str]) -> dict[str, Any]:
    script = SRC / "mlstack_doctor" / "workers" / "w_compile.py"
    proc = subprocess.run(
        [str(python), str(script), json.dumps({"device": "cpu"})],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_MARKER)), None)
    assert line, f"no result from the worker (rc {proc.returncode}): {proc.stderr[-2000:]}"
    data: dict[str, Any] = json.loads(line[len(RESULT_MARKER) :])
    return data


def test_compile_worker_matches_eager_for_real(torch_venv: Path) -> None:
    """Inductor really generates and compiles code here (C++ on the CPU; Triton on a GPU)."""
    data = _compile_worker(torch_venv, dict(os.environ))
    assert data["ok"], data.get("error")
    assert data["mismatch"] is False and data["rel_err"] <= data["tol"]
    assert data["kernels_generated"] >= 1  # a fresh inductor cache: code was generated, not reused


def test_compile_worker_reports_a_broken_compiler_for_real(torch_venv: Path) -> None:
    """Inductor's CPU backend builds with $CXX: a compiler that cannot run breaks torch.compile."""
    data = _compile_worker(torch_venv, {**os.environ, "CXX": "/nonexistent/g++"})
    assert data["ok"] is False
    assert "InvalidCxxCompiler" in data["error"]


def test_purpose_is_in_the_report() -> None:
    run = run_doctor("--no-gpu", "--only", "c_compiler", "--purpose", "inference")
    assert run.rc == 0
    assert run.report["options"]["purpose"] == "inference"
    assert run_doctor("--no-gpu", "--purpose", "testing").rc == 2  # argparse refuses other purposes
