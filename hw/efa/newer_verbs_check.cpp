// Compiled check of hw/efa/newer_verbs.h against a newer rdma-core's own headers: the
// declarations host.cpp uses for 128-byte WQEs with inline writes (v63) and completion
// counters (after v64), which v59's headers lack. Compiles iff they agree.
//
//   g++ -std=c++17 -fsyntax-only -I<tree include> hw/efa/newer_verbs_check.cpp
//
// -DLEVER_EFA_CHECK_COMP_CNTR adds the completion-counter checks (a tree after v64);
// -DLEVER_EFA_SKEW_CNTR=N shifts the expected offset of err_cntr_ext_mem (test hook: the
// check must then fail). Built by tests/test_hw_efa128.py where $LEVER_RDMA_CORE_TREE names
// a tree (no registry carries one newer than v59).
#include <stddef.h>
#include <stdint.h>

#include <type_traits>

#include <infiniband/efadv.h>
#include <infiniband/verbs.h>

#include "newer_verbs.h"

#ifndef LEVER_EFA_SKEW_CNTR
#define LEVER_EFA_SKEW_CNTR 0
#endif

#define MSIZE(t, f) sizeof(((t*)0)->f)
#define SAME(lt, lf, pt, pf)                                                                    \
  static_assert(offsetof(lt, lf) == offsetof(pt, pf) && MSIZE(lt, lf) == MSIZE(pt, pf),       \
                #lt "." #lf ": offset or size differs from the provider's " #pt "." #pf)

// ---- v63: inline writes, 128-byte WQEs
static_assert(LEVER_EFADV_QP_FLAGS_INLINE_WRITE == EFADV_QP_FLAGS_INLINE_WRITE, "inline-write QP flag differs");
static_assert(offsetof(efadv_device_attr, inline_buf_size_ex) == LEVER_EFADV_DEVICE_ATTR_INLINE_BUF_SIZE_EX_OFFSET &&
                  sizeof(((efadv_device_attr*)0)->inline_buf_size_ex) == 2,
              "efadv_device_attr.inline_buf_size_ex is not where newer_verbs.h reads it");

#ifdef LEVER_EFA_CHECK_COMP_CNTR
// ---- after v64: completion counters
static_assert(LEVER_EFADV_DEVICE_ATTR_CAPS_COMP_CNTR == EFADV_DEVICE_ATTR_CAPS_COMP_CNTR, "COMP_CNTR cap differs");
static_assert(LEVER_IBV_COMP_CNTR_TYPE_WRS == IBV_COMP_CNTR_TYPE_WRS, "IBV_COMP_CNTR_TYPE_WRS differs");
static_assert(LEVER_IBV_QP_ATTACH_COMP_CNTR_OP_RDMA_WRITE == IBV_QP_ATTACH_COMP_CNTR_OP_RDMA_WRITE,
              "attach op RDMA_WRITE differs");
static_assert(LEVER_IBV_QP_ATTACH_COMP_CNTR_OP_REMOTE_RDMA_WRITE == IBV_QP_ATTACH_COMP_CNTR_OP_REMOTE_RDMA_WRITE,
              "attach op REMOTE_RDMA_WRITE differs");
static_assert(LEVER_EFADV_COMP_CNTR_INIT_WITH_COMP_EXTERNAL_MEM == EFADV_COMP_CNTR_INIT_WITH_COMP_EXTERNAL_MEM &&
                  LEVER_EFADV_COMP_CNTR_INIT_WITH_ERR_EXTERNAL_MEM == EFADV_COMP_CNTR_INIT_WITH_ERR_EXTERNAL_MEM,
              "counter external-memory flags differ");
static_assert(LEVER_EFADV_MEMORY_LOCATION_VA == EFADV_MEMORY_LOCATION_VA &&
                  LEVER_EFADV_MEMORY_LOCATION_DMABUF == EFADV_MEMORY_LOCATION_DMABUF,
              "memory location types differ");

SAME(lever_ibv_comp_cntr_init_attr, comp_mask, ibv_comp_cntr_init_attr, comp_mask);
SAME(lever_ibv_comp_cntr_init_attr, type, ibv_comp_cntr_init_attr, type);
SAME(lever_ibv_comp_cntr_init_attr, flags, ibv_comp_cntr_init_attr, flags);
static_assert(sizeof(lever_ibv_comp_cntr_init_attr) == sizeof(ibv_comp_cntr_init_attr), "ibv_comp_cntr_init_attr size");

SAME(lever_ibv_qp_attach_comp_cntr_attr, comp_mask, ibv_qp_attach_comp_cntr_attr, comp_mask);
SAME(lever_ibv_qp_attach_comp_cntr_attr, op_mask, ibv_qp_attach_comp_cntr_attr, op_mask);
static_assert(sizeof(lever_ibv_qp_attach_comp_cntr_attr) == sizeof(ibv_qp_attach_comp_cntr_attr),
              "ibv_qp_attach_comp_cntr_attr size");

SAME(lever_efadv_memory_location, ptr, efadv_memory_location, ptr);
SAME(lever_efadv_memory_location, dmabuf.offset, efadv_memory_location, dmabuf.offset);
SAME(lever_efadv_memory_location, dmabuf.fd, efadv_memory_location, dmabuf.fd);
SAME(lever_efadv_memory_location, type, efadv_memory_location, type);
static_assert(sizeof(lever_efadv_memory_location) == sizeof(efadv_memory_location), "efadv_memory_location size");

SAME(lever_efadv_comp_cntr_init_attr, comp_mask, efadv_comp_cntr_init_attr, comp_mask);
SAME(lever_efadv_comp_cntr_init_attr, flags, efadv_comp_cntr_init_attr, flags);
SAME(lever_efadv_comp_cntr_init_attr, comp_cntr_ext_mem, efadv_comp_cntr_init_attr, comp_cntr_ext_mem);
static_assert(offsetof(lever_efadv_comp_cntr_init_attr, err_cntr_ext_mem) + LEVER_EFA_SKEW_CNTR ==
                  offsetof(efadv_comp_cntr_init_attr, err_cntr_ext_mem),
              "lever_efadv_comp_cntr_init_attr.err_cntr_ext_mem: offset differs from the provider's");
static_assert(sizeof(lever_efadv_comp_cntr_init_attr) == sizeof(efadv_comp_cntr_init_attr),
              "efadv_comp_cntr_init_attr size");

// the entry points host.cpp resolves have the signatures its function types say
static_assert(sizeof(&efadv_create_comp_cntr) == sizeof(lever_efadv_create_comp_cntr_fn), "fn");
static_assert(sizeof(&ibv_qp_attach_comp_cntr) == sizeof(lever_ibv_qp_attach_comp_cntr_fn), "fn");
static_assert(std::is_same<decltype(&efadv_create_comp_cntr),
                           ibv_comp_cntr* (*)(ibv_context*, ibv_comp_cntr_init_attr*, efadv_comp_cntr_init_attr*,
                                              uint32_t)>::value,
              "efadv_create_comp_cntr's signature differs");
static_assert(std::is_same<decltype(&ibv_qp_attach_comp_cntr),
                           int (*)(ibv_qp*, ibv_comp_cntr*, ibv_qp_attach_comp_cntr_attr*)>::value,
              "ibv_qp_attach_comp_cntr's signature differs");
static_assert(std::is_same<decltype(&ibv_destroy_comp_cntr), int (*)(ibv_comp_cntr*)>::value,
              "ibv_destroy_comp_cntr's signature differs");
int lever_efa_newer_verbs_comp_cntr_checked() { return 1; }
#endif

int lever_efa_newer_verbs_checked() { return 1; }
