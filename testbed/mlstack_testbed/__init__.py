"""mlstack testbed: a one-machine stand-in for a Proxmox VE node, made of real parts.

fakepve serves the PVE API, a backend mirrors every container onto a real LXC container, a real sshd
offers `pct`, and optional dummy NVIDIA device nodes make devN passthrough real. See testbed/README.md.
"""

__version__ = "0.1.0"
