"""The fault matrix runner, for real on this machine: the rows that need no GPU, injected in their own
mount namespaces as root, judged from the doctor's real reports; and a row expecting the wrong code
must be reported as a mismatch (exit 1), since a runner that always says ok proves nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
import fault_matrix  # noqa: E402  (it puts tests/faults, where the rows live, on sys.path)
from fault_rows import ROWS, Row  # noqa: E402

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("unshare", "setpriv", "mount")),
    reason="the fault matrix injects with unshare -m, mount and setpriv: needs root and util-linux",
)

# cache_root_owned runs as uid 1000 (setpriv), through this machine's 0700 /root where the interpreter lives.
CPU_ROWS = (
    "no_cc,no_python_h,cache_ro,cache_root_owned,home_ro_cache_unset,model_shard_missing,two_failures,"
    "in_container_lxc"
)
# The process environment and the kernel caches, injected for real: limits (prlimit), identities
# (setpriv to a uid without a passwd entry), settings torch reads at start, start-up hooks (a
# sitecustomize on PYTHONPATH, a .pth in an overlay over site-packages), caches corrupted on disk.
PROCESS_ROWS = (
    "as_limit,nproc_low,nofile_low,uid_unknown,uid_unknown_user_set,home_unwritable,alloc_conf_bad_value,"
    "alloc_conf_unparsable,omp_threads_not_number,ld_preload_missing,libcuda_stub_named,"
    "sitecustomize_alloc_conf,sitecustomize_named,pth_hook_bad_path"
)
CACHE_ROWS = (
    "cache_cubin_empty,cache_cubin_truncated,cache_binary_missing,cache_metadata_truncated,"
    "inductor_cache_truncated,cache_repair"
)


def _outside() -> dict[str, object]:
    """What this process sees where the CPU rows mount: the mounts on those paths, Python.h, /run's marker."""
    include = Path(sysconfig.get_paths()["include"])
    marker = Path("/run/systemd/container")
    watched = (str(include), "/run", "/dev", str(Path(tempfile.gettempdir()) / "fault-matrix-"))
    mounts = sorted(
        line.split()[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if line.split()[4].startswith(watched)
    )
    return {
        "mounts": mounts,
        "python_h": (include / "Python.h").is_file(),
        "marker": marker.read_text() if marker.exists() else None,
    }


@needs_root
def test_cpu_rows_match_for_real(tmp_path: Path) -> None:
    before = _outside()
    out = tmp_path / "matrix.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH / "fault_matrix.py"),
            "--cpu",
            "--jobs",
            "2",
            "--only",
            CPU_ROWS,
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    rows = {r["name"]: r for r in json.loads(out.read_text())}
    assert set(rows) == set(CPU_ROWS.split(","))
    assert all(r["ok"] for r in rows.values()), proc.stdout[-3000:]
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert rows["two_failures"]["got"] == "c_compiler:NO_C_COMPILER, model_config:MODEL_WEIGHTS_INCOMPLETE"
    # The injections stayed in their namespaces: no_python_h bound an empty folder over the include dir,
    # in_container_lxc a tmpfs over /run; this process's mount table and those paths are as they were.
    assert _outside() == before


def _run_rows(tmp_path: Path, names: str) -> tuple[dict[str, dict], subprocess.CompletedProcess]:
    out = tmp_path / "matrix.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH / "fault_matrix.py"),
            "--cpu",
            "--jobs",
            "2",
            "--only",
            names,
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=400,
    )
    return {r["name"]: r for r in json.loads(out.read_text())}, proc


@needs_root
@pytest.mark.parametrize("names", [PROCESS_ROWS, CACHE_ROWS], ids=["process_env", "kernel_caches"])
def test_process_and_cache_rows_match_for_real(tmp_path: Path, names: str) -> None:
    rows, proc = _run_rows(tmp_path, names)
    assert set(rows) == set(names.split(","))
    bad = {n: (r["got"], r["detail"]) for n, r in rows.items() if not r["ok"]}
    assert not bad, proc.stdout[-3000:]
    assert proc.returncode == 0


@needs_root
def test_a_wrong_expectation_is_a_mismatch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wrong = Row(
        "cache_ro_expected_full",
        "a row whose expectation is wrong on purpose",
        "TRITON_CACHE_DIR=<read-only tmpfs>",
        ["triton_cache_dir:TRITON_CACHE_FULL"],
        setup='ro_tmpfs "$W/rocache"',
        env={"TRITON_CACHE_DIR": "{W}/rocache"},
        args=("--only", "triton_cache_dir"),
    )
    false_green = Row(
        "no_cc_expected_pass",
        "a broken toolchain that a row calls healthy",
        "PATH without a compiler",
        "pass",
        setup='mkdir -p "$W/nobin"',
        env={"PATH": "{W}/nobin"},
        unset=("CC",),
        args=("--only", "c_compiler"),
    )
    out = tmp_path / "m.json"
    rc = fault_matrix.main(["--cpu", "--json", str(out)], rows=[wrong, false_green])
    got = {r["name"]: r for r in json.loads(out.read_text())}
    assert rc == 1
    assert got["cache_ro_expected_full"]["ok"] is False
    assert got["cache_ro_expected_full"]["got"] == "triton_cache_dir:TRITON_CACHE_UNWRITABLE"
    assert got["no_cc_expected_pass"]["ok"] is False
    assert got["no_cc_expected_pass"]["got"] == "c_compiler:NO_C_COMPILER"
    assert "mismatched: ['cache_ro_expected_full', 'no_cc_expected_pass']" in capsys.readouterr().out


def _report(*causes: tuple[str, str, str]) -> dict:
    return {"summary": {"root_causes": [{"probe": p, "code": c, "fix": f} for p, c, f in causes]}}


def test_judge_wants_every_cause_and_no_other() -> None:
    row = Row("r", "", "", ["c_compiler:NO_C_COMPILER", "*:MODEL_WEIGHTS_INCOMPLETE"])
    both = _report(("c_compiler", "NO_C_COMPILER", ""), ("model_config", "MODEL_WEIGHTS_INCOMPLETE", ""))
    assert fault_matrix.judge(row, both, "/w")[1]
    assert not fault_matrix.judge(row, _report(("c_compiler", "NO_C_COMPILER", "")), "/w")[1]
    extra = _report(
        *[(c["probe"], c["code"], "") for c in both["summary"]["root_causes"]], ("tmpdir", "X", "")
    )
    assert fault_matrix.judge(row, extra, "/w")[2].startswith("unexpected: tmpdir:X")


def test_judge_checks_the_fix_text() -> None:
    row = Row(
        "r", "", "", ["triton_cache_dir:TRITON_CACHE_UNWRITABLE"], fix_lacks=("TRITON_CACHE_DIR={W}/home",)
    )
    under_home = _report(("triton_cache_dir", "TRITON_CACHE_UNWRITABLE", "export TRITON_CACHE_DIR=/w/home/c"))
    elsewhere = _report(("triton_cache_dir", "TRITON_CACHE_UNWRITABLE", "export TRITON_CACHE_DIR=/var/tmp/t"))
    assert not fault_matrix.judge(row, under_home, "/w")[1]
    assert fault_matrix.judge(row, elsewhere, "/w")[1]


def test_json_rows_read_report_paths() -> None:
    row = Row("r", "", "", json={"host.in_container": False, "probes.tmpdir.status": "pass"})
    report = {"host": {"in_container": False}, "probes": [{"name": "tmpdir", "status": "pass"}]}
    assert fault_matrix.judge(row, report, "/w")[1]
    assert not fault_matrix.judge(row, {"host": {"in_container": True}, "probes": []}, "/w")[1]


def test_a_cpu_json_row_fails_beside_a_false_root_cause() -> None:
    """The values a JSON row names are right, but a root cause nobody expects stands beside them: no match
    on CPU rows (on a GPU row the other causes depend on the machine's linker, and are not compared)."""
    values = {"host": {"in_container": True}, "probes": []}
    extra = {
        **values,
        "summary": {"root_causes": [{"probe": "tmpdir", "code": "TMPDIR_UNUSABLE", "fix": ""}]},
    }
    cpu = Row("r", "", "", json={"host.in_container": True})
    assert fault_matrix.judge(cpu, values, "/w")[1]
    got, ok, why = fault_matrix.judge(cpu, extra, "/w")
    assert (
        not ok
        and why == "unexpected: tmpdir:TMPDIR_UNUSABLE"
        and got.endswith("root causes: tmpdir:TMPDIR_UNUSABLE")
    )
    gpu = Row("r", "", "", json={"host.in_container": True}, gpu=True)
    assert fault_matrix.judge(gpu, extra, "/w")[1]


def test_every_row_is_well_formed() -> None:
    names = [r.name for r in ROWS]
    assert len(names) == len(set(names))
    for r in ROWS:
        if r.json:
            assert r.expect == "pass", f"{r.name}: a JSON row checks report values, not causes"
        elif not isinstance(r.expect, str):
            assert all(":" in e for e in r.expect), r.name
    cpu = fault_matrix.select(ROWS, None, cpu=True)
    assert cpu and not [r for r in cpu if r.gpu]
