// Host consumer threads of the proxy hand-off (see proxy_host.h).
#include "proxy_host.h"

#include <chrono>

namespace prim {
namespace {

struct Deadline {
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  double limit;
  explicit Deadline(double s) : limit(s) {}
  bool passed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > limit;
  }
};

}  // namespace

std::string proxy_consume(ProxyRingView v, const volatile int* abort, double timeout_s) {
  Deadline dl(timeout_s);
  uint64_t seen = 0, prod = 0;
  unsigned polls = 0;
  while (seen < v.count) {
    prod = __atomic_load_n(&v.ctl->prod, __ATOMIC_ACQUIRE);
    if (prod > v.count || prod < seen)
      return "ring " + std::to_string(v.ring_id) + ": producer index " + std::to_string(prod) +
             " out of order (consumed " + std::to_string(seen) + ")";
    if (prod == seen) {
      if ((++polls & 1023u) == 0 && (*abort || dl.passed()))
        return "ring " + std::to_string(v.ring_id) + ": no descriptor " + std::to_string(seen) +
               " (timed out or aborted)";
      continue;
    }
    for (; seen < prod; ++seen) {
      const ProxyDesc* d = v.ring + (seen % v.depth);
      for (uint32_t j = 0; j < 16; ++j) {
        uint64_t got = __atomic_load_n(&d->w[j], __ATOMIC_RELAXED);
        if (got != proxy_desc_word(seen, v.ring_id, j, v.epoch))
          return "ring " + std::to_string(v.ring_id) + ": descriptor " + std::to_string(seen) +
                 " word " + std::to_string(j) + " is stale or torn";
      }
      __atomic_store_n(&v.ctl->cons, seen + 1, __ATOMIC_RELEASE);
    }
  }
  return "";
}

std::string flag_echo(uint64_t* gpu_flag, uint64_t* host_flag, uint64_t count,
                      const volatile int* abort, double timeout_s) {
  Deadline dl(timeout_s);
  unsigned polls = 0;
  for (uint64_t i = 1; i <= count; ++i) {
    for (;;) {
      uint64_t v = __atomic_load_n(gpu_flag, __ATOMIC_ACQUIRE);
      if (v == i) break;
      if (v != i - 1)
        return "flag " + std::to_string(v) + " seen while waiting for " + std::to_string(i);
      if ((++polls & 1023u) == 0 && (*abort || dl.passed()))
        return "flag " + std::to_string(i) + " never arrived (timed out or aborted)";
    }
    __atomic_store_n(host_flag, i, __ATOMIC_RELEASE);
  }
  return "";
}

}  // namespace prim
