#!/bin/sh
# Warm once, install elsewhere, on one GPU machine: the 27B key warmed in a fresh cache (container A's) and
# published to a share folder; installed into a second fresh cache (container B's) through the doctor's
# --warm-share, as the triton_warm role runs it (A's cache is removed first: B must stand alone); then in B
# a first training step, forward + backward at the warm shapes (the warm tier's passes again, --rewarm:
# new autotune files counted, seconds timed), and the stress tier. Prints the figures as JSON.
# Usage: OUT=dir WHEELS=dir sh verify/bench/warm_share_h200.sh   (MODEL=27b SEQ=2048 THREADS=4)
set -eu
: "${OUT:?}" "${WHEELS:=.wheels}" "${MODEL:=27b}" "${SEQ:=2048}" "${THREADS:=4}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl
export PYTHONPATH=/tmp/site:$PWD/verify/src PYTHONUNBUFFERED=1
A=$(mktemp -d /tmp/warm-a-XXXX) B=$(mktemp -d /tmp/warm-b-XXXX) S=$(mktemp -d /tmp/warm-share-XXXX)
doc() {  # doc TAG CACHE doctor-args...: the report in $OUT/TAG.json, its wall seconds in $OUT/TAG.wall
  tag=$1 cache=$2; shift 2; t0=$(date +%s.%N)
  TRITON_CACHE_DIR=$cache timeout 1800 python3 -m mlstack_doctor --quiet --model "$MODEL" --seq-len "$SEQ" \
    --output "$OUT/$tag.json" "$@" > "$OUT/$tag.txt" 2>&1 || echo "$tag: rc=$?"
  echo "$(date +%s.%N) $t0" | awk '{printf "%.1f\n", $1 - $2}' > "$OUT/$tag.wall"
}
doc warm_a "$A" --tier warm --warm-share "$S"
rm -rf "$A"
doc install_b "$B" --tier warm --warm-share "$S" --warm-plan
doc step_b "$B" --tier warm --rewarm
doc stress_b "$B" --tier stress --only model_config,autotune_stress --threads "$THREADS"
python3 - "$OUT" "$S" <<'EOF'
import json, sys
from pathlib import Path
out, share = Path(sys.argv[1]), Path(sys.argv[2])
def run(tag):
    doc = json.loads((out / f"{tag}.json").read_text()) if (out / f"{tag}.json").is_file() else {"probes": []}
    probes = {p["name"]: p for p in doc["probes"]}
    return doc, probes, float((out / f"{tag}.wall").read_text())
(_, a, wa), (_, i, wi), (_, s, ws), (stress, t, wt) = (run(x) for x in ("warm_a", "install_b", "step_b", "stress_b"))
ea, ei, es = (p.get("triton_warm", {}).get("evidence", {}) for p in (a, i, s))
art = next(share.glob("*.tar.gz"), None)
figures = {
    "key": ea.get("key"), "gpu": ea.get("key_parts", {}).get("gpu"),
    "warm_a": {"status": a.get("triton_warm", {}).get("status"), "action": ea.get("action"), "seconds": ea.get("seconds"),
               "kernel_configs_tuned": ea.get("autotune_files_new"), "wall_s": wa, "published": ea.get("published")},
    "artifact": {"bytes": art.stat().st_size if art else None,
                 "files": json.loads(art.with_suffix("").with_suffix(".json").read_text())["files"] if art else None},
    "install_b": {"status": i.get("triton_warm", {}).get("status"), "action": ei.get("action"), "wall_s": wi,
                  "summary": i.get("triton_warm", {}).get("summary"), "refused": ei.get("share_refused")},
    "first_step_b": {"status": s.get("triton_warm", {}).get("status"), "passes": "forward+backward",
                     "layers": f"{es.get('layers_warmed')} of {es.get('layers_full')}",
                     "autotune_files_new": es.get("autotune_files_new"), "seconds": es.get("seconds"),
                     "shapes": es.get("shapes"), "wall_s": ws},
    "stress_b": {"ok": (stress.get("summary") or {}).get("ok"), "status": t.get("autotune_stress", {}).get("status"),
                 "summary": t.get("autotune_stress", {}).get("summary"), "wall_s": wt},
}
if ea.get("seconds") and es.get("seconds"):
    figures["first_step_b"]["vs_cold_warm_a"] = round(es["seconds"] / ea["seconds"], 3)
print(json.dumps(figures, indent=2))
(out / "warm_share.json").write_text(json.dumps(figures, indent=2))
EOF
