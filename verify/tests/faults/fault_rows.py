"""The fault matrix's rows: a fault real users hit, how it is injected, the doctor's expected verdict.

`setup` is shell run as root inside the row's own mount namespace (`unshare -m`), before the doctor
starts there; it sees $W (the row's folder), $PY (the interpreter under test), $SRC (the doctor's
source) and the helpers of PRELUDE. `env`/`unset` change the doctor's environment, `user` runs it as
another uid (setpriv --clear-groups, HOME=$W/home). `expect` is "pass" (no probe fails), or a list of
"probe:CODE" (every independent root cause, order free; probe "*" matches any probe); `json` rows check
report values instead ({"host.in_container": False}). `gpu` rows need a real NVIDIA GPU; `needs`
names distributions the interpreter must have for the row to say anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Shell helpers for `setup` (sh, set -eu).
PRELUDE = r"""
ro_tmpfs() { mkdir -p "$1"; mount -t tmpfs -o ro,size=1m tmpfs "$1"; }
dev_without() {  # a private /dev: a tmpfs copy of it without the named nodes
  mkdir -p "$W/dev"; mount -t tmpfs -o mode=0755 tmpfs "$W/dev"
  cp -a /dev/. "$W/dev/" 2>/dev/null || true
  for n in "$@"; do rm -rf "$W/dev/$n"; done
  mount --bind "$W/dev" /dev
}
open_dir() {  # DIR traversable by other uids, in this namespace only: a 0755 tmpfs, its entries bound back
  o="$W/opened$1"; mkdir -p "$o"; mount --bind "$1" "$o"; mount -t tmpfs -o mode=0755 tmpfs "$1"
  for e in "$o"/* "$o"/.[!.]*; do
    [ -e "$e" ] || continue
    if [ -d "$e" ]; then mkdir "$1/${e##*/}"; else : > "$1/${e##*/}"; fi
    mount --bind "$e" "$1/${e##*/}"
  done
}
driver_dirs() {  # the folders holding libcuda.so.1 / libnvidia-ml.so.1: the linker cache's, LD_LIBRARY_PATH's
  # and CUDA's forward-compatibility folders (a libcuda.so.1 there is a real driver library too)
  { (ldconfig -p 2>/dev/null || /sbin/ldconfig -p) | awk '/lib(cuda|nvidia-ml)\.so\.1 /{print $NF}'
    echo "${LD_LIBRARY_PATH:-}" | tr ':' '\n' | while read -r d; do
      [ -n "$d" ] && ls "$d"/libcuda.so.1 "$d"/libnvidia-ml.so.1 2>/dev/null; done
    ls /usr/local/cuda*/compat/libcuda.so.1 2>/dev/null; } \
    | while read -r f; do dirname "$(readlink -f "$f")"; done | sort -u \
    | awk '{print length, $0}' | sort -n | cut -d' ' -f2-
}
farm_without() {  # DIR PATTERN...: DIR seen without its entries matching a PATTERN (an overlay of whiteouts:
  # no link back to the real folder, which a search through a library's real path would find)
  d=$1; shift; n=$(echo "$d" | tr / _); mkdir -p "$W/up$n" "$W/wk$n"
  for f in "$d"/* "$d"/.[!.]*; do
    [ -e "$f" ] || [ -L "$f" ] || continue; hit=
    for p in "$@"; do case "${f##*/}" in $p) hit=1;; esac; done
    [ -z "$hit" ] || mknod "$W/up$n/${f##*/}" c 0 0
  done
  mount -t overlay overlay -o "lowerdir=$d,upperdir=$W/up$n,workdir=$W/wk$n" "$d"
}
hide_driver_libs() {  # PATTERN...: hide those files in every driver library folder the linker cache names
  dirs=$(driver_dirs)
  [ -n "$dirs" ] || { echo "no libcuda.so.1 in ldconfig -p: nothing to hide" >&2; return 3; }
  for d in $dirs; do farm_without "$d" "$@"; done
}
include_dir() { PYTHONPATH=$SRC "$PY" -c \
  'from mlstack_doctor.probes.toolchain import python_include_dir; print(python_include_dir())'; }
libcuda_dir() {  # the folder of libcuda.so.1 in the linker cache; none: the row cannot be injected
  lib=$( (ldconfig -p 2>/dev/null || /sbin/ldconfig -p) | awk '/libcuda\.so\.1 /{print $NF; exit}')
  [ -n "$lib" ] || { echo "no libcuda.so.1 in ldconfig -p: nothing to hide" >&2; return 3; }
  dirname "$lib"
}
tiny_model() {  # $1: a model folder holding the shipped tiny Qwen3.5 config
  mkdir -p "$1"; cp "$SRC/mlstack_doctor/configs/qwen3_5_tiny.json" "$1/config.json"; chmod -R a+rX "$1"; }
sharded_model() {  # $1: a model folder whose index names two shards; only the first is there
  tiny_model "$1"
  s1=model-00001-of-00002.safetensors; s2=model-00002-of-00002.safetensors
  printf '{"metadata":{},"weight_map":{"a":"%s","b":"%s"}}' $s1 $s2 > "$1/model.safetensors.index.json"
  printf '\x0e\x00\x00\x00\x00\x00\x00\x00{"__metadata__":{}}' > "$1/model-00001-of-00002.safetensors"
  chmod -R a+rX "$1"
}
fake_entry() {  # DIR NAME [ARCH]: a Triton 3.x cache entry (group file, metadata, binary)
  e="$1/MLSTACKFAKE$(echo "$2" | tr a-z A-Z)ENTRY"; mkdir -p "$e"
  cp /bin/true "$e/$2.cubin"  # a complete ELF file; arch 0 in the metadata: the driver check skips it
  printf '{"name": "%s", "target": {"backend": "cuda", "arch": %s, "warp_size": 32}}' "$2" "${3:-0}" \
    > "$e/$2.json"
  printf '{"child_paths": {"%s.cubin": "%s", "%s.json": "%s"}}' "$2" "$e/$2.cubin" "$2" "$e/$2.json" \
    > "$e/__grp__$2.json"
  echo "$e"
}
real_kernel() {  # DIR: compile one small Triton kernel into the cache DIR with the interpreter under test
  cat > "$W/kern.py" <<'PY'
import torch, triton, triton.language as tl
@triton.jit
def add(x, y, o, n, B: tl.constexpr):
    i = tl.program_id(0) * B + tl.arange(0, B); m = i < n
    tl.store(o + i, tl.load(x + i, mask=m) + tl.load(y + i, mask=m), mask=m)
x = torch.ones(1000, device="cuda"); o = torch.empty_like(x); add[(4,)](x, x, o, 1000, B=256)
torch.cuda.synchronize()
PY
  TRITON_CACHE_DIR="$1" "$PY" "$W/kern.py"
}
stub_dir() {  # $W/stub holding libcuda.so.1 -> the CUDA toolkit's link-time stub; none: not injectable
  s=$(ls /usr/local/cuda*/targets/*/lib/stubs/libcuda.so /usr/local/cuda*/lib64/stubs/libcuda.so 2>/dev/null \
    | head -1)
  [ -n "$s" ] || { echo "no CUDA toolkit stub libcuda.so here" >&2; return 3; }
  mkdir -p "$W/stub"; ln -s "$s" "$W/stub/libcuda.so.1"
}
site_overlay() {  # the interpreter's site-packages, writable in this namespace only (an overlay)
  sp=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  mkdir -p "$W/up" "$W/wk"; mount -t overlay overlay -o "lowerdir=$sp,upperdir=$W/up,workdir=$W/wk" "$sp"
  echo "$sp"
}
hook() {  # DIR LINE: a sitecustomize.py in DIR (put on PYTHONPATH by the row) running LINE
  mkdir -p "$1"; printf 'import os\n%s\n' "$2" > "$1/sitecustomize.py"; chmod -R a+rX "$1"
}
"""

HOST = "nvidia_device_nodes,nvidia_driver,cuda_visible_devices"
TOOLCHAIN = "c_compiler,python_headers,tmpdir,c_extension_build"


@dataclass(frozen=True)
class Row:
    name: str
    users: str  # what real users hit
    injection: str
    expect: str | list[str] = "pass"
    setup: str = ""
    env: dict[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()
    user: int | None = None
    args: tuple[str, ...] = ()  # doctor arguments beyond --tier/--json/--output
    json: dict[str, object] = field(default_factory=dict)
    fix_has: tuple[str, ...] = ()  # each matched cause's fix contains these ({W}: the row's folder)
    fix_lacks: tuple[str, ...] = ()
    gpu: bool = False
    needs: tuple[str, ...] = ()
    cwd: str | None = None  # relative to $W; default $W
    timeout: float = 300.0


ROWS: list[Row] = [
    Row(
        "baseline_quick",
        "a healthy GPU machine: the quick tier must not cry wolf",
        "none",
        "pass",
        args=("--purpose", "inference"),
        gpu=True,
        timeout=450.0,  # a cold Triton cache: the FLA and inductor kernels compile
        needs=("torch", "triton", "fla-core", "transformers"),
    ),
    Row(
        "baseline_fast",
        "monitoring's fast tier on a healthy machine",
        "none",
        "pass",
        args=("--tier", "fast"),
        gpu=True,
    ),
    Row(
        "cvd_uuid_unmatched",
        "a scheduler's GPU UUID from another machine left in CUDA_VISIBLE_DEVICES",
        "CUDA_VISIBLE_DEVICES=GPU-<uuid matching no GPU>",
        ["cuda_visible_devices:CUDA_VISIBLE_DEVICES_UNMATCHED"],
        env={"CUDA_VISIBLE_DEVICES": "GPU-00000000-1111-2222-3333-444444444444"},
        args=("--only", HOST),
        gpu=True,
    ),
    Row(
        "cvd_empty",
        "CUDA_VISIBLE_DEVICES= exported empty by a job script",
        "CUDA_VISIBLE_DEVICES=''",
        ["cuda_visible_devices:CUDA_HIDDEN"],
        env={"CUDA_VISIBLE_DEVICES": ""},
        args=("--only", HOST),
        gpu=True,
    ),
    Row(
        "cvd_index_out_of_range",
        "CUDA_VISIBLE_DEVICES=7 copied from an 8-GPU node onto a 1-GPU one",
        "CUDA_VISIBLE_DEVICES=7",
        ["cuda_visible_devices:CUDA_VISIBLE_DEVICES_UNMATCHED"],
        env={"CUDA_VISIBLE_DEVICES": "7"},
        args=("--only", HOST),
        gpu=True,
    ),
    Row(
        "triton_libcuda_path_wrong",
        "TRITON_LIBCUDA_PATH pointing at a folder without libcuda (an old image's setting)",
        "TRITON_LIBCUDA_PATH=<empty dir>",
        # a warn where the linker still finds libcuda in a default folder (the H200's /lib), else a fail
        json={"probes.nvidia_driver.code": "TRITON_LIBCUDA_PATH_WRONG"},
        setup='mkdir -p "$W/nolibcuda"',
        env={"TRITON_LIBCUDA_PATH": "{W}/nolibcuda"},
        args=("--only", HOST),
        gpu=True,
    ),
    Row(
        "nonroot_caps_nodes",
        "a non-root user on a standard host: nvidia-caps nodes are root 0400/0444 (needed only for MIG)",
        "setpriv uid 1000",
        "pass",
        user=1000,
        args=("--only", HOST),
        gpu=True,
    ),
    Row(
        "nonroot_no_uvm",
        "/dev/nvidia-uvm absent after a reboot; an unprivileged user cannot have CUDA create it",
        "uid 1000 + a tmpfs /dev copy without nvidia-uvm*",
        ["torch_cuda:NVIDIA_UVM_MISSING"],
        setup="dev_without nvidia-uvm nvidia-uvm-tools",
        user=1000,
        args=("--only", HOST + ",torch_cuda"),
        gpu=True,
        needs=("torch",),
    ),
    Row(
        "nvidia0_missing",
        "a container config that passes nvidiactl but not the GPU node",
        "tmpfs /dev copy without nvidia0",
        ["nvidia_device_nodes:NVIDIA_NODE_MISSING"],
        setup="dev_without nvidia0",
        args=("--only", HOST),
        gpu=True,
    ),
    Row(
        "node_permission",
        "a GPU node left 0600 root by a udev rule, job run as a user",
        "uid 1000 + /dev copy with nvidia0 mode 0600",
        ["nvidia_device_nodes:NVIDIA_NODE_PERMISSION"],
        setup="dev_without; chmod 0600 /dev/nvidia0",
        user=1000,
        args=("--only", HOST),
        gpu=True,
    ),
    Row(
        "driver_libs_hidden",
        "a container without the driver's user-space libraries (bind mount forgotten)",
        "every driver library folder of ldconfig -p replaced by links to all but libcuda*/libnvidia-ml*",
        ["nvidia_driver:NVML_UNAVAILABLE"],
        setup="hide_driver_libs 'libcuda.so*' 'libnvidia-ml.so*'",
        args=("--only", HOST),
        gpu=True,
    ),
    Row(
        "driver_version_mismatch",
        "user-space libraries of another driver than the kernel module (NVRM: API mismatch)",
        "/proc/driver/nvidia/version replaced (bind) by one naming 999.99.99",
        ["nvidia_driver:DRIVER_API_MISMATCH"],
        setup="printf 'NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  999.99.99  Release Build\\n'"
        ' > "$W/version"; mount --bind "$W/version" /proc/driver/nvidia/version',
        args=("--only", HOST),
        gpu=True,
    ),
    Row(
        "libcuda_missing",
        "user-space driver half-installed: libnvidia-ml there, libcuda.so.1 gone (the cache still names it)",
        "every driver library folder of ldconfig -p replaced by links to all but libcuda*",
        ["nvidia_driver:LIBCUDA_NOT_FOUND"],
        setup="hide_driver_libs 'libcuda.so*'",
        args=("--only", HOST),
        gpu=True,
    ),
    Row(
        "libcuda_shadowed",
        "LD_LIBRARY_PATH left pointing at an old driver's libcuda.so.1 (a copied CUDA image)",
        "LD_LIBRARY_PATH=<dir with libcuda.so.1 -> libcuda.so.535.54.03>",
        ["nvidia_driver:LIBCUDA_SHADOWED"],
        setup='mkdir -p "$W/stale"; : > "$W/stale/libcuda.so.535.54.03"; '
        'ln -s libcuda.so.535.54.03 "$W/stale/libcuda.so.1"',
        env={"LD_LIBRARY_PATH": "{W}/stale"},
        args=("--only", HOST),
        gpu=True,
    ),
    Row(
        "proc_version_hidden",
        "a container without /proc/driver/nvidia (some runtimes mask it): versions cannot be compared",
        "/dev/null bound over /proc/driver/nvidia/version",
        json={
            "probes.nvidia_driver.status": "warn",
            "probes.nvidia_driver.code": "KERNEL_MODULE_VERSION_UNKNOWN",
        },
        setup="mount --bind /dev/null /proc/driver/nvidia/version",
        args=("--only", HOST),
        gpu=True,
    ),
    Row(
        "nonroot_mig_selected",
        "a user naming a MIG device that does not exist: the caps nodes are needed now, and unreadable",
        "uid 1000, CUDA_VISIBLE_DEVICES=MIG-ffff",
        # One cause, not two: the caps nodes fail first, nvidia_driver (NVML) is skipped, and without NVML
        # cuda_visible_devices can only warn that MIG-ffff is unchecked (H200 run 2026-12-01).
        ["nvidia_device_nodes:NVIDIA_NODE_PERMISSION"],
        env={"CUDA_VISIBLE_DEVICES": "MIG-ffff"},
        user=1000,
        args=("--only", HOST),
        gpu=True,
    ),
    Row(
        "cvd_stops_at_unmatched",
        "CUDA_VISIBLE_DEVICES=0,<stale uuid>: CUDA keeps GPU 0 and drops the rest (a warning, not a fail)",
        "CUDA_VISIBLE_DEVICES=0,GPU-ffff",
        json={
            "probes.cuda_visible_devices.status": "warn",
            "probes.cuda_visible_devices.code": "CUDA_VISIBLE_DEVICES_UNMATCHED",
            "probes.torch_cuda.status": "pass",
        },
        env={"CUDA_VISIBLE_DEVICES": "0,GPU-ffff"},
        args=("--only", HOST + ",torch_cuda"),
        gpu=True,
        needs=("torch",),
    ),
    Row(
        "no_assembler",
        "gcc installed without binutils (or PATH without /usr/bin): cc --version works, builds do not",
        "CC=<gcc by absolute path>, PATH without as",
        ["c_extension_build:C_COMPILER_BROKEN"],
        setup='mkdir -p "$W/nobin" "$W/cc"; ln -s "$(command -v gcc)" "$W/cc/gcc"',
        env={"CC": "{W}/cc/gcc", "PATH": "{W}/nobin"},
        args=("--only", TOOLCHAIN),
    ),
    Row(
        "no_cc",
        "a slim image without gcc: Triton cannot build its C helper",
        "PATH without a compiler, CC unset",
        ["c_compiler:NO_C_COMPILER"],
        setup='mkdir -p "$W/nobin"',
        env={"PATH": "{W}/nobin"},
        unset=("CC",),
        args=("--only", TOOLCHAIN),
    ),
    Row(
        "no_cc_triton",
        "the same, seen through Triton itself (its own error text classified)",
        "PATH without a compiler, CC unset, --only triton_target",
        ["triton_target:NO_C_COMPILER"],
        setup='mkdir -p "$W/nobin"',
        env={"PATH": "{W}/nobin"},
        unset=("CC",),
        args=("--only", "triton_target"),
        gpu=True,
        needs=("torch", "triton"),
    ),
    Row(
        "cc_wrong",
        "CC exported to a compiler that is not installed (clang in a gcc image)",
        "CC=/nonexistent/clang",
        ["c_compiler:CC_INVALID"],
        env={"CC": "/nonexistent/clang"},
        args=("--only", TOOLCHAIN),
    ),
    Row(
        "no_python_h",
        "python3 without python3-dev: Triton's helper fails on Python.h",
        "empty dir bound over the include dir Triton uses",
        ["python_headers:NO_PYTHON_H"],
        setup='mkdir -p "$W/empty"; mount --bind "$W/empty" "$(include_dir)"',
        args=("--only", TOOLCHAIN),
    ),
    Row(
        "no_python_h_triton",
        "the same, seen through Triton's own build",
        "empty include dir, --only triton_target",
        ["triton_target:NO_PYTHON_H"],
        setup='mkdir -p "$W/empty"; mount --bind "$W/empty" "$(include_dir)"',
        args=("--only", "triton_target"),
        gpu=True,
        needs=("torch", "triton"),
    ),
    Row(
        "tmpdir_unwritable",
        "TMPDIR on a read-only or vanished mount: gcc and Python's tempfile pass over it to /tmp, so the "
        "builds work; a warning names it",
        "TMPDIR=<read-only tmpfs>",
        "pass",
        setup='ro_tmpfs "$W/rotmp"',
        env={"TMPDIR": "{W}/rotmp"},
        args=("--only", TOOLCHAIN),
        json={"probes.tmpdir.status": "warn", "probes.tmpdir.code": "TMPDIR_UNUSABLE"},
    ),
    Row(
        "cache_ro",
        "a Triton cache on a read-only mount (a shared cache bound ro)",
        "TRITON_CACHE_DIR=<read-only tmpfs>",
        ["triton_cache_dir:TRITON_CACHE_UNWRITABLE"],
        setup='ro_tmpfs "$W/rocache"',
        env={"TRITON_CACHE_DIR": "{W}/rocache"},
        args=("--only", "triton_cache_dir"),
    ),
    Row(
        "cache_root_owned",
        "a shared Triton cache created by root (a provisioning step), training run as a user",
        "uid 1000, TRITON_CACHE_DIR=<root-owned 0755 folder>",
        ["triton_cache_dir:TRITON_CACHE_UNWRITABLE"],
        setup='mkdir -p "$W/rootcache"; chmod 0755 "$W/rootcache"',
        env={"TRITON_CACHE_DIR": "{W}/rootcache"},
        user=1000,
        args=("--only", "triton_cache_dir"),
    ),
    Row(
        "home_ro_cache_unset",
        "HOME on a read-only fs (a pod, a container with a ro home) and no TRITON_CACHE_DIR",
        "HOME=<read-only tmpfs>, TRITON_CACHE_DIR unset",
        ["triton_cache_dir:TRITON_CACHE_UNWRITABLE"],
        setup='ro_tmpfs "$W/rohome"',
        env={"HOME": "{W}/rohome"},
        unset=("TRITON_CACHE_DIR", "TRITON_HOME", "XDG_CACHE_HOME"),
        args=("--only", "triton_cache_dir"),
        fix_has=("TRITON_CACHE_DIR=",),
        fix_lacks=("TRITON_CACHE_DIR={W}/rohome",),  # the folder it exports is not under HOME
    ),
    Row(
        "cache_noexec",
        "a Triton cache on a noexec mount (/tmp mounted noexec): kernels cannot be loaded",
        "TRITON_CACHE_DIR=<noexec tmpfs>",
        ["triton_cache_dir:TRITON_CACHE_NOEXEC"],
        setup='mkdir -p "$W/nx"; mount -t tmpfs -o noexec,size=4m tmpfs "$W/nx"',
        env={"TRITON_CACHE_DIR": "{W}/nx"},
        args=("--only", "triton_cache_dir"),
    ),
    Row(
        "cache_full",
        "the cache's filesystem full (a small /var, a cache never pruned)",
        "TRITON_CACHE_DIR=<64 KiB tmpfs, filled>",
        ["triton_cache_dir:TRITON_CACHE_FULL"],
        setup='mkdir -p "$W/full"; mount -t tmpfs -o size=64k tmpfs "$W/full"; '
        'dd if=/dev/zero of="$W/full/fill" bs=4k 2>/dev/null || true',
        env={"TRITON_CACHE_DIR": "{W}/full"},
        args=("--only", "triton_cache_dir"),
    ),
    Row(
        "triton_shadowed",
        "a ./triton folder (a source checkout) in the working directory shadows the installed Triton",
        "cwd with an empty triton/ package",
        ["package_versions:PACKAGE_SHADOWED"],
        setup='mkdir -p "$W/work/triton"; : > "$W/work/triton/__init__.py"',
        cwd="work",
        args=("--only", "package_versions"),
        needs=("triton",),
    ),
    Row(
        "fla_shadowed",
        "a ./fla folder (FLA's source checkout) in the working directory shadows the installed FLA",
        "cwd with an empty fla/ package",
        ["package_versions:PACKAGE_SHADOWED"],
        setup='mkdir -p "$W/work/fla"; : > "$W/work/fla/__init__.py"',
        cwd="work",
        args=("--only", "package_versions"),
        needs=("fla-core",),
    ),
    Row(
        "torch_unreadable",
        "a venv installed by root with a umask 077: torch unreadable to the user who trains",
        "uid 1000 + a root-only empty folder bound over torch's package folder",
        ["model_config:PACKAGE_UNREADABLE"],
        setup='t=$("$PY" -c \'import importlib.util as u; '
        'print(u.find_spec("torch").submodule_search_locations[0])\'); '
        'mkdir -m 0700 "$W/locked"; mount --bind "$W/locked" "$t"',
        user=1000,
        args=("--only", "model_config", "--model", "tiny"),
        needs=("torch", "transformers"),
    ),
    Row(
        "fla_core_missing",
        "FLA's kernels (fla-core) not installed beside flash-linear-attention",
        "PYTHONPATH without the folders holding fla",
        ["package_versions:PACKAGE_MISSING"],
        env={"PYTHONPATH": "{PYTHONPATH_WITHOUT_FLA}"},
        args=("--only", "package_versions"),
        needs=("fla-core",),
    ),
    Row(
        "model_shard_missing",
        "a download interrupted: the index names a shard that is not there",
        "model folder whose index names a missing shard",
        ["model_config:MODEL_WEIGHTS_INCOMPLETE"],
        setup='sharded_model "$W/model"',
        args=("--only", "model_config", "--model", "{W}/model"),
    ),
    Row(
        "model_shard_truncated",
        "a shard cut short (disk full during the download)",
        "a safetensors file whose header promises more than the file holds",
        ["model_config:MODEL_WEIGHTS_CORRUPT"],
        setup='tiny_model "$W/model"; '
        'printf \'\\x00\\x10\\x00\\x00\\x00\\x00\\x00\\x00{"a"\' > "$W/model/model.safetensors"',
        args=("--only", "model_config", "--model", "{W}/model"),
    ),
    Row(
        "model_config_truncated",
        "config.json cut in half (a copy interrupted)",
        "config.json truncated to 40 bytes",
        ["model_config:MODEL_CONFIG_CORRUPT"],
        setup='tiny_model "$W/model"; '
        'head -c 40 "$W/model/config.json" > "$W/c" && mv "$W/c" "$W/model/config.json"',
        args=("--only", "model_config", "--model", "{W}/model"),
    ),
    Row(
        "model_type_unknown",
        "a model newer than the installed transformers (model_type it does not know)",
        "config.json with model_type qwen9_next",
        ["model_config:MODEL_TYPE_UNKNOWN"],
        setup='tiny_model "$W/model"; '
        'sed -i \'s/"model_type": *"[^"]*"/"model_type": "qwen9_next"/\' "$W/model/config.json"',
        args=("--only", "model_config", "--model", "{W}/model"),
        needs=("transformers",),
    ),
    Row(
        "model_config_nonroot",
        "model_config as an unprivileged user (a METH_CLASS ValueError seen in an unprivileged container)",
        "setpriv uid 1000, --model tiny",
        "pass",
        user=1000,
        args=("--only", "model_config", "--model", "tiny"),
        needs=("transformers",),
    ),
    Row(
        "two_failures",
        "two independent faults at once: both must be named, not only the first",
        "PATH without a compiler + a model folder with a missing shard",
        ["c_compiler:NO_C_COMPILER", "model_config:MODEL_WEIGHTS_INCOMPLETE"],
        setup='mkdir -p "$W/nobin"; sharded_model "$W/model"',
        env={"PATH": "{W}/nobin"},
        unset=("CC",),
        args=("--only", TOOLCHAIN + ",model_config", "--model", "{W}/model"),
    ),
    Row(
        # Was in_container_bare (expected false): the lent H200 is itself a Docker container (/.dockerenv
        # beside an overlay root, /run/systemd/container = docker), so "bare" was the row's error; a bare
        # root is proven on fake trees in test_host_verdicts.
        "in_container_docker",
        "inside a Docker container (the lent GPU machine is one), the report says so",
        "none (host section of the report)",
        json={"host.in_container": True},
        args=("--only", "nvidia_device_nodes"),
        gpu=True,
    ),
    Row(
        "in_container_lxc",
        "inside an LXC container (systemd's marker file), the report says so",
        "tmpfs over /run with run/systemd/container = lxc",
        json={"host.in_container": True},
        setup="mount -t tmpfs tmpfs /run; mkdir -p /run/systemd; echo lxc > /run/systemd/container",
        args=("--only", "nvidia_device_nodes"),
    ),
    # ---- the process environment (process_env, and the same faults seen through torch) ----------
    Row(
        "as_limit",
        "ulimit -v left at 1 GiB by a login profile or a batch system's default",
        "prlimit --as=1 GiB",
        ["process_env:ADDRESS_SPACE_LIMIT"],
        setup="prlimit --pid $$ --as=1073741824",
        args=("--only", "process_env"),
        fix_has=("ulimit -v unlimited",),
    ),
    Row(
        "as_limit_torch",
        "the same limit (8 GiB), seen by torch: cudaGetDeviceCount 'Error 2: out of memory' on an idle GPU",
        "prlimit --as=8 GiB, --only torch_cuda",
        ["torch_cuda:CUDA_INIT_OUT_OF_MEMORY"],
        setup="prlimit --pid $$ --as=8589934592",
        args=("--only", "torch_cuda"),
        fix_has=("RLIMIT_AS",),
        gpu=True,
        needs=("torch",),
    ),
    Row(
        "nproc_low",
        "ulimit -u 16 for a training user (a shared login node's limits.conf)",
        "uid 1500 (its own: RLIMIT_NPROC counts every process of the uid), USER set, prlimit --nproc=16",
        ["process_env:THREAD_LIMIT"],
        setup="prlimit --pid $$ --nproc=16:16",
        user=1500,
        env={"USER": "trainer"},
        args=("--only", "process_env"),
    ),
    Row(
        "nproc_low_torch",
        "the same, seen by torch: 'libgomp: Thread creation failed', OpenBLAS pthread_create",
        "uid 1501 (its own), USER set, prlimit --nproc=12, --only torch_cuda",
        ["torch_cuda:THREAD_LIMIT"],
        setup="prlimit --pid $$ --nproc=12:12",
        user=1501,
        env={"USER": "trainer"},
        args=("--only", "torch_cuda"),
        gpu=True,
        needs=("torch",),
    ),
    Row(
        "nofile_low",
        "ulimit -n 64 (an init system's default for a service)",
        "prlimit --nofile=64",
        ["process_env:OPEN_FILES_LIMIT"],
        setup="prlimit --pid $$ --nofile=64:64",
        args=("--only", "process_env"),
    ),
    Row(
        "uid_unknown",
        "a container run with --user 4242 (no passwd entry) and no USER: getpass and pwd look-ups fail",
        "setpriv uid 4242, USER and LOGNAME unset",
        ["process_env:USER_UNKNOWN"],
        user=4242,
        unset=("USER", "LOGNAME"),
        args=("--only", "process_env"),
        fix_has=("useradd -u 4242",),
    ),
    Row(
        "uid_unknown_user_set",
        "the same uid with USER exported (getpass answers from it): a warning, not a failure",
        "setpriv uid 4242, USER=trainer",
        json={"probes.process_env.status": "warn", "probes.process_env.code": "USER_UNKNOWN"},
        user=4242,
        env={"USER": "trainer"},
        args=("--only", "process_env"),
    ),
    Row(
        "uid_unknown_compile",
        "the unknown uid, seen by torch.compile: KeyError 'getpwuid(): uid not found' in inductor",
        "setpriv uid 4242, USER unset, --only torch_cuda,torch_compile",
        ["torch_compile:USER_UNKNOWN"],
        user=4242,
        unset=("USER", "LOGNAME"),
        args=("--only", "torch_cuda,torch_compile"),
        gpu=True,
        needs=("torch", "triton"),
    ),
    Row(
        "uid_unknown_quick",
        "the unknown uid in the quick tier: ONE root cause, not one per probe that trips over it",
        "setpriv uid 4242, USER unset, quick tier",
        ["process_env:USER_UNKNOWN"],
        user=4242,
        unset=("USER", "LOGNAME"),
        args=("--purpose", "inference"),
        gpu=True,
        needs=("torch", "triton", "fla-core", "transformers"),
        timeout=450.0,
    ),
    Row(
        "home_unwritable",
        "HOME pointing at a folder the user cannot write (a shared read-only home)",
        "uid 1000, HOME=<root-owned 0755 folder>",
        json={"probes.process_env.status": "warn", "probes.process_env.code": "HOME_UNUSABLE"},
        setup='mkdir -p "$W/roothome"; chmod 0755 "$W/roothome"',
        user=1000,
        env={"HOME": "{W}/roothome"},
        args=("--only", "process_env"),
    ),
    Row(
        "alloc_conf_bad_value",
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:maybe copied from a forum post",
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:maybe",
        ["process_env:ALLOC_CONF_INVALID"],
        env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:maybe"},
        args=("--only", "process_env"),
        fix_has=("PYTORCH_CUDA_ALLOC_CONF",),
    ),
    Row(
        "alloc_conf_unparsable",
        "PYTORCH_CUDA_ALLOC_CONF without key:value (torch aborts the process on it)",
        "PYTORCH_CUDA_ALLOC_CONF=garbage",
        ["process_env:ALLOC_CONF_INVALID"],
        env={"PYTORCH_CUDA_ALLOC_CONF": "garbage"},
        args=("--only", "process_env"),
    ),
    Row(
        "alloc_conf_value_torch",
        "the bad value seen by torch at CUDA init (ValueError from its ConfigTokenizer)",
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:maybe, --only torch_cuda",
        ["torch_cuda:ALLOC_CONF_INVALID"],
        env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:maybe"},
        args=("--only", "torch_cuda"),
        gpu=True,
        needs=("torch",),
    ),
    Row(
        "alloc_conf_abort_torch",
        "the unparsable value seen by torch: the worker dies on a signal; the doctor reruns it without it",
        "PYTORCH_CUDA_ALLOC_CONF=garbage, --only torch_cuda",
        ["torch_cuda:ALLOC_CONF_INVALID"],
        env={"PYTORCH_CUDA_ALLOC_CONF": "garbage"},
        args=("--only", "torch_cuda"),
        gpu=True,
        needs=("torch",),
    ),
    Row(
        "omp_threads_not_number",
        "OMP_NUM_THREADS=auto (libgomp ignores it with a warning; the pool is then one per CPU)",
        "OMP_NUM_THREADS=auto",
        json={"probes.process_env.status": "warn", "probes.process_env.code": "ENV_SETTING_INVALID"},
        env={"OMP_NUM_THREADS": "auto"},
        args=("--only", "process_env"),
    ),
    Row(
        "ld_preload_missing",
        "LD_PRELOAD naming an allocator library that is not installed in this image",
        "LD_PRELOAD=/nonexistent/libjemalloc.so.2",
        json={"probes.process_env.status": "warn", "probes.process_env.code": "ENV_SETTING_INVALID"},
        env={"LD_PRELOAD": "/nonexistent/libjemalloc.so.2"},
        args=("--only", "process_env"),
    ),
    Row(
        "libcuda_stub_named",
        "a CUDA toolkit's stubs folder on LD_LIBRARY_PATH (copied from a build step): named without a GPU",
        "LD_LIBRARY_PATH=<dir with libcuda.so.1 -> a small library in a stubs folder>",
        json={"probes.process_env.code": "CUDA_DRIVER_STUB"},
        setup='mkdir -p "$W/cuda/lib64/stubs" "$W/stublink"; cp /bin/true "$W/cuda/lib64/stubs/libcuda.so"; '
        'ln -s "$W/cuda/lib64/stubs/libcuda.so" "$W/stublink/libcuda.so.1"',
        env={"LD_LIBRARY_PATH": "{W}/stublink"},
        args=("--only", "process_env"),
    ),
    Row(
        "libcuda_stub",
        "the toolkit's stub first on LD_LIBRARY_PATH: CUDA says 'Error 34: CUDA driver is a stub library'",
        "LD_LIBRARY_PATH=<dir with libcuda.so.1 -> .../stubs/libcuda.so>:$LD_LIBRARY_PATH",
        ["process_env:CUDA_DRIVER_STUB"],
        setup="stub_dir",
        env={"LD_LIBRARY_PATH": "{W}/stub:{LD_LIBRARY_PATH}"},
        args=("--only", "process_env," + HOST + ",torch_cuda"),
        fix_has=("remove {W}/stub from LD_LIBRARY_PATH",),
        gpu=True,
    ),
    Row(
        "libcuda_stub_torch",
        "the same stub, seen by torch alone (Error 34 from cudaGetDeviceCount)",
        "the stub first on LD_LIBRARY_PATH, --only torch_cuda",
        ["torch_cuda:CUDA_DRIVER_STUB"],
        setup="stub_dir",
        env={"LD_LIBRARY_PATH": "{W}/stub:{LD_LIBRARY_PATH}"},
        args=("--only", "torch_cuda"),
        fix_has=("remove {W}/stub from LD_LIBRARY_PATH",),
        gpu=True,
        needs=("torch",),
    ),
    # ---- start-up hooks ---------------------------------------------------------------------------
    Row(
        "sitecustomize_alloc_conf",
        "a site's sitecustomize.py exporting an allocator setting torch rejects, in every interpreter",
        "PYTHONPATH=<dir with sitecustomize.py setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:yes>",
        ["process_env:ALLOC_CONF_INVALID"],
        setup="hook \"$W/hook\" \"os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:yes'\"",
        env={"PYTHONPATH": "{W}/hook:{PYTHONPATH}"},
        args=("--only", "process_env"),
        fix_has=("sitecustomize.py",),
    ),
    Row(
        "sitecustomize_hides_gpus",
        "a sitecustomize.py that empties CUDA_VISIBLE_DEVICES (a scheduler's hook run outside it)",
        "PYTHONPATH=<dir with sitecustomize.py setting CUDA_VISIBLE_DEVICES=''>",
        ["process_env:STARTUP_HOOK_CHANGES_ENV"],
        setup="hook \"$W/hook\" \"os.environ['CUDA_VISIBLE_DEVICES'] = ''\"",
        env={"PYTHONPATH": "{W}/hook:{PYTHONPATH}"},
        args=("--only", "process_env," + HOST),
        gpu=True,
    ),
    Row(
        "sitecustomize_named",
        "the same hook without a GPU: named, a warning (hiding GPUs from a CPU job harms nothing)",
        "PYTHONPATH=<dir with sitecustomize.py setting CUDA_VISIBLE_DEVICES=''>",
        json={"probes.process_env.status": "warn", "probes.process_env.code": "STARTUP_HOOK_CHANGES_ENV"},
        setup="hook \"$W/hook\" \"os.environ['CUDA_VISIBLE_DEVICES'] = ''\"",
        env={"PYTHONPATH": "{W}/hook:{PYTHONPATH}"},
        args=("--only", "process_env", "--no-gpu"),
    ),
    Row(
        "pth_hook_bad_path",
        "a .pth file in site-packages whose import line sets TRITON_PTXAS_PATH to a ptxas that is gone",
        "site-packages overlay with a .pth: import os; os.environ['TRITON_PTXAS_PATH']='/nonexistent/ptxas'",
        ["process_env:ENV_SETTING_INVALID"],
        setup='sp=$(site_overlay); printf "import os; '
        "os.environ['TRITON_PTXAS_PATH'] = '/nonexistent/ptxas'\\n\""
        ' > "$sp/zz_site_hook.pth"',
        args=("--only", "process_env"),
        fix_has=("zz_site_hook.pth",),
    ),
    # ---- kernel caches on disk, corrupted several ways --------------------------------------------
    Row(
        "cache_cubin_empty",
        "a disk that filled while Triton wrote a kernel: an empty .cubin in the cache",
        "Triton cache entry with a 0-byte .cubin",
        ["kernel_caches:KERNEL_CACHE_CORRUPT"],
        setup='e=$(fake_entry "$W/cache" k1); : > "$e/k1.cubin"',
        args=("--only", "kernel_caches"),
        fix_has=("rm -rf {W}/cache/MLSTACKFAKEK1ENTRY",),
    ),
    Row(
        "cache_cubin_truncated",
        "a copy of a shared cache interrupted: a .cubin cut short (its section headers past the end)",
        "Triton cache entry whose .cubin is its first 200 bytes",
        ["kernel_caches:KERNEL_CACHE_CORRUPT"],
        setup='e=$(fake_entry "$W/cache" k1); head -c 200 /bin/true > "$e/k1.cubin"',
        args=("--only", "kernel_caches"),
    ),
    Row(
        "cache_binary_missing",
        "a cleanup script that deleted *.cubin but left the metadata (Triton: KeyError 'cubin')",
        "Triton cache entry whose group file lists a .cubin that is gone",
        ["kernel_caches:KERNEL_CACHE_CORRUPT"],
        setup='e=$(fake_entry "$W/cache" k1); rm "$e/k1.cubin"',
        args=("--only", "kernel_caches"),
    ),
    Row(
        "cache_metadata_truncated",
        "a kernel's metadata JSON cut short (a full disk during the write)",
        "Triton cache entry whose k1.json is 10 bytes",
        ["kernel_caches:KERNEL_CACHE_CORRUPT"],
        setup='e=$(fake_entry "$W/cache" k1); head -c 10 "$e/k1.json" > "$W/j" && mv "$W/j" "$e/k1.json"',
        args=("--only", "kernel_caches"),
    ),
    Row(
        "inductor_cache_truncated",
        "inductor's generated kernel module cut short in TORCHINDUCTOR_CACHE_DIR",
        "TORCHINDUCTOR_CACHE_DIR with ab/cabc.py = 'def call(args:'",
        ["kernel_caches:KERNEL_CACHE_CORRUPT"],
        setup='mkdir -p "$W/ind/ab"; printf "def call(args:" > "$W/ind/ab/cabc.py"',
        env={"TORCHINDUCTOR_CACHE_DIR": "{W}/ind"},
        args=("--only", "kernel_caches"),
        fix_has=("rm -rf {W}/ind/ab",),
    ),
    Row(
        "cache_repair",
        "--repair on a cache with an empty .cubin: moved aside inside the cache, nothing deleted",
        "Triton cache entry with a 0-byte .cubin, --repair",
        json={"probes.kernel_caches.status": "warn", "probes.kernel_caches.code": "KERNEL_CACHE_CORRUPT"},
        setup='e=$(fake_entry "$W/cache" k1); : > "$e/k1.cubin"',
        args=("--only", "kernel_caches", "--repair"),
    ),
    Row(
        "cache_image_invalid",
        "a cached kernel the driver refuses though it is a complete ELF file (its arch flags damaged)",
        "a real Triton kernel compiled into the cache, its ELF e_flags zeroed",
        ["kernel_caches:KERNEL_IMAGE_INVALID"],
        setup='real_kernel "$W/cache"; for c in $(find "$W/cache" -name "*.cubin"); do '
        'printf "\\000\\000\\000\\000" | dd of="$c" bs=1 seek=48 conv=notrunc 2>/dev/null; done',
        args=("--only", "kernel_caches"),
        gpu=True,
        needs=("torch", "triton"),
    ),
    Row(
        "cache_truncated_compile",
        "the origin story: a Triton cache poisoned on disk, seen by torch.compile",
        "torch.compile's kernels compiled into the cache, every .cubin cut to half, --only torch_compile",
        # On the H200 inductor's launch dies of SIGSEGV on the cut image (a plain Triton kernel gets
        # "device kernel image is invalid"): the doctor reads the cache and names the entry.
        ["torch_compile:KERNEL_CACHE_CORRUPT"],
        setup='TRITON_CACHE_DIR="$W/cache" "$PY" "$SRC/mlstack_doctor/workers/w_compile.py" '
        '\'{"device": "cuda"}\' '
        '>/dev/null; for c in $(find "$W/cache" -name "*.cubin"); do s=$(stat -c %s "$c"); '
        'head -c $((s / 2)) "$c" > "$c.h" && mv "$c.h" "$c"; done',
        args=("--only", "torch_cuda,torch_compile"),
        fix_has=("rm -rf {W}/cache/",),
        gpu=True,
        needs=("torch", "triton"),
    ),
    Row(
        "tmpdir_full_compile",
        "TMPDIR on a full filesystem: torch.compile's generated code cannot be written (ENOSPC)",
        "TMPDIR=<64 KiB tmpfs, filled>, --only torch_cuda,torch_compile",
        ["torch_compile:DISK_FULL"],
        setup='mkdir -p "$W/full"; mount -t tmpfs -o size=64k,mode=1777 tmpfs "$W/full"; '
        'dd if=/dev/zero of="$W/full/fill" bs=4k 2>/dev/null || true',
        env={"TMPDIR": "{W}/full"},
        args=("--only", "torch_cuda,torch_compile"),
        gpu=True,
        needs=("torch", "triton"),
    ),
]
