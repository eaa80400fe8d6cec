"""gpu-passthrough-check: GPU passthrough proven on a real machine, with the doctor inside the container.

On any machine with NVIDIA device nodes (a real GPU, or the testbed's dummy nodes), as root:

1. creates containers through the testbed's pct verbs (direct backend: no API server, no network),
   rootfs = the machine's own root under an overlay (hostroot.py), with a devN entry for every NVIDIA
   node found on the host, written by the project's own filter (plugins/filter/container_options.py,
   gid/mode from roles/gpu_container/defaults) and translated to LXC by lxcconf (cgroup allows from
   each node's major:minor, passthrough nodes mknod'ed with gid/mode, bind entries, autodev);
2. binds the host's driver library folder read-only (the nvidia_userspace `bind` method) and does the
   role's steps inside (ld.so.conf.d entry + ldconfig);
3. runs the doctor inside with `pct exec`, prints its report and checks its verdict, for:
     pass         everything passed through                               -> doctor passes (full tier),
                  then with more than one GPU its NCCL tier across them    -> passes (exact sums, busbw)
     fault-node   /dev/nvidia-uvm not passed, so its major:minor not allowed -> NVIDIA_UVM_MISSING
     fault-libs   the driver libraries not bound             -> NVML_UNAVAILABLE or LIBCUDA_NOT_FOUND
     fault-perm   unprivileged CT, nodes with a wrong gid and mode 0660,
                  doctor run as a user not in that group                  -> NVIDIA_NODE_PERMISSION
   and says which checks this machine cannot make (no driver: no GPU stages, no driver libraries).

Exit codes: 0 every case gave its expected verdict; 1 a case did not (or broke); 2 could not run (not
root, no LXC, no NVIDIA nodes, bad arguments); 3 no NVIDIA driver on this machine: what could be
checked gave its expected verdict, the GPU checks were not made (listed in the output).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from mlstack_doctor.facts.stack import DEFAULT_PURPOSE, PURPOSES

from .. import paths
from ..lxc import hostroot
from .cases import build_cases, load_filter, set_aside_uncheckable
from .host import REPO, CannotRun, ensure_lxc, host_facts
from .report import EXIT_CANNOT_RUN, exit_code, print_cases, print_host, print_summary, write_json
from .run import run_all

DEFAULT_DEBS = REPO / ".debs"
DEFAULT_PREFIX = Path("/tmp/mlstack-lxc")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    # The module's docstring is the --help text: it says what is checked and what each exit code means.
    p = argparse.ArgumentParser(
        prog="gpu-passthrough-check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--vmid-base", type=int, default=950, help="first vmid (4 are used; default 950)")
    p.add_argument(
        "--cases", default="", help="comma list: pass,fault-node,fault-libs,fault-perm (default all)"
    )
    p.add_argument("--pass-tier", default="full", choices=("quick", "full"))
    p.add_argument("--fault-tier", default="quick", choices=("quick", "full"))
    p.add_argument(
        "--nccl",
        default="auto",
        choices=("auto", "always", "never"),
        help="after a passing pass case, the doctor's NCCL tier in its container: auto (more than one GPU, "
        "as provisioning does), always (also one GPU: one rank), never",
    )
    p.add_argument(
        "--pass-skip",
        default="",
        help="probes left out of the pass case (doctor --only the rest), e.g. gdn_backward; reported",
    )
    p.add_argument(
        "--profile",
        default="",
        help="the stack profile the doctor checks versions against (a profiles/<name> folder or its "
        "uv.lock; default: none: the doctor pins nothing and names the shipped profile the stack matches)",
    )
    p.add_argument("--purpose", default=DEFAULT_PURPOSE, choices=PURPOSES)
    p.add_argument(
        "--python", default=sys.executable, help="the interpreter the doctor tests (default: this one)"
    )
    p.add_argument("--lib-dir", default=None, help="host folder with the driver libraries (default: found)")
    p.add_argument(
        "--rootfs",
        default="overlay",
        choices=hostroot.MODES,
        help="overlay (default) of the host's root; bind writes the host's root (disposable machines only)",
    )
    p.add_argument(
        "--lxc-debs", type=Path, default=DEFAULT_DEBS, help="carried LXC .debs (used when no lxc-start)"
    )
    p.add_argument("--lxc-prefix", type=Path, default=DEFAULT_PREFIX)
    p.add_argument(
        "--lxc-from-debs", action="store_true", help="use the carried .debs even if LXC is installed"
    )
    p.add_argument("--jobs", type=int, default=4, help="cases run at once (default 4)")
    p.add_argument("--report-dir", default=None, help="save each doctor JSON report here")
    p.add_argument("--json", dest="json_out", default=None, help="write the summary as JSON here")
    p.add_argument("--keep", action="store_true", help="leave the containers (pct destroy them later)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if os.geteuid() != 0:
            raise CannotRun("must run as root (real LXC containers, device nodes, mounts)")
        lxc = ensure_lxc(args.lxc_debs, args.lxc_prefix, args.lxc_from_debs)
        host = host_facts(args)
        cases = build_cases(host, args, load_filter())
    except CannotRun as e:
        print(f"gpu-passthrough-check: cannot run: {e}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    paths.LOG_DIR.mkdir(parents=True, exist_ok=True)
    print_host(lxc, host, args.rootfs)
    cases, skipped = set_aside_uncheckable(cases, host)
    t0 = time.monotonic()
    run_all(cases, host, args)
    print_cases(cases)
    everything = cases + skipped
    print_summary(everything, host, time.monotonic() - t0)
    if args.json_out:
        write_json(args.json_out, host, everything)
    return exit_code(everything, host)
