#!/usr/bin/env bash
# Does sharing a GPU slow the testbed's ranks? The V2 records run 4 ranks on one GPU, the V1
# records 2, and the model (fitted on V1) is ~57% low on V2 everywhere; doubling the emulated
# NIC's per-operation costs brings that to 32% (README, "DeepEP V2 on the testbed"). This
# measures the same protocols at 1, 2 and 4 ranks a GPU, baselines only, so the model's
# per-rank resources can be checked against the GPU's:
#   V2 hybrid  2 nodes x 1 rank  on 1 GPU (2 ranks a GPU)  and  2 nodes x 2 ranks on 1 GPU (4)
#   V1 LL      EP2 on 1 GPU (2 ranks a GPU, the training records' packing)  and  EP4 on 1 GPU (4)
# and, where the machine has 2 GPUs or more, V2 hybrid 2 x 2 on 2 GPUs (2 a GPU) and V1 EP2 on
# 2 GPUs (1 a GPU): the same shape at another packing.
# One call on the device machine: every step bounded by `timeout`, logged to $OUT/log.txt, a
# failing step does not stop the others, records come back in $OUT/records.tgz. Records name
# their commit: set LEVER_GIT_REV to the clean 40-hex commit the tree came from. ~4 min on one
# H200 (the build is most of it).
# Usage: LEVER_GIT_REV=<rev> bash hw/run_rpg_on_device.sh
set -u
cd "$(dirname "$0")/.."
ITERS=${ITERS:-60}
. hw/device_lib.sh  # device_start, build_exts, step
device_start rpg
NGPU=$(nvidia-smi --list-gpus | wc -l)
echo "=== $NGPU GPU(s)" | tee -a "$LOG"
build_exts  # the EP extension (V1 and V2 kernels): its log in $OUT/build_ep.log
V2="--protocol v2-hybrid --out-dir $REC --iters $ITERS --variants ;"
step v2-n2x1-g1 90 $V2 --ranks 2 --ranks-per-node 1 --gpus 1 --id-prefix emu-rpg-v2-n2x1-g1
step v2-n2x2-g1 90 $V2 --ranks 4 --ranks-per-node 2 --gpus 1 --id-prefix emu-rpg-v2-n2x2-g1
step v1-ep2-g1 90 --protocol v1-ll --ranks 2 --gpus 1 --out-dir "$REC" --iters "$ITERS" --variants ";" --id-prefix emu-rpg-v1-ep2-g1
step v1-ep4-g1 90 --protocol v1-ll --ranks 4 --gpus 1 --out-dir "$REC" --iters "$ITERS" --variants ";" --id-prefix emu-rpg-v1-ep4-g1
if (( NGPU >= 2 )); then
  step v2-n2x2-g2 90 $V2 --ranks 4 --ranks-per-node 2 --gpus 2 --id-prefix emu-rpg-v2-n2x2-g2
  step v1-ep2-g2 90 --protocol v1-ll --ranks 2 --gpus 2 --out-dir "$REC" --iters "$ITERS" --variants ";" --id-prefix emu-rpg-v1-ep2-g2
fi
ls "$REC" | tee -a "$LOG"
tar czf "$OUT/records.tgz" -C "$(dirname "$REC")" "$(basename "$REC")"
echo "done" | tee -a "$LOG"
