"""On a real CUDA GPU only (skipped cleanly elsewhere, e.g. CI): the quick tier's GPU stages pass."""

from __future__ import annotations

import subprocess
import sys

import pytest
from doctor_testlib import run_doctor

pytestmark = pytest.mark.gpu


def _cuda() -> bool:
    try:
        out = subprocess.run(
            [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.stdout.strip() == "True"


requires_gpu = pytest.mark.skipif(not _cuda(), reason="no CUDA GPU (torch.cuda.is_available() is not True)")


@requires_gpu
def test_gpu_stages_pass() -> None:
    run = run_doctor(
        "--only",
        "nvidia_device_nodes,nvidia_driver,torch_cuda,triton_target,fla_device,fla_kernel",
        timeout=900,
    )
    for name in ("nvidia_driver", "torch_cuda", "triton_target", "fla_device", "fla_kernel"):
        assert run.probe(name)["status"] == "pass", run.probe(name)


@requires_gpu
def test_cuda_hidden() -> None:
    from doctor_testlib import doctor_env

    run = run_doctor(
        "--only",
        "nvidia_device_nodes,nvidia_driver,cuda_visible_devices",
        env=doctor_env({"CUDA_VISIBLE_DEVICES": ""}),
    )
    p = run.probe("cuda_visible_devices")
    # What the doctor read is the value it was given (not this test's own environment), and it is the cause.
    assert p["code"] == "CUDA_HIDDEN" and p["evidence"]["CUDA_VISIBLE_DEVICES"] == "", p
    assert run.root and (run.root["probe"], run.root["code"]) == ("cuda_visible_devices", "CUDA_HIDDEN"), (
        run.root
    )
