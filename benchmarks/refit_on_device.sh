#!/usr/bin/env bash
# The joint recalibration and every held-out check, on the device machine's 16 CPUs (no GPU
# used): lever calibrate --joint, the calibrated platforms put in place, lever validate
# --levers, V2 held out, IB held out. About 5 minutes there (40+ on a 2-core machine).
# Everything lands in $OUT: the platform TOMLs (p/), joint_calibration.json,
# validate_levers.json, validate_levers_fits.json, v2_held_out.json, ib_generalisation.json.
# Copy them into scenarios/platforms and benchmarks/ here; LEVER_GIT_REV names the commit.
# WARM= (empty) fits from the base platforms' priors instead of the shipped calibrated values
# (default --warm); NFEV sets --max-nfev (default 30); LEVERS=0 skips lever validate --levers,
# whose folds start from the base platforms and do not read the calibrated ones.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/refit_out}
mkdir -p "$OUT"
. hw/device_lib.sh
use_carried_wheels
L() { python3 -m lever.cli "$@"; }
t0=$(date +%s)
L calibrate --joint ${WARM---warm} --max-nfev ${NFEV:-30} --workers 16 --out-dir "$OUT/p" --json >"$OUT/joint_calibration.json" 2>"$OUT/calibrate.err"
echo "calibrate rc=$? wall=$(( $(date +%s) - t0 ))s"; tail -3 "$OUT/calibrate.err"
cp "$OUT"/p/*.toml scenarios/platforms/
[ "${LEVERS:-1}" = 0 ] || L validate --levers --json --workers 16 --fits-out "$OUT/validate_levers_fits.json" >"$OUT/validate_levers.json" 2>"$OUT/validate.err"
echo "validate rc=$? wall=$(( $(date +%s) - t0 ))s"; tail -3 "$OUT/validate.err"
python3 benchmarks/v2_held_out.py --out "$OUT/v2_held_out.json" >"$OUT/v2.log" 2>&1
echo "v2 rc=$? wall=$(( $(date +%s) - t0 ))s"
python3 benchmarks/ib_generalisation.py --workers 16 --out "$OUT/ib_generalisation.json" >"$OUT/ib.log" 2>&1
echo "ib rc=$? wall=$(( $(date +%s) - t0 ))s"
[ "${LEVERS:-1}" = 0 ] || python3 -c "import json; d = json.load(open('$OUT/validate_levers.json')); print('validated', d['validated'], 'of', d['total'], 'wrong sign', d['wrong_sign'])"
tail -n 5 "$OUT/v2.log" "$OUT/ib.log"
