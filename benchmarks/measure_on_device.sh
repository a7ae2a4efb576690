#!/usr/bin/env bash
# The CPU-heavy benchmarks of the model in one call on the GPU machine's 16 CPU cores (no GPU is
# used): the joint calibration, then, on the platforms it wrote, the leave-one-lever-out
# validation and the designs sweep. Everything lands under $OUT; the calibrated platforms in
# $OUT/platforms are what to commit into scenarios/platforms/.
#
#   run: bash benchmarks/measure_on_device.sh   (carry .whl: simpy, pydantic, rich for Python 3.12)
# At most 8 files come back from a device call: everything is also packed into $OUT/bench.tgz.
set -euo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
W=${WORKERS:-16}
mkdir -p "$OUT/platforms"
t0=$(date +%s)
python3 -m lever calibrate --joint --warm --max-nfev 30 --workers "$W" --out-dir "$OUT/platforms" --json \
    > "$OUT/joint.json" 2> "$OUT/joint.err"
cp "$OUT"/platforms/*.toml scenarios/platforms/
echo "joint calibration: $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
python3 -m lever validate --levers --json --workers "$W" --fits-out "$OUT/validate_levers_fits.json" \
    > "$OUT/validate_levers.json" 2> "$OUT/validate.err" || echo "validate rc=$?"
echo "validate --levers: $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
for P in p5 p5en p6-b200 ib-cx7; do
    python3 -m lever designs --platform "$P" --ep 8,16,24,32,64 --design deepep-v1-ll \
        --design deepep-v2-direct-gin-gda --design deepep-v2-hybrid-gin-gda \
        --design deepep-v2-hybrid-gin-proxy --design uccl-ep --design pplx-garden \
        --workers "$W" --json > "$OUT/designs-$P.json" 2>> "$OUT/designs.err" || echo "designs $P rc=$?"
done
echo "designs: $(( $(date +%s) - t0 )) s"
tar czf /tmp/bench.tgz -C "$OUT" . && mv /tmp/bench.tgz "$OUT/bench.tgz"
