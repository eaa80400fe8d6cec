"""The cluster's warm caches: a warmed key's Triton cache as one artifact, published once, installed.

The warm step tunes every kernel training calls for one cache key (mlstack_doctor.cache.warm: GPU, stack,
config, shapes). Every node of the same key would tune the same configs again, and a cold node meets
the autotuner race until it is warm. So the first node that warms a key publishes that key's cache to a
share folder, and the next node of the same key installs it instead of warming:

  <share>/<key>.tar.gz   the stamp (mlstack-warm/<key>.json) and the cache entries it names
  <share>/<key>.json     the manifest: the stamp, the cache folder it came from, the tarball's sha256 and
                         size; written after the tarball, so a manifest names a complete artifact

An artifact is installed only when its key and key parts are this cache's, its bytes match the
manifest's sha256, every member is a plain file or folder of a named entry, and every file passes the
kernel-cache check (kernel_cache.scan: complete ELF binaries, parsing metadata, group files whose
children are there). Entries are unpacked inside the cache (<cache>/mlstack-incoming/), checked, then
moved into place; the stamp is written last, so a cut install is a cold cache, never a false warm one.
Standard library only.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tarfile
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from mlstack_doctor.cache import kernel_cache, warm
from mlstack_doctor.files import read_json_object, sha256_of, write_atomic

SHARE_DIR = "mlstack-share"  # a node's own share folder inside its cache (the controller's copies land here)
INCOMING = "mlstack-incoming"  # unpacked and checked here, inside the cache, before entries move into place


class Refused(Exception):
    """The artifact cannot be published or installed; the message says why and what to do."""


def node_share(cache_dir: str | Path) -> Path:
    return Path(cache_dir) / SHARE_DIR


def artifact_path(share: str | Path, key: str) -> Path:
    return Path(share) / f"{key}.tar.gz"


def manifest_path(share: str | Path, key: str) -> Path:
    return Path(share) / f"{key}.json"


def has(share: str | Path, key: str) -> bool:
    """Whether the share holds a complete artifact for `key` (its manifest is written last)."""
    return manifest_path(share, key).is_file() and artifact_path(share, key).is_file()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _bad_files(root: Path) -> dict[str, list[str]]:
    return dict(kernel_cache.scan(str(root))["bad"])  # type: ignore[arg-type]


def pack(cache_dir: str | Path, key: str, share: str | Path) -> Path:
    """Publish the warm of `key` in `cache_dir` to `share`; the tarball's path. Refused when the stamp is
    missing, names entries that are gone, or an entry fails the kernel-cache check."""
    cache = Path(cache_dir)
    stamp = read_json_object(warm.stamp_path(cache, key))
    if stamp is None or stamp.get("key") != key:
        raise Refused(f"no readable warm stamp for key {key} in {cache}: nothing to publish")
    entries = [str(e) for e in stamp.get("entries", [])]
    gone = [e for e in entries if not (cache / e).is_dir()]
    if gone:
        raise Refused(f"{len(gone)} of {len(entries)} cache entries of key {key} are gone: not published")
    for entry in entries:
        bad = _bad_files(cache / entry)
        if bad:
            why = "; ".join(w for ws in bad.values() for w in ws)
            raise Refused(f"cache entry {entry} cannot be loaded ({why}): not published")
    share = Path(share)
    share.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=share, prefix=f".{key}.", suffix=".tmp")
    os.close(fd)
    try:
        files = 0
        with tarfile.open(tmp, "w:gz") as tar:
            tar.add(warm.stamp_path(cache, key), arcname=f"{warm.STAMP_DIR}/{key}.json", recursive=False)
            for entry in entries:
                for dirpath, _, filenames in os.walk(cache / entry):
                    for name in sorted(filenames):
                        path = Path(dirpath, name)
                        if path.is_file() and not path.is_symlink():
                            tar.add(path, arcname=str(path.relative_to(cache)), recursive=False)
                            files += 1
        os.chmod(tmp, 0o644)
        target = artifact_path(share, key)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    manifest = {
        "key": key,
        "parts": stamp.get("parts"),
        "stamp": stamp,
        "cache_dir": str(cache),
        "sha256": sha256_of(target),
        "bytes": target.stat().st_size,
        "files": files,
        "published": _now(),
        "published_by": socket.gethostname(),
    }
    write_atomic(manifest_path(share, key), json.dumps(manifest, indent=2, sort_keys=True))
    return target


def _member_problem(member: tarfile.TarInfo, allowed: set[str]) -> str | None:
    path = PurePosixPath(member.name)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        return f"member {member.name!r} lies outside the cache"
    if not (member.isfile() or member.isdir()):
        return f"member {member.name!r} is not a plain file or folder"
    if path.parts[0] not in allowed:
        return f"member {member.name!r} belongs to no entry the stamp names"
    return None


def _repoint_groups(root: Path, old: str, new: str) -> None:
    """Triton's group files list their children by absolute path: point those under `old` to `new`."""
    for grp in root.rglob("__grp__*.json"):
        data = read_json_object(grp)
        children = data.get("child_paths") if data else None
        if not isinstance(children, dict):
            continue
        data["child_paths"] = {  # type: ignore[index]
            k: new + str(p)[len(old) :] if str(p).startswith(old + "/") else p for k, p in children.items()
        }
        grp.write_text(json.dumps(data), encoding="utf-8")


def install(
    share: str | Path,
    key: str,
    parts: dict[str, Any],
    cache_dir: str | Path,
    check_binaries: Callable[[list[str]], dict[str, str]] | None = None,
) -> dict[str, Any]:
    """Install the artifact of `key` from `share` into `cache_dir`; the stamp installed. Refused (nothing
    installed) when the key does not match, the tarball is corrupt or partial, a member is not one of
    the stamp's entries, a file fails the kernel-cache check, or `check_binaries` (the driver's load of
    each .cubin: {path: error}) refuses one. Never over a warm stamp of the same key."""
    cache = Path(cache_dir)
    tarball = artifact_path(share, key)
    if warm.stamp_path(cache, key).exists():
        raise Refused(f"{cache} already holds a warm stamp for key {key}: not installed over it")
    manifest = read_json_object(manifest_path(share, key))
    if manifest is None:
        raise Refused(f"{manifest_path(share, key)} is missing or unreadable: the artifact is incomplete")
    src_parts = manifest.get("parts")
    if manifest.get("key") != key or not isinstance(src_parts, dict) or warm.cache_key(src_parts) != key:
        raise Refused(f"{manifest_path(share, key)} names key {manifest.get('key')}, not {key}")
    if src_parts != parts:
        raise Refused(f"{tarball} was warmed for other key parts: {'; '.join(warm.diff(src_parts, parts))}")
    try:
        size, digest = tarball.stat().st_size, sha256_of(tarball)
    except OSError as exc:
        raise Refused(f"{tarball} cannot be read: {exc}") from None
    if digest != manifest.get("sha256"):
        raise Refused(
            f"{tarball} is corrupt or partial ({size} of {manifest.get('bytes')} bytes, sha256 {digest[:12]} "
            f"!= {str(manifest.get('sha256'))[:12]}): publish it again"
        )
    staging = cache / INCOMING / f"{key}.{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        stamp = _unpack(tarball, key, staging)
        entries = [str(e) for e in stamp.get("entries", [])]
        src_cache = str(manifest.get("cache_dir") or "")
        if src_cache:
            _repoint_groups(staging, src_cache, str(staging))
        bad = _bad_files(staging)
        if bad:
            listed = "; ".join(f"{Path(f).name}: {', '.join(w)}" for f, w in bad.items())
            raise Refused(f"{tarball} holds cache files that cannot be loaded: {listed}")
        cubins = [str(p) for p in staging.rglob("*.cubin")]
        refused = check_binaries(cubins) if check_binaries and cubins else {}
        if refused:
            first = next(iter(refused.values()))
            raise Refused(f"the driver refuses {len(refused)} kernel image(s) of {tarball}: {first}")
        _repoint_groups(staging, str(staging), str(cache))
        for entry in entries:
            # An entry already there is the same kernel (content-addressed), maybe moved in a moment ago by
            # another container of this node installing the same key.
            try:
                if not (cache / entry).exists():
                    os.rename(staging / entry, cache / entry)
            except OSError:
                if not (cache / entry).is_dir():
                    raise
        stamp = {**stamp, "installed_from": str(tarball), "installed": _now()}
        write_atomic(warm.stamp_path(cache, key), json.dumps(stamp, indent=2, sort_keys=True))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return stamp


def _unpack(tarball: Path, key: str, staging: Path) -> dict[str, Any]:
    """Unpack into `staging` after checking every member; the stamp it carries."""
    stamp_name = f"{warm.STAMP_DIR}/{key}.json"
    try:
        with tarfile.open(tarball, "r:gz") as tar:
            members = tar.getmembers()
            stamp_member = next((m for m in members if m.name == stamp_name), None)
            raw = None
            if stamp_member is not None and stamp_member.isfile():
                raw = tar.extractfile(stamp_member)
            if raw is None:
                raise Refused(f"{tarball} carries no stamp {stamp_name}")
            try:
                stamp = json.loads(raw.read().decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise Refused(f"{tarball}: its stamp does not parse: {exc}") from None
            named = stamp.get("key") if isinstance(stamp, dict) else None
            if named != key:
                raise Refused(f"{tarball}: its stamp names key {named}, not {key}")
            allowed = {str(e) for e in stamp.get("entries", [])} | {warm.STAMP_DIR}
            for m in members:
                why = _member_problem(m, allowed)
                if why:
                    raise Refused(f"{tarball}: {why}")
            for m in members:
                if m.isfile() and m.name != stamp_name:
                    dest = staging / m.name
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    src = tar.extractfile(m)
                    with dest.open("wb") as out:
                        shutil.copyfileobj(src, out)  # type: ignore[arg-type]
    except (tarfile.TarError, EOFError, OSError) as exc:
        why = f"{type(exc).__name__}: {exc}"
        raise Refused(f"{tarball} is not a readable tar.gz ({why}): publish it again") from None
    missing = [e for e in stamp.get("entries", []) if not (staging / str(e)).is_dir()]
    if missing:
        raise Refused(f"{tarball} lacks {len(missing)} of the entries its stamp names: publish it again")
    return stamp


def nearest(share: str | Path, parts: dict[str, Any]) -> str:
    """What the share holds against `parts`, for a key it has no artifact for: the closest key and what
    differs, or that it holds none."""
    read = (read_json_object(p) for p in sorted(Path(share).glob("*.json")))
    others = [m for m in read if m and isinstance(m.get("parts"), dict)]
    if not others:
        return f"the cluster's cache {share} holds no warmed key"
    best = min(others, key=lambda m: len(warm.diff(m["parts"], parts)))
    return (
        f"the cluster's cache {share} holds {len(others)} other key(s); the nearest, {best.get('key')}, "
        f"differs: {'; '.join(warm.diff(best['parts'], parts))}"
    )
