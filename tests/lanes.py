"""`make test`'s suites after lint: steps run side by side where they only wait on I/O (apt, uv and
Ansible inside real testbed containers), never two at once that could disturb each other.

What each step holds decides what may run beside it:
- vmids: the containers its tests make; two steps sharing a vmid never run at once (CT 128 of
  tests/provision is also CT 128 of the other controller stack's run of the same file).
- node: "exclusive" for tests that change the testbed node's global state (the GPU model its nvidia-smi
  reports, the API server killed and restarted, `testbed up` rewriting sshd's keys): nothing else that
  uses the node runs meanwhile. "shared" for the rest; "none" for what never touches the node.
- isolated: the step runs in a mount namespace of its own where the folders a playbook run writes in the
  checkout (reports/: fleet.json, the doctor's reports; build/dist and the doctor's setuptools build
  folders) are folders of the step's own, so a test that reads reports/fleet.json reads its own run's.
  The other stack's steps run in the second controller (testbed/testbed controller), which sees the
  checkout's own folders: they hold one lock, so one at a time writes there.

The first step brings the testbed up (`make testbed`); the unit tests and lint, which need no testbed, run
beside it, and every other step waits for it (and is not run if it fails).

MLSTACK_TEST_LANES=N runs at most N steps at once (default 6); 1 runs them one after the other in the
order below, in the checkout's own folders, as a plain `pytest` of each would. Logs: build/test-lanes/.
Usage: python tests/lanes.py [--only STEP,...] [--list] [-- EXTRA PYTEST ARGS]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from lanes_cpu import CpuLedger
from skips import allowed

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import controller_stack

REPO = Path(__file__).resolve().parents[1]
LOGS = REPO / "build" / "test-lanes"
PYTEST = [sys.executable, "-m", "pytest", "-q", "--durations=30", "-p", "tests.lanes_collect"]
# Every folder that holds tests: what the tree collects, to compare with what the steps ran.
TEST_ROOTS = ("verify/tests", "tests/unit", "tests/provision", "tests/faults", "tests/testbed")
TESTBED = "testbed/testbed"
# Folders of the checkout a playbook run writes to (roles doctor, fleet_report): one set per step.
ISOLATED = ("reports", "build/dist", "verify/build", "verify/src/mlstack_doctor.egg-info")
# The controller stack beside the one of the venv running the suites (ansible-core 2.21 beside 2.19, 2.19
# beside 2.21): `testbed/testbed controller` holds it, and its steps are named after it.
OTHER_STACK = controller_stack.other(controller_stack.installed(Path(sys.prefix), sys.version_info[:2]))
# The files `make test-other-stack` runs again on it (the Makefile passes its own list).
OTHER_STACK_TESTS = os.environ.get(
    "OTHER_STACK_TESTS",
    "tests/provision/test_lifecycle.py tests/provision/test_api_token.py tests/provision/test_bad_input.py",
).split()
# The unit tests of the execution environment (its stack's Ansible and collections) run where that stack is.
EE_TESTS = ("tests/unit/test_execution_environment.py",)
OTHER_CONTROLLER = f"{OTHER_STACK.name}-controller"


def span(*parts: int | tuple[int, int]) -> frozenset[int]:
    """vmids from single ids and inclusive (first, last) ranges."""
    ids: set[int] = set()
    for p in parts:
        ids.update(range(p[0], p[1] + 1) if isinstance(p, tuple) else (p,))
    return frozenset(ids)


@dataclass
class Step:
    name: str
    # pytest paths (a folder runs what no other step claims in it), or argv for a command step.
    paths: tuple[str, ...] = ()
    argv: tuple[str, ...] = ()
    vmids: frozenset[int] = frozenset()
    node: str = "shared"
    after: tuple[str, ...] = ()
    isolated: bool = True
    # Files another step runs, run here too over this step's own runs.
    again: tuple[str, ...] = ()
    # Other things only one step at a time may hold.
    locks: tuple[str, ...] = ()
    # The step whose fault suite's shared container (CT 160) this one starts from, where that step runs
    # first and passes: it keeps the container rather than destroying it (MLSTACK_FAULTS_HANDOFF).
    takes_from: str = ""
    # Environment of its command (tests/faults/conftest.py's MLSTACK_FAULTS_VMIDS).
    env: tuple[tuple[str, str], ...] = ()
    # Whether it needs the testbed up (its nodes, or the LXC and apt packages `testbed up` installs): such a
    # step waits for the testbed-up step where the run has one.
    testbed: bool = True
    # Filled in while it runs.
    state: str = "waiting"
    rc: int | None = None
    seconds: float = 0.0
    summary: str = ""
    note: str = ""
    # Its tests' counts (passed, failed, ...) and skips (node id, reason, the allow-list's why or "").
    counts: dict[str, int] = field(default_factory=dict)
    skips: list[tuple[str, str, str]] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def log(self) -> Path:
        return LOGS / f"{self.name}.log"

    @property
    def collected(self) -> Path:
        """The node ids its pytest collected (tests/lanes_collect.py)."""
        return LOGS / self.name / "collected.txt"

    @property
    def ledger(self) -> Path:
        """One line per playbook run of its tests (playbook_runner.record_run)."""
        return LOGS / self.name / "runs.jsonl"

    @property
    def outcomes(self) -> Path:
        """Its pytest's counts and skips (tests/lanes_collect.py)."""
        return LOGS / self.name / "outcomes.json"

    def runs(self) -> list[dict[str, object]]:
        if not self.ledger.exists():
            return []
        return [json.loads(line) for line in self.ledger.read_text().splitlines() if line.strip()]


PROVISION = "tests/provision/"
TESTBED_UP = "testbed-up"
# In priority order (and the serial order). The node-exclusive step goes first, beside the steps that
# never touch the node; then the long shared steps run together to the end.
PLAN = [
    # `make testbed` (on a fresh machine also its apt packages, disk and template: about a minute on one
    # core), beside the steps that need no testbed; every other step waits for it.
    Step(TESTBED_UP, argv=("make", "--no-print-directory", "testbed"), node="exclusive", isolated=False),
    Step(
        "node-state",
        (
            # `testbed up` (GPU models, idempotence) and the API server killed and restarted (CT 900).
            "tests/testbed/test_testbed_cli.py",
            # `testbed up --nodes 2` (refused while testbed3 holds CT 936; CT 935-936).
            "tests/testbed/test_multinode.py",
            # The GPU model set to h200 for a whole module (CT 121; CT 141 planned only).
            PROVISION + "test_policy_refusal.py",
            # The nodes' NVIDIA kernel module set, then upgraded (CT 134).
            PROVISION + "test_driver_upgrade.py",
            # /dev/nvidia1, passed through to every container, removed from the machine (CT 160).
            "tests/faults/test_fault_devnode.py",
            # Node testbed3 rebooted: the machine's /dev/nvidia-uvm* removed and made again (CT 300-301).
            PROVISION + "test_reboot.py",
        ),
        # The fault suite's session fixtures (CT 160) come along; so does its secrets grep, over these runs.
        again=("tests/faults/test_fault_secrets.py",),
        vmids=span(900, 935, 936, 121, 141, 134, 160, (300, 305)),
        node="exclusive",
    ),
    Step("unit", ("verify/tests", "tests/unit"), node="none", testbed=False),
    # ruff and ansible-lint (`make lint`): minutes of CPU, beside the node-exclusive step's waits.
    Step("lint", argv=("make", "--no-print-directory", "lint"), node="none", isolated=False, testbed=False),
    Step(
        OTHER_CONTROLLER,
        argv=(
            "sh",
            "-c",
            f"{TESTBED} controller up && {TESTBED} controller run -- ansible --version"
            + (
                f" && {TESTBED} controller run -- pytest -q -p no:cacheprovider {' '.join(EE_TESTS)}"
                if OTHER_STACK.name == controller_stack.EXECUTION_ENVIRONMENT
                else ""
            ),
        ),
        node="none",
        isolated=False,
    ),
    # The fault suite in two sessions at once, each on a shared container of its own, each grepping its own
    # runs' logs for secrets: 160-169 (CT 160, node-state's, kept for it), and 170-189 (CT 170) for the
    # faults that wait on the API, apt's lock and the preflight. One session would be the longest step.
    Step("faults", ("tests/faults",), vmids=span((160, 169)), takes_from="node-state"),
    Step(
        "faults-2",
        (
            "tests/faults/test_fault_apt.py",
            "tests/faults/test_fault_api.py",
            "tests/faults/test_fault_metachar.py",
            "tests/faults/test_fault_preflight.py",
        ),
        again=("tests/faults/test_fault_secrets.py",),
        vmids=span((170, 189)),
        env=(("MLSTACK_FAULTS_VMIDS", "170-189"),),
    ),
    # Template download (CT 943-944), README commands (CT 100), CT 120 for monitoring; vmids 133 and
    # 135-138 kept for new files.
    Step("provision", (PROVISION.rstrip("/"),), vmids=span(100, 120, 133, (135, 138), (943, 944))),
    # One provisioned container (CT 150, conftest.py's default_ct) for the files that check one: the
    # doctor typed by hand, the scheduled runs, reruns after changes by hand (each puts it back), a second
    # venv of its lock built beside its own.
    Step(
        "provisioned",
        (
            PROVISION + "test_doctor_defaults.py",
            PROVISION + "test_monitor.py",
            PROVISION + "test_rerun_state.py",
            PROVISION + "test_venv_bytecode.py",
        ),
        vmids=span(150),
    ),
    # The fleet across the cluster's three nodes (CT 130-132), and the warm shared across them.
    Step("fleet", (PROVISION + "test_fleet.py",), vmids=span((130, 132))),
    # CT 139 is the foreign guest of both lifecycle and bad input.
    Step("lifecycle", (PROVISION + "test_lifecycle.py",), vmids=span(128, 139)),
    # One container changed in turn on day two (CT 200), one only planned (CT 201); 202-219 kept for it.
    Step("day-two", (PROVISION + "test_day_two.py",), vmids=span((200, 219))),
    Step("api-token", (PROVISION + "test_api_token.py",), vmids=span((940, 942), 962)),
    # Shared folders removed under running containers (CT 220-221): folders of its own (pve_host_root), so
    # the node's shared store that the other steps' containers bind is never touched.
    Step("mount-heal", (PROVISION + "test_mount_heal.py",), vmids=span((220, 229))),
    # upgrade.yml and rollback.yml on CT 129, on the node as every shared step finds it.
    Step("upgrade", (PROVISION + "test_upgrade.py",), vmids=span(129)),
    Step("bad-input", (PROVISION + "test_bad_input.py",), vmids=span((121, 127), 139, (320, 325))),
    # Snapshots around an upgrade (CT 260-261): two stacks built, in a step of its own rather than at the
    # end of the provision step, the longest.
    Step("snapshots", (PROVISION + "test_snapshots.py",), vmids=span((260, 261))),
    Step("host-life", (PROVISION + "test_host_life.py",), vmids=span((310, 319))),
    # No playbook run of its own writes reports/; its hostroot containers mount in the machine's namespace.
    # CT 960-961: test_api_errors.py's second API server (960 never created, 961 an API record only).
    # With it, the doctor against the node's dummy NVIDIA device nodes: never beside `testbed up` or the
    # node-state step, which make and remove them (the unit tests run beside both).
    Step(
        "testbed",
        ("tests/testbed", "verify/tests/test_doctor_node_devices.py"),
        vmids=span((900, 939), (949, 963)),
        isolated=False,
    ),
    Step("molecule", argv=("molecule", "test", "-s", "default"), vmids=span(110)),
]


# Where a step's log says what failed first: Ansible's failed task, pytest's first failure. A step that
# retries or cleans up after it (molecule destroys again) prints its cause far from its last lines.
FIRST_FAILURE = re.compile(r"fatal: \[|\[ERROR\]: Task failed|^_{5,} test|^E {3}")


def first_failure(lines: list[str], tail: int, context: int = 40) -> str:
    """The lines from the first failure in a log on, when they lie before its last `tail` lines."""
    for i, line in enumerate(lines[: max(len(lines) - tail, 0)]):
        if FIRST_FAILURE.search(line):
            return "\n".join(lines[max(i - 5, 0) : i + context])
    return ""


def plan(extra: list[str]) -> list[Step]:
    """Every step in priority order: the other stack's reruns right after the steps whose vmids they wait
    for."""
    cut = next(i for i, s in enumerate(PLAN) if s.name == "bad-input") + 1
    steps = [*PLAN[:cut], *other_stack_steps(extra), *PLAN[cut:]]
    for s in steps:
        if s.testbed and s.name != TESTBED_UP and TESTBED_UP not in s.after:
            s.after = (TESTBED_UP, *s.after)
    return steps


def claimed() -> dict[str, str]:
    """Test files named by a step -> that step."""
    return {p: s.name for s in PLAN for p in s.paths if p.endswith(".py")}


def pytest_argv(step: Step, extra: list[str]) -> list[str]:
    """pytest over the step's paths, leaving out files other steps name under its folders."""
    ignores = [
        f"--ignore={f}"
        for f, owner in claimed().items()
        if owner != step.name and any(f.startswith(p.rstrip("/") + "/") for p in step.paths)
    ]
    cache = f"cache_dir={LOGS / step.name / 'pytest-cache'}"
    temp = f"--basetemp=/tmp/mlstack-test-{step.name}"
    return [*PYTEST, "-o", cache, temp, *ignores, *step.paths, *step.again, *extra]


def runs(step: Step, path: str) -> bool:
    """Whether `path` (a test file or folder) runs, at least in part, in `step`."""
    files = claimed()
    if path in files:
        return files[path] == step.name
    path = path.rstrip("/")
    return any(
        p == path or p.startswith(path + "/") or path.startswith(p.rstrip("/") + "/") for p in step.paths
    )


def other_stack_split() -> tuple[list[str], list[str]]:
    """OTHER_STACK_TESTS as (test paths, pytest options such as `--deselect PATH`)."""
    paths: list[str] = []
    options: list[str] = []
    tokens = iter(OTHER_STACK_TESTS)
    for token in tokens:
        if token in ("--deselect", "--ignore", "-k", "-m"):
            options += [token, next(tokens, "")]
        elif token.startswith("-"):
            options.append(token)
        else:
            paths.append(token)
    return paths, options


def other_stack_steps(extra: list[str]) -> list[Step]:
    """The provisioning files again on the other controller stack, one step per path, each holding the
    vmids (and the node, where a node-exclusive step runs the file) of the steps that run it here."""
    paths, options = other_stack_split()
    steps = []
    for path in paths:
        here = [s for s in PLAN if s.paths and runs(s, path)]
        node = "exclusive" if any(s.node == "exclusive" for s in here) else "shared"
        name = f"{OTHER_STACK.name}-" + Path(path).stem.removeprefix("test_").replace("_", "-")
        argv = (TESTBED, "controller", "run", "--", "pytest", "-q", "--durations=10", path, *options, *extra)
        vmids = frozenset().union(*(s.vmids for s in here))
        # The controller container sees the checkout's own reports/ (bound when it started): one at a time.
        steps.append(Step(name, argv=argv, vmids=vmids, node=node, after=(OTHER_CONTROLLER,), isolated=False))
        steps[-1].locks = ("checkout-reports",)
    return steps


def command(step: Step, extra: list[str], lanes: int) -> list[str]:
    argv = pytest_argv(step, extra) if step.paths else list(step.argv)
    if lanes == 1 or not step.isolated:
        return argv
    binds = []
    for rel in ISOLATED:
        own = LOGS / step.name / rel.replace("/", "_")
        own.mkdir(parents=True, exist_ok=True)
        (REPO / rel).mkdir(parents=True, exist_ok=True)
        binds.append(f"mount --bind {shlex.quote(str(own))} {shlex.quote(str(REPO / rel))}")
    script = " && ".join([*binds, 'exec "$@"'])
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh", *argv]


def conflicts(step: Step, running: list[Step]) -> bool:
    for other in running:
        if step.vmids & other.vmids or set(step.locks) & set(other.locks):
            return True
        if "exclusive" in (step.node, other.node) and "none" not in (step.node, other.node):
            return True
    return False


PROGRESS = re.compile(rb"\[\s*(\d+)%\]")
# pytest's last line: "12 passed, 1 skipped in 80.31s (0:01:20)" (between "=" rules without -q).
SUMMARY = re.compile(
    r"^=*\s*(.*\b(?:passed|failed|errors?|skipped|deselected|no tests ran)\b.* in [\d.]+s.*?)\s*=*$"
)


SKIPPED = re.compile(r"\b(\d+) skipped\b")


def judge_skips(step: Step) -> None:
    """Its counts and skips from its pytest's own results, each skip judged by the allow-list. A step
    whose log counts skips that no outcomes file itemises (pytest without the plugin: the other stack's
    controller's) holds them as unjudged, so not allowed."""
    if step.outcomes.exists():
        data = json.loads(step.outcomes.read_text())
        step.skips = []
        for s in data.pop("skipped"):
            entry = allowed(s["reason"])
            step.skips.append((s["nodeid"], s["reason"], entry.why if entry else ""))
        step.counts = {k: int(v) for k, v in data.items()}
    elif (m := SKIPPED.search(step.summary)) and int(m.group(1)):
        step.skips = [(step.name, f"{m.group(1)} skips not itemised (no outcomes file)", "")]


def skip_table(steps: list[Step]) -> str:
    """Per step: passed, failed (and errors), skipped, of which allowed; then every skip with its reason."""
    rows = ["\nstep                 passed  failed  skipped  allowed"]
    detail: list[str] = []
    for s in steps:
        if not s.counts and not s.skips:
            continue
        ok = sum(1 for sk in s.skips if sk[2])
        failed = s.counts.get("failed", 0) + s.counts.get("errors", 0)
        rows.append(f"{s.name:<20} {s.counts.get('passed', 0):>6} {failed:>7} {len(s.skips):>8} {ok:>8}")
        for nodeid, reason, why in s.skips:
            verdict = f"allowed: {why}" if why else "NOT ALLOWED"
            detail.append(f"  {s.name}: {nodeid}: {reason}\n      {verdict}")
    return "\n".join(rows + (["skips (tests/skips.py):", *detail] if detail else ["no skips"]))


def cpu_busy_seconds() -> float:
    """CPU seconds the machine has spent busy, all cores (/proc/stat): says whether more lanes can help."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def busy_share(busy0: float, since: float) -> str:
    cores = os.cpu_count() or 1
    busy, wall = cpu_busy_seconds() - busy0, time.monotonic() - since
    return f"CPU {busy / max(wall * cores, 1e-9):.0%} busy of {cores} cores ({busy:.0f} core-seconds)"


class Runner:
    def __init__(self, steps: list[Step], extra: list[str], lanes: int) -> None:
        self.steps, self.extra, self.lanes = steps, extra, lanes
        self.t0 = time.monotonic()
        self.busy0 = cpu_busy_seconds()
        self.lock = threading.Lock()
        self.cpu = CpuLedger()

    def say(self, text: str) -> None:
        elapsed = int(time.monotonic() - self.t0)
        print(f"[lanes {elapsed // 60:02d}:{elapsed % 60:02d}] {text}", flush=True)

    def env(self, step: Step) -> dict[str, str]:
        env = dict(os.environ)
        env["MLSTACK_TEST_COLLECTED"] = str(step.collected)
        env["MLSTACK_TEST_RUN_LEDGER"] = str(step.ledger)
        env["MLSTACK_TEST_OUTCOMES"] = str(step.outcomes)
        if self.lanes > 1 and step.node != "exclusive":
            # tests/conftest.py: only check that the testbed is up, never `up` it or change its GPU model.
            env["MLSTACK_TESTBED_SHARED"] = "1"
        # tests/faults/conftest.py: one first provision of CT 160 rather than one per step.
        if any(s.takes_from == step.name for s in self.steps):
            env["MLSTACK_FAULTS_HANDOFF"] = "keep"
        elif any(s.name == step.takes_from and s.state == "passed" for s in self.steps):
            env["MLSTACK_FAULTS_HANDOFF"] = "take"
        env.update(step.env)
        return env

    def start(self, step: Step) -> None:
        step.state, step.seconds = "running", time.monotonic()
        argv = command(step, self.extra if step.paths else [], self.lanes)
        (LOGS / step.name).mkdir(parents=True, exist_ok=True)
        for stale in (step.collected, step.ledger, step.outcomes):
            stale.unlink(missing_ok=True)
        out = step.log.open("wb")
        out.write(f"$ {shlex.join(argv)}\n".encode())
        out.flush()
        step.proc = subprocess.Popen(
            argv,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=self.env(step),
            preexec_fn=self.cpu.enter(step.name),
        )
        out.close()
        what = " ".join(step.paths) or " ".join(step.argv)
        self.say(f"{step.name} started: {what} (log {os.path.relpath(step.log, REPO)})")

    def finish(self, step: Step, rc: int) -> None:
        step.rc, step.seconds = rc, time.monotonic() - step.seconds
        self.cpu.close(step.name)
        step.state = "passed" if rc == 0 else "failed"
        lines = step.log.read_text(errors="replace").splitlines()
        step.summary = next((m.group(1) for ln in reversed(lines) if (m := SUMMARY.match(ln))), f"exit {rc}")
        judge_skips(step)
        if rc == 0 and (refused := [s for s in step.skips if not s[2]]):
            step.state = "failed"
            step.note = f"{len(refused)} skips not allowed (tests/skips.py); {step.summary}"
        self.say(f"{step.name} {step.state} in {step.seconds:.0f} s: {step.note or step.summary}")

    def holder(self, key: int | str) -> str | None:
        """The running step a container's CPU counts to: the one holding its vmid; the other stack's
        controller's to the step running in it (one at a time holds it)."""
        for s in self.steps:
            if s.state != "running":
                continue
            if key in s.vmids or (isinstance(key, str) and s.name.startswith(f"{OTHER_STACK.name}-")):
                return s.name
        return None

    def progress(self, step: Step) -> str:
        tail = step.log.read_bytes()[-4000:] if step.log.exists() else b""
        found = PROGRESS.findall(tail)
        return f"{step.name} {int(found[-1])}%" if found else step.name

    def ready(self, step: Step, running: list[Step], blocked: list[Step]) -> bool:
        deps = [s for s in self.steps if s.name in step.after]
        if any(d.state == "failed" or d.note for d in deps):
            step.state, step.note = "failed", f"not run: {', '.join(d.name for d in deps)} failed"
            self.say(f"{step.name} {step.note}")
            return False
        if any(d.state != "passed" for d in deps) or conflicts(step, running):
            return False
        # An earlier step still waiting keeps what it needs from being taken by later ones.
        return not any(conflicts(step, [b]) for b in blocked)

    @property
    def tree(self) -> Path:
        return LOGS / "tree-collected.txt"

    def collect_tree(self) -> None:
        """What the whole tree collects (a few seconds of CPU), for the report's count."""
        LOGS.mkdir(parents=True, exist_ok=True)
        argv = [*PYTEST[:3], "-q", "--collect-only", "-p", "tests.lanes_collect", *TEST_ROOTS]
        env = dict(os.environ, MLSTACK_TEST_COLLECTED=str(self.tree))
        r = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
        if r.returncode != 0:
            self.say(f"collecting the tree failed (exit {r.returncode}): {(r.stdout + r.stderr)[-4000:]}")

    def run(self) -> int:
        self.collect_tree()
        heartbeat, beat_busy = time.monotonic(), cpu_busy_seconds()
        while True:
            self.cpu.sample(self.holder)
            running = [s for s in self.steps if s.state == "running"]
            for s in running:
                assert s.proc is not None
                if (rc := s.proc.poll()) is not None:
                    self.finish(s, rc)
            running = [s for s in self.steps if s.state == "running"]
            blocked: list[Step] = []
            for s in [s for s in self.steps if s.state == "waiting"]:
                if len(running) < self.lanes and self.ready(s, running, blocked):
                    self.start(s)
                    running.append(s)
                elif s.state == "waiting":
                    blocked.append(s)
                if self.lanes == 1 and s.state == "waiting":
                    break  # serial: strictly in order
            if not running and not [s for s in self.steps if s.state == "waiting"]:
                break
            if not running:  # nothing can ever start (a cycle or a failed dependency left)
                for s in self.steps:
                    if s.state == "waiting":
                        s.state, s.note = "failed", "not run: its dependencies did not pass"
                break
            if time.monotonic() - heartbeat > 60:
                share = busy_share(beat_busy, heartbeat)
                heartbeat, beat_busy = time.monotonic(), cpu_busy_seconds()
                waiting = [s.name for s in self.steps if s.state == "waiting"]
                running_now = ", ".join(self.progress(s) for s in running)
                self.say(f"running: {running_now}; waiting: {waiting}; last minute: {share}")
            time.sleep(1)
        return self.report()

    def report(self) -> int:
        failed = [s for s in self.steps if s.state != "passed"]
        print("\nstep                 result   seconds    cpu-s  runs  run-s  ctl-cpu  ct-cpu  summary")
        for s in self.steps:
            runs = s.runs()
            run_s, cpu, inside = (
                sum(float(r[key]) for r in runs)  # type: ignore[arg-type]
                for key in ("seconds", "controller_cpu", "containers_cpu")
            )
            print(
                f"{s.name:<20} {s.state:<8} {s.seconds:>7.0f} {self.cpu.seconds(s.name):>8.0f} {len(runs):>5}"
                f" {run_s:>6.0f} {cpu:>8.0f} {inside:>7.0f}  {s.note or s.summary}"
            )
        print(
            "(cpu-s: CPU seconds of its processes and of the containers of its vmids; runs: its tests'"
            " playbook runs; run-s: their wall seconds; ctl-cpu: their controller CPU; ct-cpu: the CPU"
            " inside their containers)"
        )
        self.say(self.cpu_split())
        self.cpu.cleanup(s.name for s in self.steps)
        print(skip_table(self.steps), flush=True)
        self.say(self.coverage())
        for s in failed:
            if s.rc is not None:
                lines = s.log.read_text(errors="replace").splitlines()
                first = first_failure(lines, tail=60)
                if first:
                    print(f"\n----- {s.name}: its first failure, in {s.log}:\n{first}", flush=True)
                tail = "\n".join(lines[-60:])
                print(f"\n----- {s.name} failed (exit {s.rc}); last lines of {s.log}:\n{tail}", flush=True)
        passed = len(self.steps) - len(failed)
        self.say(f"{passed}/{len(self.steps)} steps passed; all along: {busy_share(self.busy0, self.t0)}")
        if failed:
            self.say(f"failed: {', '.join(s.name for s in failed)} (their last lines above)")
        return 1 if failed else 0

    def cpu_split(self) -> str:
        """The whole run's CPU: the steps' (as counted above), and what no step claims."""
        if not self.cpu.enabled:
            return "CPU per step: not counted (no writable cgroup tree here)"
        busy = cpu_busy_seconds() - self.busy0
        steps = sum(self.cpu.seconds(s.name) for s in self.steps)
        return (
            f"CPU: {busy:.0f} core-seconds in all; the steps {steps:.0f}; containers no running step held "
            f"{self.cpu.unclaimed:.0f}; the rest {busy - steps - self.cpu.unclaimed:.0f} (the testbed's API "
            "server, its nodes' sshd and pct, this runner)"
        )

    def coverage(self) -> str:
        """Tests the tree collects against the tests the steps collected: a test no step runs shows here."""
        ran: dict[str, int] = {}
        for s in self.steps:
            if s.collected.exists():
                for nodeid in s.collected.read_text().splitlines():
                    ran[nodeid] = ran.get(nodeid, 0) + 1
        tree = self.tree.read_text().splitlines() if self.tree.exists() else []
        missing = sorted(set(tree) - set(ran))
        text = (
            f"tests: {len(tree)} collected in the tree ({' '.join(TEST_ROOTS)}); the steps collected "
            f"{len(ran)} of them, {sum(ran.values()) - len(ran)} a second time "
            f"({OTHER_STACK.name}, `again`); "
            f"{len(missing)} in no step"
        )
        if missing and len(self.steps) == len(plan([])):
            text += ": " + ", ".join(missing[:20]) + (" ..." if len(missing) > 20 else "")
        return text


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", help="comma-separated step names (dependencies are not added)")
    parser.add_argument("--list", action="store_true", help="print the steps and their commands, run nothing")
    parser.add_argument("extra", nargs="*", help="more pytest arguments for every pytest step (after --)")
    args = parser.parse_args()
    lanes = int(os.environ.get("MLSTACK_TEST_LANES", "6"))
    if os.geteuid() != 0:
        lanes = 1  # the namespaces need root (the testbed suites skip without it anyway)
    steps = plan(args.extra)
    if args.only:
        names = args.only.split(",")
        unknown = set(names) - {s.name for s in steps}
        if unknown:
            parser.error(f"unknown steps {sorted(unknown)}; known: {[s.name for s in steps]}")
        steps = [s for s in steps if s.name in names]
        for s in steps:
            s.after = tuple(a for a in s.after if a in names)
    if args.list:
        for s in steps:
            print(f"{s.name} [node {s.node}, vmids {len(s.vmids)}]: {shlex.join(command(s, args.extra, 1))}")
        return 0
    return Runner(steps, args.extra, max(1, lanes)).run()


if __name__ == "__main__":
    sys.exit(main())
