/* What hw/efa/host.cpp uses of rdma-core releases newer than the v59 headers it compiles
 * against, declared here and resolved at run time (dlsym), so one build runs on v59 and
 * uses a newer library's features where the library has them:
 *
 *   - 128-byte WQEs with inline RDMA writes (v63): the QP flag below in
 *     efadv_qp_init_attr.flags, and efadv_device_attr.inline_buf_size_ex (v59's two
 *     reserved bytes after inline_buf_size). A library is v63+ when libefa exports
 *     efadv_get_max_sq_depth (EFA_1.5, the same release).
 *   - completion counters (after v64): libibverbs' ibv_comp_cntr objects (IBVERBS_1.18:
 *     ibv_qp_attach_comp_cntr, ibv_destroy_comp_cntr) made by libefa's
 *     efadv_create_comp_cntr (EFA_1.7) on application memory, the device cap bit below.
 *
 * The structs mirror the provider's (efadv.h / verbs.h after v64), written from their
 * description; hw/efa/newer_verbs_check.cpp compares them field by field with a newer
 * tree's headers (tests/test_hw_efa128.py, where $LEVER_RDMA_CORE_TREE names one).
 * Plain C/C++, stdint only.
 */
#ifndef LEVER_EFA_NEWER_VERBS_H
#define LEVER_EFA_NEWER_VERBS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* efadv_qp_init_attr.flags: RDMA write with inline data; the QP's WQEs are 128 bytes (v63) */
#define LEVER_EFADV_QP_FLAGS_INLINE_WRITE (1u << 1)
/* efadv_device_attr.device_caps: completion counters (after v64) */
#define LEVER_EFADV_DEVICE_ATTR_CAPS_COMP_CNTR (1u << 6)
/* efadv_device_attr: offset of inline_buf_size_ex (v63; reserved bytes in v59) */
#define LEVER_EFADV_DEVICE_ATTR_INLINE_BUF_SIZE_EX_OFFSET 22u

/* ibv_comp_cntr_type */
#define LEVER_IBV_COMP_CNTR_TYPE_WRS 0u
/* ibv_qp_attach_comp_cntr_op bits */
#define LEVER_IBV_QP_ATTACH_COMP_CNTR_OP_RDMA_WRITE (1u << 4)
#define LEVER_IBV_QP_ATTACH_COMP_CNTR_OP_REMOTE_RDMA_WRITE (1u << 5)
/* efadv_comp_cntr_init_attr.flags and efadv_memory_location.type */
#define LEVER_EFADV_COMP_CNTR_INIT_WITH_COMP_EXTERNAL_MEM (1u << 0)
#define LEVER_EFADV_COMP_CNTR_INIT_WITH_ERR_EXTERNAL_MEM (1u << 1)
#define LEVER_EFADV_MEMORY_LOCATION_VA 0u
#define LEVER_EFADV_MEMORY_LOCATION_DMABUF 1u

typedef struct lever_ibv_comp_cntr_init_attr { /* ibv_comp_cntr_init_attr */
  uint32_t comp_mask;
  uint32_t type; /* enum ibv_comp_cntr_type */
  uint32_t flags;
} lever_ibv_comp_cntr_init_attr;

typedef struct lever_ibv_qp_attach_comp_cntr_attr { /* ibv_qp_attach_comp_cntr_attr */
  uint32_t comp_mask;
  uint32_t op_mask;
} lever_ibv_qp_attach_comp_cntr_attr;

typedef struct lever_efadv_memory_location { /* efadv_memory_location */
  uint8_t* ptr;
  struct {
    uint64_t offset;
    int32_t fd;
    uint32_t reserved;
  } dmabuf;
  uint8_t type;
  uint8_t reserved[7];
} lever_efadv_memory_location;

typedef struct lever_efadv_comp_cntr_init_attr { /* efadv_comp_cntr_init_attr */
  uint64_t comp_mask;
  uint32_t flags;
  uint32_t reserved;
  lever_efadv_memory_location comp_cntr_ext_mem;
  lever_efadv_memory_location err_cntr_ext_mem;
} lever_efadv_comp_cntr_init_attr;

/* the entry points, as host.cpp calls them through dlsym (struct ibv_comp_cntr is opaque here) */
typedef void* (*lever_efadv_create_comp_cntr_fn)(void* ibvctx, lever_ibv_comp_cntr_init_attr* attr,
                                                 lever_efadv_comp_cntr_init_attr* efa_attr, uint32_t inlen);
typedef int (*lever_ibv_qp_attach_comp_cntr_fn)(void* qp, void* comp_cntr,
                                                lever_ibv_qp_attach_comp_cntr_attr* attr);
typedef int (*lever_ibv_destroy_comp_cntr_fn)(void* comp_cntr);

#ifdef __cplusplus
static_assert(sizeof(lever_efadv_memory_location) == 32, "efadv_memory_location is 32 bytes");
static_assert(sizeof(lever_efadv_comp_cntr_init_attr) == 80, "efadv_comp_cntr_init_attr is 80 bytes");
}
#endif

#endif /* LEVER_EFA_NEWER_VERBS_H */
