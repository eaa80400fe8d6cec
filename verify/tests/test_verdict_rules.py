"""Verdicts checked against the evidence: fixes never point back at the cause, each independent failure
gets its own root cause, and the toolchain/package/model faults users hit, made for real (tmpfs mounts
in a private mount namespace, a cwd that shadows a package, truncated safetensors)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from doctor_testlib import SRC, TEST_TORCH, DoctorRun, doctor_env, run_doctor, validate, write_lock
from mlstack_doctor import SCHEMA_VERSION, engine, vetting
from mlstack_doctor.record import Result, Stage, Status, failed, passed, skipped

CAN_MOUNT = os.geteuid() == 0 and shutil.which("unshare") is not None
needs_mounts = pytest.mark.skipif(not CAN_MOUNT, reason="needs root and unshare for private tmpfs mounts")


def doctor(
    *args: str,
    python: str = sys.executable,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    mounts: tuple[tuple[str, Path], ...] = (),
) -> DoctorRun:
    """The doctor as a subprocess; with `mounts` ((tmpfs options, dir), ...) inside `unshare -m`. The
    option "bind,ro" makes a folder read-only in place instead (its content stays: the checkout, the
    interpreter or the test's own folders may live below it, e.g. a clone under /tmp)."""
    argv = [python, "-m", "mlstack_doctor", "--json", "--quiet", *args]
    if mounts:
        steps = [
            f"mount --bind {shlex.quote(str(d))} {shlex.quote(str(d))} && "
            f"mount -o remount,bind,ro {shlex.quote(str(d))}"
            if o == "bind,ro"
            else f"mount -t tmpfs -o {o} tmpfs {shlex.quote(str(d))}"
            for o, d in mounts
        ]
        argv = ["unshare", "-m", "sh", "-c", " && ".join([*steps, "exec " + shlex.join(argv)])]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env or doctor_env(), cwd=cwd, timeout=240)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    validate(report)
    return DoctorRun(proc.returncode, report, proc.stdout, proc.stderr)


def exported(fix: str, var: str) -> str | None:
    m = re.search(rf"export {var}=(\S+)", fix)
    return m.group(1) if m else None


# --- A: the vetting pass ---------------------------------------------------------------------------


def _fail(fix: str, **ev: Any) -> Result:
    return failed("triton_cache_dir", Stage.TOOLCHAIN, "x", "TRITON_CACHE_UNWRITABLE", fix, **ev)


def test_fix_into_a_folder_found_unwritable_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The H200 case: HOME read-only; the old fix said export TRITON_CACHE_DIR=$HOME/.cache/triton."""
    monkeypatch.setenv("HOME", str(tmp_path))
    facts: dict[str, Any] = {}
    vetting.note_path(facts, str(tmp_path / ".triton/cache"), "OSError: Read-only file system")
    vetting.note_path(facts, str(tmp_path), "OSError: Read-only file system")
    res = vetting.vet(_fail("export TRITON_CACHE_DIR=$HOME/.cache/triton (or make it writable)"), facts)
    assert "$HOME" not in res.fix and "could not determine" in res.fix and "Read-only" in res.fix
    assert res.evidence["rejected_fix"]["fix"].startswith("export TRITON_CACHE_DIR=$HOME")


def test_fix_into_a_folder_never_tried_is_replaced() -> None:
    res = vetting.vet(_fail("export TRITON_CACHE_DIR=/somewhere/else"), {})
    assert "did not try /somewhere/else" in res.fix


def test_fix_setting_the_failing_value_again_is_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    res = vetting.vet(_fail("export CUDA_VISIBLE_DEVICES=7"), {})
    assert "already is 7" in res.fix


def test_fix_into_a_folder_the_doctor_wrote_to_is_kept(tmp_path: Path) -> None:
    facts: dict[str, Any] = {}
    vetting.note_path(facts, str(tmp_path), None)
    fix = f"export TRITON_CACHE_DIR={tmp_path}/triton; or make /c writable"
    assert vetting.vet(_fail(fix), facts).fix == fix  # below a folder found writable
    other = "read evidence.exception; then TRITON_CACHE_DIR=$(mktemp -d) python -c 'import triton'"
    assert vetting.vet(_fail(other), {}).fix == other  # a command, not a path: nothing to check
    ok = passed("x", Stage.TOOLCHAIN, "fine")
    assert vetting.vet(ok, {}) is ok


@needs_mounts
def test_read_only_home_fix_is_a_folder_the_doctor_wrote(tmp_path: Path) -> None:
    """HOME on a read-only filesystem, TRITON_CACHE_DIR unset: the fix must not be under HOME."""
    home = tmp_path / "home"
    home.mkdir()
    env = doctor_env({"HOME": str(home)}, unset=("TRITON_CACHE_DIR", "XDG_CACHE_HOME", "TRITON_HOME"))
    env.pop("TRITON_CACHE_DIR", None)
    run = doctor("--no-gpu", "--only", "triton_cache_dir", env=env, mounts=(("ro", home),))
    p = run.probe("triton_cache_dir")
    assert run.rc == 1 and p["code"] == "TRITON_CACHE_UNWRITABLE", p
    target = exported(p["fix"], "TRITON_CACHE_DIR")
    assert target and not target.startswith(str(home)) and "$HOME" not in p["fix"], p["fix"]
    assert any(t.startswith(f"{target} (usable)") for t in p["evidence"]["alternatives_tried"])
    assert any(t.startswith(str(home)) and "Read-only" in t for t in p["evidence"]["alternatives_tried"])


@needs_mounts
def test_a_read_only_inductor_cache_is_named_before_any_compile(tmp_path: Path) -> None:
    """TORCHINDUCTOR_CACHE_DIR on a read-only mount fails every torch.compile: process_env names it from the
    environment alone, so a fault that stops the GPU probes first (an address-space limit) cannot hide it."""
    cache = tmp_path / "inductor"
    cache.mkdir()
    env = doctor_env({"TORCHINDUCTOR_CACHE_DIR": str(cache)})
    run = doctor("--no-gpu", "--only", "process_env", env=env, mounts=(("ro", cache),))
    p = run.probe("process_env")
    assert run.rc == 1 and p["status"] == "fail" and p["code"] == "ENV_SETTING_INVALID", p
    assert "TORCHINDUCTOR_CACHE_DIR" in p["summary"] and "Read-only file system" in p["summary"], p["summary"]
    assert "TORCHINDUCTOR_CACHE_DIR" in p["fix"], p["fix"]
    # Writable, it is no finding: the same run without the mount passes.
    assert doctor("--no-gpu", "--only", "process_env", env=env).probe("process_env")["status"] == "pass"


def test_a_cache_folder_nobody_can_make_is_named_from_the_environment(tmp_path: Path) -> None:
    """TORCHINDUCTOR_CACHE_DIR under /proc: access() tells root it may write /proc, mkdir there still fails.
    process_env names it (a real mkdir), where a GPU fault first would otherwise leave it to an experiment;
    a folder it can make is left as it found it."""
    env = doctor_env({"TORCHINDUCTOR_CACHE_DIR": "/proc/mlstack-test-inductor-cache"})
    p = doctor("--no-gpu", "--only", "process_env", env=env).probe("process_env")
    assert p["status"] == "fail" and p["code"] == "ENV_SETTING_INVALID", p
    assert "/proc/mlstack-test-inductor-cache" in p["summary"] and "cannot be created" in p["summary"], p
    made = tmp_path / "new" / "inductor"
    env = doctor_env({"TORCHINDUCTOR_CACHE_DIR": str(made)})
    assert doctor("--no-gpu", "--only", "process_env", env=env).probe("process_env")["status"] == "pass"
    assert not (tmp_path / "new").exists()


@needs_mounts
def test_each_finding_of_the_environment_gets_its_fix(tmp_path: Path) -> None:
    """Two settings that each break the stack, found by one probe: the root cause's fix mends both, so the
    next run does not fail on the one left out."""
    cache = tmp_path / "inductor"
    cache.mkdir()
    env = doctor_env({"TORCHINDUCTOR_CACHE_DIR": str(cache), "TRITON_PTXAS_PATH": "/nonexistent/ptxas"})
    run = doctor("--no-gpu", "--only", "process_env", env=env, mounts=(("ro", cache),))
    roots = run.report["summary"]["root_causes"]
    assert [r["probe"] for r in roots] == ["process_env"], roots
    fix = roots[0]["fix"]
    assert "TORCHINDUCTOR_CACHE_DIR" in fix and "TRITON_PTXAS_PATH" in fix, fix


@needs_mounts
@pytest.mark.parametrize(
    "opts,code",
    [("noexec", "TRITON_CACHE_NOEXEC"), ("size=16k", "TRITON_CACHE_FULL")],
    ids=["noexec", "full"],
)
def test_cache_on_a_noexec_or_full_mount(tmp_path: Path, opts: str, code: str) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    env = doctor_env({"TRITON_CACHE_DIR": str(cache), "HOME": str(tmp_path / "h")})
    run = doctor("--no-gpu", "--only", "triton_cache_dir", env=env, mounts=((opts, cache),))
    p = run.probe("triton_cache_dir")
    assert run.rc == 1 and p["code"] == code, p
    target = exported(p["fix"], "TRITON_CACHE_DIR")
    assert target and target != str(cache) and str(cache) in p["fix"]


@needs_mounts
def test_no_usable_folder_anywhere_is_said_not_guessed(tmp_path: Path) -> None:
    """Every candidate read-only: the fix says none was found, and suggests no export."""
    home, xdg, tmp = tmp_path / "home", tmp_path / "xdg", tmp_path / "tmp"
    for d in (home, xdg, tmp):
        d.mkdir()
    env = doctor_env({"HOME": str(home), "XDG_CACHE_HOME": str(xdg), "TMPDIR": str(tmp), "USER": "u"})
    env.pop("TRITON_CACHE_DIR")
    # /tmp last: Python's tempfile falls back to it when TMPDIR is read-only.
    ro = (("ro", home), ("ro", xdg), ("ro", tmp), ("bind,ro", Path("/var/tmp")), ("bind,ro", Path("/tmp")))
    run = doctor("--no-gpu", "--only", "triton_cache_dir", env=env, mounts=ro)
    p = run.probe("triton_cache_dir")
    assert p["code"] == "TRITON_CACHE_UNWRITABLE"
    assert "export" not in p["fix"] and "no usable folder found for TRITON_CACHE_DIR" in p["fix"], p["fix"]


TOOLCHAIN_ONLY = ("--no-gpu", "--only", "tmpdir,c_compiler,python_headers,c_extension_build")


def test_tmpdir_missing_is_a_warning_while_the_fallback_works(tmp_path: Path) -> None:
    """gcc and Python's tempfile pass over a TMPDIR they cannot use to /tmp: the stack's builds work, so the
    doctor warns naming it and the build probe runs (and passes) instead of being skipped."""
    run = doctor(*TOOLCHAIN_ONLY, env=doctor_env({"TMPDIR": str(tmp_path / "gone")}))
    p = run.probe("tmpdir")
    assert p["status"] == "warn" and p["code"] == "TMPDIR_UNUSABLE", p
    assert str(tmp_path / "gone") in p["fix"] and p["evidence"]["fallback"] == "/tmp", p
    assert run.rc == 0 and run.probe("c_extension_build")["status"] == "pass"


def test_tmpdir_missing_fails_when_the_fallback_fails_too(tmp_path: Path) -> None:
    """/tmp, /var/tmp and the working folder (tempfile's last resort) read-only: nothing takes the
    builds' files, and the doctor fails naming TMPDIR."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    ro = (("bind,ro", Path("/tmp")), ("bind,ro", Path("/var/tmp")), ("bind,ro", cwd))
    run = doctor(*TOOLCHAIN_ONLY, env=doctor_env({"TMPDIR": str(tmp_path / "gone")}), cwd=cwd, mounts=ro)
    p = run.probe("tmpdir")
    assert run.rc == 1 and p["status"] == "fail" and p["code"] == "TMPDIR_UNUSABLE", p
    assert str(tmp_path / "gone") in p["fix"] and "tempfile.gettempdir() failed" in p["evidence"]["fallback"]
    assert run.probe("c_extension_build")["skipped_by"] == "tmpdir"


def test_gcc_without_assembler_names_binutils(tmp_path: Path) -> None:
    """gcc finds `as` on PATH: without it (binutils missing) it cannot assemble anything."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("needs gcc")
    env = doctor_env({"CC": gcc, "PATH": str(tmp_path)})
    run = doctor("--no-gpu", "--only", "c_compiler,python_headers,c_extension_build", env=env)
    p = run.probe("c_extension_build")
    assert p["code"] == "C_COMPILER_BROKEN" and "binutils" in p["fix"], p
    assert p["evidence"]["missing_tool"] == "as"


# --- E: packages -----------------------------------------------------------------------------------


@pytest.mark.parametrize("shadow", ["torch/__init__.py", "torch.py"])
def test_package_shadowed_by_the_working_directory(torch_venv: Path, tmp_path: Path, shadow: str) -> None:
    (tmp_path / shadow).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / shadow).write_text("")
    run = doctor("--no-gpu", "--only", "package_versions", python=str(torch_venv), cwd=tmp_path)
    p = run.probe("package_versions")
    wins = str(tmp_path / shadow.split("/")[0])
    assert run.rc == 1 and p["code"] == "PACKAGE_SHADOWED" and wins in p["fix"], p
    assert p["evidence"]["shadowed"]["torch"]["imported_from"] == wins


def test_off_profile_fix_names_package_and_locked_version(torch_venv: Path, tmp_path: Path) -> None:
    lock = write_lock(tmp_path / "p", {"torch": "2.11.0", "transformers": "5.17.0"})
    run = run_doctor(
        "--no-gpu", "--only", "package_versions", "--profile", str(lock.parent), python=str(torch_venv)
    )
    p = run.probe("package_versions")
    assert p["code"] == "VERSION_OFF_PROFILE"
    assert "'torch==2.11.0'" in p["fix"] and str(torch_venv) in p["fix"] and "transformers" not in p["fix"]
    assert TEST_TORCH  # the venv's torch is the one off the lock


# --- B: model weights ------------------------------------------------------------------------------

TINY = (SRC / "mlstack_doctor/configs/qwen3_5_tiny.json").read_text()


def safetensors(path: Path, nbytes: int, cut: int = 0) -> None:
    """A real safetensors file: one U8 tensor of `nbytes`, minus `cut` bytes at the end."""
    header = json.dumps({"w": {"dtype": "U8", "shape": [nbytes], "data_offsets": [0, nbytes]}}).encode()
    data = struct.pack("<Q", len(header)) + header + b"\0" * nbytes
    path.write_bytes(data[: len(data) - cut])


def _model(tmp_path: Path, name_or_path: str | None = None) -> None:
    cfg = json.loads(TINY)
    if name_or_path:
        cfg["_name_or_path"] = name_or_path
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps(
            {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
        )
    )
    safetensors(tmp_path / "model-00001-of-00002.safetensors", 64)


def test_missing_shard_is_incomplete_weights_with_its_download(tmp_path: Path) -> None:
    _model(tmp_path, "Qwen/Qwen3.5-27B")
    run = doctor("--no-gpu", "--only", "model_config", "--model", str(tmp_path))
    p = run.probe("model_config")
    assert run.rc == 1 and p["code"] == "MODEL_WEIGHTS_INCOMPLETE"
    assert p["fix"] == (
        f"huggingface-cli download Qwen/Qwen3.5-27B model-00002-of-00002.safetensors --local-dir {tmp_path}"
    )


def test_missing_shard_without_a_known_repo_says_so(tmp_path: Path) -> None:
    _model(tmp_path)
    p = doctor("--no-gpu", "--only", "model_config", "--model", str(tmp_path)).probe("model_config")
    assert p["code"] == "MODEL_WEIGHTS_INCOMPLETE" and "<repo>" in p["fix"] and "names it" in p["fix"]


def test_truncated_shard_is_corrupt_weights(tmp_path: Path) -> None:
    _model(tmp_path, "Qwen/Qwen3.5-27B")
    safetensors(tmp_path / "model-00002-of-00002.safetensors", 4096, cut=100)
    p = doctor("--no-gpu", "--only", "model_config", "--model", str(tmp_path)).probe("model_config")
    assert p["code"] == "MODEL_WEIGHTS_CORRUPT", p
    assert list(p["evidence"]["damaged_shards"]) == ["model-00002-of-00002.safetensors"]
    assert "model-00002-of-00002.safetensors" in p["fix"] and "model-00001" not in p["fix"]


def test_whole_shards_pass_the_header_check(tmp_path: Path) -> None:
    _model(tmp_path)
    safetensors(tmp_path / "model-00002-of-00002.safetensors", 4096)
    p = doctor("--no-gpu", "--only", "model_config", "--model", str(tmp_path)).probe("model_config")
    assert p["status"] != "fail" or p["code"] not in ("MODEL_WEIGHTS_CORRUPT", "MODEL_WEIGHTS_INCOMPLETE"), p


# --- C: independent root causes --------------------------------------------------------------------


def _r(name: str, status: Status, code: str | None = None, by: str | None = None) -> Result:
    stage = next(p.stage for p in engine.PROBES if p.name == name)
    if status is Status.FAIL:
        return failed(name, stage, f"{name} failed", code or "X", "fix " + name)
    if status is Status.SKIP:
        return skipped(name, stage, "skipped", skipped_by=by)
    return passed(name, stage, "ok")


def test_unrelated_failures_each_have_a_root_cause() -> None:
    """The H200 case: gdn_backward refused and model_forward out of memory do not depend on each other."""
    results = [
        _r("torch_cuda", Status.PASS),
        _r("fla_kernel", Status.PASS),
        _r("gdn_backward", Status.FAIL, "FLA_BACKWARD_NEEDS_TILELANG"),
        _r("model_config", Status.PASS),
        _r("model_forward", Status.FAIL, "GPU_MEMORY_TOO_SMALL"),
    ]
    s = engine.summarize(results)
    assert s["root_cause"]["probe"] == "gdn_backward"
    assert [(r["probe"], r["code"]) for r in s["root_causes"]] == [
        ("gdn_backward", "FLA_BACKWARD_NEEDS_TILELANG"),
        ("model_forward", "GPU_MEMORY_TOO_SMALL"),
    ]


def test_a_failure_below_a_failed_prerequisite_is_not_its_own_root() -> None:
    results = [
        _r("fla_kernel", Status.FAIL, "FLA_KERNEL_FAILED"),
        _r("gdn_backward", Status.SKIP, by="fla_kernel"),
        _r("model_config", Status.PASS),
        _r("model_forward", Status.FAIL, "MODEL_LOAD_FAILED"),  # requires fla_kernel
    ]
    assert [r["probe"] for r in engine.summarize(results)["root_causes"]] == ["fla_kernel"]


def test_real_run_lists_every_independent_root_cause(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    env = doctor_env({"TRITON_CACHE_DIR": str(tmp_path / "a-file")})
    argv = ("--no-gpu", "--only", "triton_cache_dir,model_config", "--model", str(tmp_path / "nope"))
    run = doctor(*argv, env=env)
    roots = run.report["summary"]["root_causes"]
    assert [r["code"] for r in roots] == ["TRITON_CACHE_UNWRITABLE", "MODEL_PATH_MISSING"]
    assert run.report["schema_version"] == SCHEMA_VERSION
    table = subprocess.run(
        [sys.executable, "-m", "mlstack_doctor", *argv], capture_output=True, text=True, env=env, timeout=120
    ).stdout
    assert "2 INDEPENDENT ROOT CAUSES" in table and "FIX: mkdir" not in table.split("2 INDEPENDENT")[0]
    assert table.count("   FIX: ") == 2


# --- D: a failed first import of torch in the GPU session ------------------------------------------


@needs_mounts
def test_failed_torch_import_is_reported_not_retried(torch_venv: Path, tmp_path: Path) -> None:
    """The H200 unprivileged case: the session's `import torch` failed (a file root installed 0600), and
    model_config's second `import torch` in the same process raised nonsense ("module functions cannot
    set METH_CLASS or METH_STATIC" on torch 2.11). Here torch/functional.py raises PermissionError on
    its first execution in a process only, so a retry in the same process gets past it into the
    half-initialised torch: the doctor must report the first error and name the package folder."""
    site = next(torch_venv.parent.parent.glob("lib/python*/site-packages"))
    real = site / "torch" / "functional.py"
    once = tmp_path / "functional.py"
    guard = (
        "import sys\n"
        "if not getattr(sys, '_mlstack_test_once', False):\n"
        "    sys._mlstack_test_once = True\n"
        f"    raise PermissionError(13, 'Permission denied', {str(real)!r})\n"
    )
    once.write_text(guard + real.read_text())
    argv = [str(torch_venv), "-m", "mlstack_doctor", "--json", "--quiet"]
    argv += ["--only", "nvidia_device_nodes,torch_cuda,model_config", "--model", "tiny"]
    script = f"mount --bind {shlex.quote(str(once))} {shlex.quote(str(real))} && exec {shlex.join(argv)}"
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=doctor_env(), timeout=300
    )
    report = json.loads(proc.stdout)
    validate(report)
    p = next(p for p in report["probes"] if p["name"] == "model_config")
    assert p["code"] == "PACKAGE_UNREADABLE", p
    assert "Permission denied" in p["summary"] and str(real) in p["summary"]
    assert p["fix"].startswith(f"chmod -R a+rX {site / 'torch'} ")
