"""`pveam` for the testbed node: PVE's appliance manager, with its verbs and output shapes.

The testbed cannot reach download.proxmox.com, so its catalogue lists, under PVE's standard names,
what it can build itself with debootstrap (the recipe of the testbed's own template, rootfs.py):
Debian 12 bookworm and Debian 13 trixie. Ubuntu 24.04 is listed, as on PVE, but its download fails
saying the testbed cannot build Ubuntu templates. A "download" builds the suite once (cached in the
state dir; bookworm is the testbed template itself) and copies it into the storage `local`'s
template/cache folder, where the API sees it as a vztmpl volume.

  pveam update                          write the catalogue index; "update successful"
  pveam available [--section system]    "%-15s %s" section and template, as PVE prints them
  pveam list <storage>                  NAME / SIZE table of the storage's templates
  pveam download <storage> <template>   the template into the storage, checksum verified
  pveam remove <volid>                  delete a template (local:vztmpl/<file>)

Errors print PVE's message and exit 255, as PVE's CLI does.
"""

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from .. import paths
from ..lxc import rootfs

SECTIONS = ("system", "mail", "turnkeylinux")
USAGE = """USAGE: pveam <COMMAND> [ARGS] [OPTIONS]
       pveam available  [OPTIONS]
       pveam download <storage> <template>
       pveam list <storage>
       pveam remove <template_path>
       pveam update"""


@dataclass(frozen=True)
class Appliance:
    section: str
    template: str
    # The Debian suite debootstrap builds it from; None: the testbed cannot build it.
    suite: str | None


CATALOGUE = (
    Appliance("system", "debian-12-standard_12.12-1_amd64.tar.zst", "bookworm"),
    Appliance("system", "debian-13-standard_13.1-2_amd64.tar.zst", "trixie"),
    Appliance("system", "ubuntu-24.04-standard_24.04-2_amd64.tar.zst", None),
)
INDEX = paths.PVEAM_DIR / "aplinfo.json"
CACHE = paths.PVEAM_DIR / "cache"
LOCK = paths.PVEAM_DIR / "lock"


class TaskError(Exception):
    """A download that failed: printed as PVE's `TASK ERROR: ...`."""


def die(msg: str, code: int = 255) -> NoReturn:
    print(msg.rstrip("\n"), file=sys.stderr)
    sys.exit(code)


def say(msg: str) -> None:
    print(msg, flush=True)


def find(template: str) -> Appliance | None:
    return next((a for a in CATALOGUE if a.template == template), None)


def template_dir(storage: str) -> Path:
    # One storage holds templates here, `local` (a dir storage, as on a PVE installed on ext4).
    if storage != paths.STORAGE:
        die(f"storage '{storage}' does not exist")
    return paths.TEMPLATE_CACHE


# ------------------------------------------------------------------------ verbs


def cmd_update() -> int:
    paths.PVEAM_DIR.mkdir(parents=True, exist_ok=True)
    INDEX.write_text(json.dumps([a.__dict__ for a in CATALOGUE], indent=1) + "\n")
    say("update successful")
    return 0


def cmd_available(section: str | None) -> int:
    if section is not None and section not in SECTIONS:
        die(
            "400 Parameter verification failed.\n"
            f"section: value '{section}' does not have a value in the enumeration '{', '.join(SECTIONS)}'\n"
            "pveam available  [OPTIONS]"
        )
    for a in sorted(CATALOGUE, key=lambda a: (a.section, a.template)):
        if section is None or a.section == section:
            say(f"{a.section:<15} {a.template}")
    return 0


def cmd_list(storage: str) -> int:
    if storage != paths.STORAGE:
        die("Storage does not support templates!")
    folder = paths.TEMPLATE_CACHE
    files = sorted(folder.glob("*.tar.*")) if folder.is_dir() else []
    say(f"{'NAME':<60} {'SIZE':<6}")
    for f in files:
        if f.name.endswith((".tar.zst", ".tar.gz", ".tar.xz")):
            say(f"{f'{storage}:vztmpl/{f.name}':<60} {f.stat().st_size / 1024**2:<4.2f}MB")
    return 0


def cmd_remove(volid: str) -> int:
    storage, _, volname = volid.partition(":")
    kind, _, name = volname.partition("/")
    if kind != "vztmpl" or not name or "/" in name:
        die(f"unable to parse volume name '{volid}'")
    (template_dir(storage) / name).unlink(missing_ok=True)
    return 0


def cmd_download(storage: str, template: str) -> int:
    appliance = find(template)
    if appliance is None:
        die(
            "400 Parameter verification failed.\n"
            "template: no such template\n"
            "pveam download <storage> <template>"
        )
    dest = template_dir(storage) / template
    try:
        download(appliance, dest)
    except TaskError as e:
        print(f"TASK ERROR: {e}", file=sys.stderr, flush=True)
        return 255
    say("TASK OK")
    return 0


# -------------------------------------------------------------------- downloads


def download(appliance: Appliance, dest: Path) -> None:
    if appliance.suite is None:
        raise TaskError(
            f"the testbed cannot build Ubuntu templates: {appliance.template} is listed as on PVE, "
            "but the testbed has no route to download.proxmox.com and builds only Debian templates "
            f"with debootstrap ({', '.join(a.template for a in CATALOGUE if a.suite)})"
        )
    paths.PVEAM_DIR.mkdir(parents=True, exist_ok=True)
    # One download or build at a time on the node; a second waits for the first.
    with LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        source = build(appliance.suite)
        expected = sha512(source)
        if dest.is_file() and sha512(dest) == expected:
            say(f"file already exists {expected}, no need to download")
            return
        say(f"downloading {source} to {dest}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_name(dest.name + ".tmp_dwnl." + str(os.getpid()))
        try:
            shutil.copyfile(source, part)
            print("calculating checksum...", end="", flush=True)
            if sha512(part) != expected:
                raise TaskError(f"checksum mismatch: got '{sha512(part)}' != expect '{expected}'")
            say("OK, checksum verified")
            part.chmod(0o644)
            part.replace(dest)
        finally:
            part.unlink(missing_ok=True)
        say(f"download of '{source}' to '{dest}' finished")


def sha512(path: Path) -> str:
    h = hashlib.sha512()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def build(suite: str) -> Path:
    """The packed rootfs of `suite`, built once with the testbed template's recipe."""
    target = CACHE / f"{suite}.tar.zst"
    if target.is_file():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    testbed = rootfs.template_status()
    if (
        suite == paths.TEMPLATE_SUITE
        and testbed.get("present")
        and testbed.get("packages") == rootfs.PACKAGES
    ):
        # The testbed's own template is this very build: no second debootstrap.
        say(f"using the testbed's {suite} build {rootfs.template_path()}")
        shutil.copyfile(rootfs.template_path(), target.with_suffix(".partial"))
        target.with_suffix(".partial").replace(target)
        return target
    debootstrap(suite, target)
    return target


def debootstrap(suite: str, target: Path) -> None:
    work = paths.PVEAM_DIR / f"build-{suite}"
    shutil.rmtree(work, ignore_errors=True)
    root = work / "rootfs"
    root.mkdir(parents=True)
    log = paths.LOG_DIR / f"debootstrap-{suite}.log"
    t0 = time.monotonic()
    say(f"building with debootstrap {suite} (minbase + the testbed template's packages) from {rootfs.MIRROR}")
    argv = [
        "debootstrap",
        "--variant=minbase",
        f"--include={rootfs.PACKAGES}",
        suite,
        str(root),
        rootfs.MIRROR,
    ]
    paths.LOG_DIR.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert p.stdout is not None
        last = 0.0
        for line in p.stdout:
            out.write(line)
            if line.startswith("I: ") and time.monotonic() - last > 10:
                say(f"  debootstrap: {line[3:].strip()}")
                last = time.monotonic()
        if p.wait(timeout=1800) != 0:
            shutil.rmtree(work, ignore_errors=True)
            raise TaskError(f"debootstrap {suite} failed (exit {p.returncode}); see {log}")
    try:
        rootfs._customise(root)
    except RuntimeError as e:
        raise TaskError(str(e)) from e
    part = target.with_suffix(".partial")
    packed = subprocess.run(
        [
            "sh",
            "-c",
            f"tar -C '{root}' --numeric-owner --xattrs --exclude='./dev/*' -cf - . "
            f"| zstd -q -T0 -3 -f -o '{part}'",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    shutil.rmtree(work, ignore_errors=True)
    if packed.returncode != 0:
        part.unlink(missing_ok=True)
        raise TaskError(f"packing the {suite} template failed: {packed.stderr.strip()[-500:]}")
    part.replace(target)
    say(f"built {suite} in {time.monotonic() - t0:.0f} s")


# -------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        die(f"ERROR: no command specified\n{USAGE}")
    verb, rest = args[0], args[1:]
    if verb in ("help", "-h", "--help"):
        say(USAGE)
        return 0
    if verb == "update" and not rest:
        return cmd_update()
    if verb == "available":
        if rest[:1] == ["--section"] and len(rest) == 2:
            return cmd_available(rest[1])
        if rest and rest[0].startswith("--section="):
            return cmd_available(rest[0].split("=", 1)[1])
        if not rest:
            return cmd_available(None)
    if verb == "list" and len(rest) == 1:
        return cmd_list(rest[0])
    if verb == "download" and len(rest) == 2:
        return cmd_download(rest[0], rest[1])
    if verb == "remove" and len(rest) == 1:
        return cmd_remove(rest[0])
    if verb not in ("update", "available", "list", "download", "remove"):
        die(f"ERROR: unknown command 'pveam {verb}'\n{USAGE}")
    die(f"400 wrong number of arguments\n{USAGE}")


if __name__ == "__main__":
    sys.exit(main())
