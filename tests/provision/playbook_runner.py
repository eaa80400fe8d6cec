"""Running the repo's playbooks against the testbed node with a per-run inventory, and reading
their outcome: shared by the provisioning and fault suites and the provisioning benchmark."""

from __future__ import annotations

import configparser
import json
import os
import re
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from mlstack_testbed import client

REPO = Path(__file__).resolve().parents[2]
# The Ansible of the interpreter running the tests: .venv's, or the second controller's (the other stack)
# under `make test-other-stack`.
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


# The provisioned container that the files which only read one share (tests/provision/conftest.py's
# default_ct): test_doctor_defaults.py and test_monitor.py.
DEFAULT_CT_VMID = 150
# What the stack policy chooses for a new container where the GPU architecture is unknown: its default.
DEFAULT_PROFILE = yaml.safe_load((REPO / "profiles" / "policy.yml").read_text())["default_profile"]
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


def token_vars(token_id: str, secret_file: Path | str) -> dict[str, str]:
    """Inventory variables that make a run use an API token instead of the root password; the secret
    reaches Ansible through a file lookup (as a vault lookup would), never on a command line."""
    return {
        "mlstack_pve_api_token_id": token_id,
        "mlstack_pve_api_token_secret": f"{{{{ lookup('ansible.builtin.file', '{secret_file}') }}}}",
        # Nothing to fall back on: the token alone must do.
        "mlstack_pve_api_password": "",
    }


def read_testbed_token(state_dir: Path | str) -> tuple[str, Path]:
    """The testbed's own token (testbed.json): its id and its secret's file. Privilege-separated, granted
    exactly the docs' role."""
    info = json.loads((Path(state_dir) / "testbed.json").read_text())
    return info["api_token_id"], Path(info["api_token_secret_file"])


def vars_of_testbed_token(state_dir: Path | str) -> dict[str, str]:
    """token_vars of the testbed's own token."""
    return token_vars(*read_testbed_token(state_dir))


def callbacks_with(*extra: str, repo: Path = REPO) -> str:
    """ANSIBLE_CALLBACKS_ENABLED for runs that add callbacks (profile_tasks, the fault suite's): the
    variable replaces the list `repo`'s ansible.cfg enables, so that list is kept, first."""
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(repo / "ansible.cfg")
    listed = cfg.get("defaults", "callbacks_enabled", fallback="")
    return ",".join([*(c.strip() for c in listed.split(",") if c.strip()), *extra])


def set_gpu_model(model: str | None) -> None:
    """What the testbed node's nvidia-smi reports: a recorded GPU model, or no driver (None). Global
    state of the shared testbed: whoever sets a model puts None back."""
    argv = [str(TESTBED_CLI), "up", "--gpu-nodes", "2"] + (["--gpu-model", model] if model else [])
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{r.stdout}\n{r.stderr}")


def make_runner(
    workdir: Path, env: dict[str, str] | None = None, repo: Path = REPO
) -> Callable[..., PlaybookRun]:
    """A runner of the repo's playbooks against the testbed, with the testbed's group_vars and the given
    containers: run(name, containers, **extra_vars). `containers` is the first node's list, or a dict
    {node name: list} for several nodes of the testbed's cluster (one inventory host per node). `limit`
    is ansible-playbook's --limit: a node's name runs the node plays only (create, configure, start); `flags`
    are more of its flags (--check --diff). `repo` is the checkout whose playbooks, roles and collection run
    (another commit's worktree, for a benchmark's before and after)."""

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
            group_vars.symlink_to(repo / "inventory" / "testbed" / "group_vars")
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
        argv = [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), str(repo / "playbooks" / playbook)]
        if limit:
            # `--limit <node>`: the node plays only (the containers added at run time are not in the limit).
            argv += ["--limit", limit]
        # ansible-playbook's own flags, e.g. ("--check", "--diff") for a plan.
        argv += list(flags)
        if extra:
            argv += ["-e", json.dumps(extra)]
        run_env = dict(os.environ, ANSIBLE_CONFIG=str(repo / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
        run_env.update(env or {})
        run_env["PATH"] = f"{VENV_BIN}:{run_env['PATH']}"
        # Bad-input tests pass vmids that are no number: those containers never exist.
        entries = [c for cts in per_node.values() if isinstance(cts, list) for c in cts]
        vmids = [int(v) for c in entries if isinstance(c, dict) and str(v := c.get("vmid", "")).isdigit()]
        before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
        inside = containers_cpu(vmids)
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env=run_env, cwd=repo, check=False
        )
        result = PlaybookRun(proc.returncode, proc.stdout + proc.stderr)
        record_run(playbook, result, time.monotonic() - t0, before, containers_cpu(vmids) - inside)
        return result

    return run


def containers_cpu(vmids: list[int]) -> float:
    """CPU its containers have used so far (tests/lanes_cpu.py), where make test's steps count it."""
    if not os.environ.get("MLSTACK_TEST_RUN_LEDGER"):
        return 0.0
    if str(REPO / "tests") not in sys.path:
        sys.path.insert(0, str(REPO / "tests"))
    from lanes_cpu import containers_seconds

    return containers_seconds(vmids)


def record_run(
    playbook: str, result: PlaybookRun, seconds: float, before: resource.struct_rusage, inside: float = 0.0
) -> None:
    """One line per playbook run in the file MLSTACK_TEST_RUN_LEDGER names (tests/lanes.py sets it per
    step): which test ran what, how long, the controller CPU it cost and the CPU inside its containers
    (none where a container was destroyed during the run), so a step's time can be told apart into its
    runs."""
    ledger = os.environ.get("MLSTACK_TEST_RUN_LEDGER")
    if not ledger:
        return
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    line = {
        "test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0],
        "playbook": playbook,
        "rc": result.rc,
        "seconds": round(seconds, 2),
        "controller_cpu": round(cpu, 2),
        "containers_cpu": round(max(inside, 0.0), 2),
        "tasks": result.output.count("\nTASK ["),
    }
    with open(ledger, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
