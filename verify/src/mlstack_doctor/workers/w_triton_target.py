"""Ask Triton itself for its GPU target (this JIT-compiles its C helper: compiler, Python.h, libcuda)."""

from __future__ import annotations

import os
from typing import Any

from _common import main


def check(args: dict[str, Any]) -> dict[str, Any]:
    import triton

    target = triton.runtime.driver.active.get_current_target()
    cache = os.environ.get("TRITON_CACHE_DIR", "")
    entries = len(os.listdir(cache)) if cache and os.path.isdir(cache) else None
    return {
        "triton": triton.__version__,
        "target": repr(target),
        "backend": target.backend,
        "arch": target.arch,
        "warp_size": target.warp_size,
        "cache_dir": cache,
        "cache_entries_after": entries,
    }


if __name__ == "__main__":
    main(check)
