/* The RDMA-write TX WQE as the EFA provider builds it (rdma-core v59; 128-byte WQEs with
 * inline writes as v63 builds them), from a NIC layout: the one WQE builder of every kernel
 * and host proxy in hw/.
 *
 * Why: the kernels must post the same 64 bytes whether the NIC behind the layout is
 * the emulated one (hw/ep) or a real EFA device (layout from efadv_query_qp_wqs /
 * efadv_query_cq, hw/efa/device.py layout_from_query). Everything that differs
 * between the two comes from the layout and the peer entry (ring geometry, phase
 * convention, QPN, AH, qkey, lkey, rkey); nothing here knows which NIC it builds for.
 *
 * Conventions, as v59 providers/efa/verbs.c sets them (read there, written here):
 *   - meta.ctrl1: op type RDMA_WRITE, meta_desc set, has_imm when an immediate goes.
 *   - meta.ctrl2: phase = the SQ lap's phase (first lap 0: lever_efa_sq_phase), first,
 *     last and comp_req set; every other bit MBZ.
 *   - meta.req_id: a per-WQE cookie the device echoes in the TX CQE. The provider
 *     takes it from a pool of [0, sq entries); here the ring slot (same range, unique
 *     among in-flight WQEs because at most sq_num_entries are outstanding).
 *   - meta.length = 1 (one local buffer), meta.ah = the peer's AH number,
 *     meta.dest_qp_num = the peer QP's number, meta.qkey = the peer QP's qkey.
 *   - v59 reserved bytes (meta.reserved, meta.reserved2[12]) are written 0: the project
 *     header's newer ctrl3 / req_id_ex live there and are MBZ on v59.
 *   - local buffer lkey: bits 23:0 only (31:24 MBZ).
 * Word k of the WQE is bytes [8k, 8k+8), little-endian, so eight 8-byte stores (one
 * per lane, or a loop) write the whole entry: the order NCCL's GIN EFA path and the
 * provider's LLQ copy use (stores, then a fence, then the doorbell).
 *
 * C++ (host and device), stdint only besides nic_layout.h.
 */
#ifndef LEVER_EFA_WQE_H
#define LEVER_EFA_WQE_H

#include <stdint.h>

#include "nic_layout.h"

/* Bits of meta.ctrl1 / ctrl2 and the CQE flags (the values hw/efa/offsets_check.cpp
 * proves equal to the provider's masks, through hw/efa_io_defs.h). */
#define LEVER_EFA_OP_RDMA_WRITE 2u
#define LEVER_EFA_CTRL1_HAS_IMM (1u << 4)
#define LEVER_EFA_CTRL1_INLINE_MSG (1u << 5)
#define LEVER_EFA_CTRL1_META_DESC (1u << 7)
#define LEVER_EFA_CTRL2_PHASE (1u << 0)
#define LEVER_EFA_CTRL2_FIRST (1u << 2)
#define LEVER_EFA_CTRL2_LAST (1u << 3)
#define LEVER_EFA_CTRL2_COMP_REQ (1u << 4)
#define LEVER_EFA_LKEY_MASK 0x00ffffffu
#define LEVER_EFA_CDESC_PHASE (1u << 0)

/* Everything a WQE needs besides the layout and the peer. */
typedef struct lever_efa_write {
  uint64_t laddr; /* local source (inside the layout's registered window) */
  uint64_t raddr; /* remote destination (inside the peer's window) */
  uint32_t len;   /* bytes, at most max_rdma_size */
  uint32_t imm;   /* immediate data (sent when has_imm) */
  uint32_t has_imm;
  /* Where the builder may read the payload to send it inline (the caller can load from it:
   * the local buffer on the GPU, laddr itself for device code), or null: never inline (a
   * host proxy thread can not read GPU memory). Inline only where lever_efa_write_inline
   * says the layout takes it. */
  const void* inline_src;
} lever_efa_write;

/* Payload word k (bytes [8k, 8k+8) of the write, zero past len) read from src. */
LEVER_EFA_HD uint64_t lever_efa_inline_word(const void* src, uint32_t len, uint32_t k) {
  const uint32_t off = k * 8u;
  if (off >= len) return 0ull;
  const unsigned char* b = (const unsigned char*)src + off;
  if ((((uint64_t)(uintptr_t)b) & 7u) == 0u && len - off >= 8u) return *(const uint64_t*)b;
  uint64_t v = 0ull;
  const uint32_t n = len - off < 8u ? len - off : 8u;
  for (uint32_t i = 0; i < n; ++i) v |= (uint64_t)b[i] << (8u * i);
  return v;
}

/* Word wd (0 .. lever_efa_wqe_words(l) - 1) of the RDMA-write WQE posted as number pc on
 * the QP of layout l towards peer p. A 64-byte WQE is words 0..7; a 128-byte one (v63,
 * efa_io_tx_wqe_128) has the same first six words, then either the local buffer (words
 * 6, 7) and zeros, or, for an inline write, the payload from byte 48 (words 6..15, zero
 * past len), ctrl1 inline_msg set and meta.length = len (the provider's inline setter). */
LEVER_EFA_HD uint64_t lever_efa_write_wqe_word(const lever_efa_nic_layout* l, const lever_efa_peer* p,
                                               const lever_efa_write* wr, uint32_t pc, int wd) {
  const int inl = wr->inline_src != 0 && lever_efa_write_inline(l, wr->len);
  switch (wd) {
    case 0: {
      const uint64_t ctrl1 = LEVER_EFA_OP_RDMA_WRITE | LEVER_EFA_CTRL1_META_DESC |
                             (wr->has_imm ? LEVER_EFA_CTRL1_HAS_IMM : 0u) |
                             (inl ? LEVER_EFA_CTRL1_INLINE_MSG : 0u);
      const uint64_t ctrl2 = lever_efa_sq_phase(pc, l->sq_num_entries) | LEVER_EFA_CTRL2_FIRST |
                             LEVER_EFA_CTRL2_LAST | LEVER_EFA_CTRL2_COMP_REQ;
      const uint64_t req_id = lever_efa_slot(pc, l->sq_num_entries);
      /* meta.length: one buffer, or the inline payload's bytes */
      const uint64_t length = inl ? (uint64_t)wr->len : 1ull;
      return req_id | (ctrl1 << 16) | (ctrl2 << 24) | ((uint64_t)p->remote_qpn << 32) | (length << 48);
    }
    case 1: /* immediate_data, ah, reserved */
      return (uint64_t)(wr->has_imm ? wr->imm : 0u) | ((uint64_t)p->ahn << 32);
    case 2: /* qkey, reserved2[0..3] */
      return (uint64_t)p->remote_qkey;
    case 3: /* reserved2[4..11] */
      return 0ull;
    case 4: /* remote_mem.length, rkey */
      return (uint64_t)wr->len | ((uint64_t)p->rkey << 32);
    case 5: /* remote_mem.buf_addr_lo/hi */
      return wr->raddr;
    default:
      break;
  }
  if (inl) return lever_efa_inline_word(wr->inline_src, wr->len, (uint32_t)wd - 6u);
  if (wd == 6) /* local_mem[0].length, lkey (23:0) */
    return (uint64_t)wr->len | ((uint64_t)(l->lkey & LEVER_EFA_LKEY_MASK) << 32);
  if (wd == 7) /* local_mem[0].buf_addr_lo/hi */
    return wr->laddr;
  return 0ull; /* the rest of a 128-byte entry */
}

/* The CQE flags byte of a 16-byte load's first word (efa_io_cdesc_common.flags). */
LEVER_EFA_HD uint32_t lever_efa_cqe_flags(uint32_t word0) { return (word0 >> 24) & 0xffu; }
LEVER_EFA_HD uint32_t lever_efa_cqe_status(uint32_t word0) { return (word0 >> 16) & 0xffu; }
/* Whether a CQE (flags byte) is the ci-th completion of layout l's CQ. */
LEVER_EFA_HD int lever_efa_cqe_is_new(const lever_efa_nic_layout* l, uint32_t flags, uint32_t ci) {
  return (flags & LEVER_EFA_CDESC_PHASE) == lever_efa_cq_phase(ci, l->cq_num_entries);
}

#endif /* LEVER_EFA_WQE_H */
