"""gpu-passthrough-check: GPU passthrough proven on a real machine, with the doctor inside the container.

On any machine with NVIDIA device nodes (a real GPU, or the testbed's dummy nodes), as root:

1. creates containers through the testbed's pct verbs (direct backend: no API server, no network),
   rootfs = the machine's own root under an overlay (hostroot.py), with a devN entry for every NVIDIA
   node found on the host, written by the project's own filter (plugins/filter/container_options.py,
   gid/mode from roles/gpu_container/defaults) and translated to LXC by lxcconf (cgroup allows from
   each node's major:minor, passthrough nodes mknod'ed with gid/mode, bind entries, autodev);
2. binds the host's driver library folder read-only (the nvidia_userspace `bind` method) and does the
   role's steps inside (ld.so.conf.d entry + ldconfig);
3. runs the doctor inside with `pct exec`, prints its report and checks its verdict, for:
     pass         everything passed through                               -> doctor passes (full tier)
     fault-node   /dev/nvidia-uvm not passed, so its major:minor not allowed -> NVIDIA_UVM_MISSING
     fault-libs   the driver libraries not bound             -> NVML_UNAVAILABLE or LIBCUDA_NOT_FOUND
     fault-perm   unprivileged CT, nodes with a wrong gid and mode 0660,
                  doctor run as a user not in that group                  -> NVIDIA_NODE_PERMISSION
   and says which checks this machine cannot make (no driver: no GPU stages, no driver libraries).

Exit codes: 0 every case gave its expected verdict; 1 a case did not (or broke); 2 could not run (not
root, no LXC, no NVIDIA nodes, bad arguments); 3 no NVIDIA driver on this machine: what could be
checked gave its expected verdict, the GPU checks were not made (listed in the output).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import glob
import importlib.util
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import hostroot, paths

REPO = paths.REPO_DIR
EXIT_OK, EXIT_WRONG, EXIT_CANNOT_RUN, EXIT_NO_GPU = 0, 1, 2, 3
DOCTOR_MP = "/opt/mlstack/doctor"
LD_CONF = "/etc/ld.so.conf.d/mlstack-nvidia.conf"
DEFAULT_DEBS = REPO / ".debs"
DEFAULT_PREFIX = Path("/tmp/mlstack-lxc")
# LXC's compiled-in mount point for a container's rootfs (Debian's build); a private prefix lacks it.
LXC_ROOTFS_MOUNT = Path("/usr/lib/x86_64-linux-gnu/lxc/rootfs")
NV_LIB = re.compile(r"^lib(cuda|cudadebugger|nvcuvid|nvoptix|nvidia-[A-Za-z0-9_.-]+?)\.so(\.\d+)*$")
SYSTEM_LIB_DIRS = {
    "/lib",
    "/lib64",
    "/usr/lib",
    "/usr/lib64",
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
}
WRONG_GID = 0  # PVE's default gid when devN has none: root's group, which an ML user is not in
USER_UID, USER_GROUPS = 1000, "44"  # the non-root user inside: in `video` (44), as our devN gid assumes
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


NOT_CHECKABLE = (
    "not checkable on this machine (no NVIDIA driver): torch CUDA, Triton's GPU target, FLA on the GPU,",
    "the model forward, the driver libraries (nvidia_userspace bind) and their absence (fault-libs),",
    "and the doctor's code for a missing node (dummy nodes stop it at NVIDIA_NO_DRIVER first).",
)


class CannotRun(Exception):
    pass


_print_lock = threading.Lock()


def say(msg: str) -> None:
    with _print_lock:
        print(f"gpu-passthrough-check: {msg}", file=sys.stderr, flush=True)


def sh(argv: list[str], timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, **kw)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return subprocess.CompletedProcess(argv, 124, out, f"timed out after {timeout:.0f} s")
    except FileNotFoundError:
        return subprocess.CompletedProcess(argv, 127, "", f"{argv[0]}: not found")


# ------------------------------------------------------------------------------ LXC


def ensure_lxc(debs_dir: Path, prefix: Path, force_debs: bool) -> str:
    """LXC on PATH, or unpacked from carried Debian packages into a private prefix (no network)."""
    if not force_debs and shutil.which("lxc-start") and shutil.which("lxc-attach"):
        return f"system LXC ({shutil.which('lxc-start')})"
    debs = sorted(debs_dir.glob("*.deb"))
    if not debs:
        raise CannotRun(
            f"no lxc-start on PATH and no .deb in {debs_dir}; on a machine with network: "
            f"mkdir -p {debs_dir} && cd {debs_dir} && apt-get download lxc liblxc1 liblxc-common libapparmor1"
        )
    if not shutil.which("dpkg-deb"):
        raise CannotRun("dpkg-deb is needed to unpack the carried LXC packages")
    prefix.mkdir(parents=True, exist_ok=True)
    for deb in debs:
        r = sh(["dpkg-deb", "-x", str(deb), str(prefix)], timeout=120)
        if r.returncode != 0:
            raise CannotRun(f"dpkg-deb -x {deb.name}: {r.stderr.strip()}")
    share = prefix / "usr/share/lxc"
    for f in (share / "config").rglob("*"):
        if f.is_file():
            text = f.read_text(errors="replace")
            new = re.sub(r"(?<![\w/])/usr/share/lxc", str(share), text)
            if new != text:
                f.write_text(new)
    os.environ["PATH"] = f"{prefix}/usr/bin:{prefix}/usr/sbin:{os.environ.get('PATH', '/usr/bin:/bin')}"
    libdir = f"{prefix}/usr/lib/x86_64-linux-gnu"
    old = os.environ.get("LD_LIBRARY_PATH")
    os.environ["LD_LIBRARY_PATH"] = libdir + (f":{old}" if old else "")
    os.environ["MLSTACK_LXC_CONFIG_DIR"] = str(share / "config")
    LXC_ROOTFS_MOUNT.mkdir(parents=True, exist_ok=True)
    paths.LXC_PATH.mkdir(parents=True, exist_ok=True)
    r = sh(["lxc-start", "--version"])
    if r.returncode != 0:
        raise CannotRun(f"the unpacked lxc-start does not run: {(r.stderr or r.stdout).strip()}")
    return f"LXC {r.stdout.strip()} unpacked from {len(debs)} .deb into {prefix}"


# ------------------------------------------------------------------------- host facts


@dataclass
class Host:
    nodes: list[str]
    numbers: dict[str, tuple[str, int, int]]
    proc_majors: dict[str, int]
    driver: str | None
    lib_dir: str | None
    lib_note: str
    python: str
    python_mounts: list[str]
    device_gid: int
    device_mode: str
    ct_lib_dir: str

    @property
    def gpu(self) -> bool:
        return bool(self.driver)


def nvidia_nodes() -> list[str]:
    """What pve_host finds: /dev/nvidia* and /dev/nvidia-caps/*, device nodes only."""
    found = []
    for p in sorted(set(glob.glob("/dev/nvidia*") + glob.glob("/dev/nvidia-caps/*"))):
        try:
            mode = os.stat(p).st_mode
        except OSError:
            continue
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            found.append(p)
    return found


def proc_majors() -> dict[str, int]:
    out, section = {}, ""
    for line in Path("/proc/devices").read_text().splitlines():
        if line.endswith(":"):
            section = line
        elif section.startswith("Character") and "nvidia" in line:
            num, name = line.split()
            out[name] = int(num)
    return out


def driver_version() -> str | None:
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    m = re.search(r"Kernel Module(?: for [\w-]+)?\s+([\d.]+)", text)
    return m.group(1) if m else None


def find_lib_dir() -> str | None:
    """The host folder holding libcuda.so.1: ldconfig's cache, LD_LIBRARY_PATH, then the usual places."""
    dirs: list[str] = []
    ldconfig = "/sbin/ldconfig" if os.path.exists("/sbin/ldconfig") else "ldconfig"
    r = sh([ldconfig, "-p"], timeout=30)
    for line in r.stdout.splitlines():
        if "libcuda.so.1 " in line and "=>" in line:
            dirs.append(os.path.dirname(line.split("=>")[-1].strip()))
    dirs += [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    dirs += ["/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib64"]
    return next((d for d in dirs if os.path.exists(os.path.join(d, "libcuda.so.1"))), None)


def libcuda_locations() -> list[str]:
    """Every libcuda.so.1 in the host's linker cache, with where it really is (diagnostics)."""
    ldconfig = "/sbin/ldconfig" if os.path.exists("/sbin/ldconfig") else "ldconfig"
    out = []
    for line in sh([ldconfig, "-p"], timeout=30).stdout.splitlines():
        if "libcuda.so.1 " in line and "=>" in line:
            loc = line.split("=>")[-1].strip()
            real = os.path.realpath(loc)
            out.append(f"{loc} -> {real} (on the mount at {hostroot.mount_of(real)})")
    return out


def stage_libs(src: str, dst: Path, version: str) -> int:
    """Copy the driver's libraries (of this version) and their soname links into a folder of their own."""
    dst.mkdir(parents=True, exist_ok=True)
    n = 0
    for p in sorted(Path(src).iterdir()):
        if not NV_LIB.match(p.name):
            continue
        target = dst / p.name
        if p.is_symlink():
            link = os.readlink(p)
            if "/" not in link and NV_LIB.match(link) and not target.is_symlink():
                target.symlink_to(link)
        elif p.is_file() and p.name.endswith(f".so.{version}") and not target.exists():
            shutil.copy2(p, target)
            n += 1
    return n


def lib_dir_for_bind(explicit: str | None, version: str | None) -> tuple[str | None, str]:
    if not version:
        return None, "no NVIDIA driver loaded: no driver libraries to bind"
    src = explicit or find_lib_dir()
    if not src:
        return None, "libcuda.so.1 not found on the host (ldconfig -p, LD_LIBRARY_PATH, /usr/local/nvidia)"
    if os.path.realpath(src) in SYSTEM_LIB_DIRS or os.path.exists(os.path.join(src, "libc.so.6")):
        dst = paths.STATE_DIR / "gpucheck" / f"nvidia-lib-{version}"
        n = stage_libs(src, dst, version)
        return str(dst), f"{src} is a system library folder: {n} driver libraries staged into {dst}"
    return src, f"{src} (a folder of the driver's libraries only)"


def python_facts(python: str) -> list[str]:
    """Mount points (other than /) that the interpreter's files live on: bound at the same path."""
    code = (
        "import json,site,sys;"
        "print(json.dumps([sys.prefix,sys.base_prefix,sys.executable,*site.getsitepackages()]))"
    )
    r = sh([python, "-c", code], timeout=60)
    if r.returncode != 0:
        raise CannotRun(f"{python} does not run: {r.stderr.strip()}")
    mounts = {hostroot.mount_of(p) for p in json.loads(r.stdout) if os.path.exists(p)}
    return sorted(m for m in mounts if m != "/" and not m.startswith(("/proc", "/sys", "/dev")))


def role_default(role: str, var: str, fallback: str) -> str:
    text = (REPO / "roles" / role / "defaults" / "main.yml").read_text()
    m = re.search(rf"^{var}:\s*\"?([^\"\n#]+?)\"?\s*$", text, re.M)
    return m.group(1) if m else fallback


def load_filter() -> types.ModuleType:
    """The project's own devN/mpN filter (plugins/filter/container_options.py), with or without Ansible."""
    try:
        import ansible.errors
    except ImportError:
        ansible = types.ModuleType("ansible")
        errors = types.ModuleType("ansible.errors")
        errors.AnsibleFilterError = type("AnsibleFilterError", (Exception,), {})  # type: ignore[attr-defined]
        ansible.errors = errors  # type: ignore[attr-defined]
        sys.modules.setdefault("ansible", ansible)
        sys.modules.setdefault("ansible.errors", errors)
    spec = importlib.util.spec_from_file_location(
        "mlstack_container_options", REPO / "plugins" / "filter" / "container_options.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def host_facts(args: argparse.Namespace) -> Host:
    nodes = nvidia_nodes()
    if not nodes:
        raise CannotRun(
            "no NVIDIA device nodes on this machine (/dev/nvidia*): nothing to pass through "
            "(on a GPU host: nvidia-smi; nvidia-modprobe -u -c=0. "
            "Without a GPU: testbed/testbed up --gpu-nodes 2)"
        )
    numbers = {}
    for p in nodes:
        st = os.stat(p)
        numbers[p] = ("b" if stat.S_ISBLK(st.st_mode) else "c", os.major(st.st_rdev), os.minor(st.st_rdev))
    version = driver_version()
    lib_dir, note = lib_dir_for_bind(args.lib_dir, version)
    return Host(
        nodes=nodes,
        numbers=numbers,
        proc_majors=proc_majors(),
        driver=version,
        lib_dir=lib_dir,
        lib_note=note,
        python=args.python,
        python_mounts=python_facts(args.python),
        device_gid=int(role_default("gpu_container", "gpu_container_device_gid", "44")),
        device_mode=role_default("gpu_container", "gpu_container_device_mode", "0666"),
        ct_lib_dir=role_default(
            "nvidia_userspace", "nvidia_userspace_ct_lib_dir", "/usr/local/lib/mlstack-nvidia"
        ),
    )


# ------------------------------------------------------------------------------ cases


@dataclass
class Case:
    name: str
    title: str
    vmid: int
    devs: dict[str, str]
    mps: dict[str, str]
    tier: str
    unprivileged: bool = False
    as_user: bool = False
    dropped: str | None = None  # the node left out (fault-node)
    expect: str = ""
    log: list[str] = field(default_factory=list)
    result: dict[str, Any] = field(default_factory=dict)


def pct(args: list[str], timeout: float = 300, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(paths.TESTBED_DIR) + (f":{env['PYTHONPATH']}" if env.get("PYTHONPATH") else "")
    env["MLSTACK_TESTBED_PCT"] = "direct"
    argv = [sys.executable, "-m", "mlstack_testbed.pct", *args]
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env=env, input=stdin, check=False
        )
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return subprocess.CompletedProcess(argv, 124, out, f"pct {args[0]} timed out after {timeout:.0f} s")


def build_cases(host: Host, args: argparse.Namespace, filt: types.ModuleType) -> list[Case]:
    devs = filt.device_options(host.nodes, "all", host.device_gid, host.device_mode)
    mounts = [{"host": str(REPO / "verify" / "src"), "ct": DOCTOR_MP, "ro": True}]
    mounts += [{"host": m, "ct": m, "ro": True} for m in host.python_mounts]
    libs = [{"host": host.lib_dir, "ct": host.ct_lib_dir, "ro": True}] if host.lib_dir else []
    with_libs = filt.mount_options(mounts + libs)
    without_libs = filt.mount_options(mounts)
    base = args.vmid_base
    dropped = "/dev/nvidia-uvm" if "/dev/nvidia-uvm" in host.nodes else host.nodes[0]
    numbers = "{1}:{2}".format(*host.numbers[dropped])
    node_devs = filt.device_options(
        [n for n in host.nodes if n != dropped], "all", host.device_gid, host.device_mode
    )
    perm_devs = filt.device_options(host.nodes, "all", WRONG_GID, "0660")
    cases = [
        Case(
            "pass", "every NVIDIA node as devN, driver libraries bound", base, devs, with_libs, args.pass_tier
        ),
        Case(
            "fault-node",
            f"{dropped} not passed (no devN), so its {numbers} not allowed",
            base + 1,
            node_devs,
            with_libs,
            args.fault_tier,
            dropped=dropped,
        ),
        Case("fault-libs", "driver libraries not bound", base + 2, devs, without_libs, args.fault_tier),
        Case(
            "fault-perm",
            f"unprivileged, nodes gid={WRONG_GID} mode=0660, doctor as uid {USER_UID} (groups {USER_GROUPS})",
            base + 3,
            perm_devs,
            with_libs,
            args.fault_tier,
            unprivileged=True,
            as_user=True,
        ),
    ]
    wanted = args.cases.split(",") if args.cases else [c.name for c in cases]
    unknown = set(wanted) - {c.name for c in cases}
    if unknown:
        raise CannotRun(f"unknown case(s): {', '.join(sorted(unknown))}")
    return [c for c in cases if c.name in wanted]


def run_case(case: Case, host: Host, args: argparse.Namespace) -> None:
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
        userspace(case, host, step)
        report = run_doctor(case, host, args, step)
        res["doctor"] = report
        evaluate(case, host, report)
    finally:
        if not args.keep:
            cleanup(case.vmid)
        res["seconds"] = round(time.monotonic() - t0, 1)
        say(f"[{case.name}] {res.get('verdict')} in {res['seconds']} s")


def case_start(case: Case, host: Host, args: argparse.Namespace, step: Any) -> bool:
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


def userspace(case: Case, host: Host, step: Any) -> None:
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
    script = (
        f"echo {shlex.quote(host.ct_lib_dir)} > {LD_CONF} && ldconfig; "
        "ldconfig -p | sed -n 's/.*libcuda\\.so\\.1 .*=> //p' | head -n1 | xargs -r readlink -f "
        "| sed -n 's/.*libcuda\\.so\\.//p'"
    )
    r = pct(["exec", str(case.vmid), "--", "/bin/sh", "-c", script], timeout=120)
    step(f"nvidia_userspace bind method inside: {LD_CONF} -> {host.ct_lib_dir}; ldconfig; libcuda version", r)
    got = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    case.result["libcuda_version"] = got
    case.log.append(
        f"libcuda inside: {got or 'none'}; host module: {host.driver} -> "
        + ("match" if got == host.driver else "the role's assert would fail here")
    )


def run_doctor(case: Case, host: Host, args: argparse.Namespace, step: Any) -> dict[str, Any] | None:
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
    out = f"/tmp/doctor-{case.name}.json"
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
        case.tier,
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
    if case.name == "pass" and args.pass_skip:
        doctor += ["--only", ",".join(doctor_probes(case.tier, args.pass_skip.split(",")))]
        case.result["skipped_probes"] = args.pass_skip
    timeout = 1500 if case.tier != "quick" else 600
    argv = ["exec", vmid, "--", *prefix, *env, *doctor]
    t0 = time.monotonic()
    r = pct(argv, timeout=timeout)
    case.result["doctor_rc"] = r.returncode
    case.result["doctor_seconds"] = round(time.monotonic() - t0, 1)
    who = f"uid {USER_UID}" if case.as_user else "root"
    secs = case.result["doctor_seconds"]
    step(f"pct exec {vmid} -- mlstack-doctor --tier {case.tier} --model tiny  (as {who}, {secs} s)", r)
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / "report.json"
        pr = pct(["pull", vmid, out, str(local)])
        if pr.returncode != 0 or not local.is_file():
            case.log.append(f"no doctor report: {pr.stderr.strip()}")
            return None
        report: dict[str, Any] = json.loads(local.read_text())
    if args.report_dir:
        Path(args.report_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.report_dir) / f"doctor-{case.name}.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def doctor_probes(tier: str, skip: list[str]) -> list[str]:
    """The probes of a tier (the doctor's own list, from verify/src) less the skipped ones."""
    sys.path.insert(0, str(REPO / "verify" / "src"))
    try:
        from mlstack_doctor import engine
    finally:
        sys.path.pop(0)
    return [p.name for p in engine.selected(tier) if p.name not in skip]


# --------------------------------------------------------------------------- verdicts


def probes(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in report.get("probes", [])}


def evaluate(case: Case, host: Host, report: dict[str, Any] | None) -> None:
    res = case.result
    if report is None:
        res.update(verdict="error", detail="the doctor gave no report")
        return
    pr = probes(report)
    root = (report.get("summary") or {}).get("root_cause") or {}
    res["root_cause"] = root
    nodes = pr.get("nvidia_device_nodes", {})
    got = f"{root.get('code')} ({root.get('probe')})" if root else "none (passed)"

    def verdict(ok: bool, expected: str, detail: str = "") -> None:
        res.update(verdict="ok" if ok else "wrong", expected=expected, got=got, detail=detail)

    if case.name == "pass":
        if not host.gpu:
            res.update(
                verdict="not-checked" if root.get("code") == "NVIDIA_NO_DRIVER" else "wrong",
                expected="NVIDIA_NO_DRIVER (nodes passed through, no driver behind them)",
                got=got,
                detail="no NVIDIA driver here: torch CUDA, Triton, FLA, the model forward and the driver "
                "libraries cannot be checked",
            )
            return
        fails = [(p["name"], p.get("code")) for p in report["probes"] if p["status"] == "fail"]
        tt = pr.get("triton_target", {})
        fd = pr.get("fla_device", {})
        mf = pr.get("model_forward", {})
        musts = {
            "triton_target": tt.get("status") == "pass" and tt.get("evidence", {}).get("backend") == "cuda",
            "fla_device": fd.get("status") == "pass" and fd.get("evidence", {}).get("fla_device") == "cuda",
        }
        if case.tier != "quick":
            musts["model_forward"] = mf.get("status") == "pass"
            musts["logits_finite"] = mf.get("evidence", {}).get("logits_finite") is True
        if res.get("skipped_probes"):
            detail_skip = f"; left out on request: {res['skipped_probes']}"
        else:
            detail_skip = ""
        ev = tt.get("evidence", {})
        detail = (
            f"Triton target {ev.get('target')} (arch {ev.get('arch')}); FLA device "
            f"{fd.get('evidence', {}).get('fla_device')!r}; "
            f"model_forward {mf.get('status')}: {mf.get('summary', '')}"
        )
        detail += detail_skip
        if fails:
            detail += "; failed: " + ", ".join(f"{n} {c}" for n, c in fails)
        verdict(not fails and all(musts.values()), "every probe passes (no failure accepted)", detail)
    elif case.name == "fault-node":
        code = "NVIDIA_UVM_MISSING" if case.dropped == "/dev/nvidia-uvm" else "NVIDIA_NODE_MISSING"
        cg = (res.get("cgroup_check") or {}).get(case.dropped or "")
        others = [v for k, v in (res.get("cgroup_check") or {}).items() if k != case.dropped]
        cg_ok = cg == "EPERM" and "EPERM" not in others
        detail = f"cgroup: a fresh {case.dropped} node inside gives {cg} (others: {sorted(set(others))})"
        if not host.gpu:
            res.update(
                verdict="not-checked" if cg_ok else "wrong",
                expected=f"{code} (needs a driver: with dummy nodes the doctor stops at NVIDIA_NO_DRIVER)",
                got=f"{got}; nodes probe {nodes.get('code')}",
                detail=detail + "; the cgroup deny and the node's absence were checked",
            )
            return
        res["nodes_code"] = nodes.get("code")
        verdict(
            nodes.get("code") == code and cg_ok,
            f"{code} from nvidia_device_nodes",
            detail
            + f"; nvidia_device_nodes: {nodes.get('status')} {nodes.get('code')}: {nodes.get('summary')}",
        )
    elif case.name == "fault-libs":
        ok = root.get("probe") == "nvidia_driver" and root.get("code") in (
            "NVML_UNAVAILABLE",
            "LIBCUDA_NOT_FOUND",
        )
        verdict(ok, "NVML_UNAVAILABLE or LIBCUDA_NOT_FOUND (nvidia_driver)", root.get("summary", ""))
    elif case.name == "fault-perm":
        verdict(
            root.get("code") == "NVIDIA_NODE_PERMISSION",
            "NVIDIA_NODE_PERMISSION",
            root.get("summary", "") + (" (privileged fallback)" if res.get("fallback") else ""),
        )


# ------------------------------------------------------------------------------- main


def cleanup(vmid: int) -> None:
    if (paths.DIRECT_DIR / f"{vmid}.conf").exists():
        pct(["stop", str(vmid)], timeout=120)
        r = pct(["destroy", str(vmid)], timeout=120)
        if r.returncode != 0:
            say(f"CT {vmid}: destroy failed: {r.stderr.strip()}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="gpu-passthrough-check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--vmid-base", type=int, default=950, help="first vmid (4 are used; default 950)")
    p.add_argument(
        "--cases", default="", help="comma list: pass,fault-node,fault-libs,fault-perm (default all)"
    )
    p.add_argument("--pass-tier", default="full", choices=("quick", "full"))
    p.add_argument("--fault-tier", default="quick", choices=("quick", "full"))
    p.add_argument(
        "--pass-skip",
        default="",
        help="probes left out of the pass case (doctor --only the rest), e.g. gdn_backward; reported",
    )
    p.add_argument(
        "--profile",
        default="",
        help="the stack profile the doctor checks versions against (a profiles/<name> folder or its "
        "uv.lock; default: the doctor's built-in default)",
    )
    p.add_argument("--purpose", default="training", choices=("training", "inference"))
    p.add_argument(
        "--python", default=sys.executable, help="the interpreter the doctor tests (default: this one)"
    )
    p.add_argument("--lib-dir", default=None, help="host folder with the driver libraries (default: found)")
    p.add_argument(
        "--rootfs",
        default="overlay",
        choices=hostroot.MODES,
        help="overlay (default) of the host's root; bind writes the host's root (disposable machines only)",
    )
    p.add_argument(
        "--lxc-debs", type=Path, default=DEFAULT_DEBS, help="carried LXC .debs (used when no lxc-start)"
    )
    p.add_argument("--lxc-prefix", type=Path, default=DEFAULT_PREFIX)
    p.add_argument(
        "--lxc-from-debs", action="store_true", help="use the carried .debs even if LXC is installed"
    )
    p.add_argument("--jobs", type=int, default=4, help="cases run at once (default 4)")
    p.add_argument("--report-dir", default=None, help="save each doctor JSON report here")
    p.add_argument("--json", dest="json_out", default=None, help="write the summary as JSON here")
    p.add_argument("--keep", action="store_true", help="leave the containers (pct destroy them later)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if os.geteuid() != 0:
            raise CannotRun("must run as root (real LXC containers, device nodes, mounts)")
        lxc = ensure_lxc(args.lxc_debs, args.lxc_prefix, args.lxc_from_debs)
        host = host_facts(args)
        cases = build_cases(host, args, load_filter())
    except CannotRun as e:
        print(f"gpu-passthrough-check: cannot run: {e}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    paths.LOG_DIR.mkdir(parents=True, exist_ok=True)
    print("== host")
    print(f"   {lxc}")
    print(f"   NVIDIA nodes: {', '.join(f'{p} ({k} {a}:{b})' for p, (k, a, b) in host.numbers.items())}")
    print(f"   /proc/devices nvidia majors: {host.proc_majors or 'none'}")
    print(f"   driver: {host.driver or 'none (no /proc/driver/nvidia/version)'}")
    print(f"   driver libraries: {host.lib_note}; bound read-only at {host.ct_lib_dir}")
    for loc in libcuda_locations():
        print(f"   host ldconfig -p: {loc}")
    print(f"   python: {host.python}; extra mounts for it: {host.python_mounts or 'none'}")
    print(f"   rootfs: the host's root ({args.rootfs}); devN gid={host.device_gid} mode={host.device_mode}")
    skipped: list[Case] = []
    if not host.gpu:
        skipped = [c for c in cases if c.name == "fault-libs"]
        cases = [c for c in cases if c.name != "fault-libs"]
        for c in skipped:
            c.result.update(
                case=c.name,
                vmid=c.vmid,
                title=c.title,
                verdict="not-checked",
                detail="no driver libraries on this host: nothing to leave unbound",
            )
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
        futures = {ex.submit(run_case, c, host, args): c for c in cases}
        for fut in concurrent.futures.as_completed(futures):
            c = futures[fut]
            try:
                fut.result()
            except Exception as e:  # report, never leave a container behind
                c.result.update(verdict="error", detail=f"{type(e).__name__}: {e}")
                cleanup(c.vmid)
    for c in cases:
        r = c.result
        print(f"\n== {c.name}: CT {c.vmid}: {c.title}")
        for line in c.log:
            print(line)
        root = r.get("root_cause") or {}
        if root:
            print(f"   doctor's root cause: {root.get('probe')} {root.get('code')}")
            print(f"   doctor's fix: {root.get('fix')}")
        print(f"   VERDICT {r.get('verdict')}: expected {r.get('expected')}; got {r.get('got')}")
        if c.result.get("detail"):
            print(f"   {c.result['detail']}")
    everything = cases + skipped
    print(f"\n== summary ({time.monotonic() - t0:.0f} s)")
    for c in everything:
        r = c.result
        got = r.get("got", "") or r.get("detail", "")
        print(f"   {c.name:<11} CT {c.vmid}  {r.get('verdict', '?'):<12} {got}")
    if not host.gpu:
        for line in NOT_CHECKABLE:
            print(f"   {line}")
    summary = [{k: v for k, v in c.result.items() if k != "doctor"} for c in everything]
    if args.json_out:
        data = {"gpu": host.gpu, "driver": host.driver, "cases": summary}
        Path(args.json_out).write_text(json.dumps(data, indent=1) + "\n")
    if any(c.result.get("verdict") in ("wrong", "error", None) for c in everything):
        return EXIT_WRONG
    return EXIT_OK if host.gpu else EXIT_NO_GPU


if __name__ == "__main__":
    sys.exit(main())
