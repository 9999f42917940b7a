/* Rivet's own C declarations of NCCL's CollNet plugin ABI, ncclCollNet_v6_t ... ncclCollNet_v12_t,
 * written from NCCL's net_v6.h ... net_v12.h layouts (shared/reference/nccl-net-api.md §1.6). Used
 * by the loader test and the CollNet conformance program. */
#ifndef RIVET_NCCL_COLLNET_ABI_H
#define RIVET_NCCL_COLLNET_ABI_H
#include "nccl_net_abi.h"

/* ncclDataType_t and ncclRedOp_t values. */
enum { DT_INT8 = 0, DT_UINT8, DT_INT32, DT_UINT32, DT_INT64, DT_UINT64, DT_FLOAT16, DT_FLOAT32, DT_FLOAT64,
       DT_BFLOAT16, DT_FP8E4M3, DT_FP8E5M2, DT_COUNT };
enum { OP_SUM = 0, OP_PROD = 1, OP_MAX = 2, OP_MIN = 3, OP_AVG = 4, OP_COUNT };

typedef struct { void* mhandle; void* address; uint32_t size; } sge_v8;
typedef struct { void* mhandle; void* address; size_t size; } sge_v9;
_Static_assert(sizeof(sge_v8) == 24 && offsetof(sge_v8, size) == 16, "ncclNetSGE_v8_t");
_Static_assert(sizeof(sge_v9) == 24 && offsetof(sge_v9, size) == 16, "ncclNetSGE_v9_t");

#define COLLNET_COMMON(props_t)                                                              \
  const char* name;                                                                          \
  nccl_result (*init)(nccl_logger);                                                          \
  nccl_result (*devices)(int*);                                                              \
  nccl_result (*get_properties)(int, props_t*);                                              \
  nccl_result (*listen)(int, void*, void**);                                                 \
  nccl_result (*connect)(void**, int, int, void*, void**);                                   \
  nccl_result (*reduce_support)(int, int, int*);

typedef struct {
  COLLNET_COMMON(props_v6)
  nccl_result (*reg_mr)(void*, void*, int, int, void**);
  nccl_result (*reg_mr_dma_buf)(void*, void*, size_t, int, uint64_t, int, void**);
  nccl_result (*dereg_mr)(void*, void*);
  nccl_result (*iallreduce)(void*, void*, void*, int, int, int, void*, void*, void**);
  nccl_result (*iflush)(void*, void*, int, void*, void**);
  nccl_result (*test)(void*, int*, int*);
  nccl_result (*close_coll)(void*);
  nccl_result (*close_listen)(void*);
} collnet_v6;

typedef struct {
  COLLNET_COMMON(props_v7)
  nccl_result (*reg_mr)(void*, void*, int, int, void**);
  nccl_result (*reg_mr_dma_buf)(void*, void*, size_t, int, uint64_t, int, void**);
  nccl_result (*dereg_mr)(void*, void*);
  nccl_result (*iallreduce)(void*, void*, void*, int, int, int, void*, void*, void**);
  nccl_result (*iflush)(void*, void*, int, void*, void**);
  nccl_result (*test)(void*, int*, int*);
  nccl_result (*close_coll)(void*);
  nccl_result (*close_listen)(void*);
} collnet_v7;

typedef struct {
  COLLNET_COMMON(props_v8)
  nccl_result (*reg_mr)(void*, void*, size_t, int, void**);
  nccl_result (*reg_mr_dma_buf)(void*, void*, size_t, int, uint64_t, int, void**);
  nccl_result (*dereg_mr)(void*, void*);
  nccl_result (*iallreduce)(void*, void*, void*, int, int, int, void*, void*, void**);
  nccl_result (*iallgather)(void*, void*, int, sge_v8*, size_t, size_t, size_t, void*, void**);
  nccl_result (*ireducescatter)(void*, int, sge_v8*, void*, size_t, size_t, size_t, int, int, void*, void**);
  nccl_result (*iflush)(void*, void*, int, void*, void**);
  nccl_result (*test)(void*, int*, int*);
  nccl_result (*close_coll)(void*);
  nccl_result (*close_listen)(void*);
} collnet_v8;

/* v9 and v10 (v10's properties are v9's). */
typedef struct {
  COLLNET_COMMON(props_v9)
  nccl_result (*reg_mr)(void*, void*, size_t, int, void**);
  nccl_result (*reg_mr_dma_buf)(void*, void*, size_t, int, uint64_t, int, void**);
  nccl_result (*dereg_mr)(void*, void*);
  nccl_result (*iallreduce)(void*, void*, void*, size_t, int, int, void*, void*, void**);
  nccl_result (*iallgather)(void*, void*, int, sge_v9*, size_t, size_t, size_t, void*, void**);
  nccl_result (*ireducescatter)(void*, int, sge_v9*, void*, size_t, size_t, size_t, int, int, void*, void**);
  nccl_result (*iflush)(void*, void*, int, void*, void**);
  nccl_result (*test)(void*, int*, int*);
  nccl_result (*close_coll)(void*);
  nccl_result (*close_listen)(void*);
  nccl_result (*make_vdevice)(int*, vdevice_props_v9*);
} collnet_v9;

#define COLLNET_V11_LIKE(type_name, props_t, vprops_t)                                         \
  typedef struct {                                                                           \
    const char* name;                                                                        \
    nccl_result (*init)(void**, uint64_t, nccl_logger);                                      \
    nccl_result (*devices)(int*);                                                            \
    nccl_result (*get_properties)(int, props_t*);                                            \
    nccl_result (*listen)(void*, int, void*, void**);                                        \
    nccl_result (*connect)(void**, int, int, void*, void**);                                 \
    nccl_result (*reduce_support)(int, int, int*);                                           \
    nccl_result (*reg_mr)(void*, void*, size_t, int, void**);                                \
    nccl_result (*reg_mr_dma_buf)(void*, void*, size_t, int, uint64_t, int, void**);         \
    nccl_result (*dereg_mr)(void*, void*);                                                   \
    nccl_result (*iallreduce)(void*, void*, void*, size_t, int, int, void*, void*, void**);  \
    nccl_result (*iallgather)(void*, void*, int, sge_v9*, size_t, size_t, size_t, void*, void**); \
    nccl_result (*ireducescatter)(void*, int, sge_v9*, void*, size_t, size_t, size_t, int, int, void*, \
                                  void**);                                                   \
    nccl_result (*iflush)(void*, void*, int, void*, void**);                                 \
    nccl_result (*test)(void*, int*, int*);                                                  \
    nccl_result (*close_coll)(void*);                                                        \
    nccl_result (*close_listen)(void*);                                                      \
    nccl_result (*make_vdevice)(int*, vprops_t*);                                            \
    nccl_result (*finalize)(void*);                                                          \
  } type_name;
COLLNET_V11_LIKE(collnet_v11, props_v11, vdevice_props_v9)
COLLNET_V11_LIKE(collnet_v12, props_v12, vdevice_props_v12)

_Static_assert(sizeof(collnet_v6) == 120, "ncclCollNet_v6_t");
_Static_assert(sizeof(collnet_v7) == 120, "ncclCollNet_v7_t");
_Static_assert(sizeof(collnet_v8) == 136, "ncclCollNet_v8_t");
_Static_assert(offsetof(collnet_v8, iallgather) == 88, "v8 iallgather");
_Static_assert(sizeof(collnet_v9) == 144, "ncclCollNet_v9_t");
_Static_assert(offsetof(collnet_v9, make_vdevice) == 136, "v9 makeVDevice");
_Static_assert(sizeof(collnet_v11) == 152, "ncclCollNet_v11_t");
_Static_assert(sizeof(collnet_v12) == 152, "ncclCollNet_v12_t");
_Static_assert(offsetof(collnet_v12, finalize) == 144, "v12 finalize");
#endif
