#!/usr/bin/env bash
# One device call (nvidia-h200) for what a lever delta's noise is and where the emulator's
# lateness goes (issues 15 and 17):
#  * the V1 lever set with its baseline in the same process, three times, each round followed
#    by a baseline-only process (hw/ep.py ids emu-noise-r{1,2,3}-* and emu-noise-base-r*): the
#    repeats calibration/repro.py pools into the run-to-run sd of one configuration;
#  * the baseline at deliver_lead_ns 900 (the file's), 3000 and 6000 with the lateness split
#    into the claim scan, the copies and the fence (ST_NIC_SCAN/COPY/FENCE_NS);
#  * the fence_reads primitives: one warp's system fence while W warps poll host memory, the
#    same lines or their own, on its SM or another (sim/issuer.py HostReadPath, CqReadQueue).
# About 5 minutes with the build. $OUT/records.tgz and $OUT/log.txt come back.
# LEVER_GIT_REV must name the clean 40-hex commit the tree came from.
set -u
cd "$(dirname "$0")/.."
. hw/device_lib.sh
device_start noise
build_exts prim
C="--ranks 2 --gpus 1 --iters 60 --out-dir $REC"
LEVERS="lazy-completion-dispatch;lazy-completion-combine;batched-doorbells;qp-fanout-fix;write-imm-counting;put-many;deferred-doorbell-aggregation;provider-batched-tail;cached-dispatch;lazy-completion-dispatch,deferred-doorbell-aggregation"
step smoke 60 --ranks 2 --gpus 1 --iters 5 --warmup 1 --profile 0 --out-dir "$REC/smoke" --id-prefix smoke-noise --variants ";"
if [[ $SMOKE_FAILED == 1 ]]; then echo "=== smoke failed: nothing else run" | tee -a "$LOG"; exit 1; fi
for lead in 900 3000 6000; do
  step late-lead$lead 60 $C --emu-set deliver_lead_ns=$lead --id-prefix emu-late-lead$lead- --variants ";"
done
for r in 1 2 3; do
  step noise-levers-r$r 150 $C --id-prefix emu-noise-r$r- --variants ";$LEVERS"
  step noise-base-r$r 60 $C --id-prefix emu-noise-base-r$r- --variants ";"
done
echo "=== primitives fence_reads" | tee -a "$LOG"
timeout 200 python3 -m lever.hw.primitives --gpus 1 --reps 60 --only fence_reads \
  --out "$REC/h200-primitives-fence-reads.json" 2>&1 | tail -5 | tee -a "$LOG"
python3 - "$REC" <<'PY' 2>&1 | tee -a "$LOG"
import json, sys, pathlib
d = pathlib.Path(sys.argv[1])
for p in sorted(d.glob("emu-*.json")):
    j = json.loads(p.read_text())
    m, lat = j.get("metrics", {}), j.get("latency_us", {})
    g = lambda k: m.get(k, {}).get("median", float("nan"))
    print(f"{p.stem[:60]:60s} d {lat.get('dispatch', {}).get('median', 0):8.1f} c {lat.get('combine', {}).get('median', 0):8.1f}"
          + "".join(f" {k} {g(f'nic_{k}_per_packet_ns'):7.0f}" for k in ("late", "early", "claim_lag", "scan", "copy", "fence", "deliver")))
pr = d / "h200-primitives-fence-reads.json"
if pr.exists():
    for k, v in sorted(json.loads(pr.read_text())["metrics"].items()):
        print(f"primitive {k:45s} median {v['median']:9.1f} p90 {v['p90']:9.1f}")
PY
tar czf "$OUT/records.tgz" -C /tmp noise_rec
echo "done" | tee -a "$LOG"
