"""The driver userspace check: each container's libcuda against its node's kernel module.

A node's driver upgrade leaves every container with the old userspace: CUDA then fails with "API
mismatch" until provision.yml installs the node's version again (nvidia_userspace).
"""

from __future__ import annotations

from typing import Any

# The check's statuses.
MATCH = "match"
MISMATCH = "mismatch"
NO_DRIVER = "no_driver"


def _fix(node: str, method: str, source: str) -> str:
    """How each nvidia_userspace_method brings a container back to the node's version."""
    if method == "bind":
        where = f" ({source})" if source else ""
        return (
            f"make the node's driver library folder{where} hold its {node} libraries, "
            "then rerun provision.yml (it rebuilds the linker cache inside)"
        )
    if method == "none":
        return (
            "the template's driver libraries are not the node's: set mlstack_nvidia_userspace_method to "
            f"runfile or bind, then rerun provision.yml (it installs {node})"
        )
    where = f" from {source}" if source else ""
    return f"rerun provision.yml: it installs NVIDIA-Linux-x86_64-{node}.run{where} without its kernel module"


def driver_userspace(
    libcuda: str | None, node: str | None, method: str = "runfile", source: str = ""
) -> dict[str, Any]:
    """The check's record for one container: the node's kernel module version, the container's libcuda
    version (as `ldconfig -p` and readlink resolve libcuda.so.1), whether they match, and the fix."""
    libcuda, node = (libcuda or "").strip() or None, (node or "").strip() or None
    record: dict[str, Any] = {"node": node, "libcuda": libcuda, "method": method, "fix": None}
    if node is None:
        return record | {"status": NO_DRIVER, "summary": "the node has no NVIDIA driver loaded: not compared"}
    if libcuda == node:
        return record | {"status": MATCH, "summary": f"libcuda {libcuda} matches the node's kernel module"}
    inside = (
        f'libcuda {libcuda} inside, the node\'s kernel module is {node}: CUDA fails with "API mismatch"'
        if libcuda
        else f"no libcuda inside, the node's kernel module is {node}: CUDA cannot start"
    )
    return record | {"status": MISMATCH, "summary": inside, "fix": _fix(node, method, source)}
