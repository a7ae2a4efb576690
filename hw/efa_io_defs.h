// EFA device interface layouts shared by every kernel family in hw/ (the
// microbenchmarks in hw/primitives and the emulated NIC + EP kernels in hw/ep).
//
// Field names and bit positions follow the EFA device interface (rdma-core
// providers/efa efa_io_defs.h, RDMA-write capable revision); written from that
// description, not copied. One definition, so a layout fix lands everywhere.
// Plain C++ (stdint only): nvcc and the host compiler both include it.
#pragma once
#include <stdint.h>

enum EfaSendOp : uint8_t { EFA_IO_SEND = 0, EFA_IO_RDMA_READ = 1, EFA_IO_RDMA_WRITE = 2 };
enum EfaQueueType : uint8_t { EFA_IO_SEND_QUEUE = 1, EFA_IO_RECV_QUEUE = 2 };


struct efa_io_tx_meta_desc {  // 32 bytes
  uint16_t req_id;
  uint8_t ctrl1;
  uint8_t ctrl2;
  uint16_t dest_qp_num;
  uint16_t length;  // number of buffers (1 for RDMA write) or inline bytes
  uint32_t immediate_data;
  uint16_t ah;
  uint8_t ctrl3;
  uint8_t reserved;
  uint32_t qkey;
  uint8_t reserved2[6];
  uint16_t req_id_ex[3];
};
struct efa_io_tx_buf_desc {  // 16 bytes
  uint32_t length;
  uint32_t lkey;
  uint32_t buf_addr_lo;
  uint32_t buf_addr_hi;
};
struct efa_io_remote_mem_addr {  // 16 bytes
  uint32_t length;
  uint32_t rkey;
  uint32_t buf_addr_lo;
  uint32_t buf_addr_hi;
};
struct efa_io_rdma_req {
  efa_io_remote_mem_addr remote_mem;
  efa_io_tx_buf_desc local_mem[1];
};
struct efa_io_tx_wqe {  // 64 bytes
  efa_io_tx_meta_desc meta;
  union {
    efa_io_tx_buf_desc sgl[2];
    uint8_t inline_data[32];
    efa_io_rdma_req rdma_req;
  } data;
};
// The 128-byte WQE (rdma-core v63+, a QP created with the inline-write flag or a large
// max_inline_data): the same meta descriptor, then for an RDMA write the remote address and
// either the local buffer or up to 80 bytes of payload in its place (ctrl1 inline_msg set,
// meta.length = the payload bytes, remote_mem.length the same).
constexpr unsigned EFA_IO_TX_DESC_INLINE_MAX_SIZE_128_BYTES = 80;
struct efa_io_rdma_req_128 {
  efa_io_remote_mem_addr remote_mem;
  union {
    efa_io_tx_buf_desc local_mem[1];
    uint8_t inline_data[EFA_IO_TX_DESC_INLINE_MAX_SIZE_128_BYTES];
  };
};
struct efa_io_tx_wqe_128 {  // 128 bytes
  efa_io_tx_meta_desc meta;
  union {
    efa_io_tx_buf_desc sgl[2];
    uint8_t inline_data[EFA_IO_TX_DESC_INLINE_MAX_SIZE_128_BYTES];
    efa_io_rdma_req_128 rdma_req;
  } data;
};
struct efa_io_cdesc_common {  // 6 bytes
  uint16_t req_id;
  uint8_t status;
  uint8_t flags;
  uint16_t qp_num;
};
struct efa_io_tx_cdesc {  // 16 bytes
  efa_io_cdesc_common common;
  uint16_t req_id_ex[3];
  uint8_t reserved[4];
};
struct efa_io_rx_cdesc {  // 16 bytes
  efa_io_cdesc_common common;
  uint16_t length;
  uint16_t ah;
  uint16_t src_qp_num;
  uint32_t imm;
};
static_assert(sizeof(efa_io_tx_meta_desc) == 32, "meta 32 B");
static_assert(sizeof(efa_io_tx_wqe) == 64, "TX WQE 64 B");
static_assert(sizeof(efa_io_tx_wqe_128) == 128, "TX WQE 128 B");
static_assert(sizeof(efa_io_tx_cdesc) == 16, "TX CQE 16 B");
static_assert(sizeof(efa_io_rx_cdesc) == 16, "RX CQE 16 B");

// rdma-core style bit names (meta.ctrl1 / ctrl2, cdesc flags)
constexpr uint8_t EFA_IO_TX_META_DESC_OP_TYPE_MASK = 0x0f;
constexpr uint8_t EFA_IO_TX_META_DESC_HAS_IMM = 1u << 4;
constexpr uint8_t EFA_IO_TX_META_DESC_INLINE_MSG = 1u << 5;
constexpr uint8_t EFA_IO_TX_META_DESC_META_DESC = 1u << 7;
constexpr uint8_t EFA_IO_TX_META_DESC_PHASE = 1u << 0;
constexpr uint8_t EFA_IO_TX_META_DESC_FIRST = 1u << 2;
constexpr uint8_t EFA_IO_TX_META_DESC_LAST = 1u << 3;
constexpr uint8_t EFA_IO_TX_META_DESC_COMP_REQ = 1u << 4;
constexpr uint8_t EFA_IO_CDESC_COMMON_PHASE = 1u << 0;
constexpr uint8_t EFA_IO_CDESC_COMMON_Q_TYPE_SHIFT = 1;
constexpr uint8_t EFA_IO_CDESC_COMMON_HAS_IMM = 1u << 3;
constexpr uint8_t EFA_IO_CDESC_COMMON_OP_TYPE_SHIFT = 4;
// an RX completion of an unsolicited write-with-immediate (no posted receive; v52+)
constexpr uint8_t EFA_IO_CDESC_COMMON_UNSOLICITED = 1u << 7;
