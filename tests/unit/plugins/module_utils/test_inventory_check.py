"""mlstack.pve.inventory_check: the preflight's checks of the inventory, each with the message a user
reads (the provisioning tests grep these same words from a real run), and the action as a play runs it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ansible_collections.mlstack.pve.plugins.module_utils import inventory_check as check
from localplay import run_module

ROOT = Path(__file__).resolve().parents[4]
SETTINGS = {
    "node": "pve1",
    "storage": "local-lvm",
    "bridge": "vmbr0",
    "ostemplate": "local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst",
    "tag": "mlstack",
}
ROOTS = ["/var/lib/mlstack", "/srv"]


def ct(vmid: int = 161, **fields: Any) -> dict[str, Any]:
    return {"vmid": vmid, "hostname": f"t-{vmid}", **fields}


def test_good_settings_pass() -> None:
    assert check.node_settings("pve1", SETTINGS) == []
    assert check.token_settings("pve1", "", False) == []


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("node", "pve;1", "node name (mlstack_pve_node) a DNS name"),
        ("storage", "local lvm", "rootfs storage (mlstack_rootfs_storage) a PVE storage id"),
        ("bridge", "vmbr0$(x)", "bridge (mlstack_bridge) an interface name"),
        ("ostemplate", "debian-12.tar.zst", "template (mlstack_ostemplate) a volid storage:vztmpl/file"),
        ("tag", "MLstack", "tag (gpu_container_tag) of a-z, 0-9, . _ -"),
    ],
)
def test_a_bad_setting_is_named(field: str, value: str, said: str) -> None:
    assert check.node_settings("pve1", {**SETTINGS, field: value}) == [
        f"pve1: expected {said}, of letters, digits and . _ - only. Fix the inventory."
    ]


@pytest.mark.parametrize(
    ("token_id", "secret", "said"),
    [
        ("root@pam!mlstack", True, None),
        ("mlstack", True, None),
        ("root@pam!ml stack", True, "mlstack_pve_api_token_id must be user@realm!name"),
        ("root@pam!mlstack", False, "mlstack_pve_api_token_secret is empty"),
    ],
)
def test_token_settings(token_id: str, secret: bool, said: str | None) -> None:
    found = check.token_settings("pve1", token_id, secret)
    assert (said is None) == (found == []), found
    if said:
        assert found[0].startswith("pve1: the API token settings are incomplete: ") and said in found[0]


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"vmid": 99}, "vmid 100..999999999"),
        ({"hostname": "x;touch /tmp/pwned"}, "hostname a DNS label (a-z, 0-9, '-')"),
        ({"profile": ".."}, "profile a folder name"),
        ({"model_path": "/srv/../etc"}, "(no '.' or '..' parts)"),
        ({"model_path": "models"}, "model_path an absolute path"),
        ({"extras": ["fla", "x y"]}, "extras names of letters, digits and . _ -"),
        ({"extras": "fla"}, "extras a list of names"),
        ({"purpose": "gaming"}, "purpose training or inference"),
    ],
)
def test_a_bad_container_field_is_named(fields: dict[str, Any], said: str) -> None:
    found = check.container_fields("testbed", [{**ct(), **fields}])
    assert len(found) == 1 and said in found[0], found
    assert found[0].startswith(f"Container {fields.get('vmid', 161)} on testbed: expected ")
    assert found[0].endswith("Fix the inventory entry.")


def test_good_container_fields_pass() -> None:
    entry = ct(profile="torch211-triton37", model_path="/srv/models/x", extras=["fla"], purpose="inference")
    assert check.container_fields("testbed", [entry]) == []


def test_an_unknown_profile_names_the_known_ones() -> None:
    profiles = str(ROOT / "profiles")
    assert check.profiles_exist([ct(profile="torch211-triton37")], profiles) == []
    found = check.profiles_exist([ct(121, profile="torch99-nosuch")], profiles)
    assert found == [
        "Container 121: unknown profile 'torch99-nosuch'. Known profiles: "
        + ", ".join(sorted(p.parent.name for p in (ROOT / "profiles").glob("*/uv.lock")))
        + "."
    ]


@pytest.mark.parametrize(
    ("fields", "ok"),
    [
        ({"memory_mb": 2048, "disk_gb": 16}, True),
        ({"memory_mb": 512}, False),
        ({"memory_mb": 4096, "disk_gb": 4}, False),
    ],
)
def test_memory_and_disk_against_the_profile(tmp_path: Path, fields: dict[str, Any], ok: bool) -> None:
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "profile.yml").write_text("min_memory_mb: 2048\nmin_disk_gb: 16\n")
    found = check.resources([ct(**fields)], {"161": {"profile": "p"}}, str(tmp_path))
    assert (found == []) is ok
    if not ok:
        assert "Container 161: profile p needs at least 2048 MiB of memory and 16 GiB of disk" in found[0]
        assert f"memory_mb {fields['memory_mb']} and disk_gb {fields.get('disk_gb', 32)}" in found[0]


def test_a_profile_without_needs_takes_any_size(tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    assert check.resources([ct(memory_mb=1, disk_gb=1)], {"161": {"profile": "p"}}, str(tmp_path)) == []


def test_a_stale_lock_says_uvs_error_and_the_fix() -> None:
    results = {
        "a": {"rc": 0},
        "b": {"skipped": True},
        "c": {
            "rc": 1,
            "stderr": "Resolved 3 packages\nerror: The lockfile at `uv.lock` needs to be updated\n",
        },
    }
    found = check.locks(results)
    assert len(found) == 1
    assert found[0].startswith(
        "Profile c: `uv lock --check` says its uv.lock is out of date with its pyproject.toml"
    )
    assert "error: The lockfile at `uv.lock` needs to be updated Refresh" in found[0]
    assert "`uv lock --project profiles/c`" in found[0]


@pytest.mark.parametrize(
    ("gpus", "said"),
    [
        ("all", None),
        ("none", None),
        ([0], None),
        ([7], "GPU index(es) [7] not present on the node"),
        (0, "is not a list"),
    ],
)
def test_gpu_selections(gpus: Any, said: str | None) -> None:
    found = check.gpu_selections("testbed", [ct(gpus=gpus)], ["/dev/nvidia0", "/dev/nvidiactl"])
    assert (found == []) is (said is None), found
    if said:
        assert found[0].startswith("Container 161 on testbed: ") and said in found[0]


def test_duplicates_across_nodes_are_named() -> None:
    """Each of the node's entries whose vmid or hostname another entry has, one line naming both."""
    assert check.unique("pve1", {"pve1": [ct(122)], "pve2": [ct(123)]}) == []
    inventory = {"pve1": [ct(122), ct(124, hostname="t-123")], "pve2": [ct(122, hostname="t-122b"), ct(123)]}
    assert check.unique("pve1", inventory) == [
        "Container 122 (t-122) on pve1: vmid 122 is also the vmid of t-122b on pve2. Each container needs its"
        " own vmid.",
        "Container 124 on pve1: hostname t-123 is also the hostname of Container 123 on pve2. Each container"
        " needs its own hostname.",
    ]


@pytest.mark.parametrize(
    ("resolved", "said"),
    [
        ({"real": "/srv/models/x", "exists": True}, None),
        ({"real": "/srv/no/such", "exists": False}, "model_path /srv/m does not exist on testbed"),
        ({"real": "/etc", "exists": True}, "model_path /srv/m is /etc on testbed, outside the folders"),
    ],
)
def test_model_paths_as_resolved_on_the_node(resolved: dict[str, Any], said: str | None) -> None:
    caches = {"/var/lib/mlstack/cache/uv": {"real": "/var/lib/mlstack/cache/uv", "exists": False}}
    found = check.bind_sources(
        "testbed", [ct(model_path="/srv/m"), ct(162)], list(caches), {"/srv/m": resolved, **caches}, ROOTS
    )
    assert (found == []) is (said is None), found
    if said:
        assert found == [found[0]] and found[0].startswith("Container 161: ") and said in found[0]


def test_a_cache_that_leads_outside_the_roots_is_refused() -> None:
    found = check.bind_sources("testbed", [], ["/var/lib/mlstack/cache/uv"], {}, ROOTS)
    assert found == [
        "The shared cache /var/lib/mlstack/cache/uv is ? on testbed, outside the folders that may be"
        " bind-mounted into containers (/var/lib/mlstack, /srv). Put the caches below pve_host_root"
        " (/var/lib/mlstack)."
    ]


def test_a_vmid_of_someone_elses_guest_is_refused() -> None:
    guests = [
        {"vmid": 150, "type": "lxc", "name": "not-ours", "node": "testbed"},
        {"vmid": 161, "type": "lxc", "name": "t-161", "node": "testbed"},
    ]
    assert check.foreign_vmids([ct(161)], guests, [161], "mlstack") == []
    assert check.foreign_vmids([ct(150)], guests, [161], "mlstack") == [
        "vmid 150 is already used by lxc 'not-ours' on node testbed, which this project did not create"
        " (no 'mlstack' tag). Choose a free vmid."
    ]


def test_missing_passthrough_names_each_node() -> None:
    missing = [{"vmid": 161, "key": "dev1", "path": "/dev/nvidia1"}]
    assert check.missing_passthrough_message("testbed", []) == []
    found = check.missing_passthrough_message("testbed", missing)
    assert found[0].startswith(
        "CT 161 passes /dev/nvidia1 through (dev1), but node testbed has no /dev/nvidia1."
    )
    assert "`nvidia-modprobe -u -c=0` recreates /dev/nvidia-uvm*" in found[0]


def run_action(args: dict[str, Any]) -> dict[str, Any]:
    return run_module("mlstack.pve.inventory_check", args)


def test_the_action_fails_with_every_message_that_applies() -> None:
    """Through ansible: the checks the task names run, all their messages in one failure."""
    containers = [ct(121, profile="torch99-nosuch"), ct(122, hostname="x;y")]
    checks = ["node_settings", "token_settings", "container_fields", "profiles_exist"]
    result = run_action(
        {
            "checks": checks,
            "settings": SETTINGS,
            "containers": containers,
            "profiles_dir": str(ROOT / "profiles"),
        }
    )
    assert result["failed"] is True
    assert len(result["errors"]) == 2
    assert "Container 122 on localhost: expected hostname a DNS label" in result["msg"]
    assert "Container 121: unknown profile 'torch99-nosuch'" in result["msg"]


def test_the_action_passes_good_input() -> None:
    checks = ["node_settings", "container_fields", "unique"]
    result = run_action(
        {
            "checks": checks,
            "settings": SETTINGS,
            "containers": [ct()],
            "inventory": {"localhost": [ct(), ct(162)]},
        }
    )
    assert not result.get("failed") and result["errors"] == [] and result["changed"] is False


def test_only_the_named_checks_run() -> None:
    """Given inputs are not a reason to run a check: duplicates across nodes pass unchecked when the
    task names only the settings check."""
    result = run_action(
        {"checks": ["node_settings"], "settings": SETTINGS, "inventory": {"localhost": [ct(), ct()]}}
    )
    assert not result.get("failed") and result["errors"] == []


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            {"containers": [ct()]},
            "inventory_check: checks must name the checks to run, some of: node_settings,",
        ),
        ({"checks": ["no_such"]}, "inventory_check: unknown check(s) no_such; the checks: node_settings,"),
        (
            {"checks": ["container_fields", "gpu_selections"]},
            "inventory_check: check gpu_selections needs gpu_nodes",
        ),
    ],
    ids=["no-checks", "unknown-check", "missing-input"],
)
def test_a_task_that_names_no_check_or_omits_its_input_is_refused(args: dict[str, Any], said: str) -> None:
    result = run_action(args)
    assert result["failed"] is True and result["msg"].startswith(said), result["msg"]


def test_the_documented_checks_are_the_checks() -> None:
    import yaml
    from ansible_collections.mlstack.pve.plugins.modules import inventory_check as doc

    options = yaml.safe_load(doc.DOCUMENTATION)["options"]
    assert options["checks"]["choices"] == list(check.CHECKS)
    documented = set(options) - {"checks"}
    needed = {arg for needs, _ in check.CHECKS.values() for arg in needs}
    assert needed <= documented, needed - documented


def test_a_bare_zero_is_refused_with_the_entrys_own_fields() -> None:
    """Before the stack policy reads `gpus` (the first group), as every reading of it refuses it."""
    assert check.container_fields("testbed", [ct(gpus=0)]) == [
        "Container 161 on testbed: gpus: 0 is not a list: write [0] for GPU 0, or none for no GPU. Fix the"
        " inventory entry."
    ]
    assert check.container_fields("testbed", [ct(gpus=[0]), ct(162, gpus="none")]) == []


def test_the_locks_are_checked_once_per_profile_with_uv() -> None:
    calls: list[list[str]] = []

    def uv(argv: list[str]) -> tuple[int, str, str]:
        calls.append(argv)
        return (
            (1, "", "error: The lockfile at `uv.lock` needs to be updated")
            if "p/b" in argv[-1]
            else (0, "", "")
        )

    results = check.lock_results("/uv", "p", ["a", "b", "a"], uv)
    assert calls == [
        ["/uv", "lock", "--check", "--project", "p/a"],
        ["/uv", "lock", "--check", "--project", "p/b"],
    ]
    said = check.locks(results)
    assert len(said) == 1 and said[0].startswith(
        "Profile b: `uv lock --check` says its uv.lock is out of date"
    )
