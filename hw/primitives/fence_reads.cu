// Fence-under-reads family: what one warp's system fence costs while other warps of the GPU
// poll pinned host memory. The model (sim/issuer.py HostReadPath.fence_ns, CqReadQueue) has a
// ringer's fence wait until the host reads in flight are back; the open question is which
// reads: those of its own SM only or of the whole GPU, and, where many warps read the same
// lines (the warps sharing a QP polling its CQ from the same consumer index), whether reads
// queued behind one another count or only the one on the wire.
//
//   fence_reads_{shared,private}_{samesm,othersm}_w{W}_ns
//       one fencer warp: a 64-bit store to device memory then __threadfence_system(), timed
//       per fence over batches of 16 (%globaltimer), while W reader warps chase cycles of
//       lines in pinned host memory, 32 lanes per step (one line each, ld.relaxed.sys), all W
//       on the same cycle (shared: the same lines at the same time) or each its own
//       (private). samesm: the fencer is a second warp of reader 0's block; othersm: the
//       fencer is a block of its own. W = 0: the fence with no reader (the same number as
//       stores_fences' fence_system_after_device_store_ns, measured in this launch shape).
//   fence_reads_step_{shared,private}_w{W}_ns
//       the readers' own time per step in the same launches (one step = one round trip of
//       their read, queued or not), so the fence can be read against it.
//   fence_concurrent_{host,device}_w{W}_ns
//       W warps, one per SM, lane 0 of each storing 8 bytes to its own line (pinned host
//       memory: a WQE in a host-memory SQ; or device memory) and issuing __threadfence_system(),
//       back to back, all starting together: what each fence costs when W warps fence at once
//       (the testbed's 96 issuing warps), against one warp's (W = 1).
//
// Verification: every reader's chase ends on the line the host computes by walking the same
// cycle for the step count the reader reports; the fencer's device word holds its last value.
#include "common.cuh"

namespace prim {
namespace {

constexpr int kLineWords = 16;   // one index per 128-byte line
constexpr size_t kLines = 256;   // lines per cycle (32 KiB of host memory)
constexpr int kPer = 16;         // fences per sample

// One thread: an 8-byte store to `word` then __threadfence_system(), back to back; each of
// `reps` samples (after `warmup`) is the mean ns per fence over kPer of them. The word ends
// holding kPer * (warmup + reps), which the host checks.
__device__ void timed_fences(uint64_t* word, int warmup, int reps, unsigned long long* ns) {
  uint64_t v = 0;
  for (int s = -warmup; s < reps; ++s) {
    const unsigned long long t0 = gtimer();
    for (int k = 0; k < kPer; ++k) {
      st_volatile(word, ++v);
      __threadfence_system();
    }
    const unsigned long long t1 = gtimer();
    if (s >= 0) ns[s] = (t1 - t0) / kPer;
  }
}

__global__ void fence_reads_kernel(const uint64_t* base, int W, int shared, int same_sm, int warmup,
                                   int reps, unsigned* arrive, volatile unsigned* stop,
                                   uint64_t* word, unsigned long long* fence_ns,
                                   unsigned long long* step_ns, uint64_t* end_idx,
                                   unsigned long long* steps, Status* st) {
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  // who am I: reader r (warp 0 of block r < W), or the fencer (warp 1 of block 0 when
  // same_sm, else warp 0 of block W)
  const bool fencer = same_sm ? (blockIdx.x == 0 && warp == 1) : (int(blockIdx.x) == W && warp == 0);
  const bool reader = !fencer && warp == 0 && int(blockIdx.x) < W;
  if (!fencer && !reader) return;
  if (lane == 0) atomicAdd(arrive, 1u);
  const unsigned parties = unsigned(W) + 1u;
  if (lane == 0 &&
      !spin_until(st, 70, [&] { return *reinterpret_cast<volatile unsigned*>(arrive) >= parties; }))
    return;
  __syncwarp();
  if (reader) {
    const unsigned r = blockIdx.x;
    const uint64_t* mine = base + (shared ? size_t(0) : size_t(r) * kLines * kLineWords);
    uint64_t idx = 0;
    const unsigned long long t0 = gtimer();
    const unsigned long long n = chase_lines(mine, kLines, kLineWords, stop, st, idx);
    const unsigned long long t1 = gtimer();
    if (lane == 0) {
      end_idx[r] = idx;
      steps[r] = n;
      step_ns[r] = (t1 - t0) / n;
    }
    return;
  }
  // the fencer: lane 0 alone, as a ringer's fence is one thread's
  if (lane == 0) {
    timed_fences(word, warmup, reps, fence_ns);
    *stop = 1u;
  }
}

__global__ void fence_concurrent_kernel(uint64_t* words, int warmup, int reps, unsigned* arrive,
                                        unsigned long long* ns, Status* st) {
  if (threadIdx.x != 0) return;
  const unsigned w = blockIdx.x, W = gridDim.x;
  atomicAdd(arrive, 1u);
  if (!spin_until(st, 71, [&] { return *reinterpret_cast<volatile unsigned*>(arrive) >= W; })) return;
  timed_fences(words + size_t(w) * kLineWords, warmup, reps, ns + size_t(w) * reps);
}

std::vector<double> concurrent(int W, bool host, int reps, const std::string& what) {
  const int warmup = 4;
  DevBuf<unsigned> arrive(1);
  DevBuf<unsigned long long> ns(size_t(W) * reps);
  HostBuf<Status> st(1);
  std::vector<uint64_t> got(size_t(W) * kLineWords);
  if (host) {
    HostBuf<uint64_t> words(size_t(W) * kLineWords);
    fence_concurrent_kernel<<<W, 32>>>(words.p, warmup, reps, arrive.p, ns.p, st.p);
    finish(0, st.p, what);
    std::memcpy(got.data(), words.p, got.size() * sizeof(uint64_t));
  } else {
    DevBuf<uint64_t> words(size_t(W) * kLineWords);
    fence_concurrent_kernel<<<W, 32>>>(words.p, warmup, reps, arrive.p, ns.p, st.p);
    finish(0, st.p, what);
    got = words.to_host();
  }
  for (int w = 0; w < W; ++w)
    verify(got[size_t(w) * kLineWords] == uint64_t(kPer) * uint64_t(warmup + reps),
           what + ": warp " + std::to_string(w) + "'s word does not hold its last store");
  auto raw = ns.to_host();
  return std::vector<double>(raw.begin(), raw.end());
}

struct One {
  std::vector<double> fence, step;
};

One one(int W, bool shared, bool same_sm, int reps, const std::string& what) {
  const int warmup = 4;
  auto next = random_cycle(kLines, 11);
  const int cycles = shared ? 1 : (W > 0 ? W : 1);
  HostBuf<uint64_t> buf(size_t(cycles) * kLines * kLineWords);
  for (int c = 0; c < cycles; ++c)
    for (size_t i = 0; i < kLines; ++i) buf.p[(size_t(c) * kLines + i) * kLineWords] = next[i];
  DevBuf<unsigned> arrive(1), stop(1);
  DevBuf<uint64_t> word(1), end_idx(W > 0 ? W : 1);
  DevBuf<unsigned long long> fence_ns(reps), step_ns(W > 0 ? W : 1), steps(W > 0 ? W : 1);
  HostBuf<Status> st(1);
  // same_sm with no reader: block 0 has the fencer as its warp 1 and no reader
  const int blocks = same_sm ? (W > 0 ? W : 1) : W + 1;
  const int threads = same_sm ? 64 : 32;
  fence_reads_kernel<<<blocks, threads>>>(buf.p, W, shared ? 1 : 0, same_sm ? 1 : 0, warmup, reps,
                                          arrive.p, stop.p, word.p, fence_ns.p, step_ns.p, end_idx.p,
                                          steps.p, st.p);
  finish(0, st.p, what);
  verify(word.to_host()[0] == uint64_t(kPer) * uint64_t(warmup + reps),
         what + ": the fencer's word does not hold its last store");
  One out;
  auto f = fence_ns.to_host();
  out.fence.assign(f.begin(), f.end());
  if (W > 0) {
    auto got = end_idx.to_host();
    auto n = steps.to_host();
    auto sn = step_ns.to_host();
    for (int r = 0; r < W; ++r) {
      uint64_t idx = 0;
      for (unsigned long long k = 0; k < n[r]; ++k) idx = next[idx % kLines];
      verify(got[r] == idx, what + ": reader " + std::to_string(r) + " chase ended on line " +
                                std::to_string(got[r]) + ", host expects " + std::to_string(idx));
      out.step.push_back(double(sn[r]));
    }
  }
  return out;
}

}  // namespace

Result run_fence_reads(int device, int reps) {
  const int sms = use_device(device);
  Result res;
  for (bool shared : {true, false}) {
    const std::string lines = shared ? "shared" : "private";
    for (int W : {0, 1, 2, 4, 8, 16, 32}) {
      if (W + 1 > sms) continue;
      for (bool same : {false, true}) {
        if (W == 0 && !shared) continue;  // no reader: one baseline per placement is enough
        const std::string name = "fence_reads_" + lines + (same ? "_samesm" : "_othersm") + "_w" +
                                 std::to_string(W) + "_ns";
        One o = one(W, shared, same, reps, name);
        res.first[name] = o.fence;
        if (!same && W > 0) res.first["fence_reads_step_" + lines + "_w" + std::to_string(W) + "_ns"] = o.step;
      }
    }
  }
  for (bool host : {true, false})
    for (int W : {1, 2, 4, 8, 16, 32, 64, 96, 128}) {
      if (W > sms) continue;
      const std::string name = std::string("fence_concurrent_") + (host ? "host" : "device") + "_w" +
                               std::to_string(W) + "_ns";
      res.first[name] = concurrent(W, host, reps, name);
    }
  res.second.push_back("fence_reads: every reader's chase ended on the host-computed line for its "
                       "step count, every fencer's word holds its last store");
  return res;
}

}  // namespace prim
