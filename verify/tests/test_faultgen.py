"""The fault generator: reproducible cases with their ground truth, a judge that can say every verdict, and
a CPU share of it run for real (each case in its own mount namespace, the stack's job and the doctor)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from doctor_testlib import TEST_TORCH, TEST_TRANSFORMERS, write_lock

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
import faultgen  # noqa: E402

# The CPU share CI runs: this seed, this many cases (a baseline and 4 cases fit about two minutes on two
# cores). The seed was chosen before the run, not tuned against its outcome.
SEED, COUNT = 20261207, 4


def test_same_seed_same_cases_and_every_case_carries_its_truth() -> None:
    a, b = faultgen.generate(11, 30, cpu=False), faultgen.generate(11, 30, cpu=False)
    assert [c.name for c in a] == [c.name for c in b]
    assert [c.name for c in faultgen.generate(12, 30, cpu=False)] != [c.name for c in a]
    for case in a:
        assert case.truths and all(t["kind"] in faultgen.KINDS and t["name"] for t in case.truths)
        if len(case.parts) == 2:
            assert case.parts[0].kind != case.parts[1].kind
    assert any(len(c.parts) == 2 for c in a), "pairs: two faults at once"


def test_the_universe_covers_every_kind_and_cpu_keeps_only_what_a_cpu_shows() -> None:
    assert {m.kind for m in faultgen.universe()} == set(faultgen.KINDS)
    limits = {m.name for m in faultgen.universe() if m.kind == "limit"}
    assert {"RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_AS", "RLIMIT_STACK"} <= limits
    cpu = faultgen.generate(3, 60, cpu=True)
    assert all(m.cpu for c in cpu for m in c.parts)


def _case(*muts: faultgen.Mutation) -> faultgen.Case:
    return faultgen.Case(0, muts)


FSIZE = next(m for m in faultgen.universe() if m.name == "RLIMIT_FSIZE")
ALLOC = next(m for m in faultgen.universe() if m.name == "PYTORCH_CUDA_ALLOC_CONF")
TMPDIR = next(m for m in faultgen.universe() if m.kind == "tmpdir")
FAILS, PASSES = {"model": "OSError: [Errno 27] File too large"}, {"model": "ok"}


def _report(*causes: tuple[str, str, str], experiment: dict | None = None) -> dict:
    probes = [{"name": p, "evidence": {"experiment": experiment} if experiment else {}} for p, _, _ in causes]
    return {
        "summary": {"root_causes": [{"probe": p, "code": c, "fix": f, "summary": ""} for p, c, f in causes]},
        "probes": probes,
    }


@pytest.mark.parametrize(
    "report,job,want",
    [
        (
            _report(("process_env", "RESOURCE_LIMIT_LOW", "raise RLIMIT_FSIZE where the job starts")),
            FAILS,
            "right",
        ),
        (
            _report(
                ("process_env", "RESOURCE_LIMIT_LOW", "ulimit -f unlimited"),
                ("c_compiler", "NO_C_COMPILER", "apt install gcc"),
            ),
            FAILS,
            "half",
        ),
        (_report(("fla_kernel", "FLA_KERNEL_FAILED", "read evidence.exception")), FAILS, "wrong"),
        (_report(), FAILS, "wrong"),
        (
            _report(
                ("gdn_backward", "RESOURCE_LIMIT_BREAKS", "see evidence"),
                experiment={
                    "confirmed": True,
                    "culprits": [{"kind": "limit", "name": "file_size", "value": "1048576"}],
                },
            ),
            FAILS,
            "right",
        ),
        (
            _report(
                ("model_config", "MODEL_LOAD_FAILED", "read evidence.exception; the reruns named no setting"),
                experiment={
                    "confirmed": False,
                    "culprits": [{"kind": "limit", "name": "file_size", "value": "1048576"}],
                },
            ),
            FAILS,
            "wrong",
        ),
        (_report(), PASSES, "no-false-red"),
        (_report(("process_env", "RESOURCE_LIMIT_LOW", "RLIMIT_FSIZE is low")), PASSES, "no-false-red"),
        (_report(("tmpdir", "TMPDIR_UNUSABLE", "mkdir -p /tmp")), PASSES, "false-red"),
    ],
    ids=[
        "right",
        "half",
        "wrong",
        "missed",
        "by-experiment",
        "unconfirmed",
        "quiet",
        "named-anyway",
        "false-red",
    ],
)
def test_judge_says_each_verdict(report: dict, job: dict, want: str) -> None:
    assert faultgen.verdict(_case(FSIZE), report, job)["verdict"] == want


def test_a_pair_is_right_only_when_both_are_named() -> None:
    both = _report(
        ("process_env", "ALLOC_CONF_INVALID", "unset PYTORCH_CUDA_ALLOC_CONF"),
        ("tmpdir", "TMPDIR_UNUSABLE", "export TMPDIR=/var/tmp"),
    )
    one = _report(("process_env", "ALLOC_CONF_INVALID", "unset PYTORCH_CUDA_ALLOC_CONF"))
    assert faultgen.verdict(_case(ALLOC, TMPDIR), both, FAILS)["verdict"] == "right"
    assert faultgen.verdict(_case(ALLOC, TMPDIR), one, FAILS)["verdict"] == "half"


def test_a_part_the_stack_does_not_notice_need_not_be_named() -> None:
    """TRITON_HOME under a TRITON_CACHE_DIR, paired with a uid without a passwd entry: the job fails for the
    uid alone, and a report naming the uid is right. Where neither part fails the job alone, both count."""
    user = next(m for m in faultgen.universe() if m.kind == "user")
    home = next(m for m in faultgen.universe() if m.name == "TRITON_HOME")
    report = _report(("process_env", "USER_UNKNOWN", "uid 4343 has no passwd entry"))
    case = _case(home, user)
    assert faultgen.verdict(case, report, FAILS)["verdict"] == "half"
    assert faultgen.verdict(case, report, FAILS, effective=(False, True))["verdict"] == "right"
    assert faultgen.verdict(case, report, FAILS, effective=(True, True))["verdict"] == "half"
    assert faultgen.verdict(case, report, FAILS, effective=(False, False))["verdict"] == "half"
    assert faultgen.verdict(case, _report(), FAILS, effective=(False, True))["verdict"] == "wrong"


def test_baseline_causes_are_the_machines_not_the_mutations() -> None:
    report = _report(("package_versions", "PACKAGE_MISSING", "pip install triton"))
    known = frozenset({("package_versions", "PACKAGE_MISSING")})
    assert faultgen.verdict(_case(ALLOC), report, PASSES, known) == {
        "verdict": "no-false-red",
        "stack_fails": False,
        "failed_steps": {},
        "named": [],
        "contradicted": [],
    }


@pytest.mark.parametrize(
    "fix,truth,contradicts",
    [
        ("python -m pip install 'triton==3.6.0'", FSIZE, True),
        (
            "read evidence.exception; retry with a fresh TRITON_CACHE_DIR to rule out a stale cache",
            FSIZE,
            True,
        ),
        ("unset PYTORCH_CUDA_ALLOC_CONF", ALLOC, False),
        (
            "remove the cache folder /w/cache",
            next(m for m in faultgen.universe() if m.kind == "cache"),
            False,
        ),
    ],
    ids=["version", "fresh-cache", "unset", "cache-truth"],
)
def test_contradicted_fixes(fix: str, truth: faultgen.Mutation, contradicts: bool) -> None:
    found = [{"probe": "p", "code": "C", "fix": fix}]
    assert bool(faultgen.contradicted(_case(truth), found)) is contradicts


needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("unshare", "setpriv", "mount", "prlimit")),
    reason="the generator injects with unshare -m, mount, setpriv and prlimit: needs root and util-linux",
)


@pytest.fixture
def open_profile() -> Iterator[Path]:
    """A profile lock matching the torch test venv, where the cases' other uids can read it."""
    folder = Path(tempfile.mkdtemp(prefix="faultgen-profile-"))
    os.chmod(folder, 0o755)
    write_lock(folder, {"torch": TEST_TORCH + "+cpu", "transformers": TEST_TRANSFORMERS})
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@needs_root
def test_cpu_share_for_real(torch_venv: Path, open_profile: Path, tmp_path: Path) -> None:
    out = tmp_path / "faultgen.json"
    argv = [sys.executable, str(BENCH / "faultgen.py"), "--seed", str(SEED), "--count", str(COUNT), "--cpu"]
    argv += ["--jobs", "2", "--python", str(torch_venv), "--profile", str(open_profile), "--json", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert out.is_file(), proc.stdout[-3000:] + proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    t = doc["totals"]
    said = proc.stdout[-4000:]
    assert len(doc["cases"]) == COUNT and t["not run"] == 0, said
    # The thresholds the judge can defend today: the doctor never turns red on a mutation that leaves the
    # stack working (a sitecustomize setting TMPDIR to a missing folder: tempfile and gcc fall back, a
    # warning), and no fix contradicts the ground truth. The right-share is printed, not asserted: these four
    # cases leave the stack working. Seeds 31, 53, 97, 4242 (10 cases), 777 (12): 15 right, 2 wrong of 17
    # where the stack fails; both wrong ones stop the interpreter itself (PYTHONHASHSEED='not-a-number',
    # ulimit -s 64), so no doctor runs to write a report.
    assert t["false-red"] == 0, said
    assert t["contradicted_fixes"] == 0, said
    assert proc.returncode == 0, said


def test_experiment_culprits_name_the_mutation_in_the_doctors_words() -> None:
    """experiment.py names a limit procenv's way (file_size), a folder by its path."""
    cache_dir = next(m for m in faultgen.universe() if m.name == "TRITON_CACHE_DIR" and "file" in m.how)
    assert faultgen.culprit_is(FSIZE, {"kind": "limit", "name": "file_size", "value": "1048576"})
    assert not faultgen.culprit_is(FSIZE, {"kind": "limit", "name": "open_files", "value": "24"})
    assert faultgen.culprit_is(cache_dir, {"kind": "cache", "name": "/w/triton_cache_dir-file", "value": ""})
    assert faultgen.culprit_is(ALLOC, {"kind": "env", "name": "PYTORCH_CUDA_ALLOC_CONF", "value": "garbage"})
    assert not faultgen.culprit_is(ALLOC, {"kind": "env", "name": "TORCH_LOGS", "value": "x"})


def test_a_long_draw_runs_in_parts_and_their_verdicts_add_up(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A lent GPU gives minutes per command: `--only A:B` runs a slice of the same draw, and `--totals`
    reads back the verdicts the parts appended, one table and one total over all of them."""
    draw = faultgen.generate(SEED, 6, cpu=False)
    assert faultgen.main(["--seed", str(SEED), "--count", "6", "--only", "2:4", "--list"]) == 0
    listed = [ln.split()[0] for ln in capsys.readouterr().out.splitlines()]
    assert listed == [c.name for c in draw[2:4]]
    parts = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    rows = [
        (parts[0], draw[0], "right", []),
        (parts[0], draw[1], "wrong", []),
        (parts[1], draw[2], "half", ["probe:CODE changes versions: pip install x==1"]),
    ]
    for path, case, verdict, contra in rows:
        j = faultgen.Judged(
            case.name, case.truths, "inj", verdict, True, {"job": "failed"}, contradicted=contra
        )
        with path.open("a") as f:
            f.write(json.dumps(faultgen.asdict(j)) + "\n")
    assert faultgen.main(["--totals", *map(str, parts)]) == 1  # a contradicted fix fails the run
    total = capsys.readouterr().out.splitlines()[-1]
    assert "right 1, half 1, wrong 1" in total and "contradicted_fixes 1" in total, total
