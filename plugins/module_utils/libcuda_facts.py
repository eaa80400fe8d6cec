# Copied from verify/src/mlstack_doctor/facts/libcuda.py (the source; a unit test keeps both equal).
"""libcuda.so.1 as the dynamic linker's cache lists it, and the driver version its file carries.

`ldconfig -p` lists `\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1`; the
driver installs libcuda.so.1 as a link to libcuda.so.<its version>, so the file the link leads to names
the driver userspace's version. Standard library only (see the package's docstring).
"""

from __future__ import annotations

import os
import re

SONAME = "libcuda.so.1"
_VERSIONED = re.compile(r"libcuda\.so\.(\d+\.\d+(?:\.\d+)?)$")


def ldconfig_argv() -> list[str]:
    """`ldconfig -p`, by its full path where PATH may lack /sbin (a non-login shell, a service)."""
    return ["/sbin/ldconfig" if os.path.exists("/sbin/ldconfig") else "ldconfig", "-p"]


def ldconfig_paths(text: str, soname: str = SONAME) -> list[str]:
    """The paths the answer to ldconfig_argv() lists for `soname`, in its order (the loader takes the
    first)."""
    paths = []
    for line in text.splitlines():
        name, sep, path = line.partition("=>")
        if sep and name.split()[:1] == [soname] and path.strip():
            paths.append(path.strip())
    return paths


def file_version(path: str) -> str | None:
    """The driver version in the name of the file `path` leads to (libcuda.so.1 -> libcuda.so.580.95.05:
    "580.95.05"); None when that name carries none."""
    m = _VERSIONED.search(os.path.realpath(path))
    return m.group(1) if m else None


def cached_version(ldconfig_text: str) -> str | None:
    """libcuda's version as the linker cache resolves it: the first libcuda.so.1 listed, followed to its
    file; None when the cache lists none or its file carries no version."""
    paths = ldconfig_paths(ldconfig_text)
    return file_version(paths[0]) if paths else None
