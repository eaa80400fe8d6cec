"""Host stage: NVIDIA device nodes, driver versions (NVML, kernel module, libcuda), CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import errno
import glob
import os
import re
import stat

from mlstack_doctor import runner
from mlstack_doctor.context import Context
from mlstack_doctor.diagnosis import classify, fix_for
from mlstack_doctor.record import Result, Stage, failed, passed, warned

PROC_VERSION = "/proc/driver/nvidia/version"
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


def device_nodes(ctx: Context) -> Result:
    name, stage = "nvidia_device_nodes", Stage.HOST
    paths = sorted(set(glob.glob("/dev/nvidia*") + glob.glob("/dev/nvidia-caps/*")))
    paths = [p for p in paths if not os.path.isdir(p)]
    nodes = [_node_state(p) for p in paths]
    gpus = [n for n in nodes if re.fullmatch(r"/dev/nvidia\d+", str(n["path"]))]
    ev = {"nodes": nodes, "proc_devices_majors": _proc_majors()}
    ctx.facts["gpu_nodes"] = len(gpus)
    expect = ctx.opts.expect_gpu
    if not nodes:
        if not expect:
            return passed(name, stage, "no NVIDIA device nodes (none expected: --no-gpu)", **ev)
        return failed(
            name,
            stage,
            "no /dev/nvidia* device nodes",
            "NVIDIA_NODE_MISSING",
            fix_for("NVIDIA_NODE_MISSING"),
            **ev,
        )
    verdict = warned if not expect else None
    no_driver = [n["path"] for n in nodes if n.get("open") in ("ENXIO", "ENODEV")]
    denied = [n["path"] for n in nodes if n.get("open") in ("EACCES", "EPERM")]
    missing = [p for p in REQUIRED_NODES if p not in paths] + ([] if gpus else ["/dev/nvidia[0-9]"])
    for code, bad, what in (
        ("NVIDIA_NO_DRIVER", no_driver, "present but no driver answers (ENXIO)"),
        ("NVIDIA_NODE_PERMISSION", denied, "present but permission denied"),
        ("NVIDIA_NODE_MISSING", missing, "missing"),
    ):
        if bad:
            summary = f"{', '.join(bad)}: {what}"
            if verdict is not None:
                return warned(name, stage, summary + " (no GPU expected)", code, fix_for(code), **ev)
            return failed(name, stage, summary, code, fix_for(code), **ev)
    if "/dev/nvidia-uvm" not in paths:
        # Only a warning here (a host's driver may create it on first use); torch_cuda names it the root
        # cause if CUDA then fails (an H200 without it says only "CUDA unknown error").
        ctx.facts["uvm_missing"] = True
        return warned(
            name,
            stage,
            f"{len(gpus)} GPU node(s) ok, /dev/nvidia-uvm missing",
            "NVIDIA_UVM_MISSING",
            fix_for("NVIDIA_UVM_MISSING"),
            **ev,
        )
    return passed(name, stage, f"{len(gpus)} GPU node(s), nvidiactl and nvidia-uvm open fine", **ev)


def _kernel_module_version() -> tuple[str | None, str | None]:
    try:
        with open(PROC_VERSION, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None, None
    m = re.search(r"Kernel Module(?: for [\w-]+)?\s+([\d.]+)", text)
    return (m.group(1) if m else None), text.splitlines()[0] if text else None


def _libcuda() -> tuple[list[str], str | None, runner.RunResult]:
    """libcuda.so.1 as Triton finds it: TRITON_LIBCUDA_PATH, else `ldconfig -p`."""
    ldconfig = "/sbin/ldconfig" if os.path.exists("/sbin/ldconfig") else "ldconfig"
    res = runner.run([ldconfig, "-p"], timeout=30)
    override = os.environ.get("TRITON_LIBCUDA_PATH")
    if override:
        locs = (
            [os.path.join(override, "libcuda.so.1")]
            if os.path.exists(os.path.join(override, "libcuda.so.1"))
            else []
        )
    else:
        locs = [line.split()[-1] for line in res.stdout.splitlines() if "libcuda.so.1" in line]
    version = None
    for loc in locs:
        m = re.search(r"libcuda\.so\.(\d+\.\d+(?:\.\d+)?)$", os.path.realpath(loc))
        if m:
            version = m.group(1)
            break
    return locs, version, res


def driver(ctx: Context) -> Result:
    name, stage = "nvidia_driver", Stage.HOST
    kmod, kmod_line = _kernel_module_version()
    nvml = runner.run_worker("w_nvml.py", {}, timeout=ctx.timeout(60))
    locs, libcuda_ver, ld = _libcuda()
    ev: dict[str, object] = {
        "kernel_module": kmod,
        "proc_version": kmod_line,
        "nvml_driver": nvml.data.get("driver_version"),
        "nvml_gpus": nvml.data.get("gpus"),
        "libcuda": locs,
        "libcuda_version": libcuda_ver,
        "ldconfig_rc": ld.rc,
    }
    ctx.facts["nvml_count"] = nvml.data.get("count")
    ctx.facts["nvml_gpus"] = nvml.data.get("gpus")
    ctx.facts["kernel_driver"] = kmod
    if not nvml.ok:
        ev.update(nvml.evidence())
        code = classify(nvml.error_text, "NVML_UNAVAILABLE")
        return failed(name, stage, f"NVML: {nvml.error_text}", code, fix_for(code, kernel_driver=kmod), **ev)
    versions = {
        k: v for k, v in (("kernel", kmod), ("nvml", ev["nvml_driver"]), ("libcuda", libcuda_ver)) if v
    }
    if len(set(versions.values())) > 1:
        return failed(
            name,
            stage,
            "driver versions differ: " + ", ".join(f"{k} {v}" for k, v in versions.items()),
            "DRIVER_API_MISMATCH",
            fix_for("DRIVER_API_MISMATCH", kernel_driver=kmod),
            **ev,
        )
    if not locs:
        return failed(
            name,
            stage,
            "libcuda.so.1 not in the linker cache (ldconfig -p)",
            "LIBCUDA_NOT_FOUND",
            fix_for("LIBCUDA_NOT_FOUND"),
            **ev,
        )
    return passed(name, stage, f"driver {ev['nvml_driver']} (kernel module, NVML and libcuda agree)", **ev)


def cuda_visible_devices(ctx: Context) -> Result:
    name, stage = "cuda_visible_devices", Stage.HOST
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    ev = {"CUDA_VISIBLE_DEVICES": value}
    if value is None:
        return passed(name, stage, "unset: all GPUs visible", **ev)
    items = [x.strip() for x in value.split(",") if x.strip()]
    count = ctx.facts.get("nvml_count")
    hidden = not items or items[0] in ("-1", "NoDevFiles", "void", "none")
    if not hidden and count is not None and all(x.isdigit() for x in items):
        # CUDA stops at the first invalid index
        valid = []
        for x in items:
            if int(x) >= count:
                break
            valid.append(x)
        hidden = not valid
        ev["valid"] = valid
    if hidden:
        return failed(
            name,
            stage,
            f"CUDA_VISIBLE_DEVICES={value!r} hides every GPU",
            "CUDA_HIDDEN",
            fix_for("CUDA_HIDDEN"),
            **ev,
        )
    return passed(name, stage, f"CUDA_VISIBLE_DEVICES={value}", **ev)
