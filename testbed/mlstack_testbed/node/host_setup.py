"""What the machine needs for the testbed, installed and configured idempotently.

Debian packages, subuid/subgid ranges for unprivileged containers, and the lxcbr0 bridge through
lxc-net (started directly: PID 1 need not be systemd). Each step checks first and changes nothing
when the machine is already right.
"""

import os
from pathlib import Path

from .. import paths
from ..proc import run, say

PACKAGES = (
    "lxc",
    "debootstrap",
    "uidmap",
    "openssh-server",
    "dnsmasq-base",
    "iptables",
    "zstd",
    "ca-certificates",
    # mkfs.ext4 for the testbed's disk (node/disk.py)
    "e2fsprogs",
    # A C compiler, libc's headers and Python.h: the stand-in NVIDIA driver's libraries and runfile are
    # built with gcc (node/nvdriver.py), and the doctor run on this machine checks Triton's toolchain.
    "gcc",
    "libc6-dev",
    "python3-dev",
)
# What `make test`'s suites need beyond the testbed (`testbed packages --tests`): promtool checks the alert
# rules and the doctor's metrics files. Not for `make testbed` or `make provision`.
TEST_PACKAGES = ("prometheus",)
LXC_NET = "/usr/libexec/lxc/lxc-net"
LXC_NET_DEFAULTS = Path("/etc/default/lxc-net")
LXC_NET_FLAG = Path("/run/lxc/network_up")  # lxc-net's "already running" marker
SUBID_LINE = f"root:{paths.IDMAP_BASE}:{paths.IDMAP_SIZE}"


def debian_version() -> str:
    p = Path("/etc/debian_version")
    return p.read_text().strip() if p.is_file() else "unknown"


def missing_packages(packages: tuple[str, ...] = PACKAGES) -> list[str]:
    r = run(["dpkg-query", "-W", "-f", "${Package} ${db:Status-Abbrev}\n", *packages], timeout=30)
    installed = {ln.split()[0] for ln in r.out.splitlines() if len(ln.split()) > 1 and ln.split()[1] == "ii"}
    return [p for p in packages if p not in installed]


def ensure_packages(packages: tuple[str, ...] = PACKAGES) -> list[str]:
    missing = missing_packages(packages)
    if not missing:
        return []
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    say(f"apt-get install {' '.join(missing)} (Debian {debian_version()}); this takes a little while")
    r = run(["apt-get", "update", "-qq"], timeout=600, env=env)
    if not r.ok:
        raise RuntimeError(f"apt-get update failed: {r.detail()}")
    r = run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], timeout=900, env=env)
    if not r.ok:
        raise RuntimeError(f"apt-get install failed: {r.detail()}")
    return missing


def ensure_subids() -> list[str]:
    """root:100000:65536 in /etc/subuid and /etc/subgid (what PVE ships)."""
    changed = []
    for f in (Path("/etc/subuid"), Path("/etc/subgid")):
        lines = f.read_text().splitlines() if f.is_file() else []
        if SUBID_LINE not in lines:
            f.write_text("\n".join([*lines, SUBID_LINE]) + "\n")
            changed.append(str(f))
    return changed


def bridge_up() -> bool:
    r = run(["ip", "-4", "-o", "addr", "show", "dev", paths.HOST_BRIDGE], timeout=10)
    pidfile = Path("/run/lxc/dnsmasq.pid")
    dnsmasq = pidfile.is_file() and Path(f"/proc/{pidfile.read_text().strip()}").exists()
    return r.ok and "inet " in r.out and dnsmasq


def ensure_bridge() -> bool:
    """lxcbr0 with DHCP and NAT through lxc-net; returns True if this call started it."""
    if bridge_up():
        return False
    text = LXC_NET_DEFAULTS.read_text() if LXC_NET_DEFAULTS.is_file() else ""
    if 'USE_LXC_BRIDGE="true"' not in text:
        lines = [ln for ln in text.splitlines() if not ln.startswith("USE_LXC_BRIDGE=")]
        LXC_NET_DEFAULTS.write_text("\n".join([*lines, 'USE_LXC_BRIDGE="true"']) + "\n")
    if LXC_NET_FLAG.is_file():
        # lxc-net's own flag outlived its dnsmasq (a reboot without tmpfs /run, a killed process):
        # "start" would refuse with "already running", so clear the stale state first.
        say(f"{paths.HOST_BRIDGE}: lxc-net state is stale (flag set, address or dnsmasq gone); resetting")
        run([LXC_NET, "stop", "force"], timeout=60)
        LXC_NET_FLAG.unlink(missing_ok=True)
    say(f"starting the {paths.HOST_BRIDGE} bridge ({LXC_NET} start)")
    r = run([LXC_NET, "start"], timeout=60)
    if not r.ok or not bridge_up():
        raise RuntimeError(f"lxc-net start failed: {r.detail()}")
    paths.LXC_NET_MARKER.write_text("started by mlstack-testbed\n")
    return True


def stop_bridge() -> bool:
    """Stop lxc-net only if the testbed started it."""
    if not paths.LXC_NET_MARKER.is_file():
        return False
    run([LXC_NET, "stop"], timeout=60)
    paths.LXC_NET_MARKER.unlink()
    return True


def install_known_host(line: str) -> bool:
    """A node's pinned host key ([127.0.0.1]:2222 ...) in /etc/ssh/ssh_known_hosts (read by OpenSSH and
    paramiko): the one line for that name."""
    host = line.split()[0]
    f = paths.SYSTEM_KNOWN_HOSTS
    lines = f.read_text().splitlines() if f.is_file() else []
    kept = [ln for ln in lines if ln.split()[:1] != [host]]
    if len(kept) == len(lines) - 1 and line in lines:
        return False
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text("\n".join([*kept, line]) + "\n")
    return True


def remove_known_host(host: str) -> None:
    f = paths.SYSTEM_KNOWN_HOSTS
    if f.is_file():
        lines = f.read_text().splitlines()
        kept = [ln for ln in lines if ln.split()[:1] != [host]]
        if kept != lines:
            f.write_text("\n".join(kept) + ("\n" if kept else ""))
