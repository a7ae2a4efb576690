#!/usr/bin/env bash
# Same-machine A/B of the shared NIC-layout path (issue 18) against the commit before it:
# EP2 loopback native baseline and batched doorbells, proxy baseline, and the wqe_doorbell
# + shared_queue primitive families, old then new then old again, on one GPU. Needs the old
# tree exported beside this one (OLD=path, e.g. `git archive 26ad9d9`). Logs under $OUT.
set -u
cd "$(dirname "$0")/.."
NEW=$PWD OLD=${OLD:?export the old tree and set OLD}
OUT=${OUT:-/tmp/ab_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16
LOG="$OUT/ab-log.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$LOG"
build() {  # tree tag
  (cd "$1" && LEVER_BUILD_DIR=/tmp/build_$2 PYTHONPATH=/tmp/site:$1 timeout 300 python3 -c \
    'from lever.hw.ep import load_ext; load_ext(); from lever.hw.primitives import load_primitives; load_primitives(); print("built")') \
    >"$OUT/build_$2.log" 2>&1 || tail -20 "$OUT/build_$2.log"
}
build "$OLD" old & build "$NEW" new & wait
round() {  # tree tag round
  local d=$1 t=$2 r=$3 rec=/tmp/ab_rec_${2}_${3}
  mkdir -p "$rec"
  echo "=== $t round $r" | tee -a "$LOG"
  (cd "$d" && export LEVER_BUILD_DIR=/tmp/build_$t PYTHONPATH=/tmp/site:$d LEVER_GIT_REV=ab-$t
   timeout 120 python3 -m lever.cli hw ep --ranks 2 --gpus 1 --iters 60 --profile 0 --variants ";batched-doorbells" \
     --out-dir "$rec" --id-prefix ab-$t-$r- 2>&1 | tee -a "$LOG"
   timeout 90 python3 -m lever.cli hw ep --ranks 2 --gpus 1 --iters 60 --profile 0 --path proxy --variants ";" \
     --out-dir "$rec" --id-prefix ab-$t-$r- 2>&1 | tee -a "$LOG"
   timeout 120 python3 -m lever.hw.primitives --gpus 1 --reps 100 --only wqe_doorbell,shared_queue \
     --out "$rec/prim.json" 2>&1 | grep -E "wqe_fence_doorbell_(host|device)_ns|wqe_store_host|sharedq_owned_sms1_|sharedq_ticket_sms8_|gate" | tee -a "$LOG")
}
round "$OLD" old 1; round "$NEW" new 1; round "$OLD" old 2; round "$NEW" new 2
echo done | tee -a "$LOG"
