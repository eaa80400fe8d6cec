"""The fault generator's mutations: test data, each with its ground truth by construction.

A mutation is one change a user's environment can carry; `universe()` lists every one the generator knows,
`generate(seed, count, cpu)` draws the cases of a run (singles and pairs of two kinds). Each becomes a row of
the fault matrix (fault_rows.Row): shell `setup` in the case's own mount namespace with the rows' PRELUDE
helpers, `env`/`unset`, `user`. verify/bench/faultgen.py injects and judges them.
"""

from __future__ import annotations

import itertools
import random
import re
import shlex
from dataclasses import dataclass

from fault_rows import Row

KINDS = ("env", "limit", "home", "tmpdir", "cache", "startup", "user", "path")


@dataclass(frozen=True)
class Mutation:
    """One change to the environment, with its ground truth ({"kind", "name"}) set by construction."""

    kind: str
    name: str  # the variable, the limit (RLIMIT_FSIZE), the cache's variable, the uid ...
    how: str  # for a person: what was done
    setup: str = ""
    env: tuple[tuple[str, str], ...] = ()
    unset: tuple[str, ...] = ()
    user: int | None = None
    cpu: bool = True  # a CPU-only machine can show it (the job or a CPU probe meets it)
    words: tuple[str, ...] = ()  # more texts that name it in a report (a limit's ulimit flag)

    @property
    def truth(self) -> dict[str, str]:
        return {"kind": self.kind, "name": self.name}


# --- the mutation families -----------------------------------------------------------------------------
# Variables from torch's, Triton's, CUDA's, NCCL's and inductor's documentation and source, each with a
# value that is invalid or contradicts another setting. Whether it breaks the job is not assumed: the job
# says so (an invalid NCCL_DEBUG breaks nothing a single process does, and must not make the doctor red).
ENV_VALUES: dict[str, tuple[tuple[str, bool], ...]] = {
    # name: ((value, visible without a GPU), ...)
    "PYTORCH_CUDA_ALLOC_CONF": (
        ("expandable_segments:maybe", True),
        ("garbage", True),
        ("max_split_size_mb:-5", True),
    ),
    "CUDA_VISIBLE_DEVICES": (("7", False), ("GPU-00000000-0000-0000-0000-000000000000", False), ("", False)),
    "CUDA_LAUNCH_BLOCKING": (("yes-please", True),),
    "CUDA_MODULE_LOADING": (("NEVER", False),),
    "CUDA_DEVICE_MAX_CONNECTIONS": (("0", False),),
    "TRITON_INTERPRET": (("1", False),),
    "TRITON_CACHE_MANAGER": (("nonexistent.module:Manager", False),),
    "TRITON_PTXAS_PATH": (("/nonexistent/ptxas", True),),
    "TRITON_LIBCUDA_PATH": (("/nonexistent", False),),
    "TRITON_DEFAULT_FP_FUSION": (("maybe", False),),
    "TRITON_ALWAYS_COMPILE": (("1", False),),
    "TRITON_DEBUG": (("1", False),),
    "TORCHINDUCTOR_MAX_AUTOTUNE": (("sometimes", False),),
    "TORCHINDUCTOR_COMPILE_THREADS": (("many", False), ("0", False)),
    "TORCHINDUCTOR_FX_GRAPH_CACHE": (("2", False),),
    "TORCH_LOGS": (("+nonsense_component", True),),
    "TORCH_COMPILE_DEBUG": (("1", False),),
    "TORCH_SHOW_CPP_STACKTRACES": (("1", True),),
    "TORCH_CUDA_ARCH_LIST": (("13.7", False),),
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": (("banana", False),),
    "NCCL_DEBUG": (("LOUD", True),),
    "NCCL_SOCKET_IFNAME": (("=nonexistent0", False),),
    "NCCL_P2P_LEVEL": (("NOWHERE", False),),
    "NCCL_IB_DISABLE": (("perhaps", False),),
    "OMP_NUM_THREADS": (("auto", True), ("0", True)),
    "MKL_NUM_THREADS": (("-3", True),),
    "PYTHONWARNINGS": (("error", True),),
    "PYTHONHASHSEED": (("not-a-number", True),),
    "LD_PRELOAD": (("/nonexistent/libjemalloc.so.2", True),),
    "CC": (("/nonexistent/clang", True), ("true", True)),
}

# Resource limits: (prlimit option, value, the flag ulimit names it by, visible without a GPU, what names it)
LIMITS: tuple[tuple[str, str, str, int, bool, tuple[str, ...]], ...] = (
    ("RLIMIT_FSIZE", "fsize", "-f", 2**20, True, ("file_size", "file size", "File too large", "EFBIG")),
    ("RLIMIT_NOFILE", "nofile", "-n", 24, True, ("open_files", "open files", "OPEN_FILES_LIMIT")),
    ("RLIMIT_AS", "as", "-v", 2**30, True, ("address_space", "address space", "ADDRESS_SPACE_LIMIT")),
    ("RLIMIT_AS", "as", "-v", 8 * 2**30, False, ("address_space", "address space", "ADDRESS_SPACE_LIMIT")),
    ("RLIMIT_STACK", "stack", "-s", 64 * 1024, True, ("stack", "stack size")),
    ("RLIMIT_DATA", "data", "-d", 2**29, True, ("data", "data segment")),
    ("RLIMIT_MEMLOCK", "memlock", "-l", 0, False, ("locked_memory", "locked memory")),
    ("RLIMIT_CORE", "core", "-c", 0, True, ("core file",)),
    ("RLIMIT_NPROC", "nproc", "-u", 12, True, ("processes", "THREAD_LIMIT", "Thread creation failed")),
)

# Folders the stack writes into, by the variable that names them; the ground truth's kind.
PATH_VARS = {
    "HOME": "home",
    "TMPDIR": "tmpdir",
    "TRITON_CACHE_DIR": "path",
    "TORCHINDUCTOR_CACHE_DIR": "path",
    "TRITON_HOME": "path",
    "XDG_CACHE_HOME": "path",
}
PATH_MODES = {
    "file": ('printf x > "$W/{tag}"', "a regular file"),
    "readonly": ('ro_tmpfs "$W/{tag}"', "a read-only tmpfs"),
    "unreachable": (":", "a path under /proc, which nobody can create"),
}


def _env_mutations() -> list[Mutation]:
    out = []
    for name, values in ENV_VALUES.items():
        for value, cpu in values:
            out.append(Mutation("env", name, f"{name}={value!r}", env=((name, value),), cpu=cpu))
    return out


def _limit_mutations() -> list[Mutation]:
    out = []
    for rlimit, opt, flag, value, cpu, words in LIMITS:
        # RLIMIT_NPROC counts every process of the uid machine-wide: a uid of its own, as the matrix's rows
        user = 1700 + value if opt == "nproc" else None
        env = (("USER", "trainer"),) if user is not None else ()
        out.append(
            Mutation(
                "limit",
                rlimit,
                f"ulimit {flag} {value if opt in ('nofile', 'nproc') else value // 1024}"
                + (f" (uid {user})" if user else ""),
                setup=f"prlimit --pid $$ --{opt}={value}:{value}",
                env=env,
                user=user,
                cpu=cpu,
                words=(f"ulimit {flag}", *words),
            )
        )
    return out


def _path_mutations() -> list[Mutation]:
    out = []
    for var, kind in PATH_VARS.items():
        for mode, (setup, what) in PATH_MODES.items():
            tag = f"{var.lower()}-{mode}"
            target = f"/proc/mlstack-{tag}/x" if mode == "unreachable" else f"{{W}}/{tag}"
            # As root, HOME missing is no fault (root creates it; field notes): a uid of its own then.
            user = 1000 if var == "HOME" else None
            out.append(
                Mutation(
                    kind,
                    var,
                    f"{var}=<{what}>" + (" as uid 1000" if user else ""),
                    setup=setup.format(tag=tag),
                    env=((var, target),),
                    user=user,
                )
            )
    out.append(
        Mutation(
            "path",
            "PATH",
            "PATH without a compiler, CC unset",
            'mkdir -p "$W/nobin"',
            env=(("PATH", "{W}/nobin"),),
            unset=("CC",),
        )
    )
    return out


def _cache_mutations() -> list[Mutation]:
    """Kernel caches truncated, emptied or mixed between versions ($W/cache: the cache the cases run with)."""
    entry = 'e=$(fake_entry "$W/cache" k1)'
    return [
        Mutation(
            "cache", "TRITON_CACHE_DIR", "a cached kernel binary emptied", f'{entry}; : > "$e/k1.cubin"'
        ),
        Mutation(
            "cache",
            "TRITON_CACHE_DIR",
            "a cached kernel binary truncated",
            f'{entry}; head -c 200 /bin/true > "$e/k1.cubin"',
        ),
        Mutation(
            "cache",
            "TRITON_CACHE_DIR",
            "a cached kernel's metadata truncated",
            f'{entry}; head -c 10 "$e/k1.json" > "$W/j" && mv "$W/j" "$e/k1.json"',
        ),
        Mutation(
            "cache",
            "TRITON_CACHE_DIR",
            "a cache entry of another GPU architecture (sm_70 in an sm_90 cache)",
            'fake_entry "$W/cache" k2 70 > /dev/null',
            cpu=False,
        ),
        Mutation(
            "cache",
            "TORCHINDUCTOR_CACHE_DIR",
            "an inductor cache entry cut mid-file",
            'mkdir -p "$W/ind/ab"; printf "def call(args:" > "$W/ind/ab/cabc.py"',
            env=(("TORCHINDUCTOR_CACHE_DIR", "{W}/ind"),),
        ),
    ]


def _user_mutations() -> list[Mutation]:
    return [
        Mutation(
            "user",
            "uid",
            "uid 4343 without a passwd entry, USER and LOGNAME unset",
            unset=("USER", "LOGNAME"),
            user=4343,
            words=("passwd", "USER_UNKNOWN", "getpwuid"),
        ),
        Mutation(
            "user",
            "uid",
            "uid 4344 without a passwd entry, USER=trainer",
            env=(("USER", "trainer"),),
            user=4344,
            words=("passwd", "USER_UNKNOWN", "getpwuid"),
        ),
    ]


def _startup_mutations() -> list[Mutation]:
    hook = 'hook "$W/hook" {line}'
    pythonpath = (("PYTHONPATH", "{W}/hook:{PYTHONPATH}"),)
    lines = {
        "sets PYTORCH_CUDA_ALLOC_CONF=garbage": "os.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'garbage'",
        "sets TORCH_LOGS to an unknown component": "os.environ['TORCH_LOGS'] = '+nonsense_component'",
        "raises at start-up": "raise RuntimeError('site hook broken')",
        "sets TMPDIR to a missing folder": "os.environ['TMPDIR'] = '/proc/mlstack-hook-tmp'",
    }
    return [
        Mutation(
            "startup",
            "sitecustomize",
            f"a sitecustomize.py on PYTHONPATH that {what}",
            setup=hook.format(line=shlex.quote(line)),
            env=pythonpath,
            words=("sitecustomize", "start-up hook"),
        )
        for what, line in lines.items()
    ]


def universe() -> list[Mutation]:
    """Every single mutation the generator knows, in a fixed order (the seed picks among them)."""
    return [
        *_env_mutations(),
        *_limit_mutations(),
        *_path_mutations(),
        *_cache_mutations(),
        *_user_mutations(),
        *_startup_mutations(),
    ]


@dataclass(frozen=True)
class Case:
    """One generated case: a single mutation or a pair, its name, and everything the matrix needs."""

    index: int
    parts: tuple[Mutation, ...]

    @property
    def name(self) -> str:
        if not self.parts:
            return "baseline"
        return f"g{self.index:03d}-" + "+".join(
            re.sub(r"[^a-z0-9]+", "_", f"{m.kind}_{m.name}".lower()) for m in self.parts
        )

    @property
    def truths(self) -> list[dict[str, str]]:
        return [m.truth for m in self.parts]

    def row(self) -> Row:
        users = {m.user for m in self.parts if m.user is not None}
        env: dict[str, str] = {}
        for m in self.parts:
            env.update(dict(m.env))
        return Row(
            self.name,
            "generated",
            "; ".join(m.how for m in self.parts),
            setup="\n".join(m.setup for m in self.parts if m.setup),
            env=env,
            unset=tuple(u for m in self.parts for u in m.unset),
            user=min(users) if users else None,
            timeout=600.0,
        )


def generate(seed: int, count: int, cpu: bool, pair_share: float = 0.25) -> list[Case]:
    """`count` cases drawn with `seed`: singles without repeats, about `pair_share` of them pairs of two
    mutations of different kinds (two faults at once: both must be named). Same seed, same cases."""
    rng = random.Random(seed)
    pool = [m for m in universe() if m.cpu or not cpu]
    singles = rng.sample(pool, len(pool))
    pairs = [
        (a, b) for a, b in itertools.combinations(pool, 2) if a.kind != b.kind and not (a.user and b.user)
    ]
    cases: list[Case] = []
    for i in range(count):
        if rng.random() < pair_share and pairs:
            parts: tuple[Mutation, ...] = rng.choice(pairs)
        else:
            parts = (singles[i % len(singles)],)
        cases.append(Case(i, parts))
    return cases
