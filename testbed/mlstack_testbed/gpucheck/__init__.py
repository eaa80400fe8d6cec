"""gpu-passthrough-check: GPU passthrough proven on a real machine, with the doctor inside the container.

Run as `python -m mlstack_testbed.gpucheck` (testbed/gpu-passthrough-check); `cli.py` holds the full
description, which is also the --help text. The parts, each depending only on those above it:

    host     the machine: LXC (system or carried .debs), NVIDIA nodes, driver, libraries, interpreter
    cases    what is checked: the four containers and what each gets
    report   judging the doctor's reports, printing, the exit code
    run      running the cases: containers through pct's direct backend, the doctor inside
    cli      arguments and the order of it all
"""

from .cli import main, parse_args
from .report import EXIT_CANNOT_RUN, EXIT_NO_GPU, EXIT_OK, EXIT_WRONG

__all__ = ["EXIT_CANNOT_RUN", "EXIT_NO_GPU", "EXIT_OK", "EXIT_WRONG", "main", "parse_args"]
