"""`pct` for the testbed: the verbs this project uses, on the same containers as the API.

config / pending / set / resize / create / destroy / start / stop / shutdown / reboot / status / list go
through the local API as root@pam, so API state and real state stay one. exec / push / pull use
lxc-attach directly, as PVE's pct does: exec clears the environment (PVE 9), passes stdin through and
returns the command's exit code. Errors print PVE's message and exit 255, as PVE's CLI does.

Where no testbed runs (no testbed.json, e.g. a GPU machine without network) or with
MLSTACK_TESTBED_PCT=direct, the non-exec verbs use the direct backend (direct.py): the same LXC
translation on a local config file per container, no API server. MLSTACK_TESTBED_PCT=api forces the API.
"""

import os
import sys
from typing import Any, NoReturn

# Only what `pct exec` needs at the top (every task in a container runs it): the API client, proxmoxer and
# the LXC lifecycle are imported by the verbs that use them.
from .. import paths
from ..lxc import ctlayout

USAGE = """usage: pct <command> <vmid> [ARGS] [OPTIONS]
  pct exec <vmid> [--keep-env 0|1] [-- <command> [args...]]
  pct push <vmid> <file> <destination> [--perms MODE] [--user U] [--group G]
  pct pull <vmid> <path> <destination> [--perms MODE] [--user U] [--group G]
  pct status <vmid> [--verbose]
  pct config <vmid> [--current]
  pct pending <vmid>
  pct set <vmid> [--<key> <value>]... [--delete <keys>]
  pct resize <vmid> <disk> <size>
  pct create <vmid> <ostemplate> [--<key> <value>]...
  pct destroy <vmid> [--purge] [--force]
  pct start|stop|shutdown|reboot <vmid> [OPTIONS]
  pct list"""


def die(msg: str, code: int = 255) -> NoReturn:
    print(msg.rstrip("\n"), file=sys.stderr)
    sys.exit(code)


def parse_opts(args: list[str]) -> dict[str, str]:
    """`--key value` pairs; a flag with no value means 1, as PVE's CLI takes booleans."""
    out: dict[str, str] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if not a.startswith("-"):
            die(f"400 too many arguments\n{USAGE}")
        key = a.lstrip("-")
        if "=" in key:
            key, value = key.split("=", 1)
            i += 1
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            value = args[i + 1]
            i += 2
        else:
            value = "1"
            i += 1
        out[key] = value
    return out


def vmid_arg(text: str) -> int:
    if not text.isdigit() or not 100 <= int(text) <= 999999999:
        die(
            "400 Parameter verification failed.\n"
            "vmid: invalid format - value does not look like a valid VM ID\n"
        )
    return int(text)


# ---------------------------------------------------------------- API-backed verbs


class Api:
    def __init__(self) -> None:
        from .. import client

        self.tb = client.load()
        self.api = self.tb.proxmox()
        # The node whose SSH this pct runs on (its stand-in script sets MLSTACK_TESTBED_NODE).
        self.node = paths.NODE

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from proxmoxer.core import ResourceException

        try:
            return fn(*args, **kwargs)
        except ResourceException as e:
            lines = [str(e.content or e.status_message).strip()]
            for k, v in (e.errors or {}).items():
                lines.append(f"{k}: {v}")
            die("\n".join(lines))

    def wait(self, upid: str) -> None:
        from .. import client

        status = client.wait_task(self.api, self.node, upid)
        if status.get("exitstatus") != "OK":
            for line in client.task_log(self.api, self.node, upid)[:-1]:
                print(line, file=sys.stderr)
            die(str(status.get("exitstatus")))

    def lxc(self, vmid: int) -> Any:
        return self.api.nodes(self.node).lxc(vmid)


def cmd_status(vmid: int, opts: dict[str, str]) -> int:
    a = Api()
    st = a.call(a.lxc(vmid).status.current.get)
    if opts.get("verbose") in ("1", "yes", "true"):
        for k in sorted(st):
            print(f"{k}: {st[k]}")
    else:
        print(f"status: {st['status']}")
    return 0


def cmd_config(vmid: int, opts: dict[str, str]) -> int:
    a = Api()
    params = {"current": 1} if opts.get("current") in ("1", "yes", "true") else {}
    cfg = a.call(a.lxc(vmid).config.get, **params)
    cfg.pop("digest", None)
    desc = cfg.pop("description", None)
    if desc:
        for line in str(desc).splitlines():
            print(f"#{line}")
    for k in sorted(cfg, key=lambda k: (k.startswith("unused"), k)):
        print(f"{k}: {cfg[k]}")
    return 0


def cmd_pending(vmid: int) -> int:
    from .direct import format_pending

    a = Api()
    for line in format_pending(a.call(a.lxc(vmid).pending.get)):
        print(line)
    return 0


def cmd_resize(vmid: int, rest: list[str]) -> int:
    if len(rest) < 2 or rest[0].startswith("-") or rest[1].startswith("--"):
        die("400 not enough arguments\n" + USAGE)
    a = Api()
    upid = a.call(a.lxc(vmid).resize.put, disk=rest[0], size=rest[1], **parse_opts(rest[2:]))
    if upid:
        a.wait(upid)
    return 0


def cmd_set(vmid: int, opts: dict[str, str]) -> int:
    if not opts:
        die("400 no options specified")
    a = Api()
    a.call(a.lxc(vmid).config.put, **opts)
    return 0


def cmd_create(vmid: int, rest: list[str]) -> int:
    if not rest or rest[0].startswith("-"):
        die("400 not enough arguments\n" + USAGE)
    opts = parse_opts(rest[1:])
    a = Api()
    upid = a.call(a.api.nodes(a.node).lxc.post, vmid=vmid, ostemplate=rest[0], **opts)
    a.wait(upid)
    return 0


def cmd_destroy(vmid: int, opts: dict[str, str]) -> int:
    a = Api()
    upid = a.call(a.lxc(vmid).delete, **opts)
    a.wait(upid)
    return 0


def cmd_power(verb: str, vmid: int, opts: dict[str, str]) -> int:
    a = Api()
    upid = a.call(getattr(a.lxc(vmid).status, verb).post, **opts)
    a.wait(upid)
    return 0


def cmd_list() -> int:
    a = Api()
    cts = a.call(a.api.nodes(a.node).lxc.get)
    print(f"{'VMID':<10} {'Status':<10} {'Lock':<10} Name")
    for ct in sorted(cts, key=lambda c: int(c["vmid"])):
        print(f"{ct['vmid']:<10} {ct['status']:<10} {ct.get('lock', ''):<10} {ct.get('name', '')}")
    return 0


# ---------------------------------------------------------------- lxc-attach verbs


def api_node_of(vmid: int) -> str | None:
    """The node the API has the container on (its saved state); None where no API state says."""
    if direct_mode():
        return None
    try:
        cts = paths.saved_cts()
    except (OSError, ValueError):
        return None
    return next((str(c.get("node") or paths.FIRST_NODE) for c in cts if int(c["vmid"]) == vmid), None)


def need_running(vmid: int) -> None:
    status, _ = ctlayout.state(vmid)
    node = api_node_of(vmid)
    # A container of another node of the cluster is not on this one: PVE's pct finds no config here.
    if status == "missing" or (node is not None and node != paths.NODE):
        die(f"Configuration file 'nodes/{paths.NODE}/lxc/{vmid}.conf' does not exist")
    if status != "running":
        die(f"CT {vmid} not running")


def attach_argv(vmid: int, keep_env: bool = False) -> list[str]:
    argv = ["lxc-attach", "-n", str(vmid)]
    if not keep_env:
        argv += ["--clear-env", "--keep-var", "TERM"]
    return [*argv, "--"]


def cmd_exec(vmid: int, rest: list[str]) -> NoReturn:
    keep_env = False
    while rest and rest[0] != "--":
        opts = parse_opts(rest[:2])
        if "keep-env" not in opts:
            die(f"400 unknown option {rest[0]}\n{USAGE}")
        keep_env = opts["keep-env"] in ("1", "yes", "true")
        rest = rest[2:]
    command = rest[1:] if rest else []
    if not command:
        command = ["/bin/sh", "-l"]
    need_running(vmid)
    argv = attach_argv(vmid, keep_env) + command
    os.execvp(argv[0], argv)


def _owner_args(opts: dict[str, str], default_perms: str) -> tuple[str, str, str]:
    perms = opts.get("perms", default_perms)
    perms = format(int(perms, 16), "o") if perms.lower().startswith("0x") else perms
    return opts.get("user", "root"), opts.get("group", opts.get("user", "root")), perms


def cmd_push(vmid: int, rest: list[str]) -> int:
    if len(rest) < 2:
        die("400 not enough arguments\n" + USAGE)
    src, dst, opts = rest[0], rest[1], parse_opts(rest[2:])
    if not dst.startswith("/"):
        die(f"destination '{dst}' must be an absolute path")
    try:
        fd = os.open(src, os.O_RDONLY)
    except OSError as e:
        die(f"failed to open {src} for reading: {e.strerror}")
    need_running(vmid)
    user, group, perms = _owner_args(opts, "0644")
    script = 'umask 077; cat > "$1" && chown "$2:$3" "$1" && chmod "$4" "$1"'
    argv = [*attach_argv(vmid), "/bin/sh", "-c", script, "pct-push", dst, user, group, perms]
    import subprocess

    rc = subprocess.run(argv, stdin=fd, check=False).returncode
    os.close(fd)
    return 0 if rc == 0 else 255


def cmd_pull(vmid: int, rest: list[str]) -> int:
    if len(rest) < 2:
        die("400 not enough arguments\n" + USAGE)
    src, dst, opts = rest[0], rest[1], parse_opts(rest[2:])
    need_running(vmid)
    import subprocess

    tmp = f"{dst}.pct-pull.{os.getpid()}"
    with open(tmp, "wb") as out:
        r = subprocess.run(
            [*attach_argv(vmid), "cat", "--", src], stdout=out, stderr=subprocess.PIPE, check=False
        )
    if r.returncode != 0:
        os.unlink(tmp)
        die(f"failed to open {src} for reading: {r.stderr.decode(errors='replace').strip()}")
    if "perms" in opts:
        os.chmod(tmp, int(_owner_args(opts, "0644")[2], 8))
    if "user" in opts or "group" in opts:
        import shutil

        shutil.chown(tmp, opts.get("user"), opts.get("group"))
    os.replace(tmp, dst)
    return 0


def direct_mode() -> bool:
    """The direct backend: asked for, or no testbed (API) on this machine."""
    mode = os.environ.get("MLSTACK_TESTBED_PCT", "")
    if mode in ("direct", "api"):
        return mode == "direct"
    return not paths.TESTBED_JSON.is_file()


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("help", "-h", "--help"):
        print(USAGE)
        return 0
    verb, rest = args[0], args[1:]
    if verb == "list":
        if direct_mode():
            from . import direct

            return direct.main(verb, None, [], parse_opts)
        return cmd_list()
    if not rest:
        die(f"400 not enough arguments\n{USAGE}")
    vmid = vmid_arg(rest[0])
    rest = rest[1:]
    if verb == "exec":
        cmd_exec(vmid, rest)
    if verb == "push":
        return cmd_push(vmid, rest)
    if verb == "pull":
        return cmd_pull(vmid, rest)
    if direct_mode():
        from . import direct

        return direct.main(verb, vmid, rest, parse_opts)
    if verb == "create":
        return cmd_create(vmid, rest)
    if verb == "resize":
        return cmd_resize(vmid, rest)
    opts = parse_opts(rest)
    if verb == "status":
        return cmd_status(vmid, opts)
    if verb == "config":
        return cmd_config(vmid, opts)
    if verb == "pending":
        return cmd_pending(vmid)
    if verb == "set":
        return cmd_set(vmid, opts)
    if verb == "destroy":
        return cmd_destroy(vmid, opts)
    if verb in ("start", "stop", "shutdown", "reboot"):
        return cmd_power(verb, vmid, opts)
    die(f"unknown command 'pct {verb}'\n{USAGE}")


def pveversion_main() -> int:
    """`pveversion`: PVE's one-line form (and -v), matching the fakepve API version (as `testbed up` recorded
    it in testbed.json; fakepve's own where no testbed runs)."""
    import json
    import platform

    try:
        version = str(json.loads(paths.TESTBED_JSON.read_text())["pve_version"])
    except (OSError, ValueError, KeyError):
        from fakepve.model import Model

        version = Model().version
    kernel = platform.release()
    if any(a in ("-v", "--verbose") for a in sys.argv[1:]):
        print(f"proxmox-ve: {version.rsplit('.', 1)[0]}.0 (running kernel: {kernel})")
        print(f"pve-manager: {version} (running version: {version}/mlstack-testbed)")
        print("pve-container: testbed (lxc + mlstack-testbed)")
        print("lxc-pve: (Debian lxc, see dpkg -l lxc)")
    else:
        print(f"pve-manager/{version}/mlstack-testbed (running kernel: {kernel})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
