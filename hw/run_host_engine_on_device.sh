#!/usr/bin/env bash
# One device call: what the emulated NIC's host-facing engine does per iteration, for the
# baseline and every V1 lever of the testbed (docs/testbed.md, "The host engine's passes").
# The engine reads every host doorbell it serves in one pass, then copies the new WQEs of each
# QP whose doorbell moved (one copy per moved QP, however many WQEs were rung on it since the
# last pass), then writes CQEs. The counters say how many copies a pass makes and a WQE needs,
# and what a pass, a copy and a CQE cost: the model's nic.host_engine is priced from them.
# About 3 minutes with the build. $OUT/records.tgz and $OUT/log.txt come back.
# LEVER_GIT_REV must name the clean 40-hex commit the tree came from.
set -u
cd "$(dirname "$0")/.."
. hw/device_lib.sh
# LEVERS: the EP2 lever sets run beside the baseline (a set's levers joined by ","); EP4_LEVERS:
# lever sets run at EP4 on the GPU (4 ranks, 12 SMs each) beside its baseline, none when empty;
# CHAIN=: leave out the one-warp chain
LEVERS=${LEVERS-"qp17-ownership;deferred-doorbell-aggregation;batched-doorbells;put-many;lazy-completion-dispatch;qp-fanout-fix;provider-batched-tail"}
EP4_LEVERS=${EP4_LEVERS-} CHAIN=${CHAIN-1}
device_start host
build_exts
C="--ranks 2 --gpus 1 --iters 40 --out-dir $REC"
step smoke 60 --ranks 2 --gpus 1 --iters 5 --warmup 1 --profile 0 --faults --out-dir "$REC/smoke" --id-prefix smoke-host --variants ";qp17-ownership"
if [[ $SMOKE_FAILED == 1 ]]; then echo "=== smoke failed: nothing else run" | tee -a "$LOG"; exit 1; fi
[[ -n $CHAIN ]] && step chain 60 $C --num-sms 1 --set design.warps_per_sm=1 --id-prefix emu-host-chain --variants ";"
step levers 300 $C --id-prefix emu-host- --variants ";$LEVERS"
[[ -n $EP4_LEVERS ]] && step ep4 200 --ranks 4 --gpus 1 --num-sms 12 --iters 40 --out-dir $REC --id-prefix emu-host-ep4-sms12- --variants ";$EP4_LEVERS"
python3 - "$REC" <<'PY' 2>&1 | tee -a "$LOG"
import json, sys, pathlib
d = pathlib.Path(sys.argv[1])
keys = ("mirrored_wqes_per_iteration_count", "host_passes_per_iteration_count", "host_qp_copies_per_iteration_count",
        "host_read_per_pass_ns", "host_copy_per_qp_copy_ns", "host_cqe_pass_per_cqe_ns", "host_read_share_ratio",
        "host_copy_share_ratio", "host_cqe_share_ratio", "host_idle_share_ratio", "nic_late_per_packet_ns",
        "dispatch_credit_read_qp0_ns", "dispatch_credit_read_dataqps_ns", "combine_credit_read_qp0_ns",
        "combine_credit_read_dataqps_ns")
print(f"{'record':44s} {'disp':>7s} {'comb':>7s} " + " ".join(f"{k.split('_')[0][:4]}_{k.split('_')[1][:5]:5s}" for k in keys))
for p in sorted(d.glob("emu-*.json")):
    j = json.loads(p.read_text())
    m, lat = j.get("metrics", {}), j.get("latency_us", {})
    g = lambda k: m.get(k, {}).get("median", float("nan"))
    print(f"{p.stem[:44]:44s} {lat.get('dispatch', {}).get('median', 0):7.1f} {lat.get('combine', {}).get('median', 0):7.1f} "
          + " ".join(f"{g(k):10.3f}" for k in keys))
PY
tar czf "$OUT/records.tgz" -C /tmp host_rec
echo "done" | tee -a "$LOG"
