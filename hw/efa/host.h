// Host setup of one EFA SRD endpoint for GPU-initiated posting (hw/efa/host.cpp).
//
// Why: the kernels need a real QP's LLQ, doorbell, CQ ring and keys in a
// lever_efa_nic_layout (nic_layout.h). This code makes them with rdma-core v59
// (ibv_* and efadv_*), fills the layout from efadv_query_qp_wqs / efadv_query_cq /
// efadv_query_ah, and tears everything down in reverse order on every exit path.
//
// Plain C++17, no CUDA and no torch: the GPU mapping (cudaHostRegister with
// cudaHostRegisterIoMemory for the BAR, cudaHostRegisterMapped for the host CQ)
// is a callback the CUDA-side binding supplies, so this file builds and links with
// only libibverbs and libefa. Users of this header need no rdma-core headers.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "nic_layout.h"

extern "C" {

// efadv_device_attr.device_caps bits (EFADV_DEVICE_ATTR_CAPS_*, rdma-core v59);
// host.cpp asserts they equal the provider's.
#define LEVER_EFA_CAP_RDMA_READ (1u << 0)
#define LEVER_EFA_CAP_RNR_RETRY (1u << 1)
#define LEVER_EFA_CAP_CQ_WITH_SGID (1u << 2)
#define LEVER_EFA_CAP_RDMA_WRITE (1u << 3)
#define LEVER_EFA_CAP_UNSOLICITED_WRITE_RECV (1u << 4)
#define LEVER_EFA_CAP_CQ_WITH_EXT_MEM_DMABUF (1u << 5)

// What one EFA device can do.
typedef struct lever_efa_caps {
  char device_name[64];   // ibv_get_device_name
  uint64_t node_guid;     // ibv_device_attr.node_guid
  uint8_t gid[16];        // ibv_query_gid(port, 0): the device's network address
  // efadv_query_device
  uint32_t max_sq_wr;
  uint32_t max_rq_wr;
  uint16_t max_sq_sge;
  uint16_t max_rq_sge;
  uint16_t inline_buf_size;
  uint16_t reserved0;
  uint32_t device_caps;   // LEVER_EFA_CAP_*
  uint32_t max_rdma_size; // bytes
  // ibv_query_device
  uint32_t max_qp;
  uint32_t max_cq;
  uint32_t max_cqe;
  uint32_t max_mr;
  uint32_t max_pd;
  uint32_t max_ah;
  uint64_t max_mr_size;
  // ibv_query_port
  uint32_t port_state;    // enum ibv_port_state (4: active)
  uint32_t active_mtu;    // enum ibv_mtu
  uint32_t max_msg_sz;    // SEND limit; RDMA is limited by max_rdma_size
  // The device's max_tx_batch is not in efadv_device_attr: it is read back as
  // efadv_wq_attr.max_batch of a probe QP (WQEs per doorbell); 0 when not probed.
  uint32_t max_tx_batch;
} lever_efa_caps;

// Maps host memory (page-aligned range) for the GPU. kind is LEVER_EFA_MEM_DEVICE_BAR
// (the binding calls cudaHostRegister(ptr, len, cudaHostRegisterMapped |
// cudaHostRegisterIoMemory)) or LEVER_EFA_MEM_HOST (cudaHostRegisterMapped |
// cudaHostRegisterReadOnly); it returns 0 and the GPU address, or non-zero when the
// GPU can not map it. unmap undoes one successful map (cudaHostUnregister).
typedef struct lever_efa_gpu_mapper {
  int (*map)(void* user, void* host_ptr, size_t len, uint32_t kind, uint64_t* dev_ptr);
  void (*unmap)(void* user, void* host_ptr);
  void* user;
} lever_efa_gpu_mapper;

typedef struct lever_efa_endpoint_options {
  const char* device_name; // null: the first device of the EFA provider
  uint8_t port;            // 1 on EFA
  uint8_t sl;              // SRD service level
  uint8_t unsolicited_write_recv;  // write-with-imm without posted receives (device cap)
  uint8_t reserved0;
  uint32_t sq_depth;       // max_send_wr asked for (the provider rounds up to a power of two)
  uint32_t rq_depth;       // max_recv_wr
  uint32_t cq_depth;       // CQ entries asked for
  uint32_t qkey;
  // The local window the WQEs read from / peers write to. dmabuf_fd >= 0 registers it
  // with ibv_reg_dmabuf_mr (GPU memory exported as dma-buf); else, or when that fails,
  // ibv_reg_mr (GPU memory then needs nvidia_peermem).
  void* buf;
  size_t len;
  int dmabuf_fd;
  uint64_t dmabuf_offset;
  // A CQ ring in GPU memory (dma-buf, EFADV_CQ_INIT_FLAGS_EXT_MEM_DMABUF): cq_dmabuf_fd
  // >= 0 and cq_gpu_buf its GPU address. Else the provider's host ring is used.
  int cq_dmabuf_fd;
  uint64_t cq_dmabuf_offset;
  uint64_t cq_dmabuf_len;
  void* cq_gpu_buf;
  lever_efa_gpu_mapper mapper;  // map == null: nothing is mapped (*_dev stay 0)
} lever_efa_endpoint_options;

// Defaults: first EFA device, port 1, SQ 1024, RQ 128, CQ 4096, qkey 0x11111111.
void lever_efa_endpoint_options_init(lever_efa_endpoint_options* o);

// Fills caps for the named device (null: the first EFA device). 0 or an errno value;
// err (may be null) receives a one-line message.
int lever_efa_query_caps(const char* device_name, uint8_t port, lever_efa_caps* caps, char* err,
                         size_t err_len);

typedef struct lever_efa_endpoint lever_efa_endpoint;

// Creates context, PD, MR, CQ, SRD QP (INIT -> RTR -> RTS). On failure *out is null
// and everything made so far is destroyed.
int lever_efa_endpoint_open(const lever_efa_endpoint_options* o, lever_efa_endpoint** out,
                            char* err, size_t err_len);
// An address handle for a peer (its GID, QPN, qkey and window), appended to the peer
// table; *index receives its position (the index the kernels use).
int lever_efa_endpoint_add_peer(lever_efa_endpoint* ep, const uint8_t gid[16], uint32_t qpn,
                                uint32_t qkey, uint32_t rkey, uint64_t remote_addr,
                                uint32_t* index, char* err, size_t err_len);
// The local QPN, qkey, window rkey (what peers need), and the device's GID.
int lever_efa_endpoint_local(const lever_efa_endpoint* ep, uint32_t* qpn, uint32_t* qkey,
                             uint32_t* rkey, uint64_t* addr, uint8_t gid[16]);
// Queries the SQ/CQ and fills the layout; maps the LLQ, doorbell and CQ for the GPU
// through the mapper (once). peers_dev / peers_mem: where the caller put the peer table
// (lever_efa_endpoint_peers) for the GPU.
int lever_efa_endpoint_fill_layout(lever_efa_endpoint* ep, uint64_t peers_dev, uint32_t peers_mem,
                                   lever_efa_nic_layout* layout, char* err, size_t err_len);
// The peer table (host memory, num entries) to copy where the GPU reads it.
const lever_efa_peer* lever_efa_endpoint_peers(const lever_efa_endpoint* ep, uint32_t* num);
// Unmaps and destroys in reverse order of creation; null is ignored. Returns the first
// non-zero rc of a destroy call (teardown continues past it).
int lever_efa_endpoint_close(lever_efa_endpoint* ep);

}  // extern "C"
