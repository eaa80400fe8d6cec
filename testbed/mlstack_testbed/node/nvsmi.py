"""A stand-in `nvidia-smi` for the testbed node: replays a RECORDED answer of a real node.

`testbed up --gpu-model NAME` copies tests/data/nvidia-smi/NAME.csv (one line per GPU, exactly what
`nvidia-smi --query-gpu=index,name,uuid,compute_cap --format=csv,noheader` printed on that machine)
into the testbed's state; `testbed up` without it removes it, and this then answers as a node whose
driver is not loaded does: NVIDIA's message and exit 9. Only the node's SSH namespace sees it (in
/usr/sbin, like pct): containers and the machine itself never do.

`driver_version` answers the kernel module `testbed up --driver-version` loaded (nvdriver.py), the
version /proc/driver/nvidia/version shows on the node; `[N/A]` without one. A driver loaded with no GPU
model recorded answers as a node whose driver finds no GPU: "No devices were found", exit 6.
"""

import shutil
import sys

from .. import paths
from . import nvdriver

# The recorded answers live with the tests that read them too (the stack policy's unit tests).
RECORDED_DIR = paths.REPO_DIR / "tests" / "data" / "nvidia-smi"
FIELDS = ("index", "name", "uuid", "compute_cap")
# Answered from the driver, not from the recorded rows.
DRIVER_FIELD = "driver_version"
NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)
EXIT_NO_DRIVER = 9
NO_DEVICES = "No devices were found\n"
EXIT_NO_DEVICES = 6


def models() -> list[str]:
    return sorted(p.stem for p in RECORDED_DIR.glob("*.csv"))


def current() -> str | None:
    """The GPU model the node reports, or None (no driver)."""
    if not paths.GPU_MODEL_FILE.is_file():
        return None
    return paths.GPU_MODEL_FILE.read_text().strip() or None


def select(model: str | None) -> bool:
    """Make the node report `model` (a recorded answer) or no driver (None); True when it changed."""
    before = (current(), paths.GPU_ANSWER_FILE.read_bytes() if paths.GPU_ANSWER_FILE.is_file() else None)
    if model is None:
        paths.GPU_MODEL_FILE.unlink(missing_ok=True)
        paths.GPU_ANSWER_FILE.unlink(missing_ok=True)
        return before != (None, None)
    src = RECORDED_DIR / f"{model}.csv"
    if not src.is_file():
        raise RuntimeError(
            f"no recorded nvidia-smi answer for GPU model {model!r}; known: {', '.join(models())}"
        )
    tmp = paths.GPU_ANSWER_FILE.with_suffix(".tmp")
    shutil.copyfile(src, tmp)
    tmp.chmod(0o644)
    tmp.replace(paths.GPU_ANSWER_FILE)
    paths.GPU_MODEL_FILE.write_text(model + "\n")
    return before != (model, src.read_bytes())


def _rows() -> list[list[str]]:
    text = paths.GPU_ANSWER_FILE.read_text()
    return [[f.strip() for f in line.split(",")] for line in text.splitlines() if line.strip()]


def answer(argv: list[str]) -> tuple[int, str]:
    """What nvidia-smi prints for argv (exit code, stdout), for the queries this project makes."""
    driver = nvdriver.current()
    if current() is None or not paths.GPU_ANSWER_FILE.is_file():
        return (EXIT_NO_DRIVER, NO_DRIVER) if driver is None else (EXIT_NO_DEVICES, NO_DEVICES)
    rows = _rows()
    known = ("--query-gpu=", "--format=", "-L", "--list-gpus")
    stray = [a for a in argv if not a.startswith(known)]
    if stray:
        # As the real one does: a stray argument is an error, not ignored.
        return (
            2,
            f"Invalid combination of input arguments ({' '.join(stray)}). "
            "Please run 'nvidia-smi -h' for help.\n",
        )
    query = next((a.split("=", 1)[1] for a in argv if a.startswith("--query-gpu=")), None)
    fmt = next((a.split("=", 1)[1] for a in argv if a.startswith("--format=")), "")
    if query is None:
        if "-L" in argv or "--list-gpus" in argv:
            return 0, "".join(f"GPU {r[0]}: {r[1]} (UUID: {r[2]})\n" for r in rows)
        return 2, "The testbed's nvidia-smi answers --query-gpu=... and -L only.\n"
    fields = [f.strip() for f in query.split(",")]
    for f in fields:
        if f not in (*FIELDS, DRIVER_FIELD):
            return 2, f'Field "{f}" is not a valid field to query.\n\n'
    if "csv" not in fmt.split(","):
        return 2, "The testbed's nvidia-smi answers --format=csv[,noheader] only.\n"
    lines = [] if "noheader" in fmt.split(",") else [", ".join(fields)]
    values = [{**dict(zip(FIELDS, r, strict=False)), DRIVER_FIELD: driver or "[N/A]"} for r in rows]
    lines += [", ".join(v[f] for f in fields) for v in values]
    return 0, "".join(line + "\n" for line in lines)


def main() -> int:
    code, out = answer(sys.argv[1:])
    sys.stdout.write(out)
    return code
