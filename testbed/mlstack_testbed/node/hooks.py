"""Guest hookscripts, run as PVE runs them (PVE::GuestHelpers): `<script> <vmid> <phase>` on the
container's node, as root, its output into the task's log.

The script is a volume `<storage>:snippets/<file>` of the storage `local` (its snippets/ folder). At
`pct set --hookscript` and at each start it must be one, exist and be executable (check_hookscript's
words). It runs in the node's own mount namespace (its sshd's): there /usr/sbin holds the node's `pct`,
`nvidia-smi`, `nvidia-modprobe` and `pvesm`, and /proc/driver the node's driver, as on a PVE node. A
non-zero exit in pre-start refuses the start (`hookscript error for <vmid> on pre-start: command '...'
failed: exit code N`); in the other phases it is a warning in the log, as on PVE.
"""

import re
from pathlib import Path

from .. import paths
from ..proc import run
from . import nodes, sshd

VOLID = re.compile(r"^([a-z][a-z0-9_.-]*):snippets/([^/\s]+)$")
# Phases whose failure stops what runs them (PVE: pre-start only, with $stop_on_error).
STOPS = ("pre-start",)
TIMEOUT_S = 300


class HookError(Exception):
    """The hookscript refused, or is not one; the message is PVE's."""


def script_path(volid: str) -> Path:
    """The file of a hookscript volume, checked as PVE's check_hookscript does."""
    m = VOLID.match(volid)
    if not m:
        raise HookError(f"'{volid}' is not in the snippets directory")
    if m.group(1) != paths.STORAGE:
        raise HookError(f"storage '{m.group(1)}' does not exist")
    path = paths.LOCAL_STORAGE / "snippets" / m.group(2)
    if not path.is_file():
        raise HookError(f"script '{volid}' does not exist")
    if not path.stat().st_mode & 0o111:
        raise HookError(f"script '{volid}' is not executable")
    return path


def run_phase(volid: str, vmid: int, node: str, phase: str, tasklog: list[str]) -> None:
    """Run the hookscript for `phase` on `node`; its output lines go to `tasklog`. HookError where PVE
    stops (pre-start), a line in the log for the other phases."""
    try:
        _run(volid, vmid, node, phase, tasklog)
    except HookError as e:
        if phase in STOPS:
            raise
        tasklog.append(str(e))


def _run(volid: str, vmid: int, node: str, phase: str, tasklog: list[str]) -> None:
    path = script_path(volid)
    owner = next((n for n in nodes.cluster() if n.name == node), None)
    pid = sshd.running(owner) if owner else None
    if pid is None:
        raise HookError(f"hookscript error for {vmid} on {phase}: node '{node}' is not running (no sshd)")
    argv = ["nsenter", "-t", str(pid), "-m", "--", str(path), str(vmid), phase]
    r = run(argv, timeout=TIMEOUT_S, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"})
    tasklog.extend(line for line in (r.out + r.err).splitlines() if line.strip())
    if r.ok:
        return
    said = f"timed out after {TIMEOUT_S}s" if r.rc == 124 else f"exit code {r.rc}"
    msg = f"hookscript error for {vmid} on {phase}: command '{path} {vmid} {phase}' failed: {said}"
    raise HookError(msg)
