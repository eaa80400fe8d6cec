#!/usr/bin/env bash
# On a real NVIDIA GPU machine (root): the doctor's full tier, then each fault injected for real.
# Usage: OUT=/some/dir bash verify/bench/device_smoke.sh [STEP...]
#   steps: full faults nopyh stress (default: all). Reports: $OUT/reports/<step>.{json,txt}, bundled
#   as $OUT/reports.tgz.
set -u
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/doctor-smoke}; R=$OUT/reports; mkdir -p "$R"
PY=$(command -v python3)
export PYTHONPATH=$PWD/verify/src${PYTHONPATH:+:$PYTHONPATH}
STEPS=${*:-full faults nopyh stress}
doc() {  # doc TAG [env...] -- doctor args...
  local tag=$1; shift; local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  echo "=== $tag: ${envs[*]} mlstack-doctor $*"
  timeout 900 env "${envs[@]}" "$PY" -m mlstack_doctor --quiet --output "$R/$tag.json" "$@" > "$R/$tag.txt" 2>&1
  echo "rc=$?"; tail -n 4 "$R/$tag.txt"
}
CACHE=$(mktemp -d /tmp/tc-XXXX)
for step in $STEPS; do case $step in
full)  # full tier, tiny model, cold cache (FLA 0.5.1 + triton 3.6 refuse the GDN backward on Hopper)
  doc full_tiny TRITON_CACHE_DIR=$CACHE -- --tier full --model tiny ;;
faults)
  NOCC=$(mktemp -d); ln -s "$PY" "$NOCC/python3"   # a PATH with python only, CC unset, fresh cache
  doc no_cc -u CC PATH=$NOCC TRITON_CACHE_DIR=$(mktemp -d) -- --tier quick
  doc no_cc_triton -u CC PATH=$NOCC -- --only triton_target
  doc cuda_hidden CUDA_VISIBLE_DEVICES= TRITON_CACHE_DIR=$CACHE -- --tier quick
  mkdir -p /tmp/rocache && mount -t tmpfs -o ro tmpfs /tmp/rocache   # root ignores mode bits: ro mount
  doc cache_ro TRITON_CACHE_DIR=/tmp/rocache -- --tier quick
  umount /tmp/rocache ;;
nopyh)  # an empty dir bound over the interpreter's include dir, in a private mount namespace
  INC=$("$PY" -c 'import sysconfig;print(sysconfig.get_paths()["include"])'); EMPTY=$(mktemp -d)
  unshare -m sh -c "mount --bind $EMPTY $INC && \
    $PY -m mlstack_doctor --quiet --tier quick --output $R/no_python_h.json > $R/no_python_h.txt 2>&1; echo no_python_h rc=\$?; \
    TRITON_CACHE_DIR=\$(mktemp -d) $PY -m mlstack_doctor --quiet --only triton_target --output $R/no_python_h_triton.json \
      > $R/no_python_h_triton.txt 2>&1; echo no_python_h_triton rc=\$?"
  tail -n 3 "$R/no_python_h.txt" "$R/no_python_h_triton.txt" ;;
stress)  # 4 threads on the GPU(s), cold cache (autotuner race, triton#11494)
  doc stress_tiny -- --tier stress --model tiny --threads 4 --only model_config,autotune_stress ;;
esac; done
tar czf "$OUT/reports.tgz" -C "$R" . && rm -rf "$R"
