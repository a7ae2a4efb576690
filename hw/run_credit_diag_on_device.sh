#!/usr/bin/env bash
# What the testbed's credit checks are made of (issue 15): the V1 EP2 baseline on one GPU,
# profiled, with the credit time split into CQ reads per WQE and time per read
# (dispatch/combine_credit_reads_per_wqe_count, _credit_read_ns), against what could make a
# read dear: how many warps poll (--num-sms), how many ranks share the GPU (EP4 on one GPU at
# the same warps per rank), how many NIC host engines spin on host doorbells (nics_per_rank),
# the CQ's placement, and lazy completion (no credit reads). Diagnostics, not calibration
# records: $OUT/diag.tgz and $OUT/log.txt. LEVER_GIT_REV names the clean commit.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/diag_out}
REC=/tmp/diag_rec; rm -rf "$REC"; mkdir -p "$REC" "$OUT"  # a warm machine keeps /tmp: no earlier call's records
. hw/device_lib.sh  # emu_set_args (its step is replaced below)
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LEVER_BUILD_DIR=/tmp/lever_build TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16
LOG="$OUT/log.txt"
echo "git_rev ${LEVER_GIT_REV:-unset}" | tee -a "$LOG"
t0=$(date +%s)
timeout 300 python3 -c 'from lever.hw.ep import load_ext; load_ext(); print("ep built")' 2>&1 | tail -2 | tee -a "$LOG"
echo "build wall $(( $(date +%s) - t0 ))s" | tee -a "$LOG"
step() {  # name, args... ($EMU_SETS ahead of them, as hw/device_lib.sh's step does)
  local name=$1; shift
  emu_set_args
  echo "=== $name: lever hw ep ${EMU_ARGS[*]-} $*" | tee -a "$LOG"
  local s0=$(date +%s)
  timeout 90 python3 -m lever.cli hw ep ${EMU_ARGS[@]+"${EMU_ARGS[@]}"} --iters 50 --profile 2 --out-dir "$REC" --id-prefix "diag-$name" "$@" 2>&1 | tail -4 | tee -a "$LOG"
  echo "=== $name rc=${PIPESTATUS[0]} wall=$(( $(date +%s) - s0 ))s" | tee -a "$LOG"
}
E2="--ranks 2 --gpus 1"
step base $E2 --variants ";lazy-completion-dispatch"
step sms12 $E2 --num-sms 12 --variants ";"
step sms6 $E2 --num-sms 6 --variants ";"
step ep4-sms12 --ranks 4 --gpus 1 --num-sms 12 --variants ";"
step nics1 $E2 --emu-set nics_per_rank=1 --variants ";"
step nics2 $E2 --emu-set nics_per_rank=2 --variants ";"
step cqdev $E2 --cq device --variants ";"
python3 - "$REC" <<'PY' 2>&1 | tee -a "$LOG"
import json, pathlib, sys
print(f"{'record':58} {'op':8} {'lat_us':>8} {'cred/wqe':>9} {'reads/wqe':>9} {'read_ns':>8} {'polls/it':>9} {'wqes/it':>8}")
for p in sorted(pathlib.Path(sys.argv[1]).glob("diag-*.json")):
    d = json.loads(p.read_text()); m = d["metrics"]
    for op in ("dispatch", "combine"):
        g = lambda k: m.get(f"{op}_{k}", {}).get("median", float("nan"))
        print(f"{d['id']:58} {op:8} {d['latency_us'][op]['median']:8.1f} {g('credit_check_per_wqe_ns'):9.0f} "
              f"{g('credit_reads_per_wqe_count'):9.2f} {g('credit_read_ns'):8.0f} "
              f"{m['credit_polls_per_iteration_count']['median']:9.0f} {m['wqes_per_iteration_count']['median']:8.0f}")
PY
tar czf "$OUT/diag.tgz" -C "$REC" . 2>/dev/null
echo "total wall $(( $(date +%s) - t0 ))s" | tee -a "$LOG"
