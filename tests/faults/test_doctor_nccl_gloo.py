"""The doctor's NCCL tier on the gloo path, inside the shared provisioned container (CT 160): the doctor
provisioning installed there, with the container's real torch, spawning two ranks on its CPU. Then a
real fault: /dev/shm replaced by a 4 MiB tmpfs in a mount namespace of the doctor's own (the container's
/dev/shm stays as it is), which the doctor must name as the root cause with the PVE fix."""

from __future__ import annotations

import json
from typing import Any

from faultlib import ct_sh

DOCTOR = "/opt/mlstack/venv/bin/mlstack-doctor"
GLOO = "--tier nccl --nccl-backend gloo --nccl-ranks 2 --no-gpu --json --quiet"


def _doctor(vmid: int, prefix: str = "") -> tuple[int, dict[str, Any]]:
    r = ct_sh(vmid, f"cd /tmp && {prefix}{DOCTOR} {GLOO}", timeout=180)
    assert r.returncode in (0, 1), f"rc {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    return r.returncode, json.loads(r.stdout)


def _probe(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in report["probes"] if p["name"] == name)


def test_gloo_two_ranks_exact_sums_and_table(shared_ct: dict[str, Any]) -> None:
    rc, report = _doctor(shared_ct["vmid"])
    coll = _probe(report, "nccl_collectives")
    assert coll["status"] == "pass", coll
    assert coll["evidence"]["backend"] == "gloo" and coll["evidence"]["torch"].startswith("2.11")
    checks = coll["evidence"]["checks"]
    assert sorted(checks) == ["0", "1"]
    assert all(c["mismatches"] == 0 and c["elements"] > 0 for cs in checks.values() for c in cs)
    assert {c["check"] for c in checks["1"]} == {
        "all_reduce int64 sum",
        "all_reduce float32 sum",
        "all_gather int64",
    }
    bw = _probe(report, "nccl_bandwidth")
    assert bw["status"] == "pass" and "floor 0.01 GB/s for CPU" in bw["summary"]
    table = bw["evidence"]["busbw_table"]
    assert {r["op"] for r in table} == {"all_reduce", "all_gather"} and len(table) == 8
    assert all(r["busbw_gbs"] > 0 and r["floor_gbs"] == 0.01 for r in table)
    assert report["summary"]["failed"] == 0 and rc == 0


def test_tiny_dev_shm_is_named(shared_ct: dict[str, Any]) -> None:
    rc, report = _doctor(
        shared_ct["vmid"], 'unshare -m sh -c \'mount -t tmpfs -o size=4m tmpfs /dev/shm && exec "$0" "$@"\' '
    )
    root = report["summary"]["root_cause"]
    assert rc == 1 and root["probe"] == "nccl_shm" and root["code"] == "NCCL_SHM_TOO_SMALL", root
    assert "4 MiB free" in root["summary"] and "lxc.mount.entry: tmpfs dev/shm" in root["fix"]
