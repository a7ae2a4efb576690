// Host entry points of the primitive microbenchmarks (plain C++, no torch, no CUDA types).
//
// Each family returns (samples per metric, verification checks that passed). Metric
// names end in their unit (_ns, _gbytes_per_s, _mops), as calibration/records.py
// requires. Every sample is already a per-operation value (e.g. ns per WQE), the
// mean of a batch of operations timed together after warm-up. A CUDA error, a spin
// that ran past its bound, or a verification that failed throws std::runtime_error:
// a failed check is an error, never a number.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace prim {

using Metrics = std::map<std::string, std::vector<double>>;
using Result = std::pair<Metrics, std::vector<std::string>>;

Result run_latency(int device, int reps);
Result run_stores_fences(int device, int reps);
Result run_wqe_doorbell(int device, int reps);
Result run_cq_poll(int device, int reps);
Result run_proxy_ring(int device, int reps);
Result run_shared_queue(int device, int reps);
Result run_host_read(int device, int reps);
Result run_fence_reads(int device, int reps);
Result run_warp_copy(int device, int reps);
Result run_turn_handoff(int device, int reps);
Result run_nvlink(int device0, int device1, int reps);

// {CUDA driver API version, CUDA runtime version, SM count of device 0}.
std::vector<int> cuda_versions();

}  // namespace prim
