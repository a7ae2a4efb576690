// Thin Python binding of the EFA host setup (host.cpp) and the EFA extension's kernels
// (efa_kernels.cu): the module lever_hw_efa that hw/efa/wire.py, ep_run.py and prims.py
// drive on a machine with an EFA device.
//
// Why here and not in hw/ep/binding.cpp: the EP binding stays NIC-agnostic (it takes NIC
// tables as bytes from whoever filled them); everything that needs libibverbs/libefa
// lives in this module, built against rdma-core v59's headers (hw/efa/rdma_core.py) and
// linked with the machine's libibverbs.so.1 / libefa.so.1. What it adds to host.cpp is
// CUDA: the GPU mapping of the LLQ, doorbell and host CQ (cudaHostRegister with
// cudaHostRegisterIoMemory for the BAR pages; reference-counted, since a page can hold
// more than one queue's registers), the dma-buf export of GPU memory for the MR
// (cuMemGetHandleForAddressRange, looked up in libcuda at run time) and the kernel
// launches; torch allocates every GPU buffer. pybind11 only, no torch headers.
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "efa_kernels.h"
#include "host.h"

namespace py = pybind11;

namespace {

// ------------------------------------------------------------------ GPU mapping
// cudaHostRegister of page ranges, counted: the same page registered twice is one
// registration (cudaErrorHostMemoryAlreadyRegistered otherwise), undone by its last unmap.
struct Mapper {
  struct Reg {
    uint64_t dev;
    size_t len;
    int refs;
    unsigned flags;
  };
  std::map<void*, Reg> regs;
  std::string last_error;

  static int map_cb(void* user, void* host, size_t len, uint32_t kind, uint64_t* dev) {
    return static_cast<Mapper*>(user)->map(host, len, kind, dev);
  }
  static void unmap_cb(void* user, void* host) { static_cast<Mapper*>(user)->unmap(host); }

  int map(void* host, size_t len, uint32_t kind, uint64_t* dev) {
    auto it = regs.find(host);
    if (it != regs.end() && it->second.len >= len) {
      ++it->second.refs;
      *dev = it->second.dev;
      return 0;
    }
    // BAR pages (LLQ, doorbell): I/O memory, written by the GPU. Host CQ: the provider's
    // ring is an mmap of the uverbs fd (no struct page behind it on some kernels), so a
    // plain registration may be refused: then as I/O memory too. Read-only either way.
    std::vector<unsigned> tries;
    if (kind == LEVER_EFA_MEM_DEVICE_BAR) {
      tries = {cudaHostRegisterMapped | cudaHostRegisterIoMemory};
    } else {
      tries = {cudaHostRegisterMapped | cudaHostRegisterReadOnly,
               cudaHostRegisterMapped | cudaHostRegisterIoMemory | cudaHostRegisterReadOnly,
               cudaHostRegisterMapped | cudaHostRegisterIoMemory};
    }
    cudaError_t e = cudaErrorUnknown;
    unsigned used = 0;
    for (unsigned fl : tries) {
      e = cudaHostRegister(host, len, fl);
      if (e == cudaSuccess) {
        used = fl;
        break;
      }
      cudaGetLastError();
    }
    if (e != cudaSuccess) {
      last_error = std::string("cudaHostRegister(") + (kind == LEVER_EFA_MEM_DEVICE_BAR ? "BAR" : "host CQ") +
                   "): " + cudaGetErrorString(e);
      return 1;
    }
    void* d = nullptr;
    e = cudaHostGetDevicePointer(&d, host, 0);
    if (e != cudaSuccess || !d) {
      cudaHostUnregister(host);
      cudaGetLastError();
      last_error = std::string("cudaHostGetDevicePointer: ") + cudaGetErrorString(e);
      return 1;
    }
    regs[host] = Reg{(uint64_t)(uintptr_t)d, len, 1, used};
    *dev = (uint64_t)(uintptr_t)d;
    return 0;
  }
  void unmap(void* host) {
    auto it = regs.find(host);
    if (it == regs.end()) return;
    if (--it->second.refs == 0) {
      cudaHostUnregister(host);
      cudaGetLastError();
      regs.erase(it);
    }
  }
};

// ------------------------------------------------------------------ dma-buf
// A dma-buf fd for GPU memory [ptr, ptr + len) (both page-aligned), or -1 and why.
typedef CUresult (*GetHandleFn)(void*, CUdeviceptr, size_t, CUmemRangeHandleType, unsigned long long);

int dmabuf_fd(uint64_t ptr, size_t len, std::string* why) {
  static GetHandleFn fn = nullptr;
  static bool looked = false;
  if (!looked) {
    looked = true;
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) h = dlopen("libcuda.so.1", RTLD_NOW);
    if (h) fn = reinterpret_cast<GetHandleFn>(dlsym(h, "cuMemGetHandleForAddressRange"));
  }
  if (!fn) {
    *why = "cuMemGetHandleForAddressRange not in libcuda (driver too old for dma-buf)";
    return -1;
  }
  const uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
  if ((ptr % pg) || (len % pg)) {
    *why = "window not page-aligned";
    return -1;
  }
  int fd = -1;
  CUresult r = fn(&fd, (CUdeviceptr)ptr, len, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  if (r != CUDA_SUCCESS || fd < 0) {
    *why = "cuMemGetHandleForAddressRange(DMA_BUF_FD) failed with CUresult " + std::to_string((int)r);
    return -1;
  }
  return fd;
}

py::dict caps_dict(const lever_efa_caps& c) {
  py::dict d;
  d["device_name"] = std::string(c.device_name);
  d["node_guid"] = c.node_guid;
  d["gid"] = py::bytes(reinterpret_cast<const char*>(c.gid), 16);
  d["max_sq_wr"] = c.max_sq_wr;
  d["max_rq_wr"] = c.max_rq_wr;
  d["max_sq_sge"] = c.max_sq_sge;
  d["max_rq_sge"] = c.max_rq_sge;
  d["inline_buf_size"] = c.inline_buf_size;
  d["inline_buf_size_ex"] = c.inline_buf_size_ex;
  d["device_caps"] = c.device_caps;
  d["max_rdma_size"] = c.max_rdma_size;
  d["max_qp"] = c.max_qp;
  d["max_cq"] = c.max_cq;
  d["max_cqe"] = c.max_cqe;
  d["max_mr"] = c.max_mr;
  d["max_pd"] = c.max_pd;
  d["max_ah"] = c.max_ah;
  d["max_mr_size"] = c.max_mr_size;
  d["port_state"] = c.port_state;
  d["active_mtu"] = c.active_mtu;
  d["max_msg_sz"] = c.max_msg_sz;
  d["max_tx_batch"] = c.max_tx_batch;
  py::dict names;
  names["rdma_read"] = (c.device_caps & LEVER_EFA_CAP_RDMA_READ) != 0;
  names["rnr_retry"] = (c.device_caps & LEVER_EFA_CAP_RNR_RETRY) != 0;
  names["cq_with_sgid"] = (c.device_caps & LEVER_EFA_CAP_CQ_WITH_SGID) != 0;
  names["rdma_write"] = (c.device_caps & LEVER_EFA_CAP_RDMA_WRITE) != 0;
  names["unsolicited_write_recv"] = (c.device_caps & LEVER_EFA_CAP_UNSOLICITED_WRITE_RECV) != 0;
  names["cq_with_ext_mem_dmabuf"] = (c.device_caps & LEVER_EFA_CAP_CQ_WITH_EXT_MEM_DMABUF) != 0;
  names["comp_cntr"] = (c.device_caps & LEVER_EFA_CAP_COMP_CNTR) != 0;
  d["caps"] = names;
  py::dict lib;  // what the loaded rdma-core exports beyond v59
  lib["wqe128_inline_write"] = (c.lib_features & LEVER_EFA_LIB_WQE128) != 0;
  lib["comp_cntr"] = (c.lib_features & LEVER_EFA_LIB_COMP_CNTR) != 0;
  d["lib_features"] = lib;
  return d;
}

py::dict query_caps(const std::string& name, int port) {
  lever_efa_caps c;
  char err[256] = "";
  int rc = lever_efa_query_caps(name.empty() ? nullptr : name.c_str(), (uint8_t)port, &c, err, sizeof err);
  if (rc) throw std::runtime_error(err);
  return caps_dict(c);
}

// ------------------------------------------------------------------ the device
class Device {
 public:
  Device(const std::string& name, int port, uint64_t window, uint64_t len, bool dmabuf, int gpu)
      : gpu_(gpu) {
    cudaSetDevice(gpu);
    lever_efa_device_options o;
    lever_efa_device_options_init(&o);
    o.device_name = name.empty() ? nullptr : name.c_str();
    o.port = (uint8_t)port;
    o.buf = reinterpret_cast<void*>(window);
    o.len = (size_t)len;
    o.mapper.map = &Mapper::map_cb;
    o.mapper.unmap = &Mapper::unmap_cb;
    o.mapper.user = &mapper_;
    int fd = -1;
    if (dmabuf) {
      fd = dmabuf_fd(window, (size_t)len, &dmabuf_why_);
      o.dmabuf_fd = fd;
      o.dmabuf_offset = 0;
    } else {
      dmabuf_why_ = "not asked for";
    }
    char err[256] = "";
    int rc = lever_efa_device_open(&o, &dev_, err, sizeof err);
    if (fd >= 0) close(fd);  // the MR holds its own reference to the dma-buf
    if (rc) throw std::runtime_error(err);
  }
  ~Device() { close_all(); }

  py::dict caps() const {
    py::dict d = caps_dict(*lever_efa_device_caps(live()));
    d["mr"] = lever_efa_device_mr_dmabuf(dev_) ? std::string("dma-buf")
                                               : std::string("ibv_reg_mr (dma-buf: ") + dmabuf_why_ + ")";
    return d;
  }
  py::dict local() const {
    uint32_t lkey = 0, rkey = 0;
    uint64_t addr = 0;
    uint8_t gid[16];
    if (lever_efa_device_local(live(), &lkey, &rkey, &addr, gid)) throw std::runtime_error("device_local");
    py::dict d;
    d["lkey"] = lkey;
    d["rkey"] = rkey;
    d["addr"] = addr;
    d["gid"] = py::bytes(reinterpret_cast<const char*>(gid), 16);
    return d;
  }
  int open_qp(uint32_t sq_depth, uint32_t rq_depth, uint32_t cq_depth, uint32_t qkey, bool unsolicited,
              uint64_t cq_gpu, uint64_t cq_gpu_len, bool inline_write, bool send_cntr, bool rwrite_cntr,
              uint64_t cntr_gpu, uint64_t cntr_gpu_len) {
    cudaSetDevice(gpu_);
    lever_efa_qp_options o;
    lever_efa_qp_options_init(&o);
    o.sq_depth = sq_depth;
    o.rq_depth = rq_depth ? rq_depth : 1;
    o.cq_depth = cq_depth;
    o.qkey = qkey;
    o.unsolicited_write_recv = unsolicited ? 1 : 0;
    int fd = -1;
    if (cq_gpu) {
      std::string why;
      fd = dmabuf_fd(cq_gpu, (size_t)cq_gpu_len, &why);
      if (fd < 0) throw std::runtime_error("CQ in GPU memory: " + why);
      o.cq_dmabuf_fd = fd;
      o.cq_gpu_buf = reinterpret_cast<void*>(cq_gpu);
      o.cq_dmabuf_len = cq_gpu_len;
    }
    // v63: 128-byte WQEs with inline writes; after v64: completion counters (host page, or the
    // 32 bytes at cntr_gpu exported as dma-buf: the GPU then reads its own memory)
    o.inline_write = inline_write ? 1 : 0;
    o.send_cntr = send_cntr ? 1 : 0;
    o.rwrite_cntr = rwrite_cntr ? 1 : 0;
    int cfd = -1;
    if (cntr_gpu && (send_cntr || rwrite_cntr)) {
      std::string why;
      cfd = dmabuf_fd(cntr_gpu, (size_t)cntr_gpu_len, &why);
      if (cfd < 0) {
        if (fd >= 0) close(fd);
        throw std::runtime_error("completion counters in GPU memory: " + why);
      }
      o.cntr_dmabuf_fd = cfd;
      o.cntr_gpu_buf = reinterpret_cast<void*>(cntr_gpu);
    }
    lever_efa_qp* q = nullptr;
    char err[256] = "";
    int rc = lever_efa_qp_open(live(), &o, &q, err, sizeof err);
    if (fd >= 0) close(fd);
    if (cfd >= 0) close(cfd);
    if (rc) throw std::runtime_error(err);
    qps_.push_back(q);
    return (int)qps_.size() - 1;
  }
  uint32_t qp_num(int h) const { return lever_efa_qp_num(qp(h)); }
  // Closes one QP (its mappings, the QP, its CQ); its handle is then invalid.
  int close_qp(int h) {
    cudaSetDevice(gpu_);
    lever_efa_qp* q = qp(h);
    qps_[(size_t)h] = nullptr;
    return lever_efa_qp_close(q);
  }
  uint32_t add_peer(const py::bytes& gid, uint32_t qpn, uint32_t qkey, uint32_t rkey, uint64_t addr) {
    const std::string g = gid;
    if (g.size() != 16) throw std::runtime_error("add_peer: a GID is 16 bytes");
    uint32_t idx = 0;
    char err[256] = "";
    if (lever_efa_device_add_peer(live(), reinterpret_cast<const uint8_t*>(g.data()), qpn, qkey, rkey, addr,
                                  &idx, err, sizeof err))
      throw std::runtime_error(err);
    return idx;
  }
  uint32_t num_ahs() const { return lever_efa_device_num_ahs(live()); }
  py::bytes peers() const {
    uint32_t n = 0;
    const lever_efa_peer* p = lever_efa_device_peers(live(), &n);
    return py::bytes(reinterpret_cast<const char*>(p), (size_t)n * sizeof(lever_efa_peer));
  }
  py::bytes fill_layout(int h, uint32_t flags) {
    cudaSetDevice(gpu_);
    lever_efa_nic_layout l;
    char err[256] = "";
    if (lever_efa_qp_fill_layout(qp(h), 0, LEVER_EFA_MEM_GPU, flags, &l, err, sizeof err)) {
      std::string m = err;
      if (!mapper_.last_error.empty()) m += " (" + mapper_.last_error + ")";
      throw std::runtime_error(m);
    }
    return py::bytes(reinterpret_cast<const char*>(&l), sizeof l);
  }
  std::string map_error() const { return mapper_.last_error; }
  int mapped_ranges() const { return (int)mapper_.regs.size(); }
  // Reverse order of creation (host.cpp: mappings, AHs, QPs, MR, PD, context). Idempotent;
  // the window (torch memory) must outlive this call.
  int close_all() {
    int rc = 0;
    if (dev_) {
      cudaSetDevice(gpu_);
      rc = lever_efa_device_close(dev_);
      dev_ = nullptr;
      qps_.clear();
    }
    return rc;
  }

 private:
  lever_efa_device* live() const {
    if (!dev_) throw std::runtime_error("EFA device already closed");
    return dev_;
  }
  lever_efa_qp* qp(int h) const {
    live();
    if (h < 0 || (size_t)h >= qps_.size() || !qps_[(size_t)h]) throw std::runtime_error("no such QP handle");
    return qps_[(size_t)h];
  }
  int gpu_;
  lever_efa_device* dev_ = nullptr;
  std::vector<lever_efa_qp*> qps_;
  Mapper mapper_;
  std::string dmabuf_why_;
};

uint64_t need(const std::map<std::string, uint64_t>& m, const char* k) {
  auto it = m.find(k);
  if (it == m.end()) throw std::runtime_error(std::string("missing key: ") + k);
  return it->second;
}
template <class T>
T* dptr(const std::map<std::string, uint64_t>& m, const char* k) {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(need(m, k)));
}

// ------------------------------------------------------------------ kernels
// c: lay, peers, st, words, src, err (device addresses), words_off, rank, ranks, nrx, timeout_ns
int barrier_launch(const std::map<std::string, uint64_t>& c, uint64_t seq, int64_t stream) {
  efa_gpu::Barrier b{};
  b.lay = dptr<const lever_efa_nic_layout>(c, "lay");
  b.peers = dptr<const lever_efa_peer>(c, "peers");
  b.st = dptr<efa_gpu::QpState>(c, "st");
  b.words = dptr<unsigned long long>(c, "words");
  b.src = dptr<unsigned long long>(c, "src");
  b.err = dptr<uint32_t>(c, "err");
  b.words_off = need(c, "words_off");
  b.rank = (int)need(c, "rank");
  b.ranks = (int)need(c, "ranks");
  b.nrx = (int)need(c, "nrx");
  b.timeout_ns = (long long)need(c, "timeout_ns");
  return efa_host::launch_barrier(b, seq, reinterpret_cast<void*>(stream));
}

// c: sq, rx, peer, st, ping, src, out, err (device), ping_remote, scratch_remote, initiator,
// reps, inner, timeout_ns
int prim_launch(const std::map<std::string, uint64_t>& c, int family, int64_t stream) {
  efa_gpu::Prim p{};
  p.sq = dptr<const lever_efa_nic_layout>(c, "sq");
  p.rx = dptr<const lever_efa_nic_layout>(c, "rx");
  p.peer = dptr<const lever_efa_peer>(c, "peer");
  p.st = dptr<efa_gpu::QpState>(c, "st");
  p.ping = dptr<unsigned long long>(c, "ping");
  p.src = dptr<unsigned long long>(c, "src");
  p.out = dptr<unsigned long long>(c, "out");
  p.err = dptr<uint32_t>(c, "err");
  p.ping_remote = need(c, "ping_remote");
  p.scratch_remote = need(c, "scratch_remote");
  p.initiator = (int)need(c, "initiator");
  p.reps = (int)need(c, "reps");
  p.inner = (int)need(c, "inner");
  p.timeout_ns = (long long)need(c, "timeout_ns");
  return efa_host::launch_prim(p, family, reinterpret_cast<void*>(stream));
}

std::map<std::string, int64_t> sizes() {
  return {{"nic_layout", sizeof(lever_efa_nic_layout)}, {"peer", sizeof(lever_efa_peer)},
          {"qp_state", sizeof(efa_gpu::QpState)}, {"err_words", efa_gpu::ERR_WORDS},
          {"families", efa_gpu::F_NUM}, {"fill_no_sq_map", LEVER_EFA_FILL_NO_SQ_MAP}};
}
std::string err_string(int e) { return cudaGetErrorString((cudaError_t)e); }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("query_caps", &query_caps, py::arg("device") = "", py::arg("port") = 1);
  py::class_<Device>(m, "Device")
      .def(py::init<const std::string&, int, uint64_t, uint64_t, bool, int>(), py::arg("device"),
           py::arg("port"), py::arg("window"), py::arg("length"), py::arg("dmabuf"), py::arg("gpu"))
      .def("caps", &Device::caps)
      .def("local", &Device::local)
      .def("open_qp", &Device::open_qp, py::arg("sq_depth"), py::arg("rq_depth"), py::arg("cq_depth"),
           py::arg("qkey"), py::arg("unsolicited"), py::arg("cq_gpu") = 0, py::arg("cq_gpu_len") = 0,
           py::arg("inline_write") = false, py::arg("send_cntr") = false, py::arg("rwrite_cntr") = false,
           py::arg("cntr_gpu") = 0, py::arg("cntr_gpu_len") = 0)
      .def("qp_num", &Device::qp_num)
      .def("close_qp", &Device::close_qp)
      .def("add_peer", &Device::add_peer)
      .def("num_ahs", &Device::num_ahs)
      .def("peers", &Device::peers)
      .def("fill_layout", &Device::fill_layout)
      .def("map_error", &Device::map_error)
      .def("mapped_ranges", &Device::mapped_ranges)
      .def("close", &Device::close_all);
  m.def("barrier_launch", &barrier_launch);
  m.def("prim_launch", &prim_launch);
  m.def("sizes", &sizes);
  m.def("err_string", &err_string);
}
