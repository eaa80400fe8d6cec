"""Diagnosis by experiment: where no rule names a failure's cause, find it by rerunning the probe.

The doctor knows how this process differs from a clean baseline: the variables of the stack and of the
loader, interpreter and compiler (`differences`), each resource limit whose soft value is below its hard
one, HOME and TMPDIR where a real write there fails, the kernel caches in use (against a fresh private
folder), and the Python start-up hooks. It reruns the failing probe (a `Trial`) with all of them removed.
When that baseline passes, it narrows them by delta debugging (halves, then singles; two faults at once
are both found) and confirms the answer: the named difference(s) alone restored on the baseline must
bring the failure back, and the baseline, run again, must pass again. Only a confirmed difference is a
cause; a failure that comes and goes (memory other processes hold is load) is "not confirmed".

Bounded by BUDGET (reruns and seconds, per experiment and per run of the doctor); a run in which
nothing fails pays nothing. The evidence it leaves (`Outcome.evidence`) says what ran.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlstack_doctor import procenv, runner

# The bounds, in one place. A GPU probe's rerun imports torch again and compiles kernels (tens of
# seconds); the per-run bound keeps a run with several unexplained failures from paying for each.
BUDGET = {
    "reruns": 12,  # per experiment: baseline, narrowing and the two confirming runs
    "seconds": 300.0,  # per experiment
    "run_reruns": 24,  # per run of the doctor, all experiments together
    "run_seconds": 600.0,
}

# Variables the experiment takes as differences: the stack's families (procenv.FAMILIES, SINGLE) and
# the loader's, interpreter's and compiler's.
PREFIXES = ("LD_", "PYTHON", "GCC_", "OPENBLAS_")
NAMES = ("CC", "CXX", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "CPATH", "C_INCLUDE_PATH", "LIBRARY_PATH")
# Kept as they are: where the driver's libraries are found (a stub there is the rules' to name), which GPUs
# the job runs on (a baseline on another GPU would prove nothing about this one; the rules judge these), and
# the settings the doctor's workers need themselves.
KEEP = (
    "LD_LIBRARY_PATH",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "PYTHONUNBUFFERED",
    "PYTHONIOENCODING",
    "PYTHONPATH",
    "PYTHONDONTWRITEBYTECODE",
)
# The kernel caches: replaced by a fresh private folder in the baseline.
CACHE_VARS = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")
HOOK_MODULES = ("sitecustomize", "usercustomize")
KINDS = ("env", "limit", "home", "tmpdir", "cache", "startup")


@dataclass(frozen=True)
class Difference:
    """One way this process differs from the baseline. `var`: the variable it lives in (env, cache,
    startup via PYTHONSTARTUP); `entry`: the PYTHONPATH entry holding a start-up hook."""

    kind: str
    name: str
    value: str
    var: str | None = None
    entry: str | None = None
    # a start-up hook's: the variables it set in this process (name, the value the process started with or
    # None); without the hook, they are what the process started with
    sets: tuple[tuple[str, str | None], ...] = ()

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "name": self.name, "value": self.value}


# A trial runs the failing probe's work once with this environment and preexec; True when it passes.
Trial = Callable[[dict[str, str], "Callable[[], None] | None"], "tuple[bool, str]"]


def usable_dir(path: str) -> str | None:
    """Why `path` cannot take a file (a real write), or None when it can."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".mlstack-doctor-", dir=path)
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror or exc}"
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(b"x" * 4096)
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror or exc}"
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return None


def _variable(name: str) -> bool:
    if name in KEEP or name in CACHE_VARS or name == "PYTHONSTARTUP" or name.startswith("MLSTACK_DOCTOR"):
        return False
    return procenv.in_family(name) or name.startswith(PREFIXES) or name in NAMES


def _hook_files(dirs: Iterable[str]) -> list[tuple[str, str]]:
    """(folder, file) of each sitecustomize/usercustomize found in `dirs`."""
    out = []
    for d in dirs:
        for mod in HOOK_MODULES:
            for cand in (Path(d, mod + ".py"), Path(d, mod, "__init__.py")):
                if cand.is_file():
                    out.append((d, str(cand)))
    return out


def _site_dirs() -> list[str]:
    import site

    dirs = [*site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


def differences(environ: dict[str, str] | None = None) -> list[Difference]:
    """How this process differs from the clean baseline, in the order the narrowing splits them."""
    env = dict(os.environ if environ is None else environ)
    out: list[Difference] = []
    pypath = [e for e in env.get("PYTHONPATH", "").split(os.pathsep) if e]
    hooks = _hook_files(pypath)
    hooked = {d for d, _ in hooks}
    site_hooks = [(d, f) for d, f in _hook_files(_site_dirs()) if d not in hooked]
    # Variables a start-up hook set in this process (not as it started): the hook's doing, part of it. A
    # sitecustomize/usercustomize runs in every interpreter; PYTHONSTARTUP only in an interactive one.
    set_at_start: tuple[tuple[str, str | None], ...] = ()
    if environ is None and (hooks or site_hooks):
        first = procenv.initial_environ() or {}
        set_at_start = tuple((k, first.get(k)) for k in procenv.changed_at_start() if _variable(k))
    for k in sorted(env):
        if _variable(k) and k not in dict(set_at_start):
            out.append(Difference("env", k, procenv.redact(k, env[k]), var=k))
    for name, res in procenv.LIMITS.items():
        soft, hard = resource.getrlimit(res)
        if soft != hard and (hard == resource.RLIM_INFINITY or soft < hard):
            out.append(Difference("limit", name, str(soft)))
    home = env.get("HOME")
    if not home or usable_dir(home):
        out.append(Difference("home", home or "(unset)", home or "", var="HOME"))
    tmp = env.get("TMPDIR")
    if tmp or usable_dir("/tmp"):
        out.append(Difference("tmpdir", tmp or "/tmp", tmp or "", var="TMPDIR"))
    for var in CACHE_VARS:
        path = env.get(var) or _default_cache(var, env)
        if path and (var in env or os.path.isdir(path)):
            out.append(Difference("cache", path, env.get(var, ""), var=var))
    for d, f in hooks:
        out.append(Difference("startup", f, f, entry=d, sets=set_at_start))
    for _, f in site_hooks:
        out.append(Difference("startup", f, f, sets=set_at_start))
    rest = [e for e in pypath if e not in hooked]
    if rest:
        out.append(Difference("env", "PYTHONPATH", os.pathsep.join(rest), var="PYTHONPATH"))
    if env.get("PYTHONSTARTUP"):
        out.append(Difference("startup", env["PYTHONSTARTUP"], env["PYTHONSTARTUP"], var="PYTHONSTARTUP"))
    return out


def _default_cache(var: str, env: dict[str, str]) -> str | None:
    if var == "TRITON_CACHE_DIR":
        home = env.get("TRITON_HOME") or env.get("HOME")
        return os.path.join(home, ".triton", "cache") if home else None
    user = env.get("USER") or str(os.getuid())
    return os.path.join(tempfile.gettempdir(), f"torchinductor_{user}")


def _raise_limits(names: list[str]) -> Callable[[], None] | None:
    """A preexec that raises these limits' soft values to their hard ones, in the child only."""
    if not names:
        return None
    ids = [procenv.LIMITS[n] for n in names]

    def preexec() -> None:
        for res in ids:
            _, hard = resource.getrlimit(res)
            resource.setrlimit(res, (hard, hard))

    return preexec


def setting(
    diffs: list[Difference], restored: Iterable[int], scratch: str, environ: dict[str, str] | None = None
) -> tuple[dict[str, str], Callable[[], None] | None]:
    """(environment, preexec) of the baseline with the differences of index `restored` put back."""
    keep = set(restored)
    env = dict(os.environ if environ is None else environ)
    pypath = [e for e in env.get("PYTHONPATH", "").split(os.pathsep) if e]
    drop: set[str] = set()
    shadows: list[str] = []
    limits: list[str] = []
    # what start-up hooks set goes back to the value the process started with unless a hook that sets it stays
    kept_sets = {k for i, d in enumerate(diffs) if i in keep for k, _ in d.sets}
    for d in diffs:
        for k, started in d.sets:
            if k in kept_sets:
                continue
            if started is None:
                env.pop(k, None)
            else:
                env[k] = started
    for i, d in enumerate(diffs):
        if i in keep:
            continue
        if d.kind == "env" and d.name == "PYTHONPATH":
            drop.update(d.value.split(os.pathsep))
        elif d.kind == "env" or (d.kind == "startup" and d.var):
            env.pop(d.var or d.name, None)
        elif d.kind == "limit":
            limits.append(d.name)
        elif d.kind in ("home", "tmpdir", "cache"):
            env[str(d.var)] = _private(scratch, str(d.var))
        elif d.kind == "startup" and d.entry:
            drop.add(d.entry)
        elif d.kind == "startup":
            shadows.append(
                _shadow(scratch, Path(d.name).stem if d.name.endswith(".py") else Path(d.name).parent.name)
            )
    # A rerun writes no bytecode: not into the stack's folders, and not cut short by a file-size limit
    # (CPython's .pyc write is one write(2): under RLIMIT_FSIZE it leaves a truncated file behind).
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    pypath = shadows + [e for e in pypath if e not in drop]
    if pypath:
        env["PYTHONPATH"] = os.pathsep.join(pypath)
    else:
        env.pop("PYTHONPATH", None)
    return env, _raise_limits(limits)


def _private(scratch: str, var: str) -> str:
    path = os.path.join(scratch, var.lower())
    os.makedirs(path, exist_ok=True)
    return path


def _shadow(scratch: str, module: str) -> str:
    """A folder first on PYTHONPATH holding an empty `module`: the hook of that name is not imported."""
    d = os.path.join(scratch, "shadow-" + module)
    os.makedirs(d, exist_ok=True)
    Path(d, module + ".py").write_text("", encoding="utf-8")
    return d


class _Spent(Exception):
    """The budget is spent: the experiment stops where it is."""


@dataclass
class Budget:
    """What one run of the doctor may still spend on experiments (ctx.facts keeps one)."""

    reruns: int = BUDGET["run_reruns"]  # type: ignore[assignment]
    seconds: float = BUDGET["run_seconds"]


@dataclass
class Outcome:
    baseline: str = "not run"  # pass | fail | not run
    culprits: list[Difference] = field(default_factory=list)
    confirmed: bool = False
    ruled_out: list[str] = field(default_factory=list)
    reruns: int = 0
    seconds: float = 0.0
    runs: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""

    @property
    def evidence(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "baseline": self.baseline,
            "culprits": [c.to_json() for c in self.culprits],
            "confirmed": self.confirmed,
            "ruled_out": self.ruled_out,
            "reruns": self.reruns,
            "seconds": round(self.seconds, 2),
            "runs": self.runs,
        }
        if self.note:
            out["note"] = self.note
        return out


class Experiment:
    def __init__(
        self, trial: Trial, diffs: list[Difference], budget: Budget, reproduced: bool = False
    ) -> None:
        """`reproduced`: the failure came from this very trial's work in this process's setting (not from
        the long-lived session), so it need not be run again with every difference in place."""
        self.trial, self.diffs, self.budget, self.reproduced = trial, diffs, budget, reproduced
        self.out = Outcome()
        self.start = time.monotonic()
        self.scratch = tempfile.mkdtemp(prefix="mlstack-doctor-experiment-", dir=_scratch_root())
        self._seen: dict[frozenset[int], bool] = {}

    def fails(self, restored: Iterable[int], *, again: bool = False) -> bool:
        """Whether the probe fails on the baseline with `restored` put back (a rerun; `again`: even
        when this setting ran before)."""
        key = frozenset(restored)
        if key in self._seen and not again:
            return self._seen[key]
        spent = time.monotonic() - self.start
        if (
            self.out.reruns >= BUDGET["reruns"]
            or spent >= BUDGET["seconds"]
            or self.budget.reruns <= 0
            or self.budget.seconds <= 0
        ):
            raise _Spent
        env, preexec = setting(self.diffs, key, self.scratch)
        t0 = time.monotonic()
        ok, detail = self.trial(env, preexec)
        took = time.monotonic() - t0
        self.out.reruns += 1
        self.budget.reruns -= 1
        self.budget.seconds -= took
        run: dict[str, Any] = {
            "restored": [self.diffs[i].name for i in sorted(key)],
            "ok": ok,
            "s": round(took, 2),
        }
        if not ok and detail.strip():
            run["error"] = _error_line(detail)
        self.out.runs.append(run)
        self._seen[key] = not ok
        return not ok

    def narrow(self, cands: list[int], context: frozenset[int]) -> list[int]:
        """The differences among `cands` that, with `context` restored, bring the failure back (it fails
        with all of `cands` and `context` restored)."""
        if len(cands) == 1:
            return cands
        half = len(cands) // 2
        a, b = cands[:half], cands[half:]
        fa = self.fails(context | set(a))
        fb = self.fails(context | set(b))
        found: list[int] = []
        if fa:
            found += self.narrow(a, context)
        if fb:
            found += self.narrow(b, context)
        if not fa and not fb:  # only together: each half needs the other
            found += self.narrow(a, context | set(b)) + self.narrow(b, context | set(a))
        return sorted(set(found))

    def run(self) -> Outcome:
        out = self.out
        try:
            if not self.diffs:
                out.note = "this process does not differ from the baseline: nothing to take away"
                return out
            everything = list(range(len(self.diffs)))
            if not self.reproduced and not self.fails(everything):  # rerun on its own, every difference in
                out.note = "the failure did not come back in a rerun with this process's settings"
                return out
            base_fails = self.fails(())
            out.baseline = "fail" if base_fails else "pass"
            if base_fails:
                out.ruled_out = [d.name for d in self.diffs]
                out.note = "the baseline fails too: the cause is not in the process's settings"
                return out
            found = self.narrow(everything, frozenset())
            out.culprits = [self.diffs[i] for i in found]
            # Confirm: the named differences alone bring the failure back, and the baseline passes again.
            back = self.fails(found, again=True)
            clean = not self.fails((), again=True)
            out.confirmed = back and clean
            if out.confirmed:
                out.ruled_out = [d.name for i, d in enumerate(self.diffs) if i not in found]
            else:
                out.note = (
                    "not confirmed: the failure comes and goes with the same settings (load, another "
                    "process, a race), so no setting is named"
                )
        except _Spent:
            out.note = f"stopped: the experiment's budget is spent ({BUDGET})"
            out.confirmed = False
        finally:
            out.seconds = time.monotonic() - self.start
            shutil.rmtree(self.scratch, ignore_errors=True)
        return out


def _error_line(text: str) -> str:
    """The line of a failure's text that names the error (the last one saying error, else the last)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    named = [ln for ln in lines if re.search(r"error|Error|exceeded|denied|refused", ln)]
    return (named or lines or [""])[-1][:200]


def _scratch_root() -> str:
    """A folder the experiment can write its private HOME, TMPDIR and caches into (not $TMPDIR, which
    may be the fault)."""
    for d in ("/var/tmp", "/tmp", os.path.expanduser("~")):
        if os.path.isdir(d) and usable_dir(d) is None:
            return d
    return tempfile.gettempdir()


def worker_trial(script: str, args: dict[str, Any], timeout: float, python: str | None = None) -> Trial:
    """A trial that runs workers/<script> once on its own."""

    def trial(env: dict[str, str], preexec: Callable[[], None] | None) -> tuple[bool, str]:
        res = runner.run_worker(
            script,
            args,
            timeout=timeout,
            python=python or sys.executable,
            env=env,
            replace_env=True,
            preexec=preexec,
        )
        return res.ok, "" if res.ok else res.error_text

    return trial


def budget_of(facts: dict[str, Any]) -> Budget:
    return facts.setdefault("experiment_budget", Budget())


def diagnose(facts: dict[str, Any], key: str, trial: Trial, reproduced: bool = False) -> Outcome:
    """The experiment for one failing worker (`key`: its script and args): run once per run of the
    doctor; when an earlier experiment confirmed a cause, first check whether removing that cause alone
    makes this one pass too (one rerun instead of a new experiment). `reproduced`: see Experiment."""
    done: dict[str, Outcome] = facts.setdefault("experiments", {})
    if key in done:
        return done[key]
    diffs = differences()
    for earlier in done.values():
        if earlier.confirmed and earlier.culprits and all(c in diffs for c in earlier.culprits):
            same = _same_cause(trial, diffs, earlier.culprits, budget_of(facts))
            if same is not None:
                done[key] = same
                return same
    outcome = Experiment(trial, diffs, budget_of(facts), reproduced).run()
    done[key] = outcome
    return outcome


def _same_cause(
    trial: Trial, diffs: list[Difference], culprits: list[Difference], budget: Budget
) -> Outcome | None:
    """This process with only an earlier experiment's culprits removed: if the probe then passes, its
    failure (seen with them) has the same cause."""
    exp = Experiment(trial, diffs, budget)
    keep = [i for i, d in enumerate(diffs) if d not in culprits]
    try:
        passes = not exp.fails(keep)
    except _Spent:
        passes = False
    finally:
        shutil.rmtree(exp.scratch, ignore_errors=True)
    if not passes:
        return None
    out = exp.out
    out.baseline, out.culprits, out.confirmed = "not run", list(culprits), True
    out.seconds = time.monotonic() - exp.start
    out.note = "passes with only the cause an earlier experiment confirmed removed: the same cause"
    return out
