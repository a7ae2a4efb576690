#!/usr/bin/env bash
# DeepEP V2 on the emulated SRD NIC, 2 emulated nodes x 2 ranks on one GPU: build, gate and
# measure V2 hybrid native and proxy (baseline, every lever as a flag, with and without
# --faults), V2 direct, and the unsafe-ordered negative control (must fail its gate).
# One call on the device machine (nvidia-h200): every step bounded by `timeout`, logged to
# $OUT/log.txt; a failing step does not stop the others; records come back in one tarball.
# Records name their commit: set LEVER_GIT_REV to the clean 40-hex commit the tree came from.
# rxdev: write-with-immediate counting with the receive CQs in GPU memory, beside the default
# (host memory, polled through PCIe).
# Usage: hw/run_v2_on_device.sh [STEPS]  (comma list of smoke,hybrid,levers,proxy,faults,direct,unsafe,rxdev)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/v2_out}
REC=/tmp/v2_rec; rm -rf "$REC"; mkdir -p "$REC" "$OUT"  # a warm machine keeps /tmp: no earlier call's records
STEPS=${1:-smoke,hybrid,levers,proxy,faults,direct,unsafe,rxdev}
ITERS=${ITERS:-60}
. hw/device_lib.sh  # device_env, use_carried_wheels, step
device_env
use_carried_wheels
LOG="$OUT/log.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv | tee -a "$LOG"
has() { [[ ",$STEPS," == *",$1,"* ]]; }
t0=$(date +%s)
timeout 400 python3 -c 'from lever.hw.ep import load_ext; m = load_ext(); print("built", m.layout_sizes(), m.v2_layout_sizes())' 2>&1 | tail -20 | tee -a "$LOG"
echo "=== build wall=$(( $(date +%s) - t0 ))s" | tee -a "$LOG"
H="--protocol v2-hybrid --ranks 4 --ranks-per-node 2 --gpus 1 --out-dir $REC"
D="--protocol v2-direct --ranks 4 --ranks-per-node 2 --gpus 1 --out-dir $REC"
LEVERS="lazy-completion-dispatch;lazy-completion-combine;batched-doorbells;qp-fanout-fix;qp17-ownership;write-imm-counting;put-many;deferred-doorbell-aggregation;cached-dispatch;scaleout-update-interval"
# a short gated run of each protocol first: a hang or a failed gate shows in seconds
has smoke && step smoke-hybrid 90 $H --faults --iters 5 --warmup 1 --profile 0 --variants ";write-imm-counting" --id-prefix smoke-v2-hybrid
has smoke && step smoke-direct 90 $D --path proxy --iters 5 --warmup 1 --profile 0 --variants ";" --id-prefix smoke-v2-direct
# a failed smoke step stops here: the full steps would only run into the same failure
if [[ $SMOKE_FAILED == 1 ]]; then STEPS=unsafe-skipped; echo "=== smoke failed: full steps skipped" | tee -a "$LOG"; fi
has hybrid && step hybrid 90 $H --iters $ITERS --variants ";"
has levers && step levers 240 $H --iters $ITERS --variants "$LEVERS"
has proxy && step proxy 150 $H --path proxy --iters $ITERS --variants ";lazy-completion-dispatch;scaleout-update-interval;cached-dispatch"
has faults && step faults 150 $H --faults --iters $ITERS --variants ";write-imm-counting;cached-dispatch;scaleout-update-interval"
has faults && step proxy-faults 90 $H --faults --path proxy --iters $ITERS --variants ";"
has direct && step direct 120 $D --iters $ITERS --variants ";cached-dispatch"
has direct && step direct-faults 90 $D --faults --iters $ITERS --variants ";"
has direct && step direct-proxy 90 $D --path proxy --iters $ITERS --variants ";"
has rxdev && step rxdev 90 $H --rxcq device --iters $ITERS --variants "write-imm-counting"
has rxdev && step rxdev-faults 90 $H --rxcq device --faults --iters $ITERS --variants "write-imm-counting"
# the negative control: tails right after the data (no flush) on a lossy SRD wire must fail the gate
has unsafe && step unsafe-ordered-must-fail 90 $H --faults --unsafe-ordered --iters 20 --warmup 2 --profile 0 --out "$OUT/unsafe-ordered.json"
ls "$REC" | tee -a "$LOG"
tar czf "$OUT/records.tgz" -C /tmp v2_rec
echo "done" | tee -a "$LOG"
