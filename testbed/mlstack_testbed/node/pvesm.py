"""`pvesm path <volid>` for the testbed's nodes: where a volume of a dir storage lies, as PVE's pvesm
prints it (the storage `local` is the state dir's storage/local, as /var/lib/vz is on PVE)."""

import re
import sys

from .. import paths

# PVE's dir-storage layout: content type -> folder under the storage's path.
FOLDERS = {"vztmpl": "template/cache", "iso": "template/iso", "snippets": "snippets", "backup": "dump"}
VOLID = re.compile(r"^([a-z][a-z0-9_.-]*):(vztmpl|iso|snippets|backup)/([^/\s]+)$")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "path":
        print("400 unable to parse option\nUSAGE: pvesm path <volume>", file=sys.stderr)
        return 255
    m = VOLID.match(args[1])
    if not m:
        print(f"unable to parse directory volume name '{args[1].partition(':')[2]}'", file=sys.stderr)
        return 255
    storage, content, name = m.groups()
    if storage != paths.STORAGE:
        print(f"storage '{storage}' does not exist", file=sys.stderr)
        return 255
    print(paths.LOCAL_STORAGE / FOLDERS[content] / name)
    return 0
