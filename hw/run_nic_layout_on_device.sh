#!/usr/bin/env bash
# One call on a single-GPU machine (nvidia-h200): build the EP and primitive extensions,
# then run the emulated-NIC gates through the shared NIC-layout path (issue 18): EP2 on one
# GPU, native and proxy, the levers, faults, the unsafe-ordered negative control (must
# fail), EP4 virtual ranks, and the primitive families that build WQEs / poll CQEs.
# Records, logs and the machine description go into $OUT/records.tgz and $OUT/log.txt.
# LEVER_GIT_REV must name the clean commit the tree was copied from.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/nic_out}
REC=/tmp/nic_rec; rm -rf "$REC"; mkdir -p "$REC" "$OUT"  # a warm machine keeps /tmp: no earlier call's records
. hw/device_lib.sh  # device_env, build_exts (its own step() below)
device_env
ITERS=${ITERS:-60}
LOG="$OUT/log.txt"
{
  echo "git_rev ${LEVER_GIT_REV:-unset}"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  nvidia-smi topo -m 2>&1 | head -4
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
  python3 -c 'from lever.hw.ep import kernel_sources_sha256; print("ep kernel sources sha256", kernel_sources_sha256())'
} 2>&1 | tee -a "$LOG"
build_exts prim
step() {  # name, timeout, args...
  local name=$1 to=$2; shift 2
  echo "=== $name: lever hw ep $*" | tee -a "$LOG"
  local s0=$(date +%s)
  timeout "$to" python3 -m lever.cli hw ep "$@" 2>&1 | tee -a "$LOG"
  echo "=== $name rc=${PIPESTATUS[0]} wall=$(( $(date +%s) - s0 ))s" | tee -a "$LOG"
}
C="--ranks 2 --gpus 1 --iters $ITERS --out-dir $REC"
LEVERS="lazy-completion-dispatch;batched-doorbells;qp-fanout-fix;qp17-ownership;write-imm-counting;put-many;deferred-doorbell-aggregation;provider-batched-tail;cached-dispatch"
step base 120 $C --variants ";$LEVERS" --id-prefix emu-layout-loop-ep
step proxy 120 $C --path proxy --variants ";lazy-completion-dispatch" --id-prefix emu-layout-loop-ep
step faults 120 $C --faults --variants ";write-imm-counting;cached-dispatch" --id-prefix emu-layout-loop-ep
step proxy-faults 90 $C --faults --path proxy --variants ";" --id-prefix emu-layout-loop-ep
step unsafe-ordered-must-fail 60 --ranks 2 --gpus 1 --faults --unsafe-ordered --iters 5 --warmup 1 --profile 0 --out "$REC/unsafe-ordered.json"
step ep4-virtual 90 --ranks 4 --gpus 1 --num-sms 12 --iters $ITERS --variants ";" --out-dir "$REC" --id-prefix emu-layout-loop-ep
echo "=== primitives" | tee -a "$LOG"
timeout 240 python3 -m lever.hw.primitives --gpus 1 --reps 100 --only wqe_doorbell,shared_queue,cq_poll \
  --out "$REC/h200-primitives-layout.json" 2>&1 | tee -a "$LOG"
echo "=== primitives rc=${PIPESTATUS[0]}" | tee -a "$LOG"
ls "$REC" | tee -a "$LOG"
tar czf "$OUT/records.tgz" -C /tmp nic_rec
echo "done" | tee -a "$LOG"
