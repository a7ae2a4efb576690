// CPU-proxy hand-off family: a GPU warp writes 128-byte descriptors into a ring in
// pinned host memory; C++ host threads (proxy_host.cpp) consume them.
//
//   gpu_cpu_flag_rtt_ns        flag ping-pong GPU <-> host thread through pinned memory
//   proxy_descriptor_store_ns  one warp-wide 128 B descriptor store to the host ring, no fence
//   proxy_desc_rtt_ns          descriptor + producer index (st.release.sys), host checks it and
//                              publishes its consumer index, GPU polls that: one hand-off
//                              round trip (ring depth 32)
//   proxy_t{T}_{fence1,batch8}_mops     sustained descriptors/s over T rings, one GPU
//                                       warp and one host thread per ring (T = 1,2,4,8);
//                                       fence1: release-store of the producer index
//                                       (a system fence) per descriptor, batch8: one
//                                       per 8 descriptors
//   proxy_t{T}_{fence1,batch8}_desc_ns  the same as ns per descriptor of one warp
//
// Verification: the host checks all 16 words of every descriptor (sequence, ring and
// launch epoch) before acknowledging it; the GPU waits for every acknowledgement; the
// flag echo must see every value in order; the no-fence store test reads the ring back.
#include <thread>

#include "common.cuh"
#include "proxy_host.h"

namespace prim {
namespace {

constexpr uint32_t kDepth = 32;  // NCCL GIN proxy queue depth on EFA

__global__ void flag_rtt_kernel(uint64_t* gpu_flag, uint64_t* host_flag, int per, int warmup,
                                int reps, long long* cycles, ClockCal* cal, Status* st) {
  uint64_t i = 0;
  for (int s = -warmup; s < reps; ++s) {
    if (s == 0) cal_begin(cal);
    long long t0 = clock64();
    for (int k = 0; k < per; ++k) {
      ++i;
      st_relaxed_sys(gpu_flag, i);
      uint64_t v = 0;
      if (!spin_until(st, 30, [&] { v = ld_acquire_sys(host_flag); return v != i - 1; })) return;
      if (v != i) { fail(st, kMismatch, 31, i, v); return; }
    }
    long long t1 = clock64();
    if (s >= 0) cycles[s] = t1 - t0;
  }
  cal_end(cal);
}

// Warp-wide post of descriptor i: credit check (lane 0), 16 lanes x 8 B coalesced
// store, then (if publish) the producer index by lane 0 as st.release.sys: one
// system-scope fence that also covers the other lanes' stores (ordered by __syncwarp),
// as NCCL GIN publishes its producer index with a system-scope release.
__device__ inline bool post_one(ProxyDesc* ring, ProxyCtl* ctl, uint64_t i, uint32_t r,
                                uint32_t epoch, uint64_t& cons_cached, bool publish, Status* st) {
  int lane = threadIdx.x & 31;
  int ok = 1;
  if (lane == 0 && i - cons_cached >= kDepth) {
    ok = spin_until(st, 20, [&] {
      cons_cached = ld_acquire_sys(&ctl->cons);
      return i - cons_cached < kDepth;
    });
  }
  ok = __shfl_sync(0xffffffffu, ok, 0);
  if (!ok) return false;
  if (lane < 16) st_volatile(&ring[i % kDepth].w[lane], proxy_desc_word(i, r, lane, epoch));
  __syncwarp();
  if (publish && lane == 0) st_release_sys(&ctl->prod, i + 1);  // the system-scope fence
  __syncwarp();
  return true;
}

__global__ void desc_store_kernel(ProxyDesc* ring, int per, int warmup, int reps, uint32_t epoch,
                                  long long* cycles, ClockCal* cal) {
  int lane = threadIdx.x & 31;
  uint64_t i = 0;
  for (int s = -warmup; s < reps; ++s) {
    if (s == 0 && lane == 0) cal_begin(cal);
    __syncwarp();
    long long t0 = clock64();
    for (int k = 0; k < per; ++k, ++i)
      if (lane < 16) st_volatile(&ring[i % kDepth].w[lane], proxy_desc_word(i, 0, lane, epoch));
    __syncwarp();
    long long t1 = clock64();
    if (s >= 0 && lane == 0) cycles[s] = t1 - t0;
    __threadfence_system();  // drain outside the timed region
  }
  if (lane == 0) cal_end(cal);
}

__global__ void proxy_rtt_kernel(ProxyDesc* ring, ProxyCtl* ctl, int per, int warmup, int reps,
                                 uint32_t epoch, long long* cycles, ClockCal* cal, Status* st) {
  int lane = threadIdx.x & 31;
  uint64_t i = 0, cons_cached = 0;
  for (int s = -warmup; s < reps; ++s) {
    if (s == 0 && lane == 0) cal_begin(cal);
    long long t0 = clock64();
    for (int k = 0; k < per; ++k, ++i) {
      if (!post_one(ring, ctl, i, 0, epoch, cons_cached, true, st)) return;
      int ok = 1;
      if (lane == 0)
        ok = spin_until(st, 21, [&] {
          cons_cached = ld_acquire_sys(&ctl->cons);
          return cons_cached >= i + 1;
        });
      if (!__shfl_sync(0xffffffffu, ok, 0)) return;
    }
    long long t1 = clock64();
    if (s >= 0 && lane == 0) cycles[s] = t1 - t0;
  }
  if (lane == 0) cal_end(cal);
}

__global__ void proxy_stream_kernel(ProxyDesc* rings, ProxyCtl* ctls, uint64_t count, int batch,
                                    uint32_t epoch, unsigned long long* t_start,
                                    unsigned long long* t_end, Status* st) {
  int lane = threadIdx.x & 31;
  uint32_t r = blockIdx.x;
  ProxyDesc* ring = rings + size_t(r) * kDepth;
  ProxyCtl* ctl = ctls + r;
  uint64_t cons_cached = 0;
  if (lane == 0) t_start[r] = gtimer();
  for (uint64_t i = 0; i < count; ++i) {
    bool publish = (i + 1) % uint64_t(batch) == 0 || i + 1 == count;
    if (!post_one(ring, ctl, i, r, epoch, cons_cached, publish, st)) return;
  }
  int ok = 1;  // the run ends when the host has consumed everything
  if (lane == 0)
    ok = spin_until(st, 22, [&] { return ld_acquire_sys(&ctl->cons) >= count; });
  if (lane == 0 && ok) t_end[r] = gtimer();
}

struct Rings {
  HostBuf<ProxyDesc> ring;
  HostBuf<ProxyCtl> ctl;
  explicit Rings(int t) : ring(size_t(t) * kDepth), ctl(t) {}
  void reset() {
    std::memset(static_cast<void*>(ring.p), 0, ring.n * sizeof(ProxyDesc));
    std::memset(static_cast<void*>(ctl.p), 0, ctl.n * sizeof(ProxyCtl));
  }
};

void raise_host_errors(const std::vector<std::string>& errs, const std::string& what) {
  for (const std::string& e : errs)
    if (!e.empty()) throw std::runtime_error(what + ": host proxy: " + e);
}

}  // namespace

Result run_proxy_ring(int device, int reps) {
  PRIM_CHECK(cudaSetDevice(device));
  Result res;
  const int warmup = 10;
  uint32_t epoch = 1;
  Stream stream;

  {  // flag ping-pong
    const int per = 16;
    HostBuf<uint64_t> gflag(16), hflag(16);
    HostBuf<Status> st(1);
    DevBuf<long long> cycles(reps);
    DevBuf<ClockCal> cal(1);
    flag_rtt_kernel<<<1, 1, 0, stream.s>>>(gflag.p, hflag.p, per, warmup, reps, cycles.p, cal.p,
                                           st.p);
    PRIM_CHECK(cudaGetLastError());
    std::string err = flag_echo(gflag.p, hflag.p, uint64_t(per) * (warmup + reps), &st.p->code,
                                kHostTimeoutS);
    if (!err.empty()) host_fail(st.p, 32, 0, 0);
    finish(stream.s, st.p, "gpu_cpu_flag_rtt");
    raise_host_errors({err}, "gpu_cpu_flag_rtt");
    res.first["gpu_cpu_flag_rtt_ns"] =
        per_op_ns(cycles.to_host(), ns_per_clk(cal.to_host()[0], "gpu_cpu_flag_rtt"), per);
    res.second.push_back("gpu_cpu_flag_rtt: the host saw every flag value in order, the GPU every echo");
  }
  {  // descriptor store cost, no fence
    const int per = 32;
    Rings r(1);
    DevBuf<long long> cycles(reps);
    DevBuf<ClockCal> cal(1);
    ++epoch;
    desc_store_kernel<<<1, 32, 0, stream.s>>>(r.ring.p, per, warmup, reps, epoch, cycles.p, cal.p);
    PRIM_CHECK(cudaGetLastError());
    PRIM_CHECK(cudaStreamSynchronize(stream.s));
    uint64_t total = uint64_t(per) * (warmup + reps);
    for (uint32_t slot = 0; slot < kDepth; ++slot) {
      uint64_t last = total - 1 - ((total - 1 - slot) % kDepth);
      for (uint32_t j = 0; j < 16; ++j)
        verify(reinterpret_cast<volatile uint64_t*>(r.ring.p[slot].w)[j] ==
                   proxy_desc_word(last, 0, j, epoch),
               "proxy_descriptor_store: slot " + std::to_string(slot) + " is not the last descriptor");
    }
    res.first["proxy_descriptor_store_ns"] =
        per_op_ns(cycles.to_host(), ns_per_clk(cal.to_host()[0], "proxy_descriptor_store"), per);
    res.second.push_back("proxy_descriptor_store: every ring slot holds the last descriptor stored");
  }
  {  // hand-off round trip
    const int per = 16;
    Rings r(1);
    HostBuf<Status> st(1);
    DevBuf<long long> cycles(reps);
    DevBuf<ClockCal> cal(1);
    ++epoch;
    ProxyRingView v{r.ring.p, r.ctl.p, kDepth, 0, epoch, uint64_t(per) * (warmup + reps)};
    std::string err;
    std::thread host([&] { err = proxy_consume(v, &st.p->code, kHostTimeoutS); if (!err.empty()) host_fail(st.p, 23, 0, 0); });
    proxy_rtt_kernel<<<1, 32, 0, stream.s>>>(r.ring.p, r.ctl.p, per, warmup, reps, epoch, cycles.p,
                                            cal.p, st.p);
    cudaError_t launch = cudaGetLastError();
    if (launch != cudaSuccess) host_fail(st.p, 24, 0, 0);
    host.join();
    PRIM_CHECK(launch);
    raise_host_errors({err}, "proxy_desc_rtt");
    finish(stream.s, st.p, "proxy_desc_rtt");
    res.first["proxy_desc_rtt_ns"] =
        per_op_ns(cycles.to_host(), ns_per_clk(cal.to_host()[0], "proxy_desc_rtt"), per);
    res.second.push_back("proxy_desc_rtt: host checked all 16 words of every descriptor; GPU saw every ack");
  }
  // sustained throughput, T rings / warps / host threads
  const uint64_t count = 2048;
  const int launches = std::max(3, reps / 16) + 1;  // first launch is warm-up
  for (int t : {1, 2, 4, 8}) {
    for (int batch : {1, 8}) {
      std::string base = "proxy_t" + std::to_string(t) + (batch == 1 ? "_fence1" : "_batch8");
      Rings r(t);
      std::vector<double> mops, desc_ns;
      for (int l = 0; l < launches; ++l) {
        r.reset();
        ++epoch;
        HostBuf<Status> st(1);
        DevBuf<unsigned long long> t0(t), t1(t);
        std::vector<std::string> errs(t);
        std::vector<std::thread> threads;
        for (int k = 0; k < t; ++k) {
          ProxyRingView v{r.ring.p + size_t(k) * kDepth, r.ctl.p + k, kDepth, uint32_t(k), epoch,
                          count};
          threads.emplace_back([&, v, k] {
            errs[k] = proxy_consume(v, &st.p->code, kHostTimeoutS);
            if (!errs[k].empty()) host_fail(st.p, 25, k, 0);
          });
        }
        proxy_stream_kernel<<<t, 32, 0, stream.s>>>(r.ring.p, r.ctl.p, count, batch, epoch, t0.p,
                                                   t1.p, st.p);
        cudaError_t launch = cudaGetLastError();
        if (launch != cudaSuccess) host_fail(st.p, 26, 0, 0);
        for (auto& th : threads) th.join();
        PRIM_CHECK(launch);
        raise_host_errors(errs, base);
        finish(stream.s, st.p, base);
        auto s0 = t0.to_host(), s1 = t1.to_host();
        unsigned long long lo = *std::min_element(s0.begin(), s0.end());
        unsigned long long hi = *std::max_element(s1.begin(), s1.end());
        verify(hi > lo, base + ": empty timing window");
        double per_warp = 0;
        for (int k = 0; k < t; ++k) per_warp += double(s1[k] - s0[k]) / double(count);
        if (l == 0) continue;
        mops.push_back(double(t) * double(count) / double(hi - lo) * 1e3);
        desc_ns.push_back(per_warp / t);
      }
      res.first[base + "_mops"] = mops;
      res.first[base + "_desc_ns"] = desc_ns;
    }
  }
  res.second.push_back(
      "proxy throughput: every descriptor of every ring checked by its host thread, in order");
  return res;
}

}  // namespace prim
