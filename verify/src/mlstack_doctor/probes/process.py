"""The process environment (fast tier, no torch import): the limits CUDA, torch and thread pools need,
the identity the stack looks up, the variables it reads at start-up, and the start-up hooks.

Each finding is (status, code, what, fix, markers): the worst one is the probe's verdict; `markers` are
texts that a later failure caused by this finding shows (getpwuid, the variable's name, the stub's
folder), so the summary lists that failure as a consequence instead of a cause of its own
(engine.explained_by).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from mlstack_doctor import procenv
from mlstack_doctor.context import Context
from mlstack_doctor.diagnosis import fix_for
from mlstack_doctor.probes.toolchain import try_dir
from mlstack_doctor.record import Result, Stage, Status, failed, passed, warned

NAME, STAGE = "process_env", Stage.HOST
MEMLOCK_FLOOR = 64 << 20  # NCCL over InfiniBand/RoCE registers its buffers; 64 KiB (Docker's) is too little
STACK_FLOOR = 64 << 10
# Checkpoint shards (about 5 GiB each), kernel caches and compiled helpers are written whole.
FILE_SIZE_FLOOR = 16 << 30
OPEN_FILES_FAIL, OPEN_FILES_WARN = 128, 1024  # CUDA init failed at 40 on an H200; NCCL/inductor want hundreds


@dataclass
class Finding:
    status: Status
    code: str
    what: str
    fix: str
    markers: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status.value, "code": self.code, "what": self.what, "fix": self.fix}


def _mib(n: int | None) -> str:
    return "unlimited" if n is None else f"{n / (1 << 20):.0f} MiB"


def limit_findings(ctx: Context, lim: dict[str, dict[str, int | None]], ev: dict[str, Any]) -> list[Finding]:
    out: list[Finding] = []
    gpu = ctx.opts.expect_gpu
    soft = {k: v["soft"] for k, v in lim.items()}
    need_as = procenv.address_space_needed(gpu)
    if soft["address_space"] is not None and soft["address_space"] < need_as:
        what = (
            f"address space limited to {_mib(soft['address_space'])} (RLIMIT_AS, ulimit -v); "
            f"{'CUDA reserves' if gpu else 'torch and its thread pools map'} more than {_mib(need_as)}"
        )
        fix = fix_for("ADDRESS_SPACE_LIMIT", limit=_mib(soft["address_space"]), need=_mib(need_as))
        out.append(Finding(Status.FAIL, "ADDRESS_SPACE_LIMIT", what, fix, ["Error 2: out of memory"]))
    elif soft["address_space"] is not None and gpu:
        out.append(
            Finding(
                Status.WARN,
                "ADDRESS_SPACE_LIMIT",
                f"address space limited to {_mib(soft['address_space'])}: a large model's CUDA context and "
                "pinned buffers may not fit",
                fix_for("ADDRESS_SPACE_LIMIT", limit=_mib(soft["address_space"]), need="unlimited"),
            )
        )
    nproc = soft["processes"]
    # root (CAP_SYS_RESOURCE) is not held to RLIMIT_NPROC; counting the uid's threads reads all of /proc
    counted = nproc is not None and ev["identity"]["uid"] != 0
    used = procenv.threads_of_uid(ev["identity"]["uid"]) if counted else None
    need = procenv.threads_needed()
    ev["usage"] = {"open_fds": procenv.open_fds(), "threads_of_uid": used, "threads_needed": need}
    if counted and nproc - (used or 0) < need:
        what = (
            f"processes/threads limited to {nproc} for uid {ev['identity']['uid']} (RLIMIT_NPROC, "
            f"ulimit -u), {used} in use; one torch process starts about {need} (OpenMP and OpenBLAS "
            "pools, CUDA, inductor)"
        )
        fix = fix_for("THREAD_LIMIT", limit=nproc, need=(used or 0) + need)
        markers = [
            "Thread creation failed",
            "pthread_create",
            "RLIMIT_NPROC",
            "Resource temporarily unavailable",
        ]
        out.append(Finding(Status.FAIL, "THREAD_LIMIT", what, fix, markers))
    nofile = soft["open_files"]
    if nofile is not None and nofile < OPEN_FILES_WARN:
        status = Status.FAIL if nofile < OPEN_FILES_FAIL else Status.WARN
        what = (
            f"open files limited to {nofile} (RLIMIT_NOFILE, ulimit -n); CUDA, NCCL, inductor open hundreds"
        )
        fix = fix_for("OPEN_FILES_LIMIT", limit=nofile)
        out.append(Finding(status, "OPEN_FILES_LIMIT", what, fix, ["Too many open files", "EMFILE"]))
    memlock = soft["locked_memory"]
    if memlock is not None and memlock < MEMLOCK_FLOOR and ctx.opts.tier == "nccl":
        what = f"locked memory limited to {_mib(memlock)} (RLIMIT_MEMLOCK): NCCL over InfiniBand cannot pin"
        out.append(Finding(Status.WARN, "RESOURCE_LIMIT_LOW", what, fix_for("RESOURCE_LIMIT_LOW", flag="-l")))
    fsize = soft["file_size"]
    if fsize is not None and fsize < FILE_SIZE_FLOOR:
        what = (
            f"file size limited to {_mib(fsize)} (RLIMIT_FSIZE, ulimit -f): a longer write fails with EFBIG "
            "('File too large'), a compiler dies of SIGXFSZ"
        )
        markers = ["File too large", "Errno 27", "File size limit exceeded"]
        out.append(
            Finding(
                Status.WARN, "RESOURCE_LIMIT_LOW", what, fix_for("RESOURCE_LIMIT_LOW", flag="-f"), markers
            )
        )
    stack = soft["stack"]
    if stack is not None and stack < STACK_FLOOR:
        what = f"stack limited to {stack >> 10} KiB (RLIMIT_STACK): new threads get stacks this small"
        out.append(Finding(Status.WARN, "RESOURCE_LIMIT_LOW", what, fix_for("RESOURCE_LIMIT_LOW", flag="-s")))
    return out


def identity_findings(ident: dict[str, Any]) -> list[Finding]:
    out: list[Finding] = []
    if ident["user"] is None:
        markers = ["getpwuid", "uid not found"]
        if ident["login_vars"]:
            what = (
                f"uid {ident['uid']} has no passwd entry; getpass.getuser() answers "
                f"{next(iter(ident['login_vars'].values()))!r} from the environment, pwd look-ups still fail"
            )
            out.append(
                Finding(Status.WARN, "USER_UNKNOWN", what, fix_for("USER_UNKNOWN", uid=ident["uid"]), markers)
            )
        else:
            what = (
                f"uid {ident['uid']} has no passwd entry and no LOGNAME/USER is set: getpass.getuser() "
                "raises KeyError 'getpwuid(): uid not found' (inductor and Triton ask it for their cache "
                "folders)"
            )
            out.append(
                Finding(Status.FAIL, "USER_UNKNOWN", what, fix_for("USER_UNKNOWN", uid=ident["uid"]), markers)
            )
    if ident["group"] is None:
        what = f"gid {ident['gid']} has no group entry (grp.getgrgid fails)"
        out.append(
            Finding(
                Status.WARN, "USER_UNKNOWN", what, fix_for("USER_UNKNOWN", uid=ident["uid"]), ["getgrgid"]
            )
        )
    if ident.get("home_problem"):
        out.append(
            Finding(
                Status.WARN,
                "HOME_UNUSABLE",
                ident["home_problem"]
                + ": caches that default under ~ (~/.triton, ~/.cache) cannot be written",
                fix_for("HOME_UNUSABLE", alternative="", proof=""),
                ["~/.triton", "expanduser"],
            )
        )
    return out


def variable_findings(ctx: Context, ev: dict[str, Any]) -> list[Finding]:
    out: list[Finding] = []
    problems = procenv.variable_problems()
    for var in procenv.WRITTEN_ON_USE:
        value = os.environ.get(var)
        if value and var not in problems and os.path.isdir(value):
            # A real write, as the stack makes (access() answers root "yes" where writes still fail).
            code, why = try_dir(ctx.facts, value, create=False)
            if code is not None:
                problems[var] = f"{value} exists but cannot take a kernel: {why}"
    ev["variable_problems"] = problems
    ev["ld_library_path_missing"] = procenv.missing_library_dirs()
    changed = procenv.changed_at_start()
    hooks = [h for h in procenv.hooks() if not procenv.ordinary_pth(h)]
    ev["startup_hooks"] = hooks
    ev["changed_at_start"] = changed
    hook_names = ", ".join(h["path"] for h in hooks) or "a start-up hook"

    def setting(var: str) -> str:
        """The hooks whose code names `var` (all of them when none does)."""
        named = [h["path"] for h in hooks if var in procenv.hook_text(h)]
        return ", ".join(named) or hook_names

    stub = procenv.stub_libcuda()
    if stub:
        ev["stub_libcuda"] = stub
        folder = stub.split(" -> ")[0].rsplit("/", 1)[0]
        out.append(
            Finding(
                Status.FAIL if ctx.opts.expect_gpu else Status.WARN,
                "CUDA_DRIVER_STUB",
                f"LD_LIBRARY_PATH puts the CUDA toolkit's stub libcuda first ({stub}): CUDA fails with "
                "'Error 34: CUDA driver is a stub library'",
                fix_for("CUDA_DRIVER_STUB", dir=folder),
                ["stub library", "Error 34", folder],
            )
        )
    for var, why in problems.items():
        code = "ALLOC_CONF_INVALID" if var in procenv.ALLOC_VARS else "ENV_SETTING_INVALID"
        by_hook = var in changed
        source = f"set by {setting(var)}" if by_hook else "set in the environment"
        # A setting torch refuses at CUDA init fails; one a loader or library ignores only warns.
        fatal = (
            code == "ALLOC_CONF_INVALID"
            or var in ("TRITON_LIBCUDA_PATH", "TRITON_PTXAS_PATH")
            or var in procenv.WRITTEN_ON_USE
        )
        status = Status.FAIL if fatal else Status.WARN
        fix = fix_for(code, var=var, why=why, where=setting(var) if by_hook else "the environment")
        markers = [var] + (
            ["ConfigTokenizer", "CUDA allocator", "stoull"] if code == "ALLOC_CONF_INVALID" else []
        )
        out.append(Finding(status, code, f"{var} ({source}): {why}", fix, markers))
    for var, change in changed.items():
        if var in problems:
            continue
        hides = var == "CUDA_VISIBLE_DEVICES" and (change["now"] or "").strip() in ("", "-1")
        status = Status.FAIL if hides and ctx.opts.expect_gpu else Status.WARN
        what = f"{setting(var)} changed {var} from {change['started_with']!r} to {change['now']!r}"
        if hides:
            what += ": it hides every GPU"
        out.append(
            Finding(
                status,
                "STARTUP_HOOK_CHANGES_ENV",
                what,
                fix_for("STARTUP_HOOK_CHANGES_ENV", var=var, where=setting(var)),
                [var],
            )
        )
    if hooks and not changed:
        out.append(
            Finding(
                Status.PASS,
                "STARTUP_HOOK",
                f"start-up hooks run in every interpreter (and every worker): {hook_names}; "
                "they changed none of the stack's variables",
                "",
            )
        )
    return out


def process_env(ctx: Context) -> Result:
    ident = procenv.identity()
    lim = procenv.limits()
    ev: dict[str, Any] = {
        "limits": lim,
        "identity": ident,
        "variables": procenv.stack_variables(),
    }
    findings = [*limit_findings(ctx, lim, ev), *identity_findings(ident), *variable_findings(ctx, ev)]
    ev["findings"] = [f.to_json() for f in findings]
    bad = [f for f in findings if f.status is Status.FAIL] or [f for f in findings if f.status is Status.WARN]
    ctx.facts["process_env"] = {"findings": findings, "identity": ident, "limits": lim}
    if not bad:
        hooks = next((f.what for f in findings if f.code == "STARTUP_HOOK"), "")
        summary = (
            f"uid {ident['uid']} ({ident['user']}), limits fit, {len(ev['variables'])} stack variables valid"
            + (f"; {hooks}" if hooks else "")
        )
        return passed(NAME, STAGE, summary, **ev)
    top = bad[0]
    ev["explains"] = sorted({m for f in bad for m in f.markers})
    summary = "; ".join(f.what for f in bad)
    # Independent findings each need their fix: one left out is the next run's failure.
    fixes = list(dict.fromkeys(f.fix for f in bad if f.fix))
    fix = fixes[0] if len(fixes) == 1 else "; and ".join(f"({i}) {x}" for i, x in enumerate(fixes, 1))
    if top.status is Status.FAIL:
        return failed(NAME, STAGE, summary, top.code, fix, **ev)
    return warned(NAME, STAGE, summary, top.code, fix, **ev)
