"""NVML through ctypes (no pynvml needed): driver version, GPU count, names, memory, compute capability."""

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


def check(args: dict[str, Any]) -> dict[str, Any]:
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as exc:
        return {"ok": False, "error": f"OSError: cannot load libnvidia-ml.so.1: {exc}", "stage": "load"}
    rc = lib.nvmlInit_v2()
    if rc != 0:
        return {
            "ok": False,
            "error": f"nvmlInit_v2 failed: {NVML_ERRORS.get(rc, rc)}",
            "nvml_rc": rc,
            "stage": "init",
        }
    buf = ctypes.create_string_buffer(96)
    lib.nvmlSystemGetDriverVersion(buf, 96)
    count = ctypes.c_uint(0)
    lib.nvmlDeviceGetCount_v2(ctypes.byref(count))
    gpus = []
    for i in range(count.value):
        handle = ctypes.c_void_p()
        if lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0:
            continue
        name = ctypes.create_string_buffer(96)
        lib.nvmlDeviceGetName(handle, name, 96)
        mem = _Memory()
        lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem))
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        get_cc = getattr(lib, "nvmlDeviceGetCudaComputeCapability", None)  # absent from very old drivers
        cc_rc = get_cc(handle, ctypes.byref(major), ctypes.byref(minor)) if get_cc else -1
        gpus.append(
            {
                "index": i,
                "name": name.value.decode(),
                "memory_total_gib": round(mem.total / 2**30, 1),
                "compute_capability": f"{major.value}.{minor.value}" if cc_rc == 0 else None,
            }
        )
    lib.nvmlShutdown()
    return {"driver_version": buf.value.decode(), "count": count.value, "gpus": gpus}


if __name__ == "__main__":
    main(check)
