"""testbed/gpu-passthrough-check on this machine (no GPU, the testbed's dummy NVIDIA nodes), and pct's
direct backend it runs on. Containers use vmids 950-959 and are removed by the script and the tests.

The same script on a GPU machine is the proof on real hardware (testbed/README.md); here it must run,
check what it can (devN -> LXC, the cgroup allow list, node gid/mode, the permission fault) and say
honestly what it cannot (exit 3)."""

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "testbed" / "gpu-passthrough-check"
VMIDS = range(950, 960)


def run(argv: list[str], timeout: float = 600, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, **kw)  # type: ignore[call-overload]


def pct(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO / "testbed"), MLSTACK_TESTBED_PCT="direct")
    return run(["python3", "-m", "mlstack_testbed.node.pct", *args], timeout=timeout, env=env)


def mounts() -> str:
    return Path("/proc/self/mountinfo").read_text()


def leftovers() -> list[str]:
    out = [f"/var/lib/lxc/{v}" for v in VMIDS if Path(f"/var/lib/lxc/{v}").exists()]
    out += [line for line in mounts().splitlines() if any(f"/var/lib/lxc/{v}/" in line for v in VMIDS)]
    return out


@pytest.fixture(scope="module")
def checked(testbed: object, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """One run of the script (all cases, in parallel) against the dummy nodes."""
    out = tmp_path_factory.mktemp("gpucheck")
    r = run(
        [str(SCRIPT), "--vmid-base", "950", "--json", str(out / "summary.json"), "--report-dir", str(out)]
    )
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
    return {"rc": r.returncode, "stdout": r.stdout, "stderr": r.stderr, "summary": summary, "dir": out}


def case(checked: dict[str, object], name: str) -> dict[str, object]:
    cases = checked["summary"]["cases"]  # type: ignore[index]
    return next(c for c in cases if c["case"] == name)


def test_script_runs_and_exits_3_without_a_gpu(checked: dict[str, object]) -> None:
    """Exit 3: what could be checked was as expected, the GPU checks were not made, and it says which."""
    assert checked["rc"] == 3, f"{checked['stdout']}\n{checked['stderr']}"
    assert checked["summary"]["gpu"] is False  # type: ignore[index]
    out = str(checked["stdout"])
    assert "not checkable on this machine (no NVIDIA driver)" in out
    assert "torch CUDA, Triton's GPU target, FLA on the GPU" in out
    assert "driver: none" in out


def test_pass_case_passes_every_node_and_the_doctor_sees_no_driver(checked: dict[str, object]) -> None:
    c = case(checked, "pass")
    assert c["verdict"] == "not-checked"
    assert c["root_cause"]["code"] == "NVIDIA_NO_DRIVER"  # type: ignore[index]
    # every dummy node became an allow + a bind, from the project's own devN filter
    nodes = sorted(str(p) for p in Path("/dev").glob("nvidia*") if p.is_char_device())
    lines = "\n".join(c["lxc_device_lines"])  # type: ignore[arg-type]
    for node in nodes:
        st = os.stat(node)
        assert f"lxc.cgroup2.devices.allow = c {os.major(st.st_rdev)}:{os.minor(st.st_rdev)} rw" in lines
        assert f"passthrough{node} {node.lstrip('/')} none bind,create=file" in lines
    # a fresh node of each, made inside, opens as far as the (absent) driver: the cgroup allows them all
    assert set(c["cgroup_check"].values()) == {"ENXIO"}  # type: ignore[union-attr]
    report = json.loads((Path(str(checked["dir"])) / "doctor-pass.json").read_text())
    assert report["host"]["in_container"] is True
    probe = next(p for p in report["probes"] if p["name"] == "nvidia_device_nodes")
    seen = {n["path"]: n for n in probe["evidence"]["nodes"]}
    assert set(nodes) <= set(seen)
    assert all(seen[n]["mode"] == "0o666" and seen[n]["open"] == "ENXIO" for n in nodes)


def test_fault_node_drops_the_node_and_its_allow(checked: dict[str, object]) -> None:
    c = case(checked, "fault-node")
    assert c["verdict"] == "not-checked"  # the doctor stops at NVIDIA_NO_DRIVER before the missing node
    assert not any("/dev/nvidia-uvm " in ln for ln in c["lxc_device_lines"])  # type: ignore[union-attr]
    uvm = os.stat("/dev/nvidia-uvm").st_rdev
    assert not any(
        f" {os.major(uvm)}:{os.minor(uvm)} " in ln or f" {os.major(uvm)}:* " in ln
        for ln in c["lxc_device_lines"]  # type: ignore[union-attr]
    )
    assert c["cgroup_check"]["/dev/nvidia-uvm"] == "EPERM"  # type: ignore[index]
    assert c["cgroup_check"]["/dev/nvidia-uvm-tools"] == "ENXIO"  # type: ignore[index]


def test_fault_perm_gives_node_permission(checked: dict[str, object]) -> None:
    """Unprivileged CT, devN gid=0 mode=0660, the doctor as uid 1000 in group 44: NVIDIA_NODE_PERMISSION."""
    c = case(checked, "fault-perm")
    assert c["verdict"] == "ok", c
    assert "fallback" not in c  # a real unprivileged container here
    assert c["root_cause"]["code"] == "NVIDIA_NODE_PERMISSION"  # type: ignore[index]
    assert "mode=0666" in c["root_cause"]["fix"]  # type: ignore[index]


def test_fault_libs_is_reported_as_not_checkable(checked: dict[str, object]) -> None:
    c = case(checked, "fault-libs")
    assert c["verdict"] == "not-checked"
    assert "no driver libraries" in str(c["detail"])


def test_nothing_is_left_behind_and_the_host_root_is_untouched(checked: dict[str, object]) -> None:
    assert leftovers() == []
    assert not Path("/etc/ld.so.conf.d/mlstack-nvidia.conf").exists()
    assert not any(Path("/var/lib/mlstack-testbed/direct").glob("95*.conf"))


def test_direct_pct_speaks_pve(testbed: object) -> None:
    """pct's direct backend refuses what PVE refuses, in PVE's words, and exits 255."""
    r = pct("create", "954", "hostroot", "--dev0", "/dev/nvidia-nonexistent")
    assert r.returncode == 255 and "Device /dev/nvidia-nonexistent does not exist" in r.stderr
    r = pct("create", "954", "hostroot", "--dev0", "/tmp/../dev/null")
    assert r.returncode == 255 and "is not a valid device path" in r.stderr
    r = pct("create", "954", "hostroot", "--dev0", "/dev/shm")
    assert r.returncode == 255 and "/dev/shm is not a device" in r.stderr
    r = pct("start", "955")
    assert (
        r.returncode == 255 and "Configuration file 'nodes/testbed/lxc/955.conf' does not exist" in r.stderr
    )
    assert not Path("/var/lib/lxc/954").exists()


def test_hostroot_container_writes_only_its_overlay(testbed: object) -> None:
    """A container on the machine's own root writes into its tmpfs upper; destroy unmounts, never deletes."""
    vmid = "956"
    canary = Path("/etc/mlstack-gpucheck-canary")
    try:
        assert pct("create", vmid, "hostroot", "--dev0", "/dev/nvidia0,gid=44,mode=0666").returncode == 0
        assert pct("start", vmid).returncode == 0
        r = pct(
            "exec", vmid, "--", "sh", "-c", f"echo inside > {canary} && cat {canary} && ls -ln /dev/nvidia0"
        )
        assert r.returncode == 0 and "inside" in r.stdout and " 0 44 195, 0 " in r.stdout, r.stderr
        assert not canary.exists()
        r = pct("destroy", vmid)
        assert r.returncode == 255 and f"CT {vmid} is running - destroy failed" in r.stderr
        assert pct("stop", vmid).returncode == 0
        assert pct("destroy", vmid).returncode == 0
        assert not Path(f"/var/lib/lxc/{vmid}").exists()
        assert Path("/etc/hostname").exists() and Path("/usr/bin/python3").exists()
    finally:
        pct("stop", vmid)
        pct("destroy", vmid)
    assert leftovers() == []


@pytest.fixture(scope="module")
def lxc_debs() -> Path:
    """LXC's .debs as the script says to carry them (`apt-get download` of host.LXC_DEBS on a machine with
    network: this one), in an ignored folder of the checkout, kept between runs."""
    from mlstack_testbed.gpucheck.host import LXC_DEBS

    debs = REPO / "build" / "lxc-debs"
    debs.mkdir(parents=True, exist_ok=True)
    have = {p.name.split("_", 1)[0] for p in debs.glob("*.deb")}
    if missing := [d for d in LXC_DEBS if d not in have]:
        r = run(["apt-get", "download", *missing], cwd=debs)
        assert r.returncode == 0, f"apt-get download {' '.join(missing)}: {r.stderr[-2000:]}"
    assert {p.name.split("_", 1)[0] for p in debs.glob("*.deb")} >= set(LXC_DEBS)
    return debs


def test_runs_with_lxc_from_carried_debs_only(testbed: object, lxc_debs: Path, tmp_path: Path) -> None:
    """As on the GPU machine: the system's LXC hidden (private mount namespace), LXC from .debs."""
    hide = " ".join(
        f"mount -t tmpfs tmpfs {d};"
        for d in ("/usr/share/lxc", "/usr/lib/x86_64-linux-gnu/lxc", "/usr/libexec/lxc")
        if Path(d).is_dir()
    )
    # The system's LXC programs and library too: nothing of it can stand in for a .deb left out.
    system = [*Path("/usr/bin").glob("lxc-*"), *Path("/usr/lib/x86_64-linux-gnu").glob("liblxc.so*")]
    hide += " ".join(f"mount --bind /dev/null {f};" for f in system)
    cmd = (
        f"{hide} exec {SCRIPT} --lxc-from-debs --lxc-debs {lxc_debs} --lxc-prefix {tmp_path}/lxc "
        f"--vmid-base 955 --cases fault-perm --json {tmp_path}/s.json"
    )
    r = run(["unshare", "-m", "--propagation", "private", "sh", "-c", cmd])
    assert r.returncode == 3, f"{r.stdout}\n{r.stderr}"
    assert f"unpacked from {len(list(lxc_debs.glob('*.deb')))} .deb" in r.stdout, r.stdout
    c = json.loads((tmp_path / "s.json").read_text())["cases"][0]
    assert c["verdict"] == "ok" and c["root_cause"]["code"] == "NVIDIA_NODE_PERMISSION"
    assert leftovers() == []
