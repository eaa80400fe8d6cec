"""The record every probe returns, and the context probes read."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Status(str, enum.Enum):  # noqa: UP042 - StrEnum needs 3.11; the doctor runs on 3.10
    PASS = "pass"
    FAIL = "fail"
    WARN = "warn"
    SKIP = "skip"


class Stage(str, enum.Enum):  # noqa: UP042
    HOST = "host"
    TOOLCHAIN = "toolchain"
    PACKAGES = "packages"
    TORCH = "torch"
    TRITON = "triton"
    FLA = "fla"
    TRAINING = "training"
    MODEL = "model"
    WARM = "warm"
    STRESS = "stress"
    NCCL = "nccl"


@dataclass
class Result:
    """One probe's verdict. `code` and `fix` are set on fail (and on warn when there is something to do)."""

    name: str
    stage: Stage
    status: Status
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)
    code: str | None = None
    fix: str | None = None
    skipped_by: str | None = None
    duration_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "stage": self.stage.value,
            "status": self.status.value,
            "summary": self.summary,
            "evidence": self.evidence,
            "code": self.code,
            "fix": self.fix,
            "skipped_by": self.skipped_by,
            "duration_s": round(self.duration_s, 3),
        }


def passed(name: str, stage: Stage, summary: str, **evidence: Any) -> Result:
    return Result(name, stage, Status.PASS, summary, evidence)


def warned(
    name: str, stage: Stage, summary: str, code: str | None, fix: str | None, **evidence: Any
) -> Result:
    return Result(name, stage, Status.WARN, summary, evidence, code=code, fix=fix)


def failed(name: str, stage: Stage, summary: str, code: str, fix: str, **evidence: Any) -> Result:
    return Result(name, stage, Status.FAIL, summary, evidence, code=code, fix=fix)


def skipped(name: str, stage: Stage, reason: str, skipped_by: str | None = None, **evidence: Any) -> Result:
    return Result(name, stage, Status.SKIP, reason, evidence, skipped_by=skipped_by)
