"""The machine under test: LXC (system or carried .debs) and the NVIDIA facts the cases are built from.

Read-only towards the host, except for unpacking carried LXC packages into a private prefix and staging the
driver's libraries out of a system library folder (so that binding them binds nothing else).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlstack_doctor.facts import libcuda, nvidia

from .. import paths
from ..lxc import hostroot

REPO = paths.REPO_DIR
# LXC's compiled-in mount point for a container's rootfs (Debian's build); a private prefix lacks it.
LXC_ROOTFS_MOUNT = Path("/usr/lib/x86_64-linux-gnu/lxc/rootfs")
NV_LIB = re.compile(r"^lib(cuda|cudadebugger|nvcuvid|nvoptix|nvidia-[A-Za-z0-9_.-]+?)\.so(\.\d+)*$")
SYSTEM_LIB_DIRS = {
    "/lib",
    "/lib64",
    "/usr/lib",
    "/usr/lib64",
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
}


class CannotRun(Exception):
    """The check cannot be made on this machine (exit 2): not root, no LXC, no NVIDIA nodes, bad arguments."""


def sh(argv: list[str], timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
    """A command's result, never an exception: a timeout gives rc 124, a missing program rc 127."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, **kw)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return subprocess.CompletedProcess(argv, 124, out, f"timed out after {timeout:.0f} s")
    except FileNotFoundError:
        return subprocess.CompletedProcess(argv, 127, "", f"{argv[0]}: not found")


# ------------------------------------------------------------------------------ LXC


# The Debian packages LXC is carried in: `apt-get download` of these on a machine with network.
LXC_DEBS = ("lxc", "liblxc1", "liblxc-common", "libapparmor1")


def ensure_lxc(debs_dir: Path, prefix: Path, force_debs: bool) -> str:
    """LXC on PATH, or unpacked from carried Debian packages into a private prefix (no network)."""
    if not force_debs and shutil.which("lxc-start") and shutil.which("lxc-attach"):
        return f"system LXC ({shutil.which('lxc-start')})"
    debs = sorted(debs_dir.glob("*.deb"))
    if not debs:
        raise CannotRun(
            f"no lxc-start on PATH and no .deb in {debs_dir}; on a machine with network: "
            f"mkdir -p {debs_dir} && cd {debs_dir} && apt-get download {' '.join(LXC_DEBS)}"
        )
    if not shutil.which("dpkg-deb"):
        raise CannotRun("dpkg-deb is needed to unpack the carried LXC packages")
    prefix.mkdir(parents=True, exist_ok=True)
    for deb in debs:
        r = sh(["dpkg-deb", "-x", str(deb), str(prefix)], timeout=120)
        if r.returncode != 0:
            raise CannotRun(f"dpkg-deb -x {deb.name}: {r.stderr.strip()}")
    share = prefix / "usr/share/lxc"
    for f in (share / "config").rglob("*"):
        if f.is_file():
            text = f.read_text(errors="replace")
            new = re.sub(r"(?<![\w/])/usr/share/lxc", str(share), text)
            if new != text:
                f.write_text(new)
    os.environ["PATH"] = f"{prefix}/usr/bin:{prefix}/usr/sbin:{os.environ.get('PATH', '/usr/bin:/bin')}"
    libdir = f"{prefix}/usr/lib/x86_64-linux-gnu"
    old = os.environ.get("LD_LIBRARY_PATH")
    os.environ["LD_LIBRARY_PATH"] = libdir + (f":{old}" if old else "")
    os.environ["MLSTACK_LXC_CONFIG_DIR"] = str(share / "config")
    LXC_ROOTFS_MOUNT.mkdir(parents=True, exist_ok=True)
    paths.LXC_PATH.mkdir(parents=True, exist_ok=True)
    r = sh(["lxc-start", "--version"])
    if r.returncode != 0:
        raise CannotRun(f"the unpacked lxc-start does not run: {(r.stderr or r.stdout).strip()}")
    return f"LXC {r.stdout.strip()} unpacked from {len(debs)} .deb into {prefix}"


# ------------------------------------------------------------------------- host facts


@dataclass
class Host:
    """What this machine offers the cases: its NVIDIA nodes, driver, libraries and interpreter."""

    nodes: list[str]
    numbers: dict[str, tuple[str, int, int]]
    proc_majors: dict[str, int]
    driver: str | None
    lib_dir: str | None
    lib_note: str
    python: str
    python_mounts: list[str]
    device_gid: int
    device_mode: str
    ct_lib_dir: str

    @property
    def gpu(self) -> bool:
        return bool(self.driver)

    @property
    def gpu_count(self) -> int:
        """The GPU device nodes (/dev/nvidiaN), each passed through to the pass case."""
        return sum(1 for n in self.nodes if re.fullmatch(r"/dev/nvidia\d+", n))


def nvidia_nodes() -> list[str]:
    """What pve_host finds: /dev/nvidia* and /dev/nvidia-caps/*, device nodes only."""
    found = []
    for p in sorted(set(glob.glob("/dev/nvidia*") + glob.glob("/dev/nvidia-caps/*"))):
        try:
            mode = os.stat(p).st_mode
        except OSError:
            continue
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            found.append(p)
    return found


def proc_majors() -> dict[str, int]:
    out, section = {}, ""
    for line in Path("/proc/devices").read_text().splitlines():
        if line.endswith(":"):
            section = line
        elif section.startswith("Character") and "nvidia" in line:
            num, name = line.split()
            out[name] = int(num)
    return out


def driver_version() -> str | None:
    try:
        return nvidia.kernel_module_version(Path(nvidia.PROC_VERSION).read_text())
    except OSError:
        return None


def find_lib_dir() -> str | None:
    """The host folder holding libcuda.so.1: ldconfig's cache, LD_LIBRARY_PATH, then the usual places."""
    dirs = [
        os.path.dirname(p) for p in libcuda.ldconfig_paths(sh(libcuda.ldconfig_argv(), timeout=30).stdout)
    ]
    dirs += [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    dirs += ["/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib64"]
    return next((d for d in dirs if os.path.exists(os.path.join(d, "libcuda.so.1"))), None)


def libcuda_locations() -> list[str]:
    """Every libcuda.so.1 in the host's linker cache, with where it really is (diagnostics)."""
    out = []
    for loc in libcuda.ldconfig_paths(sh(libcuda.ldconfig_argv(), timeout=30).stdout):
        real = os.path.realpath(loc)
        out.append(f"{loc} -> {real} (on the mount at {hostroot.mount_of(real)})")
    return out


def stage_libs(src: str, dst: Path, version: str) -> int:
    """Copy the driver's libraries (of this version) and their soname links into a folder of their own."""
    dst.mkdir(parents=True, exist_ok=True)
    n = 0
    for p in sorted(Path(src).iterdir()):
        if not NV_LIB.match(p.name):
            continue
        target = dst / p.name
        if p.is_symlink():
            link = os.readlink(p)
            if "/" not in link and NV_LIB.match(link) and not target.is_symlink():
                target.symlink_to(link)
        elif p.is_file() and p.name.endswith(f".so.{version}") and not target.exists():
            shutil.copy2(p, target)
            n += 1
    return n


def lib_dir_for_bind(explicit: str | None, version: str | None) -> tuple[str | None, str]:
    if not version:
        return None, "no NVIDIA driver loaded: no driver libraries to bind"
    src = explicit or find_lib_dir()
    if not src:
        return None, "libcuda.so.1 not found on the host (ldconfig -p, LD_LIBRARY_PATH, /usr/local/nvidia)"
    if os.path.realpath(src) in SYSTEM_LIB_DIRS or os.path.exists(os.path.join(src, "libc.so.6")):
        dst = paths.STATE_DIR / "gpucheck" / f"nvidia-lib-{version}"
        n = stage_libs(src, dst, version)
        return str(dst), f"{src} is a system library folder: {n} driver libraries staged into {dst}"
    return src, f"{src} (a folder of the driver's libraries only)"


def python_facts(python: str) -> list[str]:
    """Mount points (other than /) that the interpreter's files live on: bound at the same path."""
    code = (
        "import json,site,sys;"
        "print(json.dumps([sys.prefix,sys.base_prefix,sys.executable,*site.getsitepackages()]))"
    )
    r = sh([python, "-c", code], timeout=60)
    if r.returncode != 0:
        raise CannotRun(f"{python} does not run: {r.stderr.strip()}")
    mounts = {hostroot.mount_of(p) for p in json.loads(r.stdout) if os.path.exists(p)}
    return sorted(m for m in mounts if m != "/" and not m.startswith(("/proc", "/sys", "/dev")))


def role_default(role: str, var: str, fallback: str) -> str:
    text = (REPO / "roles" / role / "defaults" / "main.yml").read_text()
    m = re.search(rf"^{var}:\s*\"?([^\"\n#]+?)\"?\s*$", text, re.M)
    return m.group(1) if m else fallback


def host_facts(args: argparse.Namespace) -> Host:
    """The facts every case is built from; CannotRun when there is nothing to pass through."""
    nodes = nvidia_nodes()
    if not nodes:
        raise CannotRun(
            "no NVIDIA device nodes on this machine (/dev/nvidia*): nothing to pass through "
            "(on a GPU host: nvidia-smi; nvidia-modprobe -u -c=0. "
            "Without a GPU: testbed/testbed up --gpu-nodes 2)"
        )
    numbers = {}
    for p in nodes:
        st = os.stat(p)
        numbers[p] = ("b" if stat.S_ISBLK(st.st_mode) else "c", os.major(st.st_rdev), os.minor(st.st_rdev))
    version = driver_version()
    lib_dir, note = lib_dir_for_bind(args.lib_dir, version)
    return Host(
        nodes=nodes,
        numbers=numbers,
        proc_majors=proc_majors(),
        driver=version,
        lib_dir=lib_dir,
        lib_note=note,
        python=args.python,
        python_mounts=python_facts(args.python),
        device_gid=int(role_default("gpu_container", "gpu_container_device_gid", "44")),
        device_mode=role_default("gpu_container", "gpu_container_device_mode", "0666"),
        ct_lib_dir=role_default(
            "nvidia_userspace", "nvidia_userspace_ct_lib_dir", "/usr/local/lib/mlstack-nvidia"
        ),
    )
