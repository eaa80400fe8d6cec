"""What a GPU probe's failure says, in one place: the code (diagnosis.match over its exception, then its
stderr), the signal that killed its worker, and the values its fix names, read from this process's
environment (the limit in force, the stub on LD_LIBRARY_PATH, the cache entries that do not load).

Every GPU probe's failure goes through `explain` (probes/gpu.py `_fail`), so the same text gets the same
code and the same fix whichever probe met it.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from typing import Any

from mlstack_doctor import kernel_cache, procenv, runner
from mlstack_doctor.diagnosis import match


@dataclass
class Explained:
    code: str
    fix_args: dict[str, str] = field(default_factory=dict)
    evidence: dict[str, Any] = field(default_factory=dict)


def signal_of(res: runner.WorkerResult) -> str | None:
    """SIGSEGV, SIGABRT, ... when the worker was killed by a signal (a negative exit status)."""
    rc = res.run.rc
    if res.run.timed_out or rc >= 0:
        return None
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def last_lines(text: str, n: int = 6) -> list[str]:
    return [ln for ln in text.strip().splitlines() if ln.strip()][-n:]


def _mount(path: str) -> str:
    p = os.path.abspath(path)
    while not os.path.ismount(p) and p != "/":
        p = os.path.dirname(p)
    return p


def fix_args(code: str, found: dict[str, str], facts: dict[str, Any]) -> dict[str, str]:
    """The values `code`'s fix names, from what this process shows now."""
    lim = procenv.limits()
    if code == "CUDA_INIT_OUT_OF_MEMORY":
        limit = lim["address_space"]["soft"]
        if limit is not None:
            need = procenv.address_space_needed(True)
            return {
                "cause": f"the address space is limited to {limit >> 20} MiB (RLIMIT_AS, ulimit -v): raise "
                "it where the job starts (ulimit -v unlimited; systemd LimitAS=infinity), more than "
                f"{need >> 20} MiB is needed"
            }
        return {
            "cause": "RLIMIT_AS is unlimited here, so the GPU's memory is taken: nvidia-smi names who has it"
        }
    if code == "ADDRESS_SPACE_LIMIT":
        limit = lim["address_space"]["soft"]
        return {
            "limit": "unlimited" if limit is None else f"{limit >> 20} MiB",
            "need": f"{procenv.address_space_needed(True) >> 20} MiB",
        }
    if code == "THREAD_LIMIT":
        n = lim["processes"]["soft"]
        return {"limit": "unlimited" if n is None else str(n), "need": str(procenv.threads_needed())}
    if code == "OPEN_FILES_LIMIT":
        n = lim["open_files"]["soft"]
        return {"limit": "unlimited" if n is None else str(n)}
    if code == "USER_UNKNOWN":
        return {"uid": str(os.getuid())}
    if code == "CUDA_DRIVER_STUB":
        stub = procenv.stub_libcuda()
        return {
            "dir": stub.split(" -> ")[0].rsplit("/", 1)[0]
            if stub
            else "<the folder holding the stub libcuda>"
        }
    if code == "ALLOC_CONF_INVALID":
        for var in procenv.ALLOC_VARS:
            if os.environ.get(var) is not None:
                why = "; ".join(procenv.alloc_conf_problems(os.environ[var])) or "torch refused it"
                return {"var": var, "why": f"{var}={os.environ[var]!r}: {why}", "where": "the environment"}
        return {}
    if code in ("KERNEL_IMAGE_INVALID", "KERNEL_CACHE_CORRUPT"):
        bad = _bad_cache(facts)  # kernel_caches's finding, or (it did not run: --only) the caches read now
        if bad:
            return {"folders": " ".join(bad)}
        return {}
    if code in ("DISK_FULL", "READ_ONLY_FS"):
        path = found.get("path")
        return {"path": path, "mount": _mount(path)} if path else {}
    if code == "PATH_PERMISSION_DENIED":
        return {"path": found["path"], "uid": str(os.getuid())} if found.get("path") else {}
    return {}


ENVIRONMENT_CODES = (
    "CUDA_DRIVER_STUB",
    "CUDA_INIT_OUT_OF_MEMORY",
    "ALLOC_CONF_INVALID",
    "USER_UNKNOWN",
    "THREAD_LIMIT",
    "OPEN_FILES_LIMIT",
)


def _bad_cache(facts: dict[str, Any]) -> list[str]:
    bad = facts.get("bad_cache_entries")
    if bad is None:
        from mlstack_doctor.probes.caches import caches  # a probe module: imported when needed only

        bad = sorted(b for _, folder, _ in caches() for b in kernel_cache.scan(folder)["bad"])  # type: ignore[union-attr]
    return list(bad)


def explain(res: runner.WorkerResult, default: str, facts: dict[str, Any], also: str = "") -> Explained:
    """The code and fix values for a worker that did not succeed; `also`: earlier errors of the same
    process (the session's failed imports), read after the worker's own text."""
    if res.run.timed_out:
        # A hang with the process environment's own words in its stderr (libgomp, OpenBLAS, getpwuid) is
        # that cause; any other text of a hung worker proves nothing.
        code, found = match(res.run.stderr[-20000:], "PROBE_TIMEOUT")
        if code not in ENVIRONMENT_CODES:
            return Explained("PROBE_TIMEOUT")
        return Explained(code, fix_args(code, found, facts), {"classified_from": found.get("match")})
    # The exception first, then the worker's stderr: a compiler Triton ran prints the specific cause there
    # ("fatal error: Python.h: No such file or directory") while the exception only says CalledProcessError.
    text = res.error_text + "\n" + res.run.stderr[-20000:]
    sig = signal_of(res)
    ev: dict[str, Any] = {}
    if sig:
        ev["signal"] = sig
        ev["stderr_last_lines"] = last_lines(res.run.stderr)
    fallback = "PROBE_CRASHED" if not res.answered else default
    code, found = match(text, fallback)
    if code == fallback and also:
        # nothing in the probe's own text: an earlier error of the same process may name the cause, if it is
        # one of the process environment's (a missing module there is no news: package_versions says so)
        earlier, seen = match(also, fallback)
        if earlier in ENVIRONMENT_CODES:
            code, found = earlier, seen
    if found.get("match"):
        ev["classified_from"] = found["match"]
    if code == "PROBE_CRASHED" and _bad_cache(facts):
        # a worker that died without a word while the kernel caches hold entries that cannot be loaded
        code = "KERNEL_CACHE_CORRUPT"
        ev["died_with_bad_cache_entries"] = True
    args = fix_args(code, found, facts)
    if sig:
        args["last"] = " | ".join(ev["stderr_last_lines"])[-400:] or "none"
    return Explained(code, args, ev)


# Kept as they are in the rerun: where the driver's libraries are found; a cache folder is replaced by an
# empty one instead of dropped (an empty cache is the reduced form of a cache).
KEEP = ("LD_LIBRARY_PATH",)
FRESHEN = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")
MAX_SINGLE = 4  # reruns that each drop one setting, after the one that drops them all


def candidates() -> list[str]:
    """The stack's settings in this environment, those whose value breaks a rule first."""
    names = [k for k in procenv.stack_variables() if k not in KEEP]
    suspect = procenv.variable_problems()
    return sorted(names, key=lambda k: (k not in suspect, k))


def reduced_rerun(script: str, args: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Rerun a probe's worker once without the stack's settings; when that passes, once without each
    setting alone, to name the one that makes the difference. {'without': [...], 'passed': bool,
    'culprit': VAR or None, 'tries': [...]}."""
    import tempfile

    names = candidates()
    out: dict[str, Any] = {"without": names, "tries": []}
    if not names:
        out["passed"] = None
        return out
    fresh = tempfile.mkdtemp(prefix="mlstack-doctor-rerun-")

    def attempt(drop: list[str]) -> bool:
        env = {k: v for k, v in os.environ.items() if k not in drop or k in FRESHEN}
        for k in drop:
            if k in FRESHEN:
                env[k] = os.path.join(fresh, k.lower())
        res = runner.run_worker(script, args, timeout=timeout, env=env, replace_env=True)
        out["tries"].append({"without": drop, "ok": res.ok, "rc": res.run.rc})
        return res.ok

    try:
        out["passed"] = attempt(names)
        if out["passed"]:
            if len(names) == 1:
                out["culprit"] = names[0]
            else:
                out["culprit"] = next((n for n in names[:MAX_SINGLE] if attempt([n])), None)
    finally:
        import shutil

        shutil.rmtree(fresh, ignore_errors=True)
    return out
