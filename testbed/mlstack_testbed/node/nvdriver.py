"""The NVIDIA driver the testbed's nodes report, and a stand-in NVIDIA runfile for a driver version.

`testbed up --driver-version V` makes every node look like one with NVIDIA kernel module V loaded, as the
project reads a node: `/proc/driver/nvidia/version` (pve_host; read back with the doctor's own parser,
mlstack_doctor.facts.nvidia) and nvidia-smi's `driver_version` (nvsmi.py). paths.DRIVER_PROC_DIR holds
`nvidia/version` and is bound over /proc/driver in each node's sshd mount namespace only: the machine
and the containers (each with its own /proc) never see it, and a later `up` rewrites the file under a
running sshd. `up` without the option: no driver, as with
--gpu-model. No kernel module is loaded: the GPU nodes still answer ENXIO.

`runfile(V, folder)` writes `NVIDIA-Linux-x86_64-V.run`, a self-contained shell script standing in for
NVIDIA's installer: with the flags the nvidia_userspace role passes it removes the previous driver's
libraries and installs libcuda.so.V and libnvidia-ml.so.V (real shared objects built here with gcc, with
NVIDIA's sonames, every entry point answering "no device") and their soname links, then runs ldconfig,
so `ldconfig -p` and readlink resolve libcuda.so.1 to libcuda.so.V as after the real one.

    python -m mlstack_testbed.node.nvdriver runfile 560.35.03 files/nvidia
"""

import argparse
import base64
import re
import shutil
import sys
import tempfile
from pathlib import Path

from mlstack_doctor.facts import nvidia

from .. import paths
from ..proc import run

VERSION_RE = re.compile(r"[0-9]+\.[0-9]+(\.[0-9]+)?")
# How an open kernel module words its first line (as on the H200 of results/h200-2026-11-30-passthrough).
PROC_VERSION_TEXT = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build  (mlstack-testbed)  \n"
    "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1) \n"
)


def _checked(version: str) -> str:
    """An NVIDIA driver version such as 560.35.03 (it lands in file names and a shell script)."""
    if not VERSION_RE.fullmatch(version):
        raise ValueError(f"{version!r} is not a driver version such as 560.35.03")
    return version


def version_arg(text: str) -> str:
    """argparse type: an NVIDIA driver version, refused in its own words."""
    try:
        return _checked(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _version_file() -> Path:
    return paths.DRIVER_PROC_DIR / "nvidia" / "version"


def current() -> str | None:
    """The kernel module version the nodes report, or None (no driver)."""
    try:
        return nvidia.kernel_module_version(_version_file().read_text())
    except OSError:
        return None


def _shown_in(pid: int) -> bool:
    """Whether the mount namespace of pid has a mount on /proc/driver (ours: nothing else puts one there)."""
    try:
        mounts = Path(f"/proc/{pid}/mountinfo").read_text()
    except OSError:
        return False
    return any(line.split()[4] == "/proc/driver" for line in mounts.splitlines() if len(line.split()) > 4)


def show_to(pids: list[int | None]) -> list[int]:
    """Bind DRIVER_PROC_DIR over /proc/driver in the mount namespace of each pid (the nodes' sshd) that
    lacks it: a node's sshd started before this, or after a restart, gets it without restarting. Their
    namespaces are private (unshare --propagation private), so nothing reaches the machine's /proc."""
    paths.DRIVER_PROC_DIR.mkdir(parents=True, exist_ok=True)
    bound = []
    for pid in pids:
        if pid is None or _shown_in(pid):
            continue
        argv = ["nsenter", f"--target={pid}", "--mount", "--", "mount", "--bind", str(paths.DRIVER_PROC_DIR)]
        r = run([*argv, "/proc/driver"], timeout=30)
        if not r.ok:
            raise RuntimeError(f"binding the driver state over /proc/driver for sshd pid {pid}: {r.detail()}")
        bound.append(pid)
    return bound


def select(version: str | None, sshd_pids: list[int | None]) -> bool:
    """Make the nodes report kernel module `version`, or no driver (None); True when it changed."""
    if version is not None:
        _checked(version)
    show_to(sshd_pids)
    before = current()
    f = _version_file()
    if version is None:
        # As a node without the module: no /proc/driver/nvidia at all.
        shutil.rmtree(f.parent, ignore_errors=True)
        return before is not None
    f.parent.mkdir(parents=True, exist_ok=True)
    tmp = f.with_suffix(".tmp")
    tmp.write_text(PROC_VERSION_TEXT.format(version=version))
    tmp.chmod(0o444)
    tmp.replace(f)
    return before != version


# ------------------------------------------------------------------------------ runfile

# Every entry point answers as a library with no GPU behind it would; no libc call, so the object links
# with -nostdlib and loads under any glibc (the controller's may be newer than the container's).
_LIBCUDA_C = """
/* libcuda of the mlstack testbed's stand-in NVIDIA runfile: no GPU behind it. */
#define CUDA_ERROR_NO_DEVICE 100
int cuInit(unsigned int flags) { (void)flags; return CUDA_ERROR_NO_DEVICE; }
int cuDriverGetVersion(int *version) { (void)version; return CUDA_ERROR_NO_DEVICE; }
"""
_LIBNVML_C = """
/* libnvidia-ml of the mlstack testbed's stand-in NVIDIA runfile: no driver behind it. */
#define NVML_ERROR_DRIVER_NOT_LOADED 9
int nvmlInit_v2(void) { return NVML_ERROR_DRIVER_NOT_LOADED; }
int nvmlInit(void) { return NVML_ERROR_DRIVER_NOT_LOADED; }
int nvmlShutdown(void) { return 0; }
"""
# (soname, C source): installed as <soname without .1>.<version> with the soname and the bare .so links.
LIBRARIES = (("libcuda.so.1", _LIBCUDA_C), ("libnvidia-ml.so.1", _LIBNVML_C))

_SCRIPT_HEAD = """#!/bin/sh
# NVIDIA-Linux-x86_64-{version}.run: the mlstack testbed's stand-in for NVIDIA's driver installer.
# Installs driver userspace {version} (no kernel module) as the real one does: the previous driver's
# libraries removed, the new ones with their soname links in $libdir, ldconfig run.
set -eu
version={version}
libdir=/usr/lib/x86_64-linux-gnu
kernel_module=1
extract_only=0
for arg in "$@"; do
    case "$arg" in
        -s|--silent|-q|--no-questions|--ui=none|--no-x-check|--accept-license) ;;
        --no-kernel-module) kernel_module=0 ;;
        -x|--extract-only) extract_only=1 ;;
        *) echo "ERROR: Unrecognized option: '$arg'; see '$0 --help'." >&2; exit 1 ;;
    esac
done
payload() {{
    mkdir -p "$1"
"""
_SCRIPT_TAIL = """}}
if [ "$extract_only" = 1 ]; then
    payload "./NVIDIA-Linux-x86_64-$version"
    echo "Extracted to ./NVIDIA-Linux-x86_64-$version"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "ERROR: nvidia-installer must be run as root" >&2; exit 1
fi
if [ "$kernel_module" = 1 ]; then
    echo "ERROR: the testbed's runfile carries no kernel module: run it with --no-kernel-module" >&2; exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
payload "$work"
for soname in {sonames}; do
    base=${{soname%.1}}
    rm -f "$libdir/$base" "$libdir/$base".*
    install -m 0755 "$work/$base.$version" "$libdir/$base.$version"
    ln -s "$base.$version" "$libdir/$soname"
    ln -s "$soname" "$libdir/$base"
done
ldconfig
echo "Installation of the NVIDIA Accelerated Graphics Driver for Linux-x86_64 (version: $version)" \
    "is now complete."
"""


def _compile(soname: str, source: str, out: Path, cc: str) -> None:
    src = out.with_suffix(".c")
    src.write_text(source)
    argv = [cc, "-shared", "-fPIC", "-O2", "-nostdlib", f"-Wl,-soname,{soname}", "-o", str(out), str(src)]
    r = run(argv, timeout=120)
    if not r.ok:
        raise RuntimeError(f"{' '.join(argv)}: {r.detail()}")


def runfile(version: str, folder: Path, cc: str = "gcc") -> Path:
    """Write folder/NVIDIA-Linux-x86_64-<version>.run (0755) and return its path."""
    _checked(version)
    parts = [_SCRIPT_HEAD.format(version=version)]
    with tempfile.TemporaryDirectory(prefix="mlstack-runfile-") as tmp:
        for soname, source in LIBRARIES:
            name = f"{soname.removesuffix('.1')}.{version}"
            _compile(soname, source, Path(tmp) / name, cc)
            encoded = base64.encodebytes((Path(tmp) / name).read_bytes()).decode()
            parts.append(f"    base64 -d > \"$1/{name}\" <<'MLSTACK_PAYLOAD'\n{encoded}MLSTACK_PAYLOAD\n")
    parts.append(_SCRIPT_TAIL.format(sonames=" ".join(s for s, _ in LIBRARIES)))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"NVIDIA-Linux-x86_64-{version}.run"
    tmp_path = path.with_suffix(".tmp")
    tmp_path.write_text("".join(parts))
    tmp_path.chmod(0o755)
    tmp_path.replace(path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mlstack_testbed.node.nvdriver", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    rf = sub.add_parser("runfile", help="write NVIDIA-Linux-x86_64-VERSION.run into FOLDER")
    rf.add_argument("version", type=version_arg)
    rf.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    print(runfile(args.version, args.folder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
