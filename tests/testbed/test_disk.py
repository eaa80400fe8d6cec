"""The testbed's disk (testbed/mlstack_testbed/node/disk.py): an ext4 image with a journal that holds the
folders where containers come and go, where the machine's root filesystem is an ext4 without one."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlstack_testbed.node import disk

MOUNTINFO = """\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard
60 22 7:0 / /var/lib/mlstack-testbed.disk rw,relatime shared:30 - ext4 /dev/loop0 rw,discard
61 22 7:0 /lxc /var/lib/lxc rw,relatime shared:30 - ext4 /dev/loop0 rw,discard
62 22 0:50 / /srv/with\\040space rw - tmpfs tmpfs rw
"""


@pytest.fixture
def kernel(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in /sys/dev/block (vda 254:0, loop0 7:0) and /proc/fs/jbd2 (loop0's journal only)."""
    block, jbd2 = tmp_path / "block", tmp_path / "jbd2"
    block.mkdir()
    (jbd2 / "loop0-8").mkdir(parents=True)
    os.symlink("../../devices/pci0000:00/virtio0/block/vda", block / "254:0")
    os.symlink("../../devices/virtual/block/loop0", block / "7:0")
    return block, jbd2


def test_mountinfo_names_the_mount_that_holds_a_path(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(MOUNTINFO)
    table = disk.mounts(info)
    assert disk.mount_of(Path("/var/lib/lxc/100/rootfs"), table).root == "/lxc"
    assert disk.mount_of(Path("/var/lib/lxcfs"), table).target == "/"
    assert disk.mount_of(Path("/var/lib/mlstack/cache"), table).target == "/"
    assert disk.mount_of(Path("/srv/with space/x"), table).fstype == "tmpfs"


def test_an_ext4_without_a_journal_is_told_from_one_with_it(
    tmp_path: Path, kernel: tuple[Path, Path]
) -> None:
    block, jbd2 = kernel
    info = tmp_path / "mountinfo"
    info.write_text(MOUNTINFO)
    table = disk.mounts(info)
    root, image, tmpfs = (disk.mount_of(Path(p), table) for p in ("/", "/var/lib/lxc", "/srv/with space"))
    assert disk.journalless_ext4(root, jbd2, block)
    assert not disk.journalless_ext4(image, jbd2, block)
    assert not disk.journalless_ext4(tmpfs, jbd2, block), "only ext4 is changed"
    (jbd2 / "vda-8").mkdir()
    assert not disk.journalless_ext4(root, jbd2, block)
    # A device the kernel does not name: nothing is changed.
    assert not disk.journalless_ext4(disk.Mount("8:1", "ext4", "/data", "/"), jbd2, block)


@pytest.fixture
def made(tmp_path: Path) -> Iterator[disk.Disk]:
    """A disk of this test's own (a real loop-mounted image), taken down afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting an image needs root")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "kept").write_text("data\n")
    d = disk.Disk(
        tmp_path / "img.ext4",
        {"empty": tmp_path / "empty", "full": tmp_path / "full", "absent": tmp_path / "absent"},
        only_without_journal=False,
    )
    yield d
    for target in (tmp_path / "empty", tmp_path / "absent", d.mount):
        subprocess.run(["umount", str(target)], check=False, capture_output=True)


def test_the_disk_holds_the_empty_folders_and_leaves_the_others(made: disk.Disk, tmp_path: Path) -> None:
    changed, line = made.ensure()
    assert changed
    assert f"{tmp_path / 'full'} kept on the root filesystem (not empty)" in line
    table = disk.mounts()
    for name in ("empty", "absent"):
        m = disk.mount_of(tmp_path / name, table)
        assert m.target == str(tmp_path / name) and m.fstype == "ext4" and m.root == f"/{name}"
        # The image's ext4 has a journal: the kernel lists it.
        dev = os.readlink(f"/sys/dev/block/{m.device}").rsplit("/", 1)[-1]
        assert any(j.name.startswith(dev + "-") for j in Path("/proc/fs/jbd2").iterdir())
    assert not os.path.ismount(tmp_path / "full") and (tmp_path / "full" / "kept").read_text() == "data\n"
    (tmp_path / "empty" / "new").write_text("x")
    assert (made.mount / "empty" / "new").read_text() == "x", "a file made in the folder is on the image"
    # Sparse: the image takes the room of what is written, not its size.
    assert made.image.stat().st_blocks * 512 < made.image.stat().st_size / 10
    assert made.state()["folders"][str(tmp_path / "empty")] == "on the testbed's disk"

    # A second `up` finds it all in place.
    assert made.ensure() == (False, line)

    # After a reboot (everything unmounted) the same image is mounted again, with what it held.
    for target in (tmp_path / "empty", tmp_path / "absent", made.mount):
        subprocess.run(["umount", str(target)], check=True)
    changed, again = made.ensure()
    assert changed and again == line
    assert (tmp_path / "empty" / "new").read_text() == "x"

    # A purge of a folder above one it holds lets that one go first; the others stay mounted.
    assert made.release(tmp_path / "empty") == [str(tmp_path / "empty")]
    assert not os.path.ismount(tmp_path / "empty") and os.path.ismount(tmp_path / "absent")
