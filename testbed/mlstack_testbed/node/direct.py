"""pct's direct backend: the pct verbs on real LXC containers where no testbed API runs.

For a machine with no network and no testbed (a lent GPU machine): no fakepve, aiohttp, proxmoxer or
TLS, standard library only. Each container's PVE config is a file, `<state>/direct/<vmid>.conf`, in
PVE's format (`key: value`), as /etc/pve/lxc/<vmid>.conf is on a node. The PVE-to-LXC work is the
testbed's own: devN values checked as PVE checks them at config time (lxcconf.parse_dev and
check_device, PVE's wording), and at start realct.start -> lxcconf (cgroup allows, passthrough nodes
mknod'ed with gid/mode, bind entries, autodev) exactly as the API backend does.

A change to a running container is applied as PVE applies it: what PVE hotplugs at once (memory, swap
and cores set on its cgroup too), the rest kept in the file's [pve:pending] section until its next
start (`pct pending`, `pct config --current`). `pct resize` records the new size: the root filesystems
here are folders, with no image to grow.

Root filesystems: `pct create <vmid> hostroot[:overlay|:bind]` uses the machine's own root
(hostroot.py); any other ostemplate is an OS template tarball (a path, or `local:vztmpl/<file>` in
the testbed's storage) unpacked as the API backend does.
"""

import re
import sys
from pathlib import Path
from typing import NoReturn
from urllib.parse import quote

from .. import paths
from ..lxc import hostroot, lxcconf, realct

HOSTROOT = "hostroot"
# PVE::Tools::encode_text keeps printable ASCII but ':'.
_TEXT_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if c != 0x3A)
# What `pct create`/`set` store as given; others are refused as PVE's schema refuses them.
KNOWN = re.compile(
    r"^(arch|cores|cpulimit|description|features|hostname|memory|nameserver|onboot|ostype|protection|"
    r"rootfs|searchdomain|swap|tags|timezone|unprivileged|cmode|console|tty|startup|"
    r"(dev|mp|net)\d+)$"
)


PENDING = "[pve:pending]"
# What PVE applies to a running container at once (pve-container, vmconfig_hotplug_pending): its
# LXC_FASTPLUG_OPTIONS, memory and swap (cgroup), and network changes. Everything else waits in the
# pending section for the next start; so does a new devN/mpN, which this testbed does not plug into a
# running container.
HOTPLUG = re.compile(
    r"^(description|onboot|startup|protection|hostname|hookscript|cores|tags|memory|swap|cpulimit|cpuunits"
    r"|net\d+)$"
)
HOT_DELETE = re.compile(
    r"^(description|onboot|startup|protection|hostname|hookscript|cores|tags|swap|cpulimit|cpuunits"
    r"|net\d+|unused\d+)$"
)
# Set on the running container's cgroup when they change.
LIMITS = ("memory", "swap", "cores")
_SIZE = re.compile(r"^(\+)?(\d+(?:\.\d+)?)([KMGT]?)$")
_UNIT = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


class DirectError(Exception):
    """A pct error: str() is PVE's message."""


def die(msg: str) -> NoReturn:
    print(msg.rstrip("\n"), file=sys.stderr)
    sys.exit(255)


def conf_file(vmid: int) -> Path:
    return paths.DIRECT_DIR / f"{vmid}.conf"


def _sections(vmid: int) -> tuple[dict[str, str], dict[str, str]]:
    """The config file's current values and its [pve:pending] section, as PVE keeps both in one file."""
    f = conf_file(vmid)
    if not f.is_file():
        raise DirectError(f"Configuration file 'nodes/{paths.NODE}/lxc/{vmid}.conf' does not exist")
    sections: list[dict[str, str]] = [{}, {}]
    desc: list[list[str]] = [[], []]
    part = 0
    for line in f.read_text().splitlines():
        if line.startswith("["):
            if line.strip() != PENDING:
                break  # a snapshot section
            part = 1
        elif line.startswith("#"):
            desc[part].append(line[1:])
        elif ": " in line:
            k, v = line.split(": ", 1)
            sections[part][k] = v
    for i in (0, 1):
        if desc[i]:
            sections[i]["description"] = "\n".join(desc[i])
    return sections[0], sections[1]


def read(vmid: int) -> dict[str, str]:
    """The config in effect (`pct config --current`)."""
    return _sections(vmid)[0]


def read_pending(vmid: int) -> tuple[dict[str, str], list[str]]:
    """Pending values and pending deletes (what the next start applies)."""
    pending = _sections(vmid)[1]
    deletes = [k for k in re.split(r"[,;\s]+", pending.pop("delete", "")) if k]
    return pending, deletes


def merged(vmid: int) -> dict[str, str]:
    """The config with the pending changes applied (`pct config`)."""
    cfg = read(vmid)
    pending, deletes = read_pending(vmid)
    cfg.update(pending)
    for k in deletes:
        cfg.pop(k, None)
    return cfg


def _lines(cfg: dict[str, str]) -> list[str]:
    lines = [f"#{d}" for d in cfg.get("description", "").splitlines()]
    return lines + [f"{k}: {cfg[k]}" for k in sorted(cfg) if k != "description"]


def write(
    vmid: int, cfg: dict[str, str], pending: dict[str, str] | None = None, deletes: list[str] | None = None
) -> None:
    paths.DIRECT_DIR.mkdir(parents=True, exist_ok=True)
    lines = _lines(cfg)
    if pending or deletes:
        section = dict(pending or {})
        if deletes:
            section["delete"] = ",".join(deletes)
        lines += ["", PENDING, *_lines(section)]
    tmp = conf_file(vmid).with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(conf_file(vmid))


def check_values(values: dict[str, str]) -> None:
    """PVE's config-time checks for what passthrough depends on."""
    for key, value in values.items():
        if not KNOWN.match(key):
            raise DirectError(f"400 Parameter verification failed.\n{key}: property is not defined in schema")
        try:
            if lxcconf.DEV_KEY.match(key):
                lxcconf.check_device(lxcconf.parse_dev(key, value).path)
            elif lxcconf.MP_KEY.match(key):
                lxcconf.parse_mp(key, value)
        except lxcconf.PveFormatError as e:
            raise DirectError(f"400 Parameter verification failed.\n{key}: invalid format - {e}") from None
        except lxcconf.PveConfigError as e:
            raise DirectError(str(e)) from None


def _hostroot_mode(cfg: dict[str, str]) -> str | None:
    rootfs = cfg.get("rootfs", "")
    if not rootfs.startswith(HOSTROOT):
        return None
    return rootfs.split(",")[0].partition(":")[2] or "overlay"


def _template(ostemplate: str) -> Path:
    sid, _, volname = ostemplate.partition(":")
    if ostemplate.startswith("/"):
        return Path(ostemplate)
    if sid == paths.STORAGE and volname.startswith("vztmpl/"):
        return paths.TEMPLATE_CACHE / volname.split("/", 1)[1]
    raise DirectError(f"unable to parse volume ID '{ostemplate}'")


# ------------------------------------------------------------------------------- verbs


def create(vmid: int, ostemplate: str, opts: dict[str, str]) -> None:
    if conf_file(vmid).exists() or realct.ct_dir(vmid).exists():
        raise DirectError(f"unable to create CT {vmid} - CT {vmid} already exists on node '{paths.NODE}'")
    start_after = opts.pop("start", "0") in ("1", "yes", "true")
    opts.pop("storage", None)
    opts.pop("password", None)
    check_values(opts)
    cfg = dict(opts)
    unpriv = cfg.get("unprivileged", "0") in ("1", "yes", "true")
    if ostemplate == HOSTROOT or ostemplate.startswith(HOSTROOT + ":"):
        mode = ostemplate.partition(":")[2] or "overlay"
        if mode not in hostroot.MODES:
            raise DirectError(f"unable to create CT {vmid} - unknown host-root mode '{mode}'")
        cfg["rootfs"] = f"{HOSTROOT}:{mode}"
        realct.ct_dir(vmid).mkdir(parents=True)
        realct.ct_dir(vmid).chmod(0o755 if unpriv else 0o750)
        hostroot.marker(vmid).write_text(mode + "\n")
        (realct.ct_dir(vmid) / "config").write_text(
            f"# Generated by {realct.ORIGIN}: a placeholder until the first start\n"
            f"lxc.uts.name = CT{vmid}\nlxc.rootfs.path = dir:{realct.rootfs_dir(vmid)}\n"
        )
    else:
        try:
            realct.create_from_template(vmid, _template(ostemplate), unpriv)
        except realct.RealCtError as e:
            raise DirectError(f"unable to create CT {vmid} - {e}") from None
        cfg.setdefault("rootfs", f"{paths.STORAGE}:{vmid}/vm-{vmid}-disk-0.raw,size=4G")
    cfg.setdefault("hostname", f"CT{vmid}")
    cfg.setdefault("arch", "amd64")
    write(vmid, cfg)
    if start_after:
        start(vmid)


def set_config(vmid: int, opts: dict[str, str]) -> None:
    """PVE's update_pct_config: a stopped container takes every change; a running one what PVE
    hotplugs, its cgroup limits set at once, the rest kept pending."""
    cfg = read(vmid)
    pending, pending_deletes = read_pending(vmid)
    deletes = [k for k in re.split(r"[,;\s]+", opts.pop("delete", "")) if k]
    opts.pop("digest", None)
    check_values(opts)
    running = realct.state(vmid)[0] == "running"
    before = dict(cfg)
    for k, v in opts.items():
        pending.pop(k, None)
        pending_deletes = [d for d in pending_deletes if d != k]
        if not running or HOTPLUG.match(k):
            cfg[k] = v
        elif cfg.get(k) != v:
            pending[k] = v
    for k in deletes:
        pending.pop(k, None)
        if not running or HOT_DELETE.match(k):
            cfg.pop(k, None)
        elif k in cfg and k not in pending_deletes:
            pending_deletes.append(k)
    write(vmid, cfg, pending, pending_deletes)
    if running and any(cfg.get(k) != before.get(k) for k in LIMITS) and not _hostroot_mode(cfg):
        try:
            realct.apply_limits(vmid, cfg)
        except (realct.RealCtError, lxcconf.PveConfigError) as e:
            raise DirectError(f"unable to hotplug {', '.join(LIMITS)}: {e}") from None


def apply_pending(vmid: int) -> dict[str, str]:
    """What a start does first: the pending changes into the config."""
    cfg = merged(vmid)
    write(vmid, cfg)
    return cfg


def _bytes(size: str) -> float:
    m = _SIZE.match(size)
    if not m:
        raise DirectError("invalid size string")
    return float(m.group(2)) * _UNIT[m.group(3)]


def resize(vmid: int, disk: str, size: str) -> None:
    """`pct resize`: the size recorded in the volume's entry. The testbed's root filesystems are folders
    on the machine's own filesystem, with no image to grow; PVE refuses to shrink."""
    cfg = read(vmid)
    value = cfg.get(disk)
    if value is None:
        raise DirectError("format error\nvolume: property is missing and it is not optional")
    found = re.search(r"(?:^|,)size=([^,]+)", value)
    have = _bytes(found.group(1)) if found else 4 * 1024**3
    want = have + _bytes(size[1:]) if size.startswith("+") else _bytes(size)
    if want < have:
        raise DirectError("unable to shrink disk size")
    if want == have:
        raise DirectError("disk is already at specified size")
    text = f"{want / 1024**3:g}G"
    cfg[disk] = re.sub(r"size=[^,]+", f"size={text}", value) if found else f"{value},size={text}"
    pending, deletes = read_pending(vmid)
    write(vmid, cfg, pending, deletes)


def format_pending(items: list[dict[str, object]]) -> list[str]:
    """PVE's `pct pending` lines (GuestHelpers format_pending): `cur k: v`, then `new k: v` for a pending
    value, or `del k: v` for a pending delete; a description with control characters and ':' escaped."""
    lines = []
    for item in sorted(items, key=lambda i: str(i["key"])):
        key, value, new = str(item["key"]), item.get("value"), item.get("pending")
        if key == "digest":
            continue
        if key == "description":
            value = None if value is None else quote(str(value), safe=_TEXT_SAFE)
            new = None if new is None else quote(str(new), safe=_TEXT_SAFE)
        if value is not None:
            if item.get("delete"):
                lines.append(f"del {key}: {value}")
            else:
                lines.append(f"cur {key}: {value}")
                if new is not None:
                    lines.append(f"new {key}: {new}")
        elif new is not None:
            lines.append(f"new {key}: {new}")
    return lines


def pending_items(vmid: int) -> list[dict[str, object]]:
    """The API's /pending answer: each key with its value, its pending value or a delete flag."""
    cfg = read(vmid)
    pending, deletes = read_pending(vmid)
    items: list[dict[str, object]] = []
    for key in sorted(set(cfg) | set(pending)):
        item: dict[str, object] = {"key": key}
        if key in cfg:
            item["value"] = cfg[key]
        if key in pending:
            item["pending"] = pending[key]
        if key in deletes:
            item["delete"] = 1
        items.append(item)
    return items


def start(vmid: int) -> None:
    if realct.state(vmid)[0] == "running":
        raise DirectError(f"CT {vmid} already running")
    cfg = apply_pending(vmid)
    mode = _hostroot_mode(cfg)
    try:
        if mode:
            rootfs = hostroot.mount(vmid, mode)
            hostroot.prepare_targets(vmid, lxcconf.mounts_of(cfg))
            realct.start(vmid, cfg, rootfs_path=rootfs, extra=hostroot.INIT_LINES, guest_setup=False)
        else:
            realct.start(vmid, cfg)
    except (realct.RealCtError, hostroot.HostRootError, lxcconf.PveConfigError, OSError) as e:
        print(str(e), file=sys.stderr)
        raise DirectError(f"startup for container '{vmid}' failed") from None


def stop(vmid: int, timeout: int | None = None, force: bool = True) -> None:
    read(vmid)
    try:
        realct.stop(vmid, timeout, force)
    except realct.RealCtError as e:
        raise DirectError(str(e)) from None


def destroy(vmid: int, force: bool = False) -> None:
    cfg = read(vmid)
    if realct.state(vmid)[0] == "running":
        if not force:
            raise DirectError(f"CT {vmid} is running - destroy failed")
        stop(vmid)
    try:
        if _hostroot_mode(cfg):
            # Never lxc-destroy a host-root container: its config names the host's root.
            hostroot.remove(vmid)
        else:
            realct.destroy(vmid)
    except (realct.RealCtError, hostroot.HostRootError) as e:
        raise DirectError(str(e)) from None
    conf_file(vmid).unlink(missing_ok=True)


def status(vmid: int) -> str:
    read(vmid)
    return "running" if realct.state(vmid)[0] == "running" else "stopped"


def vmids() -> list[int]:
    if not paths.DIRECT_DIR.is_dir():
        return []
    return sorted(int(p.stem) for p in paths.DIRECT_DIR.glob("*.conf") if p.stem.isdigit())


def main(verb: str, vmid: int | None, rest: list[str], parse_opts) -> int:  # type: ignore[no-untyped-def]
    """pct's verbs on this backend; errors print PVE's message and exit 255."""
    try:
        if verb == "list":
            print(f"{'VMID':<10} {'Status':<10} {'Lock':<10} Name")
            for v in vmids():
                print(f"{v:<10} {status(v):<10} {'':<10} {read(v).get('hostname', '')}")
            return 0
        assert vmid is not None
        if verb == "create":
            if not rest or rest[0].startswith("-"):
                raise DirectError("400 not enough arguments")
            create(vmid, rest[0], parse_opts(rest[1:]))
            return 0
        if verb == "resize":
            if len(rest) < 2:
                raise DirectError("400 not enough arguments")
            resize(vmid, rest[0], rest[1])
            return 0
        opts = parse_opts(rest)
        if verb == "config":
            cfg = read(vmid) if opts.get("current") in ("1", "yes", "true") else merged(vmid)
            desc = cfg.pop("description", None)
            for line in (desc or "").splitlines():
                print(f"#{line}")
            for k in sorted(cfg):
                print(f"{k}: {cfg[k]}")
        elif verb == "pending":
            for line in format_pending(pending_items(vmid)):
                print(line)
        elif verb == "set":
            if not opts:
                raise DirectError("400 no options specified")
            set_config(vmid, opts)
        elif verb == "start":
            start(vmid)
        elif verb == "stop":
            stop(vmid)
        elif verb == "shutdown":
            stop(vmid, int(opts.get("timeout", 60)), opts.get("forceStop") in ("1", "yes", "true"))
        elif verb == "reboot":
            stop(vmid, int(opts.get("timeout", 60)), True)
            start(vmid)
        elif verb == "destroy":
            destroy(vmid, opts.get("force") in ("1", "yes", "true"))
        elif verb == "status":
            print(f"status: {status(vmid)}")
        else:
            raise DirectError(f"unknown command 'pct {verb}'")
    except DirectError as e:
        die(str(e))
    return 0
