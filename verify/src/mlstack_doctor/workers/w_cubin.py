"""Ask the CUDA driver (libcuda through ctypes, no torch) to load each cached kernel image, as Triton
does when it takes a kernel from its cache: an image the driver refuses (CUDA_ERROR_INVALID_IMAGE,
CUDA_ERROR_NO_BINARY_FOR_GPU, ...) is named with its error. The module is unloaded at once."""

from __future__ import annotations

import ctypes
import time
from typing import Any

from _common import main


def _name(lib: Any, rc: int) -> str:
    text = ctypes.c_char_p()
    if lib.cuGetErrorName(rc, ctypes.byref(text)) == 0 and text.value:
        return text.value.decode()
    return f"CUresult {rc}"


def check(args: dict[str, Any]) -> dict[str, Any]:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return {"ok": False, "error": f"OSError: cannot load libcuda.so.1: {exc}", "stage": "load"}
    rc = lib.cuInit(0)
    if rc:
        return {"ok": False, "error": f"cuInit failed: {_name(lib, rc)}", "stage": "init"}
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    rc = lib.cuDeviceGet(ctypes.byref(dev), int(args.get("device", 0))) or lib.cuDevicePrimaryCtxRetain(
        ctypes.byref(ctx), dev
    )
    if rc or lib.cuCtxSetCurrent(ctx):
        return {"ok": False, "error": f"no CUDA context: {_name(lib, rc)}", "stage": "context"}
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    lib.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)
    arch = major.value * 10 + minor.value
    refused: dict[str, str] = {}
    loaded = other_arch = 0
    deadline = time.monotonic() + float(args.get("budget_s", 30))
    for path, built_for in args.get("images", []):
        if time.monotonic() > deadline:
            break
        if built_for is not None and int(built_for) != arch:  # a cache shared by GPUs of several kinds
            other_arch += 1
            continue
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            refused[path] = f"unreadable: {exc}"
            continue
        module = ctypes.c_void_p()
        buf = ctypes.create_string_buffer(data, len(data))
        rc = lib.cuModuleLoadData(ctypes.byref(module), buf)
        if rc:
            refused[path] = _name(lib, rc)
        else:
            lib.cuModuleUnload(module)
        loaded += 1
    lib.cuDevicePrimaryCtxRelease(dev)
    return {"checked": loaded, "refused": refused, "device_arch": arch, "other_arch": other_arch}


if __name__ == "__main__":
    main(check)
