"""Dense bf16 tensor-core peaks (TFLOP/s, no sparsity) by GPU name, from vendor datasheets: leads for MFU.

The doctor also measures an 8192^3 bf16 matmul on the spot and reports MFU against both.
"""

from __future__ import annotations

# Most specific names first: the first substring found in the device name wins.
BF16_DENSE_TFLOPS: list[tuple[str, float]] = [
    ("GB200", 2500.0),
    ("B200", 2250.0),
    ("B100", 1750.0),
    ("RTX PRO 6000 Blackwell", 503.8),
    ("H200 NVL", 835.0),
    ("H200", 989.4),
    ("GH200", 989.4),
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.4),
    ("H800", 989.4),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("RTX 6000 Ada", 364.0),
    ("RTX 5090", 209.5),
    ("RTX 4090", 165.2),
    ("A10", 125.0),
    ("L4", 121.0),
]


def bf16_peak(device_name: str) -> float | None:
    for key, tflops in BF16_DENSE_TFLOPS:
        if key in device_name:
            return tflops
    return None
