# One scheduled doctor run (mlstack-doctor-<tier>.service): writes the Prometheus metrics to
# $metrics_dir/doctor.prom (the last run of each tier) and the report beside it.
# - One run at a time (flock): the tiers share the GPUs and the metrics file. A fast run that finds the
#   lock held skips and says so (the holder writes the metrics); a run of another tier waits for it, the
#   wait counted in its TIMEOUT_S.
# - Bounded: the doctor is stopped after TIMEOUT_S (and systemd's TimeoutStartSec stops this script).
# - A tier other than fast skips while a job holds the GPUs (it would allocate GPU memory beside the
#   job), unless doctor_monitor_when_busy; the skip is written to the metrics with its reason. The fast
#   tier uses no GPU memory or compute (NVML and device-node opens, like nvidia-smi): it always runs.
# Usage: mlstack-doctor-monitor TIER TIMEOUT_S
# Exit codes: 0 passed, or skipped (saying why); 1 a probe failed (the report has the root cause and
# fix); 2 the doctor could not run; 124 it ran past TIMEOUT_S.
set -eu
if [ $# -ne 2 ]; then
    echo "usage: $0 TIER TIMEOUT_S" >&2
    exit 2
fi
tier=$1 limit=$2
prom="$metrics_dir/doctor.prom"
report="$metrics_dir/doctor-$tier.json"
lock=/run/lock/mlstack-doctor-monitor.lock

say() {
    echo "mlstack-doctor-monitor ($tier): $*"
}

mkdir -p -- "$metrics_dir"
exec 9>"$lock"
if ! flock -n 9; then
    # The fast tier runs again within minutes: it skips. Any other tier runs once a day or was started by
    # hand ("a run now"): it waits for the holder rather than vanish without a verdict.
    if [ "$tier" = fast ]; then
        say "another doctor run holds $lock; skipping this one (that run writes the metrics)"
        exit 0
    fi
    # The wait counts against this run's own limit, so the unit's bound holds.
    say "another doctor run holds $lock; waiting for it (within this run's ${limit}s)"
    waited_from=$(date +%s)
    if ! flock -w "$limit" 9; then
        say "$lock still held after ${limit}s; skipping this one (the holder writes the metrics)" >&2
        exit 0
    fi
    limit=$((limit - ($(date +%s) - waited_from)))
    if [ "$limit" -le 0 ]; then
        say "the lock came too late to run within the limit; skipping this one" >&2
        exit 0
    fi
fi

# The active venv, resolved: its doctor checks the lock it was built from (its name, profile and lock
# hash, is the report's profile) and its Triton cache is the one training uses. Resolved per run, so an
# upgrade or a rollback is followed.
if ! active=$(readlink -e -- "$venv") || [ ! -x "$active/bin/mlstack-doctor" ]; then
    say "no mlstack-doctor in $venv (${active:-not found}): cannot run; provision.yml installs it" >&2
    exit 2
fi

# Why the GPUs are busy, or nothing: compute processes nvidia-smi lists, then this container's
# processes holding a GPU open (in a PID namespace, as in an LXC container, the driver may list none).
gpu_busy() {
    if command -v nvidia-smi >/dev/null 2>&1; then
        if out=$(timeout 60 nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>&1); then
            pids=$(printf '%s\n' "$out" | tr -d ' ' | grep -E '^[0-9]+$' | tr '\n' ' ' || true)
            if [ -n "$pids" ]; then
                echo "nvidia-smi lists GPU compute processes: ${pids% }"
                return
            fi
        else
            say "nvidia-smi failed ($(printf '%s' "$out" | head -n 1)): it cannot say whether the GPUs are busy" >&2
        fi
    else
        say "nvidia-smi not found: it cannot say whether the GPUs are busy" >&2
    fi
    holders=$(find /proc/[0-9]*/fd -maxdepth 1 -lname '/dev/nvidia[0-9]*' 2>/dev/null | cut -d/ -f3 | sort -un || true)
    if [ -n "$holders" ]; then
        names=""
        for pid in $holders; do
            names="$names $pid ($(cat "/proc/$pid/comm" 2>/dev/null || echo gone))"
        done
        echo "processes hold a GPU device open:$names"
    fi
}

if [ "$tier" != fast ]; then
    if [ "$when_busy" = yes ]; then
        say "doctor_monitor_when_busy is set: running whether or not the GPUs are busy"
    else
        busy=$(gpu_busy)
        if [ -n "$busy" ]; then
            say "skipping: the GPUs are busy ($busy); doctor_monitor_when_busy: true runs it anyway"
            "$active/bin/python" -m mlstack_doctor.ops.metrics --run-skipped gpu_busy --tier "$tier" "$prom"
            exit 0
        fi
        say "no job holds the GPUs: running"
    fi
fi

# The command every caller runs: the profile (the lock of the venv it runs in), model, purpose, GPU
# expectation and Triton cache come from the container's doctor settings (/etc/mlstack/doctor.json, the
# doctor role's); a setting this schedule overrides is passed as a flag.
set -- "$active/bin/mlstack-doctor" --tier "$tier" --quiet --output "$report" --metrics "$prom"
if [ -n "$model" ]; then
    set -- "$@" --model "$model"
fi
if [ -n "$purpose" ]; then
    set -- "$@" --purpose "$purpose"
fi
if [ -n "$triton_cache_root" ]; then
    set -- "$@" --triton-cache-root "$triton_cache_root"
fi
case $expect_gpu in
    yes) set -- "$@" --expect-gpu ;;
    no) set -- "$@" --no-gpu ;;
esac
export HOME="${HOME:-/root}"
rc=0
timeout --kill-after=30 "$limit" "$@" || rc=$?
case $rc in
    0) say "passed: metrics in $prom, report in $report" ;;
    1) say "a probe failed: the root cause and its fix are in $report (summary.root_causes)" >&2 ;;
    124 | 137) say "the doctor ran longer than ${limit}s and was stopped; no verdict was written" >&2 ;;
    *) say "the doctor could not run (exit $rc); no verdict was written" >&2 ;;
esac
exit "$rc"
