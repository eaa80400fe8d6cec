"""Warm once per cluster, across the testbed's three nodes, one container each (CT 270 on testbed, 271 on
testbed2, 272 on testbed3), each node with its own Triton cache folder as real nodes have.

The testbed has no GPU, so a recorded cache stands in for the GPU warm: after the first provision (nothing
to warm: each container's key is planned and reported), the test writes into CT 270's cache a few cache
files and the stamp of the key the doctor computed there, as the warm step would have. The next run of the
three nodes publishes that key to the controller's folder from node 1 and installs it, checked by the
doctor, on nodes 2 and 3, which skip the warm and say why; a rerun changes nothing; a key the cluster does
not hold (other training shapes) is reported as not matching, with what differs."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playbook_runner import PlaybookRun, container, make_runner
from tbhelpers import attach

PLACEMENT = {"testbed": 270, "testbed2": 271, "testbed3": 272}
NODE_CACHES = Path("/var/lib/mlstack/warm-share-test")
VENV_PYTHON = "/opt/mlstack/venv/bin/python"

# A Triton 3.x entry as the warm step leaves it (a complete ELF binary, its metadata, the group file with
# absolute child paths, FLA's tuned config) and the stamp of the key: what node 1 would have after a warm.
RECORD = """
import json, shutil, sys
from pathlib import Path
from mlstack_doctor import warm
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


def cts(*nodes: str, **fields: Any) -> dict[str, list[dict[str, Any]]]:
    return {n: [container(PLACEMENT[n], **fields)] for n in nodes}


def said(run: PlaybookRun) -> str:
    """The run's output as one line, as printed (YAML results double the quote in "cluster's")."""
    return " ".join(run.output.replace("''", "'").split())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, testbed: Any) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("warm-share")
    reports, share = work / "reports", work / "share"
    run = make_runner(work)
    every = cts(*PLACEMENT)
    extra = {
        "fleet_report_dir": str(reports),
        "doctor_controller_report_dir": str(reports / "doctor"),
        # The doctor runs the warm step's key and share work (the GPU part is skipped under --no-gpu).
        "triton_warm_expect_gpu": True,
        "triton_warm_share_dir": str(share),
        # One Triton cache folder per node, as on a real cluster (the testbed's nodes share one disk).
        "pve_host_triton_cache_dir": f"{NODE_CACHES}/{{{{ inventory_hostname }}}}/triton",
        "gpu_container_triton_cache_dir": f"{NODE_CACHES}/{{{{ inventory_hostname }}}}/triton",
    }
    run("destroy.yml", every, mlstack_destroy_confirm=True)
    shutil.rmtree(NODE_CACHES, ignore_errors=True)
    first = run("provision.yml", every, **extra)
    yield {"run": run, "extra": extra, "first": first, "reports": reports, "share": share, "every": every}
    run("destroy.yml", every, mlstack_destroy_confirm=True)
    shutil.rmtree(NODE_CACHES, ignore_errors=True)


def verdict(cluster: dict[str, Any], node: str) -> dict[str, Any]:
    path = cluster["reports"] / "doctor" / f"{node}-ct{PLACEMENT[node]}-warm.json"
    report = json.loads(path.read_text())
    return next(p for p in report["probes"] if p["name"] == "triton_warm")


@pytest.fixture(scope="module")
def spread(cluster: dict[str, Any]) -> dict[str, Any]:
    """Node 1 holds the recorded warm of its key; then one run of the three nodes."""
    first: PlaybookRun = cluster["first"]
    assert first.rc == 0, first.output[-4000:]
    planned = verdict(cluster, "testbed")
    script = (
        f"cat > /tmp/warm-ev.json <<'EOF'\n{json.dumps(planned['evidence'])}\nEOF\n"
        f"cat > /tmp/record.py <<'EOF'\n{RECORD}\nEOF\n"
        f"{VENV_PYTHON} /tmp/record.py < /tmp/warm-ev.json"
    )
    r = attach(PLACEMENT["testbed"], script, timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr)
    run = cluster["run"]("provision.yml", cluster["every"], **cluster["extra"])
    return {"planned": planned, "run": run, "key": planned["evidence"]["key"]}


def test_a_cold_key_without_a_gpu_is_planned_and_nothing_is_warmed(cluster: dict[str, Any]) -> None:
    first: PlaybookRun = cluster["first"]
    assert first.rc == 0, first.output[-4000:]
    keys = set()
    for node in PLACEMENT:
        ev = verdict(cluster, node)
        assert ev["status"] == "skip" and ev["summary"] == "no GPU expected (--no-gpu)", ev
        assert (
            ev["evidence"]["key_parts"]["gpu"] == [] and "holds no warmed key" in ev["evidence"]["share_note"]
        )
        keys.add(ev["evidence"]["key"])
    assert len(keys) == 1  # one stack, one model, one shape: one key across the nodes
    assert not list(cluster["share"].glob("*.tar.gz"))


def test_node_1_publishes_the_key_and_nodes_2_and_3_install_it(
    cluster: dict[str, Any], spread: dict[str, Any]
) -> None:
    run: PlaybookRun = spread["run"]
    key, share = spread["key"], cluster["share"]
    assert run.rc == 0, run.output[-4000:]
    manifest = json.loads((share / f"{key}.json").read_text())
    assert (
        manifest["key"] == key and manifest["published_by"] == "t-270" and (share / f"{key}.tar.gz").is_file()
    )
    text = said(run)
    assert f"Published to the cluster's cache {share}/{key}.tar.gz" in text
    for node in ("testbed2", "testbed3"):
        ev = verdict(cluster, node)
        assert ev["evidence"]["action"] == "installed", ev
        assert f"installed from the cluster's cache {share}/{key}.tar.gz, key {key}" in text
        inside = attach(
            PLACEMENT[node], f"test -s {ev['evidence']['stamp_path']} && ls {ev['evidence']['cache_dir']}"
        )
        assert inside.returncode == 0 and "RECORDEDH200WARMCHUNKFWDKERNELO" in inside.stdout, inside
    assert text.count(f"installed from the cluster's cache {share}/") == 2  # node 1 kept its own


def test_a_rerun_across_the_nodes_changes_nothing(cluster: dict[str, Any], spread: dict[str, Any]) -> None:
    rerun = cluster["run"]("provision.yml", cluster["every"], **cluster["extra"])
    assert rerun.rc == 0, rerun.output[-4000:]
    assert rerun.changed() == 0, rerun.changed_tasks()
    assert said(rerun).count(f"skipped: cache key already warm ({spread['key']};") == 3  # the step's line


def test_a_key_the_cluster_does_not_hold_is_reported_as_not_matching(
    cluster: dict[str, Any], spread: dict[str, Any]
) -> None:
    other = cluster["run"](
        "provision.yml", cts("testbed3"), **{**cluster["extra"], "triton_warm_seq_lens": [4096]}
    )
    assert other.rc == 0, other.output[-4000:]
    text = said(other)
    assert f"the nearest, {spread['key']}, differs: shapes.seq_lens: [2048] -> [4096]" in text, text[-3000:]
    assert "installed from the cluster's cache" not in text and "skipped: no GPU expected (--no-gpu)" in text
