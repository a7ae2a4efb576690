// A fake libibverbs + libefa (rdma-core v59 signatures) and a driver for hw/efa/host.cpp,
// so tests/test_hw_efa.py can run the host setup without an EFA device: every object is
// logged when made and destroyed, and argv[2] (comma-separated function names, each
// optionally "@k": only its k-th call) makes those calls fail. The driver prints the log,
// the return code, the error line, the number of objects still alive, and the layouts.
//
//   g++ -std=c++17 -I<v59 include> -Ihw/efa hw/efa/host.cpp mock_verbs.cpp -o mock
//   ./mock open ""          one device, one QP, one peer (the single-QP path)
//   ./mock world "" 16 3    one device, 3 QPs, 4 peer entries over 2 GIDs (AHs shared)
//   ./mock caps ""
//   ./mock open-128 ""      the QP made with the inline-write flag (v63: 128-byte WQEs)
//   ./mock open-cntr ""     send and remote-write completion counters on a host page
//   ./mock open-128-cntrgpu ""   both, the counters in GPU memory by dma-buf
// Built with -DMOCK_V59 it is a v59 library (no v63/after-v64 entry points, unknown QP
// flags refused); "nocap:comp_cntr" in the fail list clears the device's COMP_CNTR cap.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <map>
#include <string>
#include <vector>

#include <infiniband/efadv.h>
#include <infiniband/verbs.h>

#include "host.h"
#include "newer_verbs.h"

namespace {
std::vector<std::string> g_log;
std::string g_fail;
int g_live = 0;
uint32_t g_max_batch = 16;
bool g_gpu_cq = false;
void* g_cq_gpu_buf = nullptr;

std::map<std::string, int> g_calls;
uint32_t g_next_qpn = 42, g_next_ahn = 7;

// Whether this call of fn fails: "fn" fails every call, "fn@k" only the k-th. Counted once
// per call (the first query of a call site), so callers ask exactly once.
bool fails(const char* fn) {
  const int k = ++g_calls[fn];
  std::string list = "," + g_fail + ",";
  return list.find("," + std::string(fn) + ",") != std::string::npos ||
         list.find("," + std::string(fn) + "@" + std::to_string(k) + ",") != std::string::npos;
}
template <class T>
T* make(const char* kind) {
  ++g_live;
  g_log.push_back(std::string("create ") + kind);
  return static_cast<T*>(calloc(1, sizeof(T) + 64));
}
int drop(const char* kind, void* p) {
  if (!p) return EINVAL;
  --g_live;
  g_log.push_back(std::string("destroy ") + kind);
  free(p);
  return 0;
}
uint32_t pow2_at_least(uint32_t v) {
  uint32_t p = 1;
  while (p < v) p <<= 1;
  return p;
}
ibv_device g_device;
uint32_t g_cqe = 0, g_sq_wr = 0, g_sq_entry = 64;
bool g_qp_left_reset = false;  // a modify_qp ran since the last QP was made
// a flag in the fail list that is not a call ("nocap:comp_cntr"): never counted
bool flag(const char* f) { return ("," + g_fail + ",").find("," + std::string(f) + ",") != std::string::npos; }
}  // namespace

extern "C" {
ibv_device** ibv_get_device_list(int* n) {
  if (fails("ibv_get_device_list")) {
    errno = ENOSYS;
    return nullptr;
  }
  ibv_device** l = make<ibv_device*>("devlist");
  l[0] = &g_device;
  *n = 1;
  return l;
}
void ibv_free_device_list(ibv_device** l) { drop("devlist", l); }
const char* ibv_get_device_name(ibv_device*) { return "efa_0"; }
ibv_context* ibv_open_device(ibv_device*) {
  if (fails("ibv_open_device")) {
    errno = EACCES;
    return nullptr;
  }
  return make<ibv_context>("ctx");
}
int ibv_close_device(ibv_context* c) { return drop("ctx", c); }
int efadv_query_device(ibv_context*, efadv_device_attr* a, uint32_t) {
  if (fails("efadv_query_device")) return EOPNOTSUPP;
  memset(a, 0, sizeof(*a));
  a->max_sq_wr = 4096;
  a->max_rq_wr = 32768;
  a->max_sq_sge = 2;
  a->max_rq_sge = 3;
  a->inline_buf_size = 32;
  a->device_caps = flag("nocap:comp_cntr") ? 0x3f : 0x7f;  // v59's six bits, and COMP_CNTR after v64
  a->max_rdma_size = 1u << 30;
#ifndef MOCK_V59
  const uint16_t ex = 256;  // v63's inline_buf_size_ex, in v59's reserved bytes
  memcpy(reinterpret_cast<uint8_t*>(a) + LEVER_EFADV_DEVICE_ATTR_INLINE_BUF_SIZE_EX_OFFSET, &ex, 2);
#endif
  return 0;
}
int ibv_query_device(ibv_context*, ibv_device_attr* a) {
  memset(a, 0, sizeof(*a));
  a->max_qp = 256;
  a->max_cq = 512;
  a->max_cqe = 32768;
  a->max_mr = 262144;
  a->max_pd = 256;
  a->max_ah = 1024;
  a->node_guid = 0x1122334455667788ull;
  return 0;
}
int(ibv_query_port)(ibv_context*, uint8_t, _compat_ibv_port_attr* a) {
  ibv_port_attr* p = reinterpret_cast<ibv_port_attr*>(a);
  p->state = IBV_PORT_ACTIVE;
  p->active_mtu = IBV_MTU_4096;
  p->max_msg_sz = 8928;
  return 0;
}
int ibv_query_gid(ibv_context*, uint8_t, int, ibv_gid* g) {
  for (int i = 0; i < 16; ++i) g->raw[i] = (uint8_t)(0xf0 + i);
  return 0;
}
ibv_pd* ibv_alloc_pd(ibv_context* c) {
  if (fails("ibv_alloc_pd")) {
    errno = ENOMEM;
    return nullptr;
  }
  ibv_pd* pd = make<ibv_pd>("pd");
  pd->context = c;
  return pd;
}
int ibv_dealloc_pd(ibv_pd* pd) { return drop("pd", pd); }
static ibv_mr* new_mr(ibv_pd* pd, const char* how) {
  ibv_mr* mr = make<ibv_mr>("mr");
  mr->pd = pd;
  mr->lkey = 0x1234;
  mr->rkey = 0x5678;
  g_log.push_back(std::string("mr via ") + how);
  return mr;
}
ibv_mr* ibv_reg_dmabuf_mr(ibv_pd* pd, uint64_t, size_t, uint64_t, int, int) {
  if (fails("ibv_reg_dmabuf_mr")) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  return new_mr(pd, "ibv_reg_dmabuf_mr");
}
ibv_mr*(ibv_reg_mr)(ibv_pd* pd, void*, size_t, int) {
  if (fails("ibv_reg_mr")) {
    errno = EFAULT;
    return nullptr;
  }
  return new_mr(pd, "ibv_reg_mr");
}
ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* a, size_t l, uint64_t, unsigned int acc) {
  return (ibv_reg_mr)(pd, a, l, (int)acc);
}
int ibv_dereg_mr(ibv_mr* mr) { return drop("mr", mr); }
ibv_cq_ex* efadv_create_cq(ibv_context*, ibv_cq_init_attr_ex* a, efadv_cq_init_attr* e, uint32_t) {
  if (fails("efadv_create_cq")) {
    errno = ENOMEM;
    return nullptr;
  }
  g_cqe = pow2_at_least(a->cqe);
  g_gpu_cq = (e->flags & EFADV_CQ_INIT_FLAGS_EXT_MEM_DMABUF) != 0;
  g_cq_gpu_buf = e->ext_mem_dmabuf.buffer;
  return make<ibv_cq_ex>(g_gpu_cq ? "cq(gpu)" : "cq");
}
int ibv_destroy_cq(ibv_cq* cq) { return drop("cq", cq); }
ibv_qp* efadv_create_qp_ex(ibv_context*, ibv_qp_init_attr_ex* a, efadv_qp_init_attr* e, uint32_t) {
  if (fails("efadv_create_qp_ex") || a->qp_type != IBV_QPT_DRIVER ||
      e->driver_qp_type != EFADV_QP_DRIVER_TYPE_SRD ||
      !(a->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) ||
      !(a->send_ops_flags & IBV_QP_EX_WITH_RDMA_WRITE)) {
    errno = EINVAL;
    return nullptr;
  }
  g_sq_wr = pow2_at_least(a->cap.max_send_wr);
#ifdef MOCK_V59
  if (e->flags & ~EFADV_QP_FLAGS_UNSOLICITED_WRITE_RECV) {  // v59 refuses flags it does not know
    errno = EOPNOTSUPP;
    return nullptr;
  }
#endif
  // v63: the inline-write flag makes every WQE 128 bytes
  g_sq_entry = ((e->flags & LEVER_EFADV_QP_FLAGS_INLINE_WRITE) && !flag("entry64")) ? 128u : 64u;
  ibv_qp* qp = make<ibv_qp>(g_sq_entry == 128u ? "qp(128)" : "qp");
  qp->qp_num = g_next_qpn++;
  g_qp_left_reset = false;
  return qp;
}
int ibv_modify_qp(ibv_qp*, ibv_qp_attr* a, int mask) {
  const char* st = a->qp_state == IBV_QPS_INIT ? "INIT" : a->qp_state == IBV_QPS_RTR ? "RTR" : "RTS";
  const bool f_any = fails("ibv_modify_qp");
  const bool f_rts = a->qp_state == IBV_QPS_RTS && fails("ibv_modify_qp:RTS");
  if (f_any || f_rts) return EINVAL;
  if (a->qp_state == IBV_QPS_INIT && !(mask & IBV_QP_QKEY)) return EINVAL;
  if (a->qp_state != IBV_QPS_INIT) g_qp_left_reset = true;  // RTR/RTS: too late to attach a counter
  g_log.push_back(std::string("modify ") + st);
  return 0;
}
int ibv_destroy_qp(ibv_qp* qp) { return drop("qp", qp); }
int efadv_query_qp_wqs(ibv_qp*, efadv_wq_attr* sq, efadv_wq_attr* rq, uint32_t inlen) {
  if (fails("efadv_query_qp_wqs")) return EOPNOTSUPP;
  if (inlen < sizeof(*sq)) return EINVAL;
  sq->buffer = reinterpret_cast<uint8_t*>(0x7f0000010040ull);
  sq->entry_size = g_sq_entry;
  sq->num_entries = g_sq_wr;
  sq->doorbell = reinterpret_cast<uint32_t*>(0x7f0000020008ull);
  sq->max_batch = g_max_batch;
  rq->buffer = reinterpret_cast<uint8_t*>(0x7f0000030000ull);
  rq->entry_size = 16;
  rq->num_entries = 128;
  rq->doorbell = reinterpret_cast<uint32_t*>(0x7f0000020000ull);
  rq->max_batch = 128;
  return 0;
}
int efadv_query_cq(ibv_cq*, efadv_cq_attr* a, uint32_t) {
  if (fails("efadv_query_cq")) return EOPNOTSUPP;
  a->buffer = g_gpu_cq ? static_cast<uint8_t*>(g_cq_gpu_buf) : reinterpret_cast<uint8_t*>(0x7f0000100000ull);
  a->entry_size = 32;
  a->num_entries = g_cqe;
  return 0;
}
ibv_ah* ibv_create_ah(ibv_pd*, ibv_ah_attr* a) {
  if (fails("ibv_create_ah") || !a->is_global) {
    errno = EINVAL;
    return nullptr;
  }
  return make<ibv_ah>("ah");
}
int ibv_destroy_ah(ibv_ah* ah) { return drop("ah", ah); }
#ifndef MOCK_V59
// v63 (EFA_1.5): only its presence is looked for
int efadv_get_max_sq_depth(ibv_context*, void*, uint32_t) { return 1024; }
// after v64: completion counters (newer_verbs.h's mirrors of the signatures)
void* efadv_create_comp_cntr(void*, lever_ibv_comp_cntr_init_attr* a, lever_efadv_comp_cntr_init_attr* e,
                             uint32_t inlen) {
  const uint32_t want = LEVER_EFADV_COMP_CNTR_INIT_WITH_COMP_EXTERNAL_MEM | LEVER_EFADV_COMP_CNTR_INIT_WITH_ERR_EXTERNAL_MEM;
  if (fails("efadv_create_comp_cntr") || inlen != sizeof(*e) || a->type != LEVER_IBV_COMP_CNTR_TYPE_WRS ||
      a->comp_mask || a->flags || e->flags != want || !e->comp_cntr_ext_mem.ptr || !e->err_cntr_ext_mem.ptr ||
      e->comp_cntr_ext_mem.type != e->err_cntr_ext_mem.type) {
    errno = EINVAL;
    return nullptr;
  }
  const bool dmabuf = e->comp_cntr_ext_mem.type == LEVER_EFADV_MEMORY_LOCATION_DMABUF;
  if (dmabuf && (e->comp_cntr_ext_mem.dmabuf.fd < 0 ||
                 e->err_cntr_ext_mem.dmabuf.offset != e->comp_cntr_ext_mem.dmabuf.offset + 8)) {
    errno = EINVAL;
    return nullptr;
  }
  return make<uint64_t>(dmabuf ? "cntr(dmabuf)" : "cntr(va)");
}
int ibv_qp_attach_comp_cntr(void*, void* cc, lever_ibv_qp_attach_comp_cntr_attr* a) {
  if (fails("ibv_qp_attach_comp_cntr")) return EINVAL;
  if (!cc || g_qp_left_reset) return EINVAL;  // only in RESET or INIT
  char b[64];
  snprintf(b, sizeof(b), "attach cntr ops %u", a->op_mask);
  g_log.push_back(b);
  return 0;
}
int ibv_destroy_comp_cntr(void* cc) { return drop("cntr", cc); }
#endif
int efadv_query_ah(ibv_ah*, efadv_ah_attr* a, uint32_t) {
  if (fails("efadv_query_ah")) return EOPNOTSUPP;
  a->ahn = (uint16_t)g_next_ahn++;
  return 0;
}
}  // extern "C"

namespace {
int map_fn(void*, void* p, size_t len, uint32_t kind, uint64_t* dev) {
  if (fails(kind == LEVER_EFA_MEM_HOST ? "map:host" : "map:bar")) return 1;
  if (fails("map:any")) return 1;
  ++g_live;
  char b[96];
  snprintf(b, sizeof(b), "create map(%s)", kind == LEVER_EFA_MEM_HOST ? "host" : "bar");
  g_log.push_back(b);
  if (((uint64_t)(uintptr_t)p & 4095u) || (len & 4095u)) g_log.push_back("map not page-aligned");
  *dev = (uint64_t)(uintptr_t)p + (1ull << 44);
  return 0;
}
void unmap_fn(void*, void*) {
  --g_live;
  g_log.push_back("destroy map");
}

void print_layout(const lever_efa_nic_layout& l) {
#define P(f) printf("layout %s %llu\n", #f, (unsigned long long)l.f)
  P(version); P(qp_num); P(sq_buffer); P(sq_buffer_dev); P(sq_doorbell); P(sq_doorbell_dev);
  P(sq_entry_size); P(sq_num_entries); P(sq_max_batch); P(sq_buffer_mem); P(sq_doorbell_mem);
  P(sq_phase_first); P(cq_buffer); P(cq_buffer_dev); P(cq_doorbell); P(cq_entry_size);
  P(cq_num_entries); P(cq_buffer_mem); P(cq_phase_first); P(qkey); P(lkey); P(local_addr);
  P(inline_buf_size); P(max_rdma_size); P(device_caps); P(num_peers); P(peers); P(peers_mem);
  P(inline_write_size); P(cntr_mem); P(send_cntr); P(send_cntr_dev); P(send_err_cntr_dev);
  P(rwrite_cntr); P(rwrite_cntr_dev);
#undef P
}
}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "open";
  g_fail = argc > 2 ? argv[2] : "";
  if (argc > 3) g_max_batch = (uint32_t)strtoul(argv[3], nullptr, 0);
  const int nqp = argc > 4 ? atoi(argv[4]) : 3;
  char err[256] = "";
  int rc = 0;
  static uint8_t window[1 << 16];
  if (mode == "caps") {
    lever_efa_caps c;
    rc = lever_efa_query_caps(nullptr, 1, &c, err, sizeof(err));
    if (!rc)
      printf("caps %s max_sq_wr %u device_caps %u max_rdma_size %u max_tx_batch %u port_state %u "
             "lib_features %u inline_ex %u\n",
             c.device_name, c.max_sq_wr, c.device_caps, c.max_rdma_size, c.max_tx_batch, c.port_state,
             c.lib_features, c.inline_buf_size_ex);
  } else {
    lever_efa_device_options o;
    lever_efa_device_options_init(&o);
    o.buf = window;
    o.len = sizeof(window);
    o.dmabuf_fd = 3;  // exercise ibv_reg_dmabuf_mr first
    o.mapper.map = map_fn;
    o.mapper.unmap = unmap_fn;
    lever_efa_qp_options qo;
    lever_efa_qp_options_init(&qo);
    if (mode == "open-gpucq") {
      qo.cq_dmabuf_fd = 4;
      qo.cq_gpu_buf = reinterpret_cast<void*>(0x7e0000000000ull);
      qo.cq_dmabuf_len = 1 << 20;
    }
    // the newer generations: 128-byte WQEs with inline writes (v63), completion counters
    // (after v64) on a host page or in GPU memory by dma-buf
    if (mode.find("-128") != std::string::npos) qo.inline_write = 1;
    if (mode.find("-cntr") != std::string::npos) qo.send_cntr = qo.rwrite_cntr = 1;
    if (mode.find("-cntrgpu") != std::string::npos) {
      qo.cntr_dmabuf_fd = 5;
      qo.cntr_dmabuf_offset = 4096;
      qo.cntr_gpu_buf = reinterpret_cast<void*>(0x7e0000100000ull);
    }
    lever_efa_device* dev = nullptr;
    rc = lever_efa_device_open(&o, &dev, err, sizeof(err));
    if (!rc && mode != "world") {
      lever_efa_qp* qp = nullptr;
      rc = lever_efa_qp_open(dev, &qo, &qp, err, sizeof(err));
      uint8_t gid[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
      uint32_t idx = 99;
      if (!rc)
        rc = lever_efa_device_add_peer(dev, gid, 17, 0x11111111u, 0x9abc, 0x7e1000000000ull, &idx,
                                       err, sizeof(err));
      if (!rc) {
        uint32_t n = 0;
        const lever_efa_peer* pe = lever_efa_device_peers(dev, &n);
        printf("peer %u ahn %u qpn %u rkey %u\n", idx, pe[0].ahn, pe[0].remote_qpn, pe[0].rkey);
        lever_efa_nic_layout l;
        rc = lever_efa_qp_fill_layout(qp, 0x7e2000000000ull, LEVER_EFA_MEM_GPU, 0, &l, err,
                                      sizeof(err));
        if (!rc) print_layout(l);
      }
    } else if (!rc) {
      // a rank's world: nqp QPs on one device (the last receive-only), then the peer table of
      // two ranks x two receive queues (two GIDs: two AHs, shared by the entries of a rank)
      std::vector<lever_efa_qp*> qps;
      for (int i = 0; i < nqp && !rc; ++i) {
        lever_efa_qp* q = nullptr;
        rc = lever_efa_qp_open(dev, &qo, &q, err, sizeof(err));
        if (!rc) qps.push_back(q);
      }
      for (int r = 0; r < 2 && !rc; ++r)
        for (int i = 0; i < 2 && !rc; ++i) {
          uint8_t gid[16] = {0};
          gid[15] = (uint8_t)(r + 1);
          uint32_t idx = 0;
          rc = lever_efa_device_add_peer(dev, gid, 100 + 2 * r + i, 0x5eed0000u | (uint32_t)i,
                                         0x700u + (uint32_t)r, 0x7e1000000000ull + (uint64_t)r, &idx,
                                         err, sizeof(err));
          if (!rc) {
            const lever_efa_peer* pe = lever_efa_device_peers(dev, nullptr);
            printf("peer %u ahn %u qpn %u qkey %u\n", idx, pe[idx].ahn, pe[idx].remote_qpn,
                   pe[idx].remote_qkey);
          }
        }
      if (!rc) printf("ahs %u\n", lever_efa_device_num_ahs(dev));
      for (size_t i = 0; i < qps.size() && !rc; ++i) {
        lever_efa_nic_layout l;
        const uint32_t fl = i + 1 == qps.size() ? LEVER_EFA_FILL_NO_SQ_MAP : 0u;
        rc = lever_efa_qp_fill_layout(qps[i], 0, LEVER_EFA_MEM_GPU, fl, &l, err, sizeof(err));
        if (!rc)
          printf("qp %zu num %u peers %u sq_dev %llu cq_dev %llu\n", i, lever_efa_qp_num(qps[i]),
                 l.num_peers, (unsigned long long)l.sq_buffer_dev, (unsigned long long)l.cq_buffer_dev);
      }
      if (!rc && qps.size() > 1) {  // one QP closed on its own, the rest with the device
        int crc = lever_efa_qp_close(qps[0]);
        printf("closed qp 0 rc %d\n", crc);
      }
    }
    int crc = lever_efa_device_close(dev);
    if (!rc) rc = crc;
  }
  for (const auto& s : g_log) printf("log %s\n", s.c_str());
  printf("rc %d\nlive %d\nerr %s\n", rc, g_live, err);
  return 0;
}
