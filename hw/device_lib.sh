# Shared by the device scripts (hw/run_*_on_device.sh): source it from the repository root.
#
# device_env: what every device script runs under: unbuffered output, NVLink multicast off
# (NCCL, torch symmetric memory, NVSHMEM), one build folder across a call's scripts, sm_90.
device_env() {
  export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  export LEVER_BUILD_DIR=${LEVER_BUILD_DIR:-/tmp/lever_build} TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=${MAX_JOBS:-16}
}

# build_exts [prim]: the EP extension and (with "prim") the primitives built side by side,
# each logged to $OUT/build_*.log; their tails and the build's wall time go to $LOG.
build_exts() {
  local t0=$(date +%s)
  timeout 300 python3 -c 'from lever.hw.ep import load_ext; m = load_ext(); print("ep built", m.layout_sizes())' >"$OUT/build_ep.log" 2>&1 &
  [[ ${1:-} == prim ]] && timeout 300 python3 -c 'from lever.hw.primitives import load_primitives; load_primitives(); print("primitives built")' >"$OUT/build_prim.log" 2>&1 &
  wait
  tail -n 3 "$OUT"/build_*.log | tee -a "$LOG"
  echo "build wall $(( $(date +%s) - t0 ))s" | tee -a "$LOG"
}

# use_carried_wheels: pydantic and simpy are not on the device image; the wheels a call
# carries in .whl/ go to /tmp/site, and the tree itself is put on PYTHONPATH.
use_carried_wheels() {
  if ls .whl/*.whl >/dev/null 2>&1 && ! python3 -c 'import pydantic' 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
}

# $LEVER_GIT_REV must be set on the calling side's command line as the literal 40-hex commit
# the copied tree came from: `git rev-parse HEAD` run on the device machine can answer an
# older commit than the tree it was handed (it did once: the records of that call named the
# session's first commit and were not kept, docs/testbed.md).
# log_header: the commit the tree came from ($LEVER_GIT_REV) and the GPUs with their clocks,
# at the head of $LOG.
log_header() {
  {
    echo "git_rev ${LEVER_GIT_REV:-unset}"
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  } 2>&1 | tee -a "$LOG"
}

# device_start NAME: what a device script does before its first step: $OUT (default
# /tmp/NAME_out), its records folder $REC (/tmp/NAME_rec) emptied (a warm machine keeps /tmp, so
# an earlier call's records would come back as this call's), $LOG, the device environment, the
# carried wheels, and the log's header (the commit and the GPUs).
device_start() {
  OUT=${OUT:-/tmp/$1_out}
  REC=/tmp/$1_rec; rm -rf "$REC"; mkdir -p "$REC" "$OUT"
  LOG="$OUT/log.txt"
  device_env
  use_carried_wheels
  log_header
}

# step NAME TIMEOUT ARGS...: one bounded `lever hw ep ARGS...`, logged to $LOG with its exit
# status and wall time; a failing smoke* step sets SMOKE_FAILED=1. $REC (the records folder)
# is re-tarred into $OUT/records.tgz after every step, so what ran so far comes back even if
# a later step is cut off. A failing step never stops the script.
# $EMU_SETS (KEY=VALUE words, e.g. "nic_claim=mask deliver_lead_ns=8000") go to every step as
# --emu-set flags ahead of the step's own, which win where both set a key: a whole script re-run
# on another emulator setting (docs/testbed.md, re-measuring on a new setting).
# emu_set_args: those flags, into the array EMU_ARGS (every script's step uses it).
emu_set_args() {
  EMU_ARGS=()
  local kv
  for kv in ${EMU_SETS-}; do EMU_ARGS+=(--emu-set "$kv"); done
}
SMOKE_FAILED=0
step() {
  local name=$1 to=$2; shift 2
  emu_set_args
  echo "=== $name: lever hw ep ${EMU_ARGS[*]-} $*" | tee -a "$LOG"
  local s0=$(date +%s)
  timeout "$to" python3 -m lever.cli hw ep ${EMU_ARGS[@]+"${EMU_ARGS[@]}"} "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  echo "=== $name rc=$rc wall=$(( $(date +%s) - s0 ))s" | tee -a "$LOG"
  [[ $name == smoke* && $rc != 0 ]] && SMOKE_FAILED=1
  tar czf "$OUT/records.tgz" -C "$(dirname "$REC")" "$(basename "$REC")"
  return 0
}

# metric_table DIR KEY...: one line a record DIR/emu-*.json, into $LOG: its dispatch and combine
# medians (us) and each KEY's median (a record metric, or an emulator part: late -> its
# nic_late_per_packet_ns; nan where the record has none), headed by the keys as given.
metric_table() {
  python3 - "$@" <<'PY' 2>&1 | tee -a "$LOG"
import json, sys, pathlib
d, keys = pathlib.Path(sys.argv[1]), sys.argv[2:]
print(f"{'record':52s} {'disp':>7s} {'comb':>7s}" + "".join(f" {k[:8]:>8s}" for k in keys))
for p in sorted(d.glob("emu-*.json")):
    j = json.loads(p.read_text())
    m, lat = j.get("metrics", {}), j.get("latency_us", {})
    vals = [m.get(k if k in m else f"nic_{k}_per_packet_ns", {}).get("median", float("nan")) for k in keys]
    print(f"{p.stem[:52]:52s} {lat.get('dispatch', {}).get('median', 0):7.1f} {lat.get('combine', {}).get('median', 0):7.1f}"
          + "".join(f" {v:8.0f}" for v in vals))
PY
}

# control_tally DIR: the negative-control outcomes DIR/control-gapG-iN-rK-outcome.json, into $LOG:
# a line (pause, iterations) with how many runs failed their gate as they must, of how many.
control_tally() {
  python3 - "$1" <<'PY' 2>&1 | tee -a "$LOG"
import collections, json, pathlib, re, sys
tally = collections.defaultdict(lambda: [0, 0])
for p in sorted(pathlib.Path(sys.argv[1]).glob("control-*-outcome.json")):
    g, n = re.match(r"control-gap(\d+)-i(\d+)-r\d+-outcome", p.name).groups()
    t = tally[(int(g), int(n))]
    t[0] += json.loads(p.read_text())["exit_code"] != 0
    t[1] += 1
print("pause_ns iters failed_as_it_must runs")
for (g, n), (f, r) in sorted(tally.items()):
    print(f"{g:8d} {n:5d} {f:17d} {r:4d}")
PY
}
