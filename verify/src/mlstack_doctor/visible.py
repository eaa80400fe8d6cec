"""CUDA_VISIBLE_DEVICES as CUDA reads it, matched against the GPUs NVML lists.

CUDA takes, comma-separated: indices, GPU UUIDs (`GPU-<uuid>`, or a unique prefix, with or without
`GPU-`) and MIG device UUIDs (`MIG-...`). It stops at the first entry it cannot match: that entry and
every one after it are hidden. An index counts in CUDA's order, which is NVML's (PCI bus) order only
with CUDA_DEVICE_ORDER=PCI_BUS_ID or when every GPU is the same model (CUDA's default, fastest first,
then breaks ties by bus id).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

HIDE_ALL = ("-1", "NoDevFiles", "void", "none")


@dataclass
class Selection:
    entries: list[str]
    matched: list[dict[str, Any]] = field(default_factory=list)  # {"entry", "gpu" (NVML index), "mig"?}
    unmatched: str | None = None  # the first entry CUDA cannot match
    why: str = ""
    hidden_after: list[str] = field(default_factory=list)  # entries CUDA never reads (after `unmatched`)
    unchecked: list[str] = field(default_factory=list)  # UUID entries NVML could not be asked about

    @property
    def mig(self) -> bool:
        return any(m.get("mig") for m in self.matched) or any(e.startswith("MIG-") for e in self.entries)


def entries(value: str) -> list[str]:
    return [x.strip() for x in value.split(",") if x.strip()]


def hides_all(value: str) -> bool:
    items = entries(value)
    return not items or items[0] in HIDE_ALL


def _by_uuid(entry: str, gpus: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], bool]:
    """GPUs (or MIG devices) whose UUID starts with `entry`; the bool says a MIG device matched."""
    if entry.startswith("MIG-"):
        hits = [
            {"gpu": g["index"], "uuid": u}
            for g in gpus
            for u in g.get("mig_devices") or []
            if u.startswith(entry)
        ]
        return hits, True
    want = entry if entry.startswith("GPU-") else "GPU-" + entry
    return [
        {"gpu": g["index"], "uuid": g["uuid"]} for g in gpus if (g.get("uuid") or "").startswith(want)
    ], False


def select(value: str, gpus: list[dict[str, Any]] | None, count: int | None) -> Selection:
    """Which GPUs CUDA will see for `value`; `gpus`/`count` None: NVML could not say."""
    sel = Selection(entries(value))
    for pos, entry in enumerate(sel.entries):
        if entry.isdigit():
            if count is not None and int(entry) >= count:
                sel.unmatched, sel.why = entry, f"index {entry} but only {count} GPU(s)"
            else:
                sel.matched.append({"entry": entry, "gpu": int(entry)})
        elif gpus is None:
            sel.unchecked.append(entry)
            continue
        else:
            hits, mig = _by_uuid(entry, gpus)
            if len(hits) == 1:
                sel.matched.append(
                    {"entry": entry, "gpu": hits[0]["gpu"], "uuid": hits[0]["uuid"], "mig": mig}
                )
            else:
                what = "MIG device" if mig else "GPU"
                sel.unmatched = entry
                sel.why = f"matches {len(hits)} {what}s" if hits else f"matches no {what} UUID here"
        if sel.unmatched is not None:
            sel.hidden_after = sel.entries[pos + 1 :]
            break
    return sel


def index_order_trusted(gpus: list[dict[str, Any]], env: dict[str, str]) -> bool:
    """Whether CUDA's index N is NVML's index N (see the module doc)."""
    return env.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID" or len({g.get("name") for g in gpus}) <= 1


def visible_minors(
    value: str | None, gpus: list[dict[str, Any]] | None, env: dict[str, str]
) -> set[int] | None:
    """The /dev/nvidia<minor> nodes CUDA will open, or None where the doctor cannot know (then all count)."""
    if value is None or gpus is None or any(g.get("minor") is None for g in gpus):
        return None
    if hides_all(value):
        return set()
    sel = select(value, gpus, len(gpus))
    if sel.unchecked or (
        any(m["entry"].isdigit() for m in sel.matched) and not index_order_trusted(gpus, env)
    ):
        return None
    by_index = {g["index"]: g["minor"] for g in gpus}
    return {by_index[m["gpu"]] for m in sel.matched if m["gpu"] in by_index}
