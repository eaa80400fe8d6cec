"""classify(): the one place error text becomes a code. Texts are the real ones, seen on the H200."""

from __future__ import annotations

import pytest
from mlstack_doctor.diagnosis import CODES, classify, fix_for

AUTOTUNER = """  File "/opt/torch/.venv/.../triton/runtime/autotuner.py", line 233, in benchmark
    full_nargs = {**self.nargs, **kwargs, **self.cache[key].all_kwargs()}
TypeError: 'NoneType' object is not a mapping"""
TILELANG = (
    "RuntimeError: Triton >= 3.4.0 on Hopper GPUs produces incorrect results for gated chunk_bwd_dqkwg "
    "(see #640). Please install tilelang: `pip install tilelang`"
)
PY_H = (
    "CalledProcessError: Command '['/opt/gcc/bin/gcc', '/tmp/x/cuda_utils.c', ...]' "
    "returned non-zero exit status 1."
    "\n/tmp/x/cuda_utils.c:6:10: fatal error: Python.h: No such file or directory"
)


@pytest.mark.parametrize(
    "text,code",
    [
        (
            "RuntimeError: Failed to find C compiler. Please specify via CC environment variable or set "
            "triton.knobs.build.impl.",
            "NO_C_COMPILER",
        ),
        (PY_H, "NO_PYTHON_H"),
        ("AssertionError: libcuda.so cannot found!\nPlease make sure GPU is set up", "LIBCUDA_NOT_FOUND"),
        ("RuntimeError: 0 active drivers ([]). There should only be one.", "TRITON_NO_DRIVER"),
        (AUTOTUNER, "AUTOTUNER_RACE"),
        (TILELANG, "FLA_BACKWARD_NEEDS_TILELANG"),
        (
            "nvmlInit_v2 failed: NVML_ERROR_LIB_RM_VERSION_MISMATCH (Driver/library version mismatch)",
            "DRIVER_API_MISMATCH",
        ),
        (
            "NVRM: API mismatch: the client has the version 580.1, but this kernel module has 580.2",
            "DRIVER_API_MISMATCH",
        ),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "GPU_OUT_OF_MEMORY"),
        ("ValueError: Unrecognized model identifier: qwen9. Should contain one of ...", "MODEL_TYPE_UNKNOWN"),
        ("ModuleNotFoundError: No module named 'fla'", "PACKAGE_MISSING"),
        ("RuntimeError: Found no NVIDIA driver on your system.", "CUDA_UNAVAILABLE"),
        ("something nobody has seen", "FLA_KERNEL_FAILED"),
    ],
)
def test_classify(text: str, code: str) -> None:
    assert classify(text, "FLA_KERNEL_FAILED") == code


def test_missing_cc_binary_is_cc_invalid() -> None:
    assert (
        classify("[Errno 2] No such file or directory: '/opt/cc'", "C_COMPILER_BROKEN", compiler_env=True)
        == "CC_INVALID"
    )
    assert classify(PY_H + " [Errno 2]", "C_COMPILER_BROKEN", compiler_env=True) == "NO_PYTHON_H"


@pytest.mark.parametrize("code", sorted(CODES))
def test_every_code_has_a_one_line_fix(code: str) -> None:
    fix = fix_for(
        code,
        python="/venv/bin/python",
        py_ver="3.12",
        cache_dir="/c",
        kernel_driver="580.159.04",
        package="x",
        pins="x",
        torch_pin="triton==3.6.0",
        model_dir="/m",
        model="27b",
        seq_len="2048",
        batch="1",
        alternative="export TRITON_CACHE_DIR=/t; or ",
        tmpdir="/t",
        path="./triton",
        mount="/c",
        repo="Qwen/Qwen3.5-27B",
        files="model-00001-of-00002.safetensors",
        userspace="570.86.15",
        nvml_driver="580.159.04",
        dir="/usr/lib64",
        stale="/opt/old",
        good="",
        suggest="GPU-8932f937",
        here="0=GPU-8932f937",
        size="2G",
        nodes="0,1",
        link="NV18 (NVLink, 18 bonded links)",
        limit="8192 MiB",
        need="16384 MiB",
        flag="-l",
        uid="4242",
        var="PYTORCH_CUDA_ALLOC_CONF",
        why="'garbage' is not key:value",
        where="the environment",
        folders="/c/ABC",
        cause="the address space is limited to 8192 MiB",
        action="unset TRITON_DEBUG where the job's environment sets it",
        proof=" (the doctor reran the probe)",
    )
    assert (
        fix
        and "\n" not in fix
        and "<"
        not in fix.replace("<vmid>", "")
        .replace("<dir holding", "")
        .replace("<repo>", "")
        .replace("<your config>", "")
        .replace("<package>", "")
    )


def test_fix_fills_unknown_fields_visibly() -> None:
    assert "<py_ver>" in fix_for("NO_PYTHON_H")


def test_readme_lists_every_code() -> None:
    from pathlib import Path

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    missing = [c for c in CODES if f"`{c}`" not in readme]
    assert not missing
