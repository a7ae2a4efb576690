// Host setup of a rank's EFA device and SRD QPs against rdma-core v59 (ibv_* + efadv_*):
// device discovery and capabilities, PD / MR / AH (one set per device), SRD QP + CQ (many per
// device), the queue queries that fill lever_efa_nic_layout, and teardown in reverse order.
// See host.h for why.
//
// Build (compile only where there is no EFA; link with -libverbs -lefa where there is):
//   g++ -std=c++17 -c $(python3 hw/efa/rdma_core.py) hw/efa/host.cpp
#include "host.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <new>
#include <vector>

#include <infiniband/efadv.h>
#include <infiniband/verbs.h>

#include "newer_verbs.h"

static_assert(LEVER_EFA_CAP_RDMA_READ == EFADV_DEVICE_ATTR_CAPS_RDMA_READ, "cap bit");
static_assert(LEVER_EFA_CAP_RNR_RETRY == EFADV_DEVICE_ATTR_CAPS_RNR_RETRY, "cap bit");
static_assert(LEVER_EFA_CAP_CQ_WITH_SGID == EFADV_DEVICE_ATTR_CAPS_CQ_WITH_SGID, "cap bit");
static_assert(LEVER_EFA_CAP_RDMA_WRITE == EFADV_DEVICE_ATTR_CAPS_RDMA_WRITE, "cap bit");
static_assert(LEVER_EFA_CAP_UNSOLICITED_WRITE_RECV == EFADV_DEVICE_ATTR_CAPS_UNSOLICITED_WRITE_RECV,
              "cap bit");
static_assert(LEVER_EFA_CAP_CQ_WITH_EXT_MEM_DMABUF == EFADV_DEVICE_ATTR_CAPS_CQ_WITH_EXT_MEM_DMABUF,
              "cap bit");

static_assert(offsetof(efadv_device_attr, inline_buf_size) + 2 == LEVER_EFADV_DEVICE_ATTR_INLINE_BUF_SIZE_EX_OFFSET &&
                  sizeof(efadv_device_attr) >= LEVER_EFADV_DEVICE_ATTR_INLINE_BUF_SIZE_EX_OFFSET + 2,
              "v63's inline_buf_size_ex follows inline_buf_size (v59's reserved bytes)");
static_assert(sizeof(((efadv_qp_init_attr*)0)->flags) == 2, "efadv_qp_init_attr.flags is 16 bits");

namespace {

// An entry point of the loaded libibverbs/libefa newer than the v59 headers (newer_verbs.h),
// or null: the process's global scope first, then the libraries themselves (a Python
// extension's dependencies are not in the global scope).
void* lib_sym(const char* name) {
  if (void* p = dlsym(RTLD_DEFAULT, name)) return p;
  for (const char* so : {"libefa.so.1", "libibverbs.so.1"}) {
    void* h = dlopen(so, RTLD_NOW | RTLD_NOLOAD);
    if (!h) continue;
    void* p = dlsym(h, name);
    dlclose(h);  // still loaded: NOLOAD only took a reference
    if (p) return p;
  }
  return nullptr;
}

struct NewerVerbs {
  lever_efadv_create_comp_cntr_fn create_comp_cntr = nullptr;
  lever_ibv_qp_attach_comp_cntr_fn qp_attach_comp_cntr = nullptr;
  lever_ibv_destroy_comp_cntr_fn destroy_comp_cntr = nullptr;
  uint32_t features = 0;  // LEVER_EFA_LIB_*
};
NewerVerbs newer_verbs() {
  NewerVerbs v;
  if (lib_sym("efadv_get_max_sq_depth")) v.features |= LEVER_EFA_LIB_WQE128;  // EFA_1.5, v63
  v.create_comp_cntr = (lever_efadv_create_comp_cntr_fn)lib_sym("efadv_create_comp_cntr");
  v.qp_attach_comp_cntr = (lever_ibv_qp_attach_comp_cntr_fn)lib_sym("ibv_qp_attach_comp_cntr");
  v.destroy_comp_cntr = (lever_ibv_destroy_comp_cntr_fn)lib_sym("ibv_destroy_comp_cntr");
  if (v.create_comp_cntr && v.qp_attach_comp_cntr && v.destroy_comp_cntr) v.features |= LEVER_EFA_LIB_COMP_CNTR;
  return v;
}

// A one-line message into the caller's buffer; returns rc so call sites stay short.
int fail(char* err, size_t n, int rc, const char* fmt, ...) {
  if (err && n) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(err, n, fmt, ap);
    va_end(ap);
    if (k >= 0 && (size_t)k < n) snprintf(err + k, n - (size_t)k, ": %s", strerror(rc));
  }
  return rc ? rc : EIO;
}

// errno after a verbs call that returns a pointer, never 0
int last_errno() { return errno ? errno : EIO; }

bool is_efa(ibv_context* ctx) {
  efadv_device_attr a;
  memset(&a, 0, sizeof(a));
  return efadv_query_device(ctx, &a, sizeof(a)) == 0;
}

// The named device, or the first one the EFA provider drives. The device list is
// freed before returning (an open context does not need it).
ibv_context* open_efa(const char* name, char* dev_name, size_t dev_name_len, int* rc, char* err,
                      size_t n) {
  int num = 0;
  ibv_device** list = ibv_get_device_list(&num);
  if (!list) {
    *rc = fail(err, n, last_errno(), "ibv_get_device_list");
    return nullptr;
  }
  ibv_context* found = nullptr;
  for (int i = 0; i < num && !found; ++i) {
    const char* dn = ibv_get_device_name(list[i]);
    if (name && (!dn || strcmp(dn, name) != 0)) continue;
    ibv_context* ctx = ibv_open_device(list[i]);
    if (!ctx) continue;
    if (is_efa(ctx)) {
      found = ctx;
      snprintf(dev_name, dev_name_len, "%s", dn ? dn : "");
    } else {
      ibv_close_device(ctx);
    }
  }
  ibv_free_device_list(list);
  if (!found) {
    *rc = ENODEV;
    if (err && n)
      snprintf(err, n, num == 0 ? "no ibv device" : "no ibv device of the EFA provider%s%s",
               name ? " named " : "", name ? name : "");
  }
  return found;
}

int fill_caps(ibv_context* ctx, uint8_t port, lever_efa_caps* c, char* err, size_t n) {
  efadv_device_attr ea;
  memset(&ea, 0, sizeof(ea));
  int rc = efadv_query_device(ctx, &ea, sizeof(ea));
  if (rc) return fail(err, n, rc, "efadv_query_device");
  c->max_sq_wr = ea.max_sq_wr;
  c->max_rq_wr = ea.max_rq_wr;
  c->max_sq_sge = ea.max_sq_sge;
  c->max_rq_sge = ea.max_rq_sge;
  c->inline_buf_size = ea.inline_buf_size;
  // v63's inline_buf_size_ex sits in v59's reserved bytes (0 from an older library)
  memcpy(&c->inline_buf_size_ex, reinterpret_cast<const uint8_t*>(&ea) + LEVER_EFADV_DEVICE_ATTR_INLINE_BUF_SIZE_EX_OFFSET,
         sizeof(c->inline_buf_size_ex));
  c->lib_features = newer_verbs().features;
  c->device_caps = ea.device_caps;
  c->max_rdma_size = ea.max_rdma_size;

  ibv_device_attr da;
  memset(&da, 0, sizeof(da));
  rc = ibv_query_device(ctx, &da);
  if (rc) return fail(err, n, rc, "ibv_query_device");
  c->node_guid = da.node_guid;
  c->max_qp = (uint32_t)da.max_qp;
  c->max_cq = (uint32_t)da.max_cq;
  c->max_cqe = (uint32_t)da.max_cqe;
  c->max_mr = (uint32_t)da.max_mr;
  c->max_pd = (uint32_t)da.max_pd;
  c->max_ah = (uint32_t)da.max_ah;
  c->max_mr_size = da.max_mr_size;

  ibv_port_attr pa;
  memset(&pa, 0, sizeof(pa));
  rc = ibv_query_port(ctx, port, &pa);
  if (rc) return fail(err, n, rc, "ibv_query_port(%u)", port);
  c->port_state = (uint32_t)pa.state;
  c->active_mtu = (uint32_t)pa.active_mtu;
  c->max_msg_sz = pa.max_msg_sz;

  ibv_gid gid;
  rc = ibv_query_gid(ctx, port, 0, &gid);
  if (rc) return fail(err, n, rc ? rc : EIO, "ibv_query_gid(%u, 0)", port);
  memcpy(c->gid, gid.raw, sizeof(c->gid));
  return 0;
}

uint64_t send_ops_for(uint32_t caps) {
  uint64_t ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
  if (caps & LEVER_EFA_CAP_RDMA_WRITE)
    ops |= IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
  if (caps & LEVER_EFA_CAP_RDMA_READ) ops |= IBV_QP_EX_WITH_RDMA_READ;
  return ops;
}

// An SRD QP on pd whose send and receive completions go to cq.
ibv_qp* create_srd_qp(ibv_context* ctx, ibv_pd* pd, ibv_cq* cq, uint32_t caps, uint32_t sq_depth,
                      uint32_t rq_depth, uint8_t sl, bool unsolicited, int* rc, char* err,
                      size_t n, bool inline_write = false) {
  ibv_qp_init_attr_ex qa;
  memset(&qa, 0, sizeof(qa));
  qa.send_cq = cq;
  qa.recv_cq = cq;
  qa.cap.max_send_wr = sq_depth;
  qa.cap.max_recv_wr = rq_depth;
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 1;
  qa.cap.max_inline_data = 0;
  qa.qp_type = IBV_QPT_DRIVER;
  qa.pd = pd;
  qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  qa.send_ops_flags = send_ops_for(caps);

  efadv_qp_init_attr ea;
  memset(&ea, 0, sizeof(ea));
  ea.driver_qp_type = EFADV_QP_DRIVER_TYPE_SRD;
  ea.sl = sl;
  if (unsolicited) ea.flags |= EFADV_QP_FLAGS_UNSOLICITED_WRITE_RECV;
  // v63: RDMA writes with inline data; the provider then makes every WQE 128 bytes
  if (inline_write) ea.flags |= LEVER_EFADV_QP_FLAGS_INLINE_WRITE;

  ibv_qp* qp = efadv_create_qp_ex(ctx, &qa, &ea, sizeof(ea));
  if (!qp)
    *rc = fail(err, n, last_errno(), "efadv_create_qp_ex(SRD, sq %u, rq %u%s)", sq_depth, rq_depth,
               inline_write ? ", inline writes" : "");
  return qp;
}

// RESET -> INIT -> RTR -> RTS, as an SRD QP needs before it can post.
int qp_to_rts(ibv_qp* qp, uint8_t port, uint32_t qkey, uint32_t caps, char* err, size_t n) {
  ibv_qp_attr a;
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = port;
  a.qkey = qkey;
  int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
  if (rc) return fail(err, n, rc, "ibv_modify_qp(INIT)");
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTR;
  rc = ibv_modify_qp(qp, &a, IBV_QP_STATE);
  if (rc) return fail(err, n, rc, "ibv_modify_qp(RTR)");
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 0;
  int mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
  if (caps & LEVER_EFA_CAP_RNR_RETRY) {
    a.rnr_retry = 7;  // the provider's "retry forever"
    mask |= IBV_QP_RNR_RETRY;
  }
  rc = ibv_modify_qp(qp, &a, mask);
  if (rc) return fail(err, n, rc, "ibv_modify_qp(RTS)");
  return 0;
}

ibv_cq_ex* create_cq(ibv_context* ctx, const lever_efa_qp_options* o, int* rc, char* err,
                     size_t n) {
  ibv_cq_init_attr_ex ca;
  memset(&ca, 0, sizeof(ca));
  ca.cqe = o ? o->cq_depth : 64;
  ca.wc_flags = IBV_WC_STANDARD_FLAGS;
  efadv_cq_init_attr ea;
  memset(&ea, 0, sizeof(ea));
  if (o && o->cq_dmabuf_fd >= 0) {
    ea.flags = EFADV_CQ_INIT_FLAGS_EXT_MEM_DMABUF;
    ea.ext_mem_dmabuf.buffer = (uint8_t*)o->cq_gpu_buf;
    ea.ext_mem_dmabuf.length = o->cq_dmabuf_len;
    ea.ext_mem_dmabuf.offset = o->cq_dmabuf_offset;
    ea.ext_mem_dmabuf.fd = o->cq_dmabuf_fd;
  }
  ibv_cq_ex* cq = efadv_create_cq(ctx, &ca, &ea, sizeof(ea));
  if (!cq)
    *rc = fail(err, n, last_errno(), "efadv_create_cq(%u entries%s)", ca.cqe,
               (o && o->cq_dmabuf_fd >= 0) ? ", GPU memory by dma-buf" : "");
  return cq;
}

// The device's max_tx_batch in WQEs, read back from a probe QP (efadv_query_qp_wqs);
// every probe object is destroyed in reverse order whatever happens.
int probe_max_batch(ibv_context* ctx, uint32_t caps, uint32_t* max_batch, char* err, size_t n) {
  int rc = 0;
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ibv_cq_ex* cq = nullptr;
  ibv_qp* qp = nullptr;
  if (!pd) {
    rc = fail(err, n, last_errno(), "ibv_alloc_pd");
  } else if (!(cq = create_cq(ctx, nullptr, &rc, err, n))) {
  } else if (!(qp = create_srd_qp(ctx, pd, ibv_cq_ex_to_cq(cq), caps, 64, 1, 0, false, &rc, err,
                                  n))) {
  } else {
    efadv_wq_attr sq, rq;
    memset(&sq, 0, sizeof(sq));
    memset(&rq, 0, sizeof(rq));
    rc = efadv_query_qp_wqs(qp, &sq, &rq, sizeof(sq));
    if (rc)
      fail(err, n, rc, "efadv_query_qp_wqs");
    else
      *max_batch = sq.max_batch < sq.num_entries ? sq.max_batch : sq.num_entries;
  }
  if (qp) ibv_destroy_qp(qp);
  if (cq) ibv_destroy_cq(ibv_cq_ex_to_cq(cq));
  if (pd) ibv_dealloc_pd(pd);
  return rc;
}

// Page-aligned range around [p, p + len) for cudaHostRegister.
void page_range(uint64_t p, uint64_t len, uint64_t* base, uint64_t* span) {
  uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
  *base = p & ~(pg - 1);
  *span = ((p + len - *base) + pg - 1) & ~(pg - 1);
}

}  // namespace

struct lever_efa_qp {
  lever_efa_device* dev = nullptr;
  lever_efa_qp_options opt;
  ibv_cq_ex* cq = nullptr;
  ibv_qp* qp = nullptr;
  // completion counters (after v64): [0] the send counter, [1] the remote-write counter, on
  // 32 bytes of counter memory (a host page of ours, or the caller's GPU memory)
  void* cntr[2] = {nullptr, nullptr};
  void* cntr_host = nullptr;
  NewerVerbs nv;
  uint64_t cntr_dev = 0;
  uint32_t cntr_mem = LEVER_EFA_MEM_NONE;
  std::vector<void*> mapped;  // host pointers mapped through the device's mapper, in order
  bool maps_done = false;
  uint64_t sq_buffer_dev = 0, sq_doorbell_dev = 0, cq_buffer_dev = 0;
  uint32_t cq_mem = LEVER_EFA_MEM_NONE;
};

struct lever_efa_device {
  lever_efa_device_options opt;
  lever_efa_caps caps;
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_mr* mr = nullptr;
  bool mr_dmabuf = false;
  struct Ah {
    uint8_t gid[16];
    ibv_ah* ah;
    uint16_t ahn;
  };
  std::vector<Ah> ahs;                 // one per distinct peer GID, in creation order
  std::vector<lever_efa_peer> peers;   // the peer table, in the order entries were added
  std::vector<lever_efa_qp*> qps;      // open QPs, in creation order

  // GPU address of host range [p, p + len): the page range is mapped, the offset kept.
  uint64_t map(lever_efa_qp* q, uint64_t p, uint64_t len, uint32_t kind) {
    if (!opt.mapper.map || !p) return 0;
    uint64_t base, span, dev = 0;
    page_range(p, len, &base, &span);
    if (opt.mapper.map(opt.mapper.user, (void*)base, span, kind, &dev) != 0 || !dev) return 0;
    q->mapped.push_back((void*)base);
    return dev + (p - base);
  }
};

namespace {
// Undoes the QP's GPU mappings, newest first (before the provider unmaps the memory).
void unmap_qp(lever_efa_qp* q) {
  lever_efa_device* d = q->dev;
  if (d->opt.mapper.unmap)
    for (auto it = q->mapped.rbegin(); it != q->mapped.rend(); ++it)
      d->opt.mapper.unmap(d->opt.mapper.user, *it);
  q->mapped.clear();
}

// Unmaps, destroys the QP, then its CQ; the QP leaves its device's list.
int close_qp(lever_efa_qp* q) {
  int first = 0;
  auto note = [&first](int rc) {
    if (rc && !first) first = rc;
  };
  lever_efa_device* d = q->dev;
  unmap_qp(q);
  if (q->qp) note(ibv_destroy_qp(q->qp));  // detaches its counters
  for (int i = 1; i >= 0; --i)
    if (q->cntr[i]) note(q->nv.destroy_comp_cntr(q->cntr[i]));
  if (q->cq) note(ibv_destroy_cq(ibv_cq_ex_to_cq(q->cq)));
  free(q->cntr_host);
  for (auto it = d->qps.begin(); it != d->qps.end(); ++it)
    if (*it == q) {
      d->qps.erase(it);
      break;
    }
  delete q;
  return first;
}
}  // namespace

namespace {
// The QP's completion counters (after v64), made before the QP so that teardown can go in
// reverse (a counter can not be destroyed while a QP holds it; destroying the QP detaches
// it): counter memory first (the caller's GPU memory by dma-buf, else a host page of ours),
// then one counter per kind asked for, its completion and error counts on that memory.
int create_counters(lever_efa_qp* q, char* err, size_t n) {
  const lever_efa_qp_options& o = q->opt;
  if (!o.send_cntr && !o.rwrite_cntr) return 0;
  q->nv = newer_verbs();
  const bool gpu = o.cntr_dmabuf_fd >= 0;
  uint8_t* base = static_cast<uint8_t*>(o.cntr_gpu_buf);
  if (!gpu) {
    const long pg = sysconf(_SC_PAGESIZE);
    if (posix_memalign(&q->cntr_host, (size_t)pg, (size_t)pg)) return fail(err, n, ENOMEM, "counter page");
    memset(q->cntr_host, 0, (size_t)pg);
    base = static_cast<uint8_t*>(q->cntr_host);
  }
  q->cntr_mem = gpu ? LEVER_EFA_MEM_GPU : LEVER_EFA_MEM_HOST;
  for (int i = 0; i < 2; ++i) {
    if (!(i == 0 ? o.send_cntr : o.rwrite_cntr)) continue;
    lever_ibv_comp_cntr_init_attr ca;
    memset(&ca, 0, sizeof(ca));
    ca.type = LEVER_IBV_COMP_CNTR_TYPE_WRS;
    lever_efadv_comp_cntr_init_attr ea;
    memset(&ea, 0, sizeof(ea));
    ea.flags = LEVER_EFADV_COMP_CNTR_INIT_WITH_COMP_EXTERNAL_MEM | LEVER_EFADV_COMP_CNTR_INIT_WITH_ERR_EXTERNAL_MEM;
    lever_efadv_memory_location* loc[2] = {&ea.comp_cntr_ext_mem, &ea.err_cntr_ext_mem};
    for (int k = 0; k < 2; ++k) {
      const uint64_t off = (uint64_t)(16 * i + 8 * k);
      loc[k]->ptr = base + off;
      loc[k]->type = gpu ? LEVER_EFADV_MEMORY_LOCATION_DMABUF : LEVER_EFADV_MEMORY_LOCATION_VA;
      if (gpu) {
        loc[k]->dmabuf.fd = o.cntr_dmabuf_fd;
        loc[k]->dmabuf.offset = o.cntr_dmabuf_offset + off;
      }
    }
    q->cntr[i] = q->nv.create_comp_cntr(q->dev->ctx, &ca, &ea, (uint32_t)sizeof(ea));
    if (!q->cntr[i])
      return fail(err, n, last_errno(), "efadv_create_comp_cntr(%s, %s memory)", i == 0 ? "send" : "remote write",
                  gpu ? "GPU" : "host");
  }
  return 0;
}
}  // namespace

extern "C" {

void lever_efa_device_options_init(lever_efa_device_options* o) {
  memset(o, 0, sizeof(*o));
  o->port = 1;
  o->dmabuf_fd = -1;
}

void lever_efa_qp_options_init(lever_efa_qp_options* o) {
  memset(o, 0, sizeof(*o));
  o->sq_depth = 1024;
  o->rq_depth = 128;
  o->cq_depth = 4096;
  o->qkey = 0x11111111u;
  o->cq_dmabuf_fd = -1;
  o->cntr_dmabuf_fd = -1;
}

int lever_efa_query_caps(const char* device_name, uint8_t port, lever_efa_caps* caps, char* err,
                         size_t err_len) {
  memset(caps, 0, sizeof(*caps));
  int rc = 0;
  ibv_context* ctx =
      open_efa(device_name, caps->device_name, sizeof(caps->device_name), &rc, err, err_len);
  if (!ctx) return rc;
  rc = fill_caps(ctx, port ? port : 1, caps, err, err_len);
  if (!rc) rc = probe_max_batch(ctx, caps->device_caps, &caps->max_tx_batch, err, err_len);
  ibv_close_device(ctx);
  return rc;
}

int lever_efa_device_close(lever_efa_device* d) {
  if (!d) return 0;
  int first = 0;
  auto note = [&first](int rc) {
    if (rc && !first) first = rc;
  };
  // reverse order of creation, as a rank makes them (QPs, then the peers' AHs once the
  // addresses are exchanged, then the GPU mappings when the layouts are filled): mappings
  // (newest QP first), AHs, QPs with their CQs (newest first), MR, PD, context
  for (auto it = d->qps.rbegin(); it != d->qps.rend(); ++it) unmap_qp(*it);
  for (auto it = d->ahs.rbegin(); it != d->ahs.rend(); ++it) note(ibv_destroy_ah(it->ah));
  d->ahs.clear();
  while (!d->qps.empty()) note(close_qp(d->qps.back()));
  if (d->mr) note(ibv_dereg_mr(d->mr));
  if (d->pd) note(ibv_dealloc_pd(d->pd));
  if (d->ctx) note(ibv_close_device(d->ctx));
  delete d;
  return first;
}

int lever_efa_device_open(const lever_efa_device_options* o, lever_efa_device** out, char* err,
                          size_t err_len) {
  *out = nullptr;
  if (!o || !o->buf || !o->len) return fail(err, err_len, EINVAL, "device options: no window");
  lever_efa_device* d = new (std::nothrow) lever_efa_device();
  if (!d) return fail(err, err_len, ENOMEM, "device");
  d->opt = *o;
  memset(&d->caps, 0, sizeof(d->caps));
  int rc = 0;
  const uint8_t port = o->port ? o->port : 1;
  d->opt.port = port;

  d->ctx = open_efa(o->device_name, d->caps.device_name, sizeof(d->caps.device_name), &rc, err,
                    err_len);
  if (!d->ctx) goto fail_out;
  if ((rc = fill_caps(d->ctx, port, &d->caps, err, err_len))) goto fail_out;

  d->pd = ibv_alloc_pd(d->ctx);
  if (!d->pd) {
    rc = fail(err, err_len, last_errno(), "ibv_alloc_pd");
    goto fail_out;
  }
  {
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    if (d->caps.device_caps & LEVER_EFA_CAP_RDMA_READ) access |= IBV_ACCESS_REMOTE_READ;
    // dma-buf first (GPU memory without nvidia_peermem), then the classic path
    if (o->dmabuf_fd >= 0)
      d->mr = ibv_reg_dmabuf_mr(d->pd, o->dmabuf_offset, o->len, (uint64_t)(uintptr_t)o->buf,
                                o->dmabuf_fd, access);
    d->mr_dmabuf = d->mr != nullptr;
    if (!d->mr) d->mr = ibv_reg_mr(d->pd, o->buf, o->len, access);
    if (!d->mr) {
      rc = fail(err, err_len, last_errno(), "ibv_reg_mr(%zu bytes%s)", o->len,
                o->dmabuf_fd >= 0 ? ", after ibv_reg_dmabuf_mr failed" : "");
      goto fail_out;
    }
  }
  *out = d;
  return 0;

fail_out:
  lever_efa_device_close(d);
  return rc ? rc : EIO;
}

const lever_efa_caps* lever_efa_device_caps(const lever_efa_device* d) { return d ? &d->caps : nullptr; }

int lever_efa_device_local(const lever_efa_device* d, uint32_t* lkey, uint32_t* rkey,
                           uint64_t* addr, uint8_t gid[16]) {
  if (!d || !d->mr) return EINVAL;
  if (lkey) *lkey = d->mr->lkey;
  if (rkey) *rkey = d->mr->rkey;
  if (addr) *addr = (uint64_t)(uintptr_t)d->opt.buf;  // the iova the MR was registered at
  if (gid) memcpy(gid, d->caps.gid, 16);
  return 0;
}

int lever_efa_device_add_peer(lever_efa_device* d, const uint8_t gid[16], uint32_t qpn,
                              uint32_t qkey, uint32_t rkey, uint64_t remote_addr, uint32_t* index,
                              char* err, size_t err_len) {
  if (!d || !d->pd) return fail(err, err_len, EINVAL, "add_peer: device not open");
  if (qpn > 0xffffu)
    return fail(err, err_len, EINVAL, "add_peer: QPN %u does not fit the WQE's 16 bits", qpn);
  if (qkey == 0u) return fail(err, err_len, EINVAL, "add_peer: qkey 0");
  const lever_efa_device::Ah* found = nullptr;
  for (const auto& a : d->ahs)
    if (memcmp(a.gid, gid, 16) == 0) found = &a;
  if (!found) {
    ibv_ah_attr aa;
    memset(&aa, 0, sizeof(aa));
    aa.is_global = 1;
    aa.port_num = d->opt.port;
    memcpy(aa.grh.dgid.raw, gid, 16);
    ibv_ah* ah = ibv_create_ah(d->pd, &aa);
    if (!ah) return fail(err, err_len, last_errno(), "ibv_create_ah");
    efadv_ah_attr ea;
    memset(&ea, 0, sizeof(ea));
    int rc = efadv_query_ah(ah, &ea, sizeof(ea));
    if (rc) {
      ibv_destroy_ah(ah);
      return fail(err, err_len, rc, "efadv_query_ah");
    }
    lever_efa_device::Ah a;
    memcpy(a.gid, gid, 16);
    a.ah = ah;
    a.ahn = ea.ahn;
    d->ahs.push_back(a);
    found = &d->ahs.back();
  }
  lever_efa_peer p;
  memset(&p, 0, sizeof(p));
  p.ahn = found->ahn;
  p.remote_qpn = (uint16_t)qpn;
  p.remote_qkey = qkey;
  p.rkey = rkey;
  p.remote_addr = remote_addr;
  d->peers.push_back(p);
  if (index) *index = (uint32_t)(d->peers.size() - 1);
  return 0;
}

const lever_efa_peer* lever_efa_device_peers(const lever_efa_device* d, uint32_t* num) {
  if (num) *num = d ? (uint32_t)d->peers.size() : 0u;
  return (d && !d->peers.empty()) ? d->peers.data() : nullptr;
}

uint32_t lever_efa_device_num_ahs(const lever_efa_device* d) { return d ? (uint32_t)d->ahs.size() : 0u; }

int lever_efa_device_mr_dmabuf(const lever_efa_device* d) { return (d && d->mr_dmabuf) ? 1 : 0; }

int lever_efa_qp_open(lever_efa_device* d, const lever_efa_qp_options* o, lever_efa_qp** out,
                      char* err, size_t err_len) {
  *out = nullptr;
  if (!d || !d->pd || !o) return fail(err, err_len, EINVAL, "qp_open: device not open");
  if (o->qkey == 0u) return fail(err, err_len, EINVAL, "qp_open: qkey 0");
  if (o->cq_dmabuf_fd >= 0 && !(d->caps.device_caps & LEVER_EFA_CAP_CQ_WITH_EXT_MEM_DMABUF))
    return fail(err, err_len, EOPNOTSUPP, "CQ in GPU memory: device lacks CQ_WITH_EXT_MEM_DMABUF");
  if (o->unsolicited_write_recv && !(d->caps.device_caps & LEVER_EFA_CAP_UNSOLICITED_WRITE_RECV))
    return fail(err, err_len, EOPNOTSUPP, "unsolicited write receive: device lacks the capability");
  if (o->inline_write && !(d->caps.lib_features & LEVER_EFA_LIB_WQE128))
    return fail(err, err_len, EOPNOTSUPP,
                "128-byte WQEs with inline writes: rdma-core too old (libefa lacks efadv_get_max_sq_depth, "
                "needs 63)");
  if (o->inline_write && !(d->caps.device_caps & LEVER_EFA_CAP_RDMA_WRITE))
    return fail(err, err_len, EOPNOTSUPP, "inline writes: device lacks RDMA_WRITE");
  if ((o->send_cntr || o->rwrite_cntr) && !(d->caps.lib_features & LEVER_EFA_LIB_COMP_CNTR))
    return fail(err, err_len, EOPNOTSUPP,
                "completion counters: rdma-core too old (no efadv_create_comp_cntr / "
                "ibv_qp_attach_comp_cntr, needs a release after 64)");
  if ((o->send_cntr || o->rwrite_cntr) && !(d->caps.device_caps & LEVER_EFA_CAP_COMP_CNTR))
    return fail(err, err_len, EOPNOTSUPP, "completion counters: device lacks COMP_CNTR");
  if ((o->send_cntr || o->rwrite_cntr) && o->cntr_dmabuf_fd >= 0 && !o->cntr_gpu_buf)
    return fail(err, err_len, EINVAL, "completion counters in GPU memory: no cntr_gpu_buf");
  lever_efa_qp* q = new (std::nothrow) lever_efa_qp();
  if (!q) return fail(err, err_len, ENOMEM, "qp");
  q->dev = d;
  q->opt = *o;
  d->qps.push_back(q);  // from here on close_qp undoes whatever was made
  int rc = 0;
  q->cq = create_cq(d->ctx, o, &rc, err, err_len);
  if (!q->cq) goto fail_out;
  if ((rc = create_counters(q, err, err_len))) goto fail_out;
  q->qp = create_srd_qp(d->ctx, d->pd, ibv_cq_ex_to_cq(q->cq), d->caps.device_caps, o->sq_depth,
                        o->rq_depth, o->sl, o->unsolicited_write_recv != 0, &rc, err, err_len,
                        o->inline_write != 0);
  if (!q->qp) goto fail_out;
  // counters attach while the QP is still in RESET (ibv_qp_attach_comp_cntr: RESET or INIT)
  for (int i = 0; i < 2; ++i) {
    if (!q->cntr[i]) continue;
    lever_ibv_qp_attach_comp_cntr_attr at;
    memset(&at, 0, sizeof(at));
    at.op_mask = i == 0 ? LEVER_IBV_QP_ATTACH_COMP_CNTR_OP_RDMA_WRITE : LEVER_IBV_QP_ATTACH_COMP_CNTR_OP_REMOTE_RDMA_WRITE;
    if ((rc = q->nv.qp_attach_comp_cntr(q->qp, q->cntr[i], &at))) {
      fail(err, err_len, rc, "ibv_qp_attach_comp_cntr(%s)", i == 0 ? "RDMA_WRITE" : "REMOTE_RDMA_WRITE");
      goto fail_out;
    }
  }
  if ((rc = qp_to_rts(q->qp, d->opt.port, o->qkey, d->caps.device_caps, err, err_len))) goto fail_out;
  {
    efadv_wq_attr sq, rq;
    memset(&sq, 0, sizeof(sq));
    memset(&rq, 0, sizeof(rq));
    if ((rc = efadv_query_qp_wqs(q->qp, &sq, &rq, sizeof(sq)))) {
      fail(err, err_len, rc, "efadv_query_qp_wqs");
      goto fail_out;
    }
    if (o->inline_write && sq.entry_size != LEVER_EFA_WQE_SIZE_128) {
      rc = EPROTO;
      if (err && err_len)
        snprintf(err, err_len, "QP made with the inline-write flag reports %u-byte WQEs (want 128)", sq.entry_size);
      goto fail_out;
    }
    d->caps.max_tx_batch = sq.max_batch < sq.num_entries ? sq.max_batch : sq.num_entries;
  }
  *out = q;
  return 0;

fail_out:
  close_qp(q);
  return rc ? rc : EIO;
}

uint32_t lever_efa_qp_num(const lever_efa_qp* q) { return (q && q->qp) ? q->qp->qp_num : 0u; }

int lever_efa_qp_close(lever_efa_qp* q) { return q ? close_qp(q) : 0; }

int lever_efa_qp_fill_layout(lever_efa_qp* q, uint64_t peers_dev, uint32_t peers_mem, uint32_t flags,
                             lever_efa_nic_layout* l, char* err, size_t err_len) {
  if (!q || !q->qp || !q->cq) return fail(err, err_len, EINVAL, "fill_layout: QP not open");
  lever_efa_device* d = q->dev;
  efadv_wq_attr sq, rq;
  memset(&sq, 0, sizeof(sq));
  memset(&rq, 0, sizeof(rq));
  int rc = efadv_query_qp_wqs(q->qp, &sq, &rq, sizeof(sq));
  if (rc) return fail(err, err_len, rc, "efadv_query_qp_wqs");
  efadv_cq_attr ca;
  memset(&ca, 0, sizeof(ca));
  rc = efadv_query_cq(ibv_cq_ex_to_cq(q->cq), &ca, sizeof(ca));
  if (rc) return fail(err, err_len, rc, "efadv_query_cq");

  const bool gpu_cq = q->opt.cq_dmabuf_fd >= 0;
  const uint64_t sq_buf = (uint64_t)(uintptr_t)sq.buffer;
  const uint64_t sq_db = (uint64_t)(uintptr_t)sq.doorbell;
  const uint64_t cq_buf = (uint64_t)(uintptr_t)ca.buffer;
  if (!q->maps_done) {  // map once; the mappings live until the QP is closed
    q->maps_done = true;
    if (!(flags & LEVER_EFA_FILL_NO_SQ_MAP)) {
      q->sq_buffer_dev = d->map(q, sq_buf, (uint64_t)sq.num_entries * sq.entry_size,
                                LEVER_EFA_MEM_DEVICE_BAR);
      q->sq_doorbell_dev = d->map(q, sq_db, sizeof(uint32_t), LEVER_EFA_MEM_DEVICE_BAR);
    }
    if (gpu_cq) {
      q->cq_buffer_dev = cq_buf;  // the ring is the GPU memory given at creation
      q->cq_mem = LEVER_EFA_MEM_GPU;
    } else {
      q->cq_buffer_dev = d->map(q, cq_buf, (uint64_t)ca.num_entries * ca.entry_size, LEVER_EFA_MEM_HOST);
      q->cq_mem = q->cq_buffer_dev ? LEVER_EFA_MEM_HOST : LEVER_EFA_MEM_HOST_ONLY;
    }
    if (q->cntr_mem == LEVER_EFA_MEM_GPU) {
      q->cntr_dev = (uint64_t)(uintptr_t)q->opt.cntr_gpu_buf;
    } else if (q->cntr_mem == LEVER_EFA_MEM_HOST) {  // the GPU only reads the counts
      q->cntr_dev = d->map(q, (uint64_t)(uintptr_t)q->cntr_host, 32u, LEVER_EFA_MEM_HOST);
      if (!q->cntr_dev) q->cntr_mem = LEVER_EFA_MEM_HOST_ONLY;
    }
  }

  memset(l, 0, sizeof(*l));
  l->version = LEVER_EFA_NIC_LAYOUT_VERSION;
  l->qp_num = q->qp->qp_num;
  l->sq_buffer = sq_buf;
  l->sq_buffer_dev = q->sq_buffer_dev;
  l->sq_doorbell = sq_db;
  l->sq_doorbell_dev = q->sq_doorbell_dev;
  l->sq_entry_size = sq.entry_size;
  l->sq_num_entries = sq.num_entries;
  // v59 reports UINT16_MAX when the device sets no max_tx_batch: the ring bounds it
  l->sq_max_batch = sq.max_batch < sq.num_entries ? sq.max_batch : sq.num_entries;
  l->sq_buffer_mem = LEVER_EFA_MEM_DEVICE_BAR;
  l->sq_doorbell_mem = LEVER_EFA_MEM_DEVICE_BAR;
  l->sq_phase_first = LEVER_EFA_SQ_PHASE_FIRST_LAP;
  l->cq_buffer = gpu_cq ? 0 : cq_buf;
  l->cq_buffer_dev = q->cq_buffer_dev;
  l->cq_doorbell = 0;  // efadv_cq_attr of v59 has no doorbell; polling never arms
  l->cq_entry_size = ca.entry_size;
  l->cq_num_entries = ca.num_entries;
  l->cq_buffer_mem = q->cq_mem;
  l->cq_phase_first = LEVER_EFA_CQ_PHASE_FIRST_LAP;
  l->qkey = q->opt.qkey;
  l->lkey = d->mr ? d->mr->lkey : 0;
  l->local_addr = (uint64_t)(uintptr_t)d->opt.buf;
  l->inline_buf_size = d->caps.inline_buf_size;
  l->max_rdma_size = d->caps.max_rdma_size;
  l->device_caps = d->caps.device_caps;
  l->num_peers = (uint32_t)d->peers.size();
  l->peers = peers_dev;
  l->peers_mem = peers_mem;
  // v63: a QP made with the inline-write flag has 128-byte WQEs; its RDMA writes may carry as
  // many payload bytes inline as the device's inline size allows, at most the 80 beside the
  // descriptor (the extended size where the library reports it)
  if (q->opt.inline_write && sq.entry_size == LEVER_EFA_WQE_SIZE_128) {
    const uint32_t dev_inl = d->caps.inline_buf_size_ex ? d->caps.inline_buf_size_ex : d->caps.inline_buf_size;
    l->inline_write_size = dev_inl < LEVER_EFA_INLINE_WRITE_MAX_128 ? dev_inl : LEVER_EFA_INLINE_WRITE_MAX_128;
  }
  // counters: the GPU reads the counts where they live (dma-buf GPU memory, or our host page
  // mapped for it); a host page the GPU can not map leaves the credit to the CQ
  if (q->cntr_dev) {
    l->cntr_mem = q->cntr_mem;
    const uint64_t host = q->cntr_mem == LEVER_EFA_MEM_HOST ? (uint64_t)(uintptr_t)q->cntr_host : 0u;
    if (q->cntr[0]) {
      l->send_cntr = host;
      l->send_cntr_dev = q->cntr_dev;
      l->send_err_cntr_dev = q->cntr_dev + 8u;
    }
    if (q->cntr[1]) {
      l->rwrite_cntr = host ? host + 16u : 0u;
      l->rwrite_cntr_dev = q->cntr_dev + 16u;
    }
  }
  const char* why = lever_efa_layout_problem(l);
  if (why) {
    if (err && err_len) snprintf(err, err_len, "efadv query gave an unusable layout: %s", why);
    return EINVAL;
  }
  return 0;
}

}  // extern "C"
