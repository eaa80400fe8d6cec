"""The NCCL tier's arithmetic and verdicts: nccl-tests' bandwidth formulas against hand-computed figures,
the `nvidia-smi topo -m` parser against recorded layouts, the floors, and each diagnosis rule. The worker
is the stubbed boundary here; test_nccl_gloo.py runs it for real."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from doctor_testlib import SRC  # noqa: F401  (puts the doctor's source on sys.path)
from mlstack_doctor import engine, nccl, render, runner
from mlstack_doctor.context import Context, Options
from mlstack_doctor.diagnosis import CODES, classify
from mlstack_doctor.probes import nccl as probe
from mlstack_doctor.record import Status

DATA = Path(__file__).parent / "data" / "nccl"


# --- bandwidth: nccl-tests' formulas -------------------------------------------------------------


@pytest.mark.parametrize(
    "op,nbytes,us,n,algbw,busbw",
    [
        # all_reduce_perf, 8 ranks, 128 MiB float in 1178.5 us: 134217728 / 1178.5e-6 / 1e9 = 113.89,
        # busbw = 113.89 * 2 * 7 / 8 = 199.30 (the figures nccl-tests prints for that line)
        ("all_reduce", 134217728, 1178.5, 8, 113.89, 199.30),
        # 2 ranks: the all-reduce factor is 2 * 1 / 2 = 1, busbw = algbw
        ("all_reduce", 1048576, 100.0, 2, 10.49, 10.49),
        # all_gather_perf, 8 ranks, 256 MiB gathered in 700 us: 268435456 / 700e-6 / 1e9 = 383.48,
        # busbw = 383.48 * 7 / 8 = 335.54
        ("all_gather", 268435456, 700.0, 8, 383.48, 335.54),
        # 4 ranks all-gather, 4 MiB in 2000 us: 2.10 GB/s, * 3/4 = 1.57
        ("all_gather", 4194304, 2000.0, 4, 2.10, 1.57),
        # one rank: busbw 0, as nccl-tests prints
        ("all_reduce", 268435456, 50.0, 1, 5368.71, 0.0),
        ("all_gather", 268435456, 50.0, 1, 5368.71, 0.0),
    ],
)
def test_bandwidth_matches_nccl_tests(
    op: str, nbytes: int, us: float, n: int, algbw: float, busbw: float
) -> None:
    got_alg, got_bus = nccl.bandwidth(op, nbytes, us * 1e-6, n)
    # nccl-tests prints two decimals
    assert got_alg == pytest.approx(algbw, abs=0.006) and got_bus == pytest.approx(busbw, abs=0.006)


def test_bus_factor_rejects_what_it_does_not_know() -> None:
    with pytest.raises(ValueError):
        nccl.bus_factor("broadcast", 2)
    with pytest.raises(ValueError):
        nccl.bus_factor("all_reduce", 0)


# --- topology ---------------------------------------------------------------------------------------


def test_topo_h200_node_is_nv18_everywhere() -> None:
    topo = nccl.parse_topo((DATA / "topo_h200x8_nv18.txt").read_text())
    assert topo.gpus == [f"GPU{i}" for i in range(8)]
    assert len(topo.links) == 8 * 7 and set(topo.links.values()) == {"NV18"}
    assert topo.worst(list(range(8))) == "NV18" and topo.worst([0]) is None


@pytest.mark.parametrize("fixture,link", [("topo_pcie2_sys.txt", "SYS"), ("topo_pcie2_phb.txt", "PHB")])
def test_topo_pcie_box(fixture: str, link: str) -> None:
    topo = nccl.parse_topo((DATA / fixture).read_text())
    assert topo.gpus == ["GPU0", "GPU1"]
    assert topo.links == {(0, 1): link, (1, 0): link}


MIXED = """\
\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity
GPU0\t X \tNV4\tSYS\tSYS\t0-15\t0
GPU1\tNV4\t X \tSYS\tSYS\t0-15\t0
GPU2\tSYS\tSYS\t X \tNV4\t16-31\t1
GPU3\tSYS\tSYS\tNV4\t X \t16-31\t1
"""


def test_topo_worst_link_of_the_ranks_used() -> None:
    """A ring over four GPUs with NVLink bridges in pairs runs at the speed of its SYS hops."""
    topo = nccl.parse_topo(MIXED)
    assert topo.worst([0, 1]) == "NV4" and topo.worst([2, 3]) == "NV4"
    assert topo.worst([0, 1, 2, 3]) == "SYS"


def test_topo_without_a_gpu_matrix_is_an_error() -> None:
    with pytest.raises(ValueError):
        nccl.parse_topo("No devices were found\n")


# --- floors -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "link,floor,named",
    [
        ("NV18", 90.0, "NV18 (NVLink, 18 bonded links)"),
        ("NV4", 20.0, "NV4"),
        ("PIX", 5.0, "PIX"),
        ("PXB", 5.0, "PXB"),
        ("PHB", 3.0, "PHB"),
        ("NODE", 3.0, "NODE"),
        ("SYS", 2.0, "SYS"),
        (None, 2.0, "unknown link"),
        ("CPU", 0.01, "gloo"),
    ],
)
def test_floor_per_link_type(link: str | None, floor: float, named: str) -> None:
    got, which = nccl.floor_for(link)
    assert got == floor and named in which


def test_floors_order_follows_links() -> None:
    """A better link never has a lower floor than a worse one."""
    links = ["NV18", "NV12", "NV4", "PIX", "PXB", "PHB", "NODE", "SYS"]
    assert sorted(links, key=nccl.link_rank) == links
    floors = [nccl.floor_for(link)[0] for link in links]
    assert floors == sorted(floors, reverse=True)


def test_shm_need_grows_with_rank_pairs() -> None:
    assert nccl.shm_need(1) == nccl.SHM_BASE
    assert nccl.shm_need(2) == nccl.SHM_BASE + 4 * 9637888
    assert nccl.shm_need(8) == nccl.SHM_BASE + 112 * 9637888  # ~1.1 GiB: Docker's 64 MiB is far short


# --- diagnosis: what NCCL and gloo print ----------------------------------------------------------------


@pytest.mark.parametrize(
    "text,code",
    [
        (
            "NCCL WARN Error while creating shared memory segment /dev/shm/nccl-vzIpS6 (size 9637888)",
            "NCCL_SHM_TOO_SMALL",
        ),
        ("rank 1 died: killed by SIGBUS", "NCCL_SHM_TOO_SMALL"),
        (
            "NCCL WARN Cuda failure 'peer access is not supported between these two devices'",
            "NCCL_P2P_BLOCKED",
        ),
        (
            "include/alloc.h:48 NCCL WARN Call to cudaIpcOpenMemHandle failed : invalid argument",
            "NCCL_P2P_BLOCKED",
        ),
        ("NCCL WARN Bootstrap : no socket interface found", "NCCL_SOCKET_IFNAME_WRONG"),
        (
            "RuntimeError: [enforce fail at gloo/transport/tcp/device.cc:84] ifa != nullptr. "
            "Unable to find address for: eth7",
            "NCCL_SOCKET_IFNAME_WRONG",
        ),
        (
            "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3, OpType=ALLREDUCE)",
            "NCCL_TIMEOUT",
        ),
        (
            "rank(s) [1] hung in a collective: no answer after 70 s (process group timeout 60 s)",
            "NCCL_TIMEOUT",
        ),
    ],
)
def test_nccl_messages_classify(text: str, code: str) -> None:
    assert classify(text, "NCCL_FAILED") == code


def test_every_nccl_code_has_a_fix() -> None:
    for code in [c for c in CODES if c.startswith("NCCL_")]:
        assert CODES[code].fix and "\n" not in CODES[code].fix


# --- the probes, with the worker stubbed ---------------------------------------------------------------


def _ctx(**opts: Any) -> Context:
    return Context(Options(tier="nccl", **opts))


def _answer(data: dict[str, Any], timed_out: bool = False) -> runner.WorkerResult:
    run = runner.RunResult(
        ["w_nccl.py"], runner.RC_TIMEOUT if timed_out else 0, "", "", 0.5, timed_out=timed_out
    )
    return runner.WorkerResult(run, data)


@pytest.fixture
def gpus_seen(monkeypatch: pytest.MonkeyPatch) -> Any:
    """set(torch=N, nodes=[...], smi=N): what torch, /dev and nvidia-smi say."""

    def set_(torch: int, nodes: list[int], smi: int | None) -> None:
        answer = _answer({"ok": True, "torch": "2.11.0", "torch_cuda": "13.0", "device_count": torch})
        monkeypatch.setattr(probe.runner, "run_worker", lambda *a, **k: answer)
        monkeypatch.setattr(probe, "_gpu_nodes", lambda: nodes)
        monkeypatch.setattr(probe, "_smi_count", lambda: smi)

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return set_


def test_gpus_all_seen_pass(gpus_seen: Any) -> None:
    gpus_seen(torch=2, nodes=[0, 1], smi=2)
    ctx = _ctx()
    assert probe.nccl_gpus(ctx).status is Status.PASS and probe.ranks(ctx) == 2


def test_gpus_node_present_but_cuda_sees_fewer_fails(gpus_seen: Any) -> None:
    gpus_seen(torch=1, nodes=[0, 1], smi=2)
    r = probe.nccl_gpus(_ctx())
    assert r.status is Status.FAIL and r.code == "NCCL_GPUS_HIDDEN"
    assert "2 GPU node(s) passed through, CUDA sees 1" in r.summary and "c 195:* rwm" in r.fix


def test_gpus_nvidia_smi_lists_more_than_torch_warns(gpus_seen: Any) -> None:
    """Inside LXC, NVML lists every GPU of the host; only the passed-through ones have nodes."""
    gpus_seen(torch=2, nodes=[0, 1], smi=8)
    r = probe.nccl_gpus(_ctx())
    assert r.status is Status.WARN and r.code == "NCCL_GPUS_HIDDEN" and "NVML lists 8" in r.summary


def test_gpus_visible_devices_naming_an_absent_gpu_fails(
    gpus_seen: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpus_seen(torch=1, nodes=[0, 1], smi=2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,7")
    r = probe.nccl_gpus(_ctx())
    assert r.status is Status.FAIL and r.code == "CUDA_VISIBLE_DEVICES_UNMATCHED"
    assert "'7'" in r.summary and "CUDA_VISIBLE_DEVICES=0,1" in r.fix


def test_shm_too_small_for_the_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    small = os.statvfs_result((4096, 4096, 16384, 16384, 16384, 0, 0, 0, 0, 255))  # 64 MiB, all free
    monkeypatch.setattr(probe.os, "statvfs", lambda path: small)
    r = probe.nccl_shm(_ctx(expect_gpu=False, nccl_ranks=2))
    assert r.status is Status.FAIL and r.code == "NCCL_SHM_TOO_SMALL"
    assert "64 MiB free" in r.summary and "size=2G" in r.fix and "lxc.mount.entry" in r.fix
    roomy = os.statvfs_result((4096, 4096, 1 << 20, 1 << 20, 1 << 20, 0, 0, 0, 0, 255))  # 4 GiB
    monkeypatch.setattr(probe.os, "statvfs", lambda path: roomy)
    assert probe.nccl_shm(_ctx(expect_gpu=False, nccl_ranks=8)).status is Status.PASS


OK_CHECKS = [{"check": "all_reduce int64 sum", "elements": 1048579, "mismatches": 0}]


def _collectives(monkeypatch: pytest.MonkeyPatch, answers: list[runner.WorkerResult], **opts: Any) -> Any:
    calls: list[dict[str, str]] = []

    def fake(ctx: Context, be: str, n: int, env: dict[str, str]) -> runner.WorkerResult:
        calls.append(env)
        return answers[len(calls) - 1]

    monkeypatch.setattr(probe, "_run", fake)
    ctx = _ctx(nccl_backend="nccl", **opts)
    ctx.facts["cuda_device_count"] = 2
    return probe.nccl_collectives(ctx), calls, ctx


def test_wrong_sum_fails_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    bad = [
        {
            "check": "all_reduce int64 sum",
            "elements": 1048579,
            "mismatches": 3,
            "first_index": 5,
            "expected": 18,
            "got": 17,
        }
    ]
    answer = _answer({"ok": True, "checks": {"0": OK_CHECKS, "1": bad}, "rows": []})
    r, _, ctx = _collectives(monkeypatch, [answer])
    assert r.status is Status.FAIL and r.code == "NCCL_WRONG_RESULT"
    assert "rank 1" in r.summary and "17 != 18" in r.summary and "nccl_rows" not in ctx.facts


def test_hang_that_p2p_disable_cures_is_p2p_blocked(monkeypatch: pytest.MonkeyPatch) -> None:
    hung = _answer({"ok": False, "hung": [0, 1], "error": "rank(s) [0, 1] hung in a collective: no answer"})
    ok = _answer({"ok": True, "checks": {"0": OK_CHECKS, "1": OK_CHECKS}, "rows": []})
    r, calls, _ = _collectives(monkeypatch, [hung, ok])
    assert calls == [{}, {"NCCL_P2P_DISABLE": "1"}]
    assert r.code == "NCCL_P2P_BLOCKED" and "NCCL_P2P_DISABLE=1" in r.fix and "iommu=pt" in r.fix
    assert r.evidence["p2p_disabled_retry"]["ok"] is True


def test_hang_that_p2p_disable_does_not_cure_is_a_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    hung = _answer({"ok": False, "hung": [1], "error": "rank(s) [1] hung in a collective: no answer"})
    r, calls, _ = _collectives(monkeypatch, [hung, hung])
    assert len(calls) == 2 and r.code == "NCCL_TIMEOUT"


def test_p2p_error_text_names_p2p_even_when_the_retry_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    err = _answer(
        {
            "ok": False,
            "error": "DistBackendError: NCCL error: unhandled cuda error, cudaIpcOpenMemHandle failed",
        }
    )
    r, _, _ = _collectives(monkeypatch, [err, err])
    assert r.code == "NCCL_P2P_BLOCKED"


def _bandwidth(link: str | None, seconds: float, n: int = 8) -> Any:
    ctx = _ctx(nccl_backend="nccl")
    ctx.facts.update(cuda_device_count=n, nccl_link=link)
    ctx.facts["nccl_rows"] = [
        {"op": op, "bytes": size, "seconds": seconds * size / nccl.GPU_SIZES[-1]}
        for op in nccl.OPS
        for size in nccl.GPU_SIZES
    ]
    return probe.nccl_bandwidth(ctx)


def test_bandwidth_above_the_nvlink_floor_passes() -> None:
    r = _bandwidth("NV18", 700e-6)  # 256 MiB in 700 us: all-reduce busbw 671 GB/s
    assert r.status is Status.PASS and "floor 90 GB/s for NV18" in r.summary
    assert len(r.evidence["busbw_table"]) == 10 and r.evidence["busbw_table"][-1]["floor_gbs"] == 90.0


def test_bandwidth_below_the_floor_names_floor_and_link() -> None:
    r = _bandwidth("NV18", 0.02)  # 256 MiB in 20 ms: 13.4 GB/s algbw, through host memory
    assert r.status is Status.FAIL and r.code == "NCCL_BUSBW_BELOW_FLOOR"
    assert "floor 90 GB/s for NV18 (NVLink, 18 bonded links)" in r.summary and "NV18" in r.fix


def test_same_figure_passes_on_pcie_sys() -> None:
    assert _bandwidth("SYS", 0.02).status is Status.PASS


def test_one_rank_has_no_floor() -> None:
    r = _bandwidth("NV18", 0.02, n=1)
    assert r.status is Status.PASS and "busbw 0" in r.summary
    assert {row["busbw_gbs"] for row in r.evidence["busbw_table"]} == {0.0}


def test_text_report_shows_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    r = _bandwidth("NV18", 700e-6)
    import io

    out = io.StringIO()
    render.table([r], engine.summarize([r]), out, use_rich=False)
    text = out.getvalue()
    assert "busbw (GB/s)" in text and "268435456" in text and "all_gather" in text


# --- the tier ----------------------------------------------------------------------------------------


def test_nccl_tier_is_its_own_list() -> None:
    names = [p.name for p in engine.selected("nccl")]
    assert names[-5:] == ["nccl_gpus", "nccl_shm", "nccl_topology", "nccl_collectives", "nccl_bandwidth"]
    assert not any(n.startswith("nccl_") for n in (p.name for p in engine.selected("stress")))


def test_fingerprint_without_model_does_not_walk_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The nccl tier takes no --model; run from / (lxc-attach's cwd) the fingerprint walked all of /
    and died on /proc/1/map_files."""
    from mlstack_doctor import reuse

    (tmp_path / "big.bin").write_bytes(b"x")
    monkeypatch.chdir(tmp_path)
    assert reuse._model_lines("") == ["model:"]


def test_a_rendezvous_that_cannot_reach_loopback_is_named() -> None:
    """torch 2.11's words on the H200 machine, in a container whose lo was down."""
    text = (
        "DistNetworkError: The client socket has failed to connect to any network address of "
        "(127.0.0.1, 38739). The client socket has failed to connect to localhost:38739 "
        "(errno: 101 - Network is unreachable)."
    )
    assert classify(text, "NCCL_FAILED") == "NCCL_LOOPBACK_DOWN"
    assert classify("connection refused by 10.0.0.2", "NCCL_FAILED") == "NCCL_FAILED"
