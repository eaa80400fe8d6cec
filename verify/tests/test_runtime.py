"""Failures that surface inside torch, CUDA, Triton or inductor: the one classifier table (texts as the
H200 printed them), a worker killed by a signal and its reduced-environment rerun, fixes whose premise
the evidence lacks, and root causes listed once with their consequences."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mlstack_doctor import engine, runner, runtime, vetting
from mlstack_doctor.context import Context, Options
from mlstack_doctor.diagnosis import match
from mlstack_doctor.probes import gpu
from mlstack_doctor.record import Result, Stage, Status, failed, passed, warned

# Seen on the H200 (torch 2.11.0+cu130, triton 3.6.0, driver 580.159.04): results/h200-2026-12-02-doctor/
H200_TEXTS = [
    (
        "RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before "
        "calling NumCudaDevices() that might have already set an error? Error 2: out of memory",
        "CUDA_INIT_OUT_OF_MEMORY",
    ),
    (
        "RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before "
        "calling NumCudaDevices() that might have already set an error? "
        "Error 34: CUDA driver is a stub library",
        "CUDA_DRIVER_STUB",
    ),
    (
        "ValueError: Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'maybe'",
        "ALLOC_CONF_INVALID",
    ),
    ("    torch._C._cuda_init()\nRuntimeError: stoull", "ALLOC_CONF_INVALID"),
    ("ValueError: Unknown allocator backend, options are native and cudaMallocAsync", "ALLOC_CONF_INVALID"),
    ("ValueError: garbage_collect_threshold is invalid, set it in (0.0, 1.0)", "ALLOC_CONF_INVALID"),
    ("KeyError: 'getpwuid(): uid not found: 4242'", "USER_UNKNOWN"),
    ("libgomp: Thread creation failed: Resource temporarily unavailable", "THREAD_LIMIT"),
    ("OpenBLAS blas_thread_init: RLIMIT_NPROC 8 current, 8 max", "THREAD_LIMIT"),
    ("OSError: [Errno 24] Too many open files: '/proc/self/fd'", "OPEN_FILES_LIMIT"),
    ("RuntimeError: Triton Error [CUDA]: device kernel image is invalid", "KERNEL_IMAGE_INVALID"),
    ("KeyError: \"Unknown key: 'cubin'\"", "KERNEL_IMAGE_INVALID"),
    ("OSError: [Errno 28] No space left on device: '/w/full/tmpab12/c5/x.py'", "DISK_FULL"),
    ("OSError: [Errno 30] Read-only file system: '/srv/ro/out.bin'", "READ_ONLY_FS"),
    ("RuntimeError: Unable to open /dev/urandom", "PATH_PERMISSION_DENIED"),
    # the rules before them still win where they are more specific
    (
        "Error while creating shared memory segment /dev/shm/nccl-x (size 9637888): No space left",
        "NCCL_SHM_TOO_SMALL",
    ),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "GPU_OUT_OF_MEMORY"),
]


@pytest.mark.parametrize("text,code", H200_TEXTS, ids=[c for _, c in H200_TEXTS])
def test_one_table_names_the_runtime_cause(text: str, code: str) -> None:
    assert match(text, "DEFAULT")[0] == code


def test_the_path_the_error_names_reaches_the_fix() -> None:
    code, found = match("OSError: [Errno 28] No space left on device: '/w/full/tmpab12/x.py'", "X")
    args = runtime.fix_args(code, found, {})
    assert args["path"] == "/w/full/tmpab12/x.py" and args["mount"]


def _ctx(**opts: object) -> Context:
    return Context(Options(**opts))  # type: ignore[arg-type]


def _killed(tmp_path: Path) -> runner.WorkerResult:
    """A real process that writes its last words and aborts (SIGABRT), as torch does on an allocator
    setting it cannot tokenize."""
    code = (
        "import os, sys; sys.stderr.write('terminate called after throwing an instance of X\\n'); os.abort()"
    )
    return runner.WorkerResult(runner.run([sys.executable, "-c", code], timeout=30), {})


def test_a_signal_killed_worker_reports_the_signal_and_its_last_lines(tmp_path: Path) -> None:
    ctx = _ctx()
    ctx.facts["reran"] = "another probe"  # this test is about the verdict, not the rerun
    res = gpu._fail(
        "torch_cuda", Stage.TORCH, ctx, _killed(tmp_path), "CUDA_UNAVAILABLE", "torch cannot use CUDA"
    )
    assert res.code == "PROBE_CRASHED" and res.evidence["signal"] == "SIGABRT"
    assert "SIGABRT" in res.summary and "terminate called" in res.summary and ": ?" not in res.summary
    assert "terminate called" in res.fix


def test_the_rerun_names_the_setting_that_makes_the_difference(tmp_path: Path, monkeypatch) -> None:
    """The rerun runs a real worker twice: without every stack setting (it passes), then without each one
    alone: the one whose absence makes it pass is named."""
    workers = tmp_path / "workers"
    workers.mkdir()
    shutil_src = Path(runner.WORKERS_DIR) / "_common.py"
    (workers / "_common.py").write_text(shutil_src.read_text())
    (workers / "w_torch_cuda.py").write_text(
        "import os\nfrom _common import main\n"
        "def check(args):\n"
        "    if os.environ.get('PYTORCH_CUDA_ALLOC_CONF') == 'garbage':\n"
        "        os.abort()\n"
        "    return {}\n"
        "if __name__ == '__main__':\n    main(check)\n"
    )
    monkeypatch.setattr(runner, "WORKERS_DIR", workers)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "garbage")
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    res = gpu._fail(
        "torch_cuda", Stage.TORCH, _ctx(), _killed(tmp_path), "CUDA_UNAVAILABLE", "torch cannot use CUDA"
    )
    rerun = res.evidence["reduced_env_rerun"]
    assert rerun["passed"] is True and rerun["culprit"] == "PYTORCH_CUDA_ALLOC_CONF", rerun
    assert res.code == "ALLOC_CONF_INVALID" and "PYTORCH_CUDA_ALLOC_CONF" in res.fix


def _r(name: str, status: Status, code: str | None = None, **ev: object) -> Result:
    stage = next(p.stage for p in engine.PROBES if p.name == name)
    if status is Status.PASS:
        return passed(name, stage, "ok", **ev)
    return failed(name, stage, f"{name} failed", code or "X", f"fix for {code}", **ev)


def test_cuda_unavailable_never_tells_to_fix_a_driver_that_answers() -> None:
    results = {n: _r(n, Status.PASS) for n in ("nvidia_device_nodes", "nvidia_driver")}
    res = _r("torch_cuda", Status.FAIL, "CUDA_UNAVAILABLE", exception="RuntimeError: CUDA unknown error")
    res.fix = "nvidia-smi must work here first; check the device-node and driver probes above"
    out = vetting.vet(res, {}, results)
    assert out.fix.startswith("cause not determined: RuntimeError: CUDA unknown error")
    assert out.evidence["rejected_fix"]["fix"].startswith("nvidia-smi")


@pytest.mark.parametrize("installed,kept", [("3.6.0", False), ("3.7.1", True)])
def test_the_triton_pin_fix_only_when_triton_is_off_the_pin(installed: str, kept: bool) -> None:
    # off the pin with no profile declaring it (a warning): the override was never proven
    pin = (
        _r("torch_triton_pin", Status.PASS, triton=installed, torch_pins_triton="3.6.0")
        if installed == "3.6.0"
        else warned("torch_triton_pin", Stage.PACKAGES, "off", "TRITON_PIN_OVERRIDDEN", "x", triton=installed)
    )
    res = _r("torch_compile", Status.FAIL, "TORCH_COMPILE_FAILED", exception="OSError: No space left")
    res.fix = "install the triton torch pins (pip install 'triton==3.6.0')"
    out = vetting.vet(res, {}, {"torch_triton_pin": pin})
    assert ("triton==3.6.0" in out.fix and "cause not determined" not in out.fix) is kept


def test_one_cause_and_its_consequences() -> None:
    """The H200's case: an unknown uid; FLA, torch.compile and the model all trip over getpwuid."""
    err = "KeyError: 'getpwuid(): uid not found: 4242'"
    results = [
        _r("process_env", Status.FAIL, "USER_UNKNOWN", explains=["getpwuid"]),
        _r("fla_device", Status.FAIL, "FLA_ON_CPU", exception=err),
        _r("torch_compile", Status.FAIL, "USER_UNKNOWN", exception=err),
        _r("model_config", Status.FAIL, "MODEL_LOAD_FAILED", exception=f"import torch failed earlier: {err}"),
        _r("c_compiler", Status.FAIL, "NO_C_COMPILER"),
    ]
    summary = engine.summarize(results)
    roots = {c["probe"]: c for c in summary["root_causes"]}
    assert list(roots) == ["process_env", "c_compiler"]
    assert [c["probe"] for c in roots["process_env"]["consequences"]] == [
        "fla_device",
        "torch_compile",
        "model_config",
    ]
    assert roots["c_compiler"]["consequences"] == []


def test_the_same_exception_is_one_cause() -> None:
    """gpu-passthrough-check's fault-perm case: /dev/urandom, then the model's import saying so again."""
    results = [
        _r(
            "torch_cuda",
            Status.FAIL,
            "PATH_PERMISSION_DENIED",
            exception="RuntimeError: Unable to open /dev/urandom",
        ),
        _r(
            "model_config",
            Status.FAIL,
            "MODEL_LOAD_FAILED",
            exception="ImportError: import torch failed earlier in this process: RuntimeError: "
            "Unable to open /dev/urandom (not retried)",
        ),
    ]
    causes = engine.summarize(results)["root_causes"]
    assert [c["probe"] for c in causes] == ["torch_cuda"]
    assert causes[0]["consequences"][0]["probe"] == "model_config"


def test_a_shadowed_package_explains_what_follows() -> None:
    results = [
        _r(
            "package_versions",
            Status.FAIL,
            "PACKAGE_SHADOWED",
            explains=["/work/triton", "No module named 'triton."],
        ),
        _r(
            "triton_target",
            Status.FAIL,
            "TRITON_TARGET_FAILED",
            exception="ModuleNotFoundError: No module named 'triton.runtime'",
        ),
    ]
    causes = engine.summarize(results)["root_causes"]
    assert [c["probe"] for c in causes] == ["package_versions"]


def test_the_warm_step_refuses_a_cache_that_fails_the_check() -> None:
    ctx = _ctx(tier="warm")
    ctx.results["kernel_caches"] = _r("kernel_caches", Status.FAIL, "KERNEL_CACHE_CORRUPT")
    warm = next(p for p in engine.PROBES if p.name == "triton_warm")
    skip = engine.gate(ctx, warm)
    assert skip is not None and skip.status is Status.SKIP and skip.skipped_by == "kernel_caches"
