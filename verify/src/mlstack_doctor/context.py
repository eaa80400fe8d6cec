"""What the probes share: the options, the results so far, and facts one probe leaves for the next."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from mlstack_doctor.profile import Profile
from mlstack_doctor.record import Result
from mlstack_doctor.runner import Background, Session
from mlstack_doctor.settings import DEFAULT_PURPOSE


@dataclass
class Options:
    tier: str = "quick"
    expect_gpu: bool = True
    model: str | None = None
    profile: Profile | None = None
    threads: int = 4
    tokens: int = 2048
    seq_lens: list[int] = field(default_factory=lambda: [2048])  # warm and stress: training shapes
    batch_size: int = 1
    warm_layers: int | None = None  # None: one layer of each type (Qwen3.5: 4); 0: full depth
    stress_cache: str = "shared"  # shared: TRITON_CACHE_DIR as training uses it; fresh: an empty one
    rewarm: bool = False
    timeout_scale: float = 1.0
    measure_peak: bool = True
    only: list[str] | None = None
    purpose: str = DEFAULT_PURPOSE  # training: a refused backward fails; inference: it only warns
    nccl_backend: str = "auto"  # nccl tier: auto (nccl, gloo under --no-gpu), nccl or gloo
    nccl_ranks: int | None = None  # gloo: processes (default 2); nccl: at most this many GPUs (default all)
    nccl_timeout: float = 60.0  # seconds each collective (and joining the group) may take
    repair: bool = False  # kernel_caches moves unloadable cache entries aside (inside the cache)
    warm_share: str | None = None  # the cluster's cache: a folder, "" the node's own in the cache, None off
    warm_plan: bool = False  # warm tier: decide and install from warm_share, never warm


@dataclass
class Context:
    opts: Options
    results: dict[str, Result] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    session: Session | None = None  # the long-lived GPU worker (engine.run opens and closes it)
    background: dict[str, tuple[Background, str]] = field(default_factory=dict)

    def timeout(self, seconds: float) -> float:
        return seconds * self.opts.timeout_scale

    @property
    def python(self) -> str:
        return sys.executable

    @property
    def py_ver(self) -> str:
        return f"{sys.version_info.major}.{sys.version_info.minor}"
