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
// The same post by one warp, as hw/ep writes a WQE (8 lanes, a word each), with the words
// built by hw/efa/wqe.h's builder (the one every kernel in hw/ uses) into a send ring in host
// memory named by a NIC layout:
//   wqe_warp_regs_store_host_ns        the words built from values the warp holds in registers
//   wqe_warp_build_store_host_ns       the words built from the QP's layout and its peer table
//                                      in GPU memory, read per WQE (hw/ep's put_word: the
//                                      layout's ring geometry and keys, the peer's AH, QPN,
//                                      qkey and rkey), stores, no fence
//   wqe_warp_build_fence_doorbell_host_ns   the same + a system fence + the doorbell per WQE
// so the build's own cost is build_store - regs_store: what hw/ep's profiler counts in its
// "wqe" segment beside the stores (0.76 us on the one-warp chain, h100-d2edc5a) and the
// plain primitives above do not.
//
// Verification: every ring slot holds, word for word, the WQE of the last sequence
// number stored there (req_id, phase, immediate all consistent), and the doorbell
// holds the final producer counter.
#include "common.cuh"
#include "../efa/wqe.h"

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

constexpr uint32_t kPeers = 16;  // destinations the posts cycle over (hw/ep: ranks x dest QPs)
constexpr uint32_t kLen = 7504;  // a V1 dispatch message (hw/ep DMSG at hidden 7168)

// The write of post number pc: what hw/ep's issuer holds for it in its pending list.
__host__ __device__ inline lever_efa_write warp_write(uint32_t pc) {
  return lever_efa_write{0x7f0000000000ull + uint64_t(pc % 64u) * kLen,
                         0x7e0000000000ull + uint64_t(pc) * kLen, kLen, pc, 1u, nullptr};
}

// One warp, lanes 0..7 a word each. build: 1 reads the layout and the peer entry per WQE
// from GPU memory; 0 builds from a copy in registers made before the timed loop.
__global__ void wqe_warp_kernel(const lever_efa_nic_layout* lay, uint32_t* db, int build,
                                int fence_db, int per_sample, int warmup, int reps,
                                long long* cycles, ClockCal* cal) {
  const int lane = threadIdx.x;
  lever_efa_nic_layout lreg = *lay;  // the register copy (build = 0)
  const lever_efa_peer* ptab = reinterpret_cast<const lever_efa_peer*>(lreg.peers);
  lever_efa_peer preg[kPeers];
#pragma unroll
  for (uint32_t i = 0; i < kPeers; ++i) preg[i] = ptab[i];
  uint32_t pc = 0;
  for (int s = -warmup; s < reps; ++s) {
    if (s == 0 && lane == 0) cal_begin(cal);
    long long t0 = clock64();
    for (int k = 0; k < per_sample; ++k, ++pc) {
      if (lane < 8) {
        const lever_efa_write wr = warp_write(pc);
        uint64_t word;
        uint64_t* dst;
        if (build) {  // as put_word: through the layout and its peer table, loaded now
          const lever_efa_nic_layout* l = lay;
          const lever_efa_peer* peer =
              reinterpret_cast<const lever_efa_peer*>(l->peers) + (pc % kPeers);
          word = lever_efa_write_wqe_word(l, peer, &wr, pc, lane);
          dst = reinterpret_cast<uint64_t*>(lever_efa_sq_slot_dev(l, pc));
        } else {
          lever_efa_peer pe = preg[0];
#pragma unroll
          for (uint32_t i = 1; i < kPeers; ++i)
            if (pc % kPeers == i) pe = preg[i];
          word = lever_efa_write_wqe_word(&lreg, &pe, &wr, pc, lane);
          dst = reinterpret_cast<uint64_t*>(lever_efa_sq_slot_dev(&lreg, pc));
        }
        st_volatile(dst + lane, word);
      }
      __syncwarp();
      if (fence_db && lane == 0) {
        __threadfence_system();
        st_volatile32(db, pc + 1u);
      }
      __syncwarp();
    }
    long long t1 = clock64();
    if (s >= 0 && lane == 0) cycles[s] = t1 - t0;
  }
  __threadfence_system();
  if (lane == 0) cal_end(cal);
}

std::vector<double> warp_one(int build, int fence_db, int warmup, int reps, const std::string& what) {
  const int per = 64;
  const size_t words = size_t(kDepth) * 8;
  HostBuf<uint64_t> ring(words);  // the SQ in host memory (the LLQ's stand-in)
  HostBuf<uint32_t> db(16);
  std::vector<lever_efa_peer> peers(kPeers);
  for (uint32_t i = 0; i < kPeers; ++i)
    peers[i] = lever_efa_peer{uint16_t(3 + i), uint16_t(100 + i), 0x11110000u + i, 0x2220000u + i, 0u,
                              0x7e0000000000ull};
  DevBuf<lever_efa_peer> dpeers(kPeers);
  PRIM_CHECK(cudaMemcpy(dpeers.p, peers.data(), kPeers * sizeof(lever_efa_peer), cudaMemcpyHostToDevice));
  lever_efa_nic_layout l{};
  l.version = LEVER_EFA_NIC_LAYOUT_VERSION;
  l.qp_num = kQp;
  l.sq_buffer_dev = reinterpret_cast<uint64_t>(ring.p);
  l.sq_entry_size = 64;
  l.sq_num_entries = kDepth;
  l.sq_max_batch = 16;
  l.lkey = 0x00abcdefu;
  l.qkey = 0x11110000u;
  l.num_peers = kPeers;
  l.peers = reinterpret_cast<uint64_t>(dpeers.p);
  l.peers_mem = LEVER_EFA_MEM_GPU;
  DevBuf<lever_efa_nic_layout> dlay(1);
  PRIM_CHECK(cudaMemcpy(dlay.p, &l, sizeof(l), cudaMemcpyHostToDevice));
  DevBuf<long long> cycles(reps);
  DevBuf<ClockCal> cal(1);
  wqe_warp_kernel<<<1, 32>>>(dlay.p, db.p, build, fence_db, per, warmup, reps, cycles.p, cal.p);
  PRIM_CHECK(cudaGetLastError());
  PRIM_CHECK(cudaDeviceSynchronize());
  const uint32_t total = uint32_t(per) * uint32_t(warmup + reps);
  for (uint32_t slot = 0; slot < kDepth; ++slot) {
    const uint32_t last = total - 1u - ((total - 1u - slot) % kDepth);
    const lever_efa_write wr = warp_write(last);
    for (int j = 0; j < 8; ++j) {
      const uint64_t want = lever_efa_write_wqe_word(&l, &peers[last % kPeers], &wr, last, j);
      const uint64_t got = reinterpret_cast<volatile uint64_t*>(ring.p)[size_t(slot) * 8 + j];
      verify(got == want, what + ": ring slot " + std::to_string(slot) + " word " + std::to_string(j) +
                              " is not the WQE of post " + std::to_string(last));
    }
  }
  const uint32_t dbv = *reinterpret_cast<volatile uint32_t*>(db.p);
  verify(dbv == (fence_db ? total : 0u), what + ": doorbell holds " + std::to_string(dbv));
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
  res.first["wqe_warp_regs_store_host_ns"] = warp_one(0, 0, warmup, reps, "wqe_warp_regs_store_host");
  res.first["wqe_warp_build_store_host_ns"] = warp_one(1, 0, warmup, reps, "wqe_warp_build_store_host");
  res.first["wqe_warp_build_fence_doorbell_host_ns"] =
      warp_one(1, 1, warmup, reps, "wqe_warp_build_fence_doorbell_host");
  res.second.push_back(
      "wqe/doorbell: every ring slot holds the exact WQE last stored there; doorbell = final "
      "producer counter");
  res.second.push_back(
      "wqe_warp: every ring slot holds, word for word, hw/efa/wqe.h's WQE of the last post there "
      "(layout and peer entry recomputed on the host); doorbell = final producer counter");
  return res;
}

}  // namespace prim
