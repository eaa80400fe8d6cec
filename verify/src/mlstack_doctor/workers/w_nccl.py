"""torch.distributed across ranks, one spawned process per rank, as training launches them.

mode "count": what torch sees (CUDA build, device count, names). mode "run": a TCPStore in this process
(as torchrun's agent hosts it), `world` ranks spawned, each joins the process group (nccl on GPU r, or
gloo on the CPU), checks all-reduce and all-gather against exact expected values, then times a sweep of
sizes. Every wait is bounded: the process group's timeout bounds each collective, and this launcher
kills ranks still running at its deadline, naming them. Rank 0's table is the answer; every rank's
error is kept.
"""

from __future__ import annotations

import queue
import signal
import time
import traceback
import warnings
from datetime import timedelta
from typing import Any

from _common import error_text, main


def _sync(dev: Any) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _correctness(dist: Any, torch: Any, rank: int, n: int, dev: Any) -> list[dict[str, Any]]:
    """Known rank-dependent integers, so a wrong sum or a misplaced chunk is caught exactly. Odd lengths
    so the tail of a chunked transfer is checked too."""
    out = []
    count = (1 << 20) + 3
    i64 = torch.arange(count, dtype=torch.int64)
    x = (i64 * (rank + 1) + rank).to(dev)
    dist.all_reduce(x)
    want = i64 * (n * (n + 1) // 2) + n * (n - 1) // 2
    out.append(_compare("all_reduce int64 sum", x.cpu(), want))
    f = ((i64 % 1024) + rank).to(torch.float32).to(dev)  # sums stay below 2**24: exact in float32
    dist.all_reduce(f)
    out.append(_compare("all_reduce float32 sum", f.cpu(), ((i64 % 1024) * n + n * (n - 1) // 2).float()))
    per = (1 << 18) + 1
    mine = (torch.arange(per, dtype=torch.int64) + rank * per).to(dev)
    got = torch.empty(per * n, dtype=torch.int64, device=dev)
    dist.all_gather_into_tensor(got, mine)
    out.append(_compare("all_gather int64", got.cpu(), torch.arange(per * n, dtype=torch.int64)))
    return out


def _compare(what: str, got: Any, want: Any) -> dict[str, Any]:
    bad = (got != want).nonzero()
    row: dict[str, Any] = {"check": what, "elements": int(want.numel()), "mismatches": int(bad.numel())}
    if bad.numel():
        k = int(bad[0])
        row.update(first_index=k, expected=want[k].item(), got=got[k].item())
    return row


def _sweep(dist: Any, torch: Any, n: int, dev: Any, sizes: list[int], warmup: int, iters: int) -> list:
    rows = []
    for op in ("all_reduce", "all_gather"):
        for size in sizes:
            if op == "all_reduce":
                buf = torch.zeros(size // 4, dtype=torch.float32, device=dev)
                nbytes = buf.numel() * 4

                def step(buf: Any = buf) -> None:
                    dist.all_reduce(buf)
            else:
                per = max(1, size // 4 // n)
                send = torch.zeros(per, dtype=torch.float32, device=dev)
                recv = torch.empty(per * n, dtype=torch.float32, device=dev)
                nbytes = per * n * 4  # nccl-tests: the size of an all-gather is the total gathered

                def step(send: Any = send, recv: Any = recv) -> None:
                    dist.all_gather_into_tensor(recv, send)

            for _ in range(warmup):
                step()
            _sync(dev)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                step()
            _sync(dev)
            seconds = (time.perf_counter() - t0) / iters
            t = torch.tensor([seconds], dtype=torch.float64, device=dev)
            dist.all_reduce(t)  # nccl-tests' default: the time averaged over ranks
            rows.append({"op": op, "bytes": nbytes, "seconds": t.item() / n})
    return rows


def _rank(rank: int, world: int, args: dict[str, Any], port: int, answers: Any) -> None:
    """One rank: its own process, its own GPU (nccl) or the CPU (gloo)."""
    try:
        import torch
        import torch.distributed as dist

        # torch >= 2.13 renames all_gather_into_tensor (deprecated, same semantics); 2.11 has only it.
        warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*", category=FutureWarning)
        backend = args["backend"]
        dev = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
        if backend == "nccl":
            torch.cuda.set_device(dev)
        timeout = timedelta(seconds=float(args["timeout_s"]))
        store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timeout)
        kw: dict[str, Any] = {"device_id": dev} if backend == "nccl" else {}
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout, **kw)
        answers.put({"rank": rank, "stage": "joined"})
        checks = _correctness(dist, torch, rank, world, dev)
        # Every rank must agree whether to go on: one rank alone in the sweep would wait for the others.
        bad = torch.tensor([sum(c["mismatches"] for c in checks)], dtype=torch.int64, device=dev)
        dist.all_reduce(bad)
        rows: list = []
        if not bad.item():
            rows = _sweep(dist, torch, world, dev, args["sizes"], args["warmup"], args["iters"])
        dist.destroy_process_group()
        answers.put({"rank": rank, "stage": "done", "ok": True, "checks": checks, "rows": rows})
    except BaseException as exc:  # the rank's one boundary: report to the launcher, never swallow
        answers.put(
            {
                "rank": rank,
                "stage": "done",
                "ok": False,
                "error": error_text(exc),
                "tb": traceback.format_exc(),
            }
        )


def _count() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "torch_cuda": torch.version.cuda}
    info["device_count"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
    info["names"] = [torch.cuda.get_device_name(i) for i in range(info["device_count"])]
    if torch.version.cuda and not info["device_count"]:
        try:
            torch.cuda.init()
        except RuntimeError as exc:  # is_available() hides the reason
            info["cuda_error"] = error_text(exc)
    return info


def _launch(args: dict[str, Any]) -> dict[str, Any]:
    import multiprocessing as mp

    import torch
    import torch.distributed as dist

    world = int(args["world"])
    began = time.monotonic()
    deadline = began + float(args["deadline_s"])
    store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")  # as torchrun and mp.spawn do: a forked CUDA context is unusable
    answers = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, world, args, store.port, answers)) for r in range(world)]
    for p in procs:
        p.start()
    joined: set[int] = set()
    done: dict[int, dict[str, Any]] = {}
    failed_at = float("inf")
    while len(done) < world and time.monotonic() < deadline:
        if any(not d["ok"] for d in done.values()):
            # A rank failed: the others end within their own timeout, or are hung; wait no longer.
            deadline = min(deadline, failed_at + float(args["timeout_s"]) + 5)
        try:
            msg = answers.get(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
        except queue.Empty:
            if all(not p.is_alive() for p in procs) and answers.empty():
                break
            continue
        if msg["stage"] == "joined":
            joined.add(msg["rank"])
        else:
            done[msg["rank"]] = msg
            if not msg["ok"] and failed_at == float("inf"):
                failed_at = time.monotonic()
    hung = [r for r, p in enumerate(procs) if r not in done and p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(5)
    died = {r: p.exitcode for r, p in enumerate(procs) if r not in done and r not in hung}
    errors = {r: d["error"] for r, d in done.items() if not d["ok"]}
    head = done.get(0, {})
    out: dict[str, Any] = {
        "torch": torch.__version__,
        "backend": args["backend"],
        "world": world,
        "joined": sorted(joined),
        "hung": hung,
        "died": died,
        "errors": errors,
        "tracebacks": {r: d["tb"][-3000:] for r, d in done.items() if not d["ok"]},
        "checks": {r: d["checks"] for r, d in done.items() if d["ok"]},
        "rows": head.get("rows", []),
    }
    if hung:
        where = "joining the process group" if len(joined) < world else "a collective"
        out["error"] = (
            f"rank(s) {hung} hung in {where}: no answer after {time.monotonic() - began:.0f} s "
            f"(process group timeout {float(args['timeout_s']):g} s)"
        )
    elif errors or died:
        first = min([*errors, *died])
        out["error"] = errors.get(first) or f"rank {first} died: {_exit(died[first])}"
    out["ok"] = "error" not in out
    return out


def _exit(code: int | None) -> str:
    """A rank's exit code; a signal by name (SIGBUS: a write into a full /dev/shm)."""
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            pass
    return f"exit code {code}"


def check(args: dict[str, Any]) -> dict[str, Any]:
    if args.get("mode") == "count":
        return _count()
    return _launch(args)


if __name__ == "__main__":
    main(check)
