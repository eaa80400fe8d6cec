"""The PVE API endpoint down: before a run (the preflight says so, changing nothing) and in the middle
of one (just before the create call of a new container, CT 175: a rerun of the shared CT's unchanged
config makes no API call after the preflight's read). The API is reached through a forwarder only these
runs use, so the testbed's API stays up for everybody else; cutting the forwarder is the endpoint going
away."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from faultlib import Link, fault_env, one_line, venv_works
from playbook_runner import container
from tbhelpers import ct_exists


@pytest.fixture
def api_link(testbed: Any) -> Iterator[Link]:
    link = Link(int(testbed.api_port))
    yield link
    link.close()


@pytest.mark.slow
def test_api_down_before_and_during_a_run(
    runner: Any,
    shared_ct: dict[str, Any],
    api: Any,
    testbed: Any,
    api_link: Link,
    tmp_path: Path,
    fresh_vmid: Any,
) -> None:
    vmid = int(shared_ct["vmid"])
    new_ct = container(fresh_vmid(175), hostname="fault-175")
    via_link = {
        "mlstack_pve_api_port": api_link.port,
        "gpu_container_api_retries": 2,
        "gpu_container_api_retry_delay": 1,
    }
    config_before = api.nodes(testbed.node).lxc(vmid).config.get()

    # 1. Down before the run: the preflight says which endpoint and what to check; nothing changes.
    api_link.cut()
    down = runner("provision.yml", [shared_ct], **via_link)
    text = one_line(down.output)
    assert down.rc != 0
    assert f"The PVE API at https://127.0.0.1:{api_link.port} did not answer" in text, down.output[-3000:]
    assert "Connection refused" in text
    assert "Check that pveproxy runs on the node" in text
    assert down.changed() == 0, down.changed_tasks()
    assert "PLAY [Prepare the PVE nodes" not in down.output

    # 2. Down in the middle: up for the preflight, gone when a new container is about to be created.
    api_link.restore()
    mark = tmp_path / "fault.mark"
    env = fault_env("Create the container through the PVE API", api_link.cut_command(), mark, when="start")
    middle = runner("provision.yml", [shared_ct, new_ct], env=env, **via_link)
    assert mark.exists(), "the fault did not fire"
    assert middle.rc != 0
    assert "Connection refused" in one_line(middle.output), middle.output[-3000:]
    assert middle.changed() == 0, middle.changed_tasks()
    assert not ct_exists(api, testbed.node, new_ct["vmid"])

    # State: the container is as it was, running, its venv working.
    assert api.nodes(testbed.node).lxc(vmid).status.current.get()["status"] == "running"
    config_after = api.nodes(testbed.node).lxc(vmid).config.get()
    assert {k: v for k, v in config_after.items() if k != "digest"} == {
        k: v for k, v in config_before.items() if k != "digest"
    }
    assert venv_works(vmid)

    # 3. Back up: a rerun completes and has nothing to change.
    api_link.restore()
    again = runner("provision.yml", [shared_ct], **via_link)
    assert again.rc == 0, again.output[-4000:]
    assert again.changed() == 0, again.changed_tasks()


@pytest.mark.slow
def test_destroy_reads_again_when_the_api_drops_out(
    runner: Any, api: Any, testbed: Any, api_link: Link, tmp_path: Path, fresh_vmid: Any
) -> None:
    """The API gone as destroy.yml reads the node's guests, back once that read has failed (what a guest
    removed between PVE's listing and its config read also looks like: the read fails once): the read is
    made again and the container is removed."""
    from tbhelpers import wait_ok

    vmid = fresh_vmid(176)
    lxc = api.nodes(testbed.node).lxc
    wait_ok(
        api,
        testbed,
        lxc.post(vmid=vmid, ostemplate=testbed.template, storage=testbed.storage, tags="mlstack"),
    )
    mark = tmp_path / "fault.mark"
    env = fault_env(
        "Read the guests on the node",
        api_link.cut_command(),
        mark,
        when="start",
        on_retry=api_link.restore_command(),
    )
    gone = runner(
        "destroy.yml",
        [container(vmid, hostname="fault-176")],
        env=env,
        mlstack_destroy_confirm=True,
        mlstack_pve_api_port=api_link.port,
        gpu_container_api_retries=5,
        gpu_container_api_retry_delay=2,
    )
    fired = mark.read_text() if mark.exists() else ""
    assert re.search(r"^\S+ 0 retry: .*Read the guests on the node$", fired, re.M), (
        f"did not fire and heal: {fired!r}"
    )
    assert gone.rc == 0, gone.output[-4000:]
    assert re.search(r"FAILED - RETRYING: \[testbed[^]]*\]: .*Read the guests on the node", gone.output), (
        gone.output[-4000:]
    )
    assert not ct_exists(api, testbed.node, vmid)
