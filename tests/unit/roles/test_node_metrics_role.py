"""The node_metrics role for real (ansible-playbook on localhost, its paths moved under a temporary
folder): one read of the node's state, a rerun that changes nothing runs no other module, a file that
drifted is put back, and node_metrics_enabled false removes what it finds, once."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from localplay import run_play

PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - role: node_metrics
"""


def play(tmp_path: Path, **extra: object) -> subprocess.CompletedProcess:
    node, dist = tmp_path / "node", tmp_path / "dist"
    dist.mkdir(exist_ok=True)
    (dist / "mlstack_doctor-0.1.0-py3-none-any.whl").write_bytes(b"PK\x05\x06" + bytes(18))
    evars = {
        "_node_metrics_dist": str(node / "dist"),
        "_node_metrics_script": str(node / "mlstack-node-metrics"),
        "node_metrics_out": str(node / "mlstack.prom"),
        # A wheel of its own, never built here (uv stands aside): the checkout's build/ is left alone.
        "doctor_controller_dist_dir": str(dist),
        "doctor_controller_uv": "/bin/true",
        **extra,
    }
    return run_play(tmp_path, PLAYBOOK, evars, timeout=600)


def ran(proc: subprocess.CompletedProcess) -> list[str]:
    """The node_metrics tasks that ran (ok or changed), in order."""
    out, current = [], ""
    for line in proc.stdout.splitlines():
        m = re.match(r"^TASK \[node_metrics : (.*)\]", line)
        current = m.group(1) if m else (current if not line.startswith("TASK [") else "")
        if current and re.match(r"^(ok|changed): ", line):
            out.append(current)
    return out


def test_a_rerun_reads_once_and_a_drifted_command_is_put_back(tmp_path: Path) -> None:
    first = play(tmp_path)
    # The folder, the wheel and the command in one task (no systemd here: no units, no timer).
    assert first.returncode == 0 and "changed=1" in first.stdout, first.stdout[-3000:]
    script = tmp_path / "node" / "mlstack-node-metrics"
    assert (
        "-m mlstack_doctor.ops.node_metrics" in script.read_text()
        and oct(script.stat().st_mode)[-3:] == "755"
    )
    wheel = "mlstack_doctor-0.1.0-py3-none-any.whl"
    assert (tmp_path / "node" / "dist" / wheel).read_bytes() == (tmp_path / "dist" / wheel).read_bytes()

    again = play(tmp_path)
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout[-3000:]
    # No systemd here: the state read, and the reason no timer runs it; no other module.
    assert [t for t in ran(again) if "arg spec" not in t and "Gather" not in t] == [
        "Read the node's metrics state",
        "Say why no timer runs it",
    ], ran(again)

    script.write_text("#!/bin/sh\nedited by hand\n")
    repaired = play(tmp_path)
    assert "changed=1" in repaired.stdout
    assert "Install the node's metrics command, its units and the doctor wheel" in ran(repaired)
    assert "-m mlstack_doctor.ops.node_metrics" in script.read_text()


def test_disabled_removes_what_it_finds_then_changes_nothing(tmp_path: Path) -> None:
    play(tmp_path)
    (tmp_path / "node" / "mlstack.prom").write_text("mlstack_node_container_metrics_ok 1\n")
    removed = play(tmp_path, node_metrics_enabled=False)
    assert removed.returncode == 0 and "changed=1" in removed.stdout, removed.stdout[-3000:]
    assert not (tmp_path / "node" / "mlstack-node-metrics").exists()
    assert not (tmp_path / "node" / "mlstack.prom").exists()
    again = play(tmp_path, node_metrics_enabled=False)
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout[-3000:]
    assert "Remove the node's metrics units, command and file" not in ran(again)
