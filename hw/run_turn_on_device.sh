#!/usr/bin/env bash
# The doorbell-turn hand-off primitives (hw/primitives/turn_handoff.cu): what passing a shared
# QP's turn costs, at system and GPU scope, alone and with warps reading host memory beside
# it. $OUT: log.txt, primitives-turn-handoff.json (a record; LEVER_GIT_REV names the commit).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/turn_out}
mkdir -p "$OUT"
. hw/device_lib.sh
device_env
use_carried_wheels
LOG=$OUT/log.txt
log_header
t0=$(date +%s)
timeout 400 python3 -m lever.hw.primitives --gpus 1 --reps ${REPS:-100} --only turn_handoff \
  --out "$OUT/primitives-turn-handoff.json" 2>&1 | tail -3 | tee -a "$LOG"
echo "primitives wall $(( $(date +%s) - t0 ))s" | tee -a "$LOG"
python3 - "$OUT/primitives-turn-handoff.json" <<'PY' 2>&1 | tee -a "$LOG"
import json, sys
d = json.load(open(sys.argv[1]))
print(d["what"]["platform"]["gpu"], "gate", d["gate"]["passed"])
for k, v in sorted(d["metrics"].items()):
    print(f"{k:44s} median {v['median']:9.1f} p10 {v['p10']:9.1f} p90 {v['p90']:9.1f}")
PY
