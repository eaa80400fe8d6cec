"""The node's collector (python -m mlstack_doctor.ops.node_metrics): each running container's doctor.prom read
with lxc-attach, strictly parsed, relabelled with its vmid and merged into one file for the node's
node_exporter. The container read is the boundary: stubbed by an injected reader, or by a fake lxc-attach
script for the real reader (timeouts, size limit, lxc-attach's errors). No LXC is touched here; the
output is checked with test_metrics' strict exposition parser and, where installed, promtool. The last
test builds the wheel and runs the module from it by zip import, as the node does."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from doctor_testlib import VERIFY
from mlstack_doctor.ops import metrics, node_metrics
from mlstack_doctor.ops.node_metrics import NoFile, ReadError
from test_metrics import one, parse_strict, report, values

Entry = str | Exception


def doctor_file(*tiers: tuple[str, bool]) -> str:
    """A doctor.prom as the doctor writes it: the last run of each (tier, ok)."""
    return metrics.render(
        [s for tier, ok in tiers for s in metrics.from_report(report(tier=tier, ok=ok), duration_s=2)]
    )


def stub(files: dict[str, Entry]) -> Callable[[str], str]:
    """A reader: the container's text, or the error it raises; a container not listed has no file."""

    def read(vmid: str) -> str:
        entry = files.get(vmid, NoFile(f"cat: {node_metrics.CONTAINER_FILE}: No such file or directory"))
        if isinstance(entry, Exception):
            raise entry
        return entry

    return read


def run(
    tmp_path: Path, containers: str, files: dict[str, Entry], capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    """main() with `files` as the containers' texts: its exit status, the file written and stdout."""
    out = tmp_path / "textfile" / "mlstack.prom"
    rc = node_metrics.main(["--out", str(out), "--containers", containers], reader=stub(files))
    return rc, out.read_text() if out.exists() else "", capsys.readouterr().out


def test_two_containers_are_merged_with_their_vmid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    t0 = time.time()
    rc, text, said = run(
        tmp_path,
        "102,101",
        {"101": doctor_file(("quick", False), ("fast", True)), "102": doctor_file(("fast", True))},
        capsys,
    )
    assert rc == 0
    series, types, helps = parse_strict(text)  # HELP and TYPE once per family, each family together
    assert one(series, "mlstack_doctor_ok", vmid="101", tier="quick")[1] == 0
    assert one(series, "mlstack_doctor_ok", vmid="101", tier="fast")[1] == 1
    assert one(series, "mlstack_doctor_ok", vmid="102", tier="fast")[1] == 1
    assert values(series, "mlstack_doctor_ok") and all(
        "vmid" in lab for lab, _ in values(series, "mlstack_doctor_ok")
    )
    assert one(series, "mlstack_doctor_probe_ok", vmid="101", tier="quick", probe="torch_cuda")[0][
        "code"
    ] == ("CUDA_UNAVAILABLE")
    assert one(series, "mlstack_doctor_stack_info", vmid="102")[0]["torch"] == "2.11.0"
    assert [(lab, v) for lab, v in values(series, "mlstack_node_container_metrics_ok")] == [
        ({"vmid": "101"}, 1),
        ({"vmid": "102"}, 1),
    ]
    assert t0 <= one(series, "mlstack_node_metrics_last_run_timestamp_seconds")[1] <= time.time()
    assert set(types.values()) == {"gauge"} and all(helps[n] for n in types)
    # Every series of one container is the container's, label for label, with the vmid added.
    own = {(s.name, s.labels) for s in metrics.parse(doctor_file(("fast", True)))}
    mine = {
        (n, tuple(kv for kv in labels if kv[0] != "vmid"))
        for (n, labels), _ in series.items()
        if dict(labels).get("vmid") == "102" and n.startswith("mlstack_doctor_")
    }
    assert mine == {(n, tuple(sorted(labels))) for n, labels in own}
    # One line per container, in vmid order, then the file.
    lines = said.splitlines()
    assert lines[0].startswith("101: ok, ") and lines[1].startswith("102: ok, ")
    assert lines[2] == f"wrote {tmp_path / 'textfile' / 'mlstack.prom'}: 2 of 2 containers read"


def test_a_vmid_the_container_wrote_is_replaced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    forged = (
        '# TYPE mlstack_doctor_ok gauge\nmlstack_doctor_ok{vmid="102",tier="fast"} 1\n'
        'mlstack_doctor_failed_probes{tier="fast",vmid="999"} 0\n'
        # The node's own families are not the container's to write: another container's verdict.
        'mlstack_node_container_metrics_ok{vmid="102"} 1\n'
        "mlstack_node_metrics_last_run_timestamp_seconds 1\n"
    )
    rc, text, said = run(tmp_path, "101,102", {"101": forged}, capsys)
    assert rc == 0
    series, _, _ = parse_strict(text)
    assert one(series, "mlstack_doctor_ok", tier="fast") == ({"vmid": "101", "tier": "fast"}, 1)
    assert one(series, "mlstack_doctor_failed_probes")[0] == {"vmid": "101", "tier": "fast"}
    assert one(series, "mlstack_node_container_metrics_ok", vmid="102")[1] == 0
    assert one(series, "mlstack_node_metrics_last_run_timestamp_seconds")[1] > 1
    assert "101: ok, 2 series, 2 samples of other families dropped" in said


def test_two_series_that_differ_only_by_vmid_refuse_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    twins = 'mlstack_doctor_ok{tier="fast",vmid="1"} 1\nmlstack_doctor_ok{tier="fast",vmid="2"} 0\n'
    rc, text, said = run(tmp_path, "101", {"101": twins}, capsys)
    series, _, _ = parse_strict(text)  # would be a duplicate series, failing the whole file at the node
    assert rc == 0 and values(series, "mlstack_doctor_ok") == []
    assert one(series, "mlstack_node_container_metrics_ok", vmid="101")[1] == 0
    assert "101: unparsable, nothing kept: two series are the same" in said


GOOD = 'mlstack_doctor_ok{tier="fast"} 1\n'


@pytest.mark.parametrize(
    "bad",
    [
        "this is not a metric\n",
        'mlstack_doctor_ok{tier="fast"} 1 1700000000000\n',  # a timestamp
        'mlstack_doctor_ok{tier="fa\\tst"} 1\n',  # an escape the format lacks
        'mlstack_doctor_ok{tier="fast} 1\n',  # unterminated
        'mlstack_doctor_ok{tier="fast",tier="quick"} 1\n',  # a label twice
        'mlstack_doctor_ok{__name__="x",tier="quick"} 1\n',  # reserved
        'mlstack_doctor_ok{tier="quick"} 1_0\n',  # Python's float() takes it, Prometheus does not
        'mlstack_doctor_ok{tier="quick"} infinity\n',
        'mlstack_doctor_ok{tier="fast"} 0\n',  # GOOD's series again
        'node_cpu_seconds_total{cpu="0"} x\n',  # malformed, even in a family that would be dropped
    ],
)
def test_a_malformed_line_refuses_the_whole_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    rc, text, said = run(tmp_path, "101,102", {"101": GOOD + bad, "102": GOOD}, capsys)
    series, _, _ = parse_strict(text)
    assert rc == 0
    assert [lab["vmid"] for lab, _ in values(series, "mlstack_doctor_ok")] == ["102"]
    assert one(series, "mlstack_node_container_metrics_ok", vmid="101")[1] == 0
    assert one(series, "mlstack_node_container_metrics_ok", vmid="102")[1] == 1
    assert "101: unparsable, nothing kept: line 2: " in said


def test_well_formed_samples_of_other_families_are_dropped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A newer doctor's family, or anything else: not the node's to pass on, and no reason to drop the rest.
    extra = (
        "# HELP node_load1 forged\n# TYPE node_load1 gauge\nnode_load1 99\n"
        'mlstack_doctor_future_thing{tier="fast"} 1\n'
    )
    rc, text, said = run(tmp_path, "101", {"101": GOOD + extra}, capsys)
    series, _, _ = parse_strict(text)
    assert rc == 0 and {n for n, _ in series} == {
        "mlstack_doctor_ok",
        "mlstack_node_container_metrics_ok",
        "mlstack_node_metrics_last_run_timestamp_seconds",
    }
    assert "101: ok, 1 series, 2 samples of other families dropped" in said


def test_a_container_without_a_file_or_unreadable_is_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files: dict[str, Entry] = {
        "101": GOOD,
        "103": ReadError("timed out after 10 s"),
        "104": "",  # an empty file is read and parsed: the doctor's own alerts see its series absent
    }
    rc, text, said = run(tmp_path, "101,102,103,104", files, capsys)
    series, _, _ = parse_strict(text)
    assert rc == 0
    ok = {lab["vmid"]: v for lab, v in values(series, "mlstack_node_container_metrics_ok")}
    assert ok == {"101": 1, "102": 0, "103": 0, "104": 1}
    assert [lab["vmid"] for lab, _ in values(series, "mlstack_doctor_ok")] == ["101"]
    assert f"102: no metrics file yet ({node_metrics.CONTAINER_FILE})" in said
    assert "103: unreadable: timed out after 10 s" in said
    assert "wrote " in said and "2 of 4 containers read" in said


def test_no_running_container_still_writes_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, text, said = run(tmp_path, "", {}, capsys)
    series, _, _ = parse_strict(text)
    assert rc == 0 and [n for n, _ in series] == ["mlstack_node_metrics_last_run_timestamp_seconds"]
    assert said.splitlines() == [f"wrote {tmp_path / 'textfile' / 'mlstack.prom'}: 0 of 0 containers read"]


def test_the_containers_come_from_lxc_ls_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "mlstack.prom"
    rc = node_metrics.main(
        ["--out", str(out)], reader=stub({"99": GOOD}), lister=lambda: ["1000", "99", "101"]
    )
    series, _, _ = parse_strict(out.read_text())
    assert rc == 0
    assert [lab["vmid"] for lab, _ in values(series, "mlstack_node_container_metrics_ok")] == [
        "1000",
        "101",
        "99",
    ]
    # Read and said in vmid order (the file sorts label values as text).
    assert [line.split(":")[0] for line in capsys.readouterr().out.splitlines()[:3]] == ["99", "101", "1000"]

    def broken() -> list[str]:
        raise ReadError("lxc-ls exit 1: lxc-ls: no permission")

    before = out.read_text()
    assert node_metrics.main(["--out", str(out)], reader=stub({}), lister=broken) == 2
    assert "cannot list the containers: lxc-ls exit 1" in capsys.readouterr().err
    assert out.read_text() == before, "the previous file is left for its timestamp to go stale"


@pytest.mark.parametrize(
    "argv",
    [
        ["--containers", "101,-n"],
        ["--containers", "10 1"],
        ["--containers", "../101"],
        ["--timeout", "0"],
        ["--timeout", "soon"],
        ["--lxc-attach", "/nonexistent/lxc-attach", "--containers", "101"],
        ["--bogus"],
    ],
)
def test_bad_arguments_are_exit_2(tmp_path: Path, argv: list[str]) -> None:
    out = tmp_path / "mlstack.prom"
    reader = None if "--lxc-attach" in argv else stub({})
    try:
        rc = node_metrics.main(["--out", str(out), *argv], reader=reader, lister=lambda: [])
    except SystemExit as exc:  # argparse's own refusals
        rc = exc.code  # type: ignore[assignment]
    assert rc == 2 and not out.exists()


def test_an_unwritable_output_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    rc = node_metrics.main(["--out", str(blocker / "mlstack.prom"), "--containers", "101"], reader=stub({}))
    assert rc == 2 and f"cannot write {blocker / 'mlstack.prom'}" in capsys.readouterr().err


def test_the_strict_parse_names_the_line_and_the_lenient_one_is_unchanged() -> None:
    text = GOOD + "garbage\n" + 'mlstack_doctor_ok{tier="quick"} 1_0\n'
    assert [s.label("tier") for s in metrics.parse(text)] == ["fast", "quick"]  # the doctor's own reading
    with pytest.raises(ValueError, match=r"^line 2: not a sample line"):
        metrics.parse(text, strict=True)
    nasty = 'a"quote\\back\nline}{,="'
    own = metrics.render(metrics.from_report(report(profile_name=nasty)))
    assert metrics.parse(own, strict=True) == metrics.parse(own)
    special = (
        'mlstack_doctor_ok{tier="a",} NaN\n'  # a trailing comma is allowed
        'mlstack_doctor_ok{tier="b"} +Inf\n'
        'mlstack_doctor_ok{tier="c"} -1.5e-3\n'
    )
    assert [s.value for s in metrics.parse(special, strict=True)][1:] == [float("inf"), -0.0015]


def test_a_long_hostile_line_is_refused_quickly() -> None:
    # The size limit bounds the input; the parse of that much stays linear (no regex backtracking blow-up).
    for line in (
        "mlstack_doctor_ok{" + "} " * 100_000 + "1",
        'mlstack_doctor_ok{tier="' + "\\" * 200_000 + '"} 1',
        "mlstack_doctor_ok{" + 'a="1",' * 30_000 + "} 1",
    ):
        t0 = time.monotonic()
        with pytest.raises(ValueError):
            metrics.parse(line + "\n" + line + "\n", strict=True)
        assert time.monotonic() - t0 < 5


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool not installed (apt-get install prometheus)"
)
def test_promtool_reads_the_node_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    skipped = tmp_path / "skipped.prom"
    metrics.write(skipped, report(tier="quick", profile_name='we"ird\\name'), duration_s=3)
    metrics.write_run_skipped(skipped, "quick", "gpu_busy")
    files: dict[str, Entry] = {
        "101": doctor_file(("fast", True), ("quick", False)),
        "102": skipped.read_text(),
    }
    rc, text, _ = run(tmp_path, "101,102,103", files, capsys)
    assert rc == 0
    r = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), r.stdout + r.stderr


FAKE_ATTACH = """#!/bin/sh
# lxc-attach -n VMID --clear-env -- cat FILE, answered from {root}/VMID.*
if [ $# -ne 6 ] || [ "$1 $3 $4 $5 $6" != "-n --clear-env -- cat {file}" ]; then
  echo "bad argv: $*" >&2
  exit 99
fi
d={root}/$2
if [ -e "$d.prom" ]; then exec cat "$d.prom"; fi
if [ -e "$d.hang" ]; then exec sleep 30; fi
if [ -e "$d.huge" ]; then exec head -c 1000000 /dev/zero; fi
if [ -e "$d.stopped" ]; then
  printf 'lxc-attach: %s: attach.c: get_attach_context: Failed to get init pid\\033[2J\\n' "$2" >&2
  exit 1
fi
echo "cat: {file}: No such file or directory" >&2
exit 1
"""


def fake_lxc_attach(root: Path, files: dict[str, bytes | str]) -> Path:
    """A stand-in for lxc-attach that checks its argv and answers for each vmid by a file's suffix."""
    root.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (root / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    script = root / "lxc-attach"
    script.write_text(FAKE_ATTACH.format(root=root, file=node_metrics.CONTAINER_FILE))
    script.chmod(0o755)
    return script


def test_the_real_reader_through_lxc_attach(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    attach = fake_lxc_attach(
        tmp_path / "fake",
        {
            "101.prom": doctor_file(("fast", True)),
            "103.hang": "",
            "104.huge": "",
            "105.stopped": "",
            "106.prom": b'mlstack_doctor_ok{tier="\xff"} 1\n',
        },
    )
    out = tmp_path / "mlstack.prom"
    argv = ["--out", str(out), "--lxc-attach", str(attach), "--timeout", "1.5", "--containers", "101,102,103"]
    t0 = time.monotonic()
    assert node_metrics.main([*argv[:-1], "101,102,103,104,105,106"]) == 0
    took = time.monotonic() - t0
    said = capsys.readouterr().out
    series, _, _ = parse_strict(out.read_text())
    ok = {lab["vmid"]: v for lab, v in values(series, "mlstack_node_container_metrics_ok")}
    assert ok == {"101": 1, "102": 0, "103": 0, "104": 0, "105": 0, "106": 0}
    assert one(series, "mlstack_doctor_ok", vmid="101", tier="fast")[1] == 1
    assert f"102: no metrics file yet ({node_metrics.CONTAINER_FILE})" in said
    assert "103: unreadable: timed out after 1.5 s" in said
    assert f"104: unreadable: more than {node_metrics.MAX_BYTES} bytes" in said
    assert "105: unreadable: lxc-attach exit 1: lxc-attach: 105: attach.c: get_attach_context" in said
    assert "106: unreadable: not UTF-8" in said
    assert "\033" not in said, "the container's escape sequences reach the journal"
    assert took < 1.5 + 3, "the containers are read at once, a hung one costs its timeout only"


# The collection's wheel build (module_utils/doctor_wheel.py, behind roles/doctor's build task), whose
# environment a wheel built here shares. Standard library only: loaded by path, no Ansible needed.
DOCTOR_WHEEL_UTIL = VERIFY.parent / "plugins" / "module_utils" / "doctor_wheel.py"


def doctor_build_env() -> dict[str, str]:
    """The environment the collection gives `uv build` on the controller (doctor_wheel.BUILD_ENV, defined
    there only), e.g. the system's CA store for TLS-intercepting proxies."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("doctor_wheel", DOCTOR_WHEEL_UTIL)
    assert spec and spec.loader, DOCTOR_WHEEL_UTIL
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.BUILD_ENV)


def _wheel(tmp_path: Path) -> Path:
    """The doctor's wheel, built as roles/doctor builds it (uv build, the role's environment), from a copy
    of verify/: the build leaves nothing in the checkout."""
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    if not os.access(uv, os.X_OK):
        pytest.skip("uv not installed")
    src = tmp_path / "verify"
    shutil.copytree(
        VERIFY, src, ignore=shutil.ignore_patterns("tests", "build", "*.egg-info", "__pycache__", ".*")
    )
    r = subprocess.run(
        [uv, "build", "--quiet", "--wheel", "--out-dir", str(tmp_path / "dist"), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **doctor_build_env()},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("mlstack_doctor-*.whl")
    # The ops package ships whole: the node's collector, and the monitor body the schedule writes.
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"mlstack_doctor/ops/node_metrics.py", "mlstack_doctor/ops/monitor.sh"} <= names, sorted(names)
    return wheel


@pytest.mark.slow
def test_the_node_runs_it_from_the_wheel_by_zip_import(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path)
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable  # the node's, not this venv's
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(wheel), "LC_ALL": "C"}
    work = tmp_path / "elsewhere"  # not verify/src: the module must come from the wheel
    work.mkdir()

    def py(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [python, "-s", *args], capture_output=True, text=True, env=env, cwd=work, timeout=60
        )

    r = py("-m", "mlstack_doctor.ops.node_metrics", "--help")
    assert r.returncode == 0 and "--lxc-attach" in r.stdout, r.stderr
    r = py("-c", "import mlstack_doctor.ops.node_metrics as m; print(m.__file__)")
    assert r.stdout.strip() == f"{wheel}/mlstack_doctor/ops/node_metrics.py", r.stdout + r.stderr
    attach = fake_lxc_attach(tmp_path / "fake", {"101.prom": doctor_file(("fast", True))})
    out = tmp_path / "mlstack.prom"
    r = py(
        "-m",
        "mlstack_doctor.ops.node_metrics",
        "--out",
        str(out),
        "--lxc-attach",
        str(attach),
        "--containers",
        "101,102",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith("101: ok, ")
    series, _, _ = parse_strict(out.read_text())
    assert one(series, "mlstack_node_container_metrics_ok", vmid="102")[1] == 0


def test_only_containers_named_by_a_vmid_are_the_nodes_guests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "lxc-ls"
    fake.write_text("#!/bin/sh\nprintf '101\\nmlstack-controller-core221\\n102\\n'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert node_metrics.list_running() == ["101", "102"]
