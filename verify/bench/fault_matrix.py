#!/usr/bin/env python3
"""Inject each fault real users hit, for real, and check the doctor names it (or, for a healthy case,
that it does not cry wolf).

Each row runs in its OWN mount namespace (`unshare -m`: tmpfs and bind mounts over real paths), with
its own environment and, where the row says so, another uid (`setpriv --clear-groups`); the doctor is a
fresh process (`--json --output`). The machine itself is never changed. Prints one line per row:
fault | injection | expected | got (every independent root cause: summary.root_causes) | ok | seconds.
Exit 0 only when every row that ran matches. Runs as root; standard library only, and PyYAML to write the
copied doctor's shipped profiles from profiles/ as its wheel build does (the doctor under test reads that
file: it never needs PyYAML, as in a container).

  export PYTHONPATH=/tmp/site:$PWD/verify/src
  python3 verify/bench/fault_matrix.py --jobs 4 --json matrix.json        # a GPU machine: every row
  python3 verify/bench/fault_matrix.py --cpu                              # no GPU: the rows that need none
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# The rows are test data: they live with the tests (verify/tests/faults/).
FAULTS = Path(__file__).resolve().parents[1] / "tests" / "faults"
sys.path.insert(0, str(FAULTS))
from fault_rows import PRELUDE, ROWS, Row  # noqa: E402

SRC = Path(__file__).resolve().parents[1] / "src"
PROFILES = Path(__file__).resolve().parents[2] / "profiles"


def write_shipped(package: Path) -> None:
    """The doctor's shipped_profiles.json in `package` (a copy of mlstack_doctor), written from profiles/
    as the doctor's wheel build writes it: a copy has no profiles/ beside it, and a file left in the
    checkout by an earlier build may be stale."""
    if str(SRC) not in sys.path:
        sys.path.insert(0, str(SRC))
    from mlstack_doctor import profile

    data = profile.shipped_from(PROFILES)
    (package / profile.SHIPPED_FILE).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


@dataclass
class Outcome:
    name: str
    users: str
    injection: str
    expected: str
    got: str
    ok: bool | None  # None: not run (what it needs is not installed)
    seconds: float
    rc: int | None
    detail: str = ""
    # what the report said, kept small: each root cause (with its consequences) and each probe's verdict
    causes: list[dict[str, Any]] | None = None
    probes: list[dict[str, Any]] | None = None


def expected_text(row: Row) -> str:
    if row.json:
        return ", ".join(f"{k}={json.dumps(v)}" for k, v in row.json.items())
    return row.expect if isinstance(row.expect, str) else ", ".join(row.expect)


def causes(report: dict[str, Any]) -> list[dict[str, Any]]:
    summary = report.get("summary") or {}
    if "root_causes" in summary:
        return list(summary["root_causes"] or [])
    return [summary["root_cause"]] if summary.get("root_cause") else []


def lookup(report: dict[str, Any], path: str) -> Any:
    """A dotted path; under `probes` a key is a probe's name (probes.nvidia_driver.evidence.x)."""
    node: Any = report
    for key in path.split("."):
        if isinstance(node, list):
            node = next((p for p in node if isinstance(p, dict) and p.get("name") == key), None)
        elif isinstance(node, dict):
            node = node.get(key)
        else:
            return None
    return node


def judge(row: Row, report: dict[str, Any], w: str) -> tuple[str, bool, str]:
    """(got, ok, why) for one report."""
    found = causes(report)
    named, ok, why = _causes_match(row, found, w)
    if not row.json:
        return named, ok, why
    values = {k: lookup(report, k) for k in row.json}
    got = ", ".join(f"{k}={json.dumps(v)}" for k, v in values.items())
    if values != row.json:
        return got, False, ""
    if row.gpu:  # a GPU row's other causes depend on the machine (a linker that still finds libcuda)
        return got, True, ""
    # A CPU row's root causes are compared too: the value it names beside a false root cause is no match.
    return f"{got}; root causes: {named}", ok, why


def _causes_match(row: Row, found: list[dict[str, Any]], w: str) -> tuple[str, bool, str]:
    """(got, ok, why): every root cause the row expects, with its fix text, and no other."""
    got = ", ".join(f"{c.get('probe')}:{c.get('code')}" for c in found) or "pass"
    if row.expect == "pass":
        return got, not found, "" if not found else "unexpected: " + got
    want = list(row.expect)
    unmatched = list(found)
    for spec in want:
        probe, code = spec.split(":", 1)
        hit = next((c for c in unmatched if c.get("code") == code and probe in ("*", c.get("probe"))), None)
        if hit is None:
            return got, False, f"{spec} not reported"
        unmatched.remove(hit)
        fix = str(hit.get("fix") or "")
        for text in row.fix_has:
            if text.replace("{W}", w) not in fix:
                return got, False, f"fix lacks {text!r}: {fix}"
        for text in row.fix_lacks:
            if text.replace("{W}", w) in fix:
                return got, False, f"fix names {text.replace('{W}', w)!r}: {fix}"
    if unmatched:
        return got, False, "unexpected: " + ", ".join(f"{c.get('probe')}:{c.get('code')}" for c in unmatched)
    return got, True, ""


class Matrix:
    def __init__(self, python: str, tier: str, cpu: bool, root: Path, profile: str | None) -> None:
        self.python, self.tier, self.cpu, self.root, self.profile = python, tier, cpu, root, profile
        # The doctor's source copied where any uid can read it (a checkout under /root is not).
        self.src = root / "src"
        shutil.copytree(SRC, self.src, ignore=shutil.ignore_patterns("__pycache__"))
        write_shipped(self.src / "mlstack_doctor")
        os.chmod(root, 0o755)
        self.installed = self._installed()

    def _pythonpath(self, base: str | None = None) -> str:
        rest = os.environ.get("PYTHONPATH", "") if base is None else base
        keep = [p for p in rest.split(os.pathsep) if p and Path(p).resolve() != SRC.resolve()]
        return os.pathsep.join([str(self.src), *keep])

    def _without_fla(self) -> str:
        rest = os.environ.get("PYTHONPATH", "").split(os.pathsep)
        return self._pythonpath(os.pathsep.join(p for p in rest if p and not Path(p, "fla").is_dir()))

    def _installed(self) -> set[str]:
        code = (
            "import importlib.metadata as m, json\n"
            "out = []\n"
            "for d in ('torch', 'triton', 'fla-core', 'flash-linear-attention', 'transformers'):\n"
            "    try: m.version(d); out.append(d)\n"
            "    except m.PackageNotFoundError: pass\n"
            "print(json.dumps(out))"
        )
        env = dict(os.environ, PYTHONPATH=self._pythonpath())
        proc = subprocess.run([self.python, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        return set(json.loads(proc.stdout)) if proc.returncode == 0 else set()

    def closed_dirs(self) -> list[str]:
        """Folders above the interpreter and PYTHONPATH that other uids cannot traverse (a 0700 /root):
        rows run as another uid open them in their own namespace only (open_dir)."""
        out: list[str] = []
        for path in [os.path.realpath(self.python), *self._pythonpath().split(os.pathsep)]:
            for parent in reversed(Path(path).parents):
                p = str(parent)
                if p != "/" and os.path.isdir(p) and not os.stat(p).st_mode & 0o001 and p not in out:
                    out.append(p)
        return out

    def opening(self) -> str:
        return "".join(f'open_dir "{d}"\n' for d in self.closed_dirs())

    def _unreadable(self, row: Row) -> str:
        """Why row.user cannot run the stack under test even so, else ''."""
        code = "import importlib.metadata as m\n" + "".join(f"m.version({d!r})\n" for d in row.needs)
        w = self.root / f"{row.name}.check"
        w.mkdir()
        argv = [*setpriv(row.user), "env"]
        argv += [self.python, "-c", code]
        script = "\n".join(["set -eu", PRELUDE, self.opening(), "exec " + " ".join(_quote(c) for c in argv)])
        env = dict(os.environ, PYTHONPATH=self._pythonpath(), HOME="/", W=str(w))
        proc = subprocess.run(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            cwd="/",
        )
        if proc.returncode == 0:
            return ""
        tail = (proc.stderr.strip().splitlines() or [f"rc {proc.returncode}"])[-1]
        return f"uid {row.user} cannot run {self.python} with the stack (give it read access): {tail}"

    def script(self, row: Row, w: Path) -> str:
        env = dict(row.env)
        if row.user is not None:
            env.setdefault("HOME", "{W}/home")
        lines = ["set -eu", PRELUDE, f'cd "{w}"', row.setup, f'cd "{w / (row.cwd or "")}"']
        if row.user is not None:  # before the row's own setup: a /dev copy must see the real /dev
            lines.insert(3, self.opening())
        args = ["--tier", self.tier, "--quiet", "--json", "--output", str(w / "report.json")]
        if self.profile:
            args += ["--profile", self.profile]
        if self.cpu:
            args.append("--no-gpu")
        args += [a.replace("{W}", str(w)) for a in row.args]  # a later --tier wins over the first
        cmd = [*self.launch(row, w, env), self.python, "-m", "mlstack_doctor", *args]
        lines += self.before_doctor(row, w, env)
        lines.append("exec " + " ".join(_quote(c) for c in cmd) + f' > "{w}/doctor.out" 2>&1')
        return "\n".join(lines) + "\n"

    def launch(self, row: Row, w: Path, env: dict[str, str]) -> list[str]:
        """The argv prefix that runs a program as the row says: its uid, its variables set and unset."""
        cmd = []
        if row.user is not None:
            cmd += setpriv(row.user)
        cmd += ["env", *[f"--unset={u}" for u in row.unset]]
        for key, value in env.items():
            value = value.replace("{W}", str(w)).replace("{PYTHONPATH_WITHOUT_FLA}", self._without_fla())
            value = value.replace("{PYTHONPATH}", self._pythonpath())
            value = value.replace("{LD_LIBRARY_PATH}", os.environ.get("LD_LIBRARY_PATH", ""))
            cmd.append(f"{key}={value}")
        return cmd

    def before_doctor(self, row: Row, w: Path, env: dict[str, str]) -> list[str]:
        """Shell lines run in the row's namespace, after its setup, before the doctor (none here)."""
        return []

    def run(self, row: Row) -> Outcome:
        base = Outcome(row.name, row.users, row.injection, expected_text(row), "", None, 0.0, None)
        lacking = [d for d in row.needs if d not in self.installed]
        if lacking:
            base.got, base.detail = "not run", f"needs {', '.join(lacking)}"
            return base
        if row.user is not None and (why := self._unreadable(row)):
            base.got, base.detail = "not run", why
            return base
        w = self.root / row.name
        (w / "home").mkdir(parents=True)
        if row.user is not None:
            for p in (w, w / "home"):
                os.chown(p, row.user, row.user)
        os.chmod(w, 0o755)
        env = dict(os.environ, PYTHONPATH=self._pythonpath(), W=str(w), PY=self.python, SRC=str(self.src))
        env.setdefault("TRITON_CACHE_DIR", str(w / "cache"))
        env.setdefault(
            "TORCHINDUCTOR_CACHE_DIR", str(w / "inductor")
        )  # not the machine's /tmp/torchinductor_*
        if row.user is not None:
            env["TRITON_CACHE_DIR"] = str(w / "home" / "cache")
        script = self.script(row, w)
        (w / "run.sh").write_text(script)
        t0 = time.monotonic()
        proc = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=row.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            out = f"timed out after {row.timeout:.0f} s\n{out}"
        base.seconds = round(time.monotonic() - t0, 1)
        base.rc = proc.returncode
        report_file = w / "report.json"
        if not report_file.is_file():
            doctor_out = (
                (w / "doctor.out").read_text(errors="replace") if (w / "doctor.out").is_file() else ""
            )
            base.got, base.ok = f"no report (rc {proc.returncode})", False
            base.detail = (out + doctor_out).strip()[-600:]
            return base
        self.verdict(base, row, json.loads(report_file.read_text()), w)
        return base

    def verdict(self, out: Outcome, row: Row, report: dict[str, Any], w: Path) -> None:
        """Judge the row's report into `out`."""
        out.got, out.ok, out.detail = judge(row, report, str(w))
        out.causes, out.probes = digest(report)


def digest(report: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The report's root causes and probe verdicts, cut to what a reader of the matrix needs."""
    cut = {"summary": 400, "fix": 400}
    found = [
        {k: (str(v)[: cut[k]] if k in cut and v else v) for k, v in c.items() if k != "stage"}
        for c in causes(report)
    ]
    probes = []
    for p in report.get("probes") or []:
        if p.get("status") == "skip" and not p.get("skipped_by"):
            continue
        ev = p.get("evidence") or {}
        row = {
            "name": p.get("name"),
            "status": p.get("status"),
            "code": p.get("code"),
            "summary": str(p.get("summary") or "")[:300],
        }
        for key in (
            "exception",
            "signal",
            "stderr_last_lines",
            "classified_from",
            "reduced_env_rerun",
            "libcuda",
        ):
            if ev.get(key):
                row[key] = ev[key] if key != "exception" else str(ev[key])[-600:]
        if p.get("status") in ("fail", "warn") and ev.get("stderr_tail"):
            row["stderr_tail"] = str(ev["stderr_tail"])[-800:]
        probes.append(row)
    return found, probes


def setpriv(uid: int) -> list[str]:
    # --no-new-privs: no setuid helper (nvidia-modprobe) may create a node the row took away, as in an
    # unprivileged container, where nothing can mknod.
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs"]


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def select(rows: list[Row], only: str | None, cpu: bool) -> list[Row]:
    names = [n.strip() for n in only.split(",") if n.strip()] if only else None
    if names:
        unknown = set(names) - {r.name for r in rows}
        if unknown:
            raise SystemExit(f"fault_matrix: unknown row(s) {sorted(unknown)}")
    return [r for r in rows if (names is None or r.name in names) and not (cpu and r.gpu)]


def print_table(outcomes: list[Outcome]) -> None:
    print(f"\n{'fault':<26} {'ok':<4} {'s':>6}  expected -> got")
    for o in outcomes:
        mark = {True: "ok", False: "FAIL", None: "-"}[o.ok]
        print(f"{o.name:<26} {mark:<4} {o.seconds:6.1f}  {o.expected} -> {o.got}")
        print(f"{'':<26} injection: {o.injection}")
        if o.detail:
            print(f"{'':<26} {o.detail.splitlines()[-1][:300] if o.detail.strip() else ''}")
    bad = [o.name for o in outcomes if o.ok is False]
    ran = [o for o in outcomes if o.ok is not None]
    skipped = len(outcomes) - len(ran)
    print(f"\n{len(ran) - len(bad)}/{len(ran)} rows match; not run: {skipped}; mismatched: {bad}")


def main(argv: list[str] | None = None, rows: list[Row] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", metavar="ROW[,ROW]", help="run only these rows")
    p.add_argument("--jobs", type=int, default=1, help="rows run at once (they are independent)")
    p.add_argument("--json", metavar="FILE", help="write every row's outcome as JSON")
    p.add_argument("--tier", default="quick", help="the doctor's tier for rows that do not set one")
    p.add_argument(
        "--cpu", action="store_true", help="only the rows that need no GPU; the doctor runs --no-gpu"
    )
    p.add_argument("--python", default=sys.executable, help="the interpreter under test (default: this one)")
    p.add_argument("--profile", default=None, help="the doctor's --profile for every row")
    p.add_argument("--keep", action="store_true", help="keep the rows' folders (scripts, reports, output)")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        sys.stderr.write("fault_matrix: needs root (unshare -m, mounts, setpriv)\n")
        return 2
    missing = [t for t in ("unshare", "setpriv", "mount") if shutil.which(t) is None]
    if missing:
        sys.stderr.write(f"fault_matrix: missing {', '.join(missing)}\n")
        return 2
    chosen = select(rows if rows is not None else ROWS, args.only, args.cpu)
    root = Path(tempfile.mkdtemp(prefix="fault-matrix-"))
    try:
        matrix = Matrix(args.python, args.tier, args.cpu, root, args.profile)

        def one(row: Row) -> Outcome:
            o = matrix.run(row)
            mark = {True: "ok", False: "FAIL", None: "not run"}[o.ok]
            print(f"  {row.name}: {mark} {o.seconds:.1f} s  got {o.got}", flush=True)
            return o

        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            outcomes = list(pool.map(one, chosen))
    finally:
        if args.keep:
            print(f"rows' folders kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print_table(outcomes)
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(o) for o in outcomes], indent=2) + "\n")
    bad = [o for o in outcomes if o.ok is False or (o.ok is None and not args.cpu)]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
