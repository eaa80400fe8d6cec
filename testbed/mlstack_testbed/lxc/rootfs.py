"""Container root filesystems: the Debian template built once with debootstrap, and the pluggable provider.

The template mirrors what PVE's debian-12-standard has where it matters here: systemd as init,
ifupdown + isc-dhcp-client for `ip=dhcp`, ca-certificates and curl, no python3 (provisioning
bootstraps it). The machine's extra CA certificates (/usr/local/share/ca-certificates/*.crt) are
trusted inside so TLS through an intercepting egress proxy works from a container.
"""

import hashlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .. import paths
from ..proc import run, say

MIRROR = os.environ.get("MLSTACK_TESTBED_MIRROR", "http://deb.debian.org/debian")
PACKAGES = (
    "systemd,systemd-sysv,dbus,ifupdown,isc-dhcp-client,iproute2,iputils-ping,ca-certificates,curl,"
    "less,procps,nano,locales,apt-utils"
)
EXTRA_CA_DIR = Path("/usr/local/share/ca-certificates")
TEMPLATE_META = paths.STATE_DIR / "template.json"


def template_path() -> Path:
    return paths.TEMPLATE_CACHE / paths.TEMPLATE_NAME


def extra_cas() -> list[Path]:
    return sorted(EXTRA_CA_DIR.glob("*.crt")) if EXTRA_CA_DIR.is_dir() else []


def ca_digest() -> str:
    h = hashlib.sha256()
    for p in extra_cas():
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def template_status() -> dict[str, object]:
    meta = json.loads(TEMPLATE_META.read_text()) if TEMPLATE_META.is_file() else {}
    path = template_path()
    return {
        "path": str(path),
        "present": path.is_file(),
        "size": path.stat().st_size if path.is_file() else 0,
        "stale_ca": bool(meta) and meta.get("ca_sha256") != ca_digest(),
        **meta,
    }


def build_template(force: bool = False) -> bool:
    """Build the template unless cached; returns True if it was built now."""
    target = template_path()
    if target.is_file() and not force:
        if template_status().get("stale_ca"):
            say(
                "the machine's extra CA certificates changed since the template was built: "
                "`testbed down --purge` and `up` rebuild it"
            )
        return False
    paths.ensure_dirs()
    work = paths.STATE_DIR / "build"
    if work.exists():
        shutil.rmtree(work)
    root = work / "rootfs"
    root.mkdir(parents=True)
    t0 = time.monotonic()
    say(
        f"debootstrap {paths.TEMPLATE_SUITE} (minbase + {PACKAGES.count(',') + 1} packages) from {MIRROR}; "
        "about a minute"
    )
    log = paths.LOG_DIR / "debootstrap.log"
    with log.open("w") as out:
        argv = [
            "debootstrap",
            "--variant=minbase",
            f"--include={PACKAGES}",
            paths.TEMPLATE_SUITE,
            str(root),
            MIRROR,
        ]
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert p.stdout is not None
        last = 0.0
        for line in p.stdout:
            out.write(line)
            if line.startswith("I: ") and time.monotonic() - last > 5:
                say(f"  debootstrap: {line[3:].strip()}")
                last = time.monotonic()
        if p.wait(timeout=900) != 0:
            raise RuntimeError(f"debootstrap failed (exit {p.returncode}); see {log}")
    _customise(root)
    say("packing the template (tar + zstd)")
    tmp = target.with_suffix(".partial")
    r = run(
        [
            "sh",
            "-c",
            f"tar -C '{root}' --numeric-owner --xattrs --exclude='./dev/*' -cf - . "
            f"| zstd -q -T0 -3 -o '{tmp}'",
        ],
        timeout=600,
    )
    if not r.ok:
        raise RuntimeError(f"packing the template failed: {r.detail()}")
    tmp.replace(target)
    shutil.rmtree(work)
    meta = {
        "suite": paths.TEMPLATE_SUITE,
        "packages": PACKAGES,
        "mirror": MIRROR,
        "ca_sha256": ca_digest(),
        "ca_files": [p.name for p in extra_cas()],
        "built_at": int(time.time()),
        "build_seconds": round(time.monotonic() - t0, 1),
    }
    TEMPLATE_META.write_text(json.dumps(meta, indent=2) + "\n")
    say(f"template {paths.TEMPLATE_VOLID} built in {meta['build_seconds']} s")
    return True


def _customise(root: Path) -> None:
    """The few things PVE's template build does that matter: CA trust, an empty machine-id, no caches."""
    cas = extra_cas()
    if cas:
        dst = root / "usr/local/share/ca-certificates"
        dst.mkdir(parents=True, exist_ok=True)
        for ca in cas:
            shutil.copy2(ca, dst / ca.name)
        r = run(["chroot", str(root), "update-ca-certificates"], timeout=120)
        if not r.ok:
            raise RuntimeError(f"update-ca-certificates in the template failed: {r.detail()}")
    (root / "etc/machine-id").write_text("")
    (root / "etc/hostname").write_text("localhost\n")
    (root / "etc/network/interfaces").write_text("auto lo\niface lo inet loopback\n")
    run(["chroot", str(root), "apt-get", "clean"], timeout=60)
    for p in (root / "var/lib/apt/lists").glob("*_*"):
        p.unlink()


def remove_template() -> None:
    for p in (template_path(), TEMPLATE_META):
        p.unlink(missing_ok=True)


# ------------------------------------------------------------------ pluggable rootfs


class RootfsProvider(Protocol):
    """How a container gets its root filesystem: returns the lxc.rootfs.path value."""

    def provide(self, vmid: int, unprivileged: bool) -> str: ...


@dataclass
class TemplateRootfs:
    """Unpack an OS template tarball (the testbed's way, and PVE's)."""

    tarball: Path

    def provide(self, vmid: int, unprivileged: bool) -> str:
        from . import realct

        realct.create_from_template(vmid, self.tarball, unprivileged)
        return f"dir:{realct.rootfs_dir(vmid)}"
