// Doorbell-turn hand-off family: what it costs to pass a shared QP's doorbell turn from one
// warp to the next, as hw/ep's post_group passes it (ep_kernels.cu: turn_load, turn_pass).
// W warps (one per SM) post P times each on one queue: reserve a slot (atomicAdd on a device
// counter), optionally store a 64-byte WQE into a ring in pinned host memory and fence
// (__threadfence_system, in parallel across warps), then wait until the turn word equals the
// slot, store the 4-byte doorbell (pinned host memory) and release the turn word. With every
// warp always waiting for its turn, the turn is the bottleneck: the rings come one hand-off
// apart, and a hand-off is the holder's doorbell store and release plus the time the next
// warp's spin takes to see the released word.
//
//   turn_handoff_{sys,gpu}_{bare,post}_w{W}_r{R}_ns
//       per hand-off: a warp's wall time for its P posts over P*W (the rings of every warp
//       in that time). sys: the turn is loaded with ld.acquire.sys and released with
//       st.release.sys (hw/ep with the doorbell in host or BAR memory); gpu: .gpu scope.
//       bare: no WQE, no fence (the turn alone); post: the WQE stores and the fence first.
//       R reader warps chase lines of pinned host memory meanwhile (32 lanes a step, all on
//       the same lines: the warps sharing a QP polling its CQ), R = 0 none.
//   turn_release_{sys,gpu}_{bare,post}_w{W}_r{R}_ns
//       the holder's part of it, per post: the doorbell store and the release, timed by the
//       holder (what hw/ep's profiler counts as `doorbell`); the rest of a hand-off is the
//       next warp seeing the released word.
//
// Verification: every slot was rung exactly once and by a warp that reserved it (a ring log
// in device memory), the doorbell and the turn word end at W*P, each warp's ring log entries
// count P, and every reader's chase ends on the line the host computes for its step count.
#include "common.cuh"

namespace prim {
namespace {

constexpr int kLineWords = 16;  // one index per 128-byte line
constexpr size_t kLines = 256;  // lines per reader cycle (32 KiB of host memory)

struct Args {
  uint64_t* ring;         // pinned host: W*P WQEs of 8 words
  uint32_t* db;           // pinned host: the doorbell word
  unsigned* resv;         // device: the slot counter
  unsigned* turn;         // device: the turn word
  unsigned* log;          // device: who rang each slot (warp + 1)
  const uint64_t* lines;  // pinned host: the readers' cycle
  unsigned* arrive;
  unsigned* done;
  volatile unsigned* stop;
  unsigned long long* handoff_ns;  // per poster
  unsigned long long* release_ns;  // per poster
  uint64_t* end_idx;               // per reader
  unsigned long long* steps;       // per reader
  Status* st;
  int W, R, posts, sys, post;
};

__global__ void turn_kernel(Args a) {
  const unsigned lane = threadIdx.x & 31u;
  const int b = int(blockIdx.x);
  if (lane == 0) atomicAdd(a.arrive, 1u);
  const unsigned parties = unsigned(a.W + a.R);
  if (lane == 0 &&
      !spin_until(a.st, 80, [&] { return *reinterpret_cast<volatile unsigned*>(a.arrive) >= parties; }))
    *a.stop = 1u;
  __syncwarp();
  if (b >= a.W) {  // a reader: chase the shared cycle until the posters are done
    const int r = b - a.W;
    uint64_t idx = 0;
    const unsigned long long n = chase_lines(a.lines, kLines, kLineWords, a.stop, a.st, idx);
    if (lane == 0) {
      a.end_idx[r] = idx;
      a.steps[r] = n;
    }
    return;
  }
  if (lane != 0) return;  // a poster: lane 0 alone, as hw/ep's turn is lane 0's
  const unsigned w = unsigned(b);
  unsigned long long rel = 0;
  const unsigned long long t0 = gtimer();
  for (int p = 0; p < a.posts; ++p) {
    const unsigned slot = atomicAdd(a.resv, 1u);
    if (a.post) {
      uint64_t words[8];
      make_wqe_words(slot, 1u << 16, w & 0xffffu, words);
      uint64_t* e = a.ring + size_t(slot) * 8;
#pragma unroll
      for (int j = 0; j < 8; ++j) st_volatile(e + j, words[j]);
      __threadfence_system();
    }
    bool ok = a.sys ? spin_until(a.st, 81, [&] { return ld_acquire_sys32(a.turn) == slot; })
                    : spin_until(a.st, 81, [&] { return ld_acquire_gpu32(a.turn) == slot; });
    if (!ok) break;
    const unsigned long long t1 = gtimer();
    st_volatile32(a.db, slot + 1u);
    a.log[slot] = w + 1u;
    if (a.sys) st_release_sys32(a.turn, slot + 1u);
    else st_release_gpu32(a.turn, slot + 1u);
    rel += gtimer() - t1;
  }
  const unsigned long long t2 = gtimer();
  a.handoff_ns[w] = (t2 - t0) / (unsigned long long)(a.posts * a.W);
  a.release_ns[w] = rel / (unsigned long long)a.posts;
  if (atomicAdd(a.done, 1u) + 1u == unsigned(a.W)) *a.stop = 1u;
}

struct Out {
  std::vector<double> handoff, release;
};

Out one(int W, int R, bool sys, bool post, int posts, int launches, const std::string& what) {
  const unsigned total = unsigned(W * posts);
  auto next = random_cycle(kLines, 13);
  HostBuf<uint64_t> ring(size_t(total) * 8);
  HostBuf<uint32_t> db(32);
  HostBuf<uint64_t> lines(kLines * kLineWords);
  for (size_t i = 0; i < kLines; ++i) lines.p[i * kLineWords] = next[i];
  DevBuf<unsigned> resv(1), turn(1), log(total), arrive(1), done(1), stop(1);
  DevBuf<unsigned long long> hns(W), rns(W), steps(R > 0 ? R : 1);
  DevBuf<uint64_t> end_idx(R > 0 ? R : 1);
  HostBuf<Status> st(1);
  Out out;
  for (int l = 0; l < launches + 1; ++l) {  // launch 0 is warm-up
    db.p[0] = 0;
    PRIM_CHECK(cudaMemset(resv.p, 0, sizeof(unsigned)));
    PRIM_CHECK(cudaMemset(turn.p, 0, sizeof(unsigned)));
    PRIM_CHECK(cudaMemset(log.p, 0, total * sizeof(unsigned)));
    PRIM_CHECK(cudaMemset(arrive.p, 0, sizeof(unsigned)));
    PRIM_CHECK(cudaMemset(done.p, 0, sizeof(unsigned)));
    PRIM_CHECK(cudaMemset(stop.p, 0, sizeof(unsigned)));
    Args a{ring.p, db.p, resv.p, turn.p, log.p, lines.p, arrive.p, done.p, stop.p, hns.p, rns.p,
           end_idx.p, steps.p, st.p, W, R, posts, sys ? 1 : 0, post ? 1 : 0};
    turn_kernel<<<W + R, 32>>>(a);
    finish(0, st.p, what);
    verify(*reinterpret_cast<volatile uint32_t*>(db.p) == total, what + ": the doorbell does not end at W*P");
    verify(turn.to_host()[0] == total, what + ": the turn word does not end at W*P");
    std::vector<int> per(W, 0);
    for (unsigned v : log.to_host()) {
      verify(v >= 1 && int(v) <= W, what + ": a slot was never rung");
      ++per[v - 1];
    }
    for (int w = 0; w < W; ++w)
      verify(per[w] == posts, what + ": warp " + std::to_string(w) + " did not ring its slots");
    if (R > 0) {
      auto got = end_idx.to_host();
      auto n = steps.to_host();
      for (int r = 0; r < R; ++r) {
        uint64_t idx = 0;
        for (unsigned long long k = 0; k < n[r]; ++k) idx = next[idx % kLines];
        verify(got[r] == idx, what + ": reader " + std::to_string(r) + " chase ended off its cycle");
      }
    }
    if (l == 0) continue;
    for (auto v : hns.to_host()) out.handoff.push_back(double(v));
    for (auto v : rns.to_host()) out.release.push_back(double(v));
  }
  return out;
}

}  // namespace

Result run_turn_handoff(int device, int reps) {
  const int sms = use_device(device);
  Result res;
  const int posts = 64;
  const int launches = std::max(3, reps / 20);
  auto add = [&](int W, int R, bool sys, bool post) {
    if (W + R > sms) return;
    const std::string tag = std::string(sys ? "sys" : "gpu") + (post ? "_post" : "_bare") + "_w" +
                            std::to_string(W) + "_r" + std::to_string(R) + "_ns";
    Out o = one(W, R, sys, post, posts, launches, "turn_handoff_" + tag);
    res.first["turn_handoff_" + tag] = o.handoff;
    res.first["turn_release_" + tag] = o.release;
  };
  for (bool sys : {true, false})
    for (bool post : {false, true})
      for (int W : {2, 4, 12}) add(W, 0, sys, post);
  for (int R : {8, 32, 96}) {
    add(12, R, true, true);
    add(12, R, true, false);
  }
  res.second.push_back(
      "turn_handoff: every slot rung once by a warp that reserved it, doorbell and turn at W*P, "
      "every reader's chase on its cycle");
  return res;
}

}  // namespace prim
