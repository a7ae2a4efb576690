#!/usr/bin/env bash
# Every emulated-NIC record the NIC change of wip/hwfix moves, re-measured in one call on one
# H200 (nvidia-h200): the V1 testbed (hw/run_testbed_on_device.sh: a gated smoke run, both
# exhausted-retries runs, baseline, every lever, proxy 1/4 threads, faults, unsafe-ordered,
# the chain, lateness against the batch and the fetcher, write-with-immediate with the
# receive CQs in GPU memory, the baseline repeated twice at the end), V2 on the testbed (hw/run_v2_on_device.sh, with its rxdev
# steps) and the credit diagnostics whose baselines are calibration records
# (hw/run_credit_diag_on_device.sh). One build serves all three (LEVER_BUILD_DIR). About
# 8 minutes of device time with the build; $OUT/{bed,v2,diag} come back (7 files).
# Then, here: python -m lever.hw.install_records --rev REV --from FILES_AT
# EMU_SETS="KEY=VALUE ..." runs every step on that emulator setting (hw/device_lib.sh): the
# re-measure a change of hw/emulated_nic.toml's defaults needs, before the file changes.
# LEVER_GIT_REV must name the clean 40-hex commit the tree came from.
# PARTS (default bed,v2,diag) picks which of the three run: the whole set is about 585 s on an
# H100, close to a call's 600 s, so PARTS=bed then PARTS=v2,diag splits it over two calls.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/hwfix_out}
mkdir -p "$OUT"
. hw/device_lib.sh
use_carried_wheels
export LEVER_BUILD_DIR=/tmp/lever_build
PARTS=,${PARTS:-bed,v2,diag},
if [[ $PARTS == *,bed,* ]]; then
  OUT=$OUT/bed bash hw/run_testbed_on_device.sh smoke,exhaust,base,placedev,chain,levers,proxy,faults,unsafe,late,rxdev,repeat
  if grep -q "smoke failed" "$OUT/bed/log.txt"; then echo "V1 smoke failed: V2 and the diagnostics not run"; exit 1; fi
fi
[[ $PARTS == *,v2,* ]] && OUT=$OUT/v2 bash hw/run_v2_on_device.sh smoke,hybrid,levers,proxy,faults,direct,unsafe,rxdev
[[ $PARTS == *,diag,* ]] && OUT=$OUT/diag bash hw/run_credit_diag_on_device.sh
echo "hwfix done"
