"""Judging and reporting: each case's verdict from the doctor's JSON report, what is printed, the exit code.

Verdicts: ok (as expected), wrong (not), error (broke: no container, no report), not-checked (this machine
cannot make the check: no NVIDIA driver; what it could check was as expected).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .cases import Case
from .host import Host, libcuda_locations

EXIT_OK, EXIT_WRONG, EXIT_CANNOT_RUN, EXIT_NO_GPU = 0, 1, 2, 3
NOT_CHECKABLE = (
    "not checkable on this machine (no NVIDIA driver): torch CUDA, Triton's GPU target, FLA on the GPU,",
    "the model forward, the driver libraries (nvidia_userspace bind) and their absence (fault-libs),",
    "and the doctor's code for a missing node (dummy nodes stop it at NVIDIA_NO_DRIVER first).",
)


def probes(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in report.get("probes", [])}


def evaluate(case: Case, host: Host, report: dict[str, Any] | None) -> None:
    """Judge the doctor's report against what the case expects; the verdict goes into case.result."""
    res = case.result
    if report is None:
        res.update(verdict="error", detail="the doctor gave no report")
        return
    pr = probes(report)
    root = (report.get("summary") or {}).get("root_cause") or {}
    res["root_cause"] = root
    nodes = pr.get("nvidia_device_nodes", {})
    got = f"{root.get('code')} ({root.get('probe')})" if root else "none (passed)"

    def verdict(ok: bool, expected: str, detail: str = "") -> None:
        res.update(verdict="ok" if ok else "wrong", expected=expected, got=got, detail=detail)

    if case.name == "pass":
        if not host.gpu:
            res.update(
                verdict="not-checked" if root.get("code") == "NVIDIA_NO_DRIVER" else "wrong",
                expected="NVIDIA_NO_DRIVER (nodes passed through, no driver behind them)",
                got=got,
                detail="no NVIDIA driver here: torch CUDA, Triton, FLA, the model forward and the driver "
                "libraries cannot be checked",
            )
            return
        fails = [(p["name"], p.get("code")) for p in report["probes"] if p["status"] == "fail"]
        tt = pr.get("triton_target", {})
        fd = pr.get("fla_device", {})
        mf = pr.get("model_forward", {})
        musts = {
            "triton_target": tt.get("status") == "pass" and tt.get("evidence", {}).get("backend") == "cuda",
            "fla_device": fd.get("status") == "pass" and fd.get("evidence", {}).get("fla_device") == "cuda",
        }
        if case.tier != "quick":
            musts["model_forward"] = mf.get("status") == "pass"
            musts["logits_finite"] = mf.get("evidence", {}).get("logits_finite") is True
        if res.get("skipped_probes"):
            detail_skip = f"; left out on request: {res['skipped_probes']}"
        else:
            detail_skip = ""
        ev = tt.get("evidence", {})
        detail = (
            f"Triton target {ev.get('target')} (arch {ev.get('arch')}); FLA device "
            f"{fd.get('evidence', {}).get('fla_device')!r}; "
            f"model_forward {mf.get('status')}: {mf.get('summary', '')}"
        )
        detail += detail_skip
        if fails:
            detail += "; failed: " + ", ".join(f"{n} {c}" for n, c in fails)
        verdict(not fails and all(musts.values()), "every probe passes (no failure accepted)", detail)
    elif case.name == "fault-node":
        code = "NVIDIA_UVM_MISSING" if case.dropped == "/dev/nvidia-uvm" else "NVIDIA_NODE_MISSING"
        cg = (res.get("cgroup_check") or {}).get(case.dropped or "")
        others = [v for k, v in (res.get("cgroup_check") or {}).items() if k != case.dropped]
        cg_ok = cg == "EPERM" and "EPERM" not in others
        detail = f"cgroup: a fresh {case.dropped} node inside gives {cg} (others: {sorted(set(others))})"
        if not host.gpu:
            res.update(
                verdict="not-checked" if cg_ok else "wrong",
                expected=f"{code} (needs a driver: with dummy nodes the doctor stops at NVIDIA_NO_DRIVER)",
                got=f"{got}; nodes probe {nodes.get('code')}",
                detail=detail + "; the cgroup deny and the node's absence were checked",
            )
            return
        res["nodes_code"] = nodes.get("code")
        verdict(
            nodes.get("code") == code and cg_ok,
            f"{code} from nvidia_device_nodes",
            detail
            + f"; nvidia_device_nodes: {nodes.get('status')} {nodes.get('code')}: {nodes.get('summary')}",
        )
    elif case.name == "fault-libs":
        ok = root.get("probe") == "nvidia_driver" and root.get("code") in (
            "NVML_UNAVAILABLE",
            "LIBCUDA_NOT_FOUND",
        )
        verdict(ok, "NVML_UNAVAILABLE or LIBCUDA_NOT_FOUND (nvidia_driver)", root.get("summary", ""))
    elif case.name == "fault-perm":
        verdict(
            root.get("code") == "NVIDIA_NODE_PERMISSION",
            "NVIDIA_NODE_PERMISSION",
            root.get("summary", "") + (" (privileged fallback)" if res.get("fallback") else ""),
        )


def evaluate_nccl(case: Case, report: dict[str, Any] | None) -> None:
    """The pass case's NCCL tier: every probe passes (exact sums across the GPUs, bus bandwidth at or
    above the link's floor); the bandwidth table is kept in the result, a failure makes the case wrong."""
    res = case.result
    if report is None:
        res.update(verdict="wrong", detail=f"{res.get('detail', '')}; the NCCL tier gave no report")
        return
    pr = probes(report)
    fails = [(p["name"], p.get("code")) for p in report["probes"] if p["status"] == "fail"]
    bandwidth = pr.get("nccl_bandwidth", {})
    res["nccl"] = {
        "ok": not fails,
        "collectives": pr.get("nccl_collectives", {}).get("summary"),
        "bandwidth": bandwidth.get("summary"),
        "link": pr.get("nccl_topology", {}).get("summary"),
        "busbw_table": bandwidth.get("evidence", {}).get("busbw_table"),
    }
    said = f"NCCL tier: {res['nccl']['collectives']}; {res['nccl']['bandwidth']}"
    if fails:
        res.update(verdict="wrong", detail=f"{res.get('detail', '')}; {said}; failed: {fails}")
    else:
        res["detail"] = f"{res.get('detail', '')}; {said}"


def print_host(lxc: str, host: Host, rootfs_mode: str) -> None:
    """What the cases are built from, printed before they run."""
    print("== host")
    print(f"   {lxc}")
    print(f"   NVIDIA nodes: {', '.join(f'{p} ({k} {a}:{b})' for p, (k, a, b) in host.numbers.items())}")
    print(f"   /proc/devices nvidia majors: {host.proc_majors or 'none'}")
    print(f"   driver: {host.driver or 'none (no /proc/driver/nvidia/version)'}")
    print(f"   driver libraries: {host.lib_note}; bound read-only at {host.ct_lib_dir}")
    for loc in libcuda_locations():
        print(f"   host ldconfig -p: {loc}")
    print(f"   python: {host.python}; extra mounts for it: {host.python_mounts or 'none'}")
    print(f"   rootfs: the host's root ({rootfs_mode}); devN gid={host.device_gid} mode={host.device_mode}")


def print_cases(cases: list[Case]) -> None:
    """Each case run: its log (commands, LXC lines, the doctor's table), root cause and verdict."""
    for c in cases:
        r = c.result
        print(f"\n== {c.name}: CT {c.vmid}: {c.title}")
        for line in c.log:
            print(line)
        root = r.get("root_cause") or {}
        if root:
            print(f"   doctor's root cause: {root.get('probe')} {root.get('code')}")
            print(f"   doctor's fix: {root.get('fix')}")
        print(f"   VERDICT {r.get('verdict')}: expected {r.get('expected')}; got {r.get('got')}")
        if c.result.get("detail"):
            print(f"   {c.result['detail']}")


def print_summary(everything: list[Case], host: Host, seconds: float) -> None:
    """One line a case (those set aside included), and what this machine could not check."""
    print(f"\n== summary ({seconds:.0f} s)")
    for c in everything:
        r = c.result
        got = r.get("got", "") or r.get("detail", "")
        print(f"   {c.name:<11} CT {c.vmid}  {r.get('verdict', '?'):<12} {got}")
    if not host.gpu:
        for line in NOT_CHECKABLE:
            print(f"   {line}")


def write_json(path: str, host: Host, everything: list[Case]) -> None:
    """The summary as JSON (--json): every case's result less the doctor's full report."""
    summary = [{k: v for k, v in c.result.items() if k != "doctor"} for c in everything]
    data = {"gpu": host.gpu, "driver": host.driver, "cases": summary}
    Path(path).write_text(json.dumps(data, indent=1) + "\n")


def exit_code(everything: list[Case], host: Host) -> int:
    """EXIT_WRONG when any case is not as expected; else EXIT_OK, or EXIT_NO_GPU when the GPU checks were
    not made."""
    if any(c.result.get("verdict") in ("wrong", "error", None) for c in everything):
        return EXIT_WRONG
    return EXIT_OK if host.gpu else EXIT_NO_GPU
