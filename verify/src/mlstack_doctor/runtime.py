"""What a GPU probe's failure says, in one place: the code (diagnosis.match over its exception, then its
stderr), the signal that killed its worker, and the values its fix names, read from this process's
environment (the limit in force, the stub on LD_LIBRARY_PATH, the cache entries that do not load).

Every GPU probe's failure goes through `explain` (probes/gpu.py `_fail`), so the same text gets the same
code and the same fix whichever probe met it.
"""

from __future__ import annotations

import os
import re
import resource
import signal
from dataclasses import dataclass, field
from typing import Any

from mlstack_doctor import experiment, procenv, runner
from mlstack_doctor.cache import kernel_cache
from mlstack_doctor.diagnosis import CODES, match


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


# ---- memory other processes hold ------------------------------------------------------------------

_UNITS = {"B": 1, "bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_AMOUNT = r"([\d.]+) ?(bytes|B|KiB|MiB|GiB|TiB)"


def _bytes(num: str, unit: str) -> int:
    return int(float(num) * _UNITS[unit])


def _gib(n: int) -> float:
    return round(n / (1 << 30), 2)


def memory_held(text: str, nvml: dict[str, Any] | None = None) -> dict[str, Any]:
    """Who holds the GPU's memory, from torch's OutOfMemoryError ("GPU 0 has a total capacity of X of
    which Y is free. Process P has Z memory in use. Including non-PyTorch memory, this process has W")
    and, where it answers, NVML's list of compute processes (w_nvml.py, mode memory)."""
    out: dict[str, Any] = {}
    m = re.search(rf"total capacity of {_AMOUNT} of which {_AMOUNT} is free", text)
    mine = re.search(rf"this process has {_AMOUNT} memory in use", text)
    if m:
        total, free = _bytes(*m.group(1, 2)), _bytes(*m.group(3, 4))
        out["total_gib"], out["free_gib"] = _gib(total), _gib(free)
        if mine:
            this = _bytes(*mine.group(1, 2))
            out["this_process_gib"] = _gib(this)
            out["held_outside_gib"] = _gib(max(0, total - free - this))
    named = [
        {"pid": int(p.group(1)), "used_gib": _gib(_bytes(p.group(2), p.group(3)))}
        for p in re.finditer(rf"Process (\d+) has {_AMOUNT} memory in use", text)
    ]
    if named:
        out["processes"] = named
    for gpu in (nvml or {}).get("gpus") or []:
        procs = gpu.get("processes")
        entry: dict[str, Any] = {
            "index": gpu["index"],
            "used_gib": _gib(gpu["used"]),
            "free_gib": _gib(gpu["free"]),
        }
        if procs is not None:
            entry["processes"] = [
                {"pid": p["pid"], "used_gib": _gib(p["used"]), "command": p["command"] or "not visible here"}
                for p in procs
            ]
            if procs and not any(p["command"] for p in procs):
                entry["note"] = "the holders' pids are not visible here (another PID namespace: a container)"
            elif not procs and gpu["used"] > (1 << 30):
                entry["note"] = (
                    "NVML lists no process: the holders run in another PID namespace (a container)"
                )
        else:
            entry["note"] = f"NVML does not list the processes: {gpu.get('processes_error')}"
        out.setdefault("nvml", []).append(entry)
    if nvml is not None and not nvml.get("gpus"):
        out["nvml"] = f"NVML not readable here: {nvml.get('error') or 'no GPU listed'}"
    return out


def memory_sentence(held: dict[str, Any]) -> str:
    """One line for the fix: how much the device holds outside this process, and who."""
    parts = []
    if "held_outside_gib" in held:
        parts.append(
            f"{held['held_outside_gib']} GiB of {held['total_gib']} GiB is held outside this process"
        )
    holders = [
        f"pid {p['pid']} ({p['used_gib']} GiB{', ' + p['command'] if p.get('command') else ''})"
        for g in held.get("nvml") or []
        if isinstance(g, dict)
        for p in g.get("processes") or []
    ] or [f"pid {p['pid']} ({p['used_gib']} GiB)" for p in held.get("processes") or []]
    if holders:
        parts.append("held by " + ", ".join(holders[:4]))
    notes = [g["note"] for g in held.get("nvml") or [] if isinstance(g, dict) and g.get("note")]
    parts += notes[:1]
    return "; ".join(parts)


# ---- diagnosis by experiment ----------------------------------------------------------------------

# The code for a confirmed culprit, by its kind (experiment.KINDS).
KIND_CODE = {
    "env": "ENV_SETTING_BREAKS",
    "limit": "RESOURCE_LIMIT_BREAKS",
    "home": "HOME_UNUSABLE",
    "tmpdir": "TMPDIR_UNUSABLE",
    "cache": "CACHE_BREAKS",
    "startup": "STARTUP_HOOK_BREAKS",
}


def wants_experiment(res: runner.WorkerResult, ex: Explained) -> bool:
    """A failure whose cause the evidence does not name: no rule matched its text, or its code is open
    (diagnosis.Code.open: it says a step failed, not why; out of memory is load or a setting, and only the
    experiment tells them apart). A hang is not rerun (each rerun would wait for the whole timeout)."""
    if res.run.timed_out or ex.code == "PROBE_TIMEOUT":
        return False
    return not ex.evidence.get("classified_from") or CODES[ex.code].open


def limit_action(name: str) -> str:
    """Raise limit `name` (procenv.LIMITS) where the job starts, to its hard value."""
    soft, hard = resource.getrlimit(procenv.LIMITS[name])
    to = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    unit = " (blocks of 1024 bytes)" if name == "file_size" and to != "unlimited" else ""
    return (
        f"raise the {name} limit where the job starts: ulimit {procenv.ULIMIT_FLAG[name]} {to}{unit} "
        f"(systemd {procenv.SYSTEMD_LIMIT[name]}={'infinity' if to == 'unlimited' else to}); "
        f"its soft value is {soft} here"
    )


def _action(d: experiment.Difference, facts: dict[str, Any]) -> str:
    """What to do about one confirmed difference, from its kind."""
    if d.kind == "env":
        how = ""
        if d.name in procenv.ALLOC_VARS:
            how = " or correct it (key:value[,key:value], e.g. expandable_segments:True)"
        elif d.name in procenv.INT_VARS:
            how = " or set it to a whole number"
        elif d.name in procenv.MUST_EXIST:
            how = " or point it at an existing folder"
        return f"unset {d.name}{how} where the job's environment sets it (it is {d.value!r} here)"
    if d.kind == "limit":
        return limit_action(d.name)
    if d.kind in ("home", "tmpdir"):
        return f"{d.var}={d.name} failed the probe"
    if d.kind == "cache":
        if os.path.isdir(d.name):
            return f"rm -rf {d.name} (the cache {d.var} uses; its kernels compile again on first use)"
        return f"unset {d.var} or point it at a folder that can be created ({d.name} cannot be used)"
    if d.var == "PYTHONSTARTUP":
        return f"unset PYTHONSTARTUP (it runs {d.name})"
    where = f" (or remove {d.entry} from PYTHONPATH)" if d.entry else ""
    return f"remove the start-up hook {d.name}{where}: every interpreter runs it at start"


def _alternative(facts: dict[str, Any], d: experiment.Difference) -> str:
    """'export VAR=<a folder the doctor wrote to>; or ' for HOME or TMPDIR."""
    from mlstack_doctor.probes import toolchain  # a probe module: imported when needed only

    user = os.environ.get("USER") or str(os.getuid())
    cands = ["/var/tmp", "/tmp"] if d.kind == "tmpdir" else [f"/var/tmp/home-{user}", f"/tmp/home-{user}"]
    cands = [c for c in cands if os.path.abspath(c) != os.path.abspath(d.name)]
    return toolchain.alternative_in(facts, str(d.var), d.name, cands)[0]


def experiment_note(found: dict[str, Any] | None) -> str:
    """What the fix adds when the experiment ran and named nothing: where the cause is not."""
    if not found or found.get("confirmed"):
        return ""
    if found.get("baseline") == "fail":
        ruled = ", ".join(found.get("ruled_out") or []) or "nothing"
        return (
            f"; the cause is not in this process's settings: the probe fails in a clean baseline too "
            f"(ruled out: {ruled})"
        )
    return f"; the doctor's reruns named no setting ({found.get('note') or 'not confirmed'})"


def _hook_effects(
    culprits: list[experiment.Difference],
) -> tuple[list[experiment.Difference], list[str]]:
    """(the culprits to act on, the variables among them a start-up hook culprit set): a variable the
    process did not start with but a sitecustomize set is the hook's doing; unsetting it in the job's
    environment would change nothing, removing the hook does."""
    if not any(c.kind == "startup" for c in culprits):
        return culprits, []
    changed = procenv.changed_at_start()
    sets = list(dict.fromkeys(k for c in culprits for k, _ in c.sets))
    hooked = [c.name for c in culprits if c.kind == "env" and c.name in changed]
    return [c for c in culprits if c.name not in hooked], list(dict.fromkeys(sets + hooked))


def by_experiment(
    ex: Explained, facts: dict[str, Any], key: str, trial: experiment.Trial, reproduced: bool = False
) -> None:
    """Run (or reuse) the experiment for a failure no rule explains; a confirmed culprit becomes the code
    and the fix (ex is updated in place); otherwise the evidence says what was ruled out."""
    out = experiment.diagnose(facts, key, trial, reproduced)
    ex.evidence["experiment"] = out.evidence
    # the field reports of schema 1.3 read (the rerun without the stack's settings)
    env_culprits = [c.name for c in out.culprits if c.kind == "env"] if out.confirmed else []
    ex.evidence["reduced_env_rerun"] = {
        "without": [d["name"] for d in out.evidence["culprits"]] + out.ruled_out,
        "passed": {"pass": True, "fail": False}.get(out.baseline),
        "culprit": env_culprits[0] if env_culprits else None,
    }
    if not (out.confirmed and out.culprits):
        return
    culprits, hooked = _hook_effects(out.culprits)
    first = culprits[0]
    if len(culprits) == 1 and first.name in procenv.ALLOC_VARS:
        # a grammar the doctor knows: its own code, the fix naming what is wrong with the value
        ex.code = "ALLOC_CONF_INVALID"
        ex.fix_args = fix_args(ex.code, {}, facts)
        ex.fix_args.setdefault("var", first.name)
        ex.evidence["classified_from"] = f"experiment: {first.name}"
        return
    code = KIND_CODE[first.kind]
    names = " and ".join(c.name for c in out.culprits)
    proof = (
        f" (the doctor reran the probe: it passed without {names} and failed again with only {names} put "
        "back; evidence.experiment)"
    )
    if hooked:
        proof = f" (the start-up hook sets {', '.join(hooked)}){proof}"
    others = "; and ".join(_action(c, facts) for c in culprits[1:])
    if code in ("HOME_UNUSABLE", "TMPDIR_UNUSABLE"):
        args = {"alternative": _alternative(facts, first), "tmpdir": first.name}
        proof = f" ({_action(first, facts)}{'; and ' + others if others else ''}){proof}"
    else:
        action = "; and ".join(_action(c, facts) for c in culprits)
        args = {"action": action}
    ex.code = code
    ex.fix_args = {**args, "proof": proof}
    ex.evidence["classified_from"] = f"experiment: {names}"
