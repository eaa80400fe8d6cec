"""Diagnosis codes, their one-line fixes, and the ONE function that classifies error text.

Codes are stable: the provisioning role fails a host with summary.root_cause.code, and the README
lists each one. A fix is a single line a user can paste; `fix_for` fills in the interpreter version,
the cache dir, etc. from what the probe saw.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass


@dataclass(frozen=True)
class Code:
    """`open`: the code says that a step failed, not why (a probe's default when no rule reads the text, or a
    rule's code that leaves the cause open, as out of memory does): the doctor's experiment decides the
    cause (runtime.wants_experiment); its template fix is only what to read next."""

    meaning: str
    fix: str
    open: bool = False


CODES: dict[str, Code] = {
    # host
    "NVIDIA_NODE_MISSING": Code(
        "no /dev/nvidia* device nodes: no GPU passed through, or the driver never created them",
        "on the host: nvidia-smi && nvidia-modprobe -u -c=0; for an LXC container add devN entries: "
        "pct set <vmid> --dev0 /dev/nvidia0,gid=44,mode=0666 (and nvidiactl, nvidia-uvm)",
    ),
    "NVIDIA_NO_DRIVER": Code(
        "the device nodes exist but no kernel driver answers (open() gives ENXIO/ENODEV)",
        "on the host: modprobe nvidia && nvidia-modprobe -u -c=0 (load the NVIDIA kernel module)",
    ),
    "NVIDIA_NODE_PERMISSION": Code(
        "the device nodes exist but this user cannot open them",
        "chmod 0666 /dev/nvidia* (or pct set <vmid> --devN path=...,mode=0666), "
        "or add the user to the group owning them",
    ),
    "NVIDIA_UVM_MISSING": Code(
        "/dev/nvidia-uvm is missing: CUDA allocations will fail",
        "on the host: nvidia-modprobe -u -c=0, then pass /dev/nvidia-uvm and /dev/nvidia-uvm-tools "
        "to the container",
    ),
    "NVML_UNAVAILABLE": Code(
        "libnvidia-ml.so.1 could not be loaded or initialised: the driver's user-space libraries are missing",
        "install the NVIDIA user-space driver libraries matching the host module {kernel_driver}",
    ),
    "LIBCUDA_NOT_FOUND": Code(
        "libcuda.so.1 is nowhere the loader or Triton looks, nor in the usual driver folders: the driver's "
        "user-space libraries are missing or half-installed (libnvidia-ml without libcuda)",
        "install the NVIDIA user-space driver libraries of version {kernel_driver}, libcuda.so.1 included "
        "(the doctor found it in no folder it searched: evidence.libcuda_search)",
    ),
    "LIBCUDA_NOT_IN_LDCACHE": Code(
        "libcuda.so.1 exists but is not in the linker cache (ldconfig -p): Triton and torch do not find it",
        "echo {dir} > /etc/ld.so.conf.d/nvidia.conf && ldconfig",
    ),
    "LIBCUDA_SHADOWED": Code(
        "LD_LIBRARY_PATH puts a libcuda.so.1 of another driver version ahead of the right one",
        "remove {stale} from LD_LIBRARY_PATH{good}",
    ),
    "TRITON_LIBCUDA_PATH_WRONG": Code(
        "TRITON_LIBCUDA_PATH (one folder to Triton) holds no libcuda.so.1; Triton then never asks ldconfig "
        "and links only if the linker's default folders hold it",
        "unset TRITON_LIBCUDA_PATH, or point it at a folder the doctor found holding libcuda.so.1",
    ),
    "KERNEL_MODULE_VERSION_UNKNOWN": Code(
        "/proc/driver/nvidia/version cannot be read: the user-space driver is not compared with the kernel "
        "module (a mismatch would surface only as CUDA errors)",
        "compare NVML's {nvml_driver} with what cat /proc/driver/nvidia/version prints on the host; "
        "a container must not mask /proc/driver/nvidia",
    ),
    "DRIVER_API_MISMATCH": Code(
        "the user-space driver libraries differ from the kernel module (NVRM: API mismatch)",
        "install user-space driver libraries of exactly version {kernel_driver} (the host module's; "
        "these are {userspace}) in this container",
    ),
    "CUDA_HIDDEN": Code(
        "CUDA_VISIBLE_DEVICES is set but selects no GPU",
        "unset CUDA_VISIBLE_DEVICES (or export CUDA_VISIBLE_DEVICES=0)",
    ),
    "CUDA_VISIBLE_DEVICES_UNMATCHED": Code(
        "a CUDA_VISIBLE_DEVICES entry matches no GPU (index, GPU- or MIG- UUID): CUDA stops there and hides "
        "it and every entry after it",
        "unset CUDA_VISIBLE_DEVICES, or export CUDA_VISIBLE_DEVICES={suggest} (GPUs here: {here})",
    ),
    "DISK_NEARLY_FULL": Code(
        "a disk the stack writes to is nearly full (probes/disks.py's thresholds): apt, uv and Triton stop "
        "mid-write when it fills",
        "free space on the filesystem of {path} (df -h {path}; apt-get clean, old venvs, uv cache prune)",
    ),
    # toolchain
    "NO_C_COMPILER": Code(
        "no C compiler: Triton compiles a C helper on first use and finds neither $CC nor gcc nor clang",
        "apt-get install -y gcc g++",
    ),
    "CC_INVALID": Code(
        "$CC names a compiler that does not exist or cannot run",
        "unset CC (Triton then uses gcc or clang), or export CC=/usr/bin/gcc",
    ),
    "C_COMPILER_BROKEN": Code(
        "the C compiler exists but cannot build a Python extension (the way Triton builds its helper)",
        "apt-get install -y build-essential",
        open=True,
    ),
    "NO_PYTHON_H": Code(
        "Python.h is missing from the include dir of the interpreter Triton compiles against",
        "apt-get install -y python{py_ver}-dev",
    ),
    "TRITON_CACHE_UNWRITABLE": Code(
        "the Triton cache dir cannot be written: every kernel compile will fail",
        "{alternative}make {cache_dir} writable",
    ),
    "TRITON_CACHE_NOEXEC": Code(
        "the Triton cache dir is on a noexec mount: Triton dlopen()s the .so it builds there "
        "('failed to map segment from shared object')",
        "{alternative}remount {mount} without noexec (mount -o remount,exec {mount})",
    ),
    "TRITON_CACHE_FULL": Code(
        "the filesystem of the Triton cache dir is full (ENOSPC): compiled kernels cannot be stored",
        "{alternative}free space on the filesystem of {cache_dir} (df -h {cache_dir})",
    ),
    "TMPDIR_UNUSABLE": Code(
        "$TMPDIR names a directory that is missing or unwritable: gcc and Triton's builds write there",
        "{alternative}mkdir -p {tmpdir} with write permission{proof}",
    ),
    "PACKAGE_UNREADABLE": Code(
        "an installed package's files cannot be read by this user (installed by root with umask 077): "
        "its import fails, and a retried `import torch` then fails with unrelated errors",
        "chmod -R a+rX {path} (as root; or reinstall with umask 022)",
    ),
    "PACKAGE_SHADOWED": Code(
        "a folder or file of the same name (cwd, PYTHONPATH) is imported instead of the installed package",
        "rename or move {path} (or remove its folder from PYTHONPATH / run from another directory)",
    ),
    # packages
    "PACKAGE_MISSING": Code(
        "a package of the stack is not installed in this interpreter",
        "{python} -m pip install '{package}' (or uv sync in the locked profile)",
    ),
    "VERSION_OFF_PROFILE": Code(
        "installed versions differ from the profile",
        "uv pip install --python {python} {pins} (the profile's versions of the packages that differ)",
    ),
    "TRITON_PIN_OVERRIDDEN": Code(
        "the installed triton is not the one torch pins, and the profile does not declare that override",
        "{python} -m pip install '{torch_pin}' (or declare the override in the profile's uv.lock)",
    ),
    "FLA_CORE_UNPAIRED": Code(
        "flash-linear-attention is installed beside a fla-core other than the one it pins: its layers and "
        "its kernels (fla-core) come from different releases",
        "{python} -m pip install {pins} (the fla-core this flash-linear-attention pins)",
    ),
    "STACK_POLICY_RULE": Code(
        "a rule of the stack policy (profiles/policy.yml) says these versions fail or misbehave on this GPU",
        "use a stack the policy allows on this GPU (evidence.policy.rules: each rule, why, and the fix on "
        "record; provision.yml chooses one for the node's GPUs)",
    ),
    "CAUSAL_CONV1D_MISSING": Code(
        "causal-conv1d is missing: transformers falls back to a slower torch convolution (speed only)",
        "{python} -m pip install causal-conv1d --no-build-isolation (optional)",
    ),
    # torch / triton
    "TORCH_NO_CUDA": Code(
        "torch is a CPU-only build",
        "install a CUDA build of torch: uv pip install torch --index-url https://download.pytorch.org/whl/cu130",
    ),
    "CUDA_UNAVAILABLE": Code(
        "torch cannot initialise CUDA (driver, device nodes or container passthrough)",
        "nvidia-smi must work here first; check the device-node and driver probes above",
        open=True,
    ),
    "TRITON_NO_DRIVER": Code(
        "Triton finds no active GPU driver (torch.cuda.is_available() is False in Triton's process)",
        "make torch see the GPU first (nvidia-smi; CUDA_VISIBLE_DEVICES; device nodes)",
    ),
    "TRITON_TARGET_FAILED": Code(
        "Triton could not determine its GPU target (see the exception in evidence)",
        "read evidence.exception; then TRITON_CACHE_DIR=$(mktemp -d) {python} -c "
        "'import triton; print(triton.runtime.driver.active.get_current_target())'",
        open=True,
    ),
    # FLA
    "FLA_ON_CPU": Code(
        "FLA decided its device is 'cpu' (it swallows Triton's real exception)",
        "fix what Triton reports in evidence.triton_exception; FLA then picks the GPU",
        open=True,
    ),
    "FLA_KERNEL_FAILED": Code(
        "an FLA Triton kernel failed to compile or run",
        "read evidence.exception, and evidence.experiment for what the doctor's reruns (a clean baseline, "
        "a fresh private cache among its differences) ruled out",
        open=True,
    ),
    "FLA_KERNEL_MISMATCH": Code(
        "an FLA kernel gives a different answer from the plain torch reference",
        "pin the FLA and Triton versions of the profile (uv sync --frozen); report upstream if it persists",
    ),
    "FLA_BACKWARD_NEEDS_TILELANG": Code(
        "FLA refuses the Gated DeltaNet backward on Hopper with Triton >= 3.4 (FLA #640; FLA >= 0.5.2 only "
        "below Triton 3.7.1, which fixes the bug): inference works, training does not",
        "either triton >= 3.7.1 with FLA >= 0.5.2 (mlstack profile torch211-triton37-fla06: "
        "{python} -m pip install 'triton==3.7.1' 'flash-linear-attention==0.6.0' 'fla-core==0.6.0'), "
        "or tilelang ({python} -m pip install 'flash-linear-attention[tilelang]'; mlstack profiles "
        "torch211-triton36 and torch211-triton37 with extras: [hopper])",
    ),
    "FLA_BACKWARD_MISMATCH": Code(
        "the Gated DeltaNet backward gives gradients different from the torch reference",
        "install tilelang ({python} -m pip install tilelang) or a triton/FLA pair known to be correct",
    ),
    # torch.compile (inductor generates Triton kernels: a Triton other than torch's pin can break it)
    "TORCH_COMPILE_FAILED": Code(
        "torch.compile (inductor) cannot compile or run a small function on the GPU with this torch+triton",
        "install the triton torch pins ({python} -m pip install '{torch_pin}'), or a profile whose "
        "triton override is proven with torch.compile; read evidence.exception",
        open=True,
    ),
    "TORCH_COMPILE_MISMATCH": Code(
        "a torch.compile'd function gives a different answer from eager on the GPU",
        "install the triton torch pins ({python} -m pip install '{torch_pin}') and report the pair "
        "upstream; avoid torch.compile on this stack until then",
    ),
    # model
    "MODEL_PATH_MISSING": Code(
        "the --model path does not exist", "pass an existing directory or config.json, or --model tiny"
    ),
    "MODEL_CONFIG_CORRUPT": Code(
        "config.json cannot be parsed or lacks required fields",
        "re-download config.json of the model "
        "(huggingface-cli download <repo> config.json --local-dir {model_dir})",
    ),
    "MODEL_WEIGHTS_INCOMPLETE": Code(
        "weight shards named by model.safetensors.index.json are missing from the model folder",
        "huggingface-cli download {repo} {files} --local-dir {model_dir}",
    ),
    "MODEL_WEIGHTS_MISMATCH": Code(
        "the checkpoint's tensors do not fit the model config.json builds (a shape differs, a tensor is "
        "missing or extra): a config.json edited or taken from another model, or shards of another one",
        "fetch config.json and the weights again from one source: huggingface-cli download {repo} "
        "--local-dir {model_dir} (evidence.weights_check names each tensor with both shapes)",
    ),
    "MODEL_WEIGHTS_CORRUPT": Code(
        "a safetensors shard is truncated or damaged: its header promises more bytes than the file holds",
        "huggingface-cli download {repo} {files} --local-dir {model_dir} --force-download",
    ),
    "MODEL_TYPE_UNKNOWN": Code(
        "this transformers does not know the model type",
        "{python} -m pip install -U 'transformers>=5.2' (the profile's version)",
    ),
    "MODEL_LOAD_FAILED": Code(
        "the model could not be built or loaded on the GPU",
        "read evidence.exception (weights incomplete? dtype? device_map?)",
        open=True,
    ),
    "GPU_MEMORY_TOO_SMALL": Code(
        "the model does not fit in the GPU's free memory",
        "use a GPU with more memory, free it (nvidia-smi), or run a smaller --model (e.g. tiny)",
    ),
    "GPU_OUT_OF_MEMORY": Code(
        "CUDA ran out of memory",
        "free GPU memory (nvidia-smi) or use a smaller --model / --tokens",
        open=True,
    ),
    "NONFINITE_LOGITS": Code(
        "the forward produced NaN or Inf logits",
        "check the weights (re-download) and the kernels (run the fla_kernel probe alone)",
    ),
    "LOGITS_SHAPE_WRONG": Code(
        "the logits have an unexpected shape", "check config.json (vocab_size) against the weights"
    ),
    # stress
    "AUTOTUNER_RACE": Code(
        "Triton's autotuner raced with several threads on a cold cache (triton-lang/triton#11494)",
        "warm the cache once, in one thread, with the same TRITON_CACHE_DIR: mlstack-doctor --tier warm "
        "--model {model} --seq-len {seq_len} --batch-size {batch} (provisioning: the triton_warm role), "
        "or serialise the first forward of each kernel",
    ),
    "CONCURRENT_INIT_RACE": Code(
        "concurrent first forwards raced in a lazy initialisation "
        "(the same threads pass after one warm-up forward)",
        "run one forward on one thread first (warm-up), then start the other threads",
    ),
    "STRESS_FAILED": Code("a concurrent forward failed", "read evidence.cold.errors", open=True),
    # warm
    "WARM_FAILED": Code(
        "the warm step's single-thread forward/backward failed",
        "read evidence.exception; then mlstack-doctor --tier warm again (what was tuned stays in the cache)",
        open=True,
    ),
    # nccl (multi-GPU): what breaks torch.distributed in containers
    "NCCL_P2P_BLOCKED": Code(
        "NCCL cannot use P2P/CUDA IPC between the GPUs (a P2P/cudaIpc error, or a hang that ends when "
        "NCCL_P2P_DISABLE=1): PCIe ACS or an IOMMU in translation mode blocks peer traffic",
        "workaround: export NCCL_P2P_DISABLE=1 (traffic goes through host memory, slower); real fix on the "
        "host: boot with iommu=pt (intel_iommu=on iommu=pt / amd_iommu=on iommu=pt) and turn off ACS on "
        "the PCIe switches above the GPUs, until nvidia-smi topo -p2p r says OK between them",
    ),
    "NCCL_SHM_TOO_SMALL": Code(
        "/dev/shm has less free space than NCCL maps there for this many local ranks: NCCL fails "
        "('Error while creating shared memory segment') or the ranks die with a bus error",
        "on the PVE host: add 'lxc.mount.entry: tmpfs dev/shm tmpfs rw,nosuid,nodev,size={size},create=dir "
        "0 0' to /etc/pve/lxc/<vmid>.conf and pct reboot <vmid> (Docker: --shm-size={size} or --ipc=host)",
    ),
    "NCCL_GPUS_HIDDEN": Code(
        "fewer GPUs are usable by CUDA than are passed through (device nodes) or than NVML/nvidia-smi "
        "lists: NCCL runs fewer ranks than the machine has GPUs",
        "pass every GPU and allow it: pct set <vmid> --devN /dev/nvidiaK for each GPU (nodes here: "
        "{nodes}), and 'lxc.cgroup2.devices.allow: c 195:* rwm' in /etc/pve/lxc/<vmid>.conf; then "
        "nvidia-smi -L and torch.cuda.device_count() must agree",
    ),
    "NCCL_SOCKET_IFNAME_WRONG": Code(
        "NCCL_SOCKET_IFNAME or GLOO_SOCKET_IFNAME names a network interface this container does not have "
        "(often copied from the host): the ranks cannot bootstrap",
        "unset NCCL_SOCKET_IFNAME GLOO_SOCKET_IFNAME, or set them to an interface of ip -br link here",
    ),
    "NCCL_LOOPBACK_DOWN": Code(
        "127.0.0.1 is unreachable in this container (its loopback interface is down): the ranks cannot "
        "meet at torch.distributed's TCP store, and a job would hang at init_process_group",
        "ip link set lo up inside; for good: 'auto lo' / 'iface lo inet loopback' in the container's "
        "/etc/network/interfaces (PVE's templates have it), or let its init (systemd-networkd) bring lo up",
    ),
    "NCCL_WRONG_RESULT": Code(
        "an all-reduce or all-gather over known inputs returned wrong values: a corrupting link, driver "
        "or NCCL build",
        "rerun with NCCL_P2P_DISABLE=1 and with NCCL_ALGO=Ring to isolate the path; check nvidia-smi -q "
        "for XID/ECC errors; reinstall the torch build whose NCCL passed",
    ),
    "NCCL_BUSBW_BELOW_FLOOR": Code(
        "the bus bandwidth at the largest size is below the conservative floor of the GPUs' link type",
        "NCCL_DEBUG=INFO shows the transport per peer (P2P/IPC, SHM, NET): SHM or NET where {link} "
        "should carry it means P2P is off (nvidia-smi topo -p2p r); also check that no other job shares "
        "the GPUs (nvidia-smi)",
    ),
    "NCCL_TIMEOUT": Code(
        "a collective (or joining the process group) did not finish within --nccl-timeout: a rank hung",
        "NCCL_DEBUG=INFO mlstack-doctor --tier nccl names the last step of each rank; try "
        "NCCL_P2P_DISABLE=1 and NCCL_SHM_DISABLE=1 one at a time to find the blocked transport",
    ),
    "NCCL_FAILED": Code(
        "torch.distributed failed in a rank (see evidence.errors, per rank)",
        "read evidence.errors; rerun with NCCL_DEBUG=INFO for NCCL's own account",
    ),
    # the process environment (process_env; the classifier names the same codes from runtime errors)
    "ADDRESS_SPACE_LIMIT": Code(
        "the address-space limit (RLIMIT_AS, ulimit -v) is below what CUDA or torch reserve at start: "
        "cudaGetDeviceCount fails with 'Error 2: out of memory' on an idle GPU",
        "raise the limit where the job starts (ulimit -v unlimited; systemd LimitAS=infinity; "
        "limits.conf 'as'): it is {limit} here, more than {need} is needed",
    ),
    "THREAD_LIMIT": Code(
        "the process/thread limit (RLIMIT_NPROC, ulimit -u) leaves too few threads for this user: "
        "'libgomp: Thread creation failed', OpenBLAS pthread_create, 'can't start new thread'",
        "raise ulimit -u (systemd TasksMax/LimitNPROC, limits.conf 'nproc') above {need} (it is {limit}), "
        "or export OMP_NUM_THREADS=4 OPENBLAS_NUM_THREADS=4 to start fewer",
    ),
    "OPEN_FILES_LIMIT": Code(
        "the open-files limit (RLIMIT_NOFILE, ulimit -n) is too low for CUDA, NCCL and inductor (EMFILE)",
        "ulimit -n 65536 where the job starts (systemd LimitNOFILE=65536; limits.conf 'nofile'); "
        "it is {limit}",
    ),
    "RESOURCE_LIMIT_LOW": Code(
        "a resource limit is lower than the stack uses (locked memory for NCCL over InfiniBand, stack size)",
        "raise it where the job starts: ulimit {flag} unlimited (or the systemd/limits.conf equivalent)",
    ),
    "USER_UNKNOWN": Code(
        "this uid (or gid) has no passwd (group) entry: getpass.getuser() and pwd look-ups raise "
        "KeyError 'getpwuid(): uid not found', inside torch.compile, Triton and hub downloads",
        "give uid {uid} a passwd entry (useradd -u {uid} ..., or an /etc/passwd line in the image; "
        "in Kubernetes: runAsUser with a matching user), or at least export USER and HOME (a writable "
        "folder) for getpass and ~",
    ),
    "HOME_UNUSABLE": Code(
        "HOME is unset, missing or unwritable: caches that default under ~ cannot be written",
        "{alternative}export HOME to a writable folder (or set TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR, "
        "HF_HOME to one){proof}",
    ),
    "CUDA_DRIVER_STUB": Code(
        "the CUDA toolkit's link-time stub libcuda is loaded instead of the driver's "
        "('Error 34: CUDA driver is a stub library')",
        "remove {dir} from LD_LIBRARY_PATH (stubs are for linking only; the driver's libcuda.so.1 must win)",
    ),
    "ALLOC_CONF_INVALID": Code(
        "PYTORCH_CUDA_ALLOC_CONF (or PYTORCH_ALLOC_CONF) is not what torch's allocator parses: CUDA init "
        "raises, or the process aborts",
        "fix {var} in {where} ({why}); the grammar is key:value[,key:value], e.g. expandable_segments:True",
    ),
    "ENV_SETTING_INVALID": Code(
        "a variable the stack reads at start-up has a value that cannot work (a missing path, not a number)",
        "correct or unset {var} in {where} ({why})",
    ),
    "STARTUP_HOOK_CHANGES_ENV": Code(
        "a Python start-up hook (sitecustomize, usercustomize, a .pth line) changes a variable the stack "
        "reads, in every interpreter and worker, behind what the job's environment says",
        "remove or correct the line setting {var} in {where} (python -S shows the interpreter without it)",
    ),
    "ENV_SETTING_FAULT": Code(
        "the probe fails (its worker dies) with a setting of this environment and passes without it",
        "unset or correct {var} (the probe passed when the doctor reran it without {var})",
    ),
    # causes found by experiment (experiment.py): the probe passes in a clean baseline, fails again with
    # only this difference put back, and passes again without it; {action} names the culprit(s)
    "ENV_SETTING_BREAKS": Code(
        "a variable of this environment makes the probe fail: it passes without it and fails again with "
        "it alone put back (found by rerunning the probe, no rule knew its text)",
        "{action}{proof}",
    ),
    "RESOURCE_LIMIT_BREAKS": Code(
        "a resource limit of this process (soft below hard) makes the probe fail: a write fails with EFBIG "
        "(the file-size limit), or the probe passes with the limit raised and fails again with it alone "
        "put back",
        "{action}{proof}",
    ),
    "CACHE_BREAKS": Code(
        "a kernel cache in use makes the probe fail: it passes with a fresh private cache and fails again "
        "with the cache alone put back",
        "{action}{proof}",
    ),
    "STARTUP_HOOK_BREAKS": Code(
        "a Python start-up hook (sitecustomize, usercustomize, PYTHONSTARTUP) makes the probe fail: it "
        "passes without the hook and fails again with it alone put back",
        "{action}{proof}",
    ),
    # runtime errors the classifier names from a probe's exception and stderr
    "CUDA_INIT_OUT_OF_MEMORY": Code(
        "CUDA could not initialise: 'Error 2: out of memory' from cudaGetDeviceCount (an address-space "
        "limit, or a GPU whose memory other processes hold)",
        "{cause}",
    ),
    "DISK_FULL": Code(
        "a write failed with ENOSPC (No space left on device)",
        "free space on the filesystem of {path} (df -h {mount}), or point the setting that writes there "
        "at a larger one",
    ),
    "READ_ONLY_FS": Code(
        "a write failed with EROFS (Read-only file system)",
        "{path} is on a read-only mount ({mount}): point the setting that writes there at a writable folder",
    ),
    "PATH_PERMISSION_DENIED": Code(
        "a file or device the stack opens is not accessible to this user (EACCES)",
        "give uid {uid} access to {path} (ls -l {path}), or run as its owner",
    ),
    "KERNEL_CACHE_CORRUPT": Code(
        "kernel cache entries cannot be loaded (empty or truncated binaries, metadata without its binary, "
        "metadata that does not parse): Triton takes them as compiled and fails at launch",
        "rm -rf {folders} (the kernels compile again on first use), or mlstack-doctor --repair to move "
        "them aside inside the cache",
    ),
    "KERNEL_IMAGE_INVALID": Code(
        "the CUDA driver refuses a kernel image ('device kernel image is invalid'): a cached kernel is "
        "damaged on disk",
        "rm -rf {folders} (the kernels compile again on first use), or mlstack-doctor --repair to move "
        "them aside inside the cache",
    ),
    # generic
    "PROBE_TIMEOUT": Code(
        "the probe did not finish in time", "rerun with --timeout-scale 3; a hung GPU needs nvidia-smi"
    ),
    "PROBE_CRASHED": Code(
        "the probe's worker process died without an answer (segfault, killed)",
        "read evidence.stderr_tail; dmesg may name the cause",
        open=True,
    ),
}

# Ordered most specific first: the first match wins. Patterns match the original text, which the
# probe keeps as evidence next to the code.
_RULES: list[tuple[str, re.Pattern[str]]] = [
    # NCCL and gloo: what their own messages say, before the generic CUDA rules below
    (
        "NCCL_SHM_TOO_SMALL",
        re.compile(
            r"Error while creating shared memory segment|unable to allocate shared memory|"
            r"No space left on device.*(/dev/shm|shm)|/dev/shm.*No space left|Bus error|SIGBUS",
            re.I,
        ),
    ),
    (
        "NCCL_P2P_BLOCKED",
        re.compile(
            r"cudaIpc\w*|peer access is not supported|peer mapping resources exhausted|P2P/IPC.*fail", re.I
        ),
    ),
    (
        "NCCL_SOCKET_IFNAME_WRONG",
        re.compile(r"no socket interface found|Unable to find address for|Bootstrap : no socket interface"),
    ),
    (
        "NCCL_LOOPBACK_DOWN",
        re.compile(
            r"failed to connect to (any network address of \(127\.0\.0\.1|localhost:\d+)"
            r".*Network is unreachable"
        ),
    ),
    (
        "NCCL_TIMEOUT",
        re.compile(r"Watchdog caught collective operation timeout|rank\(s\) \[[\d, ]+\] hung in"),
    ),
    # The process environment, as the runtime reports it: before the CUDA and package rules below,
    # whose texts these errors also carry (a stub's Error 34 comes wrapped in cudaGetDeviceCount).
    ("CUDA_DRIVER_STUB", re.compile(r"CUDA driver is a stub library|Error 34\b")),
    (
        "CUDA_INIT_OUT_OF_MEMORY",
        re.compile(r"cudaGetDeviceCount\(\)[^\n]*Error 2: out of memory|cuInit[^\n]*OUT_OF_MEMORY"),
    ),
    # torch's OutOfMemoryError advises "setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True": an
    # out-of-memory text is that, before the allocator setting's own rule reads the variable's name
    ("GPU_OUT_OF_MEMORY", re.compile(r"CUDA out of memory|OutOfMemoryError")),
    (
        "ALLOC_CONF_INVALID",
        re.compile(
            r"ConfigTokenizer|CUDA ?[Aa]llocator ?[Cc]onfig|Unknown allocator backend|"
            r"garbage_collect\w*_threshold is invalid|PYTORCH_(CUDA_)?ALLOC_CONF|"
            r"_cuda_init\(\)[\s\S]{0,400}\b(stoull|stoi|stod|stoul)\b"
        ),
    ),
    ("USER_UNKNOWN", re.compile(r"getpwuid\(\): uid not found|getgrgid\(\): gid not found|getpwnam\(\)")),
    (
        "THREAD_LIMIT",
        re.compile(
            r"Thread creation failed|pthread_create[^\n]*(failed|Resource temporarily)|RLIMIT_NPROC|"
            r"can't start new thread|fork: retry: Resource temporarily unavailable|"
            r"\[Errno 11\] Resource temporarily unavailable"
        ),
    ),
    ("OPEN_FILES_LIMIT", re.compile(r"Too many open files|\[Errno 24\]|EMFILE")),
    (
        "KERNEL_IMAGE_INVALID",
        re.compile(
            r"device kernel image is invalid|CUDA_ERROR_INVALID_IMAGE|Unknown key: 'cubin'|"
            r"Triton cache error: compiled module"
        ),
    ),
    ("FLA_BACKWARD_NEEDS_TILELANG", re.compile(r"install tilelang|chunk_bwd_dqkwg \(see #640\)", re.I)),
    ("NO_PYTHON_H", re.compile(r"Python\.h: No such file")),
    ("NO_C_COMPILER", re.compile(r"Failed to find C compiler")),
    ("TMPDIR_UNUSABLE", re.compile(r"[Cc]annot create temporary file")),
    ("DRIVER_API_MISMATCH", re.compile(r"API mismatch|driver/library version mismatch", re.I)),
    (
        "LIBCUDA_NOT_FOUND",
        re.compile(r"libcuda\.so cannot found|cannot find -lcuda|libcuda\.so\.1: cannot open", re.I),
    ),
    ("AUTOTUNER_RACE", re.compile(r"'NoneType' object is not a mapping")),
    (
        "DISK_FULL",
        re.compile(
            r"No space left on device(?:: '(?P<path>[^']+)')?|\[Errno 28\][^']*(?:'(?P<path2>[^']+)')?"
        ),
    ),
    (
        "TRITON_CACHE_UNWRITABLE",
        re.compile(r"(Read-only file system|Permission denied|Not a directory).*(triton|cache)", re.I),
    ),
    ("READ_ONLY_FS", re.compile(r"Read-only file system(?:: '(?P<path>[^']+)')?|\[Errno 30\]")),
    (
        "PATH_PERMISSION_DENIED",
        re.compile(r"Permission denied: '(?P<path>[^']+)'|Unable to open (?P<path2>/dev/\S+)"),
    ),
    ("TRITON_NO_DRIVER", re.compile(r"0 active drivers")),
    (
        "CUDA_UNAVAILABLE",
        re.compile(
            r"no CUDA-capable device|CUDA driver initialization failed|Found no NVIDIA driver|"
            r"cudaErrorNoDevice|"
            r"CUDA_ERROR_NO_DEVICE|Torch not compiled with CUDA",
            re.I,
        ),
    ),
    (
        "MODEL_TYPE_UNKNOWN",
        re.compile(r"Unrecognized model|does not recognize this architecture|model_type", re.I),
    ),
    ("PACKAGE_MISSING", re.compile(r"No module named '([\w.]+)'")),
]


def classify(text: str, default: str, *, compiler_env: bool = False) -> str:
    """Name the root cause in `text` (an exception, a compiler's stderr), else `default`.

    `compiler_env` says the text comes from running $CC: then a missing binary means CC_INVALID.
    """
    return match(text, default, compiler_env=compiler_env)[0]


def match(text: str, default: str, *, compiler_env: bool = False) -> tuple[str, dict[str, str]]:
    """(code, what the matching text names: `path`, `match`) for `text`, else (default, {}).

    The table's order is the order of specificity; the first rule that matches wins."""
    if compiler_env and classify_compiler(text):
        return "CC_INVALID", {}
    for code, pattern in _RULES:
        m = pattern.search(text)
        if m:
            groups = {k: v for k, v in m.groupdict().items() if v}
            path = groups.get("path") or groups.get("path2")
            return code, ({"path": path} if path else {}) | {"match": m.group(0)[:300]}
    return default, {}


def classify_compiler(text: str) -> bool:
    """Text from running $CC in which the compiler binary itself is missing."""
    return bool(re.search(r"No such file or directory: '[^']*'|\[Errno 2\]", text)) and "Python.h" not in text


def missing_module(text: str) -> str | None:
    m = re.search(r"No module named '([\w.]+)'", text)
    return m.group(1).split(".")[0] if m else None


class _Defaults(dict):
    def __missing__(self, key: str) -> str:
        return "<" + key + ">"


def fix_for(code: str, **ctx: object) -> str:
    """The one-line fix for `code`, with what the probe knows filled in."""
    template = CODES[code].fix
    return string.Formatter().vformat(template, (), _Defaults({k: str(v) for k, v in ctx.items()}))
