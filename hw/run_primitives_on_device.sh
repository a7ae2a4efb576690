#!/usr/bin/env bash
# Records name their commit: the tree is copied without .git, so set LEVER_GIT_REV to the
# clean 40-hex commit it was copied from (the harness refuses a record otherwise, hw/provenance.py).
# Build, check and measure the primitive microbenchmarks on a CUDA machine, in one go:
# the 1-GPU families, then (when a second GPU is there) the NVLink family. Records and
# logs go under $OUT (default ./out). Usage: hw/run_primitives_on_device.sh [REPS]
# Every kernel spin is bounded in the kernels themselves; `timeout` bounds each step
# once more so a stuck host never eats the device lease.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
REPS=${1:-200}
export PYTHONUNBUFFERED=1
# NVLink multicast stays off (shared hosts), whatever a library would default to.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LEVER_BUILD_DIR=${LEVER_BUILD_DIR:-/tmp/lever-build}
# The GPU image has no pydantic (calibration.records needs it): carried wheels in .whl/.
if ! python3 -c 'import pydantic' 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 4
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

{
  nvidia-smi --query-gpu=index,name,driver_version,pstate,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  nvidia-smi topo -m
} >"$OUT/machine.txt" 2>&1
head -5 "$OUT/machine.txt"
NGPU=$(python3 -c 'import torch; print(torch.cuda.device_count())')
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'

t0=$(date +%s)
timeout 300 python3 -c 'from lever.hw.primitives import load_primitives; load_primitives()' \
  >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 3; }
echo "build: $(( $(date +%s) - t0 )) s"

rc=0
timeout 240 python3 -m lever.hw.primitives --gpus 1 --reps "$REPS" --out "$OUT/h200-primitives-1gpu.json" \
  2>&1 | tee "$OUT/log-1gpu.txt" || rc=1
if [ "$NGPU" -ge 2 ]; then
  timeout 120 python3 -m lever.hw.primitives --gpus 2 --reps "$REPS" --out "$OUT/h200-primitives-2gpu.json" \
    2>&1 | tee "$OUT/log-2gpu.txt" || rc=1
else
  echo "only $NGPU GPU: NVLink family skipped"
fi
exit $rc
