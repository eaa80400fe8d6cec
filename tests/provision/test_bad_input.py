"""Bad inventory input fails in the preflight play, before any change, with a message that says
what to fix. Each case runs provision.yml for real against the testbed."""

from __future__ import annotations

from typing import Any

import pytest
from playbook_runner import container
from tbhelpers import ct_exists as exists

CASES = {
    "unknown profile": ([container(121, profile="torch99-nosuch")], "unknown profile 'torch99-nosuch'"),
    "duplicate vmid": ([container(122), container(122, hostname="t-122b")], "Duplicate vmids or hostnames"),
    "duplicate hostname": (
        [container(123), container(124, hostname="t-123")],
        "Duplicate vmids or hostnames",
    ),
    "GPU index the node lacks": ([container(125, gpus=[7])], "not present on the node"),
    "missing model path": (
        [container(126, model_path="/srv/no/such/model")],
        "model_path /srv/no/such/model does not exist on testbed",
    ),
    "shell metacharacters in hostname": (
        [container(127, hostname="x;touch /tmp/pwned")],
        "hostname a DNS label",
    ),
}


@pytest.mark.parametrize(("containers", "message"), list(CASES.values()), ids=list(CASES))
def test_bad_input_fails_before_any_change(
    run_playbook: Any, api: Any, testbed: Any, containers: list[dict[str, Any]], message: str
) -> None:
    result = run_playbook("provision.yml", containers, timeout=300)
    assert result.rc != 0
    assert message in " ".join(result.output.split()), result.output[-3000:]
    assert result.changed() == 0, result.recap()
    for entry in containers:
        assert not exists(api, testbed.node, int(entry["vmid"]))


def test_vmid_of_a_guest_that_is_not_ours_is_refused(
    run_playbook: Any, api: Any, testbed: Any, foreign_ct: int
) -> None:
    result = run_playbook("provision.yml", [container(foreign_ct)], timeout=300)
    assert result.rc != 0
    assert f"vmid {foreign_ct} is already used by lxc 'not-ours'" in " ".join(result.output.split())
    assert result.changed() == 0, result.recap()
    config = api.nodes(testbed.node).lxc(foreign_ct).config.get()
    assert "mlstack" not in str(config.get("tags", "")) and "dev0" not in config
