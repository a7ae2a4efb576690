// WQE + doorbell family: the native post path of one issuing thread.
//
// A 64-byte EFA TX WQE (efa_io_tx_wqe: meta 32 B + RDMA-write data 32 B) is stored
// as 8 x 8-byte stores into slot seq % depth of a send ring, then, every B WQEs, a
// system-scope fence and a 4-byte doorbell store of the producer counter (EFA:
// mmio_write32(sq_db, pc)). The ring and the doorbell word live in pinned host
// memory ("host": posted writes over PCIe, like the NIC's LLQ BAR) or in device
// memory ("device"). Per-WQE costs, steady state:
//   wqe_store_{mem}_ns                 WQE stores only
//   wqe_doorbell_nofence_{mem}_ns      WQE + doorbell per WQE, no fence
//   wqe_fence_doorbell_{mem}_ns        WQE + fence + doorbell per WQE (B = 1)
//   wqe_fence_doorbell_{mem}_b{B}_ns   fence + doorbell every B WQEs, B = 2..32
//
// Verification: every ring slot holds, word for word, the WQE of the last sequence
// number stored there (req_id, phase, immediate all consistent), and the doorbell
// holds the final producer counter.
#include "common.cuh"

namespace prim {
namespace {

constexpr uint32_t kDepth = 256;
constexpr uint32_t kQp = 5;

__global__ void wqe_kernel(uint64_t* ring, uint32_t* db, int fence, int doorbell, int batch,
                           int per_sample, int warmup, int reps, long long* cycles,
                           ClockCal* cal) {
  uint64_t seq = 0;
  int until_db = batch;  // countdown: no division in the timed loop
  for (int s = -warmup; s < reps; ++s) {
    if (s == 0) cal_begin(cal);
    long long t0 = clock64();
    for (int k = 0; k < per_sample; ++k, ++seq) {
      uint64_t w[8];
      make_wqe_words(seq, kDepth, kQp, w);
      uint64_t* slot = ring + (seq % kDepth) * 8;
#pragma unroll
      for (int j = 0; j < 8; ++j) st_volatile(slot + j, w[j]);
      if (doorbell && --until_db == 0) {
        until_db = batch;
        if (fence) __threadfence_system();
        st_volatile32(db, uint32_t(seq + 1));
      }
    }
    long long t1 = clock64();
    if (s >= 0) cycles[s] = t1 - t0;
  }
  __threadfence_system();
  cal_end(cal);
}

std::vector<double> one(bool host_mem, int fence, int doorbell, int batch, int warmup, int reps,
                        const std::string& what) {
  const int per = 64;  // a multiple of every B
  size_t words = size_t(kDepth) * 8;
  HostBuf<uint64_t> hring(host_mem ? words : 1);
  HostBuf<uint32_t> hdb(16);
  DevBuf<uint64_t> dring(host_mem ? 1 : words);
  DevBuf<uint32_t> ddb(16);
  uint64_t* ring = host_mem ? hring.p : dring.p;
  uint32_t* db = host_mem ? hdb.p : ddb.p;
  DevBuf<long long> cycles(reps);
  DevBuf<ClockCal> cal(1);
  wqe_kernel<<<1, 1>>>(ring, db, fence, doorbell, batch, per, warmup, reps, cycles.p, cal.p);
  PRIM_CHECK(cudaGetLastError());
  PRIM_CHECK(cudaDeviceSynchronize());

  std::vector<uint64_t> got(words);
  uint32_t dbv = 0;
  if (host_mem) {
    for (size_t i = 0; i < words; ++i) got[i] = reinterpret_cast<volatile uint64_t*>(ring)[i];
    dbv = *reinterpret_cast<volatile uint32_t*>(db);
  } else {
    PRIM_CHECK(cudaMemcpy(got.data(), ring, words * sizeof(uint64_t), cudaMemcpyDeviceToHost));
    PRIM_CHECK(cudaMemcpy(&dbv, db, sizeof(uint32_t), cudaMemcpyDeviceToHost));
  }
  uint64_t total = uint64_t(per) * uint64_t(warmup + reps);
  for (uint32_t slot = 0; slot < kDepth; ++slot) {
    uint64_t last = total - 1 - ((total - 1 - slot) % kDepth);  // last seq with seq%depth==slot
    uint64_t w[8];
    make_wqe_words(last, kDepth, kQp, w);
    for (int j = 0; j < 8; ++j)
      verify(got[size_t(slot) * 8 + j] == w[j],
             what + ": ring slot " + std::to_string(slot) + " word " + std::to_string(j) +
                 " is not the WQE of seq " + std::to_string(last));
  }
  uint32_t want_db = doorbell ? uint32_t(total) : 0u;
  verify(dbv == want_db, what + ": doorbell holds " + std::to_string(dbv) + ", expected " +
                             std::to_string(want_db));
  return per_op_ns(cycles.to_host(), ns_per_clk(cal.to_host()[0], what), per);
}

}  // namespace

Result run_wqe_doorbell(int device, int reps) {
  PRIM_CHECK(cudaSetDevice(device));
  Result res;
  const int warmup = 10;
  for (int host = 1; host >= 0; --host) {
    std::string mem = host ? "host" : "device";
    res.first["wqe_store_" + mem + "_ns"] =
        one(host, 0, 0, 1, warmup, reps, "wqe_store_" + mem);
    res.first["wqe_doorbell_nofence_" + mem + "_ns"] =
        one(host, 0, 1, 1, warmup, reps, "wqe_doorbell_nofence_" + mem);
    for (int b : {1, 2, 4, 8, 16, 32}) {
      std::string name = "wqe_fence_doorbell_" + mem + (b == 1 ? "" : "_b" + std::to_string(b)) + "_ns";
      res.first[name] = one(host, 1, 1, b, warmup, reps, name);
    }
  }
  res.second.push_back(
      "wqe/doorbell: every ring slot holds the exact WQE last stored there; doorbell = final "
      "producer counter");
  return res;
}

}  // namespace prim
