#!/usr/bin/env bash
# One call on a single-GPU machine (nvidia-h200): the EP kernels' newer-generation paths on
# the emulated NIC (hw/efa/README.md "Newer device generations"): 128-byte WQEs with
# inline RDMA writes (what rdma-core v63 makes) and the send credit read from a completion
# counter (after v64), each against the v59 control in the same call. Every variant must
# pass the emulated runs' gate (outputs equal the reference, in-kernel stamps, bounded polls);
# an inline or counter path that is wrong fails the gate (ERR_BAD_WQE: the NIC checks every
# 128-byte WQE it parses; a wrong credit: ERR_TIMEOUT_CQ or overwritten WQEs).
# Records, logs and the machine description go into $OUT/records.tgz and $OUT/log.txt.
# LEVER_GIT_REV must name the clean commit the tree was copied from.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/efa128_out}
REC=/tmp/efa128_rec; rm -rf "$REC"; mkdir -p "$REC" "$OUT"  # a warm machine keeps /tmp: no earlier call's records
. hw/device_lib.sh  # device_env, build_exts, step
device_env
use_carried_wheels
ITERS=${ITERS:-30}
LOG="$OUT/log.txt"
{
  echo "git_rev ${LEVER_GIT_REV:-unset}"
  nvidia-smi --query-gpu=name,driver_version --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
} 2>&1 | tee -a "$LOG"
build_exts
C="--ranks 2 --gpus 1 --iters $ITERS --out-dir $REC --id-prefix emu-gen-ep"
V=";lazy-completion-dispatch;batched-doorbells;put-many;write-imm-counting;provider-batched-tail"
W128="--emu-set wqe_size_bytes=128 --emu-set inline_write_bytes=80"
CNTR="--emu-set send_completions=counter"
step smoke-v59 120 $C --variants "$V"
step smoke-wqe128 120 $C $W128 --variants "$V"
step smoke-cntr 120 $C $CNTR --variants "$V"
step smoke-wqe128-cntr 120 $C $W128 $CNTR --variants "$V;qp17-ownership;deferred-doorbell-aggregation"
step smoke-wqe128-cntr-sqdev 90 $C $W128 $CNTR --sq device --cq device --variants ";put-many"
step smoke-wqe128-cntr-faults 120 $C $W128 $CNTR --faults --variants ";write-imm-counting"
step smoke-wqe128-proxy 90 $C $W128 --path proxy --variants ";lazy-completion-dispatch"
step smoke-wqe128-cntr-ep4 90 --ranks 4 --gpus 1 --num-sms 12 --iters $ITERS --out-dir "$REC" \
  --id-prefix emu-gen-ep $W128 $CNTR --variants ";"
ls "$REC" | tee -a "$LOG"
echo "smoke_failed $SMOKE_FAILED" | tee -a "$LOG"
echo "done" | tee -a "$LOG"
