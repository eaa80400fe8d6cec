"""What the probes share: the options, the results so far, and facts one probe leaves for the next."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from mlstack_doctor.profile import Profile
from mlstack_doctor.record import Result


@dataclass
class Options:
    tier: str = "quick"
    expect_gpu: bool = True
    model: str | None = None
    profile: Profile | None = None
    threads: int = 4
    tokens: int = 2048
    stress_tokens: int = 256
    timeout_scale: float = 1.0
    measure_peak: bool = True
    only: list[str] | None = None


@dataclass
class Context:
    opts: Options
    results: dict[str, Result] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)

    def timeout(self, seconds: float) -> float:
        return seconds * self.opts.timeout_scale

    @property
    def python(self) -> str:
        return sys.executable

    @property
    def py_ver(self) -> str:
        return f"{sys.version_info.major}.{sys.version_info.minor}"
