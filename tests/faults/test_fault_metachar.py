"""A shell metacharacter in an inventory string reaches neither the PVE node's shell nor a container's
shell as code.

- Statically: every raw and shell task, and every shell script template, splices only integers or
  quoted values (`| int`, `| quote`); every raw task names its executable (proxmox_pct_remote does not
  quote raw: without one, `a; b` runs `b` on the PVE node).
- For real: provision.yml with a payload that would create a canary file if any shell ran it, in each
  inventory string (container fields and node settings, on the shared CT and its node): refused by the
  preflight, and no canary on the node or in the container. And the node-side module that writes
  devN/mpN refuses such a value even when called directly, past the preflight."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from faultlib import ct_sh, one_line
from playbook_runner import REPO, container

CANARY = "/tmp/mlstack-faults-pwned"


def payload(tag: str) -> str:
    """Runs `touch <canary>-<tag>` under any shell that evaluates it, whichever way it is spliced."""
    return f"x;touch {CANARY}-{tag};$(touch {CANARY}-{tag}-sub)`touch {CANARY}-{tag}-bt`"


# ---------------------------------------------------------------- static: every shell splice point

SHELL_MODULES = ("raw", "shell", "script")
SAFE_EXPR = re.compile(r"\{\{.*\|\s*(int|quote)\s*\}\}$")


def _tasks(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, list):
        for item in node:
            yield from _tasks(item)
    elif isinstance(node, dict):
        yield node
        for key in ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks", "handlers"):
            if key in node:
                yield from _tasks(node[key])


def _shell_tasks() -> list[tuple[str, dict[str, Any], str]]:
    out = []
    files = [
        *sorted((REPO / "roles").glob("*/tasks/*.yml")),
        *sorted((REPO / "roles").glob("*/handlers/*.yml")),
    ]
    files += sorted((REPO / "playbooks").glob("*.yml"))
    for path in files:
        for task in _tasks(yaml.safe_load(path.read_text()) or []):
            for key, value in task.items():
                if key.split(".")[-1] in SHELL_MODULES and isinstance(value, str | dict):
                    out.append((str(path.relative_to(REPO)), task, key))
    return out


def _expressions(text: str) -> list[str]:
    return [m.group(0) for m in re.finditer(r"\{\{.*?\}\}", text, re.S)]


SHELL_TASKS = _shell_tasks()


@pytest.mark.parametrize(
    ("path", "task", "module"), SHELL_TASKS, ids=[f"{p}:{t.get('name', '?')}" for p, t, _ in SHELL_TASKS]
)
def test_shell_tasks_splice_only_integers_and_quoted_values(
    path: str, task: dict[str, Any], module: str
) -> None:
    body = task[module] if isinstance(task[module], str) else json.dumps(task[module])
    unsafe = [e for e in _expressions(body) if not SAFE_EXPR.match(" ".join(e.split()))]
    assert unsafe == [], f"{path}: {task.get('name')}: unquoted expressions in a shell command"
    if module.endswith("raw"):
        assert (task.get("args") or {}).get("executable"), (
            f"{path}: {task.get('name')}: a raw task without args.executable runs on the PVE node's shell "
            "when the connection is proxmox_pct_remote"
        )


SHELL_TEMPLATES = sorted(
    p for p in (REPO / "roles").glob("*/templates/*.j2") if p.name.endswith((".sh.j2", ".bash.j2"))
)
# Sourced by login shells, so it is shell code too.
SHELL_TEMPLATES.append(REPO / "roles" / "ml_venv" / "templates" / "mlstack.sh.j2")
# Templates known to splice a value unquoted into a shell file (each marked xfail, strict): none.
KNOWN_UNQUOTED: dict[str, str] = {}


@pytest.mark.parametrize(
    "template",
    [
        pytest.param(
            p,
            marks=[pytest.mark.xfail(strict=True, reason=KNOWN_UNQUOTED[str(p.relative_to(REPO))])]
            if str(p.relative_to(REPO)) in KNOWN_UNQUOTED
            else [],
            id=str(p.relative_to(REPO)),
        )
        for p in sorted(set(SHELL_TEMPLATES))
    ],
)
def test_shell_templates_splice_only_integers_and_quoted_values(template: Path) -> None:
    lines = [ln for ln in template.read_text().splitlines() if not ln.lstrip().startswith("#")]
    unsafe = [e for e in _expressions("\n".join(lines)) if not SAFE_EXPR.match(" ".join(e.split()))]
    assert unsafe == [], f"{template.name}: unquoted expressions {unsafe}"


def test_no_host_key_checking_is_turned_off_anywhere() -> None:
    """SSH host keys are always checked: no StrictHostKeyChecking=no, no host_key_checking off."""
    tracked = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    bad = re.compile(
        r"StrictHostKeyChecking\s*=?\s*(no|off|accept-new)|host_key_checking\s*[=:]\s*(false|no|0)"
        r"|HOST_KEY_CHECKING\s*=\s*(false|no|0)|host_key_auto_add\s*[=:]\s*(true|yes|1)",
        re.I,
    )
    here = Path(__file__).relative_to(REPO)
    # The connection's own test passes an "off" on purpose, to prove the plugin's checks come first.
    proves_override = Path("tests/unit/plugins/connection/test_connection_pct_ssh.py")
    offenders = []
    for name in tracked:
        path = REPO / name
        if (
            Path(name) in (here, proves_override)
            or not path.is_file()
            or path.suffix in {".lock", ".whl", ".zst", ".gz"}
        ):
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        offenders += [f"{name}: {m.group(0)}" for m in bad.finditer(text)]
    assert offenders == []


# ---------------------------------------------------------------- for real, against the testbed


@pytest.fixture
def canaries(shared_ct: dict[str, Any]) -> Iterator[int]:
    vmid = int(shared_ct["vmid"])

    def clear() -> None:
        subprocess.run(f"rm -f {CANARY}*", shell=True, check=False)
        ct_sh(vmid, f"rm -f {CANARY}*")

    clear()
    yield vmid
    clear()


def assert_no_canary(vmid: int) -> None:
    on_node = sorted(str(p) for p in Path("/tmp").glob(Path(CANARY).name + "*"))
    in_ct = ct_sh(vmid, f"ls {CANARY}* 2>/dev/null").stdout.split()
    assert on_node == [] and in_ct == [], f"a payload ran: node {on_node}, container {in_ct}"


CONTAINER_FIELDS = {
    "hostname": lambda p: {"hostname": p},
    "profile": lambda p: {"profile": p},
    "model_path": lambda p: {"model_path": "/srv/" + p},
    "extras": lambda p: {"extras": [p]},
}


def test_metacharacters_in_container_fields_never_run(
    runner: Any, shared_ct: dict[str, Any], canaries: int, api: Any, testbed: Any
) -> None:
    """One container per field, each with a payload; the shared CT alongside, untouched."""
    entries = [shared_ct] + [
        container(181 + i, **make(payload(field))) for i, (field, make) in enumerate(CONTAINER_FIELDS.items())
    ]
    result = runner("provision.yml", entries, timeout=300)
    text = one_line(result.output)
    assert result.rc != 0
    for i, field in enumerate(CONTAINER_FIELDS):
        assert re.search(rf"Container {181 + i} on testbed: expected {field} ", text), f"{field}: not refused"
    assert f"Container {shared_ct['vmid']} on testbed" not in text
    assert result.changed() == 0, result.changed_tasks()
    assert_no_canary(canaries)
    existing = {int(g["vmid"]) for g in api.cluster.resources.get(type="vm")}
    assert not existing & set(range(181, 181 + len(CONTAINER_FIELDS)))


NODE_SETTINGS = {
    "mlstack_pve_node": "node name (mlstack_pve_node)",
    "mlstack_rootfs_storage": "rootfs storage (mlstack_rootfs_storage)",
    "mlstack_bridge": "bridge (mlstack_bridge)",
    "mlstack_ostemplate": "template (mlstack_ostemplate)",
}


@pytest.mark.parametrize(("setting", "named"), NODE_SETTINGS.items(), ids=list(NODE_SETTINGS))
def test_metacharacters_in_node_settings_never_run(
    runner: Any, shared_ct: dict[str, Any], canaries: int, setting: str, named: str
) -> None:
    value = payload(setting)
    if setting == "mlstack_ostemplate":
        value = "local:vztmpl/" + value
    result = runner("provision.yml", [shared_ct], timeout=300, **{setting: value})
    assert result.rc != 0
    assert f"testbed: expected {named} " in one_line(result.output), result.output[-3000:]
    assert result.changed() == 0, result.changed_tasks()
    assert_no_canary(canaries)


def test_pct_config_refuses_a_metacharacter_past_the_preflight(
    shared_ct: dict[str, Any], canaries: int, testbed: Any, tmp_path: Path
) -> None:
    """The module that runs `pct set` on the node, called directly with a hostile mp0: refused, and
    the container's config keeps its own mp0."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        yaml.safe_dump({"all": {"hosts": {"testbed": {"ansible_host": "127.0.0.1", "ansible_port": 2222}}}})
    )
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").symlink_to(
        REPO / "inventory" / "testbed" / "group_vars" / "pve_hosts.yml"
    )
    args = json.dumps(
        {"vmid": canaries, "options": {"mp0": f"/srv/{payload('pct')},mp=/models"}, "purge": False}
    )
    argv = [str(REPO / ".venv" / "bin" / "ansible"), "testbed", "-i", str(inventory)]
    argv += ["-m", "mlstack.pve.pct_config", "-a", args]
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, cwd=REPO, env=env)
    assert r.returncode != 0
    assert "refusing values with whitespace or shell metacharacters for: mp0" in r.stdout, r.stdout + r.stderr
    assert_no_canary(canaries)
    mp0 = testbed.proxmox().nodes(testbed.node).lxc(canaries).config.get()["mp0"]
    assert "pwned" not in mp0
