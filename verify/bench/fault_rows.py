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
driver_dirs() {  # the folders holding libcuda.so.1 / libnvidia-ml.so.1 in the linker cache, shallowest first
  (ldconfig -p 2>/dev/null || /sbin/ldconfig -p) | awk '/lib(cuda|nvidia-ml)\.so\.1 /{print $NF}' \
    | while read -r f; do dirname "$(readlink -f "$f")"; done | sort -u \
    | awk '{print length, $0}' | sort -n | cut -d' ' -f2-
}
farm_without() {  # DIR PATTERN...: DIR replaced by links to its entries, except those matching a PATTERN
  d=$1; shift; n=$(echo "$d" | tr / _); mkdir -p "$W/orig$n" "$W/farm$n"; mount --bind "$d" "$W/orig$n"
  for f in "$W/orig$n"/* "$W/orig$n"/.[!.]*; do
    [ -e "$f" ] || [ -L "$f" ] || continue; skip=
    for p in "$@"; do case "${f##*/}" in $p) skip=1;; esac; done
    [ -n "$skip" ] || ln -s "$f" "$W/farm$n/"
  done
  mount --bind "$W/farm$n" "$d"
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
        ["nvidia_device_nodes:NVIDIA_NODE_PERMISSION", "cuda_visible_devices:CUDA_VISIBLE_DEVICES_UNMATCHED"],
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
        "TMPDIR on a read-only or vanished mount: gcc cannot write its temporaries",
        "TMPDIR=<read-only tmpfs>",
        ["tmpdir:TMPDIR_UNUSABLE"],
        setup='ro_tmpfs "$W/rotmp"',
        env={"TMPDIR": "{W}/rotmp"},
        args=("--only", TOOLCHAIN),
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
        "in_container_bare",
        "the report must not claim a container on a bare machine",
        "none (host section of the report)",
        json={"host.in_container": False},
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
]
