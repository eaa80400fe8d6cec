"""Day two on one real testbed container (CT 200, provisioned once): the inventory changed, and each change
is planned (--check --diff, nothing touched), applied where PVE applies it (at once on the running
container, its cgroup limits read back inside), refused (a smaller disk) or left for the next start
(restarted only with mlstack_allow_restart). CT 201 is only ever planned, never created."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from playbook_runner import PlaybookRun, container

VMID = 200
NEW = 201
MIB = 1024 * 1024
FIRST = container(VMID)  # 1 core, 2048 MiB, 16 GiB, every GPU
LIVE = container(VMID, cores=2, memory_mb=3072, swap_mb=256, disk_gb=20, tags=["day-two"], onboot=False)
# A new entry that states no sizes: the plan shows the create's defaults.
NEW_ENTRY = {"vmid": NEW, "hostname": f"t-{NEW}", "gpus": "all"}
# What the container's own cgroup says, cgroup2 or v1 (a hybrid host).
MEMORY = "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes"
SWAP = (
    "cat /sys/fs/cgroup/memory.swap.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.memsw.limit_in_bytes"
)


@pytest.fixture(scope="module")
def run_module(tmp_path_factory: pytest.TempPathFactory, testbed: Any) -> Any:
    from playbook_runner import make_runner

    return make_runner(tmp_path_factory.mktemp("day-two"))


@pytest.fixture(scope="module")
def provisioned(run_module: Any) -> Iterator[PlaybookRun]:
    # Leftovers of an interrupted run (a larger disk would be refused, rightly) go first.
    run_module("destroy.yml", [FIRST, NEW_ENTRY], mlstack_destroy_confirm=True)
    first = run_module("provision.yml", [FIRST])
    assert first.rc == 0, first.output[-4000:]
    yield first
    run_module("destroy.yml", [FIRST, NEW_ENTRY], mlstack_destroy_confirm=True)


def inside(script: str) -> str:
    from tbhelpers import attach

    r = attach(VMID, script)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def init_started() -> str:
    """When the container's PID 1 started (clock ticks since boot): a restart changes it."""
    return inside("cut -d' ' -f22 /proc/1/stat")


def state_hash(vmids: tuple[int, ...] = (VMID, NEW)) -> str:
    """The testbed's state of these containers: the API's saved config and pending changes, the real LXC
    config, and the modification times of the rootfs's top-level entries but /tmp."""
    from mlstack_testbed import paths

    saved = json.loads(paths.API_STATE.read_text())
    cts = [{k: c.get(k) for k in ("vmid", "config", "pending")} for c in saved["cts"] if c["vmid"] in vmids]
    h = hashlib.sha256(json.dumps(sorted(cts, key=lambda c: c["vmid"]), sort_keys=True).encode())
    for vmid in vmids:
        ct = paths.LXC_PATH / str(vmid)
        if (ct / "config").is_file():
            h.update((ct / "config").read_bytes())
        for entry in sorted((ct / "rootfs").iterdir()) if (ct / "rootfs").is_dir() else []:
            # /tmp is scratch: Ansible's own runs inside the container come and go there.
            if entry.name != "tmp":
                h.update(f"{entry.name} {entry.lstat().st_mtime_ns}\n".encode())
    return h.hexdigest()


def said(run: PlaybookRun) -> str:
    return " ".join(run.output.split())


def test_a_plan_names_each_change_and_changes_nothing(provisioned: PlaybookRun, run_module: Any) -> None:
    before = state_hash()
    plan = run_module("provision.yml", [LIVE, NEW_ENTRY], flags=("--check", "--diff"))
    assert plan.rc == 0, plan.output[-6000:]
    text = said(plan)
    for line in (
        "CT 200 on testbed: cores 1 -> 2 (live)",
        "CT 200 on testbed: memory_mb 2048 -> 3072 (live)",
        "CT 200 on testbed: swap_mb 0 -> 256 (live)",
        "CT 200 on testbed: onboot 1 -> 0 (live)",
        "CT 200 on testbed: tags mlstack -> day-two;mlstack (live)",
        "CT 200 on testbed: disk_gb 16G -> 20G (live)",
        "CT 201 on testbed: create it (cores 2, memory_mb 4096, swap_mb 0, disk_gb 32)",
        "CT 201: then install its stack inside",
    ):
        assert line in text, text[-6000:]
    # --diff shows the container's config lines as they are and as they would be.
    assert "-memory: 2048" in plan.output and "+memory: 3072" in plan.output, plan.output[-6000:]
    assert state_hash() == before


def test_live_settings_are_applied_to_the_running_container(
    provisioned: PlaybookRun, run_module: Any, api: Any, testbed: Any
) -> None:
    started = init_started()
    run = run_module("provision.yml", [LIVE])
    assert run.rc == 0, run.output[-6000:]
    assert "CT 200 on testbed: memory_mb 2048 -> 3072 (live)" in said(run)
    config = api.nodes(testbed.node).lxc(VMID).config.get(current=1)
    assert (config["cores"], config["memory"], config["swap"], config["onboot"]) == (2, 3072, 256, 0)
    assert set(config["tags"].split(";")) == {"mlstack", "day-two"}
    assert "size=20G" in config["rootfs"]
    # Inside: the limits PVE hotplugs, on the container's own cgroup; it was not restarted.
    assert int(inside(MEMORY)) == 3072 * MIB
    assert int(inside(SWAP)) in (256 * MIB, (3072 + 256) * MIB)
    assert inside("nproc") == "2"
    assert init_started() == started
    # The inventory now matches: the rerun changes nothing on the node.
    again = run_module("provision.yml", [LIVE], limit="testbed")
    assert again.rc == 0 and again.changed() == 0, again.changed_tasks()


def test_a_smaller_disk_is_refused_before_any_change(
    provisioned: PlaybookRun, run_module: Any, api: Any, testbed: Any
) -> None:
    run = run_module("provision.yml", [{**LIVE, "disk_gb": 18, "cores": 1}], limit="testbed")
    assert run.rc != 0
    assert "Container 200: disk_gb 18 is smaller than its root disk (20 GiB)" in said(run), run.output[-4000:]
    assert "Nothing was changed." in said(run)
    config = api.nodes(testbed.node).lxc(VMID).config.get()
    assert config["cores"] == 2 and "size=20G" in config["rootfs"]


def test_what_pve_applies_at_the_next_start_waits_for_an_allowed_restart(
    provisioned: PlaybookRun, run_module: Any, api: Any, testbed: Any
) -> None:
    lxc = api.nodes(testbed.node).lxc(VMID)
    started = init_started()
    one_gpu = {**LIVE, "gpus": [0], "hostname": "t-200-b"}
    run = run_module("provision.yml", [one_gpu])
    assert run.rc == 0, run.output[-6000:]
    text = said(run)
    assert "CT 200 on testbed: hostname t-200 -> t-200-b (live)" in text, text[-6000:]
    assert "CT 200 on testbed: restart needed for dev" in text and "pct reboot 200" in text, text[-6000:]
    # PVE keeps the devices pending; the running container still has both GPUs.
    pending = {i["key"] for i in lxc.pending.get() if "pending" in i or i.get("delete")}
    assert pending and all(k.startswith("dev") for k in pending), pending
    assert lxc.config.get(current=1)["hostname"] == "t-200-b"
    assert inside("ls /dev/nvidia1") == "/dev/nvidia1" and init_started() == started
    # Allowed: the rerun restarts it, and the container runs with what the inventory states.
    allowed = run_module("provision.yml", [one_gpu], mlstack_allow_restart=True)
    assert allowed.rc == 0, allowed.output[-6000:]
    assert "wait for the next start of container 200" in " ".join(allowed.changed_tasks())
    assert not [i for i in lxc.pending.get() if "pending" in i or i.get("delete")]
    assert inside("ls /dev/nvidia1 2>/dev/null || echo none") == "none"
    assert inside("hostname") == "t-200-b" and init_started() != started
