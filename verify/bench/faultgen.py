#!/usr/bin/env python3
"""Faults nobody listed: a seeded generator of environment mutations whose ground truth is known by
construction, each injected for real and judged from the doctor's report.

A mutation is one change a user's environment can carry (a documented variable of torch, Triton, CUDA, NCCL
or inductor set to an invalid or contradictory value, a resource limit, a path turned into a file, made
read-only or unreachable, a kernel cache truncated or mixed, an identity without a passwd entry, a start-up
hook) or a pair of them. Each is injected the fault matrix's way (its own mount namespace, setpriv, the
rows' shell helpers) and, in that same namespace, two programs run: a small job of the stack
(tests/faults/workload.py: the ground truth of "the stack fails") and the doctor (--json).

The judge, per mutation:
  no-false-red  the job passes and the doctor names no root cause (or only the mutation itself)
  false-red     the job passes, the doctor fails on something else
  right         the job fails; every root cause names the mutation (code, fix or summary text, or the
                experiment's culprits in the failing probe's evidence); of a pair, every part that makes
                the job fail on its own is named (the job runs again with each part alone to tell; a
                part that fails it alone is inert here and need not be named; when neither does, both)
  half          the job fails; the mutation is named among root causes that name something else
  wrong         the job fails; the mutation is not named (or the doctor passes)
and, whatever the verdict, a fix is "contradicted" when it changes installed versions (pip install, ==)
or tells to retry with a fresh cache while the ground truth is no version and no cache fault.

  export PYTHONPATH=/tmp/site:$PWD/verify/src
  python3 verify/bench/faultgen.py --seed 7 --count 40 --jobs 4 --json faultgen.json     # GPU machine
  python3 verify/bench/faultgen.py --seed 7 --count 12 --cpu --python VENV/bin/python    # no GPU
A long draw runs in parts (a lent GPU gives minutes per command): `--only 0:5` then `--only 5:10` run
slices of the same draw, `--baseline-json` keeps the unmutated run's result for the next part, each part
appends its verdicts to `--jsonl` as they come, and `--totals FILE.jsonl` prints the table of them all.
Standard library only; runs as root. Exit 0 when no verdict is false-red or contradicted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fault_matrix import FAULTS, Matrix, Outcome, _quote, causes
from fault_rows import Row
from mutations import KINDS, Case, Mutation, generate, universe

__all__ = ["KINDS", "Case", "Mutation", "generate", "universe"]  # the cases, from the tests' data

WORKLOAD = FAULTS / "workload.py"
# --- the judge -------------------------------------------------------------------------------------------
VERSION_FIX = re.compile(r"pip install|uv (?:pip )?install|==\s*\d")
FRESH_CACHE_FIX = re.compile(
    r"fresh\s+(?:\w+\s+){0,3}(?:cache|TRITON_CACHE_DIR)|(?:clear|remove|delete)\s+(?:the\s+)?(?:\w+\s+)?cache",
    re.I,
)


def _texts(cause: dict[str, Any]) -> str:
    return " ".join(str(cause.get(k) or "") for k in ("code", "summary", "fix"))


def names(mutation: Mutation, cause: dict[str, Any], probe: dict[str, Any] | None) -> bool:
    """Does one root cause name the mutation: its culprits (the experiment) or its words?"""
    experiment = ((probe or {}).get("evidence") or {}).get("experiment") or {}
    # only a confirmed culprit is the doctor's answer; an unconfirmed one is what the narrowing left when the
    # confirmation did not hold or the budget ran out, and the report says it named no setting
    if experiment.get("confirmed") and any(culprit_is(mutation, c) for c in experiment.get("culprits") or []):
        return True
    text = _texts(cause)
    if mutation.kind == "user":
        return any(w.lower() in text.lower() for w in mutation.words)
    if mutation.kind == "limit":  # a phrase or a code, not a bare word ("data", "stack") every text has
        phrases = [w for w in mutation.words if " " in w or "_" in w or w.isupper()]
        return mutation.name in text or any(w.lower() in text.lower() for w in phrases)
    if mutation.kind == "cache":
        return mutation.name in text or "KERNEL_CACHE_CORRUPT" in text or "CACHE_BREAKS" in text
    if mutation.kind == "startup":
        return any(w.lower() in text.lower() for w in mutation.words) or "STARTUP_HOOK" in text
    return re.search(rf"(?<![A-Z_]){re.escape(mutation.name)}(?![A-Z_])", text) is not None


def culprit_is(mutation: Mutation, culprit: dict[str, Any]) -> bool:
    """Is an experiment's culprit ({kind, name, value}) this mutation? The experiment names a limit by the
    doctor's own word for it (file_size), a folder or a hook by its path, a variable by its name."""
    kind, name, value = culprit.get("kind"), str(culprit.get("name") or ""), str(culprit.get("value") or "")
    if mutation.kind == "limit":
        return kind == "limit" and (name == mutation.name or name in mutation.words)
    if mutation.kind in ("home", "tmpdir", "cache", "startup", "user"):
        return kind == mutation.kind
    # a variable: by its name, or (a folder variable) by the folder it names
    tails = [v.split("}")[-1] for k, v in mutation.env if k == mutation.name]
    return name == mutation.name or any(t and (name.endswith(t) or value.endswith(t)) for t in tails)


def contradicted(case: Case, found: list[dict[str, Any]]) -> list[str]:
    """Fixes the ground truth contradicts: a version change, or a fresh cache where no cache is at fault."""
    out = []
    cache_truth = any(m.kind == "cache" or "CACHE" in m.name for m in case.parts)
    for c in found:
        fix = str(c.get("fix") or "")
        if VERSION_FIX.search(fix):
            out.append(f"{c.get('probe')}:{c.get('code')} changes versions: {fix[:200]}")
        elif not cache_truth and FRESH_CACHE_FIX.search(fix):
            out.append(f"{c.get('probe')}:{c.get('code')} retries with a fresh cache: {fix[:200]}")
    return out


def verdict(
    case: Case,
    report: dict[str, Any] | None,
    job: dict[str, str] | None,
    baseline: frozenset[tuple[str, str]] = frozenset(),
    effective: tuple[bool, ...] | None = None,
) -> dict[str, Any]:
    """The verdict on one case, from the job's steps (the truth of failing) and the doctor's report.
    `effective`: of a pair, which parts make the job fail on their own (None: every part counts); only
    those must be named (a part the stack does not notice, e.g. TRITON_HOME under a TRITON_CACHE_DIR, has
    nothing to be named for)."""
    failed_steps = {k: v for k, v in (job or {}).items() if not k.endswith("_where") and v != "ok"}
    stack_fails = job is None or bool(failed_steps)
    if report is None:
        return {
            "verdict": "wrong",
            "why": "the doctor wrote no report",
            "stack_fails": stack_fails,
            "failed_steps": failed_steps,
            "contradicted": [],
        }
    # A root cause the unmutated baseline has too is the machine's own, not the mutation's.
    found = [c for c in causes(report) if (c.get("probe"), c.get("code")) not in baseline]
    probes = {p.get("name"): p for p in report.get("probes") or []}
    hits = [[names(m, c, probes.get(c.get("probe"))) for m in case.parts] for c in found]
    must = [i for i in range(len(case.parts)) if effective is None or not any(effective) or effective[i]]
    all_named = bool(found) and all(any(h[i] for h in hits) for i in must)
    every_cause_names = all(any(h) for h in hits)
    if not stack_fails:
        v = "no-false-red" if not found or every_cause_names else "false-red"
    elif all_named and every_cause_names:
        v = "right"
    elif any(any(h) for h in hits):
        v = "half"
    else:
        v = "wrong"
    return {
        "verdict": v,
        "stack_fails": stack_fails,
        "failed_steps": failed_steps,
        "named": [[m.name for m, hit in zip(case.parts, h, strict=True) if hit] for h in hits],
        "contradicted": contradicted(case, found),
    }


@dataclass
class Judged:
    case: str
    truth: list[dict[str, str]]
    injection: str
    verdict: str
    stack_fails: bool
    failed_steps: dict[str, str]
    root_causes: list[dict[str, Any]] = field(default_factory=list)
    contradicted: list[str] = field(default_factory=list)
    experiments: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    detail: str = ""


class Generated(Matrix):
    """The matrix's injection with the job run first, in the same namespace, environment, limits and uid."""

    def __init__(
        self, *args: Any, gpu_job: bool, cases: dict[str, Case], warm: Path | None = None, **kw: Any
    ) -> None:
        super().__init__(*args, **kw)
        self.gpu_job, self.cases, self.warm = gpu_job, cases, warm
        self.baseline: frozenset[tuple[str, str]] = frozenset()
        self.workload = self.root / "workload.py"
        shutil.copy(WORKLOAD, self.workload)
        config = self.src / "mlstack_doctor" / "configs" / "qwen3_5_tiny.json"
        self.job_args = ["--config", str(config)] + (["--gpu"] if gpu_job else [])
        self.judged: dict[str, Judged] = {}
        self.job_only: set[str] = set()  # rows that run the job and no doctor (a pair's parts alone)

    def run(self, row: Row) -> Outcome:
        # Each case's own Triton cache ($W/cache) starts as a copy of a warmed one: the GPU's kernels are
        # compiled once, not once per case, and a case that damages its cache damages its copy only.
        if self.warm is not None:
            shutil.copytree(self.warm, self.root / row.name / "cache", symlinks=True)
        return super().run(row)

    def before_doctor(self, row: Row, w: Path, env: dict[str, str]) -> list[str]:
        cmd = [
            *self.launch(row, w, env),
            self.python,
            str(self.workload),
            str(w / "job.json"),
            *self.job_args,
        ]
        return [" ".join(_quote(c) for c in cmd) + f' > "{w}/job.out" 2>&1 || true']

    def script(self, row: Row, w: Path) -> str:
        text = super().script(row, w)
        if row.name not in self.job_only:
            return text
        # the job alone: the last line runs the doctor
        return "\n".join(ln for ln in text.splitlines() if not ln.startswith("exec ")) + "\n"

    def effective(self, case: Case) -> tuple[bool, ...] | None:
        """Of a pair, whether each part alone makes the job fail (the job run in a namespace of its own with
        that part only; no doctor); None for a single mutation."""
        if len(case.parts) < 2:
            return None
        out = []
        for i, part in enumerate(case.parts):
            row = replace(Case(case.index, (part,)).row(), name=f"{case.name}~part{i}")
            self.job_only.add(row.name)
            self.run(row)
            job_file = self.root / row.name / "job.json"
            job = json.loads(job_file.read_text()) if job_file.is_file() else None
            out.append(job is None or any(v != "ok" for k, v in job.items() if not k.endswith("_where")))
        return tuple(out)

    def verdict(self, out: Outcome, row: Row, report: dict[str, Any], w: Path) -> None:
        self.judged[row.name] = self.judge(row, report, w)
        out.ok = self.judged[row.name].verdict in ("right", "no-false-red")

    def judge(self, row: Row, report: dict[str, Any] | None, w: Path) -> Judged:
        case = self.cases[row.name]
        job_file = w / "job.json"
        job = json.loads(job_file.read_text()) if job_file.is_file() else None
        v = verdict(case, report, job, self.baseline)
        if v["verdict"] in ("half", "wrong") and len(case.parts) > 1:
            effective = self.effective(case)
            v = verdict(case, report, job, self.baseline, effective)
            v["effective"] = effective
        if job is None:
            tail = (w / "job.out").read_text(errors="replace")[-300:] if (w / "job.out").is_file() else ""
            v["failed_steps"] = {"job": f"died before writing its result: {tail.strip()}"}
        experiments = [
            {"probe": p.get("name"), **(p.get("evidence") or {}).get("experiment", {})}
            for p in (report or {}).get("probes") or []
            if (p.get("evidence") or {}).get("experiment")
        ]
        cut = [
            {k: str(c.get(k) or "")[:300] for k in ("probe", "code", "summary", "fix")}
            for c in causes(report or {})
        ]
        judged = Judged(
            row.name,
            case.truths,
            row.injection,
            v["verdict"],
            v["stack_fails"],
            v["failed_steps"],
            cut,
            v["contradicted"],
            experiments,
        )
        if v.get("effective") is not None:
            judged.detail = "parts that fail the job alone: " + ", ".join(
                f"{m.name} {'yes' if e else 'no'}" for m, e in zip(case.parts, v["effective"], strict=True)
            )
        return judged


class BaselineFails(RuntimeError):
    """The stack's job fails with no mutation at all: nothing a mutation does can be judged."""


def run_cases(
    cases: list[Case],
    python: str,
    cpu: bool,
    jobs: int,
    keep: bool,
    profile: str | None,
    warm: Path | None = None,
    baseline_file: Path | None = None,
    jsonl: Path | None = None,
) -> tuple[Judged, list[Judged]]:
    """(the unmutated baseline, each case judged against it). `baseline_file`: the baseline's result, read
    when it exists (an earlier part of the same draw ran it), written when not. `jsonl`: each verdict
    appended as it comes, so a part cut short keeps what it judged."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    root = Path(tempfile.mkdtemp(prefix="fault-matrix-gen-"))
    base = Case(-1, ())
    by_name = {c.name: c for c in [base, *cases]}
    lock = threading.Lock()
    try:
        gen = Generated(python, "quick", cpu, root, profile, gpu_job=not cpu, cases=by_name, warm=warm)
        if baseline_file is not None and baseline_file.is_file():
            baseline = Judged(**json.loads(baseline_file.read_text()))
            print(f"  baseline: read from {baseline_file}", flush=True)
        else:
            o = gen.run(base.row())
            baseline = gen.judged.get(base.name) or gen.judge(base.row(), None, root / base.name)
            baseline.seconds = o.seconds
            if baseline_file is not None and not baseline.stack_fails:
                baseline_file.write_text(json.dumps(asdict(baseline)) + "\n")
        print(
            f"  baseline: job {'fails' if baseline.stack_fails else 'passes'}, root causes "
            + (", ".join(f"{c['probe']}:{c['code']}" for c in baseline.root_causes) or "none")
            + f" ({baseline.seconds:.0f} s)",
            flush=True,
        )
        if baseline.stack_fails:
            raise BaselineFails(f"the stack's job fails with no mutation: {baseline.failed_steps}")
        gen.baseline = frozenset((c["probe"], c["code"]) for c in baseline.root_causes)

        def one(case: Case) -> Judged:
            row = case.row()
            o = gen.run(row)
            j = gen.judged.get(row.name) or gen.judge(row, None, root / row.name)
            if o.ok is None:  # not run: the uid cannot read the stack
                j.verdict, j.detail = "not run", o.detail
            j.seconds = o.seconds
            print(f"  {case.name}: {j.verdict} ({o.seconds:.0f} s)", flush=True)
            if jsonl is not None:
                with lock, jsonl.open("a") as f:
                    f.write(json.dumps(asdict(j)) + "\n")
            return j

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            return baseline, list(pool.map(one, cases))
    finally:
        if keep:
            print(f"cases' folders kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


VERDICTS = ("right", "half", "wrong", "no-false-red", "false-red", "not run")


def totals(judged: list[Judged]) -> dict[str, Any]:
    count = Counter(j.verdict for j in judged)
    failing = sum(count[v] for v in ("right", "half", "wrong"))
    return {
        **{v: count[v] for v in VERDICTS},
        "stack_failed": failing,
        "right_share": round(count["right"] / failing, 3) if failing else None,
        "contradicted_fixes": sum(len(j.contradicted) for j in judged),
    }


def exit_code(t: dict[str, Any]) -> int:
    """0 when no verdict is false-red and no fix is contradicted, else 1."""
    return 1 if t["false-red"] or t["contradicted_fixes"] else 0


def print_table(judged: list[Judged], seed: int) -> None:
    print(f"\n{'case':<44} {'verdict':<13} {'s':>5}  truth -> root causes")
    for j in judged:
        truth = ", ".join(f"{t['kind']}:{t['name']}" for t in j.truth)
        got = ", ".join(f"{c['probe']}:{c['code']}" for c in j.root_causes) or "pass"
        print(f"{j.case[:44]:<44} {j.verdict:<13} {j.seconds:5.0f}  {truth} -> {got}")
        print(f"{'':<44} injection: {j.injection}")
        if j.failed_steps:
            print(
                f"{'':<44} the job failed: " + "; ".join(f"{k}: {v[:120]}" for k, v in j.failed_steps.items())
            )
        if j.detail:
            print(f"{'':<44} {j.detail}")
        for c in j.contradicted:
            print(f"{'':<44} CONTRADICTED: {c}")
    t = totals(judged)
    print(f"\nseed {seed}: " + ", ".join(f"{k} {v}" for k, v in t.items()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--count", type=int, default=20)
    p.add_argument("--cpu", action="store_true", help="only mutations a machine without a GPU can show")
    p.add_argument("--python", default=sys.executable, help="the interpreter under test (default: this one)")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--json", metavar="FILE", help="every case's verdict and the totals as JSON")
    p.add_argument("--list", action="store_true", help="print the cases the seed draws; run nothing")
    p.add_argument("--keep", action="store_true", help="keep the cases' folders")
    p.add_argument("--profile", default=None, help="the doctor's --profile (default: its own choice)")
    p.add_argument(
        "--warm-cache", type=Path, default=None, help="a warmed Triton cache each case starts from (a copy)"
    )
    p.add_argument("--only", metavar="A:B", help="run the draw's cases A to B-1 only (a part of a long draw)")
    p.add_argument("--baseline-json", type=Path, help="the unmutated run's result: read if there, else kept")
    p.add_argument("--jsonl", type=Path, help="append each verdict to this file as it comes")
    p.add_argument("--totals", type=Path, nargs="+", metavar="JSONL", help="print the saved verdicts' table")
    args = p.parse_args(argv)
    if args.totals:
        lines = [ln for f in args.totals for ln in f.read_text().splitlines() if ln.strip()]
        judged = [Judged(**json.loads(ln)) for ln in lines]
        print_table(judged, args.seed)
        return exit_code(totals(judged))
    cases = generate(args.seed, args.count, args.cpu)
    if args.only:
        first, _, last = args.only.partition(":")
        cases = cases[int(first or 0) : int(last) if last else None]
    if args.list:
        for c in cases:
            print(c.name, json.dumps(c.truths), "|", c.row().injection)
        return 0
    if os.geteuid() != 0:
        sys.stderr.write("faultgen: needs root (unshare -m, mounts, setpriv, prlimit)\n")
        return 2
    missing = [t for t in ("unshare", "setpriv", "mount", "prlimit") if shutil.which(t) is None]
    if missing:
        sys.stderr.write(f"faultgen: missing {', '.join(missing)}\n")
        return 2
    try:
        baseline, judged = run_cases(
            cases,
            args.python,
            args.cpu,
            args.jobs,
            args.keep,
            args.profile,
            args.warm_cache,
            args.baseline_json,
            args.jsonl,
        )
    except BaselineFails as exc:
        sys.stderr.write(f"faultgen: {exc}\n")
        return 2
    print_table(judged, args.seed)
    t = totals(judged)
    if args.json:
        doc = {
            "baseline": asdict(baseline),
            "seed": args.seed,
            "count": args.count,
            "cpu": args.cpu,
            "totals": t,
            "cases": [asdict(j) for j in judged],
        }
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    return exit_code(t)


if __name__ == "__main__":
    raise SystemExit(main())
