// Warp copy family: what one warp pays to copy a token by itself, the way hw/ep's
// local_put does for a put to its own rank (and DeepEP-style kernels for their own rank).
//
// warp_copy_loop_7504_ns  : one warp copies a 7504-byte dispatch message with local_put's
//                           loop (each lane one 16-byte __ldcg then its __stcg per step of
//                           512 bytes; the pointers may alias, so a step's store waits for its
//                           load), then __threadfence(): ns per copy.
// warp_copy_loop_14400_ns : the same for a 14400-byte combine row.
// warp_copy_unroll8_7504_ns: 8 loads per lane in flight (restrict pointers, all loads of a
//                           4 KiB chunk before its stores), then the fence: the unrolled copy.
// warp_copy_loop_7504_busy_ns: the loop copy while 95 other warps (on other SMs) copy their
//                           own tokens the same way: the testbed's EP2 block shape (24 SMs x 4
//                           warps per rank) copying at once.
//
// The model's nvlink.self_copy_loads_in_flight prices a step at gpu.device_load_ns (the
// dependent L2 load); these say what a step costs in the loop itself, alone and loaded.
// Verification: every destination byte equals its source byte after the timed copies.
#include "common.cuh"

namespace prim {
namespace {

constexpr int kCopiesPerSample = 16;  // copies timed together (different source/destination)

__device__ __forceinline__ void copy_loop(const uint8_t* src, uint8_t* dst, unsigned n, int lane) {
  const uint4* s4 = reinterpret_cast<const uint4*>(src);
  uint4* d4 = reinterpret_cast<uint4*>(dst);
  for (unsigned i = (unsigned)lane; i < (n >> 4); i += 32u) __stcg(d4 + i, __ldcg(s4 + i));
  __syncwarp();
  __threadfence();
}

__device__ __forceinline__ void copy_unroll8(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst,
                                             unsigned n, int lane) {
  const uint4* __restrict__ s4 = reinterpret_cast<const uint4*>(src);
  uint4* __restrict__ d4 = reinterpret_cast<uint4*>(dst);
  const unsigned nv = n >> 4;
  for (unsigned base = 0; base < nv; base += 32u * 8u) {
    uint4 v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const unsigned i = base + (unsigned)lane + 32u * (unsigned)j;
      if (i < nv) v[j] = __ldcg(s4 + i);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const unsigned i = base + (unsigned)lane + 32u * (unsigned)j;
      if (i < nv) __stcg(d4 + i, v[j]);
    }
  }
  __syncwarp();
  __threadfence();
}

// Block b's warp 0 copies slot (b * kCopiesPerSample + k) of src into dst, kCopiesPerSample
// copies a sample; block 0 records the samples. mode 0: the loop, 1: unrolled by 8.
__global__ void copy_kernel(const uint8_t* src, uint8_t* dst, unsigned n, size_t stride, int mode,
                            int warmup, int reps, long long* cycles, ClockCal* cal) {
  if (threadIdx.x >= 32) return;
  const int lane = threadIdx.x;
  const size_t first = (size_t)blockIdx.x * kCopiesPerSample;
  for (int s = -warmup; s < reps; ++s) {
    if (s == 0 && blockIdx.x == 0 && lane == 0) cal_begin(cal);
    const long long t0 = clock64();
    for (int k = 0; k < kCopiesPerSample; ++k) {
      const size_t slot = first + (size_t)k;
      if (mode == 0) copy_loop(src + slot * stride, dst + slot * stride, n, lane);
      else copy_unroll8(src + slot * stride, dst + slot * stride, n, lane);
    }
    const long long t1 = clock64();
    if (s >= 0 && blockIdx.x == 0 && lane == 0) cycles[s] = t1 - t0;
  }
  if (blockIdx.x == 0 && lane == 0) cal_end(cal);
}

std::vector<double> timed_copy(unsigned n, int mode, int blocks, int reps, const std::string& what) {
  const size_t stride = 16384;  // one slot per copy, 16 KiB apart (a combine row fits)
  const size_t slots = (size_t)blocks * kCopiesPerSample;
  std::vector<uint8_t> img(slots * stride);
  for (size_t i = 0; i < img.size(); ++i) img[i] = (uint8_t)((i * 2654435761ull) >> 13);
  DevBuf<uint8_t> src(img.size()), dst(img.size());
  PRIM_CHECK(cudaMemcpy(src.p, img.data(), img.size(), cudaMemcpyHostToDevice));
  DevBuf<long long> cycles(reps);
  DevBuf<ClockCal> cal(1);
  copy_kernel<<<blocks, 32>>>(src.p, dst.p, n, stride, mode, 10, reps, cycles.p, cal.p);
  PRIM_CHECK(cudaGetLastError());
  PRIM_CHECK(cudaDeviceSynchronize());
  const auto out = dst.to_host();
  for (size_t s = 0; s < slots; ++s)
    verify(std::memcmp(out.data() + s * stride, img.data() + s * stride, n) == 0,
           what + ": copy " + std::to_string(s) + " differs from its source");
  return per_op_ns(cycles.to_host(), ns_per_clk(cal.to_host()[0], what), kCopiesPerSample);
}

}  // namespace

Result run_warp_copy(int device, int reps) {
  const int sms = use_device(device);
  Result res;
  res.first["warp_copy_loop_7504_ns"] = timed_copy(7504, 0, 1, reps, "warp_copy_loop_7504");
  res.first["warp_copy_loop_14400_ns"] = timed_copy(14400, 0, 1, reps, "warp_copy_loop_14400");
  res.first["warp_copy_unroll8_7504_ns"] = timed_copy(7504, 1, 1, reps, "warp_copy_unroll8_7504");
  // 96 warps, one a block (at most one a SM where the GPU has fewer)
  const int busy = std::min(96, sms);
  res.first["warp_copy_loop_7504_busy_ns"] = timed_copy(7504, 0, busy, reps, "warp_copy_loop_7504_busy");
  res.second.push_back("warp_copy: every destination byte equals its source after the timed copies (" +
                       std::to_string(busy) + " warps in the loaded run)");
  return res;
}

}  // namespace prim
