"""The NCCL tier: torch.distributed across the GPUs, one spawned process per GPU, as training runs.

`--nccl-backend gloo` (and `--no-gpu`) runs the same worker on the CPU with `--nccl-ranks` processes,
so a machine without a GPU proves the launcher, the exact-value checks and the bandwidth table. Every
collective is bounded by `--nccl-timeout` (the process group's timeout), the worker kills ranks that
outlive their deadline, and the doctor kills the worker's process group after that: a hung NCCL ends
as a verdict.
"""

from __future__ import annotations

import glob
import os
import re
import socket
from typing import Any

from mlstack_doctor import nccl, runner, visible
from mlstack_doctor.context import Context
from mlstack_doctor.diagnosis import classify, fix_for
from mlstack_doctor.record import Result, Stage, failed, passed, skipped, warned


def backend(ctx: Context) -> str:
    chosen = ctx.opts.nccl_backend
    if chosen == "auto":
        return "nccl" if ctx.opts.expect_gpu else "gloo"
    return chosen


def ranks(ctx: Context) -> int:
    """gloo: --nccl-ranks (default 2); nccl: every GPU CUDA sees, or fewer when --nccl-ranks says so."""
    if backend(ctx) == "gloo":
        return ctx.opts.nccl_ranks or 2
    seen = int(ctx.facts.get("cuda_device_count") or 0)
    return min(seen, ctx.opts.nccl_ranks) if ctx.opts.nccl_ranks else seen


def _gpu_nodes() -> list[int]:
    return sorted(int(p[len("/dev/nvidia") :]) for p in glob.glob("/dev/nvidia[0-9]*") if p[11:].isdigit())


def _smi_count() -> int | None:
    res = runner.run(["nvidia-smi", "-L"], timeout=30)
    return len(re.findall(r"^GPU \d+:", res.stdout, re.M)) if res.ok else None


def nccl_gpus(ctx: Context) -> Result:
    """The GPUs torch sees against those passed through: nodes, NVML, nvidia-smi, CUDA_VISIBLE_DEVICES."""
    name, stage = "nccl_gpus", Stage.NCCL
    res = runner.run_worker("w_nccl.py", {"mode": "count"}, timeout=ctx.timeout(120))
    nodes = _gpu_nodes()
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    ev: dict[str, Any] = {
        "device_nodes": [f"/dev/nvidia{i}" for i in nodes],
        "nvml_count": ctx.facts.get("nvml_count"),
        "nvidia_smi_count": _smi_count(),
        "cuda_visible_devices": cvd,
        **{k: v for k, v in res.data.items() if k not in ("ok", "error", "traceback")},
    }
    if not res.ok:
        text = res.error_text
        code = "PROBE_TIMEOUT" if res.run.timed_out else classify(text, "CUDA_UNAVAILABLE")
        return failed(name, stage, f"torch: {text[-300:]}", code, fix_for(code), **ev, **res.evidence())
    seen = int(res.data.get("device_count") or 0)
    ctx.facts["cuda_device_count"] = seen
    here = ",".join(str(i) for i in nodes) or "none"
    if cvd is not None and not visible.hides_all(cvd):
        named = visible.entries(cvd)
        if seen < len(named):
            sel = visible.select(cvd, ctx.facts.get("nvml_gpus"), ctx.facts.get("nvml_count"))
            absent = sel.unmatched or named[seen]
            code = "CUDA_VISIBLE_DEVICES_UNMATCHED"
            fix = fix_for(code, suggest=here if nodes else "0", here=here)
            summary = (
                f"CUDA_VISIBLE_DEVICES={cvd} names {len(named)} GPU(s), CUDA sees {seen}: {absent!r} absent"
            )
            return failed(name, stage, summary, code, fix, absent=absent, **ev)
    if seen == 0:
        code = classify(str(res.data.get("cuda_error") or ""), "CUDA_UNAVAILABLE")
        return failed(name, stage, "CUDA sees no GPU: NCCL has no rank to run", code, fix_for(code), **ev)
    listed = max(n for n in (len(nodes), ev["nvml_count"] or 0, ev["nvidia_smi_count"] or 0))
    if cvd is None and len(nodes) > seen:
        # The node is there but CUDA cannot use it: the container's device cgroup, or its permissions.
        code = "NCCL_GPUS_HIDDEN"
        summary = f"{len(nodes)} GPU node(s) passed through, CUDA sees {seen}: NCCL would run {seen} rank(s)"
        return failed(name, stage, summary, code, fix_for(code, nodes=here), **ev)
    if cvd is None and listed > seen:
        code = "NCCL_GPUS_HIDDEN"
        summary = (
            f"NVML lists {listed} GPU(s), {len(nodes)} node(s) passed through, CUDA sees {seen}: NCCL "
            f"runs on {seen} (deliberate when the container was given only these)"
        )
        return warned(name, stage, summary, code, fix_for(code, nodes=here), **ev)
    return passed(
        name, stage, f"CUDA sees {seen} GPU(s), as many as passed through: {seen} NCCL rank(s)", **ev
    )


def nccl_shm(ctx: Context) -> Result:
    """/dev/shm against what NCCL maps there for the ranks of this run (statvfs: free space)."""
    name, stage = "nccl_shm", Stage.NCCL
    n = ranks(ctx) if backend(ctx) == "gloo" else max(ranks(ctx), len(_gpu_nodes()))
    need = nccl.shm_need(n)
    try:
        st = os.statvfs("/dev/shm")
    except OSError as exc:
        code = "NCCL_SHM_TOO_SMALL"
        fix = fix_for(code, size=_shm_size(need))
        return failed(name, stage, f"/dev/shm: {exc.strerror or exc}", code, fix, need_bytes=need, ranks=n)
    free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    ev = {"ranks": n, "need_bytes": need, "free_bytes": free, "total_bytes": total}
    mib = 1 << 20
    if free < need:
        code = "NCCL_SHM_TOO_SMALL"
        summary = (
            f"/dev/shm has {free // mib} MiB free of {total // mib} MiB; "
            f"NCCL needs ~{need // mib} MiB for {n} ranks"
        )
        return failed(name, stage, summary, code, fix_for(code, size=_shm_size(need)), **ev)
    return passed(name, stage, f"/dev/shm {free // mib} MiB free >= ~{need // mib} MiB for {n} ranks", **ev)


def nccl_topology(ctx: Context) -> Result:
    """The link between the GPUs of the run: the slowest in `nvidia-smi topo -m` among them."""
    name, stage = "nccl_topology", Stage.NCCL
    n = ranks(ctx)
    res = runner.run(["nvidia-smi", "topo", "-m"], timeout=30)
    ev: dict[str, Any] = {"rc": res.rc}
    if not res.ok:
        ctx.facts["nccl_link"] = None
        ev["stderr_tail"] = res.tail(1000)
        return warned(name, stage, "nvidia-smi topo -m failed: link type unknown", None, None, **ev)
    try:
        topo = nccl.parse_topo(res.stdout)
    except ValueError as exc:
        ctx.facts["nccl_link"] = None
        return warned(
            name, stage, f"cannot read nvidia-smi topo -m: {exc}", None, None, raw=res.stdout[-3000:]
        )
    used = _rank_gpus(ctx, n, len(topo.gpus))
    link = topo.worst(used)
    ctx.facts["nccl_link"] = link
    ev.update(topo.to_json(), rank_gpus=used, link=link)
    if n < 2:
        return passed(name, stage, f"1 rank (GPU{used[0] if used else 0}): no link between GPUs", **ev)
    return passed(name, stage, f"{n} ranks on GPUs {used}: slowest link {nccl.floor_for(link)[1]}", **ev)


def _rank_gpus(ctx: Context, n: int, listed: int) -> list[int]:
    """The NVML indices of ranks 0..n-1: CUDA_VISIBLE_DEVICES's order when it names GPUs, else 0..n-1."""
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd and not visible.hides_all(cvd):
        sel = visible.select(cvd, ctx.facts.get("nvml_gpus"), ctx.facts.get("nvml_count"))
        if len(sel.matched) >= n:
            return [int(m["gpu"]) for m in sel.matched[:n]]
    return list(range(min(n, listed)))


def loopback_error() -> str | None:
    """Why a TCP connection to 127.0.0.1 fails here (torch.distributed's rendezvous), or None."""
    try:
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen(1)
            with socket.create_connection(server.getsockname(), timeout=5):
                return None
    except OSError as e:
        return f"{type(e).__name__}: {e}"


def nccl_collectives(ctx: Context) -> Result:
    """all-reduce and all-gather over known inputs, exact; then the bandwidth sweep (kept for the next
    probe). A failure or hang under NCCL with several ranks is retried once with NCCL_P2P_DISABLE=1: when
    that passes, P2P/IPC between the GPUs is what is blocked."""
    name, stage = "nccl_collectives", Stage.NCCL
    be, n = backend(ctx), ranks(ctx)
    if n < 1:
        return skipped(name, stage, "skipped: no rank to run (CUDA sees no GPU)", skipped_by="nccl_gpus")
    # The ranks meet at a TCP store on 127.0.0.1: with the loopback down they retry for minutes.
    unreachable = loopback_error()
    if unreachable:
        code = "NCCL_LOOPBACK_DOWN"
        summary = f"{be}, {n} rank(s) not started: 127.0.0.1 unreachable here ({unreachable})"
        return failed(name, stage, summary, code, fix_for(code), backend=be, ranks=n)
    res = _run(ctx, be, n, {})
    ev: dict[str, Any] = {"backend": be, "ranks": n, **_worker_ev(res)}
    if res.ok:
        checks = res.data.get("checks") or {}
        bad = [dict(c, rank=int(r)) for r, cs in checks.items() for c in cs if c["mismatches"]]
        if bad:
            code = "NCCL_WRONG_RESULT"
            first = bad[0]
            summary = (
                f"{first['check']} wrong on rank {first['rank']}: {first['mismatches']} of "
                f"{first['elements']} elements, first at {first['first_index']}: "
                f"{first['got']} != {first['expected']}"
            )
            return failed(name, stage, summary, code, fix_for(code), wrong=bad, **ev)
        ctx.facts["nccl_rows"] = res.data.get("rows") or []
        what = "; ".join(c["check"] for c in next(iter(checks.values()), []))
        return passed(name, stage, f"{be}, {n} rank(s): exact results ({what})", **ev)
    text = (
        res.error_text
        + "\n"
        + "\n".join((res.data.get("tracebacks") or {}).values())
        + res.run.stderr[-8000:]
    )
    timed_out = res.run.timed_out or bool(res.data.get("hung"))
    code = classify(text, "NCCL_TIMEOUT" if timed_out else "NCCL_FAILED")
    if be == "nccl" and n > 1 and code in ("NCCL_TIMEOUT", "NCCL_FAILED", "NCCL_P2P_BLOCKED"):
        retry = _run(ctx, be, n, {"NCCL_P2P_DISABLE": "1"})
        ev["p2p_disabled_retry"] = {
            "ok": retry.ok,
            "error": retry.error_text[-500:] if not retry.ok else None,
        }
        if retry.ok:
            code = "NCCL_P2P_BLOCKED"
    return failed(
        name, stage, f"{be}, {n} rank(s): {res.error_text.strip()[-300:]}", code, fix_for(code), **ev
    )


def _run(ctx: Context, be: str, n: int, env: dict[str, str]) -> runner.WorkerResult:
    gpu = be == "nccl"
    per_collective = ctx.timeout(ctx.opts.nccl_timeout)
    # Imports and joining, the checks, then each size's warm-up and timed iterations: each bounded by
    # the process group's timeout; the whole by this deadline.
    deadline = per_collective * 3 + ctx.timeout(120 if gpu else 60)
    args = {
        "mode": "run",
        "backend": be,
        "world": n,
        "timeout_s": per_collective,
        "deadline_s": deadline,
        "sizes": list(nccl.GPU_SIZES if gpu else nccl.CPU_SIZES),
        "warmup": 5 if gpu else 2,
        "iters": 20 if gpu else 5,
    }
    # Its own process group: at the deadline the doctor kills the launcher and every rank it spawned.
    return runner.Background("w_nccl.py", args, timeout=deadline + 30, env=env).result()


def _worker_ev(res: runner.WorkerResult) -> dict[str, Any]:
    keep = ("torch", "joined", "hung", "died", "errors", "checks")
    return {**{k: res.data[k] for k in keep if k in res.data}, **res.evidence()}


def nccl_bandwidth(ctx: Context) -> Result:
    """The sweep as nccl-tests prints it (algbw, busbw), against the floor of the run's link type."""
    name, stage = "nccl_bandwidth", Stage.NCCL
    be, n = backend(ctx), ranks(ctx)
    link = "CPU" if be == "gloo" else ctx.facts.get("nccl_link")
    floor, which = nccl.floor_for(link)
    table = []
    for row in ctx.facts.get("nccl_rows") or []:
        algbw, busbw = nccl.bandwidth(row["op"], row["bytes"], row["seconds"], n)
        table.append(
            {
                "op": row["op"],
                "bytes": row["bytes"],
                "time_us": round(row["seconds"] * 1e6, 1),
                "algbw_gbs": round(algbw, 3),
                "busbw_gbs": round(busbw, 3),
                "floor_gbs": floor if n > 1 else None,
            }
        )
    ev = {
        "backend": be,
        "ranks": n,
        "link": link,
        "floor_gbs": floor,
        "floor_for": which,
        "busbw_table": table,
    }
    if not table:
        return warned(name, stage, "no bandwidth rows came back", None, None, **ev)
    largest = {op: max((r for r in table if r["op"] == op), key=lambda r: r["bytes"]) for op in nccl.OPS}
    figures = ", ".join(f"{op} {r['busbw_gbs']:.2f} GB/s at {_size(r['bytes'])}" for op, r in largest.items())
    if n < 2:
        return passed(
            name, stage, "1 rank: busbw 0 by definition (nccl-tests prints 0); no floor applies", **ev
        )
    low = {op: r for op, r in largest.items() if r["busbw_gbs"] < floor}
    verdict = f"busbw {figures}; floor {floor:g} GB/s for {which}"
    if low:
        code = "NCCL_BUSBW_BELOW_FLOOR"
        return failed(name, stage, f"below the floor: {verdict}", code, fix_for(code, link=which), **ev)
    return passed(name, stage, verdict, **ev)


def _size(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):g} MiB" if nbytes >= 1 << 20 else f"{nbytes / 1024:g} KiB"


def _shm_size(need: int) -> str:
    return f"{2 * nccl.gib_ceil(need)}G"  # twice the estimate: the estimate is a floor, not a budget
