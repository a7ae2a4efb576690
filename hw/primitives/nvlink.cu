// NVLink family (two GPUs with peer access):
//   nvlink_flag_rtt_ns               GPU0 stores a flag into GPU1's memory (st.relaxed.sys
//                                    over NVLink, no fence), GPU1 polls its own memory and
//                                    answers the same way; round trip per exchange
//   nvlink_flag_release_rtt_ns       the same with st.release.sys (a system fence before
//                                    each flag: what a flag that publishes data costs)
//   nvlink_copy_gbytes_per_s         cudaMemcpyPeerAsync of 256 MiB GPU0 -> GPU1 (copy engines)
//   nvlink_kernel_copy_gbytes_per_s  the same bytes moved by SM loads/stores into the peer
//                                    pointer (what NVLink forward warps do)
//
// Verification: each side must see exactly the value it waits for (never a skipped or
// old one); the destination is poisoned before every copy and checked word for word
// against the source pattern after it.
#include "common.cuh"

namespace prim {
namespace {

__device__ __forceinline__ void put_flag(uint64_t* p, uint64_t v, int release) {
  if (release) st_release_sys(p, v);
  else st_relaxed_sys(p, v);
}

__global__ void ping_kernel(uint64_t* peer_flag, uint64_t* my_flag, int release, int per,
                            int warmup, int reps, long long* cycles, ClockCal* cal, Status* st) {
  uint64_t i = 0;
  for (int s = -warmup; s < reps; ++s) {
    if (s == 0) cal_begin(cal);
    long long t0 = clock64();
    for (int k = 0; k < per; ++k) {
      ++i;
      put_flag(peer_flag, i, release);
      uint64_t v = 0;
      if (!spin_until(st, 50, [&] { v = ld_acquire_sys(my_flag); return v != i - 1; })) return;
      if (v != i) { fail(st, kMismatch, 51, i, v); return; }
    }
    long long t1 = clock64();
    if (s >= 0) cycles[s] = t1 - t0;
  }
  cal_end(cal);
}

__global__ void pong_kernel(uint64_t* peer_flag, uint64_t* my_flag, int release, uint64_t total,
                            Status* st) {
  for (uint64_t i = 1; i <= total; ++i) {
    uint64_t v = 0;
    if (!spin_until(st, 52, [&] { v = ld_acquire_sys(my_flag); return v != i - 1; })) return;
    if (v != i) { fail(st, kMismatch, 53, i, v); return; }
    put_flag(peer_flag, i, release);
  }
}

__host__ __device__ inline uint4 pattern(size_t i, int pass) {
  uint32_t a = uint32_t(i * 2246822519u) ^ uint32_t(pass * 3266489917u);
  return make_uint4(a, ~a, uint32_t(i), uint32_t(pass) + 7u);
}

__global__ void fill_kernel(uint4* p, size_t n, int pass) {
  size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    p[i] = pattern(i, pass);
}

__global__ void copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t n) {
  size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = src[i];
}

__global__ void check_kernel(const uint4* p, size_t n, int pass, unsigned long long* bad) {
  size_t stride = size_t(gridDim.x) * blockDim.x;
  unsigned long long local = 0;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    uint4 v = p[i], w = pattern(i, pass);
    local += (v.x != w.x) | (v.y != w.y) | (v.z != w.z) | (v.w != w.w);
  }
  if (local) atomicAdd(bad, local);
}

void enable_peer(int a, int b) {
  int can = 0;
  PRIM_CHECK(cudaDeviceCanAccessPeer(&can, a, b));
  if (!can)
    throw std::runtime_error("GPU " + std::to_string(a) + " can not access GPU " +
                             std::to_string(b) + " as a peer");
  PRIM_CHECK(cudaSetDevice(a));
  cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
  else PRIM_CHECK(e);
}

}  // namespace

Result run_nvlink(int d0, int d1, int reps) {
  enable_peer(d0, d1);
  enable_peer(d1, d0);
  Result res;
  int sms = 0;
  PRIM_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d0));
  for (int release = 0; release <= 1; ++release) {  // flag ping-pong
    const int per = 32, warmup = 10;
    std::string name = release ? "nvlink_flag_release_rtt" : "nvlink_flag_rtt";
    PRIM_CHECK(cudaSetDevice(d1));
    DevBuf<uint64_t> flag1(16);
    Stream s1;
    PRIM_CHECK(cudaSetDevice(d0));
    DevBuf<uint64_t> flag0(16);
    DevBuf<long long> cycles(reps);
    DevBuf<ClockCal> cal(1);
    HostBuf<Status> st(1);  // portable: both GPUs report into it
    Stream s0;
    uint64_t total = uint64_t(per) * (warmup + reps);
    PRIM_CHECK(cudaSetDevice(d1));
    pong_kernel<<<1, 1, 0, s1.s>>>(flag0.p, flag1.p, release, total, st.p);
    PRIM_CHECK(cudaGetLastError());
    PRIM_CHECK(cudaSetDevice(d0));
    ping_kernel<<<1, 1, 0, s0.s>>>(flag1.p, flag0.p, release, per, warmup, reps, cycles.p, cal.p,
                                   st.p);
    finish(s0.s, st.p, name);
    PRIM_CHECK(cudaSetDevice(d1));
    finish(s1.s, st.p, name + " (peer)");
    PRIM_CHECK(cudaSetDevice(d0));
    res.first[name + "_ns"] = per_op_ns(cycles.to_host(), ns_per_clk(cal.to_host()[0], name), per);
  }
  res.second.push_back("nvlink flags (relaxed and release): both GPUs saw every flag value in order");
  {  // copies
    const size_t bytes = size_t(256) << 20, n = bytes / sizeof(uint4);
    const int passes = std::max(4, reps / 10) + 1;  // pass 0 is warm-up
    PRIM_CHECK(cudaSetDevice(d1));
    DevBuf<uint4> dst(n);
    DevBuf<unsigned long long> bad(1);
    PRIM_CHECK(cudaSetDevice(d0));
    DevBuf<uint4> src(n);
    Stream s0;
    Event e0, e1;
    for (int kernel = 0; kernel <= 1; ++kernel) {
      std::string name = kernel ? "nvlink_kernel_copy_gbytes_per_s" : "nvlink_copy_gbytes_per_s";
      std::vector<double> v;
      for (int p = 0; p < passes; ++p) {
        int pass = kernel * 100 + p;
        PRIM_CHECK(cudaSetDevice(d0));
        fill_kernel<<<sms * 4, 512, 0, s0.s>>>(src.p, n, pass);
        PRIM_CHECK(cudaGetLastError());
        PRIM_CHECK(cudaStreamSynchronize(s0.s));
        PRIM_CHECK(cudaSetDevice(d1));
        PRIM_CHECK(cudaMemset(dst.p, 0xff, bytes));  // poison
        PRIM_CHECK(cudaMemset(bad.p, 0, sizeof(unsigned long long)));
        PRIM_CHECK(cudaDeviceSynchronize());
        PRIM_CHECK(cudaSetDevice(d0));
        PRIM_CHECK(cudaEventRecord(e0.e, s0.s));
        if (kernel) copy_kernel<<<sms * 4, 512, 0, s0.s>>>(src.p, dst.p, n);
        else PRIM_CHECK(cudaMemcpyPeerAsync(dst.p, d1, src.p, d0, bytes, s0.s));
        PRIM_CHECK(cudaEventRecord(e1.e, s0.s));
        PRIM_CHECK(cudaGetLastError());
        PRIM_CHECK(cudaEventSynchronize(e1.e));
        float ms = 0;
        PRIM_CHECK(cudaEventElapsedTime(&ms, e0.e, e1.e));
        PRIM_CHECK(cudaSetDevice(d1));
        check_kernel<<<sms * 4, 512>>>(dst.p, n, pass, bad.p);
        PRIM_CHECK(cudaGetLastError());
        PRIM_CHECK(cudaDeviceSynchronize());
        unsigned long long nbad = bad.to_host()[0];
        verify(nbad == 0, name + ": " + std::to_string(nbad) + " words differ after the copy");
        if (p) v.push_back(double(bytes) / (double(ms) * 1e-3) / 1e9);
      }
      res.first[name] = v;
    }
    PRIM_CHECK(cudaSetDevice(d0));
    res.second.push_back("nvlink copies: poisoned destination equals the source pattern after every copy");
  }
  return res;
}

}  // namespace prim
