"""Real LXC containers named by vmid in the default lxcpath (/var/lib/lxc/<vmid>), driven by lxc-* tools.

Every function here blocks (subprocesses, file work); the API backend calls them from a worker thread.
Errors are raised as RealCtError with text fit for a PVE task log.
"""

import os
import re
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

from . import lxcconf, paths
from .proc import run

IDMAP = lxcconf.IdMap(paths.IDMAP_BASE, paths.IDMAP_SIZE)
BRIDGES = {paths.BRIDGE: paths.HOST_BRIDGE, paths.HOST_BRIDGE: paths.HOST_BRIDGE}


class RealCtError(RuntimeError):
    pass


def ct_dir(vmid: int) -> Path:
    return paths.LXC_PATH / str(vmid)


def rootfs_dir(vmid: int) -> Path:
    return ct_dir(vmid) / "rootfs"


def passthrough_dir(vmid: int) -> Path:
    return ct_dir(vmid) / "passthrough"


def exists(vmid: int) -> bool:
    return (ct_dir(vmid) / "config").is_file()


def state(vmid: int) -> tuple[str, int | None]:
    """('running' | 'stopped' | 'missing', pid)."""
    if not exists(vmid):
        return "missing", None
    r = run(["lxc-info", "-n", str(vmid), "-s", "-p", "-H"], timeout=15)
    if not r.ok:
        return "stopped", None
    lines = r.out.split()
    status = "running" if lines and lines[0] == "RUNNING" else "stopped"
    pid = int(lines[1]) if status == "running" and len(lines) > 1 and lines[1].isdigit() else None
    return status, pid


def apparmor_enabled() -> bool:
    return Path("/sys/module/apparmor/parameters/enabled").is_file() and \
        Path("/sys/module/apparmor/parameters/enabled").read_text().strip() == "Y"


# --------------------------------------------------------------------------- create


def create_from_template(vmid: int, tarball: Path, unprivileged: bool) -> None:
    """Unpack an OS template into /var/lib/lxc/<vmid>/rootfs, shifted into the CT's ids when unprivileged
    (PVE unpacks through lxc-usernsexec the same way)."""
    if ct_dir(vmid).exists():
        raise RealCtError(f"real container directory {ct_dir(vmid)} already exists")
    if not tarball.is_file():
        raise RealCtError(f"volume file '{tarball}' does not exist")
    root = rootfs_dir(vmid)
    root.mkdir(parents=True)
    ct_dir(vmid).chmod(0o750 if not unprivileged else 0o755)
    tar = ["tar", "-C", str(root), "--numeric-owner", "--xattrs", "--xattrs-include=user.*", "-xpf", str(tarball),
           "--zstd", "--exclude=./dev/*"]
    if unprivileged:
        os.chown(root, IDMAP.host_base, IDMAP.host_base)
        m = f"{IDMAP.host_base}:{IDMAP.size}"
        argv = ["lxc-usernsexec", "-m", f"u:0:{m}", "-m", f"g:0:{m}", "--", *tar]
    else:
        argv = tar
    r = run(argv, timeout=600)
    if not r.ok:
        shutil.rmtree(ct_dir(vmid), ignore_errors=True)
        raise RealCtError(f"unable to unpack template: {r.detail()}")
    # A placeholder config so the container exists for lxc-* tools until the first full write.
    (ct_dir(vmid) / "config").write_text(f"lxc.uts.name = CT{vmid}\nlxc.rootfs.path = dir:{root}\n")


def write_config(vmid: int, config: Mapping[str, object]) -> lxcconf.CtSpec:
    """Write /var/lib/lxc/<vmid>/config from the PVE config; validates devN and bind mounts."""
    spec = lxcconf.from_pve_config(vmid, config, f"dir:{rootfs_dir(vmid)}", passthrough_dir(vmid), BRIDGES, IDMAP,
                                   apparmor_enabled())
    text = lxcconf.render(spec, lxcconf.CgroupLayout.detect())
    tmp = ct_dir(vmid) / "config.new"
    tmp.write_text(text)
    tmp.replace(ct_dir(vmid) / "config")
    return spec


# ------------------------------------------------------------------------ guest setup


def _ct_write(vmid: int, rel: str, content: str, idmap: lxcconf.IdMap | None, mode: int = 0o644) -> None:
    """Write a file in the CT's rootfs as its root (never following a link out of the rootfs)."""
    root = rootfs_dir(vmid)
    target = root / rel.lstrip("/")
    real_parent = target.parent.resolve()
    if root.resolve() not in (real_parent, *real_parent.parents):
        raise RealCtError(f"refusing to write {rel}: it leads out of the container's root")
    if target.is_symlink():
        target.unlink()
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w") as f:
        f.write(content)
    os.chmod(target, mode)
    owner = idmap.host_id(0) if idmap else 0
    os.chown(target, owner, owner)


def setup_guest(vmid: int, spec: lxcconf.CtSpec, config: Mapping[str, object]) -> None:
    """PVE's Setup/Debian.pm pre-start part, in short: hostname, /etc/hosts, /etc/network/interfaces."""
    root = rootfs_dir(vmid)
    if not (root / "etc").is_dir():
        return
    host = spec.hostname
    _ct_write(vmid, "etc/hostname", host + "\n", spec.idmap)
    hosts = (root / "etc/hosts").read_text() if (root / "etc/hosts").is_file() else ""
    kept = [ln for ln in hosts.splitlines() if "# --- mlstack-testbed ---" not in ln and not ln.startswith("127.0.1.1")]
    if not any(ln.startswith("127.0.0.1") for ln in kept):
        kept.insert(0, "127.0.0.1\tlocalhost")
    kept.append(f"127.0.1.1\t{host}\t# --- mlstack-testbed ---")
    _ct_write(vmid, "etc/hosts", "\n".join(kept) + "\n", spec.idmap)
    if (root / "etc/network").is_dir():
        text = ["auto lo", "iface lo inet loopback", ""]
        for key in sorted((k for k in config if lxcconf.NET_KEY.match(k)), key=lambda k: int(k[3:])):
            props = lxcconf.split_props(str(config[key]), "name")
            name = props.get("name", "eth0")
            ip = props.get("ip", "")
            if ip == "dhcp":
                text += [f"auto {name}", f"iface {name} inet dhcp", ""]
            elif re.fullmatch(r"[\d.]+/\d+", ip):
                text += [f"auto {name}", f"iface {name} inet static", f"\taddress {ip}"]
                if props.get("gw"):
                    text.append(f"\tgateway {props['gw']}")
                text.append("")
            else:
                text += [f"auto {name}", f"iface {name} inet manual", ""]
        _ct_write(vmid, "etc/network/interfaces", "\n".join(text), spec.idmap)


# ------------------------------------------------------------------------ lifecycle


def start(vmid: int, config: Mapping[str, object], timeout: float = 30) -> None:
    spec = write_config(vmid, config)
    lxcconf.prepare_passthrough(passthrough_dir(vmid), spec.devs, spec.idmap)
    setup_guest(vmid, spec, config)
    log = paths.LOG_DIR / f"lxc-{vmid}.log"
    r = run(["lxc-start", "-n", str(vmid), "-l", "ERROR", "-o", str(log)], timeout=timeout)
    if not r.ok:
        raise RealCtError(f"lxc-start failed (exit code {r.rc}): {r.detail()}")
    r = run(["lxc-wait", "-n", str(vmid), "-s", "RUNNING", "-t", str(int(timeout))], timeout=timeout + 5)
    if not r.ok or state(vmid)[0] != "running":
        raise RealCtError(f"container did not reach RUNNING: {r.detail()}")


def stop(vmid: int, timeout: int | None = None, kill: bool = True) -> None:
    """lxc-stop: a clean shutdown within timeout seconds (then kill unless kill is False), or kill at once."""
    if state(vmid)[0] != "running":
        return
    argv = ["lxc-stop", "-n", str(vmid)]
    if timeout is None:
        argv.append("-k")
    else:
        argv += ["-t", str(timeout)]
        if not kill:
            argv.append("--nokill")
    r = run(argv, timeout=(timeout or 0) + 30)
    if state(vmid)[0] == "running":
        raise RealCtError("container did not stop" + (f": {r.detail()}" if r.detail() else ""))


def destroy(vmid: int) -> None:
    if not ct_dir(vmid).exists():
        return
    stop(vmid)
    r = run(["lxc-destroy", "-n", str(vmid)], timeout=120)
    if ct_dir(vmid).exists():
        # lxc-destroy refuses a directory without a valid config; the rootfs is ours.
        time.sleep(0.2)
        shutil.rmtree(ct_dir(vmid), ignore_errors=True)
    if ct_dir(vmid).exists():
        raise RealCtError(f"lxc-destroy failed: {r.detail()}")


def wait_stopped(vmid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if state(vmid)[0] != "running":
            return True
        time.sleep(0.5)
    return False
