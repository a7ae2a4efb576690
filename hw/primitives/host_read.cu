// Host-read contention family: W warps (one per SM) reading pinned host memory at once, as
// the native path's credit checks do when every warp polls a send CQ in host memory. One
// warp alone pays one PCIe read round trip per dependent load (latency.cu pcie_read_rtt_ns);
// the question is what each pays when W of them read at the same time.
//
//   host_read_w{W}_ns        lane 0 of each of W warps chases its own cycle of lines in
//                            pinned host memory (one dependent ld.relaxed.sys per step)
//   host_read_warp32_w{W}_ns the same, but every step all 32 lanes load one line each (a
//                            warp reading 32 CQEs at once, as hw/ep's cq_poll does); lane 0's
//                            value is the next index, the others' feed a checksum
//   host_read_shared_w{W}_ns the 32-lane step, but all W warps chase the same cycle: they
//                            read the same lines at the same time, as the warps sharing a QP
//                            poll its CQ (the same 32 CQEs from the same consumer index)
// A sample is one warp's wall time (%globaltimer) for a batch of steps / steps, after
// warm-up; samples of all warps are pooled. All warps start together (an arrival barrier).
//
// Verification: every warp's chase ends on the line the host computes by walking the same
// cycle, and the 32-lane checksum equals the host's.
#include "common.cuh"

namespace prim {
namespace {

constexpr int kLineWords = 16;   // one index per 128-byte line
constexpr size_t kLines = 256;   // lines per warp (32 KiB of host memory each)

__global__ void host_read_kernel(const uint64_t* base, int lanes, int shared, int per_sample,
                                 int warmup, int reps, unsigned* arrive, unsigned long long* ns,
                                 uint64_t* end_idx, uint64_t* sums, Status* st) {
  const unsigned w = blockIdx.x, W = gridDim.x, lane = threadIdx.x;
  const uint64_t* mine = base + (shared ? size_t(0) : size_t(w) * kLines * kLineWords);
  if (lane == 0) atomicAdd(arrive, 1u);
  if (lane == 0 &&
      !spin_until(st, 60, [&] { return *reinterpret_cast<volatile unsigned*>(arrive) >= W; }))
    return;
  __syncwarp();
  uint64_t idx = 0, sum = 0;
  for (int s = -warmup; s < reps; ++s) {
    unsigned long long t0 = gtimer();
    for (int k = 0; k < per_sample; ++k) {
      uint64_t v = 0;
      if (int(lane) < lanes) v = ld_relaxed_sys(mine + ((idx + lane) % kLines) * kLineWords);
      if (lane != 0) sum += v;
      idx = __shfl_sync(0xffffffffu, v, 0);
    }
    unsigned long long t1 = gtimer();
    if (s >= 0 && lane == 0) ns[size_t(w) * reps + s] = (t1 - t0) / (unsigned long long)per_sample;
  }
  for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0) {
    end_idx[w] = idx;
    sums[w] = sum;
  }
}

std::vector<double> one(int W, int lanes, bool shared, int reps, const std::string& what) {
  const int per = 16, warmup = 4;
  auto next = random_cycle(kLines, 7);
  HostBuf<uint64_t> buf(size_t(W) * kLines * kLineWords);
  for (int w = 0; w < W; ++w)
    for (size_t i = 0; i < kLines; ++i) buf.p[(size_t(w) * kLines + i) * kLineWords] = next[i];
  DevBuf<unsigned> arrive(1);
  DevBuf<unsigned long long> ns(size_t(W) * reps);
  DevBuf<uint64_t> end_idx(W), sums(W);
  HostBuf<Status> st(1);
  PRIM_CHECK(cudaMemset(arrive.p, 0, sizeof(unsigned)));
  host_read_kernel<<<W, 32>>>(buf.p, lanes, shared ? 1 : 0, per, warmup, reps, arrive.p, ns.p,
                              end_idx.p, sums.p, st.p);
  finish(0, st.p, what);
  // host replay: lane 0's chain, and the other lanes' lines summed at every step
  uint64_t idx = 0, sum = 0;
  for (int k = 0; k < per * (warmup + reps); ++k) {
    for (int l = 1; l < lanes; ++l) sum += next[(idx + l) % kLines];
    idx = next[idx % kLines];
  }
  auto got = end_idx.to_host();
  auto gs = sums.to_host();
  for (int w = 0; w < W; ++w) {
    verify(got[w] == idx, what + ": warp " + std::to_string(w) + " chase ended on line " +
                              std::to_string(got[w]) + ", host expects " + std::to_string(idx));
    verify(gs[w] == sum, what + ": warp " + std::to_string(w) + " checksum differs from the host's");
  }
  auto raw = ns.to_host();
  return std::vector<double>(raw.begin(), raw.end());
}

}  // namespace

Result run_host_read(int device, int reps) {
  const int sms = use_device(device);
  Result res;
  for (int W : {1, 2, 4, 8, 16, 32, 64, 96, 128}) {
    if (W > sms) continue;
    for (int lanes : {1, 32}) {
      std::string name = std::string(lanes == 1 ? "host_read_w" : "host_read_warp32_w") +
                         std::to_string(W) + "_ns";
      res.first[name] = one(W, lanes, false, reps, name);
    }
  }
  for (int W : {1, 2, 4, 8, 12, 16, 24, 32}) {
    if (W > sms) continue;
    const std::string name = "host_read_shared_w" + std::to_string(W) + "_ns";
    res.first[name] = one(W, 32, true, reps, name);
  }
  res.second.push_back("host_read: every warp's chase ended on the host-computed line, 32-lane "
                       "checksums equal the host's (also when all warps read the same lines)");
  return res;
}

}  // namespace prim
