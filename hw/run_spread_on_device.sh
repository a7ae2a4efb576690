#!/usr/bin/env bash
# One device call: what keeps the emulated NIC's delivering warps behind their schedule
# (docs/testbed.md, "More SMs a NIC"). Six or seven warps on one SM deliver a NIC's packets,
# about 6 us a batch of two (claim 1.6, copies 2.6, fence 1.7-2.3); the setting closest to
# the schedule (due mask 8 us ahead, batches of two, staged copies) is 0.70-1.48 us late.
#  * the fence after a batch's copies as fence.sc (every record) and as a release fence
#    (`nic_fence = "release"`: the completions after it are stores), alternately, REPEATS
#    times with the shared fetch, once each with the dedicated fetcher;
#  * the same NIC spread over twice the SMs: 8 NIC blocks a rank at 50 Gb/s each (the same
#    100 Gb/s x 4 a rank, half the packets a block), the shared fetch, at LEADS8 (ns ahead),
#    with each fence;
#  * a faulted smoke run through the gate with the release fence.
# About 4 minutes with the build. $OUT/records.tgz and $OUT/log.txt come back.
# LEVER_GIT_REV must name the clean 40-hex commit the tree came from.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/spread_out}
REC=/tmp/spread_rec; mkdir -p "$REC" "$OUT"
. hw/device_lib.sh
REPEATS=${REPEATS-3}
LEADS8=${LEADS8-"4000 8000"}
device_env
use_carried_wheels
LOG="$OUT/log.txt"
log_header
build_exts
step smoke-release 60 --ranks 2 --gpus 1 --iters 5 --warmup 1 --profile 0 --faults --out-dir "$REC/smoke" \
  --emu-set nic_fence=release --emu-set nic_copy=staged --id-prefix smoke-release --variants ";write-imm-counting"
C="--ranks 2 --gpus 1 --iters 60 --out-dir $REC --emu-set nic_copy=staged --emu-set nic_claim=mask --emu-set deliver_batch_count=2"
for i in $(seq 1 "$REPEATS"); do
  for fence in sc release; do
    step n4-$fence-shared-r$i 60 $C --emu-set deliver_lead_ns=8000 --emu-set nic_fetcher=shared \
      --emu-set nic_fence=$fence --id-prefix emu-spread-n4-lead8000-$fence-shared-r$i- --variants ";"
  done
done
for fence in sc release; do
  step n4-$fence-dedicated 60 $C --emu-set deliver_lead_ns=8000 --emu-set nic_fetcher=dedicated \
    --emu-set nic_fence=$fence --id-prefix emu-spread-n4-lead8000-$fence-dedicated-r1- --variants ";"
done
for lead in $LEADS8; do
  for fence in sc release; do
    step n8-lead$lead-$fence 60 $C --emu-set nics_per_rank=8 --emu-set line_rate_gbps=50 \
      --emu-set deliver_lead_ns=$lead --emu-set nic_fetcher=shared --emu-set nic_fence=$fence \
      --id-prefix emu-spread-n8-lead$lead-$fence-shared-r1- --variants ";"
  done
done
python3 - "$REC" <<'PY' 2>&1 | tee -a "$LOG"
import json, sys, pathlib
d = pathlib.Path(sys.argv[1])
print(f"{'record':52s} {'disp':>7s} {'comb':>7s}" + "".join(f" {k:>8s}" for k in ("late", "early", "clag", "scan", "copy", "fence")))
for p in sorted(d.glob("emu-*.json")):
    j = json.loads(p.read_text())
    m, lat = j.get("metrics", {}), j.get("latency_us", {})
    g = lambda k: m.get(k, {}).get("median", float("nan"))
    vals = [g(f"nic_{k}_per_packet_ns") for k in ("late", "early", "claim_lag", "scan", "copy", "fence")]
    print(f"{p.stem[:52]:52s} {lat.get('dispatch', {}).get('median', 0):7.1f} {lat.get('combine', {}).get('median', 0):7.1f}"
          + "".join(f" {v:8.0f}" for v in vals))
PY
tar czf "$OUT/records.tgz" -C /tmp spread_rec
echo "done" | tee -a "$LOG"
