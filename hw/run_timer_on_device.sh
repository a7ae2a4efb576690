#!/usr/bin/env bash
# One device call: what the emulated NIC's own timestamps cost its delivering warps
# (docs/testbed.md, "What a timestamp costs"). A delivering warp reads %globaltimer five times
# a batch, three of them only to time the batch's parts (claim, copies, fence); if a read costs
# a good part of a microsecond, those reads are a share of the batch (6 us for two packets)
# that keeps the emulator behind its schedule.
#  * the latency primitives, with globaltimer_read_ns (a read, back to back) and
#    globaltimer_step_ns (how far the timer moves when it moves);
#  * the EP2 baseline with the due mask 8 us ahead, batches of two, staged copies, the shared
#    fetch (the setting closest to the schedule so far), part timers on and off alternately,
#    REPEATS times each; then the dedicated fetcher, on and off, once each;
#  * COMBOS: the EP2 lever sets sealed at 8ec370b and their baselines (README, "Two more
#    combinations, sealed"), as hw/run_host_engine_on_device.sh runs levers (the same ids);
#    COMBOS= leaves them out.
# About 4 minutes with the build. $OUT/records.tgz and $OUT/log.txt come back.
# LEVER_GIT_REV must name the clean 40-hex commit the tree came from.
set -u
cd "$(dirname "$0")/.."
. hw/device_lib.sh
REPEATS=${REPEATS-3}
COMBOS=${COMBOS-"lazy-completion-dispatch;lazy-completion-dispatch,lazy-completion-combine;put-many;put-many,qp-fanout-fix"}
device_start timer
build_exts prim
echo "=== primitives latency" | tee -a "$LOG"
timeout 120 python3 -m lever.hw.primitives --gpus 1 --reps 100 --only latency \
  --out "$REC/primitives-latency.json" 2>&1 | tail -8 | tee -a "$LOG"
tar czf "$OUT/records.tgz" -C /tmp timer_rec
C="--ranks 2 --gpus 1 --iters 60 --out-dir $REC --emu-set nic_copy=staged --emu-set nic_claim=mask --emu-set deliver_lead_ns=8000"
for i in $(seq 1 "$REPEATS"); do
  for t in on off; do
    step shared-timers-$t-r$i 60 $C --emu-set nic_fetcher=shared --emu-set nic_part_timers=$t \
      --id-prefix emu-timers-$t-shared-r$i- --variants ";"
  done
done
for t in on off; do
  step dedicated-timers-$t 60 $C --emu-set nic_part_timers=$t --id-prefix emu-timers-$t-dedicated-r1- --variants ";"
done
[[ -n $COMBOS ]] && step combos 300 --ranks 2 --gpus 1 --iters 40 --out-dir "$REC" --id-prefix emu-host- --variants ";$COMBOS"
python3 - "$REC/primitives-latency.json" <<'PY' 2>&1 | tee -a "$LOG"
import json, sys, pathlib
p = pathlib.Path(sys.argv[1])
if p.exists():
    m = json.loads(p.read_text())["metrics"]
    for k in ("globaltimer_read_ns", "globaltimer_step_ns", "device_load_ns"):
        if k in m:
            print(f"{k:24s} median {m[k]['median']:.1f} p10 {m[k]['p10']:.1f} p90 {m[k]['p90']:.1f}")
PY
metric_table "$REC" late early claim_lag deliver
tar czf "$OUT/records.tgz" -C /tmp timer_rec
echo "done" | tee -a "$LOG"
