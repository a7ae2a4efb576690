#!/usr/bin/env bash
# The testbed that costs what EFA costs, in one call on a single-GPU machine (nvidia-h200):
# build the EP and primitive extensions, then gate and time on the emulated NIC with its
# queues where p5/p5en have them (SQ + doorbell write-combined host memory, CQ in host
# memory; hw/emulated_nic.toml): the baseline and every lever (V1 LL, EP2 on one GPU), the
# other queue placements, the proxy path with 1/2/4 host threads, faults (drops, resends,
# duplicates), two runs whose retries are exhausted (must fail naming the error CQE), the
# unsafe-ordered negative control (must fail its gate), EP4 virtual ranks, and the primitive
# families the chain is compared with; write-with-immediate with its receive CQs in GPU
# memory beside the default host memory (rxdev). A short gated smoke run goes first: if it
# fails, the other steps are skipped. Records and outcome files go to $OUT/records.tgz
# (re-made after every step), the log to $OUT/log.txt. LEVER_GIT_REV must name the clean
# commit the tree came from.
# Usage: hw/run_testbed_on_device.sh [STEPS]  (comma list of smoke,base,place,placedev,chain,levers,proxy,faults,exhaust,unsafe,ep4,late,rxdev,repeat,prim; default all)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/bed_out}
REC=/tmp/bed_rec; rm -rf "$REC"; mkdir -p "$REC" "$OUT"  # a warm machine keeps /tmp: no earlier call's records
. hw/device_lib.sh  # device_env, use_carried_wheels, build_exts, step
device_env
use_carried_wheels
STEPS=${1:-smoke,base,place,chain,levers,proxy,faults,exhaust,unsafe,ep4,late,rxdev,repeat,prim}
ITERS=${ITERS:-60}
LOG="$OUT/log.txt"
has() { [[ ",$STEPS," == *",$1,"* ]]; }
{
  echo "git_rev ${LEVER_GIT_REV:-unset} steps $STEPS iters $ITERS"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
  python3 -c 'from lever.hw.ep import kernel_sources_sha256; print("ep kernel sources sha256", kernel_sources_sha256())'
} 2>&1 | tee -a "$LOG"
if has prim; then build_exts prim; else build_exts; fi
P=emu-bed-ep
C="--ranks 2 --gpus 1 --iters $ITERS --out-dir $REC --id-prefix $P"
LEVERS="lazy-completion-dispatch;lazy-completion-combine;batched-doorbells;qp-fanout-fix;qp17-ownership;write-imm-counting;put-many;deferred-doorbell-aggregation;provider-batched-tail;cached-dispatch;lazy-completion-dispatch,deferred-doorbell-aggregation"
# a short gated run first (faults and write-with-immediate on the default placement): a hang
# or a failed gate shows in seconds, and the other steps are skipped
has smoke && step smoke 60 --ranks 2 --gpus 1 --iters 5 --warmup 1 --profile 0 --faults --out-dir "$REC/smoke" --id-prefix smoke-bed-ep --variants ";write-imm-counting"
if [[ $SMOKE_FAILED == 1 ]]; then STEPS=skipped; echo "=== smoke failed: the other steps are skipped" | tee -a "$LOG"; fi
has base && step base 90 $C --variants ";"
(has place || has placedev) && step place-dev-dev 60 $C --sq device --cq device --variants ";"
has place && step place-host-dev 60 $C --sq host --cq device --variants ";"
has place && step place-dev-host 60 $C --sq device --cq host --variants ";"
# the primitive chain as one posting warp per rank pays it (the primitives' shape: one thread,
# no other warp fencing), with the queues where p5 has them and in GPU memory
has chain && step chain-host 60 $C --num-sms 1 --set design.warps_per_sm=1 --id-prefix $P-chain --variants ";"
has chain && step chain-dev 60 $C --num-sms 1 --set design.warps_per_sm=1 --sq device --cq device --id-prefix $P-chain --variants ";"
has levers && step levers 240 $C --variants "$LEVERS"
for n in 1 4; do
  has proxy && step proxy-t$n 90 $C --path proxy --proxy-threads $n --id-prefix $P-t$n- --variants ";"
done
has faults && step faults 120 $C --faults --variants ";write-imm-counting;cached-dispatch;lazy-completion-dispatch"
has faults && step proxy-faults 90 $C --faults --path proxy --variants ";"
# every packet and ACK dropped: retries run out, the WQE completes with an error CQE, the run
# must fail (rc 1) with the status named; the outcome file says so
has exhaust && step exhaust-native-must-fail 40 --ranks 2 --gpus 1 --emu-set loss_prob=1 --iters 3 --warmup 0 --profile 0 --out "$REC/exhaust.json" --outcome "$REC/retries-exhausted-native-outcome.json"
has exhaust && step exhaust-proxy-must-fail 40 --ranks 2 --gpus 1 --path proxy --emu-set loss_prob=1 --iters 3 --warmup 0 --profile 0 --out "$REC/exhaust-proxy.json" --outcome "$REC/retries-exhausted-proxy-outcome.json"
# ordered flags on the SRD wire (no flush before the signal): the gate must fail. 20 iterations:
# at 5, 1 run in 8 passed its gate at either host-engine pause (h100-7af226c), at 20 none of 16
has unsafe && step unsafe-ordered-must-fail 60 --ranks 2 --gpus 1 --faults --unsafe-ordered --iters 20 --warmup 1 --profile 0 --out "$REC/unsafe.json" --outcome "$REC/unsafe-ordered-outcome.json"
# the emulator's schedule: lateness per packet against the delivery batch
for b in 1 4; do
  has late && step late-b$b 60 $C --emu-set deliver_batch_count=$b --id-prefix $P-late-b$b- --variants ";"
done
# and with every delivering warp fetching between its batches (the fetcher before it had one)
has late && step late-shared 60 $C --emu-set nic_fetcher=shared --id-prefix $P-late-shared- --variants ";"
# write-with-immediate with the receive CQs in GPU memory (the default: host memory, PCIe)
has rxdev && step rxdev 90 $C --rxcq device --variants "write-imm-counting;cached-dispatch"
has rxdev && step rxdev-faults 60 $C --rxcq device --faults --variants "write-imm-counting"
# the baseline again, twice, later in the same call: how far one configuration moves between
# processes of one call, the noise a measured lever delta carries (calibration/adjudication)
has repeat && step repeat-a 60 $C --id-prefix $P-repeat-a --variants ";"
has repeat && step repeat-b 60 $C --id-prefix $P-repeat-b --variants ";"
has ep4 && step ep4-virtual 90 --ranks 4 --gpus 1 --num-sms 12 --iters $ITERS --variants ";" --out-dir "$REC" --id-prefix $P
if has prim; then
  echo "=== primitives" | tee -a "$LOG"
  timeout 240 python3 -m lever.hw.primitives --gpus 1 --reps 100 --only latency,stores_fences,wqe_doorbell,cq_poll \
    --out "$REC/h200-primitives-testbed.json" 2>&1 | tee -a "$LOG"
  echo "=== primitives rc=${PIPESTATUS[0]}" | tee -a "$LOG"
fi
# the chain on the emulated NIC beside the primitives of the same machine
python3 - "$REC" <<'PY' 2>&1 | tee -a "$LOG"
import json, sys, pathlib
d = pathlib.Path(sys.argv[1])
rows = []
for p in sorted(d.glob("emu-bed-*.json")):
    m = json.loads(p.read_text()).get("metrics", {})
    g = lambda k: m.get(k, {}).get("median")
    rows.append((p.stem, g("dispatch_post_chain_b1_ns"), g("dispatch_post_chain_per_wqe_ns"),
                 g("dispatch_credit_check_per_wqe_ns"), g("nic_late_per_packet_ns"), g("nic_early_per_packet_ns"),
                 g("nic_claim_lag_per_packet_ns"), g("nic_deliver_per_packet_ns"),
                 g("drops_per_iteration_count"), g("duplicates_per_iteration_count")))
print(f"{'record':58s} {'b1 chain':>9s} {'chain/wqe':>9s} {'credit':>9s} {'late':>9s} {'early':>9s} {'claimlag':>9s} "
      f"{'deliver':>9s} {'drops':>9s} {'dups':>9s}")
for r in rows:
    print(f"{r[0][:58]:58s} " + " ".join(f"{x:9.1f}" if isinstance(x, float) else f"{'-':>9s}" for x in r[1:]))
pr = d / "h200-primitives-testbed.json"
if pr.exists():
    m = json.loads(pr.read_text())["metrics"]
    for k in ("pcie_read_rtt_ns", "wqe_fence_doorbell_host_ns", "wqe_fence_doorbell_device_ns", "fence_system_after_host_store_ns",
              "fence_system_after_device_store_ns", "cq_seen_host_mem_block_agent_ns", "cq_seen_device_mem_block_agent_ns"):
        if k in m:
            print(f"primitive {k:45s} {m[k]['median']:9.1f}")
PY
ls -R "$REC" | tee -a "$LOG"
tar czf "$OUT/records.tgz" -C /tmp bed_rec
echo "done" | tee -a "$LOG"
