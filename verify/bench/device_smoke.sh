#!/usr/bin/env bash
# On a real NVIDIA GPU machine (root): the doctor's full tier, the fault matrix (each fault injected for
# real in its own mount namespace: fault_matrix.py), and the stress tier.
# Usage: OUT=/some/dir bash verify/bench/device_smoke.sh [STEP...]
#   steps: full matrix stress (default: all). Reports: $OUT/reports/<step>.{json,txt}, bundled as
#   $OUT/reports.tgz; the matrix's rows in $OUT/reports/matrix.json.
set -u
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/doctor-smoke}; R=$OUT/reports; mkdir -p "$R"
PY=$(command -v python3)
export PYTHONPATH=$PWD/verify/src${PYTHONPATH:+:$PYTHONPATH}
STEPS=${*:-full matrix stress}
doc() {  # doc TAG [env...] -- doctor args...
  local tag=$1; shift; local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  echo "=== $tag: ${envs[*]} mlstack-doctor $*"
  timeout 900 env "${envs[@]}" "$PY" -m mlstack_doctor --quiet --output "$R/$tag.json" "$@" > "$R/$tag.txt" 2>&1
  echo "rc=$?"; tail -n 4 "$R/$tag.txt"
}
CACHE=$(mktemp -d /tmp/tc-XXXX)
for step in $STEPS; do case $step in
full)  # full tier, tiny model, cold cache
  doc full_tiny TRITON_CACHE_DIR=$CACHE -- --tier full --model tiny ;;
matrix)  # every fault row, 4 at a time
  "$PY" verify/bench/fault_matrix.py --jobs 4 --json "$R/matrix.json" 2>&1 | tee "$R/matrix.txt"
  echo "matrix rc=${PIPESTATUS[0]}" ;;
stress)  # 4 threads on the GPU(s), cold cache (autotuner race, triton#11494)
  doc stress_tiny -- --tier stress --model tiny --threads 4 --only model_config,autotune_stress ;;
esac; done
tar czf "$OUT/reports.tgz" -C "$R" . && rm -rf "$R"
