#!/usr/bin/env bash
# One device call: the delivering warps' staged copies against their register copies
# (docs/testbed.md, "Staged copies"), and the EP2 lever combinations sealed before any run of
# them (README, "Three lever combinations").
#  * staged: `nic_copy = "staged"` (hw/emulated_nic.toml) loads every packet of a delivery
#    batch into the warp's slice of dynamic shared memory with cp.async at once, then stores
#    them: one round trip of loads a batch instead of one a packet. Run beside `one` (every
#    record so far) on the EP2 baseline: the table walk 0.9 us ahead as shipped, the due mask
#    8 us ahead (the least lateness so far, 1.6-1.8 us) with batches of 2 and 4, and a faulted
#    smoke run through the gate with staged copies;
#  * combos: the baseline and lever sets of the three sealed combinations, as
#    hw/run_host_engine_on_device.sh runs its levers (the same ids).
# About 5 minutes with the build. $OUT/records.tgz and $OUT/log.txt come back.
# LEVER_GIT_REV must name the clean 40-hex commit the tree came from.
set -u
cd "$(dirname "$0")/.."
. hw/device_lib.sh
# COMBOS: the EP2 lever sets run beside the baseline (none when empty); STAGED=: leave out the
# copy comparison; COPIES: the copies compared; BATCHES: the delivery batches run with the due
# mask; LEADS: its leads (ns); FETCHERS: the NIC's fetch (dedicated as shipped, shared: the
# fetching warp delivers too); REPEATS: runs of each; SCAN=: leave out the table walk as
# shipped; LEAD3000=: leave out the staged mask 3 us ahead. The shared-fetch runs of
# docs/testbed.md ("A shared fetch"): COMBOS= SCAN= LEAD3000= COPIES=staged BATCHES=2
# FETCHERS="shared dedicated" REPEATS=5
COMBOS=${COMBOS-"put-many;put-many,lazy-completion-dispatch;put-many,lazy-completion-combine;lazy-completion-dispatch;lazy-completion-dispatch,batched-doorbells"}
STAGED=${STAGED-1} COPIES=${COPIES-"one staged"} BATCHES=${BATCHES-"2 4"} LEADS=${LEADS-8000}
FETCHERS=${FETCHERS-dedicated} REPEATS=${REPEATS-1} SCAN=${SCAN-1} LEAD3000=${LEAD3000-1}
device_start staged
build_exts
step smoke-staged 60 --ranks 2 --gpus 1 --iters 5 --warmup 1 --profile 0 --faults --out-dir "$REC/smoke" \
  --emu-set nic_copy=staged --id-prefix smoke-staged --variants ";write-imm-counting"
if [[ $SMOKE_FAILED == 1 ]]; then echo "=== smoke failed: staged copies left out" | tee -a "$LOG"; STAGED=; fi
C="--ranks 2 --gpus 1 --iters 60 --out-dir $REC"
if [[ -n $STAGED ]]; then
  for copy in $COPIES; do
    [[ -n $SCAN ]] && step scan-$copy 60 $C --emu-set nic_copy=$copy --id-prefix emu-copy-$copy-scan- --variants ";"
    for lead in $LEADS; do for b in $BATCHES; do for fetch in $FETCHERS; do for i in $(seq 1 "$REPEATS"); do
      # ids as the first call named them (emu-copy-COPY-maskLEAD-bB-) unless a fetch or repeats are asked
      id=emu-copy-$copy-mask$lead-b$b-
      [[ $FETCHERS != dedicated || $REPEATS != 1 ]] && id=$id$fetch-r$i-
      step mask$lead-b$b-$copy-$fetch-r$i 60 $C --emu-set nic_copy=$copy --emu-set nic_claim=mask \
        --emu-set deliver_lead_ns=$lead --emu-set deliver_batch_count=$b --emu-set nic_fetcher=$fetch \
        --id-prefix $id --variants ";"
    done; done; done; done
  done
  [[ -n $LEAD3000 ]] && step mask3000-b2-staged 60 $C --emu-set nic_copy=staged --emu-set nic_claim=mask --emu-set deliver_lead_ns=3000 \
    --id-prefix emu-copy-staged-mask3000-b2- --variants ";"
fi
[[ -n $COMBOS ]] && step combos 300 --ranks 2 --gpus 1 --iters 40 --out-dir "$REC" --id-prefix emu-host- --variants ";$COMBOS"
metric_table "$REC" late early claim_lag scan copy fence
tar czf "$OUT/records.tgz" -C /tmp staged_rec
echo "done" | tee -a "$LOG"
