"""Which code a GPU-side probe names, given what its worker answered (the worker is the stubbed boundary;
the answers are the ones recorded on an H200: results/h200-2026-11-30-passthrough/doctor-fault-node.json)."""

from __future__ import annotations

from typing import Any

import pytest
from doctor_testlib import SRC  # noqa: F401  (puts the doctor's source on sys.path)
from mlstack_doctor import runner
from mlstack_doctor.context import Context, Options
from mlstack_doctor.probes import gpu

# What torch said on the H200 with /dev/nvidia-uvm hidden from the process.
UVM_HIDDEN_ANSWER = {
    "ok": False,
    "torch": "2.11.0+cu130",
    "torch_cuda": "13.0",
    "available": False,
    "error": "RuntimeError: CUDA unknown error - this may be due to an incorrectly set up environment, "
    "e.g. changing env variable CUDA_VISIBLE_DEVICES after program start. Setting the available devices "
    "to be zero.",
}


def _torch_cuda_with(monkeypatch: pytest.MonkeyPatch, answer: dict[str, Any], **facts: Any) -> Any:
    run = runner.RunResult(["w_torch_cuda.py"], 0, "", "", 0.4)
    monkeypatch.setattr(gpu, "call", lambda *a, **k: runner.WorkerResult(run, dict(answer)))
    ctx = Context(Options())
    ctx.facts.update(facts)
    return gpu.torch_cuda(ctx)


def test_cuda_failure_with_uvm_node_missing_names_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    result = _torch_cuda_with(monkeypatch, UVM_HIDDEN_ANSWER, uvm_missing=True)
    assert result.code == "NVIDIA_UVM_MISSING"
    assert "nvidia-uvm" in result.fix


def test_cuda_failure_with_all_nodes_stays_cuda_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _torch_cuda_with(monkeypatch, UVM_HIDDEN_ANSWER).code == "CUDA_UNAVAILABLE"


def test_cpu_only_torch_is_not_blamed_on_uvm(monkeypatch: pytest.MonkeyPatch) -> None:
    answer = {**UVM_HIDDEN_ANSWER, "torch_cuda": None, "error": "AssertionError: no CUDA"}
    assert _torch_cuda_with(monkeypatch, answer, uvm_missing=True).code == "TORCH_NO_CUDA"
