"""Host stage: NVIDIA device nodes, driver versions (NVML, kernel module, libcuda), CUDA_VISIBLE_DEVICES.

A node or a setting fails only when the job needs it: the MIG capability nodes only when MIG is in use,
a /dev/nvidiaN only when CUDA_VISIBLE_DEVICES leaves that GPU visible. Where the doctor cannot know
(NVML does not answer), it says so in a warn instead of guessing.
"""

from __future__ import annotations

import errno
import glob
import os
import re
import stat
from dataclasses import asdict

from mlstack_doctor import libcuda, runner, visible
from mlstack_doctor.context import Context
from mlstack_doctor.diagnosis import classify, fix_for
from mlstack_doctor.facts import nvidia
from mlstack_doctor.record import Result, Stage, failed, passed, warned

PROC_VERSION = nvidia.PROC_VERSION
REQUIRED_NODES = ("/dev/nvidiactl",)


def _node_state(path: str) -> dict[str, object]:
    st = os.stat(path)
    info: dict[str, object] = {"path": path, "mode": oct(stat.S_IMODE(st.st_mode))}
    if not stat.S_ISCHR(st.st_mode):
        info["open"] = "not a character device"
        return info
    info["major"], info["minor"] = os.major(st.st_rdev), os.minor(st.st_rdev)
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as exc:
        info["open"] = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        info["open_error"] = str(exc)
    else:
        os.close(fd)
        info["open"] = "ok"
    return info


def _proc_majors() -> dict[str, int]:
    majors: dict[str, int] = {}
    try:
        with open("/proc/devices", encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2 and parts[0].isdigit() and "nvidia" in parts[1]:
                    majors[parts[1]] = int(parts[0])
    except OSError:
        pass
    return majors


def nvml(ctx: Context) -> runner.WorkerResult:
    """NVML's answer, asked once per run (device_nodes may need it for MIG before nvidia_driver runs)."""
    if "nvml_result" not in ctx.facts:
        ctx.facts["nvml_result"] = runner.run_worker("w_nvml.py", {}, timeout=ctx.timeout(60))
    return ctx.facts["nvml_result"]


def _mig_in_use(ctx: Context) -> bool | None:
    """MIG is in use when CUDA_VISIBLE_DEVICES names MIG devices or NVML has MIG on; None: NVML cannot say."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value and any(e.startswith("MIG-") for e in visible.entries(value)):
        return True
    answer = nvml(ctx)
    if not answer.ok:
        return None
    return any(g.get("mig_mode") for g in answer.data.get("gpus") or [])


def _unneeded(ctx: Context, denied: list[str], ev: dict[str, object]) -> tuple[list[str], str | None]:
    """The denied nodes this job does not need (with why, in evidence), and a note when it cannot know."""
    ignored: dict[str, str] = {}
    note = None
    caps = [p for p in denied if p.startswith("/dev/nvidia-caps/")]
    if caps:
        mig = _mig_in_use(ctx)
        if mig is False:
            ignored.update(dict.fromkeys(caps, "MIG capability node: only MIG needs it, and MIG is off"))
        elif mig is None:
            ignored.update(dict.fromkeys(caps, "MIG capability node: only MIG needs it"))
            note = (
                f"{', '.join(caps)} cannot be opened (only MIG needs them; NVML could not say if MIG is on)"
            )
    gpu_nodes = [p for p in denied if re.fullmatch(r"/dev/nvidia\d+", p)]
    if gpu_nodes:
        answer = nvml(ctx)
        gpus = answer.data.get("gpus") if answer.ok else None
        minors = visible.visible_minors(os.environ.get("CUDA_VISIBLE_DEVICES"), gpus, dict(os.environ))
        if minors is not None:
            for p in gpu_nodes:
                if int(p.removeprefix("/dev/nvidia")) not in minors:
                    ignored[p] = "GPU not visible (CUDA_VISIBLE_DEVICES)"
    if ignored:
        ev["not_needed"] = ignored
    return [p for p in denied if p not in ignored], note


def _mig_note(denied: list[str]) -> str:
    return (
        " (MIG is in use: it needs the nvidia-caps nodes)"
        if any("/nvidia-caps/" in p for p in denied)
        else ""
    )


def device_nodes(ctx: Context) -> Result:
    name, stage = "nvidia_device_nodes", Stage.HOST
    paths = sorted(set(glob.glob("/dev/nvidia*") + glob.glob("/dev/nvidia-caps/*")))
    paths = [p for p in paths if not os.path.isdir(p)]
    nodes = [_node_state(p) for p in paths]
    gpus = [n for n in nodes if re.fullmatch(r"/dev/nvidia\d+", str(n["path"]))]
    ev: dict[str, object] = {"nodes": nodes, "proc_devices_majors": _proc_majors()}
    ctx.facts["gpu_nodes"] = len(gpus)
    expect = ctx.opts.expect_gpu
    if not nodes:
        if not expect:
            return passed(name, stage, "no NVIDIA device nodes (none expected: --no-gpu)", **ev)
        code = "NVIDIA_NODE_MISSING"
        return failed(name, stage, "no /dev/nvidia* device nodes", code, fix_for(code), **ev)
    uvm_missing = "/dev/nvidia-uvm" not in paths
    ctx.facts["uvm_missing"] = uvm_missing  # torch_cuda names it the root cause if CUDA then fails
    no_driver = [str(n["path"]) for n in nodes if n.get("open") in ("ENXIO", "ENODEV")]
    denied = [str(n["path"]) for n in nodes if n.get("open") in ("EACCES", "EPERM")]
    note = None
    if denied and not no_driver:  # without a driver, NVML cannot answer: the driver is the fault
        denied, note = _unneeded(ctx, denied, ev)
    missing = [p for p in REQUIRED_NODES if p not in paths] + ([] if gpus else ["/dev/nvidia[0-9]"])
    for code, bad, what in (
        ("NVIDIA_NO_DRIVER", no_driver, "present but no driver answers (ENXIO)"),
        ("NVIDIA_NODE_PERMISSION", denied, "present but permission denied" + _mig_note(denied)),
        ("NVIDIA_NODE_MISSING", missing, "missing"),
    ):
        if bad:
            summary = f"{', '.join(bad)}: {what}"
            if not expect:
                return warned(name, stage, summary + " (no GPU expected)", code, fix_for(code), **ev)
            return failed(name, stage, summary, code, fix_for(code), **ev)
    if uvm_missing:
        # Only a warning here (a host's driver may create it on first use); an H200 without it says only
        # "CUDA unknown error", so torch_cuda names it.
        summary = f"{len(gpus)} GPU node(s) ok, /dev/nvidia-uvm missing" + (f"; {note}" if note else "")
        code = "NVIDIA_UVM_MISSING"
        return warned(name, stage, summary, code, fix_for(code), **ev)
    if note:
        return warned(name, stage, note, None, None, **ev)
    extra = (
        f" ({len(ev['not_needed'])} node(s) this job does not need cannot be opened)"
        if "not_needed" in ev
        else ""
    )
    return passed(name, stage, f"{len(gpus)} GPU node(s), nvidiactl and nvidia-uvm open fine{extra}", **ev)


def _kernel_module_version() -> tuple[str | None, str | None, str | None]:
    """(version, first line, why unreadable)."""
    try:
        with open(PROC_VERSION, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        return None, None, f"{PROC_VERSION}: {exc.strerror or exc}"
    version = nvidia.kernel_module_version(text)
    why = None if version else f"{PROC_VERSION} names no kernel module version"
    return version, (text.splitlines()[0] if text else None), why


def driver(ctx: Context) -> Result:
    name, stage = "nvidia_driver", Stage.HOST
    kmod, kmod_line, kmod_why = _kernel_module_version()
    answer = nvml(ctx)
    lib = libcuda.find(answer.data.get("library"))
    ev: dict[str, object] = {
        "kernel_module": kmod,
        "proc_version": kmod_line,
        "nvml_driver": answer.data.get("driver_version"),
        "nvml_library": answer.data.get("library"),
        "nvml_gpus": answer.data.get("gpus"),
        "libcuda": lib.ldconfig,
        "libcuda_version": lib.version,
        "libcuda_search": asdict(lib),
        "ldconfig_rc": lib.ldconfig_rc,
    }
    ctx.facts["nvml_count"] = answer.data.get("count") if answer.ok else None
    ctx.facts["nvml_gpus"] = answer.data.get("gpus") if answer.ok else None
    ctx.facts["kernel_driver"] = kmod
    if not answer.ok:
        ev.update(answer.evidence())
        code = classify(answer.error_text, "NVML_UNAVAILABLE")
        userspace = libcuda.userspace_version(answer.data.get("library"), lib)
        fix = fix_for(code, kernel_driver=kmod or "<the host module's>", userspace=userspace)
        return failed(name, stage, f"NVML: {answer.error_text}", code, fix, **ev)
    problem = libcuda.verdict(lib, kmod)
    if problem and problem.code == "LIBCUDA_SHADOWED":  # the stale copy's version is the mismatch below
        return failed(name, stage, problem.summary, problem.code, problem.fix, **ev)
    versions = {
        k: v for k, v in (("kernel", kmod), ("nvml", ev["nvml_driver"]), ("libcuda", lib.version)) if v
    }
    if len(set(versions.values())) > 1:
        other = (
            sorted({v for k, v in versions.items() if v != kmod}) if kmod else sorted(set(versions.values()))
        )
        fix = fix_for(
            "DRIVER_API_MISMATCH", kernel_driver=kmod or "<the host module's>", userspace=", ".join(other)
        )
        summary = "driver versions differ: " + ", ".join(f"{k} {v}" for k, v in versions.items())
        return failed(name, stage, summary, "DRIVER_API_MISMATCH", fix, **ev)
    if problem and problem.fatal:
        return failed(name, stage, problem.summary, problem.code, problem.fix, **ev)
    if kmod is None:
        ev["kernel_module_unreadable"] = kmod_why
        code = "KERNEL_MODULE_VERSION_UNKNOWN"
        summary = (
            f"driver {ev['nvml_driver']} (NVML); kernel module version unknown ({kmod_why}): not compared"
        )
        return warned(name, stage, summary, code, fix_for(code, nvml_driver=ev["nvml_driver"]), **ev)
    if problem:
        return warned(name, stage, problem.summary, problem.code, problem.fix, **ev)
    return passed(name, stage, f"driver {ev['nvml_driver']} (kernel module, NVML and libcuda agree)", **ev)


def cuda_visible_devices(ctx: Context) -> Result:
    name, stage = "cuda_visible_devices", Stage.HOST
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    ev: dict[str, object] = {"CUDA_VISIBLE_DEVICES": value}
    if value is None:
        return passed(name, stage, "unset: all GPUs visible", **ev)
    if visible.hides_all(value):
        code = "CUDA_HIDDEN"
        return failed(
            name, stage, f"CUDA_VISIBLE_DEVICES={value!r} hides every GPU", code, fix_for(code), **ev
        )
    gpus, count = ctx.facts.get("nvml_gpus"), ctx.facts.get("nvml_count")
    sel = visible.select(value, gpus, count)
    ev.update(matched=sel.matched, unmatched=sel.unmatched, hidden_after=sel.hidden_after)
    ev["valid"] = [m["entry"] for m in sel.matched]
    if sel.unmatched is not None:
        summary = f"entry {sel.unmatched!r} {sel.why}: CUDA stops there"
        summary += f", hiding {', '.join(sel.hidden_after)} too" if sel.hidden_after else ""
        summary += f"; {len(sel.matched)} GPU(s) stay visible" if sel.matched else "; no GPU is visible"
        real = [g for g in gpus or [] if g.get("uuid")]
        if sel.matched:
            suggest = ",".join(m["entry"] for m in sel.matched)
        elif real:
            suggest = real[0]["uuid"]
        else:
            suggest = "0"
        here = (
            ", ".join(f"{g['index']}={g['uuid']}" for g in real)
            or f"{count} GPU(s), indices 0-{(count or 1) - 1}"
        )
        code = "CUDA_VISIBLE_DEVICES_UNMATCHED"
        fix = fix_for(code, suggest=suggest, here=here)
        if sel.matched:
            return warned(name, stage, summary, code, fix, **ev)
        return failed(name, stage, summary, code, fix, **ev)
    if sel.unchecked:
        summary = (
            f"CUDA_VISIBLE_DEVICES={value}: {', '.join(sel.unchecked)} could not be checked "
            "(NVML did not answer, so the GPU UUIDs here are unknown)"
        )
        return warned(name, stage, summary, None, None, **ev)
    return passed(name, stage, f"CUDA_VISIBLE_DEVICES={value}: {len(sel.matched)} GPU(s) matched", **ev)
