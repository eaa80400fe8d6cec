"""Toolchain stage: what Triton needs to JIT its C helper, checked the way Triton does it, no GPU needed.

triton/runtime/build.py: the compiler is $CC, else gcc, else clang on PATH; the include dir is
sysconfig's for the running interpreter (inside a venv: the BASE interpreter's); the cache is
TRITON_CACHE_DIR, else $TRITON_HOME/.triton/cache, else ~/.triton/cache.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from pathlib import Path

from mlstack_doctor import experiment, runner, runtime, vetting
from mlstack_doctor.context import Context
from mlstack_doctor.diagnosis import classify, fix_for
from mlstack_doctor.record import Result, Stage, failed, passed, warned

PROBE_C = """#define PY_SSIZE_T_CLEAN
#include <Python.h>
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "mlstack_doctor_probe", NULL, -1, NULL};
PyMODINIT_FUNC PyInit_mlstack_doctor_probe(void) { return PyModule_Create(&mod); }
"""


# gcc/clang when binutils' assembler is missing (gcc: "cannot execute 'as'", quotes localised)
NO_ASSEMBLER = re.compile(r"cannot execute .as.|error trying to exec 'as'|execvp: as\b")


def find_compiler() -> tuple[str | None, str]:
    """(compiler, how it was chosen), exactly Triton's order."""
    cc = os.environ.get("CC")
    if cc is not None:
        return cc, "$CC"
    gcc, clang = shutil.which("gcc"), shutil.which("clang")
    if gcc:
        return gcc, "gcc on PATH"
    if clang:
        return clang, "clang on PATH"
    return None, "none of $CC, gcc, clang"


def python_include_dir() -> str:
    scheme = sysconfig.get_default_scheme()
    if scheme == "posix_local":  # Debian's scheme; Triton maps it back the same way
        scheme = "posix_prefix"
    return sysconfig.get_paths(scheme=scheme)["include"]


def c_compiler(ctx: Context) -> Result:
    name, stage = "c_compiler", Stage.TOOLCHAIN
    cc, how = find_compiler()
    ev: dict[str, object] = {"chosen_by": how, "CC": os.environ.get("CC"), "PATH": os.environ.get("PATH", "")}
    if cc is None:
        return failed(
            name,
            stage,
            "no C compiler: $CC unset, no gcc or clang on PATH (Triton: 'Failed to find C compiler')",
            "NO_C_COMPILER",
            fix_for("NO_C_COMPILER"),
            **ev,
        )
    ev["compiler"] = cc
    res = runner.run([cc, "--version"], timeout=ctx.timeout(30))
    ev["version"] = (
        (res.stdout or res.stderr).strip().splitlines()[0] if (res.stdout or res.stderr).strip() else None
    )
    if res.not_found or res.os_error:
        code = "CC_INVALID" if how == "$CC" else "C_COMPILER_BROKEN"
        return failed(
            name, stage, f"{cc} ({how}) cannot run: {res.stderr.strip()}", code, fix_for(code), **ev
        )
    if res.rc != 0:
        return failed(
            name,
            stage,
            f"{cc} --version exited {res.rc}",
            "C_COMPILER_BROKEN",
            fix_for("C_COMPILER_BROKEN"),
            **ev,
        )
    ctx.facts["cc"] = cc
    return passed(name, stage, f"{cc} ({how}): {ev['version']}", **ev)


def _headers_fix(include: str, base_prefix: str, py_ver: str) -> str:
    if include.startswith("/usr/include/"):
        return fix_for("NO_PYTHON_H", py_ver=py_ver)
    if "/uv/python/" in base_prefix or "/.local/share/uv/" in base_prefix:
        return f"uv python install --reinstall {py_ver}  # uv's managed Pythons ship Python.h"
    if "/.pyenv/" in base_prefix:
        return f"pyenv install --force {sys.version.split()[0]}  # rebuild the interpreter with its headers"
    return (
        f"install the headers of the interpreter at {base_prefix} (or recreate the venv: "
        f"uv venv --managed-python --python {py_ver})"
    )


def python_headers(ctx: Context) -> Result:
    name, stage = "python_headers", Stage.TOOLCHAIN
    include = python_include_dir()
    header = Path(include) / "Python.h"
    ev = {
        "python": sys.executable,
        "prefix": sys.prefix,
        "base_prefix": sys.base_prefix,
        "in_venv": sys.prefix != sys.base_prefix,
        "include_dir": include,
        "python_h": str(header),
    }
    ctx.facts["include_dir"] = include
    if not header.is_file():
        return failed(
            name,
            stage,
            f"{header} missing (the include dir Triton compiles against)",
            "NO_PYTHON_H",
            _headers_fix(include, sys.base_prefix, ctx.py_ver),
            **ev,
        )
    return passed(name, stage, f"{header}", **ev)


def build_extension(
    cc: str,
    include_dir: str,
    timeout: float,
    env: dict[str, str] | None = None,
    preexec: Callable[[], None] | None = None,
) -> tuple[list[str], runner.RunResult, runner.RunResult | None]:
    """Build a tiny extension with Python.h in a fresh folder of the TMPDIR `env` names, and import it:
    (the build's argv, the build, the import or None when the build failed)."""
    where = (env.get("TMPDIR") or None) if env is not None else None  # this process: tempfile's choice
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    with tempfile.TemporaryDirectory(prefix="mlstack-doctor-cc-", dir=where) as tmp:
        src = os.path.join(tmp, "mlstack_doctor_probe.c")
        so = os.path.join(tmp, "mlstack_doctor_probe" + suffix)
        Path(src).write_text(PROBE_C, encoding="utf-8")
        argv = [cc, src, "-O3", "-shared", "-fPIC", "-Wno-psabi", "-o", so, f"-I{include_dir}"]
        build = runner.run(argv, timeout=timeout, env=env, preexec=preexec)
        if not build.ok:
            return argv, build, None
        load = runner.run(
            [sys.executable, "-c", f"import sys; sys.path.insert(0, {tmp!r}); import mlstack_doctor_probe"],
            timeout=timeout,
            env=env,
            preexec=preexec,
        )
    return argv, build, load


def _build_trial(cc: str, include_dir: str, timeout: float) -> experiment.Trial:
    def trial(env: dict[str, str], preexec: Callable[[], None] | None) -> tuple[bool, str]:
        try:
            _, build, load = build_extension(cc, include_dir, timeout, env, preexec)
        except OSError as exc:  # the TMPDIR of this setting cannot take the folder
            return False, f"{type(exc).__name__}: {exc}"
        if load is None:
            return False, build.tail(300)
        return load.ok, "" if load.ok else load.tail(300)

    return trial


def _by_experiment(
    ctx: Context, cc: str, include_dir: str, ev: dict[str, object], code: str, fix: str
) -> tuple[str, str]:
    """(code, fix) for a build no rule explains: the experiment's confirmed cause, else `code` and `fix`
    with what the experiment ruled out (its evidence goes to `ev`)."""
    ex = runtime.Explained(code)
    trial = _build_trial(cc, include_dir, ctx.timeout(120))
    runtime.by_experiment(ex, ctx.facts, f"c_extension_build {cc} {include_dir}", trial, reproduced=True)
    ev.update(ex.evidence)
    if ex.code == code:
        return code, fix + runtime.experiment_note(ex.evidence.get("experiment"))
    return ex.code, fix_for(ex.code, **ex.fix_args)


def c_extension_build(ctx: Context) -> Result:
    """Build and import a tiny extension with Python.h, the way Triton builds cuda_utils (minus -lcuda)."""
    name, stage = "c_extension_build", Stage.TOOLCHAIN
    cc = ctx.facts.get("cc") or find_compiler()[0]
    include_dir = str(ctx.facts.get("include_dir") or python_include_dir())
    if cc is None:  # only when run alone (--only): c_compiler would have gated it
        return failed(name, stage, "no C compiler", "NO_C_COMPILER", fix_for("NO_C_COMPILER"))
    try:
        argv, build, load = build_extension(cc, include_dir, ctx.timeout(120))
    except OSError as exc:  # the temporary folder or the source cannot be written
        ev0: dict[str, object] = {"error": f"{type(exc).__name__}: {exc}"}
        code, fix = _by_experiment(
            ctx,
            cc,
            include_dir,
            ev0,
            "TMPDIR_UNUSABLE",
            fix_for("TMPDIR_UNUSABLE", tmpdir=tempfile.gettempdir(), alternative="", proof=""),
        )
        return failed(name, stage, f"cannot write the build's files: {exc}", code, fix, **ev0)
    ev: dict[str, object] = {
        "command": " ".join(argv),
        "rc": build.rc,
        "compiler_output": build.tail(2000),
    }
    if load is None:
        code = classify(build.stderr + build.stdout, "C_COMPILER_BROKEN", compiler_env=True)
        if code == "NO_PYTHON_H":
            fix = _headers_fix(include_dir, sys.base_prefix, ctx.py_ver)
        elif code == "C_COMPILER_BROKEN" and NO_ASSEMBLER.search(build.stderr + build.stdout):
            ev["missing_tool"] = "as"
            fix = "apt-get install -y binutils  # gcc found no assembler ('as')"
        else:
            fix = fix_for(code)
            if code == "C_COMPILER_BROKEN":  # no rule knows the compiler's words
                code, fix = _by_experiment(ctx, cc, include_dir, ev, code, fix)
        return failed(name, stage, f"building a Python extension failed: {build.tail(300)}", code, fix, **ev)
    ev["import_rc"] = load.rc
    if not load.ok:
        ev["import_error"] = load.tail(2000)
        code, fix = _by_experiment(
            ctx, cc, include_dir, ev, "C_COMPILER_BROKEN", fix_for("C_COMPILER_BROKEN")
        )
        return failed(name, stage, "the built extension does not import", code, fix, **ev)
    return passed(
        name, stage, f"built and imported a Python extension with {cc} in {build.duration_s:.1f} s", **ev
    )


def triton_cache_path() -> tuple[str, str]:
    if os.environ.get("TRITON_CACHE_DIR"):
        return os.environ["TRITON_CACHE_DIR"], "TRITON_CACHE_DIR"
    home = os.environ.get("TRITON_HOME") or os.path.expanduser("~/")
    return os.path.join(home, ".triton", "cache"), "TRITON_HOME" if os.environ.get(
        "TRITON_HOME"
    ) else "default"


PROBE_BYTES = 1 << 20  # a compiled kernel's .so/.cubin is up to ~1 MiB: a smaller disk fills at once
LOW_SPACE = 256 << 20


def try_dir(
    facts: dict[str, object], path: str, create: bool = True, keep: bool = False
) -> tuple[str | None, str | None]:
    """(code, why) of a folder Triton would write and dlopen from: (None, None) when usable.

    Writes PROBE_BYTES to a temp name and renames it (as Triton does), then reads the mount flags:
    a .so on a noexec mount cannot be mapped. The verdict goes to facts["paths"] for vetting. A folder
    it had to create is removed again unless `keep` (the cache dir itself, which Triton creates too).
    """
    made = not os.path.isdir(path)
    try:
        if made and not create:
            raise FileNotFoundError(2, "No such file or directory", path)
        os.makedirs(path, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".mlstack-doctor-", dir=path)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(b"x" * PROBE_BYTES)
            final = tmp + ".done"
            os.replace(tmp, final)
            os.unlink(final)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        flags = os.statvfs(path).f_flag
    except OSError as exc:
        code = {errno.ENOSPC: "TRITON_CACHE_FULL", errno.EFBIG: "RESOURCE_LIMIT_BREAKS"}.get(
            exc.errno or 0, "TRITON_CACHE_UNWRITABLE"
        )
        why = f"{type(exc).__name__}: {exc.strerror or exc}"
        vetting.note_path(facts, path, why)
        return code, why
    finally:
        if made and create and not keep:
            with contextlib.suppress(OSError):
                os.rmdir(path)  # only when empty: the doctor leaves no folder it made behind
    if flags & os.ST_NOEXEC:
        why = "on a noexec mount: a .so there cannot be loaded"
        vetting.note_path(facts, path, why)
        return "TRITON_CACHE_NOEXEC", why
    vetting.note_path(facts, path, None)
    return None, None


def mount_point(path: str) -> str:
    p = os.path.abspath(path)
    while not os.path.ismount(p) and p != "/":
        p = os.path.dirname(p)
    return p


def _candidates(failing: str) -> list[str]:
    """Folders a Triton cache could move to, most conventional first."""
    user = os.environ.get("USER") or str(os.getuid())
    out = []
    if os.environ.get("XDG_CACHE_HOME"):
        out.append(os.path.join(os.environ["XDG_CACHE_HOME"], "triton"))
    out.append(os.path.expanduser("~/.cache/triton"))
    out.append(f"/var/tmp/triton-cache-{user}")
    # Not tempfile.gettempdir(): it falls back to the working directory, no place for a cache.
    for tmp in (os.environ.get("TMPDIR"), "/tmp"):
        if tmp:
            out.append(os.path.join(tmp, f"triton-cache-{user}"))
    seen: list[str] = []
    for c in out:
        c = os.path.abspath(c)
        if c != os.path.abspath(failing) and c not in seen:
            seen.append(c)
    return seen


def alternative(ctx: Context, var: str, failing: str, candidates: list[str]) -> tuple[str, list[str]]:
    """('export VAR=<a folder the doctor wrote to>; or ', tried) or, when none works, a sentence saying so."""
    return alternative_in(ctx.facts, var, failing, candidates)


def alternative_in(
    facts: dict[str, object], var: str, failing: str, candidates: list[str]
) -> tuple[str, list[str]]:
    tried = []
    for c in candidates:
        existed = os.path.isdir(c)
        code, why = try_dir(facts, c)
        tried.append(f"{c} ({why or 'usable'})")
        if code is None:
            mkdir = "" if existed else f"mkdir -p {c} && "
            return f"{mkdir}export {var}={c} (the doctor wrote there); or ", tried
    return f"no usable folder found for {var} (tried {', '.join(tried)}); ", tried


def _file_size_limit(name: str, path: str, why: str | None, ev: dict[str, object]) -> Result:
    """A write of the doctor's own failed with EFBIG: the file-size limit, named by the errno itself."""
    ev["error"] = why
    return failed(
        name,
        Stage.TOOLCHAIN,
        f"a {PROBE_BYTES >> 20} MiB write to {path} failed: {why} (the file-size limit, ulimit -f)",
        "RESOURCE_LIMIT_BREAKS",
        fix_for("RESOURCE_LIMIT_BREAKS", action=runtime.limit_action("file_size"), proof=f" ({path}: {why})"),
        **ev,
    )


def triton_cache_dir(ctx: Context) -> Result:
    name, stage = "triton_cache_dir", Stage.TOOLCHAIN
    path, source = triton_cache_path()
    ev: dict[str, object] = {"cache_dir": path, "source": source}
    ctx.facts["triton_cache_dir"] = path
    code, why = try_dir(ctx.facts, path, keep=True)
    if code == "RESOURCE_LIMIT_BREAKS":
        return _file_size_limit(name, path, why, ev)
    if code is not None:
        ev["error"] = why
        alt, tried = alternative(ctx, "TRITON_CACHE_DIR", path, _candidates(path))
        ev["alternatives_tried"] = tried
        what = {
            "TRITON_CACHE_UNWRITABLE": "cannot write",
            "TRITON_CACHE_NOEXEC": "cannot load kernels from",
            "TRITON_CACHE_FULL": "no space left in",
        }[code]
        return failed(
            name,
            stage,
            f"{what} {path} ({source}): {why}",
            code,
            fix_for(code, cache_dir=path, alternative=alt, mount=mount_point(path)),
            **ev,
        )
    entries = os.listdir(path)
    ev["entries"] = len(entries)
    ctx.facts["triton_cache_entries"] = len(entries)
    free = os.statvfs(path)
    ev["free_bytes"] = free.f_bavail * free.f_frsize
    state = "warm" if entries else "cold (empty)"
    if ev["free_bytes"] < LOW_SPACE:
        alt, tried = alternative(ctx, "TRITON_CACHE_DIR", path, _candidates(path))
        ev["alternatives_tried"] = tried
        return warned(
            name,
            stage,
            f"{path} writable but only {ev['free_bytes'] >> 20} MiB free: a full cache fails kernel compiles",
            "TRITON_CACHE_FULL",
            fix_for("TRITON_CACHE_FULL", cache_dir=path, alternative=alt),
            **ev,
        )
    return passed(name, stage, f"{path} writable, {state}: {len(entries)} entries", **ev)


def tmpdir(ctx: Context) -> Result:
    """$TMPDIR as gcc, Python's tempfile and Triton's builds use it (they fail when it is unusable)."""
    name, stage = "tmpdir", Stage.TOOLCHAIN
    value = os.environ.get("TMPDIR")
    ev: dict[str, object] = {"TMPDIR": value}
    code, why = try_dir(ctx.facts, value or "/tmp", create=False)  # a real write, not only the name
    if code == "RESOURCE_LIMIT_BREAKS":
        return _file_size_limit(name, value or "/tmp", why, ev)
    if not value and code in (None, "TRITON_CACHE_NOEXEC"):
        return passed(name, stage, "TMPDIR unset: /tmp is used, and writable", **ev)
    value = value or "/tmp"
    if code in (None, "TRITON_CACHE_NOEXEC"):  # builds only write there; the .so is loaded from the cache
        return passed(name, stage, f"TMPDIR={value} is writable", **ev)
    ev["error"] = why
    cands = [c for c in ("/var/tmp", "/tmp") if os.path.abspath(c) != os.path.abspath(value)]
    alt, tried = alternative(ctx, "TMPDIR", value, cands)
    ev["alternatives_tried"] = tried
    fix = fix_for("TMPDIR_UNUSABLE", tmpdir=value, alternative=alt, proof="")
    # What the stack does with it: Python's tempfile (Triton's and inductor's builds) and gcc pass over a
    # TMPDIR they cannot use to the next folder that works. Where that folder takes files, the stack works.
    fallback, fallback_why = tempdir_fallback(ctx.timeout(30))
    ev["fallback"] = fallback or fallback_why
    if fallback and os.path.abspath(fallback) != os.path.abspath(value):
        code_fb, why_fb = try_dir(ctx.facts, fallback, create=False)
        if code_fb in (None, "TRITON_CACHE_NOEXEC"):
            return warned(
                name,
                stage,
                f"TMPDIR={value} is unusable ({why}): Python's tempfile and gcc fall back to {fallback}, "
                "which takes files",
                "TMPDIR_UNUSABLE",
                fix,
                **ev,
            )
        ev["fallback_error"] = why_fb
    return failed(
        name,
        stage,
        f"TMPDIR={value} is unusable ({why}) and so is the folder the stack falls back to "
        f"({ev['fallback']}): gcc and Triton's builds write their temporary files there",
        "TMPDIR_UNUSABLE",
        fix,
        **ev,
    )


def tempdir_fallback(timeout: float) -> tuple[str | None, str]:
    """(the folder Python's tempfile.gettempdir() picks in a fresh process of this interpreter and this
    environment, start-up hooks included, as every process of the stack computes it; or None, why not)."""
    res = runner.run([sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"], timeout=timeout)
    lines = res.stdout.strip().splitlines()
    if res.ok and lines:
        return lines[-1], ""
    return None, f"tempfile.gettempdir() failed: {res.tail(200)}"
