#!/usr/bin/env bash
# The fence primitives (hw/primitives/fence_reads.cu: fences under host reads, and W warps
# fencing at once) and, on the device CPUs, the joint refit with the emulated platform's
# gpu.fence_ns held at its primitive value (1448 ns, not free): does the 2.85 us fit stand
# for fences contending with each other? $OUT: log.txt, h200-primitives-fence-reads.json,
# pinned.tgz (the refit's platforms and every held-out check, benchmarks/refit_on_device.sh).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fence_out}
mkdir -p "$OUT"
. hw/device_lib.sh
device_env
use_carried_wheels
LOG=$OUT/log.txt
t0=$(date +%s)
timeout 300 python3 -m lever.hw.primitives --gpus 1 --reps 60 --only fence_reads \
  --out "$OUT/h200-primitives-fence-reads.json" 2>&1 | tail -3 | tee -a "$LOG"
echo "primitives wall $(( $(date +%s) - t0 ))s" | tee -a "$LOG"
python3 - "$OUT/h200-primitives-fence-reads.json" <<'PY' 2>&1 | tee -a "$LOG"
import json, sys
for k, v in sorted(json.load(open(sys.argv[1]))["metrics"].items()):
    if "concurrent" in k or "_w0_" in k:
        print(f"{k:40s} median {v['median']:9.1f} p10 {v['p10']:9.1f} p90 {v['p90']:9.1f}")
PY
if [[ "${SKIP_REFIT:-0}" != 1 ]]; then
  python3 - <<'PY'
import re, pathlib
p = pathlib.Path("scenarios/platforms/emulated-nvlink.toml")
s = p.read_text()
s2 = re.sub(r'\[platform\.free\."gpu\.fence_ns"\]\n(?:[^\[\n].*\n)*', "", s, count=1)
assert s2 != s
p.write_text(s2)
print("gpu.fence_ns pinned at its primitive value on emulated-nvlink")
PY
  OUT=$OUT/pinned bash benchmarks/refit_on_device.sh 2>&1 | tee -a "$LOG"
  tar czf "$OUT/pinned.tgz" -C "$OUT" pinned && rm -rf "$OUT/pinned"
fi
echo "done $(( $(date +%s) - t0 ))s" | tee -a "$LOG"
