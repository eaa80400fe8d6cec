"""The testbed's stand-in NVIDIA driver: the runfile it builds (real shared objects, NVIDIA's sonames and
flags), the node's driver state as nvidia-smi answers it, and /proc/driver shown to one mount namespace
only. The install itself into a container is tests/provision/test_driver_upgrade.py."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlstack_testbed import paths
from mlstack_testbed.node import nvdriver, nvsmi

V1, V2 = "550.54.14", "560.35.03"
ROLE_FLAGS = ["--silent", "--no-kernel-module", "--no-questions", "--ui=none", "--no-x-check"]
needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The testbed's state files in a folder of this test's own."""
    monkeypatch.setattr(paths, "DRIVER_PROC_DIR", tmp_path / "proc-driver")
    monkeypatch.setattr(paths, "GPU_MODEL_FILE", tmp_path / "gpu-model")
    monkeypatch.setattr(paths, "GPU_ANSWER_FILE", tmp_path / "nvidia-smi.csv")
    return tmp_path


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


@needs_gcc
def test_the_runfile_carries_libcuda_and_nvml_with_nvidias_sonames(tmp_path: Path) -> None:
    run = nvdriver.runfile(V2, tmp_path / "files")
    assert run == tmp_path / "files" / f"NVIDIA-Linux-x86_64-{V2}.run"
    assert os.access(run, os.X_OK) and run.read_text().startswith("#!/bin/sh\n")
    r = _run([str(run), "--extract-only"], tmp_path)
    assert r.returncode == 0, r.stderr
    out = tmp_path / f"NVIDIA-Linux-x86_64-{V2}"
    assert sorted(p.name for p in out.iterdir()) == [f"libcuda.so.{V2}", f"libnvidia-ml.so.{V2}"]
    for name, soname in (
        (f"libcuda.so.{V2}", "libcuda.so.1"),
        (f"libnvidia-ml.so.{V2}", "libnvidia-ml.so.1"),
    ):
        dynamic = _run(["readelf", "-d", str(out / name)], tmp_path).stdout
        assert f"Library soname: [{soname}]" in dynamic
        assert "NEEDED" not in dynamic  # loads under any glibc: the container's may be older
    # Real entry points that answer as a library with no GPU behind it.
    assert ctypes.CDLL(str(out / f"libcuda.so.{V2}")).cuInit(0) == 100  # CUDA_ERROR_NO_DEVICE
    assert ctypes.CDLL(str(out / f"libnvidia-ml.so.{V2}")).nvmlInit_v2() == 9  # NVML_ERROR_DRIVER_NOT_LOADED


@needs_gcc
@pytest.mark.parametrize(
    ("flags", "said"),
    [
        ([*ROLE_FLAGS, "--bogus"], "ERROR: Unrecognized option: '--bogus'"),
        ([f for f in ROLE_FLAGS if f != "--no-kernel-module"], "run it with --no-kernel-module"),
    ],
    ids=["unknown-flag", "with-kernel-module"],
)
def test_the_runfile_refuses_what_it_cannot_do_before_installing(
    flags: list[str], said: str, tmp_path: Path
) -> None:
    run = nvdriver.runfile(V1, tmp_path)
    r = _run([str(run), *flags], tmp_path)
    assert r.returncode == 1 and said in r.stderr


@pytest.mark.parametrize("version", ["", "560", "560.35.03; rm -rf /", "v560.35.03"])
def test_only_a_driver_version_is_accepted(version: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is not a driver version"):
        nvdriver.runfile(version, tmp_path)


def test_the_node_reports_the_driver_as_proc_and_nvidia_smi_do(state: Path) -> None:
    query = ["--query-gpu=index,driver_version", "--format=csv,noheader"]
    assert nvdriver.current() is None
    assert nvsmi.answer(query)[0] == nvsmi.EXIT_NO_DRIVER
    assert nvdriver.select(V1, []) is True and nvdriver.select(V1, []) is False
    text = (state / "proc-driver" / "nvidia" / "version").read_text()
    assert text.startswith(f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {V1}  ")
    assert nvdriver.current() == V1
    # A driver and no GPU model recorded: the driver finds no GPU.
    assert nvsmi.answer(query) == (6, "No devices were found\n")
    nvsmi.select("h200")
    code, out = nvsmi.answer(query)
    assert code == 0 and out.splitlines() == [f"{i}, {V1}" for i in range(len(out.splitlines()))] and out
    assert nvdriver.select(V2, []) is True
    assert {line.split(", ")[1] for line in nvsmi.answer(query)[1].splitlines()} == {V2}
    assert nvdriver.select(None, []) is True and nvdriver.current() is None
    assert {line.split(", ")[1] for line in nvsmi.answer(query)[1].splitlines()} == {"[N/A]"}


@pytest.fixture
def private_namespace() -> Iterator[int]:
    """A process in a private mount namespace of its own, as each node's sshd is."""
    if os.geteuid() != 0:
        pytest.skip("mount namespaces need root")
    proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "60"])
    try:
        deadline = time.monotonic() + 5
        own = os.readlink("/proc/self/ns/mnt")
        while os.readlink(f"/proc/{proc.pid}/ns/mnt") == own and time.monotonic() < deadline:
            time.sleep(0.05)
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_only_the_nodes_namespace_sees_the_driver(state: Path, private_namespace: int) -> None:
    pid = private_namespace
    seen = Path(f"/proc/{pid}/root/proc/driver/nvidia/version")
    assert nvdriver.select(V1, [pid]) is True
    assert V1 in seen.read_text()
    assert (
        not Path("/proc/driver/nvidia/version").exists()
        or V1 not in Path("/proc/driver/nvidia/version").read_text()
    )
    # A later change reaches the running namespace through the same mount, without binding again.
    assert nvdriver.show_to([pid]) == []
    nvdriver.select(V2, [pid])
    assert V2 in seen.read_text()
    nvdriver.select(None, [pid])
    assert not seen.parent.exists()
