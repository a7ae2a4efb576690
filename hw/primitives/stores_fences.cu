// Stores and fences family: what a posting thread pays to make data visible.
//
// One thread, per operation (a batch timed with clock64, divided by its size):
//   store_posted_{host,device}_ns            8-byte st.volatile, no fence (issue cost)
//   fence_system_after_{host,device}_store_ns store + __threadfence_system()
//   fence_gpu_after_{host,device}_store_ns    store + __threadfence()
//   release_sys_after_{host,device}_store_ns  store + st.release.sys of a flag word
// "host" is pinned host memory reached over PCIe (the stand-in for a NIC's BAR),
// "device" is HBM. The fence metrics include their one store (~ns), as the campaign
// table (docs/physics.md) does. Throughput (many blocks, 16-byte stores, CUDA events):
//   store_{host,device}_gbytes_per_s
//
// Verification: after each launch the host reads the target back: every slot holds
// the value of the last iteration (and the flag its last value); the throughput
// buffers hold the pattern of their last pass, word for word.
#include "common.cuh"

namespace prim {
namespace {

enum Mode : int { kPosted = 0, kFenceSys = 1, kFenceGpu = 2, kReleaseSys = 3 };

__host__ __device__ inline uint64_t slot_value(int s, int k) {
  return (uint64_t(uint32_t(s + 1000)) << 16) | uint64_t(k);
}

__global__ void store_kernel(uint64_t* dst, uint64_t* flag, int mode, int per_sample, int warmup,
                             int reps, long long* cycles, ClockCal* cal) {
  for (int s = -warmup; s < reps; ++s) {
    if (s == 0) cal_begin(cal);
    long long t0 = clock64();
    if (mode == kPosted) {
      for (int k = 0; k < per_sample; ++k) st_volatile(dst + k, slot_value(s, k));
    } else if (mode == kFenceSys) {
      for (int k = 0; k < per_sample; ++k) {
        st_volatile(dst + k, slot_value(s, k));
        __threadfence_system();
      }
    } else if (mode == kFenceGpu) {
      for (int k = 0; k < per_sample; ++k) {
        st_volatile(dst + k, slot_value(s, k));
        __threadfence();
      }
    } else {
      for (int k = 0; k < per_sample; ++k) {
        st_volatile(dst + k, slot_value(s, k));
        st_release_sys(flag, slot_value(s, k));
      }
    }
    long long t1 = clock64();
    if (s >= 0) cycles[s] = t1 - t0;
    // Drain outside the timed region so one sample's posted writes do not bill the next.
    __threadfence_system();
  }
  cal_end(cal);
}

__host__ __device__ inline uint4 pattern(size_t i, int pass) {
  uint32_t a = uint32_t(i * 2654435761u) ^ uint32_t(pass * 40503u);
  return make_uint4(a, a + 1u, uint32_t(i), uint32_t(pass));
}

__global__ void bulk_store_kernel(uint4* dst, size_t n, int pass) {
  size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = pattern(i, pass);
}

__global__ void bulk_check_kernel(const uint4* dst, size_t n, int pass, unsigned long long* bad) {
  size_t stride = size_t(gridDim.x) * blockDim.x;
  unsigned long long local = 0;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    uint4 v = dst[i], w = pattern(i, pass);
    local += (v.x != w.x) | (v.y != w.y) | (v.z != w.z) | (v.w != w.w);
  }
  if (local) atomicAdd(bad, local);
}

std::vector<double> one(uint64_t* dst, uint64_t* flag, bool host_mem, int mode, int per,
                        int warmup, int reps, const std::string& what) {
  DevBuf<long long> cycles(reps);
  DevBuf<ClockCal> cal(1);
  store_kernel<<<1, 1>>>(dst, flag, mode, per, warmup, reps, cycles.p, cal.p);
  PRIM_CHECK(cudaGetLastError());
  PRIM_CHECK(cudaDeviceSynchronize());
  std::vector<uint64_t> got(per + 1);
  if (host_mem) {
    for (int k = 0; k < per; ++k) got[k] = reinterpret_cast<volatile uint64_t*>(dst)[k];
    got[per] = *reinterpret_cast<volatile uint64_t*>(flag);
  } else {
    PRIM_CHECK(cudaMemcpy(got.data(), dst, per * sizeof(uint64_t), cudaMemcpyDeviceToHost));
    PRIM_CHECK(cudaMemcpy(&got[per], flag, sizeof(uint64_t), cudaMemcpyDeviceToHost));
  }
  for (int k = 0; k < per; ++k)
    verify(got[k] == slot_value(reps - 1, k),
           what + ": slot " + std::to_string(k) + " does not hold the last value stored");
  if (mode == kReleaseSys)
    verify(got[per] == slot_value(reps - 1, per - 1), what + ": release flag is stale");
  return per_op_ns(cycles.to_host(), ns_per_clk(cal.to_host()[0], what), per);
}

double bulk(uint4* dst, size_t n, int pass, int sms, const std::string& what) {
  Event e0, e1;
  PRIM_CHECK(cudaEventRecord(e0.e));
  bulk_store_kernel<<<sms * 4, 512>>>(dst, n, pass);
  PRIM_CHECK(cudaEventRecord(e1.e));
  PRIM_CHECK(cudaGetLastError());
  PRIM_CHECK(cudaEventSynchronize(e1.e));
  float ms = 0;
  PRIM_CHECK(cudaEventElapsedTime(&ms, e0.e, e1.e));
  DevBuf<unsigned long long> bad(1);
  bulk_check_kernel<<<sms * 4, 512>>>(dst, n, pass, bad.p);
  PRIM_CHECK(cudaGetLastError());
  PRIM_CHECK(cudaDeviceSynchronize());
  unsigned long long nbad = bad.to_host()[0];
  verify(nbad == 0, what + ": " + std::to_string(nbad) + " of " + std::to_string(n) +
                        " 16-byte words do not hold the pattern just stored");
  return double(n * sizeof(uint4)) / (double(ms) * 1e-3) / 1e9;
}

}  // namespace

Result run_stores_fences(int device, int reps) {
  const int sms = use_device(device);
  Result res;
  const int warmup = 10;
  HostBuf<uint64_t> hdst(64), hflag(16);
  DevBuf<uint64_t> ddst(64), dflag(16);
  struct Case { const char* name; int mode; int per; };
  const Case cases[] = {{"store_posted_%s_ns", kPosted, 64},
                        {"fence_system_after_%s_store_ns", kFenceSys, 16},
                        {"fence_gpu_after_%s_store_ns", kFenceGpu, 16},
                        {"release_sys_after_%s_store_ns", kReleaseSys, 16}};
  for (const Case& c : cases) {
    for (int host = 1; host >= 0; --host) {
      char name[96];
      snprintf(name, sizeof(name), c.name, host ? "host" : "device");
      uint64_t* dst = host ? hdst.p : ddst.p;
      uint64_t* flag = host ? hflag.p : dflag.p;
      // Per-sample batches must last long enough to time: posted stores are cheap.
      res.first[name] = one(dst, flag, host, c.mode, c.per, warmup, reps * 4, name);
    }
  }
  res.second.push_back("stores/fences: every slot holds the last value stored, flags not stale");

  const int passes = 6;  // 1 warm-up + 5 timed
  {
    size_t n = (size_t(64) << 20) / sizeof(uint4);
    HostBuf<uint4> h(n);
    std::vector<double> v;
    for (int p = 0; p < passes; ++p) {
      double g = bulk(h.p, n, p, sms, "store_host_gbytes_per_s");
      if (p) v.push_back(g);
    }
    res.first["store_host_gbytes_per_s"] = v;
  }
  {
    size_t n = (size_t(1) << 30) / sizeof(uint4);
    DevBuf<uint4> d(n);
    std::vector<double> v;
    for (int p = 0; p < passes; ++p) {
      double g = bulk(d.p, n, p, sms, "store_device_gbytes_per_s");
      if (p) v.push_back(g);
    }
    res.first["store_device_gbytes_per_s"] = v;
  }
  res.second.push_back("store throughput: every 16-byte word holds the pattern of its last pass");
  return res;
}

}  // namespace prim
