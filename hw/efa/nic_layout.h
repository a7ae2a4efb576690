/* The NIC layout that device code takes to post to a real EFA SRD queue pair.
 *
 * Why this header exists: the kernels in hw/ep and hw/primitives build real
 * 64-byte EFA TX WQEs for an emulated NIC. To post the same WQEs to an EFA
 * device they need to know where the device's queues are, how big and deep
 * they are, how the phase bits run, which doorbell to ring, and the keys and
 * handles that go into a WQE. The host fills one lever_efa_nic_layout from
 * efadv_query_qp_wqs / efadv_query_cq / efadv_query_ah (hw/efa/host.cpp, or
 * hw/efa/device.py from the `efa` package's query results) and hands it to
 * the kernels by value or in device memory.
 *
 * Names follow rdma-core's EFA provider (providers/efa: efadv.h
 * efadv_wq_attr / efadv_cq_attr / efadv_device_attr, efa.h efa_wq / efa_sq /
 * efa_sub_cq, verbs.c); written from rdma-core v59's description, not copied.
 *
 * Plain C99/C++/CUDA (stdint only, no rdma-core or torch headers): nvcc, the
 * host C++ compiler and a C compiler all include it, and hw/efa/device.py
 * mirrors the struct with ctypes (tests/test_hw_efa.py checks the offsets).
 */
#ifndef LEVER_EFA_NIC_LAYOUT_H
#define LEVER_EFA_NIC_LAYOUT_H

#include <stdint.h>

#if defined(__CUDACC__)
#define LEVER_EFA_HD __host__ __device__ __forceinline__
#elif defined(__cplusplus)
#define LEVER_EFA_HD inline
#else
#define LEVER_EFA_HD static inline
#endif

#define LEVER_EFA_NIC_LAYOUT_VERSION 2u

/* ---- where a region lives, and so how the GPU reaches it ------------------
 * Every address below comes twice: the host virtual address the provider
 * returned (buffer, doorbell) and the address the GPU uses (*_dev, 0 while
 * the region is not mapped into the GPU). */
/* not present / not set */
#define LEVER_EFA_MEM_NONE 0u
/* NIC BAR (PCIe MMIO): the LLQ descriptor ring and the doorbell registers,
 * which the provider mmaps write-only (write-combined) from the uverbs fd.
 * GPU: cudaHostRegister(ptr, len, cudaHostRegisterMapped |
 * cudaHostRegisterIoMemory) on the page-aligned range, then
 * cudaHostGetDevicePointer. Stores only; 64-byte WQE copies then a fence
 * before the doorbell store. */
#define LEVER_EFA_MEM_DEVICE_BAR 1u
/* Host RAM the NIC writes by DMA (the provider's CQ ring, mapped PROT_READ).
 * GPU: cudaHostRegister(..., cudaHostRegisterMapped | cudaHostRegisterReadOnly);
 * every GPU poll is a PCIe read. */
#define LEVER_EFA_MEM_HOST 2u
/* Host RAM the GPU can not map (registration refused): *_dev stays 0 and a
 * host thread polls through the host pointer (the proxy path). */
#define LEVER_EFA_MEM_HOST_ONLY 3u
/* GPU memory handed to the NIC by dma-buf (a CQ created with
 * EFADV_CQ_INIT_FLAGS_EXT_MEM_DMABUF, device cap CQ_WITH_EXT_MEM_DMABUF):
 * the GPU polls its own memory. */
#define LEVER_EFA_MEM_GPU 4u

/* ---- phase conventions (rdma-core v59 providers/efa/verbs.c) -------------
 * SQ: efa_wq.phase starts at 0 (the QP is calloc'ed) and is incremented
 * whenever the producer counter pc wraps the ring (pc & desc_mask == 0); the
 * WQE carries phase & 1 in meta.ctrl2 bit 0. So the first lap writes phase 0.
 * CQ: efa_sub_cq.phase starts at 1; an entry is new when its flags bit 0
 * equals the expected phase, which flips when consumed_cnt wraps the ring.
 * The ring memory starts zeroed, so the first lap's entries carry phase 1. */
#define LEVER_EFA_SQ_PHASE_FIRST_LAP 0u
#define LEVER_EFA_CQ_PHASE_FIRST_LAP 1u

/* Sizes the v59 provider reports (efadv_wq_attr.entry_size is
 * sizeof(efa_io_tx_wqe); efadv_cq_attr.entry_size is the extended RX CQE,
 * sizeof(efa_io_rx_cdesc_ex)). Newer devices may report 128-byte WQEs. */
#define LEVER_EFA_WQE_SIZE_V59 64u
#define LEVER_EFA_CQE_SIZE_V59 32u
/* rdma-core v63: a QP created with the inline-write flag has 128-byte WQEs
 * (efa_io_tx_wqe_128), reported as efadv_wq_attr.entry_size 128; an RDMA write then
 * carries up to 80 bytes of payload inline after the remote address (byte 48 on). */
#define LEVER_EFA_WQE_SIZE_128 128u
#define LEVER_EFA_INLINE_WRITE_MAX_128 80u
#define LEVER_EFA_INLINE_WRITE_OFFSET 48u
/* efa_wq.pc is a 16-bit producer counter and the doorbell takes its value,
 * so a ring can not be deeper than this. */
#define LEVER_EFA_MAX_RING_ENTRIES 65536u

/* What a WQE needs to reach one peer (24 bytes). */
typedef struct lever_efa_peer {
  uint16_t ahn;         /* efadv_ah_attr.ahn of the AH for the peer's GID -> meta.ah */
  uint16_t remote_qpn;  /* the peer's ibv_qp.qp_num -> meta.dest_qp_num (16 bits in the WQE) */
  uint32_t remote_qkey; /* the peer QP's qkey -> meta.qkey */
  uint32_t rkey;        /* the peer window's rkey -> rdma_req.remote_mem.rkey */
  uint32_t reserved;
  uint64_t remote_addr; /* base address of the peer's registered window */
} lever_efa_peer;

typedef struct lever_efa_nic_layout {
  uint32_t version; /* LEVER_EFA_NIC_LAYOUT_VERSION */
  uint32_t qp_num;  /* local ibv_qp.qp_num (what peers write into dest_qp_num) */

  /* ---- send queue: efadv_query_qp_wqs(sq_attr) -------------------------- */
  uint64_t sq_buffer;       /* efadv_wq_attr.buffer: the LLQ descriptor ring (efa_sq.desc), host VA */
  uint64_t sq_buffer_dev;   /* the same ring as the GPU addresses it; 0 when not mapped */
  uint64_t sq_doorbell;     /* efadv_wq_attr.doorbell: 32-bit MMIO register (efa_wq.db), host VA */
  uint64_t sq_doorbell_dev; /* the doorbell as the GPU addresses it; 0 when not mapped */
  uint32_t sq_entry_size;   /* efadv_wq_attr.entry_size: bytes per WQE (64 on v59, 128 newer) */
  uint32_t sq_num_entries;  /* efadv_wq_attr.num_entries (efa_wq.wqe_cnt): power of two;
                               desc_mask = num_entries - 1 */
  uint32_t sq_max_batch;    /* efadv_wq_attr.max_batch (efa_sq.max_batch_wr, from the device's
                               max_tx_batch): WQEs one doorbell may cover, at most the ring */
  uint32_t sq_buffer_mem;   /* LEVER_EFA_MEM_DEVICE_BAR */
  uint32_t sq_doorbell_mem; /* LEVER_EFA_MEM_DEVICE_BAR */
  uint32_t sq_phase_first;  /* LEVER_EFA_SQ_PHASE_FIRST_LAP */

  /* ---- completion queue: efadv_query_cq --------------------------------- */
  uint64_t cq_buffer;      /* efadv_cq_attr.buffer (efa_cq.buf), host VA; 0 for a GPU-memory CQ */
  uint64_t cq_buffer_dev;  /* the ring as the GPU addresses it; 0 when only a host thread polls */
  uint64_t cq_doorbell;    /* CQ arm doorbell: not reported by v59 (0); a polling GPU never arms */
  uint32_t cq_entry_size;  /* efadv_cq_attr.entry_size: stride between CQEs (32 on v59) */
  uint32_t cq_num_entries; /* efadv_cq_attr.num_entries: power of two; qmask = num_entries - 1 */
  uint32_t cq_buffer_mem;  /* LEVER_EFA_MEM_HOST, _HOST_ONLY or _GPU */
  uint32_t cq_phase_first; /* LEVER_EFA_CQ_PHASE_FIRST_LAP */

  /* ---- local keys and device limits for building a WQE ------------------ */
  uint32_t qkey;            /* the local QP's qkey (what peers write into meta.qkey) */
  uint32_t lkey;            /* local window's lkey -> tx_buf_desc.lkey (low 24 bits used) */
  uint64_t local_addr;      /* base address of the local registered window */
  uint32_t inline_buf_size; /* efadv_device_attr.inline_buf_size: inline payload bytes at most */
  uint32_t max_rdma_size;   /* efadv_device_attr.max_rdma_size: bytes one RDMA WQE moves at most */
  uint32_t device_caps;     /* efadv_device_attr.device_caps (EFADV_DEVICE_ATTR_CAPS_*) */
  uint32_t num_peers;       /* entries of peers */
  uint64_t peers;           /* lever_efa_peer[num_peers], as the GPU addresses it */
  uint32_t peers_mem;       /* where peers lives (LEVER_EFA_MEM_GPU or _HOST) */
  uint32_t reserved;

  /* ---- version 2: inline RDMA writes (rdma-core v63) --------------------- */
  uint32_t inline_write_size; /* payload bytes an RDMA write may carry inline in its WQE: 0 (no
                                 inline writes), else at most LEVER_EFA_INLINE_WRITE_MAX_128 and
                                 only with sq_entry_size 128 (the QP made with the inline-write
                                 flag; min(efadv_device_attr.inline_buf_size_ex, 80)) */
  /* ---- version 2: completion counters (rdma-core after v64) ------------- */
  uint32_t cntr_mem;          /* where the counters below live (LEVER_EFA_MEM_GPU: dma-buf,
                                 LEVER_EFA_MEM_HOST: host page mapped for the GPU); _NONE:
                                 the QP has no counters and credit comes from the CQ */
  uint64_t send_cntr;         /* host VA of the 64-bit completion count of a counter attached
                                 to this QP for its RDMA writes (0: none or GPU memory only) */
  uint64_t send_cntr_dev;     /* the same as the GPU reads it (0: no send counter: poll the CQ) */
  uint64_t send_err_cntr_dev; /* that counter's 64-bit error count, as the GPU reads it */
  uint64_t rwrite_cntr;       /* host VA of the completion count of a counter attached for
                                 remote RDMA writes into this QP's window (0: none) */
  uint64_t rwrite_cntr_dev;   /* the same as the GPU reads it (0: none) */
} lever_efa_nic_layout;

#if defined(__cplusplus)
static_assert(sizeof(lever_efa_peer) == 24, "lever_efa_peer is 24 bytes");
static_assert(sizeof(lever_efa_nic_layout) == 200, "lever_efa_nic_layout is 200 bytes");
#else
_Static_assert(sizeof(lever_efa_peer) == 24, "lever_efa_peer is 24 bytes");
_Static_assert(sizeof(lever_efa_nic_layout) == 200, "lever_efa_nic_layout is 200 bytes");
#endif

/* ---- the conventions as functions (host and device) ----------------------
 * pc and ci are free-running 32-bit counters of WQEs posted / CQEs consumed;
 * n is a ring's num_entries (a power of two). */

/* Slot of the ring a counter value lands in. */
LEVER_EFA_HD uint32_t lever_efa_slot(uint32_t counter, uint32_t n) { return counter & (n - 1u); }

/* meta.ctrl2 phase bit of the WQE posted as number pc: the parity of the lap
 * (pc / n) & 1, which for a power-of-two n is bit log2(n) of pc (no division in a
 * post path). */
LEVER_EFA_HD uint32_t lever_efa_sq_phase(uint32_t pc, uint32_t n) {
  return ((pc & n) != 0u ? 1u : 0u) ^ LEVER_EFA_SQ_PHASE_FIRST_LAP;
}

/* The value written to the SQ doorbell after WQEs up to (not including) pc:
 * the provider's 16-bit producer counter, written as one 32-bit store. */
LEVER_EFA_HD uint32_t lever_efa_sq_doorbell_value(uint32_t pc) { return pc & 0xffffu; }

/* Phase bit a CQE must carry to be the ci-th completion (flags bit 0). */
LEVER_EFA_HD uint32_t lever_efa_cq_phase(uint32_t ci, uint32_t n) {
  return ((ci & n) != 0u ? 1u : 0u) ^ LEVER_EFA_CQ_PHASE_FIRST_LAP;
}

/* GPU address of the WQE slot for pc, and of the CQE for ci. */
LEVER_EFA_HD uint64_t lever_efa_sq_slot_dev(const lever_efa_nic_layout* l, uint32_t pc) {
  return l->sq_buffer_dev + (uint64_t)lever_efa_slot(pc, l->sq_num_entries) * l->sq_entry_size;
}
LEVER_EFA_HD uint64_t lever_efa_cq_entry_dev(const lever_efa_nic_layout* l, uint32_t ci) {
  return l->cq_buffer_dev + (uint64_t)lever_efa_slot(ci, l->cq_num_entries) * l->cq_entry_size;
}

LEVER_EFA_HD int lever_efa_is_pow2(uint32_t v) { return v != 0u && (v & (v - 1u)) == 0u; }

/* Why a layout can not be used, or 0 (a null pointer) when it can. The same
 * rules as hw/efa/device.py layout_from_query, for C++ callers. */
LEVER_EFA_HD const char* lever_efa_layout_problem(const lever_efa_nic_layout* l) {
  if (l->version != LEVER_EFA_NIC_LAYOUT_VERSION) return "version: not LEVER_EFA_NIC_LAYOUT_VERSION";
  if (l->sq_buffer == 0u) return "sq_buffer: null";
  if (l->sq_doorbell == 0u) return "sq_doorbell: null";
  if ((l->sq_buffer & 63u) != 0u) return "sq_buffer: not 64-byte aligned";
  if ((l->sq_doorbell & 3u) != 0u) return "sq_doorbell: not 4-byte aligned";
  if (l->sq_entry_size != 64u && l->sq_entry_size != 128u) return "sq_entry_size: not 64 or 128";
  if (!lever_efa_is_pow2(l->sq_num_entries) || l->sq_num_entries < 2u ||
      l->sq_num_entries > LEVER_EFA_MAX_RING_ENTRIES)
    return "sq_num_entries: not a power of two in [2, 65536]";
  if (l->sq_max_batch == 0u || l->sq_max_batch > l->sq_num_entries)
    return "sq_max_batch: not in [1, sq_num_entries]";
  if (l->cq_buffer == 0u && l->cq_buffer_dev == 0u) return "cq_buffer: null";
  if (l->cq_entry_size != 16u && l->cq_entry_size != 32u && l->cq_entry_size != 64u)
    return "cq_entry_size: not 16, 32 or 64";
  if (!lever_efa_is_pow2(l->cq_num_entries) || l->cq_num_entries > LEVER_EFA_MAX_RING_ENTRIES)
    return "cq_num_entries: not a power of two in [1, 65536]";
  if (l->sq_phase_first != LEVER_EFA_SQ_PHASE_FIRST_LAP) return "sq_phase_first: not 0";
  if (l->cq_phase_first != LEVER_EFA_CQ_PHASE_FIRST_LAP) return "cq_phase_first: not 1";
  if (l->inline_write_size > LEVER_EFA_INLINE_WRITE_MAX_128)
    return "inline_write_size: above the 80 bytes a 128-byte WQE holds";
  if (l->inline_write_size != 0u && l->sq_entry_size != LEVER_EFA_WQE_SIZE_128)
    return "inline_write_size: inline RDMA writes need 128-byte WQEs";
  if ((l->send_cntr_dev != 0u || l->rwrite_cntr_dev != 0u) && l->cntr_mem != LEVER_EFA_MEM_GPU &&
      l->cntr_mem != LEVER_EFA_MEM_HOST)
    return "cntr_mem: a counter mapped for the GPU must live in GPU or host memory";
  if (l->send_cntr_dev != 0u && (l->send_err_cntr_dev == 0u || ((l->send_cntr_dev | l->send_err_cntr_dev) & 7u) != 0u))
    return "send_cntr_dev: needs its error count beside it, both 8-byte aligned";
  return 0;
}

/* Whether an RDMA write of len bytes goes inline in its WQE on layout l: a 128-byte WQE,
 * inline writes enabled, and the payload fits (the model's rule, sim/issuer.py
 * NativePort.wqe_blocks, with EFA's 80 bytes beside the descriptor of an RDMA write). */
LEVER_EFA_HD int lever_efa_write_inline(const lever_efa_nic_layout* l, uint32_t len) {
  return l->sq_entry_size == LEVER_EFA_WQE_SIZE_128 && len != 0u && len <= l->inline_write_size;
}
/* 8-byte words of one WQE on layout l (8 or 16): every WQE is written whole, as the
 * provider's LLQ copy writes sq entry_size bytes per WQE. */
LEVER_EFA_HD uint32_t lever_efa_wqe_words(const lever_efa_nic_layout* l) { return l->sq_entry_size >> 3; }

#endif /* LEVER_EFA_NIC_LAYOUT_H */
