"""The LXC translation: a PVE container config made a real LXC container.

    lxcconf    PVE config -> LXC config: devN and mpN as lxc.* keys, PVE's checks and wording
    ctlayout   where a container's files are (/var/lib/lxc/<vmid>)
    realct     the lxc-* lifecycle: create, start (cgroup allows, passthrough nodes), stop, destroy
    rootfs     the Debian template built with debootstrap, and the pluggable rootfs provider
    hostroot   the machine's own root as a container's rootfs (overlay or bind), for a GPU machine

It knows nothing of the node that serves PVE's API or commands (mlstack_testbed.node) nor of the GPU
passthrough proof (mlstack_testbed.gpucheck): both use it, and it imports only the shared modules.
"""
