#!/usr/bin/env bash
# A stack profile proven on a GPU machine, in the order provisioning runs it: the full tier (tiny) on a
# cold Triton cache, the warm tier at the 27B widths (forward + backward), the full tier with the 27B
# shape on that warmed cache, then the stress tier (threads at once, forward + backward) on it.
# Usage (root, the stack importable by python3, the doctor on PYTHONPATH):
#   OUT=/some/dir bash verify/bench/profile_proof.sh profiles/NAME [STEP...]
#   steps: full_tiny warm_27b full_27b stress_27b (default: all). Each step: $OUT/<step>.json and .txt,
#   one summary line on stdout: step, exit code, seconds, failed/warned probes.
# TRITON_CACHE_DIR is kept across steps ($OUT/cache unless set): the steps share one cache, as a
# container's doctor and training do.
set -u
export PYTHONUNBUFFERED=1
profile=${1:?usage: profile_proof.sh profiles/NAME [STEP...]}
shift
OUT=${OUT:-/tmp/profile-proof}
mkdir -p "$OUT"
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$OUT/cache}
PY=${PYTHON:-python3}
STEPS=${*:-full_tiny warm_27b full_27b stress_27b}

step() {  # step NAME doctor-args...
    local name=$1 t0 rc
    shift
    t0=$(date +%s.%N)
    timeout 1500 "$PY" -m mlstack_doctor --quiet --profile "$profile" --output "$OUT/$name.json" "$@" \
        >"$OUT/$name.txt" 2>&1
    rc=$?
    "$PY" - "$OUT/$name.json" "$name" "$rc" "$t0" <<'EOF'
import json, sys, time
path, name, rc, t0 = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
try:
    doc = json.load(open(path))
except (OSError, ValueError) as exc:
    print(f"{name}: rc={rc} {time.time() - t0:.1f}s no report ({exc})")
    raise SystemExit(0)
s = doc["summary"]
odd = [f"{p['name']}:{p['status']}:{p.get('code')}" for p in doc["probes"] if p["status"] in ("fail", "warn")]
print(f"{name}: rc={rc} {time.time() - t0:.1f}s passed={s['passed']} failed={s['failed']} "
      f"warned={s['warned']} skipped={s['skipped']} {' '.join(odd)}")
for p in doc["probes"]:
    if p["name"] in ("gdn_backward", "torch_compile", "model_forward", "triton_warm", "autotune_stress",
                     "package_versions", "torch_triton_pin", "triton_target"):
        print(f"  {p['name']}: {p['status']} {p['duration_s']}s {p['summary'][:230]}")
EOF
}

for s in $STEPS; do
    case $s in
    full_tiny) step full_tiny --tier full --model tiny ;;
    warm_27b) step warm_27b --tier warm --model 27b ;;
    full_27b) step full_27b --tier full --model 27b ;;
    stress_27b) step stress_27b --tier stress --model 27b --only model_config,torch_cuda,triton_target,fla_device,fla_kernel,autotune_stress ;;
    *) echo "unknown step $s" >&2 ;;
    esac
done
