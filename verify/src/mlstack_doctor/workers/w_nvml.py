"""NVML through ctypes (no pynvml needed): driver version, GPU count, and per GPU its index, name, UUID,
device-node minor, memory, compute capability, MIG mode and MIG device UUIDs (what CUDA_VISIBLE_DEVICES
entries are matched against)."""

from __future__ import annotations

import ctypes
from typing import Any

from _common import main

NVML_ERRORS = {
    1: "NVML_ERROR_UNINITIALIZED",
    2: "NVML_ERROR_INVALID_ARGUMENT",
    3: "NVML_ERROR_NOT_SUPPORTED",
    4: "NVML_ERROR_NO_PERMISSION",
    9: "NVML_ERROR_DRIVER_NOT_LOADED",
    12: "NVML_ERROR_LIBRARY_NOT_FOUND",
    18: "NVML_ERROR_LIB_RM_VERSION_MISMATCH (Driver/library version mismatch)",
    999: "NVML_ERROR_UNKNOWN",
}


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class _Process(ctypes.Structure):  # nvmlProcessInfo_v2_t
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


def check(args: dict[str, Any]) -> dict[str, Any]:
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as exc:
        return {"ok": False, "error": f"OSError: cannot load libnvidia-ml.so.1: {exc}", "stage": "load"}
    if args.get("mode") == "memory":
        return memory(lib)
    rc = lib.nvmlInit_v2()
    if rc != 0:
        return {
            "ok": False,
            "error": f"nvmlInit_v2 failed: {NVML_ERRORS.get(rc, rc)}",
            "nvml_rc": rc,
            "stage": "init",
            "library": _loaded_path(),  # its name carries the user-space version: a mismatch's other half
        }
    buf = ctypes.create_string_buffer(96)
    lib.nvmlSystemGetDriverVersion(buf, 96)
    count = ctypes.c_uint(0)
    lib.nvmlDeviceGetCount_v2(ctypes.byref(count))
    gpus = []
    for i in range(count.value):
        handle = ctypes.c_void_p()
        rc = lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle))
        if rc != 0:  # e.g. NO_PERMISSION on a node this user cannot open: say so, never drop it silently
            gpus.append({"index": i, "error": NVML_ERRORS.get(rc, str(rc))})
            continue
        gpus.append(_gpu(lib, i, handle))
    lib.nvmlShutdown()
    return {
        "driver_version": buf.value.decode(),
        "count": count.value,
        "gpus": gpus,
        "library": _loaded_path(),
    }


def memory(lib: ctypes.CDLL) -> dict[str, Any]:
    """Per GPU: memory total/used/free and the compute processes holding it (pid, bytes, command; a pid
    of another PID namespace, as from inside a container, has no command here)."""
    rc = lib.nvmlInit_v2()
    if rc != 0:
        return {"ok": False, "error": f"nvmlInit_v2 failed: {NVML_ERRORS.get(rc, rc)}"}
    count = ctypes.c_uint(0)
    lib.nvmlDeviceGetCount_v2(ctypes.byref(count))
    gpus = []
    for i in range(count.value):
        handle = ctypes.c_void_p()
        if lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0:
            continue
        mem = _Memory()
        lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem))
        gpu: dict[str, Any] = {"index": i, "total": mem.total, "used": mem.used, "free": mem.free}
        get = getattr(lib, "nvmlDeviceGetComputeRunningProcesses_v2", None)
        n = ctypes.c_uint(64)
        procs = (_Process * 64)()
        prc = get(handle, ctypes.byref(n), procs) if get else 3
        if prc == 0:
            gpu["processes"] = [
                {"pid": p.pid, "used": p.usedGpuMemory, "command": _command(p.pid)} for p in procs[: n.value]
            ]
        else:
            gpu["processes_error"] = NVML_ERRORS.get(prc, str(prc))
        gpus.append(gpu)
    lib.nvmlShutdown()
    return {"gpus": gpus}


def _command(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200] or None
    except OSError:
        return None


def _text(fn: Any, handle: ctypes.c_void_p) -> str | None:
    buf = ctypes.create_string_buffer(96)
    return buf.value.decode() if fn(handle, buf, 96) == 0 else None


def _gpu(lib: ctypes.CDLL, i: int, handle: ctypes.c_void_p) -> dict[str, Any]:
    mem = _Memory()
    lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem))
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    get_cc = getattr(lib, "nvmlDeviceGetCudaComputeCapability", None)  # absent from very old drivers
    cc_rc = get_cc(handle, ctypes.byref(major), ctypes.byref(minor)) if get_cc else -1
    node_minor = ctypes.c_uint(0)
    has_minor = lib.nvmlDeviceGetMinorNumber(handle, ctypes.byref(node_minor)) == 0
    gpu: dict[str, Any] = {
        "index": i,
        "name": _text(lib.nvmlDeviceGetName, handle),
        "uuid": _text(lib.nvmlDeviceGetUUID, handle),
        "minor": node_minor.value if has_minor else None,  # /dev/nvidia<minor>
        "memory_total_gib": round(mem.total / 2**30, 1),
        "compute_capability": f"{major.value}.{minor.value}" if cc_rc == 0 else None,
    }
    gpu.update(_mig(lib, handle))
    return gpu


def _mig(lib: ctypes.CDLL, handle: ctypes.c_void_p) -> dict[str, Any]:
    """MIG mode (None where the GPU has none: NOT_SUPPORTED) and the UUIDs of its MIG devices."""
    current, pending = ctypes.c_uint(0), ctypes.c_uint(0)
    get_mode = getattr(lib, "nvmlDeviceGetMigMode", None)
    if get_mode is None or get_mode(handle, ctypes.byref(current), ctypes.byref(pending)) != 0:
        return {"mig_mode": None, "mig_devices": []}
    uuids = []
    most = ctypes.c_uint(0)
    if current.value == 1 and lib.nvmlDeviceGetMaxMigDeviceCount(handle, ctypes.byref(most)) == 0:
        for j in range(most.value):
            mig = ctypes.c_void_p()
            if lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, j, ctypes.byref(mig)) == 0:
                uuids.append(_text(lib.nvmlDeviceGetUUID, mig))
    return {"mig_mode": bool(current.value), "mig_devices": [u for u in uuids if u]}


def _loaded_path() -> str | None:
    """The libnvidia-ml.so.1 this process loaded (its folder is where libcuda.so.1 belongs too)."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            for line in f:
                if "libnvidia-ml.so" in line:
                    return line.split()[-1]
    except OSError:
        pass
    return None


if __name__ == "__main__":
    main(check)
