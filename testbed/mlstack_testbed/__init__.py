"""mlstack testbed: a one-machine stand-in for a Proxmox VE node, made of real parts.

fakepve serves the PVE API, a backend mirrors every container onto a real LXC container, a real sshd
offers `pct`, and optional dummy NVIDIA device nodes make devN passthrough real. See testbed/README.md.
"""

import sys
from pathlib import Path

__version__ = "0.1.0"
# The doctor's facts (mlstack_doctor.facts: the stdlib-only parsers of what a node and a container state)
# are the testbed's too: from this checkout where no doctor is installed (gpu-passthrough-check runs under
# any python3; the second controller's venv, testbed/testbed controller, holds none).
DOCTOR_SRC = Path(__file__).resolve().parents[2] / "verify" / "src"
if (DOCTOR_SRC / "mlstack_doctor").is_dir() and str(DOCTOR_SRC) not in sys.path:
    sys.path.append(str(DOCTOR_SRC))
