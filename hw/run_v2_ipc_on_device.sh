#!/usr/bin/env bash
# V2 over EFA's IPC path on a real GPU (no EFA needed): NPROC processes under torchrun (default
# 2, on one H200: two processes on one device) exchange CUDA IPC handles of their V2 allocation
# over torch.distributed (gloo), map each other's (hw/ep_ipc.py, the V2 EFA runner's exchange;
# hw/ep/ipc.h, the EP binding's IPC calls), store words, arrival counts and release flags through
# the mapped pointers as V2's same-node traffic does, check them, run a negative control and
# close every mapping before the allocations go (hw/ipc_probe.py says what each step proves).
# Outcome: $OUT/v2_ipc_outcome.json (rank 0), log in $OUT/log.txt. Bounded: 80 s in all.
# Usage (device machine, repository root): OUT=... [NPROC=2] [EP_BINDING=1] hw/run_v2_ipc_on_device.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/v2_ipc_out}
mkdir -p "$OUT"
. hw/device_lib.sh  # device_env, use_carried_wheels
device_env
use_carried_wheels
LOG="$OUT/log.txt"
nvidia-smi --query-gpu=name,driver_version,compute_mode --format=csv | tee -a "$LOG"
t0=$(date +%s)
timeout 80 python3 -m torch.distributed.run --standalone --nproc-per-node "${NPROC:-2}" -m lever.hw.ipc_probe \
    --out "$OUT/v2_ipc_outcome.json" --timeout-s 40 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
echo "=== v2-ipc rc=$rc wall=$(( $(date +%s) - t0 ))s" | tee -a "$LOG"
# EP_BINDING=1: again with the IPC calls through the EP extension's pybind11 ipc_* (what the V2 EFA
# runner calls); builds the EP extension first (minutes: outside the 90 s of the probe itself)
if [[ ${EP_BINDING:-0} == 1 ]]; then
  t1=$(date +%s)
  timeout 400 python3 -c 'from lever.hw.ep import load_ext; m = load_ext(); print("ep built", hasattr(m, "ipc_open"))' 2>&1 | tail -3 | tee -a "$LOG"
  timeout 80 python3 -m torch.distributed.run --standalone --nproc-per-node "${NPROC:-2}" -m lever.hw.ipc_probe \
      --ep-binding --out "$OUT/v2_ipc_outcome_ep_binding.json" --timeout-s 40 2>&1 | tee -a "$LOG"
  rc2=${PIPESTATUS[0]}
  echo "=== v2-ipc ep-binding rc=$rc2 wall=$(( $(date +%s) - t1 ))s" | tee -a "$LOG"
  [[ $rc == 0 ]] && rc=$rc2
fi
exit "$rc"
