"""The container template is on the node before any container is created (pve_host's template step):
`pveam list` on the node, `pveam download` only when the template is missing, a clear failure when
the node cannot get it. Against the testbed's pveam, which serves under PVE's names the Debian
templates it builds with debootstrap and lists Ubuntu 24.04 without being able to build it.

The template these tests remove and download, debian-12-standard_12.12-1_amd64.tar.zst, is used by no
other test (the testbed inventory uses debian-12-testbed_amd64.tar.zst). Containers: vmids 943-944."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from playbook_runner import container
from tbhelpers import ct_exists, remove_ct, ssh

DEBIAN = "debian-12-standard_12.12-1_amd64.tar.zst"
UBUNTU = "ubuntu-24.04-standard_24.04-2_amd64.tar.zst"


def pveam_list(testbed: Any) -> list[str]:
    r = ssh(testbed, "pveam list local")
    assert r.returncode == 0, r.stderr
    return [line.split()[0] for line in r.stdout.splitlines()[1:] if line.strip()]


@pytest.fixture
def ct(api: Any, testbed: Any, request: pytest.FixtureRequest) -> Iterator[int]:
    vmid = int(request.param)
    remove_ct(api, testbed, vmid)
    yield vmid
    remove_ct(api, testbed, vmid)


def test_the_nodes_pveam_answers_as_pves_does(testbed: Any) -> None:
    available = ssh(testbed, "pveam available --section system")
    assert available.returncode == 0, available.stderr
    assert f"{'system':<15} {DEBIAN}" in available.stdout.splitlines()
    assert f"{'system':<15} {UBUNTU}" in available.stdout.splitlines()
    listing = ssh(testbed, "pveam list local").stdout.splitlines()
    assert re.fullmatch(r"NAME {56} SIZE\s*", listing[0])
    row = r"local:vztmpl/debian-12-testbed_amd64\.tar\.zst +\d+\.\d\dMB"
    assert any(re.fullmatch(row, line) for line in listing), listing
    unknown = ssh(testbed, "pveam download local nosuch-standard_1.0-1_amd64.tar.zst")
    assert unknown.returncode == 255
    said = unknown.stderr.splitlines()
    assert said[:2] == ["400 Parameter verification failed.", "template: no such template"], said


@pytest.mark.parametrize("ct", [943], indirect=True)
def test_a_missing_template_is_downloaded_before_the_container_is_made(
    run_playbook: Any, api: Any, testbed: Any, ct: int
) -> None:
    volid = f"local:vztmpl/{DEBIAN}"
    removed = ssh(testbed, f"pveam remove {volid}")
    assert removed.returncode == 0, removed.stderr
    assert volid not in pveam_list(testbed)

    # The template is the node plays' business: the runs stop before the inside of the container (what
    # changes there is the lifecycle tests' business).
    first = run_playbook("provision.yml", [container(ct)], limit=testbed.node, mlstack_ostemplate=volid)
    assert first.rc == 0, first.output[-5000:]
    assert "TASK [pve_host : Download the template]" in first.changed_tasks(), first.changed_tasks()
    assert volid in pveam_list(testbed)
    volumes = [v["volid"] for v in api.nodes(testbed.node).storage("local").content.get(content="vztmpl")]
    assert volid in volumes
    assert api.nodes(testbed.node).lxc(ct).status.current.get()["status"] == "running"

    # Present now: listed, not downloaded again; nothing on the node changes.
    again = run_playbook("provision.yml", [container(ct)], limit=testbed.node, mlstack_ostemplate=volid)
    assert again.rc == 0, again.output[-5000:]
    assert again.recap()["testbed"]["changed"] == 0, again.changed_tasks()
    # The node's one state read found it: the download steps are not even included.
    assert "TASK [pve_host : Download the template]" not in again.output, again.output[-3000:]


@pytest.mark.parametrize("ct", [944], indirect=True)
def test_a_template_the_node_cannot_get_fails_before_anything_is_made(
    run_playbook: Any, api: Any, testbed: Any, ct: int
) -> None:
    volid = f"local:vztmpl/{UBUNTU}"
    assert volid not in pveam_list(testbed)
    result = run_playbook("provision.yml", [container(ct)], timeout=600, mlstack_ostemplate=volid)
    text = " ".join(result.output.split())
    assert result.rc != 0
    assert f"The template {UBUNTU} is not on storage 'local' of node testbed" in text, result.output[-4000:]
    assert "the testbed cannot build Ubuntu templates" in text
    assert f"`pveam available --section system` lists: {DEBIAN}," in text
    assert "No container was created." in text
    assert result.changed() == 0, result.changed_tasks()
    assert "TASK [gpu_container : Create the container" not in result.output
    assert not ct_exists(api, testbed.node, ct)
    assert volid not in pveam_list(testbed)
