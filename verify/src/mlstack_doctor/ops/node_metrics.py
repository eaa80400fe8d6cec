"""The doctor metrics of all a Proxmox VE node's containers in one file, for the node's node_exporter.

Run on the node as root (`python -m mlstack_doctor.ops.node_metrics`): for each running container
(`lxc-ls --running -1`; PVE names them by vmid) it reads the container's
/var/lib/mlstack/metrics/doctor.prom with `lxc-attach -n VMID --clear-env -- cat FILE`, inside the
container's namespaces. Never through /proc/PID/root: the path would be resolved on the node, where an
absolute symlink the container planted points at the node's own files.

The container's text is untrusted. It is parsed strictly (metrics.parse(strict=True)): a malformed line
refuses the whole file, and the container contributes nothing. Only the doctor's own families are kept
(metrics.FAMILIES), a vmid label the container wrote is dropped, and every sample gets
vmid="<the container it was read from>". All containers go into one file (HELP and TYPE once per family),
written atomically, with `mlstack_node_container_metrics_ok{vmid}` (1 read and parsed, 0 not) and
`mlstack_node_metrics_last_run_timestamp_seconds`. The node's own word on containers whose start it refused
(the GPU hookscript's status files, one per vmid in /run/mlstack/ct-start) becomes
`mlstack_ct_start_blocked{vmid,reason}`.

Exit 0 when the file was written, even when containers failed (their metric says so); 2 for bad
arguments, a failing lxc-ls or an unwritable output (the previous file is left as it was).
"""

from __future__ import annotations

import argparse
import os
import re
import selectors
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from mlstack_doctor.files import write_atomic
from mlstack_doctor.ops.metrics import FAMILIES, Sample, parse, render

CONTAINER_FILE = "/var/lib/mlstack/metrics/doctor.prom"
# Debian's prometheus-node-exporter reads this folder (--collector.textfile.directory).
DEFAULT_OUT = "/var/lib/prometheus/node-exporter/mlstack.prom"
NODE_FAMILIES: dict[str, str] = {
    "mlstack_node_container_metrics_ok": (
        "1 when the container's doctor metrics were read and parsed in the last run of the node's "
        "collector, 0 when not (no file yet, unreadable, unparsable or timed out)"
    ),
    "mlstack_node_metrics_last_run_timestamp_seconds": (
        "When python -m mlstack_doctor.ops.node_metrics last wrote this file (Unix time)"
    ),
    "mlstack_ct_start_blocked": (
        "1 for a container whose last start the node's GPU hookscript refused, with its reason "
        "(module_load_failed, device_missing, driver_missing, driver_version_changed); absent once it starts"
    ),
}
# The GPU hookscript's refusals, one file per vmid (`reason=...` and `message=...` lines; the gpu_boot role).
START_STATUS_DIR = "/run/mlstack/ct-start"
REASON = re.compile(r"^[a-z][a-z_]{0,63}$")
# A doctor.prom is a few KiB; more is not the doctor's, and is not held in memory.
MAX_BYTES = 256 * 1024
STDERR_KEEP = 2048
WORKERS = 8  # a hung container costs its timeout, not the others' too
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # PVE: the vmid; an LXC name at most


class ReadError(Exception):
    """The container's file could not be read; the message says why."""


class NoFile(ReadError):
    """The container has no metrics file (yet: the doctor's timer has not run)."""


Reader = Callable[[str], str]  # vmid -> the file's text, or ReadError


@dataclass(frozen=True)
class Outcome:
    vmid: str
    ok: bool
    samples: tuple[Sample, ...]  # relabelled with the vmid; empty when not ok
    note: str


def _printable(text: str) -> str:
    """The container's words, safe for a journal line (no escape sequences, one line)."""
    return "".join(c if c.isprintable() else "?" for c in text.strip().replace("\n", " | "))


def _drain(proc: subprocess.Popen[bytes], deadline: float) -> tuple[bytes, bytes]:
    """Stdout (at most MAX_BYTES) and the head of stderr, until both close; TimeoutError at the deadline."""
    assert proc.stdout is not None and proc.stderr is not None
    out, err = bytearray(), bytearray()
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                key.data.extend(chunk)
            if len(out) > MAX_BYTES:
                raise ReadError(f"more than {MAX_BYTES} bytes")
            del err[STDERR_KEEP:]  # keep draining stderr, so the process never blocks on it
    return bytes(out), bytes(err)


def run_bounded(argv: Sequence[str], timeout_s: float) -> tuple[int, bytes, bytes]:
    """Run `argv` with no input; its exit status, stdout and stderr's head. ReadError when it runs past
    `timeout_s` or writes more than MAX_BYTES: it is killed."""
    deadline = time.monotonic() + timeout_s
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
    except OSError as exc:
        raise ReadError(f"cannot run {argv[0]}: {exc}") from None
    try:
        out, err = _drain(proc, deadline)
        rc = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except (TimeoutError, subprocess.TimeoutExpired):
        raise ReadError(f"timed out after {timeout_s:g} s") from None
    finally:
        if proc.poll() is None:
            proc.kill()  # what it started inside the container gets EPIPE once the pipes are closed
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    return rc, out, err


def attach_reader(lxc_attach: str, timeout_s: float) -> Reader:
    """Read CONTAINER_FILE inside the container with lxc-attach (its namespaces resolve the path)."""

    def read(vmid: str) -> str:
        argv = [lxc_attach, "-n", vmid, "--clear-env", "--", "cat", CONTAINER_FILE]
        rc, out, err = run_bounded(argv, timeout_s)
        said = _printable(err.decode("utf-8", "replace"))
        # --clear-env leaves the C locale, so cat's message is English.
        if rc != 0 and CONTAINER_FILE in said and "No such file or directory" in said:
            raise NoFile(said)
        if rc != 0:
            raise ReadError(f"{os.path.basename(lxc_attach)} exit {rc}: {said[-300:] or 'no message'}")
        try:
            return out.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ReadError(f"not UTF-8: {exc}") from None

    return read


def relabel(samples: Iterable[Sample], vmid: str) -> list[Sample]:
    """vmid first (the file then lists each family container by container); the container's own vmid
    label is dropped: it could claim another container's."""
    return [
        Sample(s.name, (("vmid", vmid), *(kv for kv in s.labels if kv[0] != "vmid")), s.value)
        for s in samples
    ]


def container_samples(text: str, vmid: str) -> list[Sample]:
    """The doctor's samples in a container's text, relabelled; ValueError when the text is not a
    well-formed file, or two of its series become one once the vmid is set."""
    samples = relabel(parse(text, strict=True), vmid)
    if len({(s.name, tuple(sorted(s.labels))) for s in samples}) != len(samples):
        raise ValueError("two series are the same once their vmid label is replaced")
    return samples


def _sample_lines(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.strip() and not line.strip().startswith("#"))


def read_container(vmid: str, reader: Reader) -> Outcome:
    try:
        text = reader(vmid)
    except NoFile:
        return Outcome(vmid, False, (), f"no metrics file yet ({CONTAINER_FILE})")
    except ReadError as exc:
        return Outcome(vmid, False, (), f"unreadable: {exc}")
    try:
        samples = container_samples(text, vmid)
    except ValueError as exc:
        return Outcome(vmid, False, (), f"unparsable, nothing kept: {exc}")
    dropped = _sample_lines(text) - len(samples)  # strict parse: every other sample line is another family
    extra = f", {dropped} sample{'s' if dropped > 1 else ''} of other families dropped" if dropped else ""
    return Outcome(vmid, True, tuple(samples), f"ok, {len(samples)} series{extra}")


def collect(vmids: Sequence[str], reader: Reader) -> list[Outcome]:
    """Each container's outcome, in the order given; read a few at once."""
    if not vmids:
        return []
    with ThreadPoolExecutor(max_workers=min(WORKERS, len(vmids))) as pool:
        return list(pool.map(lambda v: read_container(v, reader), vmids))


def node_samples(outcomes: Iterable[Outcome], now: float) -> list[Sample]:
    samples: list[Sample] = [Sample("mlstack_node_metrics_last_run_timestamp_seconds", (), now)]
    for o in outcomes:
        samples.append(Sample("mlstack_node_container_metrics_ok", (("vmid", o.vmid),), 1.0 if o.ok else 0.0))
        samples.extend(o.samples)
    return samples


def blocked_starts(folder: str) -> list[Sample]:
    """mlstack_ct_start_blocked{vmid,reason} for each refusal the hookscript left in `folder`."""
    try:
        names = sorted((n for n in os.listdir(folder) if n.isdigit()), key=int)
    except OSError:
        return []
    samples = []
    for vmid in names:
        try:
            with open(os.path.join(folder, vmid), encoding="utf-8", errors="replace") as f:
                fields = dict(line.rstrip("\n").partition("=")[::2] for line in f.read(4096).splitlines())
        except OSError:
            continue
        reason = fields.get("reason", "")
        samples.append(
            Sample(
                "mlstack_ct_start_blocked",
                (("vmid", vmid), ("reason", reason if REASON.match(reason) else "unknown")),
                1.0,
            )
        )
    return samples


def render_node(outcomes: Iterable[Outcome], now: float, blocked: Iterable[Sample] = ()) -> str:
    return render([*node_samples(outcomes, now), *blocked], {**NODE_FAMILIES, **FAMILIES})


def _vmid_key(vmid: str) -> tuple[int, int, str]:
    return (0, int(vmid), vmid) if vmid.isdigit() else (1, 0, vmid)


def list_running(timeout_s: float = 30.0) -> list[str]:
    """The node's running PVE containers: those `lxc-ls --running -1` lists by a vmid (a container PVE
    does not manage, named otherwise, is not one of its guests). ReadError when lxc-ls fails."""
    rc, out, err = run_bounded(["lxc-ls", "--running", "-1"], timeout_s)
    if rc != 0:
        raise ReadError(f"lxc-ls exit {rc}: {_printable(err.decode('utf-8', 'replace'))[-300:]}")
    return [name for name in out.decode("utf-8", "replace").split() if name.isdigit()]


def _check_names(names: Iterable[str]) -> list[str]:
    bad = [n for n in names if not NAME.match(n)]
    if bad:
        raise ValueError(f"not a container name: {', '.join(map(repr, bad))}")
    return sorted(set(names), key=_vmid_key)


def _containers(arg: str | None, lister: Callable[[], list[str]]) -> list[str]:
    if arg is None:
        return _check_names(lister())
    return _check_names([n.strip() for n in arg.split(",") if n.strip()])


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, not {text}")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m mlstack_doctor.ops.node_metrics",
        description=(
            "On a Proxmox VE node, as root: gather the doctor metrics of the running containers into one "
            "file for the node's node_exporter (textfile collector)."
        ),
    )
    p.add_argument("--out", default=DEFAULT_OUT, help=f"the file to write (default {DEFAULT_OUT})")
    p.add_argument(
        "--lxc-attach", default="lxc-attach", metavar="PATH", help="the lxc-attach to use (default: on PATH)"
    )
    p.add_argument(
        "--containers", metavar="VMID,...", help="read these containers (default: lxc-ls --running -1)"
    )
    p.add_argument(
        "--start-status-dir",
        default=START_STATUS_DIR,
        metavar="DIR",
        help=f"the GPU hookscript's refused starts, one file per vmid (default {START_STATUS_DIR})",
    )
    p.add_argument(
        "--timeout", type=_positive, default=10.0, metavar="S", help="per container, in seconds (default 10)"
    )
    return p


def main(
    argv: list[str] | None = None,
    reader: Reader | None = None,
    lister: Callable[[], list[str]] = list_running,
) -> int:
    args = _parser().parse_args(argv)
    if reader is None and shutil.which(args.lxc_attach) is None:
        sys.stderr.write(f"node_metrics: {args.lxc_attach} not found (is this a Proxmox VE node?)\n")
        return 2
    try:
        vmids = _containers(args.containers, lister)
    except (ReadError, ValueError) as exc:
        sys.stderr.write(f"node_metrics: cannot list the containers: {exc}\n")
        return 2
    outcomes = collect(vmids, reader or attach_reader(args.lxc_attach, args.timeout))
    for o in outcomes:
        print(f"{o.vmid}: {o.note}")
    try:
        write_atomic(args.out, render_node(outcomes, time.time(), blocked_starts(args.start_status_dir)))
    except OSError as exc:
        sys.stderr.write(f"node_metrics: cannot write {args.out}: {exc}\n")
        return 2
    print(f"wrote {args.out}: {sum(o.ok for o in outcomes)} of {len(outcomes)} containers read")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
