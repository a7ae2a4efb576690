// Latency family: dependent loads (pointer chases) and device-scope atomics.
//
// pcie_read_rtt_ns  : dependent ld.relaxed.sys from pinned host memory (one PCIe read
//                     round trip each; the next address is the value just read).
// device_load_ns    : dependent ld.global.cg over 512 KiB of device memory (L2 hits).
// device_load_dram_ns: the same over 256 MiB with a random cycle (misses L2).
// atomic_device_ns  : dependent atomicAdd on one device-memory word (slot reservation).
// globaltimer_read_ns: one read of %globaltimer, back to back (SM cycles per read): what each
//                     of the emulated NIC's timestamps costs the warp that takes it.
// globaltimer_step_ns: how far %globaltimer moves when it moves (its update granularity): the
//                     resolution of every ns the emulator's schedule and counters report.
//
// Verification: the chase must end on the index the host computes by walking the
// same cycle (so every load returned the value stored there, nothing stale), and the
// atomic counter must equal the number of adds issued.
#include "common.cuh"

namespace prim {
namespace {

constexpr int kLineWords = 16;  // one index per 128-byte line

__global__ void chase_kernel(const uint64_t* base, int sys_scope, uint64_t start, int per_sample,
                             int warmup, int reps, long long* cycles, ClockCal* cal,
                             uint64_t* end_idx) {
  uint64_t idx = start;
  for (int s = -warmup; s < reps; ++s) {
    if (s == 0) cal_begin(cal);
    long long t0 = clock64();
    for (int k = 0; k < per_sample; ++k) {
      const uint64_t* p = base + idx * kLineWords;
      idx = sys_scope ? ld_relaxed_sys(p) : ld_cg(p);
    }
    long long t1 = clock64();
    if (s >= 0) cycles[s] = t1 - t0;
  }
  cal_end(cal);
  *end_idx = idx;
}

__global__ void atomic_kernel(unsigned long long* ctr, int per_sample, int warmup, int reps,
                              long long* cycles, ClockCal* cal, unsigned long long* sink) {
  unsigned long long acc = 0;
  for (int s = -warmup; s < reps; ++s) {
    if (s == 0) cal_begin(cal);
    long long t0 = clock64();
    for (int k = 0; k < per_sample; ++k) {
      // The address depends on the previous result (always index 0: the counter stays
      // below 2^40), so each atomic waits for the last one's round trip.
      unsigned long long old = atomicAdd(ctr + (acc >> 40), 1ull);
      acc = old;
    }
    long long t1 = clock64();
    if (s >= 0) cycles[s] = t1 - t0;
  }
  cal_end(cal);
  *sink = acc;
}

__global__ void timer_kernel(int per_sample, int warmup, int reps, long long* cycles, ClockCal* cal,
                             unsigned long long* steps, unsigned long long* sink) {
  unsigned long long acc = 0;
  for (int s = -warmup; s < reps; ++s) {
    if (s == 0) cal_begin(cal);
    long long t0 = clock64();
    for (int k = 0; k < per_sample; ++k) acc += gtimer();  // volatile: every read is made
    long long t1 = clock64();
    if (s >= 0) cycles[s] = t1 - t0;
  }
  cal_end(cal);
  // the granularity: wait for the timer to move 16 times; the mean move is one sample
  for (int s = 0; s < reps; ++s) {
    unsigned long long first = gtimer(), last = first;
    int moves = 0;
    while (moves < 16) {
      const unsigned long long t = gtimer();
      if (t != last) {
        ++moves;
        last = t;
      }
    }
    steps[s] = (last - first) / 16u;
  }
  *sink = acc;
}

// One index per 128-byte line, uploaded as a full image (one plain copy).
void upload_lines(uint64_t* dev, const std::vector<uint64_t>& next) {
  std::vector<uint64_t> img(next.size() * kLineWords, 0);
  for (size_t i = 0; i < next.size(); ++i) img[i * kLineWords] = next[i];
  PRIM_CHECK(cudaMemcpy(dev, img.data(), img.size() * sizeof(uint64_t), cudaMemcpyHostToDevice));
}

uint64_t walk(const std::vector<uint64_t>& next, uint64_t idx, uint64_t steps) {
  steps %= next.size();  // one cycle of length n
  for (uint64_t i = 0; i < steps; ++i) idx = next[idx];
  return idx;
}

std::vector<double> chase(uint64_t* base, bool sys_scope, const std::vector<uint64_t>& next,
                          int per_sample, int warmup, int reps, const std::string& what) {
  DevBuf<long long> cycles(reps);
  DevBuf<ClockCal> cal(1);
  DevBuf<uint64_t> end_idx(1);
  chase_kernel<<<1, 1>>>(base, sys_scope ? 1 : 0, 0, per_sample, warmup, reps, cycles.p, cal.p,
                         end_idx.p);
  PRIM_CHECK(cudaGetLastError());
  PRIM_CHECK(cudaDeviceSynchronize());
  uint64_t got = end_idx.to_host()[0];
  uint64_t want = walk(next, 0, uint64_t(per_sample) * uint64_t(warmup + reps));
  verify(got == want, what + ": chase ended at line " + std::to_string(got) + ", host expects " +
                          std::to_string(want));
  return per_op_ns(cycles.to_host(), ns_per_clk(cal.to_host()[0], what), per_sample);
}

}  // namespace

Result run_latency(int device, int reps) {
  PRIM_CHECK(cudaSetDevice(device));
  Result res;
  const int warmup = 10;

  {  // PCIe read round trip: 64 lines of pinned host memory
    const size_t n = 64;
    auto next = random_cycle(n, 1);
    HostBuf<uint64_t> buf(n * kLineWords);
    for (size_t i = 0; i < n; ++i) buf.p[i * kLineWords] = next[i];
    res.first["pcie_read_rtt_ns"] = chase(buf.p, true, next, 32, warmup, reps, "pcie_read_rtt");
    res.second.push_back("pcie_read_rtt: host-memory chase ended on the host-computed line");
  }
  {  // device memory, L2-resident (ld.cg skips L1)
    const size_t n = 4096;
    auto next = random_cycle(n, 2);
    DevBuf<uint64_t> buf(n * kLineWords);
    upload_lines(buf.p, next);
    res.first["device_load_ns"] = chase(buf.p, false, next, 256, warmup, reps, "device_load");
    res.second.push_back("device_load: L2-resident chase ended on the host-computed line");
  }
  {  // device memory, 256 MiB random cycle: DRAM (and TLB) misses
    const size_t n = (size_t(256) << 20) / 128;
    auto next = random_cycle(n, 3);
    DevBuf<uint64_t> buf(n * kLineWords);
    upload_lines(buf.p, next);
    res.first["device_load_dram_ns"] =
        chase(buf.p, false, next, 64, warmup, reps, "device_load_dram");
    res.second.push_back("device_load_dram: 256 MiB chase ended on the host-computed line");
  }
  {  // dependent device-scope atomics
    const int per = 256;
    DevBuf<unsigned long long> ctr(1), sink(1);
    DevBuf<long long> cycles(reps);
    DevBuf<ClockCal> cal(1);
    atomic_kernel<<<1, 1>>>(ctr.p, per, warmup, reps, cycles.p, cal.p, sink.p);
    PRIM_CHECK(cudaGetLastError());
    PRIM_CHECK(cudaDeviceSynchronize());
    unsigned long long total = ctr.to_host()[0], want = (unsigned long long)per * (warmup + reps);
    verify(total == want, "atomic_device: counter " + std::to_string(total) + ", expected " +
                              std::to_string(want));
    verify(sink.to_host()[0] == want - 1, "atomic_device: last atomic did not return the count");
    res.first["atomic_device_ns"] =
        per_op_ns(cycles.to_host(), ns_per_clk(cal.to_host()[0], "atomic_device"), per);
    res.second.push_back("atomic_device: counter equals the number of atomics issued");
  }
  {  // %globaltimer: the cost of a read and how far it moves when it moves
    const int per = 256;
    DevBuf<long long> cycles(reps);
    DevBuf<ClockCal> cal(1);
    DevBuf<unsigned long long> steps(reps), sink(1);
    timer_kernel<<<1, 1>>>(per, warmup, reps, cycles.p, cal.p, steps.p, sink.p);
    PRIM_CHECK(cudaGetLastError());
    PRIM_CHECK(cudaDeviceSynchronize());
    verify(sink.to_host()[0] > 0, "globaltimer: the reads summed to zero");
    res.first["globaltimer_read_ns"] =
        per_op_ns(cycles.to_host(), ns_per_clk(cal.to_host()[0], "globaltimer_read"), per);
    std::vector<double> step_ns;
    for (unsigned long long v : steps.to_host()) step_ns.push_back(double(v));
    verify(step_ns.front() > 0.0, "globaltimer: the timer did not move");
    res.first["globaltimer_step_ns"] = step_ns;
    res.second.push_back("globaltimer: every read made (their sum nonzero), the timer moved");
  }
  return res;
}

std::vector<int> cuda_versions() {
  int drv = 0, rt = 0, sms = 0;
  PRIM_CHECK(cudaDriverGetVersion(&drv));
  PRIM_CHECK(cudaRuntimeGetVersion(&rt));
  PRIM_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  return {drv, rt, sms};
}

}  // namespace prim
