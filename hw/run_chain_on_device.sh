#!/usr/bin/env bash
# One device call: the one-warp post chain on the emulated NIC against the primitives that
# match it, all on the same GPU. hw/ep's post of one WQE on a QP with a slot turn (every EP
# QP has one) is: the WQE stores into the host-memory SQ, a system fence, the doorbell store,
# and the release of the turn word at system scope (turn_pass: st.release.sys); its profiler
# times the first three as wqe + fence and the last two as doorbell (post_chain_b1). The
# matching primitives: wqe_fence_doorbell_host_ns (stores, fence, doorbell) and
# turn_release_sys_bare_w2_r0_ns (a doorbell store and st.release.sys, nobody reading host
# memory). The chain runs with the host engine polling back to back (gap 0) and pausing 32 us
# after an empty pass (its doorbell reads are host reads the chain's fences wait for).
# REPEATS (default 1) runs the GAPS that many times over, alternately, each run's id with -rN.
# About 3 minutes with the build. $OUT/records.tgz and $OUT/log.txt come back.
# LEVER_GIT_REV must name the clean 40-hex commit the tree came from.
set -u
cd "$(dirname "$0")/.."
. hw/device_lib.sh
GAPS=${GAPS-"0 32000"}
device_start chain
build_exts prim
echo "=== primitives latency, wqe_doorbell, stores_fences, turn_handoff" | tee -a "$LOG"
timeout 240 python3 -m lever.hw.primitives --gpus 1 --reps 60 --only latency,wqe_doorbell,stores_fences,turn_handoff \
  --out "$REC/primitives-chain.json" 2>&1 | tail -3 | tee -a "$LOG"
tar czf "$OUT/records.tgz" -C /tmp chain_rec
step smoke 60 --ranks 2 --gpus 1 --iters 5 --warmup 1 --profile 0 --out-dir "$REC/smoke" --id-prefix smoke-chain --variants ";"
if [[ $SMOKE_FAILED == 1 ]]; then echo "=== smoke failed: nothing else run" | tee -a "$LOG"; exit 1; fi
REPEATS=${REPEATS-1}
for i in $(seq 1 "$REPEATS"); do
  R=""; [[ $REPEATS != 1 ]] && R="-r$i-"
  for gap in $GAPS; do
    step gap$gap-chain$R 90 --ranks 2 --gpus 1 --iters 60 --out-dir "$REC" --num-sms 1 --set design.warps_per_sm=1 \
      --emu-set mirror_poll_gap_ns=$gap --id-prefix emu-chain-gap$gap$R --variants ";"
  done
done
python3 - "$REC" <<'PY' 2>&1 | tee -a "$LOG"
import json, sys, pathlib
d = pathlib.Path(sys.argv[1])
p = json.loads((d / "primitives-chain.json").read_text())
m = {k: v["median"] for k, v in p["metrics"].items()}
post, rel = m["wqe_fence_doorbell_host_ns"], m["turn_release_sys_bare_w2_r0_ns"]
db = m["wqe_doorbell_nofence_host_ns"] - m["wqe_store_host_ns"]
match = post + rel - db
print(p["what"]["platform"]["gpu"], f"primitives: post {post:.0f} release {rel:.0f} doorbell {db:.0f} -> matching chain {match:.0f} ns")
# the same post by one warp with hw/ep's WQE builder reading its layout and peer table (the
# chain's "wqe" segment is that build and the stores)
wpost = m.get("wqe_warp_build_fence_doorbell_host_ns")
wmatch = wpost + rel - db if wpost else float("nan")
if wpost:
    print(f"warp post with the build {wpost:.0f} ns (build + stores {m['wqe_warp_build_store_host_ns']:.0f}, "
          f"from registers {m['wqe_warp_regs_store_host_ns']:.0f}) -> matching chain with the build {wmatch:.0f} ns")
for f in sorted(d.glob("emu-chain-*.json")):
    j = json.loads(f.read_text()); mm = j["metrics"]
    b1 = mm["dispatch_post_chain_b1_ns"]["median"]
    cr = mm.get("dispatch_credit_read_ns", {}).get("median", float("nan"))
    print(f"{f.stem:48s} b1 post {b1:6.0f} ns = {b1 / post:.2f}x the bare post, {b1 / match:.2f}x post + release, "
          f"{b1 / wmatch:.2f}x the warp's built post + release; credit read {cr:.0f} ns = {cr / m.get('pcie_read_rtt_ns', cr):.2f}x")
PY
tar czf "$OUT/records.tgz" -C /tmp chain_rec
echo "done" | tee -a "$LOG"
