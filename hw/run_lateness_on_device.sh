#!/usr/bin/env bash
# One device call (nvidia-h200) for the emulated NIC's schedule and what its host-facing
# engine costs the issuers (docs/testbed.md: the emulator keeps its schedule; the chain within
# 1.5x of the primitives):
#  * the EP2 baseline with the delivering warps' claim as every record ran it (nic_claim=scan,
#    the file's: the table walked 32 entries a step) against the due-mask claim
#    (nic_claim=mask), the mask with
#    deliver_lead_ns 900 / 3000 / 5000: lateness split into claim lag, scan, copies, fence;
#  * the host engine pausing mirror_poll_gap_ns 0 / 2000 / 8000 ns after a pass that saw no
#    new doorbell (its PCIe doorbell reads are what every issuer's system fence waits for):
#    the baseline, the one-warp chain, the levers that cut doorbells and turns, and qp17
#    ownership (16 issuing warps: the model predicts it faster, the testbed ran it slower);
#  * the warp_copy primitives: one warp's copy of a token to its own rank (local_put's loop).
# About 4 minutes with the build. $OUT/records.tgz and $OUT/log.txt come back.
# LEVER_GIT_REV must name the clean 40-hex commit the tree came from.
set -u
cd "$(dirname "$0")/.."
. hw/device_lib.sh
# LEADS, GAPS, LEVERS, FAULTS: the leads and gaps run, the levers run at each gap, and whether
# the faulted run is (a shorter call when device time is short: LEADS=900 GAPS="0 2000" LEVERS=
# FAULTS=, about 3 minutes with the build)
LEADS=${LEADS-"900 3000 5000"} GAPS=${GAPS-"0 2000 8000"} FAULTS=${FAULTS-1}
LEVERS=${LEVERS-"deferred-doorbell-aggregation;batched-doorbells;put-many;lazy-completion-dispatch;qp17-ownership"}
device_start late
build_exts prim  # the EP extension and the primitives (warp_copy) side by side
C="--ranks 2 --gpus 1 --iters 60 --out-dir $REC"
# what a warp pays to copy a token by itself (hw/ep local_put's loop: the emulated platform's
# nvlink.self_copy_step_ns); the record's id names the GPU it ran on
echo "=== primitives warp_copy" | tee -a "$LOG"
timeout 120 python3 -m lever.hw.primitives --gpus 1 --reps 60 --only warp_copy \
  --out "$REC/primitives-warp-copy.json" 2>&1 | tail -8 | tee -a "$LOG"
tar czf "$OUT/records.tgz" -C /tmp late_rec
step smoke 60 --ranks 2 --gpus 1 --iters 5 --warmup 1 --profile 0 --faults --out-dir "$REC/smoke" --id-prefix smoke-late --variants ";write-imm-counting"
if [[ $SMOKE_FAILED == 1 ]]; then echo "=== smoke failed: nothing else run" | tee -a "$LOG"; exit 1; fi
step claim-scan 60 $C --id-prefix emu-late-scan- --variants ";"
for lead in $LEADS; do
  step claim-mask-lead$lead 60 $C --emu-set nic_claim=mask --emu-set deliver_lead_ns=$lead --id-prefix emu-late-mask-lead$lead- --variants ";"
done
for gap in $GAPS; do
  step gap$gap-chain 60 $C --num-sms 1 --set design.warps_per_sm=1 --emu-set mirror_poll_gap_ns=$gap --id-prefix emu-gap$gap-chain --variants ";"
  [[ -n $LEVERS ]] && step gap$gap-levers 150 $C --emu-set mirror_poll_gap_ns=$gap --id-prefix emu-gap$gap- --variants ";$LEVERS"
done
[[ -n $FAULTS ]] && step faults-gap2000 60 $C --faults --emu-set mirror_poll_gap_ns=2000 --id-prefix emu-gap2000-faults- --variants ";write-imm-counting"
metric_table "$REC" late early claim_lag scan copy fence dispatch_post_chain_b1_ns dispatch_post_chain_per_wqe_ns dispatch_credit_read_ns mirrored_wqes_per_iteration_count
tar czf "$OUT/records.tgz" -C /tmp late_rec
echo "done" | tee -a "$LOG"
