"""libcuda.so.1 as the loader, Triton and the doctor find it, and what is wrong with where it is.

The loader (torch, Triton's dlopen) takes LD_LIBRARY_PATH first, then the ldconfig cache. Triton's link
step (triton/backends/nvidia/driver.py libcuda_dirs, 3.x) takes TRITON_LIBCUDA_PATH, the whole value as
ONE folder, INSTEAD of asking `ldconfig -p` when it is set, and links `-L<folder> -l:libcuda.so.1`: the
linker then finds libcuda.so.1 only there or in its own default folders.
Fixes name only folders the doctor saw holding libcuda.so.1, never the setting that is the cause.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import NamedTuple

from mlstack_doctor import runner
from mlstack_doctor.diagnosis import fix_for
from mlstack_doctor.facts import libcuda as facts

# The linker's default library folders (gcc -print-search-dirs, Debian and RHEL-like, x86-64 and arm64).
LINKER_DIRS = (
    "/lib",
    "/usr/lib",
    "/lib64",
    "/usr/lib64",
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
)
# Where driver packages and container runtimes put libcuda.so.1 (searched only to name a fix).
LIB_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/nvidia/lib64",
    "/usr/local/lib/mlstack-nvidia",
    "/usr/lib/wsl/lib",
)


def _holding(dirs: list[str]) -> list[str]:
    return [d for d in dirs if d and os.path.exists(os.path.join(d, "libcuda.so.1"))]


class Problem(NamedTuple):
    code: str
    summary: str
    fix: str
    fatal: bool = True  # False: a warn (wrong, but the job still runs)


@dataclass
class LibCuda:
    """libcuda.so.1 as the loader, Triton and the doctor find it."""

    ldconfig: list[str]  # `ldconfig -p` hits
    ldconfig_rc: int
    ld_library_path: list[str]  # LD_LIBRARY_PATH folders holding it, in order
    loaded: str | None  # what dlopen("libcuda.so.1") gets: LD_LIBRARY_PATH first, then the cache
    triton_libcuda_path: str | None
    triton_dirs_with: list[str] = field(default_factory=list)
    triton_dirs_without: list[str] = field(default_factory=list)
    searched: list[str] = field(default_factory=list)  # only when neither the loader nor ldconfig has it
    found_in: list[str] = field(default_factory=list)

    @property
    def version(self) -> str | None:
        return facts.file_version(self.loaded) if self.loaded else None

    @property
    def ldconfig_version(self) -> str | None:
        return facts.file_version(self.ldconfig[0]) if self.ldconfig else None


def find(nvml_lib: str | None) -> LibCuda:
    """Where libcuda.so.1 is for the loader, for Triton's link step and, when neither has it, on disk."""
    res = runner.run(facts.ldconfig_argv(), timeout=30)
    # The linker cache can name a file that is gone (a driver half-removed, a folder masked): the loader
    # then fails over it, so only the paths that exist count.
    cached = [p for p in facts.ldconfig_paths(res.stdout) if os.path.exists(p)]
    ld_dirs = _holding(os.environ.get("LD_LIBRARY_PATH", "").split(":"))
    loaded = os.path.join(ld_dirs[0], "libcuda.so.1") if ld_dirs else (cached[0] if cached else None)
    lib = LibCuda(cached, res.rc, ld_dirs, loaded, os.environ.get("TRITON_LIBCUDA_PATH"))
    if lib.triton_libcuda_path is not None:
        lib.triton_dirs_with = _holding([lib.triton_libcuda_path])
        lib.triton_dirs_without = [] if lib.triton_dirs_with else [lib.triton_libcuda_path]
    if not cached and not ld_dirs:
        # libcuda belongs beside libnvidia-ml; a TRITON_LIBCUDA_PATH folder serves Triton's link step but
        # not the loader, so it is a place to point the cache at too
        near = ([os.path.dirname(nvml_lib)] if nvml_lib else []) + lib.triton_dirs_with
        lib.searched = list(dict.fromkeys(near + list(LIB_DIRS)))
        lib.found_in = _holding(lib.searched)
    return lib


def verdict(lib: LibCuda, kmod: str | None) -> Problem | None:
    """What is wrong with where libcuda.so.1 is, else None. Fixes name only what the doctor found."""
    # Shadowing needs two copies that differ: LD_LIBRARY_PATH's wins over the linker cache's. One copy whose
    # version differs from the kernel module is a driver mismatch, which the caller names.
    cached = lib.ldconfig_version
    if lib.ld_library_path and cached and lib.version and lib.version != cached:
        stale, right = lib.ld_library_path[0], kmod or cached
        summary = f"LD_LIBRARY_PATH's {stale}/libcuda.so.1 is {lib.version}, the driver {right}"
        good = f" (the linker cache's libcuda is {right})" if cached == right else ""
        return Problem("LIBCUDA_SHADOWED", summary, fix_for("LIBCUDA_SHADOWED", stale=stale, good=good))
    if lib.triton_libcuda_path is not None and not lib.triton_dirs_with:
        return _triton_path_verdict(lib, kmod)
    if lib.ldconfig or lib.ld_library_path:
        return None
    if lib.found_in:
        where = lib.found_in[0]
        summary = f"libcuda.so.1 is in {where} but not in the linker cache (ldconfig -p)"
        return Problem("LIBCUDA_NOT_IN_LDCACHE", summary, fix_for("LIBCUDA_NOT_IN_LDCACHE", dir=where))
    summary = "libcuda.so.1 found nowhere (ldconfig -p, LD_LIBRARY_PATH, " + ", ".join(lib.searched) + ")"
    return Problem("LIBCUDA_NOT_FOUND", summary, _not_found_fix(kmod))


def userspace_version(nvml_lib: str | None, lib: LibCuda) -> str:
    """The user-space version from the file name (libnvidia-ml.so.580.159.04), for when NVML is silent."""
    if nvml_lib:
        m = re.search(r"libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)?)$", os.path.realpath(nvml_lib))
        if m:
            return m.group(1)
    return lib.version or "unknown (NVML does not initialise and libcuda.so.1 carries no version)"


def _triton_path_verdict(lib: LibCuda, kmod: str | None) -> Problem:
    value = lib.triton_libcuda_path or ""
    summary = f"TRITON_LIBCUDA_PATH={value!r} holds no libcuda.so.1"
    if ":" in value:
        summary += " (Triton takes the whole value as one folder)"
    code = "TRITON_LIBCUDA_PATH_WRONG"
    if lib.ldconfig:
        summary += f"; ldconfig finds {lib.ldconfig[0]}, which Triton does not ask while the variable is set"
        fix = "unset TRITON_LIBCUDA_PATH (Triton then uses the linker cache, which holds libcuda.so.1)"
        default = {os.path.realpath(d) for d in LINKER_DIRS}
        where = next(
            (os.path.dirname(p) for p in lib.ldconfig if os.path.realpath(os.path.dirname(p)) in default),
            None,
        )
        if where:
            # -L<wrong> still links: the linker searches this folder by default. Wrong, not yet fatal.
            return Problem(
                code, summary + f" (the link still finds it: {where} is a default linker folder)", fix, False
            )
        return Problem(code, summary, fix)
    if lib.ld_library_path:
        return Problem(code, summary, f"export TRITON_LIBCUDA_PATH={lib.ld_library_path[0]}")
    if lib.found_in:  # neither the loader nor Triton will find it: the cache fix serves both
        fix = fix_for("LIBCUDA_NOT_IN_LDCACHE", dir=lib.found_in[0]) + " && unset TRITON_LIBCUDA_PATH"
        return Problem(
            code, summary + f"; libcuda.so.1 is in {lib.found_in[0]}, outside the linker cache", fix
        )
    return Problem("LIBCUDA_NOT_FOUND", summary + "; nor anywhere else", _not_found_fix(kmod))


def _not_found_fix(kmod: str | None) -> str:
    version = kmod or "<the host module's: cat /proc/driver/nvidia/version on the host>"
    return fix_for("LIBCUDA_NOT_FOUND", kernel_driver=version)
