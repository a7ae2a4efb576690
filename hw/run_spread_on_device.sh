#!/usr/bin/env bash
# One device call: what keeps the emulated NIC's delivering warps behind their schedule
# (docs/testbed.md, "The fence's strength, and more SMs a NIC"). Six or seven warps on one SM
# deliver a NIC's packets, about 6 us a batch of two (claim 1.6, copies 2.6, fence 1.7-2.3);
# the setting closest to the schedule (due mask 8 us ahead, batches of two, staged copies) is
# 0.70-1.48 us late, and 0.54-0.77 with the same work on eight NICs a rank at half the rate.
# WHAT=blocks: `blocks_per_nic_count = 2`, p5's four 100 Gb/s NICs each served by two blocks
# (SMs): faulted smoke runs through the gate with two blocks a NIC (V1 native, V1 proxy, V2
# hybrid), the closest setting with one and two blocks a NIC alternately, REPEATS times (shared
# fetch), then two blocks with the dedicated fetcher, register copies (each fetcher), 6 us ahead.
# WHAT=wqes: p5's four 100 Gb/s NICs each served by two blocks that split its WQEs (`nic_share =
# "wqes"`: WQE i of every QP to block i mod 2, each block its own packet table, one wire): faulted
# smoke runs through the gate with it (V1 native, V1 proxy, V2 hybrid), then the closest setting
# (due mask 8 us ahead, batches of two, staged copies, shared fetch) with one block a NIC and two
# splitting its WQEs alternately, REPEATS rounds, then two with the dedicated fetcher, 6 us ahead,
# four blocks a NIC, and the file's own setting (the table walk 0.9 us ahead) with one and two.
# WHAT=lanes: the same with `nic_share = "lanes"` (the WQEs split as with "wqes", each block
# sending on a lane of its own at the line rate over the lanes, no wire shared).
# WHAT=kernel: the NIC blocks in a kernel of their own (`nic_kernel = "own"`, compiled for 128
# registers a thread, so a NIC block runs up to 16 delivering warps: `nic_warps_count`): faulted
# smoke runs through the gate with 16 NIC warps (V1 native, V1 proxy, V2 hybrid), then the closest
# setting (due mask 8 us ahead, batches of two, staged copies, shared fetch) with the one kernel's
# 8 warps, the own kernel's 8 and its 16, alternately, REPEATS rounds, then the own kernel's 12
# warps, its 16 with the dedicated fetcher, with register copies, and 6 us ahead. KBATCH (default 2)
# sets the delivery batch of those runs (1: a packet a batch, so a one-MTU staging slice costs
# no second round), ids then with -bKBATCH after the kernel.
# WHAT picks the comparison: "control", the unsafe-ordered negative control (flags ordered
# after their data on the SRD wire, with faults: its gate must fail) REPEATS times at each of
# CONTROL_ITERS iterations, the host engine polling back to back and pausing 2 us alternately,
# an outcome file a run and their tally in the log (f52c882's one pausing run of 5 iterations
# passed its gate); "gap", the host engine's 2 us pause against none on the shipped
# setting (baseline and lazy completion's dispatch, REPEATS pairs, no smoke: the kernels are
# 4fe8b9b's); "wide-edf" (default), the claim reading wide and taking the earliest
# due first from the dues it loaded (`nic_claim_loads = "wide"`, `nic_claim = "edf"`) against
# the due mask's volatile loads in table order, alternately, REPEATS times (8 us ahead, batches
# of two, staged copies, shared fetch), then wide edf with the dedicated fetcher and 6 and 4 us
# ahead, after faulted smoke runs through the gate with it (V1, V2 hybrid); "loads", what a72025c
# ran: how the due mask's claim reads the packet table
# (`nic_claim_loads`): "volatile", every 32nd entry in 48 volatile loads, each tested in turn (the
# compiler waits on an entry's loads before issuing the next: 1.13-1.15 us of the claim's 1.75 at
# bce0d7b), against "wide", a run of 16 entries in 16-byte vectors, alternately, REPEATS times (due
# mask 8 us ahead, batches of two, staged copies, shared fetch), then wide with the dedicated
# fetcher and 6 and 4 us ahead, after faulted smoke runs through the gate with it (V1, V2 hybrid);
# "bulk", the delivering warps' copies handed to the copy
# engine (`nic_copy = "bulk"`: TMA bulk copies, one lane issuing) against staged copies,
# alternately, REPEATS times (due mask 8 us ahead, batches of two, shared fetch), then bulk with
# the dedicated fetcher and 6 us ahead, after faulted smoke runs through the gate with it (V1,
# V2 hybrid); "edf", what e46346f ran: the due mask claiming earliest due first
# (`nic_claim = "edf"`) against the mask's table order, alternately, REPEATS times (shared
# fetch, staged copies, one block a NIC), then edf with the dedicated fetcher and 6 and 10 us
# ahead, after faulted smoke runs through the gate with it (V1, V2 hybrid); "blocks", what
# e630a54 and 7bb366f ran (above, with nic_share "qps" and "table"); "fences", what 587fd95 ran: the batch fence as fence.sc and
# as a release fence (`nic_fence`), alternately, and eight NICs a rank at 50 Gb/s at LEADS8
# (ns ahead).
# COMBOS (after any WHAT): EP2 lever sets with their baselines, as hw/run_host_engine_on_device.sh
# runs levers (the same ids), e.g. what a72025c ran (the two combinations sealed at 5462b22, each
# with its baseline): COMBOS="lazy-completion-dispatch,lazy-completion-combine;lazy-completion-dispatch,
# lazy-completion-combine,qp-fanout-fix;lazy-completion-dispatch,qp-fanout-fix;lazy-completion-dispatch,
# qp-fanout-fix,batched-doorbells" (one line); none by default.
# About 4 minutes with the build. $OUT/records.tgz and $OUT/log.txt come back.
# LEVER_GIT_REV must name the clean 40-hex commit the tree came from.
set -u
cd "$(dirname "$0")/.."
. hw/device_lib.sh
REPEATS=${REPEATS-3}
LEADS8=${LEADS8-"4000 8000"}
WHAT=${WHAT-wide-edf}
COMBOS=${COMBOS-}
device_start spread
build_exts
C="--ranks 2 --gpus 1 --iters 60 --out-dir $REC --emu-set nic_copy=staged --emu-set nic_claim=mask --emu-set deliver_batch_count=2"
# smokes NAME EMU-ARGS...: faulted runs through the gate with those emulator values, V1 (2 ranks)
# and V2 hybrid (2 nodes x 2 ranks), each beside write-with-immediate counting
smokes() {
  smoke_v1 "$@"
  smoke_v2 "$@"
}
# smoke_v1 / smoke_v2 NAME EMU-ARGS...: the two runs of smokes, one at a time
smoke_v1() {
  local name=$1; shift
  step smoke-$name 60 --ranks 2 --gpus 1 --iters 5 --warmup 1 --profile 0 --faults --out-dir "$REC/smoke" "$@" \
    --id-prefix smoke-$name- --variants ";write-imm-counting"
}
smoke_v2() {
  local name=$1; shift
  step smoke-$name-v2 90 --protocol v2-hybrid --ranks 4 --ranks-per-node 2 --gpus 1 --iters 5 --warmup 1 --profile 0 \
    --faults --out-dir "$REC/smoke" "$@" --id-prefix smoke-$name-v2- --variants ";write-imm-counting"
}
# smoke_proxy STEP ID-PREFIX EMU-ARGS...: a V1 proxy run through the gate (no faults)
smoke_proxy() {
  local name=$1 id=$2; shift 2
  step $name 60 --ranks 2 --gpus 1 --iters 5 --warmup 1 --profile 0 --path proxy --out-dir "$REC/smoke" "$@" \
    --id-prefix $id --variants ";"
}
# then_runs STEM VALUE LEADS ARGS...: the candidate VALUE (ARGS set it) with the dedicated fetcher 8 us
# ahead, then with the shared fetch at each of LEADS (ns); ids emu-STEM-VALUE-leadL-FETCHER-r1-
then_runs() {
  local stem=$1 value=$2 leads=$3 lead; shift 3
  step $value-dedicated 60 "$@" --emu-set deliver_lead_ns=8000 --emu-set nic_fetcher=dedicated \
    --id-prefix emu-$stem-$value-lead8000-dedicated-r1- --variants ";"
  for lead in $leads; do
    step $value-lead$lead 60 "$@" --emu-set deliver_lead_ns=$lead --emu-set nic_fetcher=shared \
      --id-prefix emu-$stem-$value-lead$lead-shared-r1- --variants ";"
  done
}
# alternate STEM KEY "A B" ARGS...: REPEATS rounds of KEY=A then KEY=B (8 us ahead, shared fetch),
# nothing else differing within a round; ids emu-STEM-VALUE-lead8000-shared-rI-
alternate() {
  local stem=$1 key=$2 values=$3 i v; shift 3
  for i in $(seq 1 "$REPEATS"); do
    for v in $values; do
      step $v-shared-r$i 60 "$@" --emu-set $key=$v --emu-set deliver_lead_ns=8000 --emu-set nic_fetcher=shared \
        --id-prefix emu-$stem-$v-lead8000-shared-r$i- --variants ";"
    done
  done
}
if [[ $WHAT == fences ]]; then
  step smoke-release 60 --ranks 2 --gpus 1 --iters 5 --warmup 1 --profile 0 --faults --out-dir "$REC/smoke" \
    --emu-set nic_fence=release --emu-set nic_copy=staged --id-prefix smoke-release --variants ";write-imm-counting"
  for i in $(seq 1 "$REPEATS"); do
    for fence in sc release; do
      step n4-$fence-shared-r$i 60 $C --emu-set deliver_lead_ns=8000 --emu-set nic_fetcher=shared \
        --emu-set nic_fence=$fence --id-prefix emu-spread-n4-lead8000-$fence-shared-r$i- --variants ";"
    done
  done
  for fence in sc release; do
    step n4-$fence-dedicated 60 $C --emu-set deliver_lead_ns=8000 --emu-set nic_fetcher=dedicated \
      --emu-set nic_fence=$fence --id-prefix emu-spread-n4-lead8000-$fence-dedicated-r1- --variants ";"
  done
  for lead in $LEADS8; do
    for fence in sc release; do
      step n8-lead$lead-$fence 60 $C --emu-set nics_per_rank=8 --emu-set line_rate_gbps=50 \
        --emu-set deliver_lead_ns=$lead --emu-set nic_fetcher=shared --emu-set nic_fence=$fence \
        --id-prefix emu-spread-n8-lead$lead-$fence-shared-r1- --variants ";"
    done
  done
elif [[ $WHAT == wide-edf ]]; then
  smokes wedf --emu-set nic_claim_loads=wide --emu-set nic_claim=edf --emu-set nic_copy=staged --emu-set deliver_lead_ns=8000
  E2="--ranks 2 --gpus 1 --iters 60 --out-dir $REC --emu-set nic_copy=staged --emu-set deliver_batch_count=2"
  for i in $(seq 1 "$REPEATS"); do
    step mask-volatile-r$i 60 $E2 --emu-set nic_claim=mask --emu-set nic_claim_loads=volatile --emu-set deliver_lead_ns=8000 \
      --emu-set nic_fetcher=shared --id-prefix emu-wedf-mask-volatile-lead8000-shared-r$i- --variants ";"
    step edf-wide-r$i 60 $E2 --emu-set nic_claim=edf --emu-set nic_claim_loads=wide --emu-set deliver_lead_ns=8000 \
      --emu-set nic_fetcher=shared --id-prefix emu-wedf-edf-wide-lead8000-shared-r$i- --variants ";"
  done
  then_runs wedf edf-wide "6000 4000" $E2 --emu-set nic_claim=edf --emu-set nic_claim_loads=wide
elif [[ $WHAT == gap ]]; then
  # the host engine pausing 2 us after a pass that saw no doorbell (mirror_poll_gap_ns, the pause
  # that brings the one-warp chain within 1.5x at 1a4010f) against polling back to back, on the
  # shipped setting, the baseline and lazy completion's dispatch in each step, alternately
  for i in $(seq 1 "$REPEATS"); do
    for gap in 0 2000; do
      step gap$gap-r$i 90 --ranks 2 --gpus 1 --iters 60 --out-dir "$REC" --emu-set mirror_poll_gap_ns=$gap \
        --id-prefix emu-gap$gap-r$i- --variants ";lazy-completion-dispatch"
    done
  done
elif [[ $WHAT == control ]]; then
  for i in $(seq 1 "$REPEATS"); do
    for it in ${CONTROL_ITERS-5 20}; do
      for gap in 0 2000; do
        step control-gap$gap-i$it-r$i 60 --ranks 2 --gpus 1 --faults --unsafe-ordered --iters $it --warmup 1 --profile 0 \
          --emu-set mirror_poll_gap_ns=$gap --out "$REC/control-gap$gap-i$it-r$i.json" \
          --outcome "$REC/control-gap$gap-i$it-r$i-outcome.json"
      done
    done
  done
  control_tally "$REC"
elif [[ $WHAT == wqes || $WHAT == lanes ]]; then
  W="--emu-set blocks_per_nic_count=2 --emu-set nic_share=$WHAT"
  S="$W --emu-set nic_copy=staged --emu-set nic_claim=mask --emu-set deliver_lead_ns=8000"
  smoke_v1 ${WHAT}2 $S
  smoke_proxy smoke-${WHAT}2-proxy smoke-${WHAT}2- $S
  smoke_v2 ${WHAT}2 $S
  for i in $(seq 1 "$REPEATS"); do
    for b in 1 2; do
      step $WHAT$b-shared-r$i 60 $C --emu-set nic_share=$WHAT --emu-set blocks_per_nic_count=$b \
        --emu-set deliver_lead_ns=8000 --emu-set nic_fetcher=shared --id-prefix emu-$WHAT-blocks$b-lead8000-shared-r$i- --variants ";"
    done
  done
  then_runs $WHAT blocks2 6000 $C $W
  step ${WHAT}4-shared 60 $C --emu-set nic_share=$WHAT --emu-set blocks_per_nic_count=4 --emu-set deliver_lead_ns=8000 \
    --emu-set nic_fetcher=shared --id-prefix emu-$WHAT-blocks4-lead8000-shared-r1- --variants ";"
  for b in 1 2; do
    step $WHAT$b-file 60 --ranks 2 --gpus 1 --iters 60 --out-dir "$REC" --emu-set nic_share=$WHAT \
      --emu-set blocks_per_nic_count=$b --id-prefix emu-$WHAT-blocks$b-file-r1- --variants ";"
  done
elif [[ $WHAT == kernel ]]; then
  O="--emu-set nic_kernel=own --emu-set nic_warps_count=16"
  KB=${KBATCH-2}
  [[ $KB != 2 ]] && C="$C --emu-set deliver_batch_count=$KB" && KS="-b$KB" || KS=""
  smokes own16 $O --emu-set nic_copy=staged --emu-set nic_claim=mask --emu-set deliver_lead_ns=8000
  smoke_proxy smoke-own16-proxy smoke-own16-proxy- $O --emu-set nic_copy=staged
  for i in $(seq 1 "$REPEATS"); do
    for kw in shared:8 own:8 own:16; do
      step ${kw/:/}-shared-r$i 60 $C --emu-set nic_kernel=${kw%:*} --emu-set nic_warps_count=${kw#*:} \
        --emu-set deliver_lead_ns=8000 --emu-set nic_fetcher=shared --id-prefix emu-kernel-${kw/:/}$KS-lead8000-shared-r$i- --variants ";"
    done
  done
  step own12-shared 60 $C --emu-set nic_kernel=own --emu-set nic_warps_count=12 --emu-set deliver_lead_ns=8000 \
    --emu-set nic_fetcher=shared --id-prefix emu-kernel-own12$KS-lead8000-shared-r1- --variants ";"
  then_runs kernel own16$KS 6000 $C $O
  step own16-one 60 $C $O --emu-set nic_copy=one --emu-set deliver_lead_ns=8000 --emu-set nic_fetcher=shared \
    --id-prefix emu-kernel-own16$KS-one-lead8000-shared-r1- --variants ";"
elif [[ $WHAT == loads ]]; then
  smokes wide --emu-set nic_claim_loads=wide --emu-set nic_copy=staged --emu-set nic_claim=mask --emu-set deliver_lead_ns=8000
  alternate loads nic_claim_loads "volatile wide" $C
  then_runs loads wide "6000 4000" $C --emu-set nic_claim_loads=wide
elif [[ $WHAT == bulk ]]; then
  smokes bulk --emu-set nic_copy=bulk --emu-set nic_claim=mask --emu-set deliver_lead_ns=8000
  K="--ranks 2 --gpus 1 --iters 60 --out-dir $REC --emu-set nic_claim=mask --emu-set deliver_batch_count=2"
  alternate copy nic_copy "staged bulk" $K
  then_runs copy bulk 6000 $K --emu-set nic_copy=bulk
elif [[ $WHAT == edf ]]; then
  smokes edf --emu-set nic_claim=edf --emu-set nic_copy=staged --emu-set deliver_lead_ns=8000
  E="--ranks 2 --gpus 1 --iters 60 --out-dir $REC --emu-set nic_copy=staged --emu-set deliver_batch_count=2"
  alternate claim nic_claim "mask edf" $E
  then_runs claim edf "6000 10000" $E --emu-set nic_claim=edf
else
  S="--emu-set blocks_per_nic_count=2 --emu-set nic_copy=staged --emu-set nic_claim=mask --emu-set deliver_lead_ns=8000"
  smoke_v1 blocks2 $S
  smoke_proxy smoke-blocks2-proxy smoke-blocks2- $S
  smoke_v2 blocks2 $S
  for i in $(seq 1 "$REPEATS"); do
    for b in 1 2; do
      step blocks$b-shared-r$i 60 $C --emu-set deliver_lead_ns=8000 --emu-set nic_fetcher=shared \
        --emu-set blocks_per_nic_count=$b --id-prefix emu-spread-blocks$b-lead8000-staged-shared-r$i- --variants ";"
    done
  done
  step blocks2-dedicated 60 $C --emu-set deliver_lead_ns=8000 --emu-set nic_fetcher=dedicated \
    --emu-set blocks_per_nic_count=2 --id-prefix emu-spread-blocks2-lead8000-staged-dedicated-r1- --variants ";"
  for fetch in shared dedicated; do
    step blocks2-one-$fetch 60 $C --emu-set nic_copy=one --emu-set deliver_lead_ns=8000 --emu-set nic_fetcher=$fetch \
      --emu-set blocks_per_nic_count=2 --id-prefix emu-spread-blocks2-lead8000-one-$fetch-r1- --variants ";"
  done
  step blocks2-lead6000 60 $C --emu-set deliver_lead_ns=6000 --emu-set nic_fetcher=shared \
    --emu-set blocks_per_nic_count=2 --id-prefix emu-spread-blocks2-lead6000-staged-shared-r1- --variants ";"
fi
[[ -n $COMBOS ]] && step combos 300 --ranks 2 --gpus 1 --iters 40 --out-dir "$REC" --id-prefix emu-host- --variants ";$COMBOS"
metric_table "$REC" late early claim_lag scan claim_load copy fence
tar czf "$OUT/records.tgz" -C /tmp spread_rec
echo "done" | tee -a "$LOG"
