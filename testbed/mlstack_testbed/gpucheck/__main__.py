"""`python -m mlstack_testbed.gpucheck`: what testbed/gpu-passthrough-check runs."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
