"""The stand-in PVE node: what answers where a Proxmox VE node would.

    api, backend    the API server (fakepve with every container mirrored onto a real one)
    access          its access control: tokens, roles, ACL, PVE's permission checks and 401s
    access_api      its /access endpoints (tokens, roles, ACL, permissions), as pveum uses them
    nodes, sshd     the cluster's nodes, each a real sshd whose /usr/sbin shows the commands below
    pct, direct     `pct` (and `pveversion`): through the API, or the direct backend where none runs
    pveam           the appliance manager and its template catalogue
    nvsmi, nvdriver the node's `nvidia-smi` and NVIDIA kernel module, and a stand-in runfile
    gpu             dummy NVIDIA device nodes on the machine
    host_setup      what the machine needs: packages, subuids, the bridge, pinned host keys
    daemons         the node's own processes, tracked by pidfile

It uses the LXC translation (mlstack_testbed.lxc) and the shared modules, never gpucheck. Entry points
are modules run with `python -m` or called by the sshd stand-in scripts; this file imports nothing, so
`pct`'s direct backend loads no more than the standard library.
"""
