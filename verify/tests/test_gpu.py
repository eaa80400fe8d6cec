"""On a real CUDA GPU only (skipped cleanly elsewhere, e.g. CI): the quick tier's GPU stages pass."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from doctor_testlib import DoctorRun, run_doctor

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


def _fresh_cache(tmp_path: Path) -> dict[str, str]:
    from doctor_testlib import doctor_env

    cache = tmp_path / "triton-cache"
    cache.mkdir()
    return doctor_env({"TRITON_CACHE_DIR": str(cache)})


def _hidden_headers(only: str, env: dict[str, str]) -> DoctorRun:
    """The doctor's run with Python.h hidden: an empty tmpfs over the interpreter's include folder, in a
    mount namespace of the doctor's own."""
    include = sysconfig.get_paths()["include"]
    assert Path(include, "Python.h").is_file(), include
    hide = 'mount -t tmpfs none "$0" && exec "$@"'
    run = run_doctor(
        "--only",
        only,
        env=env,
        timeout=600,
        prefix=("unshare", "-m", "--propagation", "private", "sh", "-c", hide, include),
    )
    assert Path(include, "Python.h").is_file(), "the mount leaked out of the doctor's namespace"
    assert run.rc == 1, run.stderr[-2000:]
    return run


@requires_gpu
def test_no_python_h_at_triton_target(tmp_path: Path) -> None:
    """The origin story's fault on a real GPU: no Python.h and a cache with no launcher built. Triton must
    compile its launcher and cannot: the Triton probe names the missing header and the package that
    provides it (never "Triton is not supported on current platform", never a CPU fallback); with the
    toolchain probes in the run, the root cause is the header, found before any GPU work."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the headers are hidden by a mount")
    env = _fresh_cache(tmp_path)
    alone = _hidden_headers("nvidia_driver,torch_cuda,triton_target", env)
    probe = alone.probe("triton_target")
    assert (probe["status"], probe["code"]) == ("fail", "NO_PYTHON_H"), probe
    assert "-dev" in probe["fix"], probe
    shutil.rmtree(env["TRITON_CACHE_DIR"])
    Path(env["TRITON_CACHE_DIR"]).mkdir()
    whole = _hidden_headers("python_headers,c_extension_build,nvidia_driver,torch_cuda,triton_target", env)
    root = whole.root or {}
    assert (root.get("probe"), root.get("code")) == ("python_headers", "NO_PYTHON_H"), whole.report["summary"]
    assert all(p["status"] != "pass" for p in whole.report["probes"] if p["name"] == "triton_target")


FLA_SITE = os.environ.get("MLSTACK_TEST_FLA051_SITE", "")


@requires_gpu
def test_fla_backward_needs_tilelang_on_hopper(tmp_path: Path) -> None:
    """FLA 0.5.1 over Triton >= 3.4 on Hopper without tilelang refuses the Gated DeltaNet backward (FLA
    #640): for purpose training the doctor fails with the refusal and tilelang as the fix; for inference
    it is a warning (the forward is what inference runs)."""
    if not FLA_SITE:
        pytest.skip("needs FLA 0.5.1 beside the stack: MLSTACK_TEST_FLA051_SITE names its folder")
    env = _fresh_cache(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([FLA_SITE, env.get("PYTHONPATH", "")])
    cap = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.get_device_capability()[0])"],
        capture_output=True,
        text=True,
        env=env,
    ).stdout.strip()
    if cap != "9":
        pytest.skip("not a Hopper GPU: FLA #640 is a Hopper fault")
    only = "nvidia_driver,torch_cuda,triton_target,fla_device,gdn_backward"
    train = run_doctor("--only", only, "--purpose", "training", env=env, timeout=900)
    p = train.probe("gdn_backward")
    assert (p["status"], p["code"]) == ("fail", "FLA_BACKWARD_NEEDS_TILELANG"), p
    assert "tilelang" in p["fix"], p
    infer = run_doctor("--only", only, "--purpose", "inference", env=env, timeout=900)
    q = infer.probe("gdn_backward")
    assert (q["status"], q["code"]) == ("warn", "FLA_BACKWARD_NEEDS_TILELANG"), q
