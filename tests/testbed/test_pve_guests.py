"""mlstack.pve.pve_guests against the testbed's API: every guest listed, and only the project's containers
and the inventory's vmids read further (config, and pending changes where they run). What happens between
the listing and the reads (a container destroyed, a privilege revoked) is made to happen there, on an API
of this checkout's code of the tests' own (tbhelpers.OwnApi: API records, no real container): its answers
are the server's own."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ansible.module_utils.testing import patch_module_args
from ansible_collections.mlstack.pve.plugins.modules import pve_guests
from mlstack_testbed import client, paths
from mlstack_testbed.node import access
from tbhelpers import LOCAL_INVENTORY, OwnApi, api_args, playbook, results, wait_ok

TAGGED, FOREIGN, NAMED = 931, 932, 933


def read(testbed: client.Testbed, env: dict[str, str], tmp: Path, **args: Any) -> dict[str, Any]:
    task = {
        "mlstack.pve.pve_guests": {**api_args(testbed), **args},
        "no_log": False,
        "ignore_errors": True,
    }
    plays = json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": [task]}])
    (result,) = results(playbook(env, tmp, LOCAL_INVENTORY, plays), "localhost")
    return result


def test_reads_ours_and_the_named_and_lists_the_rest(
    api: Any,
    testbed: client.Testbed,
    ansible_env: dict[str, str],
    tmp_path: Path,
    cleanup: Any,
) -> None:
    lxc = api.nodes(testbed.node).lxc
    for vmid, extra in ((TAGGED, {"tags": "mlstack;team-a", "start": 1}), (FOREIGN, {}), (NAMED, {})):
        cleanup(vmid)
        wait_ok(
            api,
            testbed,
            lxc.post(
                vmid=vmid, ostemplate=testbed.template, storage=testbed.storage, unprivileged=1, **extra
            ),
        )
    # A change PVE keeps pending on a running container: it shows in `pending` only.
    lxc(TAGGED).config.put(features="nesting=1")

    out = read(testbed, ansible_env, tmp_path, tag="mlstack", vmids=[NAMED], pending=True)
    assert not out.get("failed"), out
    guests = {g["vmid"]: g for g in out["proxmox_vms"]}
    assert {TAGGED, FOREIGN, NAMED} <= set(guests), sorted(guests)
    assert guests[TAGGED]["status"] == "running" and guests[TAGGED]["type"] == "lxc"
    assert "mlstack" in guests[TAGGED]["config"]["tags"]
    assert "nesting=1" not in guests[TAGGED]["config"].get("features", "")
    assert "config" in guests[NAMED], "a vmid the inventory names is read whatever its tags"
    assert "config" not in guests[FOREIGN], "a guest neither ours nor named costs no config read"
    assert guests[FOREIGN]["name"] and guests[FOREIGN]["node"] == testbed.node
    assert TAGGED in out["ours"] and FOREIGN not in out["ours"] and NAMED not in out["ours"]
    pending = {g["vmid"]: g for g in out["pending"]}
    assert set(pending) & {TAGGED, FOREIGN, NAMED} == {TAGGED}, "only running containers have pending reads"
    assert "nesting=1" in pending[TAGGED]["config"]["features"]

    # The same read of the node alone, and of a node the cluster lacks.
    out = read(testbed, ansible_env, tmp_path, tag="mlstack", node=testbed.node)
    assert not out.get("failed"), out
    assert {g["node"] for g in out["proxmox_vms"]} == {testbed.node} and out["pending"] == []
    out = read(testbed, ansible_env, tmp_path, tag="mlstack", node="nosuchnode")
    assert out.get("failed") and "Node nosuchnode doesn't exist in PVE cluster" in out["msg"], out


# On the tests' own API only: records, no real container.
STAYS, GOES = 962, 963
TOKEN = f"{paths.API_USER}!guests-read"


@pytest.fixture(scope="module")
def own(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnApi]:
    served = OwnApi(tmp_path_factory.mktemp("own-api"))
    for vmid in (STAYS, GOES):
        served.pve.add_ct(vmid, node=paths.FIRST_NODE, status="stopped", config={"tags": "mlstack"})
    # The project's token, with the privileges the docs grant (as tests/provision/test_api_token.py).
    served.pve.add_role("guests-read", access.PROVISION_PRIVILEGES)
    served.pve.add_token(TOKEN)
    for path in access.PROVISION_ACL_PATHS:
        served.pve.set_acl(path, ["guests-read"], [TOKEN])
    yield served
    served.stop()


def run_between(
    own: OwnApi,
    between: Callable[[], None],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> dict[str, Any]:
    """The module, in this process, against the own API with the token; `between` runs once the listing is
    done, right before the first config read. Its JSON answer."""
    reads = pve_guests.Guests.config

    def config(self: pve_guests.Guests, guest: dict[str, Any], current: int) -> Any:
        if not ran:
            ran.append(between())
        return reads(self, guest, current)

    ran: list[None] = []
    monkeypatch.setattr(pve_guests.Guests, "config", config)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", own.cafile)  # requests' trust for validate_certs
    args = {
        "api_host": own.HOST,
        "api_port": own.port,
        "api_user": paths.API_USER,
        "api_token_id": TOKEN.partition("!")[2],
        "api_token_secret": own.pve.token_secrets[TOKEN],
        "validate_certs": True,
        "tag": "mlstack",
    }
    with patch_module_args(args), pytest.raises(SystemExit):
        pve_guests.main()
    assert ran, "the module read no config"
    answer: dict[str, Any] = json.loads(capsys.readouterr().out)
    return answer


def test_a_container_destroyed_since_the_listing_is_left_out(
    own: OwnApi, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    gone = own.pve.ct(GOES)

    def destroy() -> None:
        own.pve.cts.remove(gone)

    try:
        out = run_between(own, destroy, monkeypatch, capsys)
    finally:
        own.pve.cts.append(gone)
    assert not out.get("failed"), out
    assert [g["vmid"] for g in out["proxmox_vms"]] == [STAYS] and out["ours"] == [STAYS], out
    assert out["proxmox_vms"][0]["config"]["tags"] == "mlstack"


def test_a_read_refused_since_the_listing_fails_with_the_apis_words(
    own: OwnApi, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    revoked = f"/vms/{GOES}"

    def revoke() -> None:
        own.pve.set_acl(revoked, ["NoAccess"], [TOKEN])

    try:
        out = run_between(own, revoke, monkeypatch, capsys)
    finally:
        own.pve.acl_entries = [e for e in own.pve.acl_entries if (e.path, e.role) != (revoked, "NoAccess")]
    assert out.get("failed"), out
    assert out["msg"] == (
        f"Failed to retrieve the config of CT {GOES} on node {paths.FIRST_NODE}: "
        f"403 Forbidden: Permission check failed ({revoked}, VM.Audit)"
    ), out
