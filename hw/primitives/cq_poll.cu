// Completion-polling family: a 16-byte CQE with a phase bit, written by another
// agent, polled until seen.
//
// Ping-pong between two agents through two CQs of 64 entries: agent A writes CQE i
// into B's CQ (one 16-byte store, no fence: a NIC's whole-entry write); B polls for it
// (16-byte loads until the phase matches), checks it, and writes CQE i into A's CQ; A
// polls. Write-to-seen latency = round trip / 2 (one hop each way, same kind of hop):
//   cq_seen_device_mem_block_agent_ns  CQs in device memory, agent = another block
//   cq_seen_host_mem_block_agent_ns    CQs in pinned host memory, agent = another block
//   cq_seen_host_mem_host_agent_ns     CQs in pinned host memory, agent = a host thread
//                                      (the GPU polls over PCIe as it would a NIC's CQ
//                                      in host memory; the host side polls its cache)
// A host thread can not store into device memory without a BAR mapping (GDRCopy),
// so the host-agent case exists only for host memory.
//
// Verification: the poller waits for the expected phase, then the whole entry must
// be exactly CQE i (req_id, qp, length, immediate, check word): a stale or torn
// entry is an error.
#include <emmintrin.h>

#include <thread>

#include "common.cuh"

namespace prim {
namespace {

constexpr uint32_t kDepth = 64;

__device__ inline void write_cqe(Cqe* cq, uint64_t i) {
  Cqe* e = cq + (i % kDepth);
  st_v2_relaxed_sys(&e->w0, cqe_w0(i, kDepth), cqe_w1(i));
}

// true when CQE i was seen and is intact
__device__ inline bool poll_cqe(Cqe* cq, uint64_t i, Status* st, int where) {
  Cqe* e = cq + (i % kDepth);
  uint32_t phase = cqe_phase(i, kDepth);
  uint64_t w0 = 0, w1 = 0;
  bool ok = spin_until(st, where, [&] {
    ld_v2_relaxed_sys(&e->w0, w0, w1);
    return ((w0 >> 24) & 1u) == phase;
  });
  if (!ok) return false;
  if (w0 != cqe_w0(i, kDepth) || w1 != cqe_w1(i)) {
    fail(st, kStale, where, cqe_w1(i), w1);
    return false;
  }
  return true;
}

// gridDim.x == 2: block 0 starts and times, block 1 answers.
__global__ void pingpong_blocks(Cqe* cq_a, Cqe* cq_b, int per_sample, int warmup, int reps,
                                long long* cycles, ClockCal* cal, Status* st) {
  if (threadIdx.x != 0) return;
  uint64_t total = uint64_t(per_sample) * uint64_t(warmup + reps);
  if (blockIdx.x == 1) {
    for (uint64_t i = 0; i < total; ++i) {
      if (!poll_cqe(cq_b, i, st, 1)) return;
      write_cqe(cq_a, i);
    }
    return;
  }
  uint64_t i = 0;
  for (int s = -warmup; s < reps; ++s) {
    if (s == 0) cal_begin(cal);
    long long t0 = clock64();
    for (int k = 0; k < per_sample; ++k, ++i) {
      write_cqe(cq_b, i);
      if (!poll_cqe(cq_a, i, st, 0)) return;
    }
    long long t1 = clock64();
    if (s >= 0) cycles[s] = t1 - t0;
  }
  cal_end(cal);
}

// One block: the GPU answers a host thread. Timed from one seen CQE to the one
// per_sample round trips later.
__global__ void pingpong_host(Cqe* cq_gpu, Cqe* cq_host, int per_sample, int warmup, int reps,
                              long long* cycles, ClockCal* cal, Status* st) {
  uint64_t i = 0;
  if (!poll_cqe(cq_gpu, i, st, 2)) return;
  write_cqe(cq_host, i);
  ++i;
  for (int s = -warmup; s < reps; ++s) {
    if (s == 0) cal_begin(cal);
    long long t0 = clock64();
    for (int k = 0; k < per_sample; ++k, ++i) {
      if (!poll_cqe(cq_gpu, i, st, 2)) return;
      write_cqe(cq_host, i);
    }
    long long t1 = clock64();
    if (s >= 0) cycles[s] = t1 - t0;
  }
  cal_end(cal);
}

// One aligned 16-byte SSE store (single-copy atomic on x86 CPUs with AVX), like the
// NIC's whole-entry write; the GPU's 16-byte read must then see all of it or none.
void host_write_cqe(Cqe* cq, uint64_t i) {
  Cqe* e = cq + (i % kDepth);
  __m128i v = _mm_set_epi64x((long long)cqe_w1(i), (long long)cqe_w0(i, kDepth));
  _mm_store_si128(reinterpret_cast<__m128i*>(e), v);
  _mm_sfence();
}

bool host_poll_cqe(Cqe* cq, uint64_t i, Status* st) {
  Cqe* e = cq + (i % kDepth);
  uint32_t phase = cqe_phase(i, kDepth);
  uint64_t w0 = 0;
  bool ok = host_spin_until(st, [&] {
    w0 = __atomic_load_n(&e->w0, __ATOMIC_ACQUIRE);
    return ((w0 >> 24) & 1u) == phase;
  });
  if (!ok) {
    host_fail(st, 10, i, 0);
    return false;
  }
  uint64_t w1 = __atomic_load_n(&e->w1, __ATOMIC_RELAXED);
  if (w0 != cqe_w0(i, kDepth) || w1 != cqe_w1(i)) {
    host_fail(st, 11, cqe_w1(i), w1);
    return false;
  }
  return true;
}

std::vector<double> blocks(bool host_mem, int per, int warmup, int reps, const std::string& what) {
  HostBuf<Cqe> ha(host_mem ? kDepth : 1), hb(host_mem ? kDepth : 1);
  DevBuf<Cqe> da(host_mem ? 1 : kDepth), db(host_mem ? 1 : kDepth);
  HostBuf<Status> st(1);
  DevBuf<long long> cycles(reps);
  DevBuf<ClockCal> cal(1);
  pingpong_blocks<<<2, 32>>>(host_mem ? ha.p : da.p, host_mem ? hb.p : db.p, per, warmup, reps,
                             cycles.p, cal.p, st.p);
  finish(0, st.p, what);
  // per sample: `per` round trips = 2 * per write->seen hops
  return per_op_ns(cycles.to_host(), ns_per_clk(cal.to_host()[0], what), 2.0 * per);
}

std::vector<double> host_agent(int per, int warmup, int reps, const std::string& what) {
  HostBuf<Cqe> cq_gpu(kDepth), cq_host(kDepth);
  HostBuf<Status> st(1);
  DevBuf<long long> cycles(reps);
  DevBuf<ClockCal> cal(1);
  Stream stream;
  pingpong_host<<<1, 1, 0, stream.s>>>(cq_gpu.p, cq_host.p, per, warmup, reps, cycles.p, cal.p,
                                       st.p);
  PRIM_CHECK(cudaGetLastError());
  uint64_t total = 1 + uint64_t(per) * uint64_t(warmup + reps);
  for (uint64_t i = 0; i < total; ++i) {
    host_write_cqe(cq_gpu.p, i);
    if (!host_poll_cqe(cq_host.p, i, st.p)) break;
  }
  finish(stream.s, st.p, what);
  return per_op_ns(cycles.to_host(), ns_per_clk(cal.to_host()[0], what), 2.0 * per);
}

}  // namespace

Result run_cq_poll(int device, int reps) {
  PRIM_CHECK(cudaSetDevice(device));
  Result res;
  const int warmup = 10, per = 16;
  res.first["cq_seen_device_mem_block_agent_ns"] =
      blocks(false, per, warmup, reps, "cq_seen_device_mem_block_agent");
  res.first["cq_seen_host_mem_block_agent_ns"] =
      blocks(true, per, warmup, reps, "cq_seen_host_mem_block_agent");
  res.first["cq_seen_host_mem_host_agent_ns"] =
      host_agent(per, warmup, reps, "cq_seen_host_mem_host_agent");
  res.second.push_back(
      "cq_poll: every CQE seen with the expected phase was complete and current (no stale or "
      "torn entry), in both directions");
  return res;
}

}  // namespace prim
