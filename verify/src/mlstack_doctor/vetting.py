"""Every fix is checked against what the doctor saw before it reaches the report.

Probes build fixes from templates; a template can be wrong for the case at hand (point at the very
setting that failed, or at a folder on the same read-only disk). `vet` runs on every failed or warned
result (engine.run) and replaces a fix that contradicts the evidence with one that says what the
doctor could not determine, instead of a guess.

Paths the doctor tried are kept in ctx.facts["paths"]: {path: "writable" | "<why not>"}.

Premises: a code's fix template states a cause ("nvidia-smi must work here first", "install torch's
triton pin", "weights incomplete?"). PREMISES holds, per code, the check that the evidence shows that
cause; when it does not, the fix says "cause not determined" with the exception instead of the template.
"""

from __future__ import annotations

import os
import re
import resource
from collections.abc import Callable
from typing import Any

from mlstack_doctor.record import Result, Status

# `export NAME=VALUE` (also `NAME=VALUE cmd`): VALUE up to whitespace, `;`, `)` or a closing quote.
_ASSIGN = re.compile(r"(?:export\s+)?\b([A-Z][A-Z0-9_]*)=([^\s;)'\"]+)")
# Variables whose value is a folder the program writes into.
_WRITE_DIR = re.compile(r"(_DIR|_HOME|^TMPDIR)$")


def note_path(facts: dict[str, Any], path: str, why_not: str | None) -> None:
    """Record that `path` was tried: writable when `why_not` is None."""
    facts.setdefault("paths", {})[os.path.abspath(path)] = why_not or "writable"


def _expand(value: str) -> str:
    return os.path.abspath(os.path.expanduser(os.path.expandvars(value)))


def _verdict(facts: dict[str, Any], path: str) -> str | None:
    """What the doctor knows of `path`: 'writable', a reason it is not, or None (never tried).

    A path below a tried folder inherits the folder's verdict (a file under a read-only folder is
    not writable either; under a writable one it can be created).
    """
    paths: dict[str, str] = facts.get("paths") or {}
    best: tuple[int, str] | None = None
    for tried, verdict in paths.items():
        if path == tried or path.startswith(tried.rstrip("/") + "/"):
            if best is None or len(tried) > best[0]:
                best = (len(tried), verdict)
    return best[1] if best else None


def problems(fix: str, facts: dict[str, Any]) -> list[str]:
    """Why `fix` must not be printed (empty when it may): it sets a variable to the value it already
    has (the failing one), or points a write folder at a path the doctor did not find writable."""
    found: list[str] = []
    for name, value in _ASSIGN.findall(fix):
        if "<" in value or value.startswith("$("):  # a placeholder or a command: nothing to check
            continue
        target = _expand(value) if _WRITE_DIR.search(name) else value
        if name in os.environ and (
            os.environ[name] == value or (_WRITE_DIR.search(name) and _expand(os.environ[name]) == target)
        ):
            found.append(f"{name} already is {os.environ[name]}")
        if _WRITE_DIR.search(name):
            verdict = _verdict(facts, target)
            if verdict is None:
                found.append(f"the doctor did not try {target}")
            elif verdict != "writable":
                found.append(f"{target} is not usable: {verdict}")
    return found


Premise = Callable[[Result, dict[str, Result]], "str | None"]


def _status(results: dict[str, Result], name: str) -> Status | None:
    r = results.get(name)
    return r.status if r is not None else None


def _driver_broken(result: Result, results: dict[str, Result]) -> str | None:
    if (
        _status(results, "nvidia_driver") is Status.PASS
        and _status(results, "nvidia_device_nodes") is Status.PASS
    ):
        return "the device nodes and the driver probes passed (NVML answers), so the driver is not the cause"
    return None


def _torch_pin() -> tuple[str | None, str | None]:
    """(torch's triton== pin, the installed triton) from package metadata."""
    import importlib.metadata as md

    try:
        have = md.version("triton")
        reqs = md.requires("torch") or []
    except md.PackageNotFoundError:
        return None, None
    pins = [m.group(1) for r in reqs if (m := re.match(r"triton\s*==\s*([\w.]+)", r)) and "extra ==" not in r]
    return (pins[0] if pins else None), have


def _pin_differs(result: Result, results: dict[str, Result]) -> str | None:
    pin = results.get("torch_triton_pin")
    if pin is None:  # not in this run (--only): the metadata says the same
        pinned, have = _torch_pin()
    else:
        pinned, have = pin.evidence.get("torch_pins_triton"), pin.evidence.get("triton")
    if pinned and have and str(have).split("+")[0] == str(pinned):
        return f"triton {have} already is torch's pin"
    return None


# An API the installed package lacks: the evidence of a version incompatibility.
_API_MISSING = re.compile(
    r"has no attribute|cannot import name|unexpected keyword argument|takes \d+ positional|"
    r"No module named '(triton|torch|fla)\.[\w.]+'"
)


def _versions_named(result: Result, results: dict[str, Result]) -> str | None:
    """A fix that changes installed versions needs evidence of a version incompatibility: an API the
    package lacks, a rule of the stack policy, or torch's own triton pin overridden where no profile
    declares (and so proves) the override."""
    text = f"{result.evidence.get('exception') or ''}\n{result.evidence.get('stderr_tail') or ''}"
    if _API_MISSING.search(text):
        return None
    pin = results.get("torch_triton_pin")
    if pin is not None and pin.code == "TRITON_PIN_OVERRIDDEN":  # an override no profile declares
        return None
    versions = results.get("package_versions")
    if versions is not None and versions.code == "STACK_POLICY_RULE":
        return None
    if "torch_triton_pin" not in results and _pin_differs(result, results) is None and _torch_pin()[0]:
        return None  # not checked in this run (--only): the metadata shows the pin differing
    return (
        "the evidence names no version incompatibility (no API the package lacks, no policy rule, torch's "
        "triton pin not failing)"
    )


def _pin_and_versions(result: Result, results: dict[str, Result]) -> str | None:
    return _pin_differs(result, results) or _versions_named(result, results)


def _fresh_cache_proven(result: Result, results: dict[str, Result]) -> str | None:
    """ "Retry with a fresh cache" only where a fresh cache was tried and passed (the experiment)."""
    if not re.search(r"fresh (TRITON_CACHE_DIR|cache)", result.fix or ""):
        return None
    found = result.evidence.get("experiment") or {}
    if found.get("confirmed") and any(c.get("kind") == "cache" for c in found.get("culprits") or []):
        return None
    if found.get("baseline") == "fail":
        return "the probe failed with a fresh private cache too (evidence.experiment)"
    return "no rerun with a fresh cache passed"


def _weights_loaded(result: Result, results: dict[str, Result]) -> str | None:
    if result.name == "model_forward" and not result.evidence.get("weights_dir"):
        return "no weights were loaded (a random-init model from the config)"
    return None


def _torch_without_cuda(result: Result, results: dict[str, Result]) -> str | None:
    if _status(results, "torch_cuda") is Status.PASS:
        return "torch_cuda passed: torch sees the GPU in its own process"
    return None


def _triton_exception(result: Result, results: dict[str, Result]) -> str | None:
    return None if result.evidence.get("triton_exception") else "Triton raised nothing in FLA's process"


def _limit_finite(res_name: int, label: str) -> Premise:
    def check(result: Result, results: dict[str, Result]) -> str | None:
        if resource.getrlimit(res_name)[0] == resource.RLIM_INFINITY:
            return f"{label} is unlimited here (a cgroup limit, pids.max or memory.max, may be the one)"
        return None

    return check


def _filled(*names: str) -> Premise:
    """The fix names what the evidence showed: its placeholders for `names` were filled."""

    def check(result: Result, results: dict[str, Result]) -> str | None:
        empty = [n for n in names if f"<{n}>" in (result.fix or "")]
        return f"the evidence does not show the {', '.join(empty)}" if empty else None

    return check


PREMISES: dict[str, Premise] = {
    "CUDA_UNAVAILABLE": _driver_broken,
    "TORCH_COMPILE_FAILED": _pin_and_versions,
    "TORCH_COMPILE_MISMATCH": _pin_and_versions,
    "MODEL_LOAD_FAILED": _weights_loaded,
    "TRITON_NO_DRIVER": _torch_without_cuda,
    "FLA_ON_CPU": _triton_exception,
    "THREAD_LIMIT": _limit_finite(resource.RLIMIT_NPROC, "RLIMIT_NPROC"),
    "KERNEL_IMAGE_INVALID": _filled("folders"),
    "KERNEL_CACHE_CORRUPT": _filled("folders"),
    "CUDA_DRIVER_STUB": _filled("the folder holding the stub libcuda"),
    "DISK_FULL": _filled("path"),
    "READ_ONLY_FS": _filled("path"),
    "PATH_PERMISSION_DENIED": _filled("path"),
    "ENV_SETTING_FAULT": _filled("var"),
    "ALLOC_CONF_INVALID": _filled("var"),
}


def exception_of(result: Result) -> str:
    text = str(result.evidence.get("exception") or "").strip() or result.summary
    return text.splitlines()[-1][:300] if text else "no exception text"


def vet_premise(result: Result, results: dict[str, Result]) -> Result:
    """`result` with a fix whose premise the evidence lacks replaced by "cause not determined"."""
    check = PREMISES.get(result.code or "")
    why = check(result, results) if check and result.fix else None
    why = why or (_fresh_cache_proven(result, results) if result.fix else None)
    if not why:
        return result
    result.evidence["rejected_fix"] = {"fix": result.fix, "why": [why]}
    result.fix = (
        f"cause not determined: {exception_of(result)} (the usual fix does not apply: {why}); "
        "read evidence.exception and evidence.stderr_tail"
    )
    return result


def vet(result: Result, facts: dict[str, Any], results: dict[str, Result] | None = None) -> Result:
    """`result` with its fix replaced when the evidence contradicts it; the old fix kept as evidence."""
    if result.status not in (Status.FAIL, Status.WARN) or not result.fix:
        return result
    result = vet_premise(result, results or {})
    if "rejected_fix" in result.evidence:
        return result
    why = problems(result.fix, facts)
    if not why:
        return result
    result.evidence["rejected_fix"] = {"fix": result.fix, "why": why}
    tried = {p: v for p, v in (facts.get("paths") or {}).items() if v != "writable"}
    seen = "; ".join(f"{p}: {v}" for p, v in tried.items()) or "none tried"
    result.fix = (
        f"the doctor could not determine a working fix ({'; '.join(why)}); unusable paths found: {seen}. "
        "Point the failing setting at a folder you can write to and rerun the doctor"
    )
    return result
