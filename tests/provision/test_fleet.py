"""One run of provision.yml across the three nodes of the testbed's cluster, one container each (CT 130 on
testbed, 131 on testbed2, 132 on testbed3), the way a fleet is provisioned: each container made on its own
node through the cluster's API and reached through its node's SSH and pct, one fleet report for all, a
rerun that changes nothing, and destroy.yml across the nodes.

The same three containers show the Triton cache warmed once per cluster, each node with its own Triton
cache folder as real nodes have. The testbed has no GPU, so a recorded cache stands in for the GPU warm:
after the first provision (nothing to warm: each container's key is planned and reported), the test writes
into CT 130's cache a few cache files and the stamp of the key the doctor computed there, as the warm step
would have. The next run of the three nodes publishes that key to the controller's folder from node 1 and
installs it, checked by the doctor, on nodes 2 and 3, which skip the warm and say why; a rerun changes
nothing; a key the cluster does not hold (other training shapes) is reported as not matching, with what
differs."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playbook_runner import PlaybookRun, container, make_runner
from tbhelpers import attach

PLACEMENT = {"testbed": 130, "testbed2": 131, "testbed3": 132}
CTS = {node: [container(vmid)] for node, vmid in PLACEMENT.items()}
NODE_CACHES = Path("/var/lib/mlstack/warm-share-test")
VENV_PYTHON = "/opt/mlstack/venv/bin/python"

# A Triton 3.x entry as the warm step leaves it (a complete ELF binary, its metadata, the group file with
# absolute child paths, FLA's tuned config) and the stamp of the key: what node 1 would have after a warm.
RECORD = """
import json, shutil, sys
from pathlib import Path
from mlstack_doctor.cache import warm
ev = json.loads(sys.stdin.read())
cache = Path(ev["cache_dir"])
e = cache / "RECORDEDH200WARMCHUNKFWDKERNELO"
e.mkdir(parents=True, exist_ok=True)
shutil.copy("/bin/true", e / "chunk_fwd_kernel_o.cubin")
(e / "chunk_fwd_kernel_o.json").write_text(json.dumps({"name": "chunk_fwd_kernel_o", "target": {"arch": 90}}))
kids = {n: str(e / n) for n in ("chunk_fwd_kernel_o.cubin", "chunk_fwd_kernel_o.json")}
(e / "__grp__chunk_fwd_kernel_o.json").write_text(json.dumps({"child_paths": kids}))
(e / "chunk_fwd_kernel_o.autotune.json").write_text(json.dumps({"configs_timings": [[{"BT": 64}, [0.1]]]}))
record = {"entries": [e.name], "kernels_tuned": 11, "kernels": 11, "seconds": 196.0, "backward": "warmed"}
print(warm.write_stamp(cache, ev["key_parts"], record))
"""


def placed(api: Any) -> dict[int, str]:
    """vmid -> node, for this test's containers, as the cluster's API lists them."""
    rows = api.cluster.resources.get(type="vm")
    return {int(r["vmid"]): r["node"] for r in rows if int(r["vmid"]) in PLACEMENT.values()}


def run_vars(work: Path) -> dict[str, Any]:
    """Reports of this test's runs in its own folder; the doctor's NCCL tier run in every container (gloo,
    2 ranks: the testbed's GPUs have no driver); the warm step's key and share work (its GPU part is
    skipped under --no-gpu) with the cluster's cache in the test's folder and one Triton cache folder per
    node, as on a real cluster (the testbed's nodes share one disk)."""
    reports = work / "reports"
    return {
        "fleet_report_dir": str(reports),
        "doctor_controller_report_dir": str(reports / "doctor"),
        "mlstack_doctor_nccl": "always",
        "triton_warm_expect_gpu": True,
        "triton_warm_share_dir": str(work / "share"),
        "pve_host_triton_cache_dir": f"{NODE_CACHES}/{{{{ inventory_hostname }}}}/triton",
        "gpu_container_triton_cache_dir": f"{NODE_CACHES}/{{{{ inventory_hostname }}}}/triton",
    }


def said(run: PlaybookRun) -> str:
    """The run's output as one line, as printed (YAML results double the quote in "cluster's")."""
    return " ".join(run.output.replace("''", "'").split())


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, testbed: Any) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("fleet")
    run = make_runner(work)
    extra = run_vars(work)
    run("destroy.yml", CTS, mlstack_destroy_confirm=True)
    shutil.rmtree(NODE_CACHES, ignore_errors=True)
    first = run("provision.yml", CTS, **extra)
    yield {"run": run, "first": first, "extra": extra, "reports": work / "reports", "share": work / "share"}
    run("destroy.yml", CTS, mlstack_destroy_confirm=True)
    shutil.rmtree(NODE_CACHES, ignore_errors=True)


def verdict(fleet: dict[str, Any], node: str) -> dict[str, Any]:
    path = fleet["reports"] / "doctor" / f"{node}-ct{PLACEMENT[node]}-warm.json"
    report = json.loads(path.read_text())
    return next(p for p in report["probes"] if p["name"] == "triton_warm")


@pytest.fixture(scope="module")
def spread(fleet: dict[str, Any]) -> dict[str, Any]:
    """Node 1 holds the recorded warm of its key; then one run of the three nodes."""
    first: PlaybookRun = fleet["first"]
    assert first.rc == 0, first.output[-4000:]
    planned = verdict(fleet, "testbed")
    script = (
        f"cat > /tmp/warm-ev.json <<'EOF'\n{json.dumps(planned['evidence'])}\nEOF\n"
        f"cat > /tmp/record.py <<'EOF'\n{RECORD}\nEOF\n"
        f"{VENV_PYTHON} /tmp/record.py < /tmp/warm-ev.json"
    )
    r = attach(PLACEMENT["testbed"], script, timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr)
    run = fleet["run"]("provision.yml", CTS, **fleet["extra"])
    return {"planned": planned, "run": run, "key": planned["evidence"]["key"]}


@pytest.fixture(scope="module")
def rerun(fleet: dict[str, Any], spread: dict[str, Any]) -> PlaybookRun:
    """provision.yml again, after the warm was shared: one rerun that both rerun tests read."""
    return fleet["run"]("provision.yml", CTS, **fleet["extra"])


def test_each_container_is_made_on_its_own_node(fleet: dict[str, Any], api: Any) -> None:
    first: PlaybookRun = fleet["first"]
    assert first.rc == 0, first.output[-4000:]
    assert placed(api) == {vmid: node for node, vmid in PLACEMENT.items()}
    recap = first.recap()
    for node, vmid in PLACEMENT.items():
        assert recap[node]["failed"] == 0 and recap[f"{node}-ct{vmid}"]["failed"] == 0, recap


def test_one_fleet_report_covers_every_node(fleet: dict[str, Any]) -> None:
    report = json.loads(Path(fleet["reports"], "fleet.json").read_text())
    rows = {int(r["vmid"]): r for r in report["containers"]}
    assert {vmid: rows[vmid]["node"] for vmid in rows} == {vmid: node for node, vmid in PLACEMENT.items()}
    for row in rows.values():
        assert row["reached_doctor"] and row["root_cause"] is None, row
    md = Path(fleet["reports"], "fleet.md").read_text()
    for node, vmid in PLACEMENT.items():
        assert f"| {node} | {node}-ct{vmid} | {vmid} |" in md, md


def test_the_nccl_tier_ran_in_each_container(fleet: dict[str, Any]) -> None:
    for node, vmid in PLACEMENT.items():
        report = json.loads(Path(fleet["reports"], "doctor", f"{node}-ct{vmid}-nccl.json").read_text())
        assert report["tier"] == "nccl" and report["summary"]["ok"], report["summary"]
        verdicts = {p["name"]: p["status"] for p in report["probes"]}
        assert verdicts["nccl_collectives"] == "pass" and verdicts["nccl_bandwidth"] == "pass", verdicts


def test_a_cold_key_without_a_gpu_is_planned_and_nothing_is_warmed(fleet: dict[str, Any]) -> None:
    first: PlaybookRun = fleet["first"]
    assert first.rc == 0, first.output[-4000:]
    keys = set()
    for node in PLACEMENT:
        ev = verdict(fleet, node)
        assert ev["status"] == "skip" and ev["summary"] == "no GPU expected (--no-gpu)", ev
        assert (
            ev["evidence"]["key_parts"]["gpu"] == [] and "holds no warmed key" in ev["evidence"]["share_note"]
        )
        keys.add(ev["evidence"]["key"])
    assert len(keys) == 1  # one stack, one model, one shape: one key across the nodes
    assert not list(fleet["share"].glob("*.tar.gz"))


def test_node_1_publishes_the_key_and_nodes_2_and_3_install_it(
    fleet: dict[str, Any], spread: dict[str, Any]
) -> None:
    run: PlaybookRun = spread["run"]
    key, share = spread["key"], fleet["share"]
    assert run.rc == 0, run.output[-4000:]
    manifest = json.loads((share / f"{key}.json").read_text())
    assert (
        manifest["key"] == key and manifest["published_by"] == "t-130" and (share / f"{key}.tar.gz").is_file()
    )
    text = said(run)
    assert f"Published to the cluster's cache {share}/{key}.tar.gz" in text
    for node in ("testbed2", "testbed3"):
        ev = verdict(fleet, node)
        assert ev["evidence"]["action"] == "installed", ev
        assert f"installed from the cluster's cache {share}/{key}.tar.gz, key {key}" in text
        inside = attach(
            PLACEMENT[node], f"test -s {ev['evidence']['stamp_path']} && ls {ev['evidence']['cache_dir']}"
        )
        assert inside.returncode == 0 and "RECORDEDH200WARMCHUNKFWDKERNELO" in inside.stdout, inside
    assert text.count(f"installed from the cluster's cache {share}/") == 2  # node 1 kept its own


def test_a_rerun_across_the_nodes_changes_nothing(rerun: PlaybookRun) -> None:
    assert rerun.rc == 0, rerun.output[-4000:]
    assert rerun.changed() == 0, rerun.changed_tasks()
    assert set(rerun.recap()) >= set(PLACEMENT)
    # The stack did not change: its verdicts carried over, so the NCCL tier is not run again.
    assert "TASK [doctor : Run the doctor at tier nccl]" not in rerun.output


def test_a_rerun_finds_every_node_warm(rerun: PlaybookRun, spread: dict[str, Any]) -> None:
    assert rerun.rc == 0, rerun.output[-4000:]
    assert rerun.changed() == 0, rerun.changed_tasks()
    assert said(rerun).count(f"skipped: cache key already warm ({spread['key']};") == 3  # the step's line


def test_a_key_the_cluster_does_not_hold_is_reported_as_not_matching(
    fleet: dict[str, Any], spread: dict[str, Any]
) -> None:
    node3 = {"testbed3": CTS["testbed3"]}
    other = fleet["run"]("provision.yml", node3, **{**fleet["extra"], "triton_warm_seq_lens": [4096]})
    assert other.rc == 0, other.output[-4000:]
    text = said(other)
    assert f"the nearest, {spread['key']}, differs: shapes.seq_lens: [2048] -> [4096]" in text, text[-3000:]
    assert "installed from the cluster's cache" not in text and "skipped: no GPU expected (--no-gpu)" in text


def test_destroy_removes_the_containers_of_every_node(fleet: dict[str, Any], api: Any) -> None:
    gone = fleet["run"]("destroy.yml", CTS, mlstack_destroy_confirm=True)
    assert gone.rc == 0, gone.output[-4000:]
    assert placed(api) == {}
