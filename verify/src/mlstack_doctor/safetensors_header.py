"""A model folder's safetensors checkpoint read from its headers alone (standard library, no tensor bytes).

A .safetensors file is an 8-byte little-endian length N, N bytes of JSON (tensor name -> {"dtype", "shape",
"data_offsets": [begin, end)} plus an optional "__metadata__"), then the tensors' bytes. A sharded checkpoint
adds model.safetensors.index.json, whose "weight_map" names the shard of each tensor.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INDEX = "model.safetensors.index.json"
# Headers are small (a 27B checkpoint's largest is well under 1 MB); a length beyond this is not a header.
MAX_HEADER = 100 * 2**20


class HeaderError(ValueError):
    """Why a file's header cannot be read (its text is the reason, for a person)."""


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """(tensors, bytes the file needs) of one .safetensors file: tensors maps a name to its header entry."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise HeaderError(f"{size} bytes: shorter than the 8-byte header length")
            n = int.from_bytes(head, "little")
            if n > size - 8:
                raise HeaderError(f"header says {n} bytes of JSON, the file has {size - 8} after the length")
            if n > MAX_HEADER:
                raise HeaderError(f"header length {n} bytes is not a safetensors header")
            header = json.loads(f.read(n))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HeaderError(f"header unreadable: {type(exc).__name__}: {exc}") from exc
    if not isinstance(header, dict):
        raise HeaderError("header is not a JSON object")
    tensors = {k: v for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)}
    ends = [t["data_offsets"][1] for t in tensors.values() if isinstance(t.get("data_offsets"), list)]
    return tensors, 8 + n + max(ends, default=0)


def damage(path: Path) -> str | None:
    """Why a .safetensors file is damaged, from its header alone: None when whole. A download cut short
    leaves a file shorter than the tensors its header promises."""
    try:
        _, need = read_header(path)
    except HeaderError as exc:
        return str(exc)
    size = path.stat().st_size
    return f"truncated: tensors end at byte {need}, the file has {size}" if need > size else None


@dataclass
class Checkpoint:
    """What a folder's safetensors files hold: every tensor's shape, dtype and file, and what stops a load."""

    tensors: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> {shape, dtype, file}
    missing_shards: list[str] = field(default_factory=list)  # named by the index, absent
    damaged: dict[str, str] = field(default_factory=dict)  # file -> why
    # tensors the index places in a file whose header does not hold them (tensor -> file)
    not_in_shard: dict[str, str] = field(default_factory=dict)
    index_unreadable: str | None = None


def read_checkpoint(folder: Path) -> Checkpoint:
    """A model folder's checkpoint: the index's shards (every *.safetensors without one), headers read."""
    out = Checkpoint()
    index = folder / INDEX
    weight_map: dict[str, str] = {}
    if index.is_file():
        try:
            raw = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
            weight_map = {str(k): str(v) for k, v in raw.items()}
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as exc:
            out.index_unreadable = f"{type(exc).__name__}: {exc}"
    shards = (
        sorted(set(weight_map.values()))
        if weight_map
        else sorted(p.name for p in folder.glob("*.safetensors"))
    )
    for name in shards:
        path = folder / name
        if not path.is_file():
            out.missing_shards.append(name)
            continue
        if why := damage(path):
            out.damaged[name] = why
            continue
        tensors, _ = read_header(path)
        for key, entry in tensors.items():
            out.tensors[key] = {
                "shape": list(entry.get("shape", [])),
                "dtype": entry.get("dtype"),
                "file": name,
            }
    for key, name in weight_map.items():
        if name not in out.missing_shards and name not in out.damaged and key not in out.tensors:
            out.not_in_shard[key] = name
    return out
