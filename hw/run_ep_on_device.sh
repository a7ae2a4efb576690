#!/usr/bin/env bash
# Records name their commit: the tree is copied without .git, so set LEVER_GIT_REV to the
# clean 40-hex commit it was copied from (the harness refuses a record otherwise, hw/provenance.py).
# Build the emulated-NIC EP kernels, run the gate, measure, and write records under $OUT.
# One call on the device machine (nvidia-h200-x2): every step is bounded by `timeout`
# and logged; a failing step does not stop the others. Records come back as one tarball.
# Usage: hw/run_ep_on_device.sh [STEPS]   (STEPS: comma list of base,proxy,levers,faults,unsafe,loop,ep8,sharing,dbsweep,stuck)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/ep_out}
REC=/tmp/ep_rec; rm -rf "$REC"; mkdir -p "$REC" "$OUT"  # a warm machine keeps /tmp: no earlier call's records
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LEVER_BUILD_DIR=/tmp/lever_build TORCH_CUDA_ARCH_LIST=9.0
STEPS=${1:-base,proxy,levers,faults,unsafe,loop,ep8}
ITERS=${ITERS:-60}
# pydantic is not on the device image: carried wheels (.whl) go to /tmp/site
if ls .whl/*.whl >/dev/null 2>&1 && ! python3 -c 'import pydantic' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
LOG="$OUT/log.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv | tee -a "$LOG"
nvidia-smi topo -m 2>&1 | head -5 | tee -a "$LOG"
python3 -c 'import torch; print("torch", torch.__version__, "gpus", torch.cuda.device_count())' | tee -a "$LOG"
step() {  # name, timeout, args...
  local name=$1 to=$2; shift 2
  echo "=== $name: lever hw ep $*" | tee -a "$LOG"
  local t0=$(date +%s)
  timeout "$to" python3 -m lever.cli hw ep "$@" 2>&1 | tee -a "$LOG"
  echo "=== $name rc=${PIPESTATUS[0]} wall=$(( $(date +%s) - t0 ))s" | tee -a "$LOG"
}
has() { [[ ",$STEPS," == *",$1,"* ]]; }
# build once (first use compiles)
timeout 300 python3 -c 'from lever.hw.ep import load_ext; m = load_ext(); print("built", m.layout_sizes())' 2>&1 | tail -20 | tee -a "$LOG"
LEVERS="lazy-completion-dispatch;lazy-completion-combine;batched-doorbells;qp-fanout-fix;qp17-ownership;write-imm-counting;put-many;deferred-doorbell-aggregation;provider-batched-tail;cached-dispatch;lazy-completion-dispatch,deferred-doorbell-aggregation"
C="--ranks 2 --gpus 2 --iters $ITERS --out-dir $REC --id-prefix emu-ep"
has base && step base 90 $C --variants ";"
has proxy && step proxy 120 $C --path proxy --variants ";lazy-completion-dispatch"
has levers && step levers 240 $C --variants "$LEVERS"
has faults && step faults 120 $C --faults --variants ";write-imm-counting;cached-dispatch"
has faults && step proxy-faults 90 $C --faults --path proxy --variants ";"
has unsafe && step unsafe-ordered-must-fail 60 --ranks 2 --gpus 2 --faults --unsafe-ordered --iters 5 --warmup 1 --profile 0 --out "$REC/../unsafe.json"
# a run that must time out (2 us budget per wait): its one-line error names the stuck rank, block,
# warp and what it waited for
has stuck && step stuck-must-fail 60 --ranks 2 --gpus 1 --timeout-ms 0.002 --iters 5 --warmup 1 --profile 0 --out "$OUT/stuck.json"
has loop && step loopback 90 --ranks 2 --gpus 1 --iters $ITERS --variants ";" --out-dir "$REC" --id-prefix emu-loop-ep
# the QP fan-out fix where QPs are scarce: 96 warps on 1 -> 2 and 2 -> 3 data QPs (heavy sharing)
for q in 2 3; do
  has sharing && step sharing-q$q 120 $C --set design.qps_per_call=$q --variants ";qp-fanout-fix" --id-prefix emu-q$q-ep
done
# doorbell batch sweep B = 2, 4, 16 (B = 1 and 8 are base and batched-doorbells): per-doorbell
# against per-WQE NIC work on the emulated NIC
for b in 2 4 16; do
  has dbsweep && step dbsweep-b$b 120 $C --set design.doorbell_batch=$b --variants ";" --id-prefix emu-b$b-ep
done
has ep8 && step ep8-virtual 90 --ranks 8 --gpus 2 --iters $ITERS --num-sms 12 --variants ";" --out-dir "$REC" --id-prefix emu-ep
ls "$REC" | tee -a "$LOG"
tar czf "$OUT/records.tgz" -C /tmp ep_rec
echo "done" | tee -a "$LOG"
