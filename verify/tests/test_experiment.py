"""Diagnosis by experiment: a failure no rule explains is rerun in a clean baseline, its differences
narrowed and the culprit confirmed by restoring it alone. Real processes throughout: the doctor itself
(a resource limit set in its process, a start-up hook on its PYTHONPATH) building a real extension with
gcc, and worker scripts run as the GPU probes' workers are."""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path

import pytest
from doctor_testlib import doctor_env, run_doctor
from mlstack_doctor import diagnosis, experiment, runner, vetting
from mlstack_doctor.context import Context, Options
from mlstack_doctor.probes import gpu, model
from mlstack_doctor.record import Result, Stage, Status, failed, passed, warned

# gcc's .so of the build probe is ~16 KiB: ld dies of SIGXFSZ under this limit; the doctor's own files fit
SMALL_FILES = 8 * 1024


def _small_files() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (SMALL_FILES, resource.RLIM_INFINITY))


def _env(hook: Path | None = None) -> dict[str, str]:
    """The doctor's environment; it writes no bytecode (CPython cuts a .pyc short under RLIMIT_FSIZE
    and leaves it behind for every later import)."""
    env = doctor_env({"PYTHONDONTWRITEBYTECODE": "1"})
    if hook is not None:
        env["PYTHONPATH"] = f"{env['PYTHONPATH']}:{hook}"
    return env


# A start-up hook that breaks only the import of the probe's extension (a rule has nothing to read)
HOOK = """import sys
class _Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.endswith("_probe"):
            raise ImportError("a site policy refuses " + name)
        return None
sys.meta_path.insert(0, _Refuse())
"""


def _hook(tmp_path: Path) -> Path:
    d = tmp_path / "site-hook"
    d.mkdir()
    (d / "sitecustomize.py").write_text(HOOK)
    return d


def _culprits(p: dict) -> list[tuple[str, str]]:
    return [(c["kind"], c["name"]) for c in p["evidence"]["experiment"]["culprits"]]


def test_a_file_size_limit_is_found_and_confirmed() -> None:
    run = run_doctor("--no-gpu", "--only", "c_extension_build", env=_env(), preexec=_small_files)
    p = run.probe("c_extension_build")
    exp = p["evidence"]["experiment"]
    assert p["code"] == "RESOURCE_LIMIT_BREAKS", p
    assert exp["baseline"] == "pass" and exp["confirmed"] is True
    assert _culprits(p) == [("limit", "file_size")] and exp["culprits"][0]["value"] == str(SMALL_FILES)
    assert "ulimit -f unlimited" in p["fix"] and "LimitFSIZE" in p["fix"]
    assert exp["reruns"] == len(exp["runs"]) <= experiment.BUDGET["reruns"]


def test_a_startup_hook_that_breaks_the_import_is_named(tmp_path: Path) -> None:
    hook = _hook(tmp_path)
    run = run_doctor("--no-gpu", "--only", "c_extension_build", env=_env(hook))
    p = run.probe("c_extension_build")
    assert p["code"] == "STARTUP_HOOK_BREAKS", p
    assert _culprits(p) == [("startup", str(hook / "sitecustomize.py"))]
    assert str(hook / "sitecustomize.py") in p["fix"] and p["evidence"]["experiment"]["confirmed"]


def test_two_faults_at_once_are_both_named(tmp_path: Path) -> None:
    hook = _hook(tmp_path)
    run = run_doctor("--no-gpu", "--only", "c_extension_build", env=_env(hook), preexec=_small_files)
    p = run.probe("c_extension_build")
    assert sorted(_culprits(p)) == [("limit", "file_size"), ("startup", str(hook / "sitecustomize.py"))], p
    assert p["evidence"]["experiment"]["confirmed"]
    assert "ulimit -f" in p["fix"] and str(hook / "sitecustomize.py") in p["fix"]


def test_a_passing_run_pays_nothing() -> None:
    ctx = Context(Options(expect_gpu=False, only=["c_extension_build"]))
    from mlstack_doctor import engine

    results = engine.run(ctx)
    assert results[0].status.value == "pass"
    assert "experiments" not in ctx.facts and "experiment_budget" not in ctx.facts
    assert "experiment" not in results[0].evidence


# ---- the GPU probes' workers, as scripts of a workers folder the test writes ----------------------


def _workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, script: str = "w_fla.py") -> None:
    """workers/<script> (default w_fla.py, the fla_kernel probe's worker) running `body` as its check."""
    workers = tmp_path / "workers"
    workers.mkdir(exist_ok=True)
    (workers / "_common.py").write_text((Path(runner.WORKERS_DIR) / "_common.py").read_text())
    (workers / script).write_text(
        "import os, sys\nfrom _common import main\ndef check(args):\n"
        + "".join("    " + ln + "\n" for ln in body.splitlines())
        + "    return {}\nif __name__ == '__main__':\n    main(check)\n"
    )
    monkeypatch.setattr(runner, "WORKERS_DIR", workers)


def _fla_kernel(ctx: Context) -> tuple[runner.WorkerResult, object]:
    res = runner.run_worker("w_fla.py", {"mode": "kernel"}, timeout=60)
    assert not res.ok, res.run.stderr
    return res, gpu._fail(
        "fla_kernel", Stage.FLA, ctx, res, "FLA_KERNEL_FAILED", "chunk_gated_delta_rule failed"
    )


def test_a_variable_no_rule_knows_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _workers(
        tmp_path,
        monkeypatch,
        "if os.environ.get('TRITON_ALWAYS_COMPILE_SERIAL') == '1':\n"
        "    raise RuntimeError('PassManager::run failed')",
    )
    monkeypatch.setenv("TRITON_ALWAYS_COMPILE_SERIAL", "1")
    monkeypatch.setenv("NCCL_DEBUG", "WARN")  # a difference that is not the cause
    _, res = _fla_kernel(Context(Options()))
    exp = res.evidence["experiment"]
    assert res.code == "ENV_SETTING_BREAKS" and exp["confirmed"], exp
    assert ("env", "TRITON_ALWAYS_COMPILE_SERIAL") in [(c["kind"], c["name"]) for c in exp["culprits"]]
    assert "NCCL_DEBUG" in exp["ruled_out"] and "unset TRITON_ALWAYS_COMPILE_SERIAL" in res.fix
    assert "fresh TRITON_CACHE_DIR" not in res.fix


def test_a_cache_that_breaks_the_kernel_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry in the Triton cache the kernel cannot use: a fresh private cache passes, the cache alone put
    back fails again; the fix removes that folder."""
    cache = tmp_path / "triton-cache"
    (cache / "ab12").mkdir(parents=True)
    (cache / "ab12" / "kernel.cubin").write_bytes(b"")
    _workers(
        tmp_path,
        monkeypatch,
        "d = os.environ.get('TRITON_CACHE_DIR', '')\n"
        "if os.path.exists(os.path.join(d, 'ab12', 'kernel.cubin')):\n"
        "    raise RuntimeError('CUDA error: an illegal instruction was encountered')",
    )
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    _, res = _fla_kernel(Context(Options()))
    exp = res.evidence["experiment"]
    assert res.code == "CACHE_BREAKS" and exp["confirmed"], exp
    assert [(c["kind"], c["name"]) for c in exp["culprits"]] == [("cache", str(cache))]
    assert f"rm -rf {cache}" in res.fix


def test_a_tmpdir_that_cannot_take_files_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("")
    _workers(tmp_path, monkeypatch, "import tempfile\ntempfile.mkstemp(dir=os.environ.get('TMPDIR'))")
    monkeypatch.setenv("TMPDIR", str(not_a_dir))
    _, res = _fla_kernel(Context(Options()))
    exp = res.evidence["experiment"]
    assert res.code == "TMPDIR_UNUSABLE" and exp["confirmed"], exp
    assert str(not_a_dir) in res.fix and "export TMPDIR=/var/tmp" in res.fix, res.fix


def test_a_failure_that_comes_and_goes_is_not_attributed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Load: the first rerun passes (the other process has not started yet), every later one fails
    whatever the settings; the narrowing pins it on something, the confirmation does not hold."""
    count = tmp_path / "runs"
    _workers(
        tmp_path,
        monkeypatch,
        f"p = {str(count)!r}\n"
        "n = int(open(p).read()) if os.path.exists(p) else 0\n"
        "open(p, 'w').write(str(n + 1))\n"
        "if n != 1:\n"
        "    raise RuntimeError('CUDA error: an illegal memory access was encountered')",
    )
    monkeypatch.setenv("TRITON_ALWAYS_COMPILE_SERIAL", "1")
    ctx = Context(Options())
    _, res = _fla_kernel(ctx)  # run 0 fails; of the reruns only the baseline (run 1) passes
    exp = res.evidence["experiment"]
    assert exp["confirmed"] is False and res.code == "FLA_KERNEL_FAILED", exp
    assert "TRITON_ALWAYS_COMPILE_SERIAL" not in res.fix


def test_a_session_failure_that_does_not_come_back_alone_names_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The failure came from the long-lived session; its worker, rerun on its own with every setting in
    place, passes: no setting is narrowed or named."""
    _workers(tmp_path, monkeypatch, "pass")
    monkeypatch.setenv("TRITON_ALWAYS_COMPILE_SERIAL", "1")
    died = runner.run([sys.executable, "-c", "import os; os.abort()"], timeout=30)
    died.argv = [sys.executable, str(runner.WORKERS_DIR / "w_session.py")]  # as Session's results carry
    res = gpu._fail(
        "fla_kernel", Stage.FLA, Context(Options()), runner.WorkerResult(died), "FLA_KERNEL_FAILED", "x"
    )
    exp = res.evidence["experiment"]
    assert exp["reruns"] == 1 and exp["baseline"] == "not run" and not exp["confirmed"], exp
    assert res.code == "PROBE_CRASHED" and "did not come back" in res.fix


def test_the_baseline_failing_too_rules_the_settings_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _workers(tmp_path, monkeypatch, "raise RuntimeError('an internal compiler error')")
    monkeypatch.setenv("TRITON_ALWAYS_COMPILE_SERIAL", "1")
    _, res = _fla_kernel(Context(Options()))
    exp = res.evidence["experiment"]
    assert exp["baseline"] == "fail" and not exp["confirmed"] and not exp["culprits"]
    assert "TRITON_ALWAYS_COMPILE_SERIAL" in exp["ruled_out"]
    assert res.code == "FLA_KERNEL_FAILED" and "not in this process's settings" in res.fix
    assert "TRITON_ALWAYS_COMPILE_SERIAL" in res.fix


def test_one_experiment_per_worker_and_cause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second failure of the same worker reuses the experiment; nothing reruns."""
    _workers(
        tmp_path, monkeypatch, "if os.environ.get('TORCHINDUCTOR_MAX_AUTOTUNE') == 'x':\n    sys.exit(3)"
    )
    monkeypatch.setenv("TORCHINDUCTOR_MAX_AUTOTUNE", "x")
    ctx = Context(Options())
    first_res, first = _fla_kernel(ctx)
    spent = ctx.facts["experiment_budget"].reruns
    second = gpu._fail("fla_kernel", Stage.FLA, ctx, first_res, "FLA_KERNEL_FAILED", "again")
    assert first.code == second.code == "ENV_SETTING_BREAKS"
    assert ctx.facts["experiment_budget"].reruns == spent


def test_a_rule_code_that_names_no_cause_is_decided_by_the_experiment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rule reads "Found no NVIDIA driver" as CUDA_UNAVAILABLE, a code that says what failed, not why
    (diagnosis.Code.open): the experiment runs and names the variable that makes torch say it."""
    assert diagnosis.CODES["CUDA_UNAVAILABLE"].open and not diagnosis.CODES["NO_PYTHON_H"].open
    _workers(
        tmp_path,
        monkeypatch,
        "if os.environ.get('TORCH_CUDA_ARCH_LIST') == 'none':\n"
        "    raise RuntimeError('Found no NVIDIA driver on your system')",
    )
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "none")
    _, res = _fla_kernel(Context(Options()))
    exp = res.evidence["experiment"]
    assert res.code == "ENV_SETTING_BREAKS" and exp["confirmed"], (res.code, exp)
    assert "unset TORCH_CUDA_ARCH_LIST" in res.fix


def test_a_variable_a_startup_hook_sets_is_fixed_by_removing_the_hook(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sitecustomize sets TORCH_LOGS (in this process too: the doctor's os.environ differs from the
    environment it started with). Both the variable and the hook bring the failure back; the fix removes
    the hook and says it sets the variable, not "unset TORCH_LOGS" in a job environment that never set it."""
    hook = tmp_path / "site-hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text("import os\nos.environ['TORCH_LOGS'] = '+bogus'\n")
    _workers(
        tmp_path,
        monkeypatch,
        "if os.environ.get('TORCH_LOGS') == '+bogus':\n    raise RuntimeError('Invalid log settings')",
    )
    monkeypatch.setenv("PYTHONPATH", f"{os.environ.get('PYTHONPATH', '')}:{hook}")
    monkeypatch.setenv("TORCH_LOGS", "+bogus")  # what the hook did in the doctor's own process
    _, res = _fla_kernel(Context(Options()))
    exp = res.evidence["experiment"]
    # the variable is no difference of its own: without the hook the process has the value it started with
    assert exp["confirmed"] and [c["kind"] for c in exp["culprits"]] == ["startup"], exp
    assert "TORCH_LOGS" not in exp["ruled_out"] and res.code == "STARTUP_HOOK_BREAKS", (res.code, res.fix)
    assert "unset TORCH_LOGS" not in res.fix and "the start-up hook sets TORCH_LOGS" in res.fix, res.fix
    assert str(hook / "sitecustomize.py") in res.fix


def test_model_configs_build_goes_through_the_experiment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """model_config's worker (w_model.py, mode config) fails with a text no rule reads: the experiment reruns
    that worker with the probe's own arguments and names the cache variable, not "weights incomplete?"."""
    cache_file = tmp_path / "inductor-cache-is-a-file"
    cache_file.write_text("x")
    _workers(
        tmp_path,
        monkeypatch,
        "assert args['mode'] == 'config' and os.path.isfile(args['config'])\n"
        "if os.path.isfile(os.environ.get('TORCHINDUCTOR_CACHE_DIR', '')):\n"
        "    raise FileExistsError(17, 'File exists', os.environ['TORCHINDUCTOR_CACHE_DIR'])",
        script="w_model.py",
    )
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache_file))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))  # no stamp of an earlier build
    monkeypatch.setattr(model, "installed", lambda dist: "5.0.0")
    res = model.model_config(Context(Options(expect_gpu=False, only=["model_config"])))
    exp = res.evidence["experiment"]
    assert res.status == Status.FAIL and res.code == "CACHE_BREAKS" and exp["confirmed"], (res.code, exp)
    assert [(c["kind"], c["name"]) for c in exp["culprits"]] == [("cache", str(cache_file))]
    assert "TORCHINDUCTOR_CACHE_DIR" in res.fix and "weights incomplete" not in res.fix


# torch 2.11's OutOfMemoryError, with another process holding most of the GPU (as seen on the H100)
OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total capacity "
    "of 79.19 GiB of which 5.20 GiB is free. Process 4242 has 73.00 GiB memory in use. Including "
    "non-PyTorch memory, this process has 990.00 MiB memory in use. Of the allocated memory 200.00 MiB "
    "is allocated by PyTorch, and 20.00 MiB is reserved by PyTorch but unallocated. If reserved but "
    "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
    "fragmentation."
)


def test_memory_others_hold_is_named_not_a_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _workers(tmp_path, monkeypatch, f"raise RuntimeError({OOM!r})")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    _, res = _fla_kernel(Context(Options()))
    held = res.evidence["gpu_memory"]
    assert res.code == "GPU_OUT_OF_MEMORY", res.code
    assert held["held_outside_gib"] == pytest.approx(73.02, abs=0.05) and held["processes"][0]["pid"] == 4242
    assert "held outside this process" in res.fix and "pid 4242" in res.fix
    assert "PYTORCH_CUDA_ALLOC_CONF" not in res.fix
    assert "experiment" not in res.evidence  # the evidence names the load: nothing reruns


def test_the_differences_are_the_settings_of_this_process(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TRITON_DEBUG", "1")
    monkeypatch.setenv("CC", "/usr/bin/gcc")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("PYTHONSTARTUP", str(tmp_path / "startup.py"))
    found = {(d.kind, d.name) for d in experiment.differences()}
    assert {("env", "TRITON_DEBUG"), ("env", "CC"), ("tmpdir", str(tmp_path))} <= found
    assert ("startup", str(tmp_path / "startup.py")) in found
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # which GPU, not how it runs: kept in the baseline
    assert not any(d.name in ("PATH", "CUDA_VISIBLE_DEVICES") for d in experiment.differences())
    env, _ = experiment.setting(experiment.differences(), (), str(tmp_path))
    assert "TRITON_DEBUG" not in env and "CC" not in env and env["TMPDIR"] != str(tmp_path)
    assert sys.executable  # the baseline keeps the interpreter: PATH and the rest are untouched


def test_a_write_cut_short_by_the_file_size_limit_names_the_limit() -> None:
    """The doctor's own 1 MiB write to TMPDIR (unset: /tmp, checked by a real write too) and to the
    Triton cache fails with EFBIG: the errno names the limit; no folder is blamed."""
    env = _env()
    env.pop("TMPDIR", None)
    run = run_doctor("--no-gpu", "--only", "tmpdir,triton_cache_dir", env=env, preexec=_small_files)
    for name in ("tmpdir", "triton_cache_dir"):
        p = run.probe(name)
        assert p["code"] == "RESOURCE_LIMIT_BREAKS" and "ulimit -f unlimited" in p["fix"], p
    assert "/tmp" in run.probe("tmpdir")["fix"]


def test_process_env_names_a_small_file_size_limit() -> None:
    run = run_doctor("--no-gpu", "--only", "process_env", env=_env(), preexec=_small_files)
    p = run.probe("process_env")
    assert p["status"] == "warn" and p["code"] == "RESOURCE_LIMIT_LOW" and "ulimit -f" in p["fix"], p


def _compile_failed(exception: str) -> Result:
    return failed(
        "torch_compile",
        Stage.TORCH,
        "torch.compile failed",
        "TORCH_COMPILE_FAILED",
        "/usr/bin/python3 -m pip install 'triton==3.6.0'",
        exception=exception,
    )


@pytest.mark.parametrize(
    "exception,pin,kept",
    [
        # a declared override (the profile's proof) and no version named: rejected
        ("RuntimeError: PassManager::run failed", Status.PASS, False),
        ("AttributeError: module 'triton' has no attribute 'knobs'", Status.PASS, True),  # an API lacking
        ("RuntimeError: PassManager::run failed", Status.WARN, True),  # an override no profile declares
    ],
)
def test_a_version_change_needs_a_version_incompatibility(exception: str, pin: Status, kept: bool) -> None:
    ev = {"torch_pins_triton": "3.6.0", "triton": "3.7.1"}
    pin_result = (
        passed("torch_triton_pin", Stage.PACKAGES, "declared", override="3.7.1", **ev)
        if pin is Status.PASS
        else warned("torch_triton_pin", Stage.PACKAGES, "undeclared", "TRITON_PIN_OVERRIDDEN", "x", **ev)
    )
    res = vetting.vet(_compile_failed(exception), {}, {"torch_triton_pin": pin_result})
    assert ("pip install" in res.fix) is kept, res.fix


def test_a_fresh_cache_is_advised_only_after_one_passed() -> None:
    res = failed(
        "fla_kernel",
        Stage.FLA,
        "x",
        "FLA_KERNEL_FAILED",
        "retry with a fresh TRITON_CACHE_DIR",
        experiment={"baseline": "fail", "culprits": [], "confirmed": False},
    )
    assert "fresh TRITON_CACHE_DIR" not in vetting.vet(res, {}, {}).fix
