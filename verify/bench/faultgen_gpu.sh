#!/bin/sh
# The fault generator's GPU share on a lent GPU machine, in one command: FLA + fla-core wheels (pure Python)
# into a --target folder first on PYTHONPATH over the machine's torch/triton/transformers, one Triton cache
# warmed by the stack's job (each case starts from a copy of it), then COUNT cases drawn with SEED, each
# injected in its own mount namespace and judged. Totals table at the end; every verdict in $OUT/faultgen.json.
#   Usage: OUT=dir SEED=n COUNT=n [JOBS=4] [WHEELS=.wheels] sh verify/bench/faultgen_gpu.sh
set -eu
: "${OUT:?}" "${SEED:?}" "${COUNT:?}" "${WHEELS:=.wheels}"
mkdir -p "$OUT"
if ls "$WHEELS"/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$WHEELS"/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD/verify/src PYTHONUNBUFFERED=1
unset TRITON_CACHE_DIR TORCHINDUCTOR_CACHE_DIR
{ nvidia-smi -L; python3 -c 'import importlib.metadata as m
for d in ("torch", "triton", "flash-linear-attention", "fla-core", "transformers"): print(d, m.version(d))'
  head -1 /proc/driver/nvidia/version; } > "$OUT/stack.txt" 2>&1 || true
WARM=$(mktemp -d /tmp/faultgen-warm-XXXX)
# The job once, and the doctor's quick tier once, on the cache the cases copy: their kernels compiled here.
TRITON_CACHE_DIR=$WARM timeout 900 python3 verify/tests/faults/workload.py "$OUT/warm-job.json" --gpu \
  > "$OUT/warm.txt" 2>&1 || true
TRITON_CACHE_DIR=$WARM timeout 900 python3 -m mlstack_doctor --tier quick --quiet --json \
  --output "$OUT/warm-doctor.json" >> "$OUT/warm.txt" 2>&1 || true
rc=0
python3 verify/bench/faultgen.py --seed "$SEED" --count "$COUNT" --jobs "${JOBS:-4}" --warm-cache "$WARM" \
  --json "$OUT/faultgen.json" > "$OUT/faultgen.txt" 2>&1 || rc=$?
cat "$OUT/stack.txt"; cat "$OUT/warm-job.json" 2>/dev/null || true
tail -c 12000 "$OUT/faultgen.txt"
rm -rf "$WARM"
exit $rc
