#!/bin/sh
# The fault generator's GPU share on a lent GPU machine, in parts that each fit one command's minutes.
#   STAGE=setup  FLA + fla-core wheels (pure Python; WHEELS, any other wheel there too) into /tmp/site, first
#                on PYTHONPATH over the machine's torch/triton/transformers; one Triton cache (/tmp/fg-warm)
#                warmed by the stack's job and the doctor's quick tier (each case starts from a copy of it)
#   STAGE=cases  the draw's cases ONLY=A:B (SEED, COUNT: the same draw in every part), JOBS at once, after
#                the unmutated baseline (run by the first part, kept in /tmp/fg-baseline.json); each
#                verdict appended to $OUT/cases.jsonl as it comes and to /tmp/fg-cases.jsonl (all parts)
#   STAGE=totals the table and totals of every part's verdicts (/tmp/fg-cases.jsonl)
# /tmp persists while the machine stays warm: send the parts back to back.
#   Usage: OUT=dir STAGE=setup [WHEELS=.wheels] [WARM_JOB_S=400] [WARM_DOCTOR_S=300 (0: no doctor run)] \
#            sh verify/bench/faultgen_gpu.sh
#          OUT=dir STAGE=cases SEED=n COUNT=n ONLY=A:B [JOBS=8] [BUDGET_S=540] sh verify/bench/faultgen_gpu.sh
set -eu
: "${OUT:?}" "${STAGE:?}"
mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:$PWD/verify/src PYTHONUNBUFFERED=1
unset TRITON_CACHE_DIR TORCHINDUCTOR_CACHE_DIR
WARM=/tmp/fg-warm
case "$STAGE" in
setup)
  : "${WHEELS:=.wheels}"
  if ls "$WHEELS"/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      "$WHEELS"/*.whl
  fi
  { nvidia-smi -L; python3 -c 'import importlib.metadata as m
for d in ("torch", "triton", "flash-linear-attention", "fla-core", "transformers"): print(d, m.version(d))'
    head -1 /proc/driver/nvidia/version; } > "$OUT/stack.txt" 2>&1 || true
  cat "$OUT/stack.txt"
  mkdir -p "$WARM"
  # The job once, and the doctor's quick tier once, on the cache the cases copy: their kernels compiled here.
  TRITON_CACHE_DIR=$WARM timeout "${WARM_JOB_S:-400}" python3 verify/tests/faults/workload.py \
    "$OUT/warm-job.json" --gpu > "$OUT/warm.txt" 2>&1 || true
  if [ "${WARM_DOCTOR_S:-300}" -gt 0 ]; then
    TRITON_CACHE_DIR=$WARM timeout "${WARM_DOCTOR_S:-300}" python3 -m mlstack_doctor --tier quick --quiet --json \
      --output "$OUT/warm-doctor.json" >> "$OUT/warm.txt" 2>&1 || true
  fi
  cat "$OUT/warm-job.json" 2>/dev/null || tail -20 "$OUT/warm.txt"
  tail -3 "$OUT/warm.txt"
  ;;
cases)
  : "${SEED:?}" "${COUNT:?}" "${ONLY:?}"
  rc=0
  # cut short before the command's limit: the verdicts so far are in the JSON lines either way
  timeout "${BUDGET_S:-540}" python3 verify/bench/faultgen.py --seed "$SEED" --count "$COUNT" --only "$ONLY" \
    --jobs "${JOBS:-8}" --warm-cache "$WARM" --baseline-json /tmp/fg-baseline.json --jsonl "$OUT/cases.jsonl" \
    > "$OUT/faultgen.txt" 2>&1 || rc=$?
  cat "$OUT/cases.jsonl" >> /tmp/fg-cases.jsonl 2>/dev/null || true
  tail -c 9000 "$OUT/faultgen.txt"
  exit $rc
  ;;
totals)
  cp /tmp/fg-cases.jsonl "$OUT/all-cases.jsonl"
  python3 verify/bench/faultgen.py --seed "${SEED:-0}" --totals /tmp/fg-cases.jsonl | tail -c 11000
  ;;
esac
