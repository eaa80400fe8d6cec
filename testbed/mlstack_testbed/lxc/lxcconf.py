"""PVE container config -> real LXC config: the one place where devN and mpN become lxc.* keys.

This module is self-contained (stdlib only, no testbed paths) so it can be reused where there is no
PVE: e.g. on a GPU machine with the machine's own root as rootfs (`rootfs_path="dir:/"`, no network).

What PVE does (pve-container, read from its source, not copied):
- devN `[path=]/dev/x[,uid=N][,gid=N][,mode=0NNN][,deny-write=1]`: the path must start with /dev/ and
  have no /./ or /../ ("... is not a valid device path"); at config and start time it must exist
  ("Device /dev/x does not exist") and be a block or character device ("/dev/x is not a device").
  The config gets `lxc.cgroup2.devices.allow = <c|b> MAJ:MIN rw` (`r` plus a `w` deny for
  deny-write), majors/minors read from the host node. Before start, PVE mknods a copy of the node in
  /var/lib/lxc/<vmid>/passthrough/<path> with mode (default 0660) and uid/gid mapped into the
  container's id range, and its autodev hook bind-mounts that node onto /dev/<...> in the container.
  Here the bind mount is an `lxc.mount.entry ... bind,create=file`, which LXC applies after autodev.
- mpN `/host/dir,mp=/ct/path[,ro=1]` (a bind mount point): the host directory must exist at start
  ("directory '/host/dir' does not exist"); it is bind-mounted at mp, read-only with ro=1.
"""

import os
import re
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

DEV_KEY = re.compile(r"^dev(\d+)$")
MP_KEY = re.compile(r"^mp(\d+)$")
NET_KEY = re.compile(r"^net(\d+)$")
MIB = 1024 * 1024
# PVE's swap for a config that states none (pct's schema default).
DEFAULT_SWAP_MIB = 512


class PveConfigError(ValueError):
    """A config value PVE refuses; str() is PVE's wording."""


class PveFormatError(PveConfigError):
    """A value PVE's schema format check refuses (the API answers 400, per parameter)."""


# ------------------------------------------------------------------ property strings


def split_props(value: str, default_key: str) -> dict[str, str]:
    """`a,k=v,...` -> {default_key: a, k: v}; PVE's property-string format."""
    out: dict[str, str] = {}
    for part in str(value).split(","):
        if not part:
            continue
        if "=" in part:
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip()
        else:
            out[default_key] = part.strip()
    return out


def _bool(text: str | None) -> bool:
    return str(text).lower() in ("1", "yes", "on", "true")


@dataclass(frozen=True)
class DevSpec:
    key: str
    path: str
    uid: int = 0
    gid: int = 0
    mode: int = 0o660
    deny_write: bool = False


@dataclass(frozen=True)
class MountSpec:
    key: str
    source: str
    target: str
    ro: bool = False


def parse_dev(key: str, value: str) -> DevSpec:
    props = split_props(value, "path")
    path = props.get("path")
    if not path:
        raise PveConfigError(f"Path is not defined for passthrough device {key}")
    if re.search(r"/\.\.?(?:/|$)", path) or not path.startswith("/dev/"):
        raise PveFormatError(f"{path} is not a valid device path")
    mode = props.get("mode")
    if mode is not None and not re.fullmatch(r"0[0-7]{3}", mode):
        raise PveConfigError(f"invalid format - mode: value does not match the regex pattern ({mode})")
    return DevSpec(
        key=key,
        path=path,
        uid=int(props.get("uid", 0)),
        gid=int(props.get("gid", 0)),
        mode=int(mode, 8) if mode else 0o660,
        deny_write=_bool(props.get("deny-write")),
    )


def check_device(path: str) -> os.stat_result:
    """The host node of a devN path, or PVE's error (LXC/Tools.pm get_device_mode_and_rdev)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise PveConfigError(f"Device {path} does not exist") from None
    except OSError:
        raise PveConfigError(f"Error accessing device {path}") from None
    if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
        raise PveConfigError(f"{path} is not a device")
    return st


def parse_mp(key: str, value: str) -> MountSpec | None:
    """A bind mount point, or None for a storage volume (which the testbed does not back)."""
    props = split_props(value, "volume")
    volume = props.get("volume", "")
    if not volume.startswith("/"):
        return None
    target = props.get("mp")
    if not target or not target.startswith("/"):
        raise PveConfigError(f"{key}: missing or invalid mount point path 'mp'")
    return MountSpec(key=key, source=volume, target=target, ro=_bool(props.get("ro")))


def check_bind_source(mount: MountSpec) -> None:
    if not os.path.isdir(mount.source):
        raise PveConfigError(f"directory '{mount.source}' does not exist")


def devices_of(config: Mapping[str, object]) -> list[DevSpec]:
    keys = sorted((k for k in config if DEV_KEY.match(k)), key=lambda k: int(k[3:]))
    return [parse_dev(k, str(config[k])) for k in keys]


def mounts_of(config: Mapping[str, object]) -> list[MountSpec]:
    keys = sorted((k for k in config if MP_KEY.match(k)), key=lambda k: int(k[2:]))
    out = []
    for k in keys:
        m = parse_mp(k, str(config[k]))
        if m is not None:
            out.append(m)
    return out


# -------------------------------------------------------------------------- id maps


@dataclass(frozen=True)
class IdMap:
    """One u and one g range, as PVE's default `lxc.idmap = u 0 100000 65536`."""

    host_base: int = 100000
    size: int = 65536

    def host_id(self, ct_id: int) -> int:
        if not 0 <= ct_id < self.size:
            raise PveConfigError(f"id {ct_id} is outside the container's id map")
        return self.host_base + ct_id

    def lines(self) -> list[str]:
        return [
            f"lxc.idmap = u 0 {self.host_base} {self.size}",
            f"lxc.idmap = g 0 {self.host_base} {self.size}",
        ]


# -------------------------------------------------------------------------- cgroups


@dataclass(frozen=True)
class CgroupLayout:
    """Which lxc.cgroup* keys this host takes: PVE 9 hosts are pure cgroup2; some hosts are hybrid."""

    devices_v1: bool
    memory_key: str | None  # full lxc key for the memory limit, or None
    swap_key: str | None  # cgroup2: swap alone; v1: memory + swap (memsw), where swap is accounted
    cpuset_key: str | None
    memory_high_key: str | None = None  # cgroup2's soft limit, which PVE sets beside the hard one

    @classmethod
    def detect(cls, root: str = "/sys/fs/cgroup") -> "CgroupLayout":
        unified = Path(root) / "cgroup.controllers"
        if unified.exists():
            ctl = unified.read_text().split()
            memory = "memory" in ctl
            swap = memory and next(Path(root).glob("*/memory.swap.max"), None) is not None
            return cls(
                devices_v1=False,
                memory_key="lxc.cgroup2.memory.max" if memory else None,
                swap_key="lxc.cgroup2.memory.swap.max" if swap else None,
                cpuset_key="lxc.cgroup2.cpuset.cpus" if "cpuset" in ctl else None,
                memory_high_key="lxc.cgroup2.memory.high" if memory else None,
            )
        mem_v1 = (Path(root) / "memory").is_dir()
        memsw = (Path(root) / "memory" / "memory.memsw.limit_in_bytes").exists()
        return cls(
            devices_v1=(Path(root) / "devices").is_dir(),
            memory_key="lxc.cgroup.memory.limit_in_bytes" if mem_v1 else None,
            swap_key="lxc.cgroup.memory.memsw.limit_in_bytes" if memsw else None,
            cpuset_key="lxc.cgroup.cpuset.cpus" if (Path(root) / "cpuset").is_dir() else None,
        )

    def cgroup_file(self, key: str) -> str:
        """The controller file of an lxc.cgroup* key (what lxc-cgroup takes): memory.max, cpuset.cpus."""
        return key.split(".", 2)[2]

    def device_keys(self) -> list[str]:
        """cgroup2 always (PVE's key); the v1 key too where the devices controller is v1."""
        return ["lxc.cgroup.devices", "lxc.cgroup2.devices"] if self.devices_v1 else ["lxc.cgroup2.devices"]


# ------------------------------------------------------------------- devN, mpN lines


def passthrough_node(passthrough_dir: Path, dev: DevSpec) -> Path:
    return passthrough_dir / dev.path.lstrip("/")


def device_lines(devs: Iterable[DevSpec], passthrough_dir: Path, layout: CgroupLayout) -> list[str]:
    """The lxc.* lines for devN entries; reads each host node (raises PveConfigError as PVE)."""
    lines: list[str] = []
    for dev in devs:
        st = check_device(dev.path)
        kind = "b" if stat.S_ISBLK(st.st_mode) else "c"
        numbers = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
        perms = "r" if dev.deny_write else "rw"
        lines.append(f"# {dev.key}: {dev.path}")
        for key in layout.device_keys():
            lines.append(f"{key}.allow = {kind} {numbers} {perms}")
            if dev.deny_write:
                lines.append(f"{key}.deny = {kind} {numbers} w")
        src = passthrough_node(passthrough_dir, dev)
        lines.append(f"lxc.mount.entry = {src} {dev.path.lstrip('/')} none bind,create=file 0 0")
    return lines


def mount_lines(mounts: Iterable[MountSpec]) -> list[str]:
    lines = []
    for m in mounts:
        opts = "rbind,create=dir" + (",ro" if m.ro else "")
        lines.append(f"# {m.key}: {m.source} -> {m.target}")
        lines.append(f"lxc.mount.entry = {m.source} {m.target.lstrip('/')} none {opts} 0 0")
    return lines


def prepare_passthrough(passthrough_dir: Path, devs: Iterable[DevSpec], idmap: IdMap | None) -> list[Path]:
    """PVE's pre-start step: fresh copies of the host nodes with the CT's owner and mode."""
    made = []
    if passthrough_dir.exists():
        for p in sorted(passthrough_dir.rglob("*"), reverse=True):
            if p.is_dir() and not p.is_symlink():
                p.rmdir()
            else:
                p.unlink()
    passthrough_dir.mkdir(parents=True, exist_ok=True)
    passthrough_dir.chmod(0o755)
    for dev in devs:
        st = check_device(dev.path)
        node = passthrough_node(passthrough_dir, dev)
        node.parent.mkdir(parents=True, exist_ok=True)
        os.mknod(node, stat.S_IFMT(st.st_mode) | dev.mode, st.st_rdev)
        os.chmod(node, dev.mode)  # mknod is subject to the umask
        uid = idmap.host_id(dev.uid) if idmap else dev.uid
        gid = idmap.host_id(dev.gid) if idmap else dev.gid
        os.chown(node, uid, gid)
        made.append(node)
    return made


# ------------------------------------------------------------------------ the config


@dataclass
class NetSpec:
    name: str
    link: str
    hwaddr: str | None = None
    mtu: int | None = None


@dataclass
class CtSpec:
    """What a real LXC container needs; built from a PVE config by from_pve_config."""

    name: str
    hostname: str
    rootfs_path: str  # LXC syntax: dir:/var/lib/lxc/900/rootfs, or dir:/ for the machine's own root
    arch: str = "amd64"
    idmap: IdMap | None = None
    memory_mib: int | None = None
    swap_mib: int | None = None
    cores: int | None = None
    nets: list[NetSpec] = field(default_factory=list)
    devs: list[DevSpec] = field(default_factory=list)
    mounts: list[MountSpec] = field(default_factory=list)
    nesting: bool = False
    apparmor: bool = False
    passthrough_dir: Path = Path("/nonexistent")
    extra: list[str] = field(default_factory=list)


def from_pve_config(
    vmid: int,
    config: Mapping[str, object],
    rootfs_path: str,
    passthrough_dir: Path,
    bridges: Mapping[str, str],
    idmap: IdMap,
    apparmor: bool,
) -> CtSpec:
    """A CtSpec from a PVE container config (the API's /config view)."""
    nets = []
    for key in sorted((k for k in config if NET_KEY.match(k)), key=lambda k: int(k[3:])):
        props = split_props(str(config[key]), "name")
        bridge = props.get("bridge", "")
        if bridge not in bridges:
            raise PveConfigError(f"bridge '{bridge}' does not exist")
        nets.append(
            NetSpec(
                name=props.get("name", "eth" + key[3:]),
                link=bridges[bridge],
                hwaddr=props.get("hwaddr"),
                mtu=int(props["mtu"]) if "mtu" in props else None,
            )
        )
    features = split_props(str(config.get("features", "")), "_")
    cores = config.get("cores")
    memory = config.get("memory")
    swap = config.get("swap", DEFAULT_SWAP_MIB)
    return CtSpec(
        name=str(vmid),
        hostname=str(config.get("hostname") or f"CT{vmid}"),
        rootfs_path=rootfs_path,
        arch=str(config.get("arch") or "amd64"),
        idmap=idmap if _bool(str(config.get("unprivileged", 0))) else None,
        memory_mib=int(str(memory)) if memory else None,
        swap_mib=int(str(swap)) if str(swap).strip().isdigit() else None,
        cores=int(str(cores)) if cores else None,
        nets=nets,
        devs=devices_of(config),
        mounts=mounts_of(config),
        nesting=_bool(features.get("nesting")),
        apparmor=apparmor,
        passthrough_dir=passthrough_dir,
    )


def memory_high(memory_mib: int) -> int:
    """PVE's soft limit beside the hard one (calculate_memory_constraints): 128 MiB below it from 16 GiB
    up, else 1016/1024 of it."""
    if memory_mib >= 16 * 1024:
        return (memory_mib - 128) * MIB
    return memory_mib * 1024 * 1016


def cgroup_limits(spec: CtSpec, layout: CgroupLayout, ncpus: int | None = None) -> list[tuple[str, str]]:
    """(lxc key, value) of the container's memory, swap and CPU limits, as PVE sets them at start and on
    a running container (LXC/CGroup.pm change_memory_limit; pvestatd's cpuset for cores)."""
    out: list[tuple[str, str]] = []
    if spec.memory_mib and layout.memory_key:
        out.append((layout.memory_key, str(spec.memory_mib * MIB)))
        if layout.memory_high_key:
            out.append((layout.memory_high_key, str(memory_high(spec.memory_mib))))
        if spec.swap_mib is not None and layout.swap_key:
            # cgroup2 limits swap alone; v1's memsw is memory and swap together.
            swap = spec.swap_mib if layout.memory_high_key else spec.memory_mib + spec.swap_mib
            out.append((layout.swap_key, str(swap * MIB)))
    if spec.cores and layout.cpuset_key:
        n = min(spec.cores, ncpus or os.cpu_count() or 1)
        out.append((layout.cpuset_key, "0" if n == 1 else f"0-{n - 1}"))
    return out


def render(
    spec: CtSpec,
    layout: CgroupLayout,
    lxc_config_dir: str = "/usr/share/lxc/config",
    ncpus: int | None = None,
    origin: str = "mlstack-testbed",
) -> str:
    """The LXC config file text (validates devN nodes and bind sources as PVE's start does)."""
    lines = [
        f"# Generated by {origin} from the PVE config of CT {spec.name}; edits are overwritten.",
        f"lxc.include = {lxc_config_dir}/common.conf",
    ]
    if spec.idmap:
        lines.append(f"lxc.include = {lxc_config_dir}/userns.conf")
    if spec.nesting:
        lines.append(f"lxc.include = {lxc_config_dir}/nesting.conf")
    lines += [
        f"lxc.arch = {spec.arch}",
        f"lxc.uts.name = {spec.hostname}",
        f"lxc.rootfs.path = {spec.rootfs_path}",
        "lxc.autodev = 1",
        "lxc.tty.max = 2",
        "lxc.environment = TERM=linux",
        "lxc.monitor.unshare = 1",
    ]
    if spec.apparmor:
        lines += ["lxc.apparmor.profile = generated", "lxc.apparmor.allow_nesting = 1"]
    else:
        lines.append("lxc.apparmor.profile = unconfined")
    if spec.idmap:
        lines += spec.idmap.lines()
        lines.append("lxc.mount.auto = sys:mixed")
    lines += [f"{key} = {value}" for key, value in cgroup_limits(spec, layout, ncpus)]
    if not spec.nets:
        lines.append("lxc.net.0.type = empty")
    for i, net in enumerate(spec.nets):
        lines += [
            f"lxc.net.{i}.type = veth",
            f"lxc.net.{i}.link = {net.link}",
            f"lxc.net.{i}.flags = up",
            f"lxc.net.{i}.name = {net.name}",
            f"lxc.net.{i}.veth.pair = veth{spec.name}i{i}",
        ]
        if net.hwaddr:
            lines.append(f"lxc.net.{i}.hwaddr = {net.hwaddr}")
        if net.mtu:
            lines.append(f"lxc.net.{i}.mtu = {net.mtu}")
    lines += device_lines(spec.devs, spec.passthrough_dir, layout)
    for m in spec.mounts:
        check_bind_source(m)
    lines += mount_lines(spec.mounts)
    lines += spec.extra
    return "\n".join(lines) + "\n"
