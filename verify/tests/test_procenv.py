"""The process-environment probe's facts: what reaches the report (only the stack's variable families,
secrets redacted), the allocator-setting grammar, the stub libcuda, start-up hooks; the probe itself
through the real doctor."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from doctor_testlib import doctor_env, run_doctor
from mlstack_doctor import procenv


@pytest.mark.parametrize(
    "name,value",
    [
        ("NCCL_IB_HCA", "https://trainer:s3cr3t@registry.example/simple"),
        ("TRITON_REMOTE_CACHE_TOKEN", "abc"),
        ("PYTORCH_HUB_TOKEN", "x"),
        ("TORCHINDUCTOR_REMOTE", "hf_abcdefghijklmnopqrstuvwxyz012345"),
        ("CUDA_EXTRA", "ghp_abcdefghijklmnopqrstuvwxyz0123456789"),
        ("NCCL_NET_PLUGIN_CONF", "password=hunter2"),
        ("TRITON_API_KEY", "plain"),
    ],
)
def test_a_value_that_looks_like_a_secret_is_redacted(name: str, value: str) -> None:
    assert procenv.redact(name, value) == procenv.REDACTED
    assert procenv.stack_variables({name: value}) == {name: procenv.REDACTED}


@pytest.mark.parametrize(
    "name,value",
    [
        ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
        ("NCCL_SOCKET_IFNAME", "eth0"),
        ("LD_LIBRARY_PATH", "/usr/local/nvidia/lib64"),
        ("TRITON_CACHE_DIR", "/var/cache/triton"),
    ],
)
def test_ordinary_values_are_kept(name: str, value: str) -> None:
    assert procenv.stack_variables({name: value}) == {name: value}


def test_only_the_stack_families_leave_the_module() -> None:
    env = {
        "HF_TOKEN": "hf_x",
        "AWS_SECRET_ACCESS_KEY": "k",
        "PATH": "/bin",
        "HOME": "/root",
        "NCCL_DEBUG": "INFO",
        "OMP_NUM_THREADS": "4",
        "LD_PRELOAD": "/x.so",
        "MY_CUDA": "1",
    }
    assert set(procenv.stack_variables(env)) == {"NCCL_DEBUG", "OMP_NUM_THREADS", "LD_PRELOAD"}


@pytest.mark.parametrize(
    "value,problem",
    [
        ("expandable_segments:maybe", "expected True or False"),
        ("garbage", "is not key:value"),
        ("max_split_size_mb:abc", "whole number"),
        ("backend:foo", "native or cudaMallocAsync"),
        ("garbage_collection_threshold:2", "(0.0, 1.0)"),
        ("expandable_segment:True", "unknown key"),
    ],
)
def test_allocator_settings_torch_refuses(value: str, problem: str) -> None:
    found = procenv.alloc_conf_problems(value)
    assert found and problem in found[0], found


@pytest.mark.parametrize(
    "value",
    [
        "expandable_segments:True",
        "backend:cudaMallocAsync",
        "max_split_size_mb:512,garbage_collection_threshold:0.6",
        "roundup_power2_divisions:[256:1,512:2,>:8],expandable_segments:False",
    ],
)
def test_allocator_settings_torch_takes(value: str) -> None:
    assert procenv.alloc_conf_problems(value) == []


def test_a_stub_libcuda_on_ld_library_path_is_named(tmp_path: Path) -> None:
    stubs = tmp_path / "cuda" / "lib64" / "stubs"
    stubs.mkdir(parents=True)
    shutil.copy("/bin/true", stubs / "libcuda.so")
    (tmp_path / "link").mkdir()
    (tmp_path / "link" / "libcuda.so.1").symlink_to(stubs / "libcuda.so")
    found = procenv.stub_libcuda({"LD_LIBRARY_PATH": f"/nonexistent:{tmp_path / 'link'}"})
    assert found and found.startswith(str(tmp_path / "link" / "libcuda.so.1")) and "stubs" in found
    assert procenv.stub_libcuda({"LD_LIBRARY_PATH": "/nonexistent"}) is None


def test_a_sitecustomize_that_changes_a_variable_is_caught_in_the_real_interpreter(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import os\nos.environ['NCCL_P2P_DISABLE'] = '1'\n")
    code = (
        "import json; from mlstack_doctor import procenv; "
        "print(json.dumps([procenv.changed_at_start(), procenv.hooks()]))"
    )
    env = doctor_env({"PYTHONPATH": f"{tmp_path}:{doctor_env()['PYTHONPATH']}"})
    env.pop("NCCL_P2P_DISABLE", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    changed, hooks = json.loads(out.stdout)
    assert changed == {"NCCL_P2P_DISABLE": {"started_with": None, "now": "1"}}
    assert {"kind": "sitecustomize", "path": str(tmp_path / "sitecustomize.py")} in hooks


def test_the_report_and_the_metrics_carry_no_secret_and_no_other_variable(tmp_path: Path) -> None:
    secret = "hunter2-do-not-print"
    env = doctor_env(
        {
            "NCCL_IB_HCA": f"https://trainer:{secret}@example.invalid/",
            "TRITON_REMOTE_CACHE_TOKEN": secret,
            "HF_TOKEN": secret,
            "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        }
    )
    metrics = tmp_path / "doctor.prom"
    run = run_doctor("--no-gpu", "--only", "process_env", "--metrics", str(metrics), env=env)
    text = run.stdout + metrics.read_text()
    assert secret not in text
    variables = run.probe("process_env")["evidence"]["variables"]
    assert variables["NCCL_IB_HCA"] == variables["TRITON_REMOTE_CACHE_TOKEN"] == procenv.REDACTED
    assert variables["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "HF_TOKEN" not in variables and "PATH" not in variables


def test_an_unknown_uid_without_user_fails_and_names_the_uid() -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to become a uid without a passwd entry")
    env = doctor_env(unset=("USER", "LOGNAME"))
    env["HOME"] = "/tmp"
    become = ["setpriv", "--reuid=4243", "--regid=4243", "--clear-groups", sys.executable]
    # Whether uid 4243 can run this interpreter at all, asked apart from the doctor.
    can = subprocess.run(
        [*become, "-c", "pass"], env=env, capture_output=True, text=True, cwd="/", timeout=60
    )
    if can.returncode != 0:
        pytest.skip(f"uid 4243 cannot run this interpreter: {can.stderr[-300:]}")
    argv = [
        *become,
        "-m",
        "mlstack_doctor",
        "--json",
        "--quiet",
        "--no-gpu",
        "--only",
        "process_env",
    ]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd="/", timeout=120)
    assert proc.returncode in (0, 1), f"the doctor crashed (exit {proc.returncode}): {proc.stderr[-2000:]}"
    cause = json.loads(proc.stdout)["summary"]["root_cause"]
    assert (cause["probe"], cause["code"]) == ("process_env", "USER_UNKNOWN")
    assert "useradd -u 4243" in cause["fix"]


def test_home_unset_is_no_fault_when_the_passwd_home_is_usable(monkeypatch: pytest.MonkeyPatch) -> None:
    # pct exec and systemd units start the doctor without HOME; '~' then expands to the passwd home.
    monkeypatch.delenv("HOME", raising=False)
    ident = procenv.identity()
    assert ident["home"] is None
    assert "home_problem" not in ident, ident


def test_home_unset_with_an_unusable_passwd_home_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("HOME", raising=False)
    gone = tmp_path / "gone"
    entry = procenv.pwd.struct_passwd(("someone", "x", os.getuid(), os.getgid(), "", str(gone), "/bin/sh"))
    monkeypatch.setattr(procenv.pwd, "getpwuid", lambda uid: entry)
    assert procenv.identity()["home_problem"] == f"HOME is unset; the passwd home {gone} does not exist"


def test_home_unset_without_a_passwd_entry_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOME", raising=False)

    def missing(uid: int) -> None:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(procenv.pwd, "getpwuid", missing)
    assert "no passwd entry" in procenv.identity()["home_problem"]


def test_the_triton_cache_the_doctor_sets_itself_is_no_hooks_doing(tmp_path: Path) -> None:
    # A provisioned container: a sitecustomize is present (Debian ships one) and the doctor sets
    # TRITON_CACHE_DIR from --triton-cache-root; that change is the doctor's, not the hook's.
    (tmp_path / "sitecustomize.py").write_text("# nothing changed here\n")
    env = doctor_env({"PYTHONPATH": f"{tmp_path}:{doctor_env()['PYTHONPATH']}"})
    env.pop("TRITON_CACHE_DIR", None)
    run = run_doctor(
        "--no-gpu", "--only", "process_env", "--triton-cache-root", str(tmp_path / "triton"), env=env
    )
    probe = next(p for p in run.report["probes"] if p["name"] == "process_env")
    assert probe["evidence"]["changed_at_start"] == {}, probe["evidence"]
    assert "STARTUP_HOOK_CHANGES_ENV" not in json.dumps(probe), probe
