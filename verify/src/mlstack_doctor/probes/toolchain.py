"""Toolchain stage: what Triton needs to JIT its C helper, checked the way Triton does it, no GPU needed.

triton/runtime/build.py: the compiler is $CC, else gcc, else clang on PATH; the include dir is
sysconfig's for the running interpreter (inside a venv: the BASE interpreter's); the cache is
TRITON_CACHE_DIR, else $TRITON_HOME/.triton/cache, else ~/.triton/cache.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

from mlstack_doctor import runner
from mlstack_doctor.context import Context
from mlstack_doctor.diagnosis import classify, fix_for
from mlstack_doctor.record import Result, Stage, failed, passed

PROBE_C = """#define PY_SSIZE_T_CLEAN
#include <Python.h>
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "mlstack_doctor_probe", NULL, -1, NULL};
PyMODINIT_FUNC PyInit_mlstack_doctor_probe(void) { return PyModule_Create(&mod); }
"""


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


def c_extension_build(ctx: Context) -> Result:
    """Build and import a tiny extension with Python.h, the way Triton builds cuda_utils (minus -lcuda)."""
    name, stage = "c_extension_build", Stage.TOOLCHAIN
    cc = ctx.facts.get("cc") or find_compiler()[0]
    include_dir = str(ctx.facts.get("include_dir") or python_include_dir())
    if cc is None:  # only when run alone (--only): c_compiler would have gated it
        return failed(name, stage, "no C compiler", "NO_C_COMPILER", fix_for("NO_C_COMPILER"))
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    with tempfile.TemporaryDirectory(prefix="mlstack-doctor-cc-") as tmp:
        src = os.path.join(tmp, "mlstack_doctor_probe.c")
        so = os.path.join(tmp, "mlstack_doctor_probe" + suffix)
        Path(src).write_text(PROBE_C, encoding="utf-8")
        argv = [cc, src, "-O3", "-shared", "-fPIC", "-Wno-psabi", "-o", so, f"-I{include_dir}"]
        build = runner.run(argv, timeout=ctx.timeout(120))
        ev: dict[str, object] = {
            "command": " ".join(argv),
            "rc": build.rc,
            "compiler_output": build.tail(2000),
        }
        if not build.ok:
            code = classify(build.stderr + build.stdout, "C_COMPILER_BROKEN", compiler_env=True)
            if code == "NO_PYTHON_H":
                fix = _headers_fix(include_dir, sys.base_prefix, ctx.py_ver)
            else:
                fix = fix_for(code)
            return failed(
                name, stage, f"building a Python extension failed: {build.tail(300)}", code, fix, **ev
            )
        load = runner.run(
            [sys.executable, "-c", f"import sys; sys.path.insert(0, {tmp!r}); import mlstack_doctor_probe"],
            timeout=ctx.timeout(60),
        )
        ev["import_rc"] = load.rc
        if not load.ok:
            ev["import_error"] = load.tail(2000)
            return failed(
                name,
                stage,
                "the built extension does not import",
                "C_COMPILER_BROKEN",
                fix_for("C_COMPILER_BROKEN"),
                **ev,
            )
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


def triton_cache_dir(ctx: Context) -> Result:
    name, stage = "triton_cache_dir", Stage.TOOLCHAIN
    path, source = triton_cache_path()
    ev: dict[str, object] = {"cache_dir": path, "source": source}
    ctx.facts["triton_cache_dir"] = path
    try:
        os.makedirs(path, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".mlstack-doctor-", dir=path)
        with os.fdopen(fd, "wb") as f:
            f.write(b"x" * 4096)
        final = tmp + ".done"
        os.replace(tmp, final)  # Triton writes kernels to a temp name and renames
        os.unlink(final)
    except OSError as exc:
        ev["error"] = f"{type(exc).__name__}: {exc}"
        return failed(
            name,
            stage,
            f"cannot write {path}: {exc.strerror or exc}",
            "TRITON_CACHE_UNWRITABLE",
            fix_for("TRITON_CACHE_UNWRITABLE", cache_dir=path),
            **ev,
        )
    entries = os.listdir(path)
    ev["entries"] = len(entries)
    ctx.facts["triton_cache_entries"] = len(entries)
    state = "warm" if entries else "cold (empty)"
    return passed(name, stage, f"{path} writable, {state}: {len(entries)} entries", **ev)
