"""`testbed controller up|run|down`: a second Ansible controller beside the checkout's .venv, against the
same testbed, holding the other controller stack (tools/controller_stack.py): ansible-core 2.21 (the
`ansible` 14.x package, community.proxmox 2.x) where .venv holds 2.19, ansible-core 2.19 where .venv holds
2.21.

Where the machine's python3 runs that stack, the controller is a venv, <repo>/.venv-<stack> (Debian 13:
.venv-core219). Where it does not (Debian 12's 3.11 and ansible-core 2.21, which needs Python >= 3.12),
the controller is a Debian trixie LXC container (`mlstack-controller-core221`, Python 3.13) holding that
venv:

- privileged, because the checkout and the testbed's state (0600 keys and secrets) are bind-mounted into
  it at the same absolute paths, and its root must read and write them as the machine's root does (an
  unprivileged root is uid 100000 outside and sees them as nobody's);
- in the machine's network namespace (`lxc.net.0.type = none`): the testbed's API and sshd on 127.0.0.1
  are its own;
- not in the machine's PID and mount namespaces, so what must run on the machine (`testbed/testbed`,
  lxc-attach/-info/-stop/-destroy into the testbed's containers) is sent there through the testbed
  node's sshd (the machine itself) by a helper: /usr/local/bin/lxc-* inside are that helper, and the
  checkout's testbed/testbed is shown as that helper inside the container only (a bind mount).

`up` is idempotent (well under a second when nothing changed) and starts a stopped container;
`run -- CMD...` runs CMD in the controller with the venv first on PATH, in the current directory (the
checkout where the current one is not shared with the container); `down` stops it, `down --purge` also
removes it (or the venv).
"""

import argparse
import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from . import paths
from .lxc import rootfs
from .node import host_setup
from .proc import report_up, run, say


def _controller_stack():
    """tools/controller_stack.py, the one table of the controller stacks (a script, not a package)."""
    if "controller_stack" in sys.modules:  # tests/lanes.py imported it
        return sys.modules["controller_stack"]
    spec = importlib.util.spec_from_file_location(
        "controller_stack", paths.REPO_DIR / "tools/controller_stack.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["controller_stack"] = module
    spec.loader.exec_module(module)
    return module


# The stack beside the one the checkout's venv holds (testbed/testbed runs on $MLSTACK_VENV, else .venv).
MAIN_VENV = Path(os.environ.get("MLSTACK_VENV", paths.REPO_DIR / ".venv"))
_stacks = _controller_stack()
STACK = _stacks.other(_stacks.installed(MAIN_VENV, sys.version_info[:2]))
NAME = f"mlstack-controller-{STACK.name}"
SUITE = "trixie"
# tini as PID 1: it reaps what ansible-playbook and ssh leave behind, which `sleep` as PID 1 would not.
PACKAGES = "python3,python3-venv,openssh-client,ca-certificates,git,make,tini"
REQUIREMENTS = paths.REPO_DIR / STACK.requirements
LOCK = paths.REPO_DIR / STACK.lock
# What installs the pins into a venv (uv; pip where uv fails), as for the checkout's .venv.
VENV_INSTALL = paths.REPO_DIR / "tools" / "venv-install"
HOST_VENV = paths.REPO_DIR / f".venv-{STACK.name}"

CT_DIR = paths.LXC_PATH / NAME
ROOTFS = CT_DIR / "rootfs"
RECIPE_FILE = CT_DIR / "controller.json"
LOG_FILE = paths.LOG_DIR / f"lxc-{NAME}.log"
LOCK_FILE = paths.RUN_DIR / f"{NAME}.lock"
# Inside the container: the venv (Python 3.13's, useless to the machine's 3.11, so not in the checkout).
CT_VENV = Path("/opt/mlstack-controller/venv")
HELPER_DIR = Path("/usr/local/libexec/mlstack-controller")
HOST_COMMANDS = ("lxc-attach", "lxc-info", "lxc-stop", "lxc-destroy", "lxc-ls")
STAMP = ".mlstack-controller.json"
PY_NAME = re.compile(r"python3\.(\d+)")
TESTBED_CLI = paths.TESTBED_DIR / "testbed"

# What `run` passes from the caller's environment into the container (it starts from an empty one).
KEEP_VARS = ("CI", "TERM", "NO_COLOR", "COLUMNS")
KEEP_PREFIXES = ("ANSIBLE_", "PYTEST_", "MLSTACK_TESTBED_")
# CA bundle variables (uv, pip, requests, curl): kept where the file exists in the container too.
TLS_VARS = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT")
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

HELPER = '''#!/usr/bin/python3
"""Runs a command on the machine that hosts this controller container (written by
testbed/mlstack_testbed/controller.py). Called as lxc-attach, lxc-info, ...: that command; as the
checkout's testbed/testbed: the machine's testbed/testbed; as on-host: its arguments. It goes through
the testbed node's sshd (the machine, as root) and, under `testbed controller run`, into the mount
namespace that command was called from (the node's sshd has a private one)."""

import os
import shlex
import sys
from pathlib import Path

STATE = os.environ.get("MLSTACK_TESTBED_STATE", {state!r})
PORT = os.environ.get("MLSTACK_TESTBED_SSH_PORT", {port!r})
# The same absolute paths here and on the machine (bind mounts).
SHARED = ({repo!r}, STATE)


def main() -> int:
    name = Path(sys.argv[0]).name
    if name == "on-host":
        argv = sys.argv[1:]
    elif name == "testbed":
        argv = [{testbed_cli!r}, *sys.argv[1:]]
    else:
        argv = [name, *sys.argv[1:]]
    if not argv:
        print("usage: on-host COMMAND [ARGS...]", file=sys.stderr)
        return 2
    cwd = os.getcwd()
    if not any(cwd == p or cwd.startswith(p + "/") for p in SHARED):
        cwd = "/"
    env = [f"{{k}}={{v}}" for k, v in os.environ.items() if k.startswith("MLSTACK_TESTBED_")]
    remote = ["env", "--chdir", cwd, *env, *argv]
    pid = os.environ.get("MLSTACK_CONTROLLER_HOST_PID", "")
    if pid.isdigit():
        remote = ["nsenter", "--target", pid, "--mount", "--", *remote]
    ssh = [
        "ssh", "-T", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR", "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={{STATE}}/ssh/known_hosts", "-o", "GlobalKnownHostsFile=/dev/null",
        "-i", f"{{STATE}}/ssh/id_ed25519", "-p", PORT, "root@127.0.0.1", shlex.join(remote),
    ]
    os.execvp("ssh", ssh)
    return 127


sys.exit(main())
'''


# ------------------------------------------------------------------------ common


def host_python() -> str:
    found = shutil.which("python3")
    if not found:
        raise RuntimeError("no python3 on PATH")
    return found


def python_version(python: str) -> tuple[int, int]:
    r = run([python, "-c", "import sys; print(*sys.version_info[:2])"], timeout=30)
    if not r.ok:
        raise RuntimeError(f"{python} does not run: {r.detail()}")
    major, minor = r.out.split()
    return int(major), int(minor)


def in_container() -> bool:
    """The machine's python3 decides: older than the stack's ansible-core allows -> the trixie container."""
    return not _stacks.runs_on(STACK, python_version(host_python()))


def requirements_digest(python: str) -> str:
    """What the venv was built from: the pins, the lock, what installs them and the interpreter's version
    (as `make venv` remakes .venv when any of its inputs changes)."""
    h = hashlib.sha256()
    for f in (REQUIREMENTS, LOCK, VENV_INSTALL):
        h.update(f.name.encode() + b"\0" + (f.read_bytes() if f.is_file() else b"-"))
    h.update(python.encode())
    return h.hexdigest()


def read_stamp(venv_on_host: Path) -> dict[str, str]:
    f = venv_on_host / STAMP
    try:
        data = json.loads(f.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def install_script(venv: Path, python: str) -> str:
    """Shell lines that build `venv` from the pins (and the lock where there is one, else write it)."""
    v, q = str(venv), shlex.quote
    return "\n".join(
        [
            "set -eu",
            f"rm -rf {q(v)}",
            f"{q(python)} -m venv {q(v)}",
            shlex.join([str(VENV_INSTALL), v, str(REQUIREMENTS), str(LOCK)]),
        ]
    )


def link_collection(venv_on_host: Path) -> bool:
    """This checkout as the collection mlstack.pve in the venv's collections (ANSIBLE_COLLECTIONS_PATH),
    as `make venv` does for .venv; on every `up`, since a checkout elsewhere (CI's clone) reuses the venv."""
    link = venv_on_host / "collections/ansible_collections/mlstack/pve"
    if link.is_symlink() and os.readlink(link) == str(paths.REPO_DIR):
        return False
    link.parent.mkdir(parents=True, exist_ok=True)
    link.unlink(missing_ok=True)
    link.symlink_to(paths.REPO_DIR)
    return True


def venv_env(venv: Path, base: Mapping[str, str]) -> dict[str, str]:
    env = dict(base)
    env["PATH"] = f"{venv}/bin:{base.get('PATH', BASE_PATH)}"
    env["VIRTUAL_ENV"] = str(venv)
    env.pop("PYTHONHOME", None)
    env.setdefault("ANSIBLE_CONFIG", str(paths.REPO_DIR / "ansible.cfg"))
    env.setdefault("ANSIBLE_COLLECTIONS_PATH", str(venv / "collections"))
    return env


# ------------------------------------------------------------------ host (Python >= 3.12)


def host_up() -> int:
    t0 = time.monotonic()
    python = host_python()
    version = ".".join(map(str, python_version(python)))
    if read_stamp(HOST_VENV).get("digest") == requirements_digest(version) and LOCK.is_file():
        print(f"already up: venv {HOST_VENV} (Python {version}, {REQUIREMENTS.name})")
    else:
        say(f"building {HOST_VENV} with {python} (Python {version}) from {REQUIREMENTS.name}")
        r = run(["/bin/sh", "-c", install_script(HOST_VENV, python)], timeout=1800)
        if not r.ok:
            raise RuntimeError(f"building {HOST_VENV} failed: {r.detail()}")
        # After the install: it may have written the lock.
        (HOST_VENV / STAMP).write_text(json.dumps({"digest": requirements_digest(version)}) + "\n")
        print(f"started/made: venv {HOST_VENV}")
    if link_collection(HOST_VENV):
        print(f"started/made: {HOST_VENV}/collections: mlstack.pve is {paths.REPO_DIR}")
    print(f"controller up in {time.monotonic() - t0:.1f} s: {HOST_VENV} (the machine's Python {version})")
    return 0


def host_run(cmd: Sequence[str]) -> int:
    if not (HOST_VENV / STAMP).is_file():
        raise RuntimeError(f"no controller venv at {HOST_VENV}: run `testbed/testbed controller up` first")
    return subprocess.run(list(cmd), env=venv_env(HOST_VENV, os.environ), check=False).returncode


def host_down(purge: bool) -> int:
    if purge and HOST_VENV.exists():
        shutil.rmtree(HOST_VENV)
        print(f"removed {HOST_VENV}")
    else:
        print("controller: a venv, nothing runs")
    return 0


# ------------------------------------------------------------------ container (Python 3.11)


def shared_dirs() -> list[Path]:
    """Bound into the container at the same absolute paths."""
    return [paths.REPO_DIR, paths.STATE_DIR, paths.LXC_PATH]


def recipe() -> dict[str, str]:
    return {"suite": SUITE, "packages": PACKAGES, "mirror": rootfs.MIRROR}


def state() -> tuple[str, int | None]:
    """('RUNNING' | 'STOPPED' | 'MISSING', init pid)."""
    if not (CT_DIR / "config").is_file():
        return "MISSING", None
    r = run(["lxc-info", "-n", NAME, "-s", "-p"], timeout=15)
    found = re.search(r"^State:\s*(\S+)", r.out, re.M)
    pid = re.search(r"^PID:\s*(\d+)", r.out, re.M)
    status = found.group(1) if r.ok and found else "STOPPED"
    return status, int(pid.group(1)) if status == "RUNNING" and pid else None


def config_text() -> str:
    for d in shared_dirs():
        if re.search(r"\s", str(d)):
            raise RuntimeError(f"{d} has white space in its path, which an lxc.mount.entry cannot hold")
    lines = [
        f"# {NAME}: {STACK.ansible} on Debian {SUITE}'s Python (testbed/mlstack_testbed/controller.py)",
        f"lxc.include = {paths.lxc_config_dir()}/common.conf",
        f"lxc.uts.name = {NAME}",
        f"lxc.rootfs.path = dir:{ROOTFS}",
        # A second userland for the machine's root, not a guest to confine.
        "lxc.apparmor.profile = unconfined",
        # The machine's network namespace: 127.0.0.1:8006 and :2222 are the testbed's.
        "lxc.net.0.type = none",
        "lxc.autodev = 1",
        "lxc.tty.max = 0",
        "lxc.init.cmd = /usr/bin/tini -- /bin/sleep infinity",
        "lxc.signal.halt = SIGTERM",
        # Python's multiprocessing (Ansible's workers) needs a /dev/shm.
        "lxc.mount.entry = tmpfs dev/shm tmpfs rw,nosuid,nodev,mode=1777,create=dir 0 0",
        "lxc.mount.entry = /etc/resolv.conf etc/resolv.conf none bind,ro,create=file 0 0",
    ]
    # Same absolute paths as on the machine: inventories, ansible.cfg, reports and testbed.json name them.
    for d in shared_dirs():
        opts = "bind" if d == paths.LXC_PATH else "rbind"
        lines.append(f"lxc.mount.entry = {d} {str(d).lstrip('/')} none {opts},create=dir 0 0")
    shim = ROOTFS / str(HELPER_DIR / "testbed").lstrip("/")
    lines.append(f"lxc.mount.entry = {shim} {str(TESTBED_CLI).lstrip('/')} none bind,ro 0 0")
    return "\n".join(lines) + "\n"


def build_rootfs() -> None:
    """debootstrap trixie into rootfs.partial, then rename: an interrupted build is never used."""
    partial = CT_DIR / "rootfs.partial"
    remove_tree(partial)
    partial.mkdir(parents=True)
    log = paths.LOG_DIR / f"debootstrap-{NAME}.log"
    say(f"debootstrap {SUITE} (minbase + {PACKAGES}) from {rootfs.MIRROR}; a minute or two")
    argv = ["debootstrap", "--variant=minbase", f"--include={PACKAGES}", SUITE, str(partial), rootfs.MIRROR]
    with log.open("w") as out:
        p = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=1800, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"debootstrap {SUITE} failed (exit {p.returncode}); see {log}")
    (partial / "etc/hostname").write_text(NAME + "\n")
    (partial / "etc/hosts").write_text(f"127.0.0.1\tlocalhost\n127.0.1.1\t{NAME}\n")
    run(["chroot", str(partial), "apt-get", "clean"], timeout=60)
    partial.replace(ROOTFS)


def sync_cas() -> bool:
    """The machine's extra CA certificates trusted inside (TLS-intercepting egress); True if changed."""
    dst = ROOTFS / "usr/local/share/ca-certificates"
    dst.mkdir(parents=True, exist_ok=True)
    want = {p.name: p.read_bytes() for p in rootfs.extra_cas()}
    have = {p.name: p.read_bytes() for p in dst.glob("*.crt")}
    if want == have:
        return False
    for name in set(have) - set(want):
        (dst / name).unlink()
    for name, data in want.items():
        (dst / name).write_bytes(data)
    r = run(["chroot", str(ROOTFS), "update-ca-certificates", "--fresh"], timeout=120)
    if not r.ok:
        raise RuntimeError(f"update-ca-certificates in {NAME} failed: {r.detail()}")
    return True


def write_if_changed(path: Path, text: str, mode: int = 0o644) -> bool:
    if path.is_file() and path.read_text() == text:
        path.chmod(mode)
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    tmp.chmod(mode)
    tmp.replace(path)
    return True


def sync_files() -> bool:
    """The host helper (and its names), and the node's pinned host key for paramiko; True if changed."""
    helper = HELPER.format(
        state=str(paths.STATE_DIR),
        port=str(paths.SSH_PORT),
        repo=str(paths.REPO_DIR),
        testbed_cli=str(TESTBED_CLI),
    )
    root = ROOTFS / str(HELPER_DIR).lstrip("/")
    changed = write_if_changed(root / "on-host", helper, 0o755)
    changed |= write_if_changed(root / "testbed", helper, 0o755)
    for name in HOST_COMMANDS:
        link = ROOTFS / "usr/local/bin" / name
        if not link.is_symlink() or os.readlink(link) != str(HELPER_DIR / "on-host"):
            link.unlink(missing_ok=True)
            link.symlink_to(HELPER_DIR / "on-host")
            changed = True
    known = paths.SYSTEM_KNOWN_HOSTS
    if known.is_file():
        changed |= write_if_changed(ROOTFS / str(known).lstrip("/"), known.read_text())
    return changed


def start() -> int:
    r = run(["lxc-start", "-n", NAME, "-l", "ERROR", "-o", str(LOG_FILE)], timeout=60)
    if not r.ok:
        raise RuntimeError(f"lxc-start {NAME} failed: {r.detail()}; see {LOG_FILE}")
    run(["lxc-wait", "-n", NAME, "-s", "RUNNING", "-t", "30"], timeout=40)
    status, pid = state()
    if status != "RUNNING" or pid is None:
        raise RuntimeError(f"{NAME} did not reach RUNNING ({status}); see {LOG_FILE}")
    return pid


def stop() -> bool:
    if state()[0] != "RUNNING":
        return False
    run(["lxc-stop", "-n", NAME, "-t", "10"], timeout=40)
    if state()[0] == "RUNNING":
        raise RuntimeError(f"{NAME} did not stop")
    return True


def mounts_current(pid: int) -> bool:
    """Whether the running container still sees what the machine has at the shared paths: a folder
    removed and made again there (`testbed down --purge` and `up`) leaves the container's bind mount on
    the old one, and a file replaced there drops the helper's bind mount on testbed/testbed."""
    inside = Path(f"/proc/{pid}/root")
    try:
        for d in shared_dirs():
            here, there = d.stat(), (inside / str(d).lstrip("/")).stat()
            if (here.st_dev, here.st_ino) != (there.st_dev, there.st_ino):
                return False
        shim = (ROOTFS / str(HELPER_DIR / "testbed").lstrip("/")).read_bytes()
        return (inside / str(TESTBED_CLI).lstrip("/")).read_bytes() == shim
    except OSError:
        return False


def mounts_below(path: Path) -> list[str]:
    prefix = str(path).rstrip("/") + "/"
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        target = line.split()[4].replace("\\040", " ")
        if target.startswith(prefix) or target == str(path):
            found.append(target)
    return found


def remove_tree(path: Path) -> None:
    """rm -rf, refused while anything is mounted below (the checkout is bound into the rootfs)."""
    if not path.exists():
        return
    mounted = mounts_below(path)
    if mounted:
        raise RuntimeError(f"refusing to remove {path}: mounted below it: {', '.join(mounted)}")
    shutil.rmtree(path)


def attach(argv: Sequence[str], env: Mapping[str, str], cwd: str, timeout: float | None = None) -> int:
    cmd = ["lxc-attach", "-n", NAME, "--clear-env", "--", "/usr/bin/env", "-i", f"--chdir={cwd}"]
    cmd += [f"{k}={v}" for k, v in env.items()]
    return subprocess.run(cmd + list(argv), timeout=timeout, check=False).returncode


def inside_env() -> dict[str, str]:
    """The controller's environment: the venv first on PATH and a few of the caller's variables."""
    caller = os.environ
    env = {"HOME": "/root", "LANG": "C.UTF-8", "PATH": BASE_PATH}
    env.update({k: caller[k] for k in KEEP_VARS if k in caller})
    env.update({k: v for k, v in caller.items() if k.startswith(KEEP_PREFIXES)})
    for k in TLS_VARS:
        if k in caller and (ROOTFS / caller[k].lstrip("/")).exists():
            env[k] = caller[k]
    # Where the helper enters the machine's mount namespace: this process's (it waits for the command).
    env["MLSTACK_CONTROLLER_HOST_PID"] = str(os.getpid())
    return venv_env(CT_VENV, env)


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """One `up` or `down` at a time; a second waits for the first."""
    paths.RUN_DIR.mkdir(parents=True, exist_ok=True)
    with LOCK_FILE.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def container_up() -> int:
    t0 = time.monotonic()
    if os.geteuid() != 0:
        raise RuntimeError("the controller container needs root (lxc-start, debootstrap)")
    done: list[str] = []
    already: list[str] = []
    if host_setup.ensure_packages():
        done.append("packages")
    paths.ensure_dirs()
    built = json.loads(RECIPE_FILE.read_text()) if RECIPE_FILE.is_file() else None
    if built != recipe() or not (ROOTFS / "usr/bin/python3").exists():
        stop()
        remove_tree(ROOTFS)
        CT_DIR.mkdir(parents=True, exist_ok=True)
        t1 = time.monotonic()
        build_rootfs()
        RECIPE_FILE.write_text(json.dumps(recipe(), indent=2) + "\n")
        done.append(f"rootfs Debian {SUITE} in {time.monotonic() - t1:.0f} s")
    else:
        already.append(f"rootfs Debian {SUITE}")
    if sync_cas():
        done.append("extra CA certificates trusted")
    sync_files()
    config_changed = write_if_changed(CT_DIR / "config", config_text())
    status, pid = state()
    if status == "RUNNING" and pid and (config_changed or not mounts_current(pid)):
        say(f"restarting {NAME} (its configuration or a bind mount changed)")
        stop()
        status = "STOPPED"
    if status == "RUNNING":
        already.append(f"container {NAME} running")
    else:
        start()
        done.append(f"container {NAME} started")
    pyver = ct_python_version()
    digest = requirements_digest(pyver)
    venv_on_host = ROOTFS / str(CT_VENV).lstrip("/")
    if read_stamp(venv_on_host).get("digest") == digest and LOCK.is_file():
        already.append(f"venv {CT_VENV} (Python {pyver})")
    else:
        t1 = time.monotonic()
        say(f"building {CT_VENV} in {NAME} (Python {pyver}) from {REQUIREMENTS.name}; a few minutes")
        env = inside_env()
        rc = attach(["/bin/sh", "-c", install_script(CT_VENV, "/usr/bin/python3")], env, "/", timeout=1800)
        if rc != 0:
            raise RuntimeError(f"building {CT_VENV} in {NAME} failed (exit {rc})")
        digest = requirements_digest(pyver)  # the lock may have just been written
        (venv_on_host / STAMP).write_text(json.dumps({"digest": digest}) + "\n")
        done.append(f"venv {CT_VENV} in {time.monotonic() - t1:.0f} s")
    if link_collection(venv_on_host):
        done.append(f"{CT_VENV}/collections: mlstack.pve is {paths.REPO_DIR}")
    report_up(
        already, done, f"controller up in {time.monotonic() - t0:.1f} s: container {NAME}, venv {CT_VENV}"
    )
    return 0


def ct_python_version() -> str:
    """The container's python3 version, read from its rootfs (no process needed)."""
    minors = [
        int(m.group(1)) for p in (ROOTFS / "usr/bin").glob("python3.*") if (m := PY_NAME.fullmatch(p.name))
    ]
    if not minors:
        raise RuntimeError(f"no python3 in {ROOTFS}")
    return f"3.{max(minors)}"


def container_run(cmd: Sequence[str]) -> int:
    status, pid = state()
    if status == "MISSING" or not (ROOTFS / str(CT_VENV).lstrip("/") / STAMP).is_file():
        raise RuntimeError(f"no controller container {NAME}: run `testbed/testbed controller up` first")
    if (CT_DIR / "config").read_text() != config_text():
        raise RuntimeError(
            f"{NAME} is set up for another checkout or state dir: run `testbed/testbed controller up` here"
        )
    sync_files()
    if status == "RUNNING" and pid and not mounts_current(pid):
        say(f"restarting {NAME}: a shared folder or the testbed/testbed helper changed on the machine")
        stop()
        status = "STOPPED"
    if status != "RUNNING":
        start()
    cwd = Path.cwd()
    if not any(cwd == d or d in cwd.parents for d in shared_dirs()):
        cwd = paths.REPO_DIR
    return attach(cmd, inside_env(), str(cwd))


def container_down(purge: bool) -> int:
    if os.geteuid() != 0:
        raise RuntimeError("must run as root")
    print(f"{NAME}: {'stopped' if stop() else 'was not running'}")
    if purge and CT_DIR.exists():
        remove_tree(CT_DIR)
        print(f"{NAME}: removed {CT_DIR}")
    return 0


# ------------------------------------------------------------------------ CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="controller_cmd", required=True)
    sub.add_parser("up", help="build and start it (idempotent; seconds when already up)")
    r = sub.add_parser("run", help="run a command in it: run -- CMD [ARGS...]")
    r.add_argument("command", nargs=argparse.REMAINDER, help="the command and its arguments, after --")
    d = sub.add_parser("down", help="stop it")
    d.add_argument("--purge", action="store_true", help="also remove it (its rootfs and venv)")


def cmd(args: argparse.Namespace) -> int:
    container = in_container()
    if args.controller_cmd == "up":
        if not container:
            return host_up()
        with locked():
            return container_up()
    if args.controller_cmd == "run":
        command = list(args.command)
        if command[:1] == ["--"]:
            command = command[1:]
        if not command:
            raise RuntimeError("nothing to run: testbed/testbed controller run -- CMD [ARGS...]")
        return container_run(command) if container else host_run(command)
    if not container:
        return host_down(args.purge)
    with locked():
        return container_down(args.purge)
