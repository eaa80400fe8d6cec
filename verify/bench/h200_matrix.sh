#!/bin/sh
# The fault matrix on a lent GPU machine, in one command: FLA + fla-core wheels (pure Python) into a
# --target folder first on PYTHONPATH over the machine's torch/triton/transformers, then every row
# (or ROWS=a,b), its table and JSON under $OUT.  Usage: OUT=dir WHEELS=dir sh verify/bench/h200_matrix.sh
set -eu
: "${OUT:?}" "${WHEELS:=.wheels}"
# No wheels there: the stack already in /tmp/site (faultgen_gpu.sh's setup) or the machine's own.
if ls "$WHEELS"/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$WHEELS"/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD/verify/src PYTHONUNBUFFERED=1
{ nvidia-smi -L; python3 -c 'import importlib.metadata as m
for d in ("torch", "triton", "flash-linear-attention", "fla-core", "transformers"): print(d, m.version(d))'
  cat /proc/driver/nvidia/version | head -1; } > "$OUT/stack.txt" 2>&1 || true
set -- --jobs "${JOBS:-8}" --json "$OUT/fault-matrix.json"
[ -n "${ROWS:-}" ] && set -- "$@" --only "$ROWS"
rc=0; python3 verify/bench/fault_matrix.py "$@" > "$OUT/fault-matrix.txt" 2>&1 || rc=$?
cat "$OUT/stack.txt"; tail -c 9000 "$OUT/fault-matrix.txt"; exit $rc
