"""Running a case: a container through pct's direct backend, the role's userspace steps, the doctor inside.

Cases run in parallel threads; each logs into its own Case.log, progress lines go to stderr through say().
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from .. import paths
from .cases import DOCTOR_MP, USER_GROUPS, USER_UID, Case
from .host import Host
from .report import evaluate, evaluate_nccl

LD_CONF = "/etc/ld.so.conf.d/mlstack-nvidia.conf"
# Inside, with the doctor's folder on PYTHONPATH: `ldconfig -p` on stdin, libcuda's version printed.
LIBCUDA_VERSION = """
import sys
from mlstack_doctor.facts import libcuda
print(libcuda.cached_version(sys.stdin.read()) or "")
"""
# Run inside with the host's interpreter: mknod each host node afresh and open it. The device cgroup is
# what answers EPERM, so this shows which major:minor the container is allowed, driver or not.
CGCHECK = r"""
import errno, json, os, stat, sys
out = {}
for path, kind, ma, mi in json.loads(sys.argv[1]):
    p = "/tmp/mlstack-cgcheck" + path.replace("/", "_")
    try:
        os.unlink(p)
    except FileNotFoundError:
        pass
    try:
        os.mknod(p, (stat.S_IFCHR if kind == "c" else stat.S_IFBLK) | 0o600, os.makedev(ma, mi))
    except OSError as e:
        out[path] = "mknod " + errno.errorcode.get(e.errno, str(e.errno))
        continue
    try:
        os.close(os.open(p, os.O_RDWR))
        out[path] = "ok"
    except OSError as e:
        out[path] = errno.errorcode.get(e.errno, str(e.errno))
    os.unlink(p)
print(json.dumps(out))
"""

_print_lock = threading.Lock()


class Step(Protocol):
    """Logs a command's outcome into the case's log; True when it succeeded."""

    def __call__(self, title: str, r: subprocess.CompletedProcess[str], show: bool = True) -> bool: ...


def say(msg: str) -> None:
    """A progress line on stderr; cases run in threads, so lines must not interleave."""
    with _print_lock:
        print(f"gpu-passthrough-check: {msg}", file=sys.stderr, flush=True)


def pct(args: list[str], timeout: float = 300, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """The testbed's pct verbs on the direct backend: no API server, no testbed.json needed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(paths.TESTBED_DIR) + (f":{env['PYTHONPATH']}" if env.get("PYTHONPATH") else "")
    env["MLSTACK_TESTBED_PCT"] = "direct"
    argv = [sys.executable, "-m", "mlstack_testbed.node.pct", *args]
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env=env, input=stdin, check=False
        )
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return subprocess.CompletedProcess(argv, 124, out, f"pct {args[0]} timed out after {timeout:.0f} s")


def cleanup(vmid: int) -> None:
    """Stop and destroy the case's container if pct knows it (a leftover of an earlier run included)."""
    if (paths.DIRECT_DIR / f"{vmid}.conf").exists():
        pct(["stop", str(vmid)], timeout=120)
        r = pct(["destroy", str(vmid)], timeout=120)
        if r.returncode != 0:
            say(f"CT {vmid}: destroy failed: {r.stderr.strip()}")


def run_all(cases: list[Case], host: Host, args: argparse.Namespace) -> None:
    """Every case at once (--jobs); a case that breaks is judged `error` and its container removed."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
        futures = {ex.submit(run_case, c, host, args): c for c in cases}
        for fut in concurrent.futures.as_completed(futures):
            c = futures[fut]
            try:
                fut.result()
            except Exception as e:  # report, never leave a container behind
                c.result.update(verdict="error", detail=f"{type(e).__name__}: {e}")
                cleanup(c.vmid)


def run_case(case: Case, host: Host, args: argparse.Namespace) -> None:
    """Start the case's container, look at what it got, run the doctor inside and judge its report."""
    t0 = time.monotonic()
    log = case.log
    res = case.result
    res.update({"case": case.name, "vmid": case.vmid, "title": case.title})

    def step(title: str, r: subprocess.CompletedProcess[str], show: bool = True) -> bool:
        out = (r.stdout + (("\n" + r.stderr) if r.stderr.strip() else "")).rstrip()
        log.append(f"$ {title}  (rc {r.returncode})")
        if show and out:
            log.extend("    " + ln for ln in out.splitlines())
        return r.returncode == 0

    say(f"[{case.name}] CT {case.vmid}: {case.title}")
    cleanup(case.vmid)
    if not case_start(case, host, args, step):
        res["verdict"] = "error"
        res["detail"] = "the container did not start"
        return
    try:
        lxc = (paths.LXC_PATH / str(case.vmid) / "config").read_text().splitlines()
        keys = ("lxc.cgroup", "lxc.mount.entry", "lxc.idmap", "lxc.rootfs.path", "lxc.autodev")
        log.append("LXC config derived by lxcconf (device, mount and id lines):")
        log += ["    " + ln for ln in lxc if ln.startswith(keys)]
        res["lxc_device_lines"] = [ln for ln in lxc if ln.startswith("lxc.cgroup") or "passthrough" in ln]
        step(
            "ls -ln /dev/nvidia* inside",
            pct(["exec", str(case.vmid), "--", "sh", "-c", "ls -ln /dev/nvidia* 2>&1"]),
        )
        if not case.unprivileged:
            cg = [(p, *host.numbers[p]) for p in host.nodes]
            r = pct(["exec", str(case.vmid), "--", host.python, "-c", CGCHECK, json.dumps(cg)], timeout=120)
            step("cgroup check inside: mknod each host node afresh, open it (EPERM = not allowed)", r)
            try:
                res["cgroup_check"] = json.loads(r.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                res["cgroup_check"] = None
        # A PVE container's init (systemd, ifupdown) brings lo up and mounts a tmpfs on /dev/shm at boot;
        # these run no init (and lxc.autodev gives a /dev without /dev/shm). NCCL needs both.
        step(
            "bring lo up and mount a tmpfs on /dev/shm inside, as the container's init does",
            pct(["exec", str(case.vmid), "--", host.python, "-c", INIT_STEPS]),
        )
        userspace(case, host, step)
        report = run_doctor(case, host, args, step)
        res["doctor"] = report
        evaluate(case, host, report)
        if case.name == "pass" and res.get("verdict") == "ok" and wants_nccl(host, args):
            nccl = run_doctor(case, host, args, step, tier="nccl")
            evaluate_nccl(case, nccl)
    finally:
        if not args.keep:
            cleanup(case.vmid)
        res["seconds"] = round(time.monotonic() - t0, 1)
        say(f"[{case.name}] {res.get('verdict')} in {res['seconds']} s")


def case_start(case: Case, host: Host, args: argparse.Namespace, step: Step) -> bool:
    """pct create + start on the host's root; an unprivileged CT that cannot start: a privileged one."""
    opts = [
        "--hostname",
        f"gpucheck-{case.name}",
        "--description",
        f"mlstack gpu-passthrough-check: {case.title}",
    ]
    for k, v in {**case.devs, **case.mps}.items():
        opts += [f"--{k}", v]
    unpriv = ["--unprivileged", "1"] if case.unprivileged else []
    rootfs = f"hostroot:{args.rootfs}"
    ok = step(
        f"pct create {case.vmid} {rootfs} ...", pct(["create", str(case.vmid), rootfs, *opts, *unpriv]), False
    )
    if ok:
        step(f"pct config {case.vmid}", pct(["config", str(case.vmid)]))
        ok = step(f"pct start {case.vmid}", pct(["start", str(case.vmid)], timeout=120))
    if not ok and case.unprivileged:
        # Faithful fallback: the same devN (wrong gid, 0660), a privileged CT, the doctor as the same user.
        log_file = paths.LOG_DIR / f"lxc-{case.vmid}.log"
        tail = log_file.read_text().splitlines()[-5:] if log_file.is_file() else []
        case.log += ["    lxc log: " + ln for ln in tail]
        case.log.append(
            "an unprivileged CT on the host's root could not start here: same devN, privileged CT"
        )
        case.result["fallback"] = "privileged"
        case.unprivileged = False
        cleanup(case.vmid)
        ok = step(
            f"pct create {case.vmid} {rootfs} ... (privileged)",
            pct(["create", str(case.vmid), rootfs, *opts]),
            False,
        )
        ok = ok and step(f"pct start {case.vmid}", pct(["start", str(case.vmid)], timeout=120))
    if not ok:
        log_file = paths.LOG_DIR / f"lxc-{case.vmid}.log"
        if log_file.is_file():
            case.log += ["    lxc log: " + ln for ln in log_file.read_text().splitlines()[-10:]]
    return ok


def userspace(case: Case, host: Host, step: Step) -> None:
    """The nvidia_userspace role's bind method inside: ld.so.conf.d entry, ldconfig, libcuda's version."""
    if not host.gpu:
        case.log.append("nvidia_userspace (bind): skipped, no driver on this host (as the role skips it)")
        return
    if case.unprivileged:
        case.log.append(
            "nvidia_userspace (bind): not done in the unprivileged CT (its /etc belongs to the host's root "
            "here); the node permission is what this case tests"
        )
        return
    # libcuda's version read as the role reads it (ct_state's libcuda item): the doctor's parser of
    # `ldconfig -p`, run inside so that the link is followed in the container's own filesystem.
    script = (
        f"echo {shlex.quote(host.ct_lib_dir)} > {LD_CONF} && ldconfig; "
        f"ldconfig -p | PYTHONPATH={DOCTOR_MP} {shlex.quote(host.python)} -c {shlex.quote(LIBCUDA_VERSION)}"
    )
    r = pct(["exec", str(case.vmid), "--", "/bin/sh", "-c", script], timeout=120)
    step(f"nvidia_userspace bind method inside: {LD_CONF} -> {host.ct_lib_dir}; ldconfig; libcuda version", r)
    got = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    case.result["libcuda_version"] = got
    case.log.append(
        f"libcuda inside: {got or 'none'}; host module: {host.driver} -> "
        + ("match" if got == host.driver else "the role's assert would fail here")
    )


# In Python (the host's, which every case runs): a GPU host's image may have no `ip`.
INIT_STEPS = """
import fcntl, os, socket, struct, subprocess
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
with socket.socket() as s:
    flags = struct.unpack("16sH", fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH14x", b"lo", 0))[:18])[1]
    fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))
print("lo up")
if not os.path.ismount("/dev/shm"):
    os.makedirs("/dev/shm", exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", "tmpfs", "/dev/shm"], check=True)
    print("/dev/shm: tmpfs mounted")
"""


def wants_nccl(host: Host, args: argparse.Namespace) -> bool:
    """The NCCL tier after the pass case: with several GPUs (as provisioning runs it), or when asked."""
    return args.nccl == "always" or (args.nccl == "auto" and host.gpu_count > 1)


def run_doctor(
    case: Case, host: Host, args: argparse.Namespace, step: Step, tier: str | None = None
) -> dict[str, Any] | None:
    """The doctor inside with `pct exec` (as the case's user), its JSON report pulled back, or None."""
    vmid = str(case.vmid)
    home = "/root"
    prefix: list[str] = []
    python = host.python
    if case.as_user:
        home = f"/tmp/mlstack-u{USER_UID}"
        prefix = ["setpriv", f"--reuid={USER_UID}", f"--regid={USER_UID}", f"--groups={USER_GROUPS}"]
        probe = pct(["exec", vmid, "--", *prefix, python, "-c", "pass"])
        if probe.returncode != 0:
            case.log.append(
                f"{python} cannot be run by uid {USER_UID} here ({probe.stderr.strip()}); "
                "using /usr/bin/python3"
            )
            python = "/usr/bin/python3"
        pct(["exec", vmid, "--", *prefix, "mkdir", "-p", home])
    tier = tier or case.tier
    name = case.name if tier == case.tier else f"{case.name}-{tier}"
    out = f"/tmp/doctor-{name}.json"
    env = [
        "env",
        f"HOME={home}",
        f"PYTHONPATH={DOCTOR_MP}",
        "PYTHONDONTWRITEBYTECODE=1",
        f"TRITON_CACHE_DIR={home}/.triton/cache",
    ]
    doctor = [
        python,
        "-m",
        "mlstack_doctor",
        "--tier",
        tier,
        "--model",
        "tiny",
        "--quiet",
        "--output",
        out,
    ]
    if args.profile:
        # The expected versions travel as the profile's own uv.lock, in a folder named after it.
        lock = Path(args.profile) / "uv.lock" if Path(args.profile).is_dir() else Path(args.profile)
        inside = f"/tmp/mlstack-profile/{lock.resolve().parent.name}"
        pct(["exec", vmid, "--", "mkdir", "-p", inside])
        pct(["push", vmid, str(lock), f"{inside}/uv.lock"])
        doctor += ["--profile", inside]
    doctor += ["--purpose", args.purpose]
    if case.name == "pass" and args.pass_skip and tier == case.tier:
        doctor += ["--only", ",".join(doctor_probes(tier, args.pass_skip.split(",")))]
        case.result["skipped_probes"] = args.pass_skip
    timeout = 1500 if tier != "quick" else 600
    argv = ["exec", vmid, "--", *prefix, *env, *doctor]
    t0 = time.monotonic()
    r = pct(argv, timeout=timeout)
    key = "doctor" if tier == case.tier else f"doctor_{tier}"
    case.result[f"{key}_rc"] = r.returncode
    case.result[f"{key}_seconds"] = round(time.monotonic() - t0, 1)
    who = f"uid {USER_UID}" if case.as_user else "root"
    secs = case.result[f"{key}_seconds"]
    step(f"pct exec {vmid} -- mlstack-doctor --tier {tier} --model tiny  (as {who}, {secs} s)", r)
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / "report.json"
        pr = pct(["pull", vmid, out, str(local)])
        if pr.returncode != 0 or not local.is_file():
            case.log.append(f"no doctor report: {pr.stderr.strip()}")
            return None
        report: dict[str, Any] = json.loads(local.read_text())
    if args.report_dir:
        Path(args.report_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.report_dir) / f"doctor-{name}.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def doctor_probes(tier: str, skip: list[str]) -> list[str]:
    """The probes of a tier (the doctor's own list, from verify/src) less the skipped ones."""
    from mlstack_doctor import engine

    return [p.name for p in engine.selected(tier) if p.name not in skip]
