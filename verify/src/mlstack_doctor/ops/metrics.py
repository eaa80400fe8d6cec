"""Prometheus metrics of a doctor run, for node_exporter's textfile collector.

The file holds the latest run of EACH tier written to it (every series has a `tier` label): a daily
quick run's failure is not hidden by the fast run five minutes later, and each tier's age can be
alerted on by itself. Writing a run replaces that tier's series and keeps the other tiers'. The file
is written atomically (a temporary file in the same folder, then a rename), so the collector never
reads half a file; two writers at once may lose one's tier (the last rename wins), hence the monitor
runs under one lock.

A skipped probe is neither a pass nor a failure: it has no `mlstack_doctor_probe_ok` sample (1 would
claim it was proven, 0 would count the failure that skipped it twice, or turn a `--no-gpu` host red);
it is listed in `mlstack_doctor_probe_skipped` with the failed probe that skipped it, if any.

A scheduled run that did not happen (the GPUs busy with training) is recorded with
`python -m mlstack_doctor.ops.metrics --run-skipped REASON --tier TIER FILE`: the tier's last verdict stays,
and `mlstack_doctor_run_skipped` says since when and why, until that tier runs again.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from mlstack_doctor.files import write_atomic

# name -> HELP text; the order of the file. All are gauges: each says what the LAST run saw.
FAMILIES: dict[str, str] = {
    "mlstack_doctor_ok": (
        "1 when the last run of this tier failed no probe (warnings allowed), 0 when one failed"
    ),
    "mlstack_doctor_failed_probes": "Probes that failed in the last run of this tier",
    "mlstack_doctor_probe_ok": (
        "1 when the probe passed or warned (code set on a warning), 0 when it failed, in the last run of "
        "this tier; a skipped probe has no sample here (mlstack_doctor_probe_skipped)"
    ),
    "mlstack_doctor_probe_skipped": (
        "1 for each probe the last run of this tier skipped; skipped_by names the failed probe that "
        "skipped it, empty when the tier or --no-gpu did"
    ),
    "mlstack_doctor_last_run_timestamp_seconds": "When the last run of this tier finished (Unix time)",
    "mlstack_doctor_run_duration_seconds": "Wall time of the last run of this tier",
    "mlstack_doctor_stack_info": "The stack the last run of this tier saw: versions as labels, value 1",
    "mlstack_doctor_run_skipped": (
        "1 while scheduled runs of this tier are skipped, with the reason (gpu_busy: a job holds the "
        "GPUs); absent once the tier runs again"
    ),
    "mlstack_doctor_run_skipped_since_timestamp_seconds": (
        "When the current streak of skipped runs of this tier began (Unix time)"
    ),
}
REASON = re.compile(r"^[a-z][a-z0-9_]*$")
# The distributions the stack info names, as label names.
STACK_LABELS = {
    "torch": "torch",
    "triton": "triton",
    "flash-linear-attention": "fla",
    "fla-core": "fla_core",
    "transformers": "transformers",
}

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Labels
    value: float

    def label(self, key: str) -> str:
        return dict(self.labels).get(key, "")


def _sample(name: str, value: float, **labels: object) -> Sample:
    return Sample(name, tuple((k, "" if v is None else str(v)) for k, v in labels.items()), float(value))


def escape_label(value: str) -> str:
    """Exposition format: backslash, double quote and line feed are escaped in label values."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


def render(samples: Iterable[Sample], families: Mapping[str, str] = FAMILIES) -> str:
    """The text exposition format (0.0.4): HELP and TYPE once per family, its samples together, no
    timestamps (the textfile collector refuses them). Families without samples are left out. `families`
    (name -> HELP, in the file's order) must name every sample's family: the node's file adds its own."""
    by_name: dict[str, list[Sample]] = {name: [] for name in families}
    for s in samples:
        by_name[s.name].append(s)
    out: list[str] = []
    for name, help_text in families.items():
        rows = sorted(by_name[name], key=lambda s: s.labels)
        if not rows:
            continue
        out.append(f"# HELP {name} {_escape_help(help_text)}")
        out.append(f"# TYPE {name} gauge")
        for s in rows:
            labels = ",".join(f'{k}="{escape_label(v)}"' for k, v in s.labels)
            out.append(f"{name}{{{labels}}} {_number(s.value)}" if labels else f"{name} {_number(s.value)}")
    return "\n".join(out) + "\n" if out else ""


_SAMPLE_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$")
_LABEL_PAIR = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(?:,|$)')
# Strict reading: the only escapes the format has, and its number syntax (Python's float() takes more:
# "1_0", "infinity").
_LABEL_VALUE = re.compile(r'(?:[^"\\]|\\[\\"n])*')
_VALUE = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[+-]?Inf|NaN")


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def _bad(strict: bool, why: str) -> None:
    """Lenient: a line to drop (None). Strict: the reason the text is refused."""
    if strict:
        raise ValueError(why)
    return None


def _parse_labels(body: str, strict: bool) -> Labels | None:
    labels: list[tuple[str, str]] = []
    pos = 0
    while pos < len(body):
        lm = _LABEL_PAIR.match(body, pos)
        if not lm:
            return _bad(strict, f"malformed labels at {body[pos : pos + 40]!r}")
        name, raw = lm.group(1), lm.group(2)
        if strict and not _LABEL_VALUE.fullmatch(raw):
            raise ValueError(f'label {name}: an escape other than \\\\, \\" or \\n')
        if strict and (name.startswith("__") or name in dict(labels)):
            raise ValueError(f"label {name}: reserved (__) or given twice")
        labels.append((name, _unescape(raw)))
        pos = lm.end()
    return tuple(labels)


def _parse_value(raw: str, strict: bool) -> float | None:
    if strict and not _VALUE.fullmatch(raw):
        raise ValueError(f"not a number: {raw[:40]!r}")
    try:
        return float(raw)
    except ValueError:
        return None


def _parse_line(line: str, strict: bool) -> Sample | None:
    """One line's sample; None for a blank line, a comment (HELP and TYPE are rewritten from FAMILIES),
    and, lenient, a malformed line."""
    if not line or line.startswith("#"):
        return None
    m = _SAMPLE_LINE.match(line)
    if not m:
        return _bad(strict, f"not a sample line (name{{labels}} value, no timestamp): {line[:80]!r}")
    labels = _parse_labels(m.group(2) or "", strict)
    value = _parse_value(m.group(3), strict)
    if labels is None or value is None:
        return None
    return Sample(m.group(1), labels, value)


def parse(text: str, strict: bool = False) -> list[Sample]:
    """The samples of FAMILIES in `text`; samples of other families are dropped.

    Lenient (the default, for the doctor's own file): a malformed line is dropped too. Strict (a file from
    elsewhere, e.g. a container's read on the node): ValueError, naming the line, for a line that is not
    blank, a comment or a well-formed sample (timestamps included), a bad escape or number, a label given
    twice, and a series given twice."""
    samples: list[Sample] = []
    seen: set[tuple[str, Labels]] = set()
    for number, line in enumerate(text.splitlines(), 1):
        try:
            s = _parse_line(line.strip(), strict)
            if s is not None and strict:
                key = (s.name, tuple(sorted(s.labels)))
                if key in seen:
                    raise ValueError(f"series {s.name} given twice")
                seen.add(key)
        except ValueError as exc:
            raise ValueError(f"line {number}: {exc}") from None
        if s is not None and s.name in FAMILIES:
            samples.append(s)
    return samples


def _epoch(iso: object) -> float | None:
    try:
        return datetime.fromisoformat(str(iso)).timestamp()
    except ValueError:
        return None


def _process_age_s() -> float | None:
    """Seconds since this process started (the whole run: interpreter start, workers, report), from
    /proc/self/stat against CLOCK_BOOTTIME; lxcfs virtualises /proc/uptime in containers, not that clock."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return age if 0 <= age < 7 * 86400 else None


def _probe(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next((p for p in doc.get("probes", []) if p.get("name") == name), {})


def stack_labels(doc: dict[str, Any]) -> dict[str, str]:
    """What the run saw of the stack: package versions (package_versions' evidence, else
    torch_triton_pin's), the profile, the driver and GPU names (nvidia_driver's), Python, the doctor.
    Empty when the run did not see it (a skipped probe, a package not installed)."""
    versions = _probe(doc, "package_versions").get("evidence", {})
    installed = dict(versions.get("installed") or {})
    pin = _probe(doc, "torch_triton_pin").get("evidence", {})
    for dist in ("torch", "triton"):
        installed.setdefault(dist, pin.get(dist))
    driver = _probe(doc, "nvidia_driver").get("evidence", {})
    gpus = list(dict.fromkeys(str(g.get("name", "")) for g in driver.get("nvml_gpus") or [] if g))
    labels = {
        "tier": str(doc.get("tier", "")),
        "doctor": str(doc.get("tool", {}).get("version", "")),
        "profile": str((versions.get("profile") or {}).get("name") or ""),
        "python": str(doc.get("host", {}).get("python", "")),
    }
    labels |= {label: str(installed.get(dist) or "") for dist, label in STACK_LABELS.items()}
    labels["driver"] = str(driver.get("nvml_driver") or driver.get("kernel_module") or "")
    labels["gpu"] = ",".join(gpus)
    return labels


def from_report(doc: dict[str, Any], duration_s: float | None = None) -> list[Sample]:
    """The samples of one run. `duration_s` defaults to the finished - started of the report (whole
    seconds)."""
    tier = str(doc.get("tier", ""))
    summary = doc.get("summary", {})
    finished = _epoch(doc.get("finished"))
    if duration_s is None:
        started = _epoch(doc.get("started"))
        duration_s = finished - started if finished is not None and started is not None else math.nan
    samples = [
        _sample("mlstack_doctor_ok", 1 if summary.get("ok") else 0, tier=tier),
        _sample("mlstack_doctor_failed_probes", int(summary.get("failed", 0)), tier=tier),
        _sample(
            "mlstack_doctor_last_run_timestamp_seconds",
            finished if finished is not None else time.time(),
            tier=tier,
        ),
        _sample("mlstack_doctor_run_duration_seconds", round(duration_s, 3), tier=tier),
        _sample("mlstack_doctor_stack_info", 1, **stack_labels(doc)),
    ]
    for p in doc.get("probes", []):
        if p.get("status") == "skip":
            samples.append(
                _sample(
                    "mlstack_doctor_probe_skipped",
                    1,
                    tier=tier,
                    probe=p.get("name"),
                    stage=p.get("stage"),
                    skipped_by=p.get("skipped_by"),
                )
            )
        else:
            ok = 0 if p.get("status") == "fail" else 1
            samples.append(
                _sample(
                    "mlstack_doctor_probe_ok",
                    ok,
                    tier=tier,
                    probe=p.get("name"),
                    stage=p.get("stage"),
                    code=p.get("code"),
                )
            )
    return samples


def _previous(path: Path) -> list[Sample]:
    try:
        return parse(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):  # none yet, or unreadable: start afresh
        return []


def write(path: str | Path, doc: dict[str, Any], duration_s: float | None = None) -> Path:
    """Write `doc`'s run into `path`, keeping the other tiers' series. `duration_s` defaults to this
    process's age (the CLI: one process per run)."""
    path = Path(path)
    tier = str(doc.get("tier", ""))
    if duration_s is None:
        duration_s = _process_age_s()
    kept = [s for s in _previous(path) if s.label("tier") != tier]
    return write_atomic(path, render([*kept, *from_report(doc, duration_s)]))


def write_run_skipped(path: str | Path, tier: str, reason: str, now: float | None = None) -> Path:
    """Record that a scheduled run of `tier` was skipped for `reason`, keeping the tier's last verdict;
    the streak's start is kept across consecutive skips for the same reason."""
    if not REASON.match(reason):
        raise ValueError(f"reason must be a lower-case word ([a-z][a-z0-9_]*), not {reason!r}")
    path = Path(path)
    now = time.time() if now is None else now
    previous = _previous(path)
    since = next(
        (
            s.value
            for s in previous
            if s.name == "mlstack_doctor_run_skipped_since_timestamp_seconds"
            and (s.label("tier"), s.label("reason")) == (tier, reason)
        ),
        now,
    )
    skipped = {"mlstack_doctor_run_skipped", "mlstack_doctor_run_skipped_since_timestamp_seconds"}
    kept = [s for s in previous if not (s.name in skipped and s.label("tier") == tier)]
    new = [
        _sample("mlstack_doctor_run_skipped", 1, tier=tier, reason=reason),
        _sample("mlstack_doctor_run_skipped_since_timestamp_seconds", since, tier=tier, reason=reason),
    ]
    return write_atomic(path, render([*kept, *new]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m mlstack_doctor.ops.metrics",
        description="Record in the doctor's metrics file that a scheduled run was skipped, and why.",
    )
    p.add_argument("--run-skipped", metavar="REASON", required=True, help="e.g. gpu_busy")
    p.add_argument("--tier", required=True, help="the tier whose run was skipped")
    p.add_argument("file", help="the metrics file (.prom) the doctor writes with --metrics")
    args = p.parse_args(argv)
    try:
        write_run_skipped(args.file, args.tier, args.run_skipped)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"mlstack-doctor metrics: cannot record the skipped run in {args.file}: {exc}\n")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
