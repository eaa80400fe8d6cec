"""Running a small play on this machine through the real ansible-playbook, with this checkout's roles and
collection (mlstack.pve) and no ansible.cfg of the checkout: how the plugin and role unit tests prove
what a play sees (argument specs, module_utils packed with a module, action plugins, changed/ok)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_play(
    tmp_path: Path,
    playbook: str,
    evars: dict[str, Any],
    *flags: str,
    inventory: str = "localhost,",
    env: dict[str, str] | None = None,
    timeout: int = 300,
) -> subprocess.CompletedProcess[str]:
    """ansible-playbook of `playbook` (YAML text) in tmp_path; the test's interpreter runs the modules."""
    (tmp_path / "play.yml").write_text(playbook)
    (tmp_path / "none.cfg").write_text("[defaults]\n")
    run_env = dict(
        os.environ,
        ANSIBLE_ROLES_PATH=str(ROOT / "roles"),
        ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".venv" / "collections"),
        ANSIBLE_CONFIG=str(tmp_path / "none.cfg"),
        ANSIBLE_NOCOLOR="1",
        **(env or {}),
    )
    argv = [
        str(Path(sys.executable).parent / "ansible-playbook"),
        *("-i", inventory, str(tmp_path / "play.yml")),
        *("-e", json.dumps({"ansible_python_interpreter": sys.executable, **evars})),
        *flags,
    ]
    return subprocess.run(argv, capture_output=True, text=True, env=run_env, timeout=timeout, check=False)


def run_module(module: str, args: dict[str, Any], timeout: int = 120) -> dict[str, Any]:
    """`ansible localhost -m module -a args` with the checkout's ansible.cfg: the task's result as a play
    sees it (argument spec applied, module_utils packed with the module, or the action on the controller)."""
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
        ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
    )
    argv = [str(Path(sys.executable).parent / "ansible"), "localhost", "-c", "local"]
    argv += ["-m", module, "-a", json.dumps(args)]
    proc = subprocess.run(
        argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout, check=False
    )
    try:
        return dict(json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"])
    except (ValueError, KeyError, IndexError) as e:
        raise AssertionError(
            f"{module}: no result ({e}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        ) from e
