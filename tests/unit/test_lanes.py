"""tests/lanes.py's plan: every test file runs in exactly one step, and steps that may run at once never
share a vmid (what `make test` relies on to run the suites side by side without dropping a test)."""

from __future__ import annotations

import importlib.metadata
import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

import lanes  # noqa: E402
import lanes_cpu  # noqa: E402
import skips  # noqa: E402

TEST_FILES = sorted(
    str(p.relative_to(REPO)) for root in ("verify/tests", "tests") for p in (REPO / root).rglob("test_*.py")
)


@pytest.mark.parametrize("path", TEST_FILES)
def test_every_test_file_runs_in_exactly_one_step(path: str) -> None:
    steps = [s.name for s in lanes.PLAN if s.paths and lanes.runs(s, path)]
    assert len(steps) == 1, f"{path} runs in {steps}"


def test_steps_beside_each_other_share_only_the_vmids_run_on_both_controllers() -> None:
    """Two shared steps holding one vmid never run at once; only the other stack's reruns of provisioning
    files (and CT 139, the foreign guest of lifecycle and bad input) are held twice."""
    others = lanes.other_stack_steps([])
    twice = frozenset().union(*(s.vmids for s in others))
    steps = [s for s in [*lanes.PLAN, *others] if s.node != "exclusive"]
    for a, b in itertools.combinations(steps, 2):
        assert a.vmids & b.vmids <= twice, (a.name, b.name, sorted(a.vmids & b.vmids))
        assert not a.vmids & b.vmids or lanes.conflicts(a, [b])


@pytest.mark.parametrize("step", lanes.other_stack_steps([]), ids=lambda s: s.name)
def test_an_other_stack_step_waits_for_the_step_running_its_file_here(step: lanes.Step) -> None:
    path = next(a for a in step.argv if a.startswith("tests/"))
    here = [s for s in lanes.PLAN if s.paths and lanes.runs(s, path)]
    assert here and all(lanes.conflicts(step, [s]) for s in here)
    assert step.after == (f"{lanes.OTHER_STACK.name}-controller",)
    assert step.name.startswith(f"{lanes.OTHER_STACK.name}-")


def test_the_other_stack_is_not_the_one_running_the_suites() -> None:
    """The provisioning files run again on the stack beside this venv's: 2.21 beside 2.19, and 2.19
    beside 2.21."""
    core = importlib.metadata.version("ansible-core")
    assert lanes.OTHER_STACK.name != {"2.19": "core219", "2.21": "core221"}[core.rsplit(".", 1)[0]]


def test_the_execution_environment_runs_on_its_own_stack() -> None:
    """Its unit tests run in the second controller exactly where that holds the environment's stack (they
    skip, allowed, in the unit step there)."""
    (controller,) = [s for s in lanes.PLAN if s.name == f"{lanes.OTHER_STACK.name}-controller"]
    there = any(path in controller.argv[-1] for path in lanes.EE_TESTS)
    assert there == (lanes.OTHER_STACK.name == lanes.controller_stack.EXECUTION_ENVIRONMENT)


def test_other_stack_steps_run_one_at_a_time() -> None:
    """Their controller writes the checkout's own reports/, which a lifecycle test reads back."""
    for a, b in itertools.combinations(lanes.other_stack_steps([]), 2):
        assert lanes.conflicts(a, [b]), (a.name, b.name)


def test_the_cpu_share_counts_work_done_while_it_ran() -> None:
    """The share printed each minute and at the end: CPU spent in that time (here, a busy loop) shows."""
    busy0, t0, spent0 = lanes.cpu_busy_seconds(), time.monotonic(), time.process_time()
    while time.process_time() - spent0 < 0.5:
        pass
    assert lanes.cpu_busy_seconds() - busy0 >= 0.4
    share = lanes.busy_share(busy0, t0)
    assert share.startswith("CPU ") and f"of {os.cpu_count()} cores" in share, share


def test_the_tree_collects_as_one_run() -> None:
    """`make test` counts the tree's tests in one collection (beside the steps' own) to show that none is
    left out: two test files of one basename would stop that collection ("import file mismatch")."""
    names = [Path(p).name for p in TEST_FILES]
    twice = sorted({n for n in names if names.count(n) > 1})
    assert not twice, [p for p in TEST_FILES if Path(p).name in twice]


def test_the_report_names_a_test_that_no_step_collected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lanes, "LOGS", tmp_path)
    steps = lanes.plan([])
    runner = lanes.Runner(steps, [], 1)
    runner.tree.write_text("a.py::t1\na.py::t2\nb.py::t3\n")
    steps[0].collected.parent.mkdir(parents=True)
    steps[0].collected.write_text("a.py::t1\nb.py::t3\n")
    steps[1].collected.parent.mkdir(parents=True)
    steps[1].collected.write_text("b.py::t3\n")
    text = runner.coverage()
    assert "3 collected in the tree" in text and "collected 2 of them, 1 a second time" in text, text
    assert text.endswith("1 in no step: a.py::t2"), text


def test_a_failed_step_shows_its_first_failure_when_the_tail_is_elsewhere() -> None:
    log = [f"line {i}" for i in range(10)]
    log += [
        "TASK [gpu_container : Read the guests on the node]",
        "fatal: [testbed -> localhost]: FAILED! => {}",
    ]
    log += [f"cleanup {i}" for i in range(100)]
    shown = lanes.first_failure(log, tail=60)
    assert "fatal: [testbed -> localhost]: FAILED!" in shown and "Read the guests on the node" in shown
    # Already among the last lines, or no failure at all: nothing more to show.
    assert lanes.first_failure(log[:20], tail=60) == ""
    assert lanes.first_failure([f"ok {i}" for i in range(200)], tail=60) == ""


def test_a_steps_cpu_counts_its_processes_and_the_containers_it_holds(tmp_path: Path) -> None:
    """On a fake cgroup tree: a container's use between samples counts to the step holding its vmid, a
    container restarted under a new cgroup counts from zero, and one that no running step holds counts to
    nobody's step."""
    ct = tmp_path / "lxc.payload.150"
    ct.mkdir()
    (ct / "cpuacct.usage").write_text(str(5 * 10**9))  # before the run: nobody's
    ledger = lanes_cpu.CpuLedger(tmp_path)
    assert ledger.enter("provisioned") is not None
    (ledger.group("provisioned") / "cpuacct.usage").write_text(str(2 * 10**9))
    (ct / "cpuacct.usage").write_text(str(8 * 10**9))
    restarted = tmp_path / "lxc.payload.150-1"
    restarted.mkdir()
    (restarted / "cpuacct.usage").write_text(str(1 * 10**9))
    other = tmp_path / "lxc.payload.mlstack-controller-core221"
    other.mkdir()
    (other / "cpuacct.usage").write_text(str(4 * 10**9))
    ledger.sample(lambda key: "provisioned" if key == 150 else None)
    assert ledger.seconds("provisioned") == pytest.approx(2 + 3 + 1)
    assert ledger.unclaimed == pytest.approx(4)


@pytest.mark.skipif(
    os.geteuid() != 0 or not lanes_cpu.CpuLedger().enabled, reason="needs a writable cgroup tree (root)"
)
def test_a_steps_cpu_is_read_from_a_real_cgroup() -> None:
    """The machine's own cgroup tree: a child that spins half a second in a step's cgroup shows there."""
    ledger = lanes_cpu.CpuLedger()
    name = f"unit-{os.getpid()}"
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass"
    subprocess.run([sys.executable, "-c", spin], preexec_fn=ledger.enter(name), check=True)
    try:
        assert 0.4 <= ledger.seconds(name) < 5
    finally:
        ledger.cleanup([name])
    assert not ledger.group(name).exists()


def test_the_fault_suites_container_is_handed_on_only_from_a_step_that_passed() -> None:
    """node-state runs the device-node fault on CT 160 and keeps it; faults starts from it when node-state
    passed, and from scratch otherwise (never from a container a failed step left)."""
    steps = lanes.plan([])
    runner = lanes.Runner(steps, [], 6)
    keeper = next(s for s in steps if s.name == "node-state")
    taker = next(s for s in steps if s.takes_from == keeper.name)
    assert runner.env(keeper)["MLSTACK_FAULTS_HANDOFF"] == "keep"
    assert "MLSTACK_FAULTS_HANDOFF" not in runner.env(taker)
    keeper.state = "failed"
    assert "MLSTACK_FAULTS_HANDOFF" not in runner.env(taker)
    keeper.state = "passed"
    assert runner.env(taker)["MLSTACK_FAULTS_HANDOFF"] == "take"
    alone = lanes.Runner([keeper], [], 6)
    assert "MLSTACK_FAULTS_HANDOFF" not in alone.env(keeper)


def test_a_steps_own_cpu_stops_counting_when_it_ends(tmp_path: Path) -> None:
    """A daemon a step started (the nodes' sshd after `testbed up`) lives on in its cgroup: what it uses
    after the step ended is not the step's."""
    ledger = lanes_cpu.CpuLedger(tmp_path)
    ledger.enter("node-state")
    usage = ledger.group("node-state") / "cpuacct.usage"
    usage.write_text(str(3 * 10**9))
    ledger.close("node-state")
    usage.write_text(str(50 * 10**9))
    assert ledger.seconds("node-state") == pytest.approx(3)


def test_a_runs_containers_cpu_sums_every_cgroup_of_its_vmids(tmp_path: Path) -> None:
    """A playbook run's CPU inside its containers: each container's cgroups (one per incarnation LXC
    made), none of another vmid or of a container that is not a vmid."""
    groups = {"150": 2, "150-1": 3, "151": 7, "1500": 11, "mlstack-controller-core221": 13}
    for name, seconds in groups.items():
        (tmp_path / f"lxc.payload.{name}").mkdir()
        (tmp_path / f"lxc.payload.{name}" / "cpuacct.usage").write_text(str(seconds * 10**9))
    assert lanes_cpu.containers_seconds([150], tmp_path) == pytest.approx(5)
    assert lanes_cpu.containers_seconds([150, 151], tmp_path) == pytest.approx(12)
    assert lanes_cpu.containers_seconds([], tmp_path) == 0


def test_the_testbed_comes_up_first_with_only_the_steps_that_need_none_beside_it() -> None:
    """`make test` brings the testbed up as its first step (`make testbed`, the Makefile's one command for
    it); the unit tests and lint start beside it, every other step waits for it."""
    steps = lanes.plan([])
    first = steps[0]
    assert first.name == lanes.TESTBED_UP and first.argv == ("make", "--no-print-directory", "testbed")
    beside = [s.name for s in steps[1:] if lanes.TESTBED_UP not in s.after]
    assert beside == ["unit", "lint"]
    assert all(s.node == "none" and not s.testbed for s in steps if s.name in beside)
    free = [s.name for s in steps[1:] if not lanes.conflicts(s, [first])]
    assert free == [
        *beside,
        f"{lanes.OTHER_STACK.name}-controller",
    ]  # which waits for it all the same (its apt packages)
    assert lanes.plan([])[1].after == steps[1].after  # planning twice adds nothing twice


def _fake_step(name: str, script: str, **kw: object) -> lanes.Step:
    return lanes.Step(name, argv=("sh", "-c", script), isolated=False, **kw)  # type: ignore[arg-type]


def test_a_testbed_that_does_not_come_up_runs_none_of_the_steps_that_need_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Real processes through the runner: the testbed step fails; the step that needs no testbed runs and
    passes beside it; the one that needs it is not started, and the report says why."""
    monkeypatch.setattr(lanes, "LOGS", tmp_path)
    monkeypatch.setattr(lanes.Runner, "collect_tree", lambda self: None)
    # A cgroup tree of its own: `make test` may be running its real steps on this machine's tree.
    (tmp_path / "cgroup").mkdir()
    monkeypatch.setattr(lanes, "CpuLedger", lambda: lanes_cpu.CpuLedger(tmp_path / "cgroup"))
    marker = tmp_path / "ran"
    steps = [
        _fake_step("fake-up", "sleep 1; echo 'testbed: no lxc here' ; exit 3", node="exclusive"),
        _fake_step("beside", "echo 1 passed in 0.01s", node="none", testbed=False),
        _fake_step("needs-it", f"touch {marker}", after=("fake-up",)),
    ]
    rc = lanes.Runner(steps, [], 6).run()
    out = capsys.readouterr().out
    assert rc == 1 and not marker.exists()
    assert [s.state for s in steps] == ["failed", "passed", "failed"]
    assert "needs-it not run: fake-up failed" in out
    assert "testbed: no lxc here" in out


SKIPPING_TESTS = """
import pytest

def test_runs():
    pass

def test_kept():
    pytest.skip("CT 100 was there before these tests: kept")

@pytest.mark.skipif(True, reason=REASON)
def test_other():
    pass
"""


@pytest.mark.parametrize(
    ("reason", "state"),
    [("cannot build the torch test venv", "failed"), ("CT 100 was there before these tests: kept", "passed")],
    ids=["not-allowed", "allowed"],
)
def test_a_step_fails_on_a_skip_the_allow_list_does_not_hold(
    reason: str,
    state: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A real pytest run through the runner: its skips are counted from pytest's own results (the
    lanes_collect plugin), shown in the table at the end, and one not on tests/skips.py fails the step."""
    monkeypatch.setattr(lanes, "LOGS", tmp_path)
    monkeypatch.setattr(lanes.Runner, "collect_tree", lambda self: None)
    (tmp_path / "cgroup").mkdir()
    monkeypatch.setattr(lanes, "CpuLedger", lambda: lanes_cpu.CpuLedger(tmp_path / "cgroup"))
    case = tmp_path / "cases" / "test_some_skips.py"
    case.parent.mkdir()
    case.write_text(SKIPPING_TESTS.replace("REASON", repr(reason)))
    argv = (*lanes.PYTEST, "-p", "no:cacheprovider", "--rootdir", str(case.parent), str(case))
    step = lanes.Step("skipping", argv=argv, node="none", isolated=False, testbed=False)
    rc = lanes.Runner([step], [], 1).run()
    out = capsys.readouterr().out
    assert step.counts["passed"] == 1 and len(step.skips) == 2, (step.counts, step.skips)
    assert (step.state, rc) == (state, 1 if state == "failed" else 0), out
    table = out[out.index("step                 passed") :]
    row = next(line for line in table.splitlines() if line.startswith("skipping "))
    assert row.split()[1:] == ["1", "0", "2", "2" if state == "passed" else "1"], row
    assert f"test_some_skips.py::test_other: {reason}" in out
    assert ("NOT ALLOWED" in out) == (state == "failed"), out


def test_skips_a_log_counts_but_no_outcomes_file_itemises_are_not_allowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lanes, "LOGS", tmp_path)  # no outcomes file there
    step = lanes.Step("core221-lifecycle", argv=("true",))
    step.summary = "12 passed, 2 skipped in 80.31s (0:01:20)"
    lanes.judge_skips(step)
    assert step.skips == [("core221-lifecycle", "2 skips not itemised (no outcomes file)", "")]


def test_a_listed_skip_is_allowed_only_where_its_condition_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The allow-list matches the reason's start, and its entry's condition, probed on this machine."""
    reason = "root ignores permission bits"
    monkeypatch.setattr(skips.os, "geteuid", lambda: 0)
    entry = skips.allowed(reason)
    assert entry is not None and "non-root" in entry.why
    monkeypatch.setattr(skips.os, "geteuid", lambda: 1000)
    assert skips.allowed(reason) is None
    for refused in ("cannot build the torch test venv (x...): no network", "no carried LXC .debs in .debs/"):
        assert skips.allowed(refused) is None
    assert skips.allowed("the doctor said: no CUDA GPU") is None  # the reason's start only
