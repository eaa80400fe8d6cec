"""The NCCL tier's arithmetic, without torch: bus bandwidth as nccl-tests computes it, the
`nvidia-smi topo -m` matrix, the busbw floor of each link type, and what NCCL needs of /dev/shm.

Bandwidth follows nccl-tests (doc/PERFORMANCE.md): algbw = bytes / time (GB/s, 1e9 bytes); busbw =
algbw * factor, all-reduce 2(n-1)/n, all-gather (n-1)/n with `bytes` the total gathered size. With
one rank the factor is 0, so busbw is 0, as nccl-tests prints.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

MIB = 1 << 20
GPU_SIZES = (1 * MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB)
CPU_SIZES = (64 << 10, 256 << 10, 1 * MIB, 4 * MIB)  # gloo over loopback: a rehearsal, kept short
OPS = ("all_reduce", "all_gather")


def bus_factor(op: str, n: int) -> float:
    if n < 1:
        raise ValueError(f"ranks must be >= 1, got {n}")
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op == "all_gather":
        return (n - 1) / n
    raise ValueError(f"unknown collective {op!r}")


def bandwidth(op: str, nbytes: int, seconds: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for one collective of `nbytes` that took `seconds` on `n` ranks."""
    algbw = nbytes / 1e9 / seconds
    return algbw, algbw * bus_factor(op, n)


# Link types of `nvidia-smi topo -m`, best first. NV# is a bonded set of # NVLinks.
PCIE_RANK = ("PIX", "PXB", "PHB", "NODE", "SYS")
LEGEND = {
    "NV": "NVLink",
    "PIX": "PCIe, at most one PCIe bridge",
    "PXB": "PCIe, several PCIe bridges, no host bridge",
    "PHB": "PCIe through a host bridge (the CPU)",
    "NODE": "PCIe and the interconnect between host bridges of one NUMA node",
    "SYS": "PCIe and the inter-NUMA link (QPI/UPI/Infinity Fabric)",
    "CPU": "processes over loopback, gloo",
}

# Conservative all-reduce/all-gather busbw floors in GB/s, at the largest size of the sweep. Healthy
# hardware measures several times these (8x H100/H200 NV18: ~450 GB/s; PCIe 4.0 x16 P2P: ~20 GB/s); a
# run below its floor means a broken path (P2P off, traffic bounced through host memory, a throttled
# link), not a slow generation. NVLink: 5 GB/s per bonded link (NV18: 90, NV12: 60, NV4: 20).
NVLINK_FLOOR_PER_LINK = 5.0
FLOORS: dict[str, float] = {"PIX": 5.0, "PXB": 5.0, "PHB": 3.0, "NODE": 3.0, "SYS": 2.0, "CPU": 0.01}


def floor_for(link: str | None) -> tuple[float, str]:
    """(floor GB/s, which link it is for). Unknown link: the lowest GPU floor (SYS), said so."""
    if link and link.startswith("NV") and link[2:].isdigit():
        links = int(link[2:])
        return NVLINK_FLOOR_PER_LINK * links, f"{link} ({LEGEND['NV']}, {links} bonded links)"
    if link in FLOORS:
        return FLOORS[link], f"{link} ({LEGEND[link]})"
    return FLOORS["SYS"], "unknown link (the SYS floor, the lowest for GPUs)"


def link_rank(link: str) -> tuple[int, int]:
    """Sort key, best link first: NVLink by bonded links (more is better), then PCIe paths."""
    if link.startswith("NV") and link[2:].isdigit():
        return (0, -int(link[2:]))
    name = "SYS" if link == "SOC" else link  # SOC: older drivers' name for SYS
    return (1, PCIE_RANK.index(name)) if name in PCIE_RANK else (2, 0)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class Topology:
    gpus: list[str]  # "GPU0", ... in the matrix's order (NVML indices)
    links: dict[tuple[int, int], str]  # (i, j) -> NV18 / PIX / ... for i != j

    def worst(self, gpus: list[int]) -> str | None:
        """The slowest link between any two of `gpus` (a ring is as fast as its slowest hop)."""
        pairs = [self.links[(i, j)] for i in gpus for j in gpus if i < j and (i, j) in self.links]
        return max(pairs, key=link_rank) if pairs else None

    def to_json(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus,
            "matrix": {f"GPU{i}-GPU{j}": v for (i, j), v in sorted(self.links.items()) if i < j},
        }


def parse_topo(text: str) -> Topology:
    """The GPU-to-GPU part of `nvidia-smi topo -m`: a tab-separated matrix whose header names GPU0..N,
    NICs and affinity columns (underlined with ANSI escapes on some drivers), then a legend."""
    lines = [_ANSI.sub("", line).rstrip() for line in text.splitlines()]
    header = next((line for line in lines if re.match(r"^\s*GPU0(\s|$)", line)), None)
    if header is None:
        raise ValueError("no GPU0 column in nvidia-smi topo -m output")
    cols = [c.strip() for c in re.split(r"\t+| {2,}", header.strip()) if c.strip()]
    gpus = [c for c in cols if re.fullmatch(r"GPU\d+", c)]
    links: dict[tuple[int, int], str] = {}
    for line in lines:
        m = re.match(r"^(GPU(\d+))\s+(.*)$", line)
        if not m or m.group(1) not in gpus:
            continue
        i = int(m.group(2))
        cells = re.split(r"\s+", m.group(3).strip())
        for pos, name in enumerate(gpus):
            if pos >= len(cells):
                break
            j = int(name[3:])
            if i != j and cells[pos] != "X":
                links[(i, j)] = cells[pos]
    if not links and len(gpus) > 1:
        raise ValueError("no GPU-to-GPU links in nvidia-smi topo -m output")
    return Topology(gpus, links)


# /dev/shm: NCCL's SHM transport and its proxy map one segment per direction per peer; NCCL's own
# failure names the size it asked for ("Error while creating shared memory segment /dev/shm/nccl-...
# (size 9637888)"). Plus a base for everything else a training job keeps there (DataLoader workers).
NCCL_SHM_SEGMENT = 9637888
SHM_BASE = 64 * MIB


def shm_need(ranks: int) -> int:
    """Bytes of /dev/shm NCCL needs for `ranks` local ranks: two segments per ordered pair, plus a base."""
    return SHM_BASE + 2 * ranks * (ranks - 1) * NCCL_SHM_SEGMENT


def gib_ceil(nbytes: int) -> int:
    return max(1, -(-nbytes // (1 << 30)))
