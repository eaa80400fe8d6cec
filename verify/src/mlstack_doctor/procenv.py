"""The process's own environment, read without importing torch: limits, identity, the variables the
stack reads at start-up, and the Python start-up hooks that may have changed them.

One source for each fact the process-environment probe, the classifier's fixes and the reduced-
environment rerun need: `limits()`, `identity()`, `stack_variables()`, `hooks()`, `stub_libcuda()`,
`alloc_conf_problems()`. Only the variable families below ever leave this module, and a value that
looks like a secret is redacted (`redact`).
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import re
import resource
import site
import sys
import sysconfig
from pathlib import Path
from typing import Any

GIB = 1 << 30
# The variables torch, CUDA, NCCL, Triton and inductor read at start (prefixes), and single names.
FAMILIES = ("PYTORCH_", "TORCH_", "TORCHINDUCTOR_", "CUDA_", "NCCL_", "TRITON_", "OMP_", "MKL_")
SINGLE = ("LD_LIBRARY_PATH", "LD_PRELOAD", "OPENBLAS_NUM_THREADS", "NVIDIA_VISIBLE_DEVICES")
# Variables whose value is a folder that must exist (or whose parent must, for caches made on first use).
MUST_EXIST = (
    "CUDA_HOME",
    "CUDA_PATH",
    "TRITON_LIBCUDA_PATH",
    "TRITON_PTXAS_PATH",
    "TRITON_CUOBJDUMP_PATH",
    "TRITON_NVDISASM_PATH",
    "TRITON_HOME",
)
MADE_ON_USE = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_DUMP_DIR", "TRITON_OVERRIDE_DIR")
# Of those, the caches the stack writes on every compile: an existing folder the process cannot write fails
# every torch.compile. process_env writes there (Triton's own cache: the triton_cache_dir probe does).
WRITTEN_ON_USE = ("TORCHINDUCTOR_CACHE_DIR",)
INT_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS")
ALLOC_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
# Names getpass.getuser() reads before it asks the passwd database.
LOGIN_VARS = ("LOGNAME", "USER", "LNAME", "USERNAME")

_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|API_?KEY|ACCESS_?KEY|PRIVATE|CREDENTIAL|AUTH", re.I)
_SECRET_VALUE = (
    re.compile(r"(?i)\b[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@"),  # a URL with user:password@
    re.compile(r"\b(?:hf|ghp|gho|ghs|github_pat|glpat|xox[abp]|sk|AKIA)[-_A-Za-z0-9]{16,}"),
    re.compile(r"(?i)(?:token|password|passwd|secret|api[_-]?key)\s*[=:]"),
)
REDACTED = "<redacted>"


def redact(name: str, value: str) -> str:
    """`value`, or REDACTED when the name or the value looks like a credential."""
    if _SECRET_NAME.search(name) or any(p.search(value) for p in _SECRET_VALUE):
        return REDACTED
    return value


def in_family(name: str) -> bool:
    return name.startswith(FAMILIES) or name in SINGLE


def stack_variables(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The family variables set in `environ` (default: this process's), values redacted where needed."""
    env = os.environ if environ is None else environ
    return {k: redact(k, v) for k, v in sorted(env.items()) if in_family(k)}


def initial_environ() -> dict[str, str] | None:
    """The environment this process was started with (/proc/self/environ is not changed by os.environ)."""
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return None
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


# Variables the doctor sets itself before its probes run (e.g. TRITON_CACHE_DIR from --triton-cache-root):
# a difference from the environment the process started with that is the doctor's own is no hook's doing.
SET_BY_DOCTOR: dict[str, str] = {}


def set_by_doctor(name: str, value: str) -> None:
    """Set `name` for this process and the workers it starts, remembered as the doctor's own setting."""
    os.environ[name] = value
    SET_BY_DOCTOR[name] = value


def changed_at_start() -> dict[str, dict[str, str | None]]:
    """Family variables a start-up hook (sitecustomize, a .pth line) changed in this interpreter."""
    first = initial_environ()
    if first is None:
        return {}
    names = {k for k in (*first, *os.environ) if in_family(k)}
    return {
        k: {"started_with": _red(k, first.get(k)), "now": _red(k, os.environ.get(k))}
        for k in sorted(names)
        if first.get(k) != os.environ.get(k) and SET_BY_DOCTOR.get(k) != os.environ.get(k)
    }


def _red(name: str, value: str | None) -> str | None:
    return None if value is None else redact(name, value)


# ---- limits ---------------------------------------------------------------------------------------

LIMITS = {
    "address_space": resource.RLIMIT_AS,
    "processes": resource.RLIMIT_NPROC,
    "open_files": resource.RLIMIT_NOFILE,
    "locked_memory": resource.RLIMIT_MEMLOCK,
    "stack": resource.RLIMIT_STACK,
    "file_size": resource.RLIMIT_FSIZE,
    "data": resource.RLIMIT_DATA,
    "cpu_time": resource.RLIMIT_CPU,
}
ULIMIT_FLAG = {
    "address_space": "-v",
    "processes": "-u",
    "open_files": "-n",
    "locked_memory": "-l",
    "stack": "-s",
    "file_size": "-f",
    "data": "-d",
    "cpu_time": "-t",
}
# systemd's name for each limit (LimitFSIZE=, ...), for a fix where the job is a unit.
SYSTEMD_LIMIT = {
    "address_space": "LimitAS",
    "processes": "LimitNPROC",
    "open_files": "LimitNOFILE",
    "locked_memory": "LimitMEMLOCK",
    "stack": "LimitSTACK",
    "file_size": "LimitFSIZE",
    "data": "LimitDATA",
    "cpu_time": "LimitCPU",
}
PRLIMIT_FLAG = {
    "address_space": "--as",
    "processes": "--nproc",
    "open_files": "--nofile",
    "locked_memory": "--memlock",
    "stack": "--stack",
    "file_size": "--fsize",
    "data": "--data",
    "cpu_time": "--cpu",
}


def limits() -> dict[str, dict[str, int | None]]:
    """Soft and hard limits (None: unlimited)."""
    out: dict[str, dict[str, int | None]] = {}
    for name, res in LIMITS.items():
        soft, hard = resource.getrlimit(res)
        out[name] = {
            "soft": None if soft == resource.RLIM_INFINITY else soft,
            "hard": None if hard == resource.RLIM_INFINITY else hard,
        }
    return out


def open_fds() -> int | None:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


def threads_of_uid(uid: int) -> int | None:
    """Threads the uid runs now (RLIMIT_NPROC counts threads of the real uid, machine-wide)."""
    total = 0
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        m_uid = re.search(r"^Uid:\s+(\d+)", text, re.M)
        m_thr = re.search(r"^Threads:\s+(\d+)", text, re.M)
        if m_uid and m_thr and int(m_uid.group(1)) == uid:
            total += int(m_thr.group(1))
    return total


def threads_needed() -> int:
    """Threads one training process starts: an OpenMP and an OpenBLAS pool of one per CPU (or
    OMP_NUM_THREADS), CUDA's and the dataloader's helpers, inductor's compile workers."""
    cpus = os.cpu_count() or 1
    try:
        omp = int(os.environ.get("OMP_NUM_THREADS", "") or cpus)
    except ValueError:
        omp = cpus
    return 2 * omp + 32


def address_space_needed(expect_gpu: bool) -> int:
    """Below this RLIMIT_AS the stack cannot start. Measured on an H200 (driver 580): cuInit and a
    primary context fail at 8 GiB and work at 16 GiB; torch's first CUDA tensor worked at 64 GiB.
    Without a GPU: torch's libraries map ~2 GiB and every thread's malloc arena reserves 64 MiB."""
    if expect_gpu:
        return 16 * GIB
    return 2 * GIB + 64 * (1 << 20) * (os.cpu_count() or 1)


# ---- identity -------------------------------------------------------------------------------------


def identity() -> dict[str, Any]:
    uid, gid = os.getuid(), os.getgid()
    out: dict[str, Any] = {"uid": uid, "gid": gid}
    passwd_home: str | None = None
    try:
        entry = pwd.getpwuid(uid)
        out["user"], passwd_home = entry.pw_name, entry.pw_dir
    except KeyError as exc:
        out["user"] = None
        out["passwd_error"] = f"KeyError: {exc}"
    try:
        out["group"] = grp.getgrgid(gid).gr_name
    except KeyError as exc:
        out["group"] = None
        out["group_error"] = f"KeyError: {exc}"
    out["login_vars"] = {k: os.environ[k] for k in LOGIN_VARS if os.environ.get(k)}
    home = os.environ.get("HOME")
    out["home"] = home
    # HOME unset is no fault by itself (pct exec and systemd units run without it): os.path.expanduser('~')
    # then takes the passwd entry's home, so that folder is the one to check.
    if not home and passwd_home is None:
        out["home_problem"] = "HOME is unset and the uid has no passwd entry, so '~' is not expanded"
        return out
    where = f"HOME={home}" if home else f"HOME is unset; the passwd home {passwd_home}"
    path = home or passwd_home or ""
    if not os.path.isdir(path):
        out["home_problem"] = f"{where} does not exist"
    elif not os.access(path, os.W_OK | os.X_OK):
        out["home_problem"] = f"{where} is not writable by uid {uid}"
    return out


# ---- the settings with a grammar ------------------------------------------------------------------

_BOOL = ("True", "False", "true", "false", "1", "0")
ALLOC_KEYS: dict[str, str] = {  # key -> kind, as torch 2.11's c10 CUDAAllocatorConfig parses them
    "backend": "backend",
    "max_split_size_mb": "int",
    "max_non_split_rounding_mb": "int",
    "garbage_collection_threshold": "fraction",
    "roundup_power2_divisions": "divisions",
    "expandable_segments": "bool",
    "release_lock_on_cudamalloc": "bool",
    "pinned_use_cuda_host_register": "bool",
    "pinned_use_background_threads": "bool",
    "pinned_num_register_threads": "int",
    "pinned_reserve_segment_size_mb": "int",
    "graph_capture_record_stream_reuse": "bool",
    "per_process_memory_fraction": "fraction",
}


def alloc_conf_problems(value: str) -> list[str]:
    """Why torch's allocator would refuse `value` (PYTORCH_CUDA_ALLOC_CONF's `key:value,...`); torch
    raises at CUDA init, or aborts the process (SIGABRT) on text it cannot tokenize."""
    out: list[str] = []
    # roundup_power2_divisions takes a list in brackets, whose commas are not separators
    items = re.findall(r"[^,\[]+(?:\[[^\]]*\][^,]*)?", value)
    for item in (i.strip() for i in items):
        if not item:
            continue
        key, sep, val = (s.strip() for s in item.partition(":"))
        if not sep or not val:
            out.append(f"{item!r} is not key:value")
            continue
        kind = ALLOC_KEYS.get(key)
        if kind is None:
            out.append(f"unknown key {key!r} (torch knows {', '.join(sorted(ALLOC_KEYS))})")
        elif kind == "bool" and val not in _BOOL:
            out.append(f"{key}:{val}: expected True or False")
        elif kind == "int" and not val.isdigit():
            out.append(f"{key}:{val}: expected a whole number")
        elif kind == "backend" and val not in ("native", "cudaMallocAsync"):
            out.append(f"{key}:{val}: expected native or cudaMallocAsync")
        elif kind == "fraction" and not _fraction(val):
            out.append(f"{key}:{val}: expected a number in (0.0, 1.0)")
        elif kind == "divisions" and not re.fullmatch(r"\d+|\[(\s*[\w>]+\s*:\s*\d+\s*,?)+\]", val):
            out.append(f"{key}:{val}: expected N or [size:N,...]")
    return out


def _fraction(text: str) -> bool:
    try:
        return 0.0 < float(text) < 1.0
    except ValueError:
        return False


def variable_problems(env: dict[str, str] | None = None) -> dict[str, str]:
    """Family variables whose value cannot work: a grammar it breaks, or a path that is not there."""
    env = os.environ if env is None else env
    out: dict[str, str] = {}
    for name in ALLOC_VARS:
        if env.get(name):
            problems = alloc_conf_problems(env[name])
            if problems:
                out[name] = "; ".join(problems)
    for name in MUST_EXIST:
        if env.get(name) and not os.path.exists(env[name]):
            out[name] = f"{env[name]} does not exist"
    for name in MADE_ON_USE:
        value = env.get(name)
        if value and not os.path.exists(value) and not _creatable(value):
            out[name] = f"{value} does not exist and cannot be created (no writable parent)"
    for name in INT_VARS:
        if env.get(name) and not re.fullmatch(r"\d+(,\d+)*", env[name].strip()):
            out[name] = f"{env[name]!r} is not a number (the library ignores it or refuses to start)"
    for entry in (env.get("LD_PRELOAD") or "").replace(":", " ").split():
        if "/" in entry and not os.path.isfile(entry):
            out["LD_PRELOAD"] = f"{entry} does not exist (the loader ignores it with an error line)"
    return out


def missing_library_dirs(env: dict[str, str] | None = None) -> list[str]:
    """LD_LIBRARY_PATH entries that do not exist (evidence only: the loader skips them)."""
    env = os.environ if env is None else env
    return [d for d in (env.get("LD_LIBRARY_PATH") or "").split(":") if d and not os.path.isdir(d)]


def _creatable(path: str) -> bool:
    """Whether the folder can be made: its first missing component is made and removed again (os.access
    says yes to root under /proc or sysfs, where mkdir still fails)."""
    p = first_missing = os.path.abspath(path)
    while not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            return False
        first_missing, p = p, parent
    if not os.path.isdir(p):
        return False
    try:
        os.mkdir(first_missing)
    except OSError:
        return False
    with contextlib.suppress(OSError):
        os.rmdir(first_missing)
    return True


def stub_libcuda(env: dict[str, str] | None = None) -> str | None:
    """A libcuda.so.1 on LD_LIBRARY_PATH that is the CUDA toolkit's link-time stub (a `stubs` folder, or
    far too small for a driver): CUDA then fails with "Error 34: CUDA driver is a stub library"."""
    env = os.environ if env is None else env
    for d in (env.get("LD_LIBRARY_PATH") or "").split(":"):
        for name in ("libcuda.so.1", "libcuda.so"):
            p = os.path.join(d, name) if d else ""
            if p and os.path.exists(p):
                real = os.path.realpath(p)
                if "/stubs/" in real or os.path.getsize(real) < (1 << 20):
                    return p + (f" -> {real}" if real != p else "")
                break
    return None


# ---- start-up hooks -------------------------------------------------------------------------------


def hooks() -> list[dict[str, str]]:
    """sitecustomize, usercustomize and .pth lines that run code, in the site folders of this interpreter."""
    found: list[dict[str, str]] = []
    for module in ("sitecustomize", "usercustomize"):
        mod = sys.modules.get(module)
        origin = getattr(mod, "__file__", None) if mod else None
        if origin:
            found.append({"kind": module, "path": origin})
    dirs = list(dict.fromkeys([*site.getsitepackages(), sysconfig.get_paths()["purelib"]]))
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    for d in dirs:
        try:
            names = sorted(n for n in os.listdir(d) if n.endswith(".pth"))
        except OSError:
            continue
        for n in names:
            try:
                lines = Path(d, n).read_text(errors="replace").splitlines()
            except OSError:
                continue
            code = [ln.strip() for ln in lines if ln.startswith(("import ", "import\t"))]
            if code:
                found.append({"kind": ".pth", "path": str(Path(d, n)), "runs": code[0][:200]})
    return found


def hook_text(entry: dict[str, str]) -> str:
    """The code a hook runs: a .pth's import line, a customize module's source."""
    if entry["kind"] == ".pth":
        return entry.get("runs", "")
    try:
        return Path(entry["path"]).read_text(errors="replace")
    except OSError:
        return ""


def ordinary_pth(entry: dict[str, str]) -> bool:
    """.pth lines every install writes (setuptools' distutils shim, editable installs' finders)."""
    return entry["kind"] == ".pth" and bool(
        re.search(r"_distutils_hack|__editable__|_virtualenv", entry.get("runs", ""))
    )
