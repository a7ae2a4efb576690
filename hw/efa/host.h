// Host setup of a rank's EFA SRD queue pairs for GPU-initiated posting (hw/efa/host.cpp).
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
// after rdma-core v64 (hw/efa/newer_verbs.h; the v59 headers lack it)
#define LEVER_EFA_CAP_COMP_CNTR (1u << 6)

// What the loaded rdma-core library can do beyond v59 (lever_efa_caps.lib_features): found at
// run time by the entry points it exports, so one build serves every release.
#define LEVER_EFA_LIB_WQE128 (1u << 0)     // v63+: 128-byte WQEs, inline writes (efadv_get_max_sq_depth)
#define LEVER_EFA_LIB_COMP_CNTR (1u << 1)  // after v64: efadv_create_comp_cntr, ibv_qp_attach_comp_cntr

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
  uint16_t inline_buf_size_ex;  // v63+: the inline size that counts (0 from an older library)
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
  uint32_t lib_features;  // LEVER_EFA_LIB_*: what the loaded libibverbs/libefa export
  uint32_t reserved1;
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

// One EFA device as one rank uses it: context, protection domain, the registered window
// every WQE reads from and every peer writes to, the address handles of the peers and the
// peer table the kernels index. Every QP of the rank on this device shares them, so one AH
// number per peer GID serves those QPs (an AH belongs to a PD) and one lkey/rkey covers
// every buffer. A rank striped over several devices opens one of these per device (each
// registers the same window: its own lkey/rkey, its own AHs and peer table; hw/efa/wire.py).
typedef struct lever_efa_device_options {
  const char* device_name; // null: the first device of the EFA provider
  uint8_t port;            // 1 on EFA
  uint8_t reserved0[3];
  // The window. dmabuf_fd >= 0 registers it with ibv_reg_dmabuf_mr (GPU memory exported as
  // dma-buf, iova = buf); else, or when that fails, ibv_reg_mr (GPU memory then needs
  // nvidia_peermem). The kernels address peers' buffers by their virtual addresses, so the
  // MR's iova is the window's address.
  void* buf;
  size_t len;
  int dmabuf_fd;
  uint64_t dmabuf_offset;
  lever_efa_gpu_mapper mapper;  // map == null: nothing is mapped (*_dev stay 0)
} lever_efa_device_options;

// One SRD QP with its own CQ (send and receive completions of this QP only), on a device.
typedef struct lever_efa_qp_options {
  uint32_t sq_depth;       // max_send_wr asked for (the provider rounds up to a power of two)
  uint32_t rq_depth;       // max_recv_wr
  uint32_t cq_depth;       // CQ entries asked for
  uint32_t qkey;
  uint8_t sl;              // SRD service level
  uint8_t unsolicited_write_recv;  // write-with-imm without posted receives (device cap)
  // 128-byte WQEs whose RDMA writes may carry their payload inline (rdma-core v63+, the
  // device's RDMA write): the QP is made with the inline-write flag; refused on an older library
  uint8_t inline_write;
  // completion counters (rdma-core after v64, device cap COMP_CNTR), created on this QP's
  // counter memory below and attached before the QP leaves RESET: send_cntr counts its RDMA
  // writes' completions (the kernels' credit), rwrite_cntr remote RDMA writes into it
  uint8_t send_cntr;
  uint8_t rwrite_cntr;
  uint8_t reserved0[3];
  // Counter memory: 32 bytes (send count, send errors, remote-write count, remote-write errors,
  // u64 each). cntr_dmabuf_fd >= 0: GPU memory at cntr_gpu_buf, exported as dma-buf (the GPU
  // reads its own memory); else a host page of host.cpp's, mapped for the GPU by the mapper.
  int cntr_dmabuf_fd;
  uint64_t cntr_dmabuf_offset;
  void* cntr_gpu_buf;
  // A CQ ring in GPU memory (dma-buf, EFADV_CQ_INIT_FLAGS_EXT_MEM_DMABUF): cq_dmabuf_fd
  // >= 0 and cq_gpu_buf its GPU address. Else the provider's host ring is used.
  int cq_dmabuf_fd;
  uint64_t cq_dmabuf_offset;
  uint64_t cq_dmabuf_len;
  void* cq_gpu_buf;
} lever_efa_qp_options;

// fill_layout flags
#define LEVER_EFA_FILL_NO_SQ_MAP 1u  // a receive-only QP: its SQ is never posted, not mapped

// Defaults: first EFA device, port 1, no window.
void lever_efa_device_options_init(lever_efa_device_options* o);
// Defaults: SQ 1024, RQ 128, CQ 4096, qkey 0x11111111, host CQ, 64-byte WQEs, no counters.
void lever_efa_qp_options_init(lever_efa_qp_options* o);

// Fills caps for the named device (null: the first EFA device). 0 or an errno value;
// err (may be null) receives a one-line message.
int lever_efa_query_caps(const char* device_name, uint8_t port, lever_efa_caps* caps, char* err,
                         size_t err_len);

typedef struct lever_efa_device lever_efa_device;
typedef struct lever_efa_qp lever_efa_qp;

// Opens the device, queries its caps, allocates the PD and registers the window. On
// failure *out is null and everything made so far is destroyed.
int lever_efa_device_open(const lever_efa_device_options* o, lever_efa_device** out, char* err,
                          size_t err_len);
const lever_efa_caps* lever_efa_device_caps(const lever_efa_device* dev);
// What peers need of this device: the window's lkey/rkey and address, the port's GID.
int lever_efa_device_local(const lever_efa_device* dev, uint32_t* lkey, uint32_t* rkey,
                           uint64_t* addr, uint8_t gid[16]);
// A peer queue (its device's GID, its QP's number and qkey, its window) appended to the
// peer table; the AH for that GID is made once per device and shared by later entries.
// *index receives the entry's position (the index the kernels use).
int lever_efa_device_add_peer(lever_efa_device* dev, const uint8_t gid[16], uint32_t qpn,
                              uint32_t qkey, uint32_t rkey, uint64_t remote_addr, uint32_t* index,
                              char* err, size_t err_len);
// The peer table (host memory, num entries) to copy where the GPU reads it.
const lever_efa_peer* lever_efa_device_peers(const lever_efa_device* dev, uint32_t* num);
// Address handles made so far (one per distinct peer GID).
uint32_t lever_efa_device_num_ahs(const lever_efa_device* dev);
// 1 when the window was registered by dma-buf (ibv_reg_dmabuf_mr), 0 by ibv_reg_mr.
int lever_efa_device_mr_dmabuf(const lever_efa_device* dev);

// Creates the CQ and the SRD QP (INIT -> RTR -> RTS) on dev. On failure *out is null and
// what was made for it is destroyed; the device stays open.
int lever_efa_qp_open(lever_efa_device* dev, const lever_efa_qp_options* o, lever_efa_qp** out,
                      char* err, size_t err_len);
uint32_t lever_efa_qp_num(const lever_efa_qp* qp);
// Queries the SQ/CQ and fills the layout (num_peers: the device's peer table so far); maps
// the LLQ, doorbell and CQ for the GPU through the device's mapper, once per QP. peers_dev
// / peers_mem: where the caller put the peer table for the GPU (0: the caller fills it in).
int lever_efa_qp_fill_layout(lever_efa_qp* qp, uint64_t peers_dev, uint32_t peers_mem,
                             uint32_t flags, lever_efa_nic_layout* layout, char* err,
                             size_t err_len);
// Unmaps its GPU mappings, destroys the QP, then its CQ. Returns the first non-zero rc of a
// destroy call (teardown continues past it). null is ignored.
int lever_efa_qp_close(lever_efa_qp* qp);
// Tears down in reverse order of how a rank builds (QPs, AHs, GPU mappings): every GPU
// mapping (newest QP first), the AHs (newest first), every QP still open with its CQ (newest
// first), the MR, the PD, the context. null is ignored. Returns the first non-zero rc.
int lever_efa_device_close(lever_efa_device* dev);

}  // extern "C"
