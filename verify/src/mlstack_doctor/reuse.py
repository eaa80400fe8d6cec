"""A rerun on an unchanged stack: the fast tier stands in for a quick or full tier that passed.

`--reuse-passed REPORT` names the report of the last run (the one `--output` replaces). It is reused
when it passed, at the same tier, less than `--reuse-max-age` hours ago (counted from the run that
really ran the tier), and the stack fingerprint it recorded is today's: the doctor (its own files) and
its options, the interpreter, the lock, every installed distribution, the driver, the device nodes, the
compilers, the environment that steers them, and the model's files. Then only the fast tier runs (about a
second, no torch import); when it passes, the other probes' verdicts are carried over, each marked
with the run they come from. Anything else, a fast-tier failure included, runs the tier in full."""

from __future__ import annotations

import glob
import hashlib
import importlib.metadata
import json
import os
import shutil
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from mlstack_doctor import __version__
from mlstack_doctor.files import sha256_of
from mlstack_doctor.record import Result, Stage, Status

# Tiers whose verdict may be carried: stress and warm act (a race, a cache to fill) and always run.
REUSABLE_TIERS = ("quick", "full")
# The environment that changes what the probes would see.
STEERING_ENV = (
    "PATH",
    "CC",
    "CXX",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "TRITON_CACHE_DIR",
    "TRITON_LIBCUDA_PATH",
    "TRITON_PTXAS_PATH",
    "LD_LIBRARY_PATH",
    "LD_PRELOAD",
    "PYTHONPATH",
    "TMPDIR",
)
TOOLS = ("cc", "gcc", "c++", "g++", "as", "ld", "nvidia-smi")
MODEL_FILES_MAX = 2000
# The doctor's own code and data: its version stays the same across changes of its probes.
DOCTOR_DIR = Path(__file__).resolve().parent


def _stat_line(path: Path) -> str:
    st = path.stat()
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


def _model_lines(model: str) -> list[str]:
    """Names, sizes and mtimes of a model path's files (tiny and 27b are built-in configs)."""
    if not model:  # no --model: Path("") is the working directory, not a model
        return ["model:"]
    path = Path(model)
    if not path.exists():
        return [f"model:{model}"]
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return [_stat_line(p) for p in files[:MODEL_FILES_MAX]]


def doctor_lines() -> list[str]:
    """The doctor's files and their sha256: a doctor that changed (an upgraded collection installs a new
    wheel of the same version) runs its tier in full rather than carrying an older doctor's verdicts."""
    files = sorted(p for p in DOCTOR_DIR.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return [f"doctor.{p.relative_to(DOCTOR_DIR)}={sha256_of(p)}" for p in files]


def fingerprint(options: dict[str, Any]) -> str:
    """sha256 of what the probes' verdicts depend on; `options` as the report records them."""
    lines = [
        f"doctor={__version__}",
        *doctor_lines(),
        f"python={sys.version}",
        f"executable={os.path.realpath(sys.executable)}",
    ]
    lines += [f"option.{k}={json.dumps(v, sort_keys=True)}" for k, v in sorted(options.items())]
    lock = options.get("profile")
    if lock and os.path.isfile(lock):
        lines.append(f"lock={sha256_of(lock)}")
    dists = {
        f"{d.metadata['Name']}=={d.version}@{d.locate_file('')}" for d in importlib.metadata.distributions()
    }
    lines += sorted(dists)
    try:
        lines.append("driver=" + Path("/proc/driver/nvidia/version").read_text())
    except OSError:
        lines.append("driver=none")
    for dev in sorted(glob.glob("/dev/nvidia*")) + sorted(glob.glob("/dev/nvidia-caps/*")):
        try:
            st = os.stat(dev)
        except OSError:
            continue
        lines.append(f"dev={dev}:{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}:{oct(st.st_mode)}")
    for tool in TOOLS:
        found = shutil.which(tool)
        lines.append(f"tool.{tool}=" + (_stat_line(Path(os.path.realpath(found))) if found else "none"))
    lines += [f"env.{var}={os.environ.get(var, '')}" for var in STEERING_ENV]
    lines += _model_lines(str(options.get("model") or ""))
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _parse_time(text: str) -> datetime | None:
    try:
        when = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def reusable(path: str, tier: str, fp: str, max_age_hours: float) -> dict[str, Any] | None:
    """The previous report when its verdicts may stand for this run's tier, else None."""
    if tier not in REUSABLE_TIERS:
        return None
    try:
        prev = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(prev, dict) or prev.get("tier") != tier or prev.get("fingerprint") != fp:
        return None
    if not (prev.get("summary") or {}).get("ok"):
        return None
    ran = _parse_time(original_run(prev))
    if ran is None or datetime.now(UTC) - ran > timedelta(hours=max_age_hours):
        return None
    return prev


def original_run(prev: dict[str, Any]) -> str:
    """When the tier really ran: a reused report passes on the time of the run it reused."""
    return str((prev.get("reused") or {}).get("from") or prev.get("started") or "")


def _result(probe: dict[str, Any], ran: str) -> Result:
    return Result(
        name=probe["name"],
        stage=Stage(probe["stage"]),
        status=Status(probe["status"]),
        summary=probe["summary"],
        evidence={**(probe.get("evidence") or {}), "reused_from": ran},
        code=probe.get("code"),
        fix=probe.get("fix"),
        skipped_by=probe.get("skipped_by"),
        duration_s=0.0,
    )


def merge(fresh: list[Result], prev: dict[str, Any]) -> list[Result]:
    """The previous report's probes in their order, the fresh ones in place of theirs."""
    ran = original_run(prev)
    by_name = {r.name: r for r in fresh}
    out = [by_name.pop(p["name"]) if p["name"] in by_name else _result(p, ran) for p in prev["probes"]]
    return out + list(by_name.values())
