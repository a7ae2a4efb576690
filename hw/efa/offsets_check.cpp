// Compiled offset check: the project's WQE/CQE structs (hw/efa_io_defs.h) against the
// EFA provider's own (rdma-core providers/efa/efa_io_defs.h), field by field.
//
// Why: the kernels write 64-byte WQEs and read CQEs that a real EFA device parses.
// A field at the wrong offset posts garbage that no emulator test notices, so the
// layouts are compared by the compiler: this file compiles iff they agree.
// Both headers go into one translation unit, each in its own namespace (they use
// the same struct names); the project's constants are captured before the
// provider's *_MASK macros exist (one name is shared: ..._OP_TYPE_MASK).
//
//   g++ -std=c++17 -fsyntax-only $(python3 hw/efa/rdma_core.py) hw/efa/offsets_check.cpp
//
// Revisions: the project header follows the newest provider layout (processing
// hints in meta.ctrl3, 64-bit request ids in req_id_ex, 16-byte TX CQE). rdma-core
// v59 has those bytes reserved (MBZ) and an 8-byte TX CQE inside a 32-byte CQ entry.
// Against a provider with req_id_ex every field must match exactly; against v59 the
// project's newer fields must lie inside v59's reserved bytes, and a project CQE
// must fit in the CQ entry v59 reports. What that means for the kernels on a v59
// device is in hw/efa/README.md.
//
// Test hooks (tests/test_hw_efa.py): -DLEVER_EFA_SKEW=N shifts the expected offset
// of meta.ah by N bytes (the check must then fail); -DLEVER_EFA_SKEW_INLINE=N the
// provider's inline-write payload offset (v63+ headers); -DLEVER_EFA_PROJECT_HEADER=
// "path" checks another copy of the project header; -DLEVER_EFA_REQUIRE_128 refuses a
// provider header without the 128-byte WQE (tests/test_hw_efa128.py).
#include <stddef.h>
#include <stdint.h>

#include <type_traits>

#ifndef LEVER_EFA_PROJECT_HEADER
#define LEVER_EFA_PROJECT_HEADER "../efa_io_defs.h"
#endif
#ifndef LEVER_EFA_SKEW
#define LEVER_EFA_SKEW 0
#endif
#ifndef LEVER_EFA_SKEW_INLINE
#define LEVER_EFA_SKEW_INLINE 0
#endif

namespace proj {
#include LEVER_EFA_PROJECT_HEADER
}  // namespace proj

// The project's bit constants, before the provider's macros can shadow them.
namespace pc {
constexpr unsigned op_type_mask = proj::EFA_IO_TX_META_DESC_OP_TYPE_MASK;
constexpr unsigned has_imm = proj::EFA_IO_TX_META_DESC_HAS_IMM;
constexpr unsigned inline_msg = proj::EFA_IO_TX_META_DESC_INLINE_MSG;
constexpr unsigned meta_desc = proj::EFA_IO_TX_META_DESC_META_DESC;
constexpr unsigned phase = proj::EFA_IO_TX_META_DESC_PHASE;
constexpr unsigned first = proj::EFA_IO_TX_META_DESC_FIRST;
constexpr unsigned last = proj::EFA_IO_TX_META_DESC_LAST;
constexpr unsigned comp_req = proj::EFA_IO_TX_META_DESC_COMP_REQ;
constexpr unsigned cdesc_phase = proj::EFA_IO_CDESC_COMMON_PHASE;
constexpr unsigned cdesc_q_type_shift = proj::EFA_IO_CDESC_COMMON_Q_TYPE_SHIFT;
constexpr unsigned cdesc_has_imm = proj::EFA_IO_CDESC_COMMON_HAS_IMM;
constexpr unsigned cdesc_op_type_shift = proj::EFA_IO_CDESC_COMMON_OP_TYPE_SHIFT;
constexpr unsigned cdesc_unsolicited = proj::EFA_IO_CDESC_COMMON_UNSOLICITED;
}  // namespace pc

// The kernel-style helpers the provider header expects (linux/bits.h in the tree).
#ifndef BIT
#define BIT(n) (1u << (n))
#endif
#ifndef GENMASK
#define GENMASK(h, l) (((~0u) << (l)) & (~0u >> (31 - (h))))
#endif

namespace prov {
#include <efa_io_defs.h>  // -I <rdma-core>/providers/efa
}  // namespace prov

#include "nic_layout.h"
#include "wqe.h"

// ---------------------------------------------------------------- helpers
#define MEMBER_SIZE(type, field) sizeof(((type*)0)->field)
#define END_OF(type, field) (offsetof(type, field) + MEMBER_SIZE(type, field))

// same offset and size, named in the error
#define SAME(ptype, pfield, vtype, vfield)                                               \
  static_assert(offsetof(proj::ptype, pfield) == offsetof(prov::vtype, vfield),          \
                #ptype "." #pfield ": offset differs from the provider's " #vtype "." #vfield); \
  static_assert(MEMBER_SIZE(proj::ptype, pfield) == MEMBER_SIZE(prov::vtype, vfield),     \
                #ptype "." #pfield ": size differs from the provider's " #vtype "." #vfield)

#define SAME_SIZEOF(ptype, vtype) \
  static_assert(sizeof(proj::ptype) == sizeof(prov::vtype), "sizeof " #ptype " differs from the provider's")

// project field pfield lies inside the provider's (reserved) field vfield
#define INSIDE(ptype, pfield, vtype, vfield)                                              \
  static_assert(offsetof(proj::ptype, pfield) >= offsetof(prov::vtype, vfield) &&          \
                    END_OF(proj::ptype, pfield) <= END_OF(prov::vtype, vfield),            \
                #ptype "." #pfield ": not inside the provider's reserved " #vtype "." #vfield)

constexpr unsigned lowest_bit(unsigned m) {
  unsigned s = 0;
  while (m && !(m & 1u)) {
    m >>= 1;
    ++s;
  }
  return s;
}

// ---------------------------------------------------------------- TX meta descriptor
SAME(efa_io_tx_meta_desc, req_id, efa_io_tx_meta_desc, req_id);
SAME(efa_io_tx_meta_desc, ctrl1, efa_io_tx_meta_desc, ctrl1);
SAME(efa_io_tx_meta_desc, ctrl2, efa_io_tx_meta_desc, ctrl2);
SAME(efa_io_tx_meta_desc, dest_qp_num, efa_io_tx_meta_desc, dest_qp_num);
SAME(efa_io_tx_meta_desc, length, efa_io_tx_meta_desc, length);
SAME(efa_io_tx_meta_desc, immediate_data, efa_io_tx_meta_desc, immediate_data);
static_assert(offsetof(proj::efa_io_tx_meta_desc, ah) + LEVER_EFA_SKEW ==
                  offsetof(prov::efa_io_tx_meta_desc, ah),
              "efa_io_tx_meta_desc.ah: offset differs from the provider's efa_io_tx_meta_desc.ah");
static_assert(MEMBER_SIZE(proj::efa_io_tx_meta_desc, ah) == MEMBER_SIZE(prov::efa_io_tx_meta_desc, ah),
              "efa_io_tx_meta_desc.ah: size differs from the provider's");
SAME(efa_io_tx_meta_desc, qkey, efa_io_tx_meta_desc, qkey);
SAME_SIZEOF(efa_io_tx_meta_desc, efa_io_tx_meta_desc);

// ---------------------------------------------------------------- buffers and RDMA request
SAME(efa_io_tx_buf_desc, length, efa_io_tx_buf_desc, length);
SAME(efa_io_tx_buf_desc, lkey, efa_io_tx_buf_desc, lkey);
SAME(efa_io_tx_buf_desc, buf_addr_lo, efa_io_tx_buf_desc, buf_addr_lo);
SAME(efa_io_tx_buf_desc, buf_addr_hi, efa_io_tx_buf_desc, buf_addr_hi);
SAME_SIZEOF(efa_io_tx_buf_desc, efa_io_tx_buf_desc);

SAME(efa_io_remote_mem_addr, length, efa_io_remote_mem_addr, length);
SAME(efa_io_remote_mem_addr, rkey, efa_io_remote_mem_addr, rkey);
SAME(efa_io_remote_mem_addr, buf_addr_lo, efa_io_remote_mem_addr, buf_addr_lo);
SAME(efa_io_remote_mem_addr, buf_addr_hi, efa_io_remote_mem_addr, buf_addr_hi);
SAME_SIZEOF(efa_io_remote_mem_addr, efa_io_remote_mem_addr);

SAME(efa_io_rdma_req, remote_mem, efa_io_rdma_req, remote_mem);
SAME(efa_io_rdma_req, local_mem, efa_io_rdma_req, local_mem);
SAME_SIZEOF(efa_io_rdma_req, efa_io_rdma_req);

// ---------------------------------------------------------------- the 64-byte TX WQE
SAME(efa_io_tx_wqe, meta, efa_io_tx_wqe, meta);
SAME(efa_io_tx_wqe, data, efa_io_tx_wqe, data);
SAME(efa_io_tx_wqe, data.sgl, efa_io_tx_wqe, data.sgl);
SAME(efa_io_tx_wqe, data.inline_data, efa_io_tx_wqe, data.inline_data);
SAME(efa_io_tx_wqe, data.rdma_req, efa_io_tx_wqe, data.rdma_req);
SAME(efa_io_tx_wqe, data.rdma_req.remote_mem.rkey, efa_io_tx_wqe, data.rdma_req.remote_mem.rkey);
SAME(efa_io_tx_wqe, data.rdma_req.remote_mem.buf_addr_lo, efa_io_tx_wqe,
     data.rdma_req.remote_mem.buf_addr_lo);
SAME(efa_io_tx_wqe, data.rdma_req.local_mem[0].lkey, efa_io_tx_wqe, data.rdma_req.local_mem[0].lkey);
SAME(efa_io_tx_wqe, data.rdma_req.local_mem[0].buf_addr_lo, efa_io_tx_wqe,
     data.rdma_req.local_mem[0].buf_addr_lo);
SAME_SIZEOF(efa_io_tx_wqe, efa_io_tx_wqe);
static_assert(MEMBER_SIZE(proj::efa_io_tx_wqe, data.inline_data) == EFA_IO_TX_DESC_INLINE_MAX_SIZE,
              "inline_data differs from EFA_IO_TX_DESC_INLINE_MAX_SIZE");
static_assert(MEMBER_SIZE(proj::efa_io_tx_wqe, data.sgl) ==
                  EFA_IO_TX_DESC_NUM_BUFS * sizeof(prov::efa_io_tx_buf_desc),
              "sgl differs from EFA_IO_TX_DESC_NUM_BUFS buffers");
static_assert(sizeof(prov::efa_io_tx_wqe) == LEVER_EFA_WQE_SIZE_V59,
              "nic_layout.h LEVER_EFA_WQE_SIZE_V59 differs from the provider's WQE");

// ---------------------------------------------------------------- the 128-byte TX WQE (v63+)
// A provider header with EFA_IO_TX_DESC_INLINE_MAX_SIZE_128 (rdma-core v63 and later) has
// efa_io_tx_wqe_128; the project's copy and wqe.h's inline-write layout must match it. Against
// an older header these checks can not run: -DLEVER_EFA_REQUIRE_128 makes that an error (the
// test that passes a v63+ tree sets it, so a v59 header can not pass for a v63 check).
#ifdef EFA_IO_TX_DESC_INLINE_MAX_SIZE_128
SAME(efa_io_rdma_req_128, remote_mem, efa_io_rdma_req_128, remote_mem);
SAME(efa_io_rdma_req_128, local_mem, efa_io_rdma_req_128, local_mem);
SAME(efa_io_rdma_req_128, inline_data, efa_io_rdma_req_128, inline_data);
SAME_SIZEOF(efa_io_rdma_req_128, efa_io_rdma_req_128);
SAME(efa_io_tx_wqe_128, meta, efa_io_tx_wqe_128, meta);
SAME(efa_io_tx_wqe_128, data, efa_io_tx_wqe_128, data);
SAME(efa_io_tx_wqe_128, data.sgl, efa_io_tx_wqe_128, data.sgl);
SAME(efa_io_tx_wqe_128, data.inline_data, efa_io_tx_wqe_128, data.inline_data);
SAME(efa_io_tx_wqe_128, data.rdma_req, efa_io_tx_wqe_128, data.rdma_req);
SAME(efa_io_tx_wqe_128, data.rdma_req.remote_mem.rkey, efa_io_tx_wqe_128, data.rdma_req.remote_mem.rkey);
SAME(efa_io_tx_wqe_128, data.rdma_req.local_mem[0].lkey, efa_io_tx_wqe_128,
     data.rdma_req.local_mem[0].lkey);
SAME(efa_io_tx_wqe_128, data.rdma_req.inline_data, efa_io_tx_wqe_128, data.rdma_req.inline_data);
SAME_SIZEOF(efa_io_tx_wqe_128, efa_io_tx_wqe_128);
static_assert(sizeof(prov::efa_io_tx_wqe_128) == LEVER_EFA_WQE_SIZE_128,
              "nic_layout.h LEVER_EFA_WQE_SIZE_128 differs from the provider's 128-byte WQE");
static_assert(offsetof(prov::efa_io_tx_wqe_128, data.rdma_req.inline_data) + LEVER_EFA_SKEW_INLINE ==
                  LEVER_EFA_INLINE_WRITE_OFFSET,
              "nic_layout.h LEVER_EFA_INLINE_WRITE_OFFSET is not where the provider puts an inline write's payload");
static_assert(MEMBER_SIZE(prov::efa_io_tx_wqe_128, data.rdma_req.inline_data) == LEVER_EFA_INLINE_WRITE_MAX_128 &&
                  EFA_IO_TX_DESC_INLINE_MAX_SIZE_128 == LEVER_EFA_INLINE_WRITE_MAX_128,
              "nic_layout.h LEVER_EFA_INLINE_WRITE_MAX_128 differs from the provider's inline write room");
static_assert(proj::EFA_IO_TX_DESC_INLINE_MAX_SIZE_128_BYTES == EFA_IO_TX_DESC_INLINE_MAX_SIZE_128,
              "efa_io_defs.h EFA_IO_TX_DESC_INLINE_MAX_SIZE_128_BYTES differs from the provider's");
// wqe.h's words 6.. of an inline write are the payload: the payload starts on a word boundary
static_assert(LEVER_EFA_INLINE_WRITE_OFFSET == 6u * 8u, "an inline write's payload is not word 6 of the WQE");
#define LEVER_EFA_CHECKED_128 1
#elif defined(LEVER_EFA_REQUIRE_128)
#error "provider efa_io_defs.h has no 128-byte WQE (EFA_IO_TX_DESC_INLINE_MAX_SIZE_128): not rdma-core v63+"
#endif
// Without a v63 header the project's own 128-byte layout still has to put the payload where
// wqe.h writes it.
static_assert(offsetof(proj::efa_io_tx_wqe_128, data.rdma_req.inline_data) == LEVER_EFA_INLINE_WRITE_OFFSET,
              "efa_io_defs.h efa_io_tx_wqe_128: inline payload not at LEVER_EFA_INLINE_WRITE_OFFSET");
static_assert(sizeof(proj::efa_io_tx_wqe_128) == LEVER_EFA_WQE_SIZE_128, "efa_io_defs.h efa_io_tx_wqe_128 size");

// ---------------------------------------------------------------- completion descriptors
SAME(efa_io_cdesc_common, req_id, efa_io_cdesc_common, req_id);
SAME(efa_io_cdesc_common, status, efa_io_cdesc_common, status);
SAME(efa_io_cdesc_common, flags, efa_io_cdesc_common, flags);
SAME(efa_io_cdesc_common, qp_num, efa_io_cdesc_common, qp_num);
SAME_SIZEOF(efa_io_cdesc_common, efa_io_cdesc_common);

SAME(efa_io_tx_cdesc, common, efa_io_tx_cdesc, common);

SAME(efa_io_rx_cdesc, common, efa_io_rx_cdesc, common);
SAME(efa_io_rx_cdesc, length, efa_io_rx_cdesc, length);
SAME(efa_io_rx_cdesc, ah, efa_io_rx_cdesc, ah);
SAME(efa_io_rx_cdesc, src_qp_num, efa_io_rx_cdesc, src_qp_num);
SAME(efa_io_rx_cdesc, imm, efa_io_rx_cdesc, imm);
SAME_SIZEOF(efa_io_rx_cdesc, efa_io_rx_cdesc);

// The CQ entry the provider allocates (and efadv_query_cq reports) is the extended
// RX descriptor; a project CQE must fit in it.
static_assert(sizeof(prov::efa_io_rx_cdesc_ex) == LEVER_EFA_CQE_SIZE_V59,
              "nic_layout.h LEVER_EFA_CQE_SIZE_V59 differs from the provider's CQ entry");
static_assert(sizeof(proj::efa_io_tx_cdesc) <= sizeof(prov::efa_io_rx_cdesc_ex) &&
                  sizeof(proj::efa_io_rx_cdesc) <= sizeof(prov::efa_io_rx_cdesc_ex),
              "a project CQE is larger than the provider's CQ entry");

// ---------------------------------------------------------------- revision-dependent fields
// A provider with 64-bit request ids has efa_io_tx_cdesc::req_id_ex (master, after v64).
template <class T, class = void>
struct has_req_id_ex : std::false_type {};
template <class T>
struct has_req_id_ex<T, std::void_t<decltype(&T::req_id_ex)>> : std::true_type {};
template <class T, class = void>
struct has_ctrl3 : std::false_type {};
template <class T>
struct has_ctrl3<T, std::void_t<decltype(&T::ctrl3)>> : std::true_type {};

// Each check: a field the project lacks keeps those bytes reserved (fine); a field both
// have must match; a project field the provider lacks must lie in its reserved bytes.
template <class V, class P>
constexpr bool meta_ctrl3_ok() {
  if constexpr (!has_ctrl3<P>::value) {
    return true;
  } else if constexpr (has_ctrl3<V>::value) {  // v64+: processing hints
    return offsetof(P, ctrl3) == offsetof(V, ctrl3);
  } else {  // v59..v63: the 16 reserved bits after ah
    return offsetof(P, ctrl3) >= offsetof(V, reserved) && END_OF(P, ctrl3) <= END_OF(V, reserved);
  }
}
static_assert(meta_ctrl3_ok<prov::efa_io_tx_meta_desc, proj::efa_io_tx_meta_desc>(),
              "efa_io_tx_meta_desc.ctrl3: neither the provider's ctrl3 nor inside its reserved bytes");

template <class V, class P>
constexpr bool meta_req_id_ex_ok() {
  if constexpr (!has_req_id_ex<P>::value) {
    return true;
  } else if constexpr (has_req_id_ex<V>::value) {  // 64-bit request ids
    return offsetof(P, req_id_ex) == offsetof(V, req_id_ex) &&
           MEMBER_SIZE(P, req_id_ex) == MEMBER_SIZE(V, req_id_ex);
  } else {  // v59: the reserved bytes after qkey
    return offsetof(P, req_id_ex) >= offsetof(V, reserved2) &&
           END_OF(P, req_id_ex) <= END_OF(V, reserved2);
  }
}
static_assert(meta_req_id_ex_ok<prov::efa_io_tx_meta_desc, proj::efa_io_tx_meta_desc>(),
              "efa_io_tx_meta_desc.req_id_ex: neither the provider's req_id_ex nor inside its reserved2");

template <class V, class P>
constexpr bool tx_cdesc_ok() {
  if constexpr (!has_req_id_ex<P>::value) {
    return true;  // only common is read; the entry size comes from efadv_query_cq
  } else if constexpr (has_req_id_ex<V>::value) {
    return offsetof(P, req_id_ex) == offsetof(V, req_id_ex) && sizeof(V) == sizeof(P);
  } else {  // v59: an 8-byte TX CQE; the project's req_id_ex starts at its MBZ tail
    return offsetof(P, req_id_ex) == offsetof(V, reserved16) && sizeof(V) <= sizeof(P);
  }
}
static_assert(tx_cdesc_ok<prov::efa_io_tx_cdesc, proj::efa_io_tx_cdesc>(),
              "efa_io_tx_cdesc: req_id_ex/size differ from the provider's TX completion descriptor");

// ---------------------------------------------------------------- opcodes, queue types, bits
static_assert(int(proj::EFA_IO_SEND) == int(prov::EFA_IO_SEND), "EFA_IO_SEND differs");
static_assert(int(proj::EFA_IO_RDMA_READ) == int(prov::EFA_IO_RDMA_READ), "EFA_IO_RDMA_READ differs");
static_assert(int(proj::EFA_IO_RDMA_WRITE) == int(prov::EFA_IO_RDMA_WRITE), "EFA_IO_RDMA_WRITE differs");
static_assert(int(proj::EFA_IO_SEND_QUEUE) == int(prov::EFA_IO_SEND_QUEUE), "EFA_IO_SEND_QUEUE differs");
static_assert(int(proj::EFA_IO_RECV_QUEUE) == int(prov::EFA_IO_RECV_QUEUE), "EFA_IO_RECV_QUEUE differs");

static_assert(pc::op_type_mask == EFA_IO_TX_META_DESC_OP_TYPE_MASK, "ctrl1 op_type mask differs");
static_assert(pc::has_imm == EFA_IO_TX_META_DESC_HAS_IMM_MASK, "ctrl1 has_imm bit differs");
static_assert(pc::inline_msg == EFA_IO_TX_META_DESC_INLINE_MSG_MASK, "ctrl1 inline_msg bit differs");
static_assert(pc::meta_desc == EFA_IO_TX_META_DESC_META_DESC_MASK, "ctrl1 meta_desc bit differs");
static_assert(pc::phase == EFA_IO_TX_META_DESC_PHASE_MASK, "ctrl2 phase bit differs");
static_assert(pc::first == EFA_IO_TX_META_DESC_FIRST_MASK, "ctrl2 first bit differs");
static_assert(pc::last == EFA_IO_TX_META_DESC_LAST_MASK, "ctrl2 last bit differs");
static_assert(pc::comp_req == EFA_IO_TX_META_DESC_COMP_REQ_MASK, "ctrl2 comp_req bit differs");
static_assert(pc::cdesc_phase == EFA_IO_CDESC_COMMON_PHASE_MASK, "cdesc phase bit differs");
static_assert(pc::cdesc_q_type_shift == lowest_bit(EFA_IO_CDESC_COMMON_Q_TYPE_MASK),
              "cdesc q_type shift differs");
static_assert(pc::cdesc_has_imm == EFA_IO_CDESC_COMMON_HAS_IMM_MASK, "cdesc has_imm bit differs");
static_assert(pc::cdesc_op_type_shift == lowest_bit(EFA_IO_CDESC_COMMON_OP_TYPE_MASK),
              "cdesc op_type shift differs");
static_assert(pc::cdesc_unsolicited == EFA_IO_CDESC_COMMON_UNSOLICITED_MASK,
              "cdesc unsolicited bit differs");
// wqe.h, the one WQE builder, against the provider's bits
static_assert(LEVER_EFA_OP_RDMA_WRITE == unsigned(prov::EFA_IO_RDMA_WRITE), "wqe.h RDMA_WRITE differs");
static_assert(LEVER_EFA_CTRL1_HAS_IMM == EFA_IO_TX_META_DESC_HAS_IMM_MASK, "wqe.h has_imm differs");
static_assert(LEVER_EFA_CTRL1_META_DESC == EFA_IO_TX_META_DESC_META_DESC_MASK, "wqe.h meta_desc differs");
static_assert(LEVER_EFA_CTRL1_INLINE_MSG == EFA_IO_TX_META_DESC_INLINE_MSG_MASK, "wqe.h inline_msg differs");
static_assert(LEVER_EFA_CTRL2_PHASE == EFA_IO_TX_META_DESC_PHASE_MASK, "wqe.h phase differs");
static_assert(LEVER_EFA_CTRL2_FIRST == EFA_IO_TX_META_DESC_FIRST_MASK, "wqe.h first differs");
static_assert(LEVER_EFA_CTRL2_LAST == EFA_IO_TX_META_DESC_LAST_MASK, "wqe.h last differs");
static_assert(LEVER_EFA_CTRL2_COMP_REQ == EFA_IO_TX_META_DESC_COMP_REQ_MASK, "wqe.h comp_req differs");
static_assert(LEVER_EFA_LKEY_MASK == EFA_IO_TX_BUF_DESC_LKEY_MASK, "wqe.h lkey mask differs");
static_assert(LEVER_EFA_CDESC_PHASE == EFA_IO_CDESC_COMMON_PHASE_MASK, "wqe.h CQE phase differs");
// nic_layout.h phase helpers use bit 0 of ctrl2 / flags
static_assert(EFA_IO_TX_META_DESC_PHASE_MASK == 1u && EFA_IO_CDESC_COMMON_PHASE_MASK == 1u,
              "phase is not bit 0");

int lever_efa_offsets_check_passed() { return 1; }
#ifdef LEVER_EFA_CHECKED_128
int lever_efa_offsets_check_128_passed() { return 1; }
#endif
