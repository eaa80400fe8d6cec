"""The CPU each step of tests/lanes.py costs, so its report says where the machine's time went: the step's
own processes (pytest, ansible-playbook, ssh) in a cgroup of their own, and the testbed containers its
tests drive (apt, uv, the doctor), read from LXC's cgroups and counted to the running step that holds the
container's vmid. Without a writable cgroup tree (not root) nothing is counted and the report says so."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

# cgroup v1 (cpuacct.usage, nanoseconds) or v2 (cpu.stat's usage_usec).
V1 = Path("/sys/fs/cgroup/cpuacct")
V2 = Path("/sys/fs/cgroup")
OWN = "mlstack-test-lanes"
LXC_PREFIX = "lxc.payload."


def usage_seconds(group: Path) -> float:
    """CPU seconds a cgroup has used, its children included; 0 where it cannot be read."""
    try:
        if (group / "cpuacct.usage").exists():
            return int((group / "cpuacct.usage").read_text()) / 1e9
        for line in (group / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
    except (OSError, ValueError):
        pass
    return 0.0


def container_key(group: str) -> int | str:
    """A container's vmid from its cgroup's name (lxc.payload.150, lxc.payload.150-1 after a restart
    that could not remove the old one), or the name of a container that is not a vmid."""
    name = group.removeprefix(LXC_PREFIX)
    head = name.split("-", 1)[0]
    return int(head) if head.isdigit() else name


def default_root() -> Path:
    return V1 if V1.is_dir() else V2


def containers_seconds(vmids: Iterable[int], root: Path | None = None) -> float:
    """CPU seconds the containers of these vmids have used so far, over every cgroup LXC made for each
    (a playbook run's before and after: what its work inside them cost)."""
    wanted = set(vmids)
    groups = (root or default_root()).glob(LXC_PREFIX + "*")
    return sum(usage_seconds(g) for g in groups if container_key(g.name) in wanted)


class CpuLedger:
    def __init__(self, root: Path | None = None) -> None:
        self.root = root or default_root()
        self.own = self.root / OWN
        try:
            self.own.mkdir(exist_ok=True)
            self.enabled = os.access(self.own, os.W_OK)
        except OSError:
            self.enabled = False
        # Container cgroup -> its usage at the last sample; what they used before the run is nobody's.
        self.seen = {g.name: usage_seconds(g) for g in self.containers()}
        self.counted: dict[str, float] = {}  # step -> its containers' CPU seconds
        self.unclaimed = 0.0
        self.start_usage: dict[str, float] = {}
        self.closed: dict[str, float] = {}

    def containers(self) -> list[Path]:
        """LXC's container cgroups, where the ledger counts (none without a writable tree)."""
        return list(self.root.glob(LXC_PREFIX + "*")) if self.enabled else []

    def group(self, step: str) -> Path:
        return self.own / step

    def enter(self, step: str) -> Callable[[], None] | None:
        """A preexec_fn that puts the step's process (and so its children) in its own cgroup."""
        if not self.enabled:
            return None
        group = self.group(step)
        group.mkdir(exist_ok=True)
        self.start_usage[step] = usage_seconds(group)
        procs = str(group / "cgroup.procs")

        def join() -> None:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))

        return join

    def own_seconds(self, step: str) -> float:
        if step in self.closed:
            return self.closed[step]
        if step not in self.start_usage:
            return 0.0
        return usage_seconds(self.group(step)) - self.start_usage[step]

    def close(self, step: str) -> None:
        """The step's own CPU as it ends: a daemon it started (`testbed up` restarting the nodes' sshd)
        keeps running in its cgroup, serving the steps after it, and is not this step's."""
        self.closed[step] = self.own_seconds(step)

    def sample(self, holder: Callable[[int | str], str | None]) -> None:
        """Counts what each container used since the last sample to the step `holder` names for it."""
        for group in self.containers():
            now = usage_seconds(group)
            before = self.seen.get(group.name)
            self.seen[group.name] = now
            # A cgroup new since the last sample (a container made or restarted) counts from zero.
            delta = now - before if before is not None and now >= before else now
            if delta <= 0:
                continue
            step = holder(container_key(group.name))
            if step is None:
                self.unclaimed += delta
            else:
                self.counted[step] = self.counted.get(step, 0.0) + delta

    def seconds(self, step: str) -> float:
        return self.own_seconds(step) + self.counted.get(step, 0.0)

    def cleanup(self, steps: Iterable[str]) -> None:
        for step in steps:
            try:
                self.group(step).rmdir()
            except OSError:
                pass  # a process it left (a daemon it started) still lives there
