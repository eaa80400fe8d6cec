"""The guest hookscript gpu_container sets on a GPU container (gpu_boot's): planned and applied like devN,
taken live by a running container (PVE's LXC_FASTPLUG_OPTIONS), and never purged - a container's own stays."""

from __future__ import annotations

from ansible_collections.mlstack.pve.plugins.module_utils import ct_plan
from ansible_collections.mlstack.pve.plugins.module_utils.pct import OPTION_KEY, plan_changes

HOOK = "local:snippets/mlstack-gpu-hook"
DEV = {"dev0": "/dev/nvidia0,gid=44,mode=0666"}


def test_a_running_container_takes_the_hookscript_live_without_a_restart() -> None:
    found = ct_plan.reconcile(DEV, DEV, True, {**DEV, "hookscript": HOOK}, {})
    assert found["set"] == {"hookscript": HOOK}
    assert found["changes"][ct_plan.name_of("hookscript")]["applies"] == "live"
    assert found["restart_needed"] == []


def test_the_hookscript_set_before_is_no_change() -> None:
    config = {**DEV, "hookscript": HOOK}
    assert ct_plan.reconcile(config, config, True, config, {})["set"] == {}


def test_a_hookscript_not_asked_for_is_never_purged() -> None:
    _, deleted = plan_changes({"hookscript": "local:snippets/theirs.pl", **DEV}, {}, True)
    assert deleted == ["dev0"]


def test_pct_config_takes_the_hookscript_key() -> None:
    assert OPTION_KEY.match("hookscript") and OPTION_KEY.match("dev3") and not OPTION_KEY.match("cores")
