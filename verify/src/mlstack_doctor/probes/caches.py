"""The kernel caches (Triton's, inductor's) checked before anything loads from them.

From disk (fast tier, no torch): every entry's binaries complete, its metadata parsing, its group
file's children present (kernel_cache.scan). With a GPU, the driver loads each cached .cubin built for
this GPU's arch (workers/w_cubin.py): an image it refuses is named too. A bad entry fails the probe
with its folder, and the probes that load kernels from the cache (FLA, torch.compile, the model, the
warm step) wait for it. `--repair` moves the bad folders aside inside the cache instead.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mlstack_doctor import runner
from mlstack_doctor.cache import kernel_cache
from mlstack_doctor.context import Context
from mlstack_doctor.diagnosis import fix_for
from mlstack_doctor.probes.toolchain import triton_cache_path
from mlstack_doctor.record import Result, Stage, Status, failed, passed, warned

NAME, STAGE = "kernel_caches", Stage.TOOLCHAIN


def caches() -> list[tuple[str, str, str]]:
    """(kind, folder, where the folder came from) of the caches the stack loads kernels from."""
    triton, source = triton_cache_path()
    inductor, isource = kernel_cache.inductor_cache_path()
    return [("triton", triton, source), ("inductor", inductor, isource)]


def _arch_of(cubin: str) -> int | None:
    """The arch Triton's metadata beside a .cubin says it was built for (target.arch), if it says."""
    meta = Path(cubin).with_suffix(".json")
    try:
        target = json.loads(meta.read_text(encoding="utf-8")).get("target") or {}
        return int(target["arch"]) if isinstance(target.get("arch"), int | str) else None
    except (OSError, ValueError, KeyError, json.JSONDecodeError, AttributeError):
        return None


def driver_refusals(ctx: Context, cubins: list[str], ev: dict[str, Any]) -> dict[str, str]:
    """{cubin: the driver's error} for the cached images built for this GPU that the driver refuses."""
    driver = ctx.results.get("nvidia_driver")
    if not ctx.opts.expect_gpu or not cubins or (driver is not None and driver.status is Status.FAIL):
        return {}
    images = [[c, _arch_of(c)] for c in cubins]
    res = runner.run_worker("w_cubin.py", {"images": images, "budget_s": 30}, timeout=ctx.timeout(60))
    if not res.ok:
        ev["driver_check"] = f"not done: {res.error_text[:300]}"
        return {}
    ev["driver_check"] = {k: res.data.get(k) for k in ("checked", "device_arch", "other_arch")}
    return dict(res.data.get("refused") or {})


def kernel_caches(ctx: Context) -> Result:
    ev: dict[str, Any] = {"caches": {}}
    bad: dict[str, list[str]] = {}
    for kind, folder, source in caches():
        found = kernel_cache.scan(folder)
        ev["caches"][kind] = {
            "dir": folder,
            "source": source,
            **{k: found[k] for k in ("exists", "entries", "files") if k in found},
        }
        bad.update(found["bad"])  # type: ignore[arg-type]
        for path, err in driver_refusals(ctx, found["cubins"], ev).items():  # type: ignore[arg-type]
            bad.setdefault(str(Path(path).parent), []).append(
                f"{Path(path).name}: the driver refuses it ({err})"
            )
    ctx.facts["bad_cache_entries"] = sorted(bad)
    if not bad:
        counts = ", ".join(f"{k} {v.get('entries', 0)} entries" for k, v in ev["caches"].items())
        return passed(NAME, STAGE, f"kernel caches load: {counts}", **ev)
    ev["bad_entries"] = bad
    ev["explains"] = ["device kernel image is invalid", "Unknown key: 'cubin'", *sorted(bad)]
    folders = sorted(bad)
    listed = "; ".join(f"{f}: {', '.join(why)}" for f, why in bad.items())
    if ctx.opts.repair:
        moved = {}
        for _, folder, _ in caches():
            inside = [f for f in folders if os.path.realpath(f).startswith(os.path.realpath(folder) + os.sep)]
            try:
                moved.update(kernel_cache.quarantine(folder, inside))
            except OSError as exc:
                ev["repair_error"] = f"{type(exc).__name__}: {exc}"
        ev["moved_aside"] = moved
        left = [f for f in folders if f not in moved]
        if not left:
            ctx.facts["bad_cache_entries"] = []
            return warned(
                NAME,
                STAGE,
                f"--repair moved {len(moved)} unloadable cache entr{'y' if len(moved) == 1 else 'ies'} aside "
                f"(the kernels compile again on first use): {listed}",
                "KERNEL_CACHE_CORRUPT",
                f"nothing left to do; the entries are kept in {next(iter(moved.values())).rsplit('/', 2)[0]}",
                **ev,
            )
        folders = left
    driver_only = all("the driver refuses it" in w for f in folders for w in bad[f])
    code = "KERNEL_IMAGE_INVALID" if driver_only else "KERNEL_CACHE_CORRUPT"
    fix = fix_for(code, folders=" ".join(folders))
    return failed(
        NAME,
        STAGE,
        f"{len(folders)} cache entr{'y' if len(folders) == 1 else 'ies'} cannot be loaded: {listed}",
        code,
        fix,
        **ev,
    )
