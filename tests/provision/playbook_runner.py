"""Running the repo's playbooks against the testbed node with a per-run inventory, and reading
their outcome: shared by the provisioning and fault suites and the provisioning benchmark."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from mlstack_testbed import client

REPO = Path(__file__).resolve().parents[2]
# The Ansible of the interpreter running the tests: .venv's (ansible-core 2.19), or the 2.21 controller's
# under `make test-core221`.
VENV_BIN = Path(sys.executable).parent


@dataclass
class PlaybookRun:
    rc: int
    output: str

    def recap(self) -> dict[str, dict[str, int]]:
        """PLAY RECAP counters per host."""
        out: dict[str, dict[str, int]] = {}
        for host, counters in re.findall(r"^(\S+)\s+:\s+(ok=.*)$", self.output, re.M):
            out[host] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", counters)}
        return out

    def changed(self) -> int:
        return sum(c.get("changed", 0) for c in self.recap().values())

    def changed_tasks(self) -> list[str]:
        """Names of the tasks that reported a change, for assertion messages."""
        tasks, current = [], ""
        for line in self.output.splitlines():
            if line.startswith("TASK ["):
                current = line.strip("* ")
            elif line.startswith("changed:"):
                tasks.append(current)
        return tasks


# What the stack policy chooses for a new container where the GPU architecture is unknown.
DEFAULT_PROFILE = "torch211-triton37-fla06"
TESTBED_CLI = REPO / "testbed" / "testbed"


def container(vmid: int, **fields: Any) -> dict[str, Any]:
    """An inventory entry; without `profile` the stack policy chooses (the default for new containers)."""
    entry = {
        "vmid": vmid,
        "hostname": f"t-{vmid}",
        "cores": 1,
        "memory_mb": 2048,
        "disk_gb": 16,
        "gpus": "all",
    }
    entry.update(fields)
    return entry


def set_gpu_model(model: str | None) -> None:
    """What the testbed node's nvidia-smi reports: a recorded GPU model, or no driver (None). Global
    state of the shared testbed: whoever sets a model puts None back."""
    argv = [str(TESTBED_CLI), "up", "--gpu-nodes", "2"] + (["--gpu-model", model] if model else [])
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{r.stdout}\n{r.stderr}")


def make_runner(workdir: Path, env: dict[str, str] | None = None) -> Callable[..., PlaybookRun]:
    """A runner of the repo's playbooks against the testbed, with the testbed's group_vars and the given
    containers: run(name, containers, **extra_vars). `containers` is the first node's list, or a dict
    {node name: list} for several nodes of the testbed's cluster (one inventory host per node). `limit`
    is ansible-playbook's --limit: a node's name runs the node plays only (create, configure, start); `flags`
    are more of its flags (--check --diff)."""

    def run(
        playbook: str,
        containers: list[dict[str, Any]] | dict[str, list[dict[str, Any]]],
        timeout: int = 1800,
        limit: str | None = None,
        flags: tuple[str, ...] = (),
        **extra: Any,
    ) -> PlaybookRun:
        inventory = workdir / "inventory"
        inventory.mkdir(exist_ok=True)
        group_vars = inventory / "group_vars"
        if not group_vars.exists():
            group_vars.symlink_to(REPO / "inventory" / "testbed" / "group_vars")
        per_node = containers if isinstance(containers, dict) else {"testbed": containers}
        nodes = {n["name"]: n for n in client.load().nodes}
        hosts = {
            name: {
                "ansible_host": nodes[name]["ssh_host"],
                "ansible_port": nodes[name]["ssh_port"],
                "mlstack_containers": cts,
            }
            for name, cts in per_node.items()
        }
        (inventory / "hosts.yml").write_text(
            yaml.safe_dump({"all": {"children": {"pve_hosts": {"hosts": hosts}}}})
        )
        argv = [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), str(REPO / "playbooks" / playbook)]
        if limit:
            # `--limit <node>`: the node plays only (the containers added at run time are not in the limit).
            argv += ["--limit", limit]
        # ansible-playbook's own flags, e.g. ("--check", "--diff") for a plan.
        argv += list(flags)
        if extra:
            argv += ["-e", json.dumps(extra)]
        run_env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
        run_env.update(env or {})
        run_env["PATH"] = f"{VENV_BIN}:{run_env['PATH']}"
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env=run_env, cwd=REPO, check=False
        )
        return PlaybookRun(proc.returncode, proc.stdout + proc.stderr)

    return run
