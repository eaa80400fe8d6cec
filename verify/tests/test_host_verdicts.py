"""Host verdicts on faults a user hits: CUDA_VISIBLE_DEVICES naming GPUs that are not there, a wrong
TRITON_LIBCUDA_PATH, a stale libcuda ahead of the right one, driver halves of different versions, an
unreadable /proc/driver/nvidia/version, MIG capability nodes a non-MIG job never opens, containers
told from VMs.

Files, folders, the environment and /dev are real (a mount namespace with mknod'ed nodes, the doctor
run as uid 1000). NVML is the one stubbed boundary (no driver here), with answers shaped like the
H200's (`tests/data/h200`); the GPU commands that inject the same faults for real are in
/work/notes/faults-host.md's rows.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from doctor_testlib import SRC, doctor_env, run_doctor
from mlstack_doctor import hostenv, libcuda, runner
from mlstack_doctor.context import Context, Options
from mlstack_doctor.probes import host
from mlstack_doctor.record import Status

UUID0 = "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"
UUID1 = "GPU-1f2e3d4c-0000-4106-c12f-20bd9faed9f6"
MIG0 = "MIG-5c89852c-d268-c3f3-1b07-005d5ae0ec0d"
KMOD = "580.159.04"


def gpu(index: int, uuid: str, *, mig: bool | None = None, migs: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "index": index,
        "name": "NVIDIA H200",
        "uuid": uuid,
        "minor": index,
        "memory_total_gib": 140.4,
        "compute_capability": "9.0",
        "mig_mode": mig,
        "mig_devices": list(migs),
    }


def nvml_ok(*gpus: dict[str, Any], version: str = KMOD) -> dict[str, Any]:
    return {
        "ok": True,
        "driver_version": version,
        "count": len(gpus),
        "gpus": list(gpus),
        "library": f"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{version}",
    }


NVML_DOWN = {"ok": False, "error": "OSError: cannot load libnvidia-ml.so.1: not found", "stage": "load"}


@pytest.fixture
def fake_driver(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    """A driver install in tmp folders: /proc/driver/nvidia/version, the ldconfig cache, driver folders."""

    class Driver:
        proc = tmp_path / "proc_version"

        def __init__(self) -> None:
            self.cache: list[str] = []
            self.proc.write_text(
                f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {KMOD}  Release Build\n"
            )
            monkeypatch.setattr(host, "PROC_VERSION", str(self.proc))
            monkeypatch.setattr(libcuda, "LIB_DIRS", (str(tmp_path / "nowhere"),))
            monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
            monkeypatch.delenv("TRITON_LIBCUDA_PATH", raising=False)
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
            real_run = runner.run

            def run(argv: list[str], **kw: Any) -> runner.RunResult:
                if argv[-1] == "-p":  # ldconfig -p: the cache this fake install has
                    lines = "".join(f"\tlibcuda.so.1 (libc6,x86-64) => {p}\n" for p in self.cache)
                    return runner.RunResult(
                        argv, 0, f"{len(self.cache)} libs found in cache\n{lines}", "", 0.0
                    )
                return real_run(argv, **kw)

            monkeypatch.setattr(runner, "run", run)
            self.nvml(nvml_ok(gpu(0, UUID0)))

        def libcuda(self, folder: str, version: str = KMOD) -> str:
            """A libcuda.so.1 -> libcuda.so.<version> pair, as the driver installs it."""
            d = tmp_path / folder
            d.mkdir(parents=True, exist_ok=True)
            (d / f"libcuda.so.{version}").write_bytes(b"\x7fELF")
            (d / "libcuda.so.1").symlink_to(f"libcuda.so.{version}")
            return str(d)

        def nvml(self, answer: dict[str, Any]) -> None:
            reply = runner.WorkerResult(runner.RunResult(["w_nvml.py"], 0, "", "", 0.1), dict(answer))
            monkeypatch.setattr(runner, "run_worker", lambda *a, **k: reply)

    yield Driver()


def host_probes(**env: str) -> dict[str, Any]:
    """The driver and CUDA_VISIBLE_DEVICES probes with `env` set for them only (restored after)."""
    ctx = Context(Options())
    with mock.patch.dict(os.environ, env):
        return {r.name: r for r in (host.driver(ctx), host.cuda_visible_devices(ctx))}


@pytest.fixture(autouse=True)
def environment_unchanged() -> Iterator[None]:
    """No test leaves a variable set for the rest of the session (CUDA_VISIBLE_DEVICES, LD_LIBRARY_PATH and
    TRITON_LIBCUDA_PATH change what later doctor runs see): checked after every other fixture's teardown."""
    before = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    yield
    after = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert not changed, {k: (before.get(k), after.get(k)) for k in changed}


# --- CUDA_VISIBLE_DEVICES ---------------------------------------------------------------------------


def test_a_uuid_matching_no_gpu_is_named_with_a_fix_from_the_real_gpus(fake_driver: Any) -> None:
    fake_driver.cache = [fake_driver.libcuda("lib") + "/libcuda.so.1"]
    r = host_probes(CUDA_VISIBLE_DEVICES="GPU-00000000-dead-beef-0000-000000000000")["cuda_visible_devices"]
    assert r.status is Status.FAIL and r.code == "CUDA_VISIBLE_DEVICES_UNMATCHED"
    assert "GPU-00000000-dead-beef" in r.summary and "no GPU is visible" in r.summary
    assert f"export CUDA_VISIBLE_DEVICES={UUID0}" in r.fix and "unset CUDA_VISIBLE_DEVICES" in r.fix


def test_an_unmatched_entry_hides_the_ones_after_it(fake_driver: Any) -> None:
    fake_driver.cache = [fake_driver.libcuda("lib") + "/libcuda.so.1"]
    fake_driver.nvml(nvml_ok(gpu(0, UUID0), gpu(1, UUID1)))
    r = host_probes(CUDA_VISIBLE_DEVICES=f"0,GPU-ffff,{UUID1}")["cuda_visible_devices"]
    assert r.status is Status.WARN and r.code == "CUDA_VISIBLE_DEVICES_UNMATCHED"
    assert r.evidence["unmatched"] == "GPU-ffff" and r.evidence["hidden_after"] == [UUID1]
    assert "export CUDA_VISIBLE_DEVICES=0 " in r.fix


@pytest.mark.parametrize(
    "value",
    [UUID0, UUID0[:12], UUID0.removeprefix("GPU-")[:8], f"{UUID1},0", "1", MIG0[:10]],
    ids=["full-uuid", "prefix", "prefix-without-GPU-", "uuid-then-index", "index", "mig-prefix"],
)
def test_entries_cuda_matches_pass(fake_driver: Any, value: str) -> None:
    fake_driver.cache = [fake_driver.libcuda("lib") + "/libcuda.so.1"]
    fake_driver.nvml(nvml_ok(gpu(0, UUID0, mig=True, migs=(MIG0,)), gpu(1, UUID1)))
    r = host_probes(CUDA_VISIBLE_DEVICES=value)["cuda_visible_devices"]
    assert r.status is Status.PASS, r.summary


@pytest.mark.parametrize("value", ["2", "GPU-", "MIG-ffff"], ids=["index-past-count", "ambiguous", "no-mig"])
def test_entries_cuda_cannot_match_fail(fake_driver: Any, value: str) -> None:
    fake_driver.cache = [fake_driver.libcuda("lib") + "/libcuda.so.1"]
    fake_driver.nvml(nvml_ok(gpu(0, UUID0, mig=True, migs=(MIG0,)), gpu(1, UUID1)))
    r = host_probes(CUDA_VISIBLE_DEVICES=value)["cuda_visible_devices"]
    assert r.status is Status.FAIL and r.code == "CUDA_VISIBLE_DEVICES_UNMATCHED", r.summary


def test_empty_still_hides_everything(fake_driver: Any) -> None:
    fake_driver.cache = [fake_driver.libcuda("lib") + "/libcuda.so.1"]
    assert host_probes(CUDA_VISIBLE_DEVICES="-1")["cuda_visible_devices"].code == "CUDA_HIDDEN"


def test_uuid_entries_nvml_cannot_check_are_said_unchecked_for_real() -> None:
    """Here NVML has no library: the real doctor must say it could not check, not pass."""
    run = run_doctor(
        "--only", "cuda_visible_devices", env=doctor_env({"CUDA_VISIBLE_DEVICES": "GPU-deadbeef"})
    )
    probe = run.probe("cuda_visible_devices")
    assert probe["status"] == "warn" and "could not be checked" in probe["summary"]


# --- libcuda: TRITON_LIBCUDA_PATH, the linker cache, LD_LIBRARY_PATH ---------------------------------


def test_triton_libcuda_path_without_libcuda_is_the_cause_and_never_the_fix(
    fake_driver: Any, tmp_path: Path
) -> None:
    fake_driver.cache = [fake_driver.libcuda("lib") + "/libcuda.so.1"]
    (tmp_path / "empty").mkdir()
    r = host_probes(TRITON_LIBCUDA_PATH=str(tmp_path / "empty"))["nvidia_driver"]
    assert r.status is Status.FAIL and r.code == "TRITON_LIBCUDA_PATH_WRONG"
    assert "not in the linker cache" not in r.summary and "ldconfig finds" in r.summary
    assert r.fix.startswith("unset TRITON_LIBCUDA_PATH") and "TRITON_LIBCUDA_PATH=" not in r.fix


def test_triton_libcuda_path_in_a_default_linker_folder_is_a_warn(
    fake_driver: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """-L<wrong> still links when ldconfig's folder is one the linker searches anyway: wrong, not fatal."""
    right = fake_driver.libcuda("lib")
    fake_driver.cache = [right + "/libcuda.so.1"]
    monkeypatch.setattr(libcuda, "LINKER_DIRS", (right,))
    r = host_probes(TRITON_LIBCUDA_PATH=str(tmp_path / "empty"))["nvidia_driver"]
    assert r.status is Status.WARN and r.code == "TRITON_LIBCUDA_PATH_WRONG" and r.fix.startswith("unset")


def test_triton_libcuda_path_fix_points_at_the_loaders_folder(fake_driver: Any, tmp_path: Path) -> None:
    found = fake_driver.libcuda("ld")
    r = host_probes(TRITON_LIBCUDA_PATH=str(tmp_path / "empty"), LD_LIBRARY_PATH=found)["nvidia_driver"]
    assert r.code == "TRITON_LIBCUDA_PATH_WRONG" and r.fix == f"export TRITON_LIBCUDA_PATH={found}"


def test_triton_libcuda_path_list_is_one_folder_to_triton_and_the_fix_uses_what_is_on_disk(
    fake_driver: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = fake_driver.libcuda("drivers")
    monkeypatch.setattr(libcuda, "LIB_DIRS", (found,))
    r = host_probes(TRITON_LIBCUDA_PATH=f"{found}:{tmp_path / 'gone'}")["nvidia_driver"]
    assert r.code == "TRITON_LIBCUDA_PATH_WRONG" and "one folder" in r.summary
    assert r.fix == f"echo {found} > /etc/ld.so.conf.d/nvidia.conf && ldconfig && unset TRITON_LIBCUDA_PATH"


def test_libcuda_nowhere_says_so_and_suggests_no_placeholder_path(fake_driver: Any) -> None:
    r = host_probes()["nvidia_driver"]
    assert r.code == "LIBCUDA_NOT_FOUND" and "found nowhere" in r.summary
    assert "TRITON_LIBCUDA_PATH" not in r.fix and "<dir" not in r.fix and KMOD in r.fix


def test_libnvidia_ml_without_libcuda_in_its_folder_is_half_installed(
    fake_driver: Any, tmp_path: Path
) -> None:
    """NVML loads from a folder that lacks libcuda.so.1: that folder is searched too, and found wanting."""
    (tmp_path / "nv").mkdir()
    fake_driver.nvml({**nvml_ok(gpu(0, UUID0)), "library": str(tmp_path / "nv" / "libnvidia-ml.so.1")})
    r = host_probes()["nvidia_driver"]
    assert r.code == "LIBCUDA_NOT_FOUND" and str(tmp_path / "nv") in r.evidence["libcuda_search"]["searched"]


def test_libcuda_outside_the_linker_cache_names_its_folder(
    fake_driver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = fake_driver.libcuda("drivers")
    monkeypatch.setattr(libcuda, "LIB_DIRS", (found,))
    r = host_probes()["nvidia_driver"]
    assert (
        r.code == "LIBCUDA_NOT_IN_LDCACHE"
        and r.fix == f"echo {found} > /etc/ld.so.conf.d/nvidia.conf && ldconfig"
    )


def test_triton_libcuda_path_right_but_loader_blind_names_the_cache_fix(fake_driver: Any) -> None:
    """Triton links through the variable, but torch's dlopen("libcuda.so.1") never looks there."""
    right = fake_driver.libcuda("triton-only")
    r = host_probes(TRITON_LIBCUDA_PATH=right)["nvidia_driver"]
    assert r.code == "LIBCUDA_NOT_IN_LDCACHE" and right in r.fix


def test_a_stale_libcuda_on_ld_library_path_shadows_the_right_one(fake_driver: Any) -> None:
    fake_driver.cache = [fake_driver.libcuda("lib") + "/libcuda.so.1"]
    stale = fake_driver.libcuda("old-driver", "535.104.05")
    r = host_probes(LD_LIBRARY_PATH=f"/nonexistent:{stale}")["nvidia_driver"]
    assert r.status is Status.FAIL and r.code == "LIBCUDA_SHADOWED"
    assert "535.104.05" in r.summary and KMOD in r.summary and f"remove {stale} from LD_LIBRARY_PATH" in r.fix


def test_one_libcuda_on_ld_library_path_against_another_module_is_a_mismatch(
    fake_driver: Any, tmp_path: Path
) -> None:
    """The H200's layout (libcuda on LD_LIBRARY_PATH and in the cache, one folder) after a module upgrade:
    nothing shadows anything; the user space is stale."""
    here = fake_driver.libcuda("nvidia-lib", "570.86.15")
    fake_driver.cache = [here + "/libcuda.so.1"]
    r = host_probes(LD_LIBRARY_PATH=here)["nvidia_driver"]
    assert r.code == "DRIVER_API_MISMATCH" and KMOD in r.fix and "570.86.15" in r.fix


def test_ld_library_path_with_the_right_libcuda_passes(fake_driver: Any) -> None:
    fake_driver.cache = [fake_driver.libcuda("lib") + "/libcuda.so.1"]
    r = host_probes(LD_LIBRARY_PATH=fake_driver.libcuda("also-right"))["nvidia_driver"]
    assert r.status is Status.PASS, r.summary


# --- driver versions ----------------------------------------------------------------------------------


def test_stale_user_space_after_a_node_upgrade_names_both_versions(fake_driver: Any, tmp_path: Path) -> None:
    """NVML refuses to initialise (LIB_RM_VERSION_MISMATCH): the fix still names the container's version."""
    fake_driver.cache = [fake_driver.libcuda("lib", "570.86.15") + "/libcuda.so.1"]
    lib = tmp_path / "lib" / "libnvidia-ml.so.570.86.15"
    lib.write_bytes(b"\x7fELF")
    fake_driver.nvml(
        {
            "ok": False,
            "error": "nvmlInit_v2 failed: NVML_ERROR_LIB_RM_VERSION_MISMATCH (Driver/library version "
            "mismatch)",
            "library": str(lib),
        }
    )
    r = host_probes()["nvidia_driver"]
    assert r.code == "DRIVER_API_MISMATCH" and KMOD in r.fix and "570.86.15" in r.fix


def test_versions_that_differ_name_both(fake_driver: Any) -> None:
    fake_driver.cache = [fake_driver.libcuda("lib", "570.86.15") + "/libcuda.so.1"]
    r = host_probes()["nvidia_driver"]
    assert r.code == "DRIVER_API_MISMATCH" and KMOD in r.fix and "570.86.15" in r.fix


def test_unreadable_kernel_module_version_is_a_warn_not_a_pass(fake_driver: Any, tmp_path: Path) -> None:
    fake_driver.cache = [fake_driver.libcuda("lib") + "/libcuda.so.1"]
    fake_driver.proc.unlink()
    r = host_probes()["nvidia_driver"]
    assert r.status is Status.WARN and r.code == "KERNEL_MODULE_VERSION_UNKNOWN"
    assert "not compared" in r.summary and KMOD in r.fix  # NVML's version, to compare by hand


# --- device nodes: a real /dev in a mount namespace, the doctor as uid 1000 ---------------------------

CAN_NAMESPACE = os.geteuid() == 0 and shutil.which("unshare") and shutil.which("setpriv")
needs_root = pytest.mark.skipif(not CAN_NAMESPACE, reason="needs root, unshare and setpriv")

# Stand-ins for the driver's nodes: /dev/null's numbers open fine without a driver, the modes and owners
# are the driver's (caps 0400/0444 root's, the rest 0666), so permissions decide as on a real host.
STANDARD_HOST = {
    "nvidia0": 0o666,
    "nvidiactl": 0o666,
    "nvidia-uvm": 0o666,
    "nvidia-uvm-tools": 0o666,
    "nvidia-caps/nvidia-cap1": 0o400,
    "nvidia-caps/nvidia-cap2": 0o444,
}

# Runs device_nodes in the namespace; NVML's answer (the stubbed boundary) comes in argv.
PROBE_SCRIPT = """
import json, sys
from mlstack_doctor import runner
from mlstack_doctor.context import Context, Options
from mlstack_doctor.probes import host
answer = json.loads(sys.argv[1])
if answer is not None:
    runner.run_worker = lambda *a, **k: runner.WorkerResult(runner.RunResult([], 0, "", "", 0.0), answer)
print(json.dumps(host.device_nodes(Context(Options())).to_json()))
"""


def in_fake_dev(nodes: dict[str, int], argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run argv as uid 1000 with /dev replaced (in a private mount namespace) by `nodes`."""
    dev = Path(tempfile.mkdtemp(prefix="mlstack-dev-"))
    try:
        dev.chmod(0o755)
        for name, mode in {"null": 0o666, "zero": 0o666, "urandom": 0o666, **nodes}.items():
            (dev / name).parent.mkdir(exist_ok=True, mode=0o755)
            minor = {"zero": 5, "urandom": 9}.get(name, 3)
            subprocess.run(["mknod", "-m", oct(mode)[2:], str(dev / name), "c", "1", str(minor)], check=True)
        inner = ["setpriv", "--reuid", "1000", "--regid", "1000", "--clear-groups", *argv]
        script = 'mount --bind "$0" /dev && exec "$@"'
        return subprocess.run(
            ["unshare", "-m", "sh", "-c", script, str(dev), *inner],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
    finally:
        shutil.rmtree(dev)


def device_nodes_as_user(nodes: dict[str, int], answer: dict[str, Any] | None, **env: str) -> dict[str, Any]:
    full = {**doctor_env(unset=("CUDA_VISIBLE_DEVICES",)), "PYTHONPATH": str(SRC), **env}
    proc = in_fake_dev(nodes, [sys.executable, "-c", PROBE_SCRIPT, json.dumps(answer)], full)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@needs_root
def test_caps_nodes_do_not_fail_a_job_without_mig_for_real() -> None:
    """The doctor itself, as uid 1000 on a standard host's nodes: no NVIDIA_NODE_PERMISSION."""
    env = {**doctor_env(unset=("CUDA_VISIBLE_DEVICES",)), "HOME": "/tmp"}
    argv = [sys.executable, "-m", "mlstack_doctor", "--only", "nvidia_device_nodes", "--json", "--quiet"]
    proc = in_fake_dev(STANDARD_HOST, argv, env)
    probe = json.loads(proc.stdout)["probes"][0]
    assert probe["code"] != "NVIDIA_NODE_PERMISSION", probe
    assert probe["status"] == "warn" and "only MIG needs them" in probe["summary"]  # NVML silent here
    assert set(probe["evidence"]["not_needed"]) == {
        "/dev/nvidia-caps/nvidia-cap1",
        "/dev/nvidia-caps/nvidia-cap2",
    }


@needs_root
def test_mig_off_caps_unreadable_passes() -> None:
    r = device_nodes_as_user(STANDARD_HOST, nvml_ok(gpu(0, UUID0, mig=False)))
    assert r["status"] == "pass" and "not need" in r["summary"], r


@needs_root
def test_missing_uvm_is_still_reported_when_caps_are_unreadable() -> None:
    nodes = {k: v for k, v in STANDARD_HOST.items() if not k.startswith("nvidia-uvm")}
    r = device_nodes_as_user(nodes, nvml_ok(gpu(0, UUID0, mig=False)))
    assert r["status"] == "warn" and r["code"] == "NVIDIA_UVM_MISSING", r


@needs_root
@pytest.mark.parametrize(
    ("answer", "env"),
    [(nvml_ok(gpu(0, UUID0, mig=True, migs=(MIG0,))), {}), (None, {"CUDA_VISIBLE_DEVICES": MIG0})],
    ids=["nvml-mig-mode-on", "mig-device-selected"],
)
def test_caps_nodes_fail_when_mig_is_in_use(answer: dict[str, Any] | None, env: dict[str, str]) -> None:
    r = device_nodes_as_user(STANDARD_HOST, answer, **env)
    assert r["status"] == "fail" and r["code"] == "NVIDIA_NODE_PERMISSION"
    assert "nvidia-cap1" in r["summary"]


@needs_root
def test_an_unopenable_gpu_node_that_is_not_visible_does_not_fail() -> None:
    nodes = {**STANDARD_HOST, "nvidia1": 0o600}
    answer = nvml_ok(gpu(0, UUID0, mig=False), gpu(1, UUID1, mig=False))
    r = device_nodes_as_user(nodes, answer, CUDA_VISIBLE_DEVICES=UUID0)
    assert r["status"] == "pass" and "/dev/nvidia1" in r["evidence"]["not_needed"], r
    r = device_nodes_as_user(nodes, answer, CUDA_VISIBLE_DEVICES=UUID1)
    assert r["code"] == "NVIDIA_NODE_PERMISSION" and r["summary"].startswith("/dev/nvidia1:"), r


# --- in_container -----------------------------------------------------------------------------------


def fake_root(tmp_path: Path, files: dict[str, str | bytes]) -> str:
    for rel, content in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(tmp_path)


VM_MOUNTINFO = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard\n"
OVERLAY_MOUNTINFO = "500 400 0:52 / / rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u\n"


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        # A VM booted from an image exported from Docker (this machine): /.dockerenv, ext4 root, hypervisor.
        (
            {
                ".dockerenv": "",
                "proc/self/mountinfo": VM_MOUNTINFO,
                "proc/cpuinfo": "flags\t: fpu hypervisor\n",
            },
            False,
        ),
        ({"proc/1/environ": b"HOME=/\0DEVCONTAINER=1\0", "proc/self/mountinfo": VM_MOUNTINFO}, False),
        ({"proc/1/environ": b"HOME=/\0container=lxc\0", "proc/self/mountinfo": VM_MOUNTINFO}, True),
        ({"run/systemd/container": "lxc\n", "proc/self/mountinfo": VM_MOUNTINFO}, True),
        ({".dockerenv": "", "proc/self/mountinfo": OVERLAY_MOUNTINFO}, True),
        ({"run/.containerenv": "", "proc/self/mountinfo": VM_MOUNTINFO}, True),
        ({"proc/1/cgroup": "0::/kubepods/burstable/pod1/abc\n", "proc/self/mountinfo": VM_MOUNTINFO}, True),
    ],
    ids=[
        "vm-from-docker-image",
        "var-ending-in-container",
        "lxc-environ",
        "systemd-container",
        "docker",
        "podman",
        "kubepods-cgroup",
    ],
)
def test_container_detection(tmp_path: Path, files: dict[str, str | bytes], expected: bool) -> None:
    inside, evidence = hostenv.container(fake_root(tmp_path, files))
    assert inside is expected, evidence
    assert evidence  # what was read is always reported


def test_the_vm_evidence_says_why_dockerenv_was_ignored(tmp_path: Path) -> None:
    files = {".dockerenv": "", "proc/self/mountinfo": VM_MOUNTINFO, "proc/cpuinfo": "flags\t: hypervisor\n"}
    _, evidence = hostenv.container(fake_root(tmp_path, files))
    assert any("/.dockerenv ignored" in e and "/dev/vda" in e for e in evidence)
    assert any("virtual machine" in e for e in evidence)


@pytest.mark.skipif(
    not any("/.dockerenv ignored" in e for e in hostenv.container()[1]),
    reason="only on a VM whose image carries /.dockerenv (as the machines this suite runs on do)",
)
def test_the_report_calls_this_vm_no_container() -> None:
    run = run_doctor("--only", "cuda_visible_devices", env=doctor_env(unset=("CUDA_VISIBLE_DEVICES",)))
    assert run.report["host"]["in_container"] is False
    assert any("/.dockerenv ignored" in e for e in run.report["host"]["container_evidence"])
