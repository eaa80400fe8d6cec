"""The NCCL tier's gloo path for real: the doctor spawns torch.distributed ranks on the CPU (torch of the
test venv), checks the exact sums and measures the sweep; then real faults: a tiny /dev/shm (a tmpfs in
a mount namespace of its own), an interface name the machine lacks, and a rank that stops (SIGSTOP)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from doctor_testlib import DoctorRun, doctor_env, run_doctor

GLOO = ("--tier", "nccl", "--no-gpu", "--nccl-ranks", "2")


def test_gloo_two_ranks_exact_and_table(torch_venv: Path) -> None:
    run = run_doctor(*GLOO, python=str(torch_venv), timeout=180)
    coll = run.probe("nccl_collectives")
    assert coll["status"] == "pass", coll
    assert coll["evidence"]["backend"] == "gloo" and coll["evidence"]["ranks"] == 2
    checks = coll["evidence"]["checks"]
    assert set(checks) == {"0", "1"}
    assert {c["check"] for c in checks["0"]} == {
        "all_reduce int64 sum",
        "all_reduce float32 sum",
        "all_gather int64",
    }
    assert all(c["mismatches"] == 0 for cs in checks.values() for c in cs)
    bw = run.probe("nccl_bandwidth")
    assert bw["status"] == "pass" and "floor 0.01 GB/s" in bw["summary"]
    table = bw["evidence"]["busbw_table"]
    assert [(r["op"], r["bytes"]) for r in table][:4] == [
        ("all_reduce", 65536),
        ("all_reduce", 262144),
        ("all_reduce", 1048576),
        ("all_reduce", 4194304),
    ]
    for row in table:  # 2 ranks: all-reduce busbw = algbw, all-gather busbw = algbw / 2
        factor = 1.0 if row["op"] == "all_reduce" else 0.5
        assert row["busbw_gbs"] == pytest.approx(row["algbw_gbs"] * factor, abs=2e-3) and row["busbw_gbs"] > 0
    assert run.rc in (0, 1) and run.report["summary"]["failed"] == 0


def test_gloo_one_rank_is_valid_with_busbw_zero(torch_venv: Path) -> None:
    run = run_doctor("--tier", "nccl", "--no-gpu", "--nccl-ranks", "1", python=str(torch_venv), timeout=180)
    bw = run.probe("nccl_bandwidth")
    assert run.probe("nccl_collectives")["status"] == "pass"
    assert bw["status"] == "pass" and {r["busbw_gbs"] for r in bw["evidence"]["busbw_table"]} == {0.0}


def test_gloo_interface_absent_names_the_variable(torch_venv: Path) -> None:
    env = doctor_env({"GLOO_SOCKET_IFNAME": "mlstack-nope0"})
    run = run_doctor(*GLOO, "--nccl-timeout", "10", python=str(torch_venv), env=env, timeout=180)
    assert run.rc == 1 and run.root["probe"] == "nccl_collectives"
    assert run.root["code"] == "NCCL_SOCKET_IFNAME_WRONG" and "GLOO_SOCKET_IFNAME" in run.root["fix"]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare")
def test_tiny_dev_shm_is_the_root_cause(torch_venv: Path) -> None:
    """A 4 MiB tmpfs over /dev/shm, in a mount namespace of the doctor's own (the machine's stays)."""
    mount = "mount -t tmpfs -o size=4m tmpfs /dev/shm"
    # The namespace on its own first: whether this machine can make it is no question for the doctor.
    can = subprocess.run(["unshare", "-m", "sh", "-c", mount], capture_output=True, text=True, timeout=30)
    if can.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a new mount namespace here: {can.stderr[-300:]}")
    script = f"{mount} && exec {torch_venv} -m mlstack_doctor --json --quiet " + " ".join(GLOO)
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=doctor_env(), timeout=180
    )
    assert proc.returncode in (0, 1), f"the doctor crashed (exit {proc.returncode}): {proc.stderr[-2000:]}"
    run = DoctorRun(proc.returncode, json.loads(proc.stdout), proc.stdout, proc.stderr)
    assert run.rc == 1 and run.root["code"] == "NCCL_SHM_TOO_SMALL" and run.root["probe"] == "nccl_shm"
    assert "4 MiB free" in run.root["summary"] and "lxc.mount.entry" in run.root["fix"]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare")
def test_loopback_down_is_named_at_once(torch_venv: Path) -> None:
    """A network namespace of the doctor's own, whose lo is down (as in a container no init brought up):
    named before any rank starts, instead of the rendezvous retrying for minutes."""
    can = subprocess.run(["unshare", "-n", "true"], capture_output=True, text=True, timeout=30)
    if can.returncode != 0:
        pytest.skip(f"cannot make a network namespace here: {can.stderr[-300:]}")
    script = f"exec {torch_venv} -m mlstack_doctor --json --quiet " + " ".join(GLOO)
    t0 = time.monotonic()
    proc = subprocess.run(
        ["unshare", "-n", "sh", "-c", script], capture_output=True, text=True, env=doctor_env(), timeout=180
    )
    seconds = time.monotonic() - t0
    assert proc.returncode in (0, 1), f"the doctor crashed (exit {proc.returncode}): {proc.stderr[-2000:]}"
    run = DoctorRun(proc.returncode, json.loads(proc.stdout), proc.stdout, proc.stderr)
    assert run.rc == 1 and run.root["code"] == "NCCL_LOOPBACK_DOWN", run.root
    assert run.root["probe"] == "nccl_collectives" and "ip link set lo up" in run.root["fix"]
    assert seconds < 60, f"took {seconds:.0f} s: the ranks were started"


def _tcp_established(pid: int) -> int:
    """How many established TCP connections the process holds (its sockets, in /proc/PID/net/tcp*)."""
    try:
        inodes = {
            link[len("socket:[") : -1]
            for fd in Path(f"/proc/{pid}/fd").iterdir()
            if (link := os.readlink(fd)).startswith("socket:[")
        }
        lines = [ln.split() for name in ("tcp", "tcp6") for ln in (Path(f"/proc/{pid}/net") / name).open()]
    except OSError:
        return 0  # ended meanwhile
    return sum(1 for f in lines[1:] if len(f) > 9 and f[3] == "01" and f[9] in inodes)


def _ranks_of(pid: int) -> list[int]:
    """The spawned rank processes under the doctor `pid` (its worker's children), read from /proc."""
    kids: dict[int, list[tuple[int, str]]] = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile
        kids.setdefault(ppid, []).append((int(proc.name), cmdline))
    found, todo = [], [pid]
    while todo:
        for kid, cmdline in kids.get(todo.pop(), []):
            todo.append(kid)
            if "spawn_main" in cmdline:
                found.append(kid)
    return found


@pytest.mark.skipif(sys.platform != "linux", reason="reads ps")
def test_stopped_rank_ends_as_a_timeout_verdict(torch_venv: Path) -> None:
    """A rank that stops answering: the others' collectives end at the process group timeout and the
    doctor says NCCL_TIMEOUT, naming the hung rank, well before its own deadline."""
    argv = [str(torch_venv), "-m", "mlstack_doctor", "--json", "--quiet", *GLOO, "--nccl-timeout", "5"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=doctor_env())
    stopped: list[int] = []

    def stop_one() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            ranks = _ranks_of(proc.pid)
            # Both joined the process group: each holds its store connection and gloo's to the other rank.
            if len(ranks) == 2 and all(_tcp_established(r) >= 2 for r in ranks):
                os.kill(max(ranks), signal.SIGSTOP)
                stopped.append(max(ranks))
                return
            time.sleep(0.1)

    t0 = time.monotonic()
    threading.Thread(target=stop_one, daemon=True).start()
    out, _ = proc.communicate(timeout=180)
    took = time.monotonic() - t0
    assert stopped, "no rank process was seen"
    report = json.loads(out)
    coll = next(p for p in report["probes"] if p["name"] == "nccl_collectives")
    assert coll["code"] == "NCCL_TIMEOUT" and coll["evidence"]["hung"], coll
    # Stopped in a collective, after both had joined the process group (not before the rendezvous).
    assert coll["evidence"]["joined"] == [0, 1], coll["evidence"]
    assert took < 75, f"the doctor took {took:.0f} s: the rank's timeout did not bound it"
    alive = subprocess.run(["ps", "-p", str(stopped[0])], capture_output=True).returncode == 0
    assert not alive, "the stopped rank outlived the doctor"
