/* Rivet's own C declarations of NCCL's RMA plugin ABI: the host-proxy one-sided tables
 * ncclRma_v13_t (NCCL's GIN v13 layout) ... ncclRma_v16_t, written from the documented x86-64
 * layouts (NCCL 2.30.7 and its development tree), not copied from NCCL's headers. Used by the
 * loader test and the RMA conformance program (tests/c/rma.c).
 *
 * Every table: name, then 20 entries (v13 ... v15: 21 pointer-sized slots, 168 bytes); v16 adds
 * getRmaProperties after devices (22 slots, 176 bytes). */
#ifndef RIVET_NCCL_RMA_ABI_H
#define RIVET_NCCL_RMA_ABI_H
#include <stdbool.h>
#include "nccl_net_abi.h"

/* ncclNetDeviceType: what getProperties(0).netDeviceType must say for NCCL to keep the table. */
enum { NET_DEVICE_HOST = 0, NET_DEVICE_UNPACK = 1, NET_DEVICE_GIN_PROXY = 2 };
/* Memory types of regMrSym. */
enum { RMA_PTR_HOST = 0x1, RMA_PTR_CUDA = 0x2, RMA_PTR_DMABUF = 0x4 };
/* mrFlags of regMrSym. */
enum { RMA_MR_FLAG_FORCE_SO = 0x1, RMA_MR_FLAG_SIGNAL_NEVER_RESET = 0x2 };
/* signalOp of iputSignal: INC adds 1, ADD adds signalValue (64-bit, at signalOff). */
enum { RMA_SIGNAL_OP_INC = 0x1, RMA_SIGNAL_OP_ADD = 0x2 };
/* optFlags of v15+ iput/iputSignal/iget. */
enum { RMA_OPT_DEFAULT = 0, RMA_OPT_AGGREGATE_REQUESTS = 0x1 };
#define RMA_HANDLE_MAXSIZE 128

/* ncclGinConfig_v13_t. */
typedef struct { int n_signals; int n_counters; int n_contexts; int queue_depth; int traffic_class; } gin_config_v13;
/* ncclRmaConfig_v14_t (= v15's and v16's). */
typedef struct { int n_contexts; int traffic_class; int rank_stride; } rma_config_v14;
/* ncclRmaProperties_v16_t. */
typedef struct { bool flushes_all_puts_on_any_signal; } rma_properties_v16;

_Static_assert(sizeof(gin_config_v13) == 20, "ncclGinConfig_v13_t");
_Static_assert(offsetof(gin_config_v13, n_contexts) == 8, "v13 config nContexts");
_Static_assert(offsetof(gin_config_v13, traffic_class) == 16, "v13 config trafficClass");
_Static_assert(sizeof(rma_config_v14) == 12, "ncclRmaConfig_v14_t");
_Static_assert(offsetof(rma_config_v14, traffic_class) == 4, "v14 config trafficClass");
_Static_assert(offsetof(rma_config_v14, rank_stride) == 8, "v14 config rankStride");
_Static_assert(sizeof(rma_properties_v16) == 1, "ncclRmaProperties_v16_t");
/* ncclNetDeviceHandle_v11_t, which v13's createContext hands out. */
_Static_assert(sizeof(net_device_handle) == 32, "ncclNetDeviceHandle_v11_t");
_Static_assert(offsetof(net_device_handle, handle) == 8, "devHandle handle");
_Static_assert(offsetof(net_device_handle, size) == 16, "devHandle size");
_Static_assert(offsetof(net_device_handle, needs_proxy_progress) == 24, "devHandle needsProxyProgress");

/* The slots every version shares, up to getProperties (v16 inserts getRmaProperties before it). */
#define RMA_HEAD                                                                                  \
  const char* name;                                                                               \
  nccl_result (*init)(void** ctx, uint64_t comm_id, nccl_logger log);                             \
  nccl_result (*devices)(int* ndev);

#define RMA_CONNECT                                                                               \
  nccl_result (*get_properties)(int dev, props_v12* props);                                       \
  nccl_result (*listen)(void* ctx, int dev, void* handle, void** listen_comm);                    \
  nccl_result (*connect)(void* ctx, void* handles[], int nranks, int rank, void* listen_comm,     \
                         void** coll_comm);

#define RMA_CLOSE                                                                                 \
  nccl_result (*dereg_mr_sym)(void* coll_comm, void* mhandle);                                    \
  nccl_result (*destroy_context)(void* rma_ctx);                                                  \
  nccl_result (*close_coll)(void* coll_comm);                                                     \
  nccl_result (*close_listen)(void* listen_comm);

#define RMA_TAIL                                                                                  \
  nccl_result (*iflush)(void* rma_ctx, int context, void* mhandle, uint32_t rank, void** request); \
  nccl_result (*test)(void* coll_comm, void* request, int* done);                                 \
  nccl_result (*progress)(void* rma_ctx);                                                         \
  nccl_result (*query_last_error)(void* rma_ctx, bool* has_error);                                \
  nccl_result (*finalize)(void* ctx);

/* ncclRma_v13_t = ncclGin_v13_t: devHandle and ginHandle out-params, no isStrongSignal, no
 * optFlags; the progress slot is ginProgress. */
typedef struct {
  RMA_HEAD
  RMA_CONNECT
  nccl_result (*create_context)(void* coll_comm, gin_config_v13* config, void** ctx, net_device_handle** dev_handle);
  nccl_result (*reg_mr_sym)(void* coll_comm, void* data, size_t size, int type, uint64_t mr_flags, void** mhandle,
                            void** gin_handle);
  nccl_result (*reg_mr_sym_dma_buf)(void* coll_comm, void* data, size_t size, int type, uint64_t offset, int fd,
                                    uint64_t mr_flags, void** mhandle, void** gin_handle);
  RMA_CLOSE
  nccl_result (*iput)(void* ctx, int context, uint64_t src_off, void* src_mh, size_t size, uint64_t dst_off,
                      void* dst_mh, uint32_t rank, void** request);
  nccl_result (*iput_signal)(void* ctx, int context, uint64_t src_off, void* src_mh, size_t size, uint64_t dst_off,
                             void* dst_mh, uint32_t rank, uint64_t signal_off, void* signal_mh, uint64_t signal_value,
                             uint32_t signal_op, void** request);
  nccl_result (*iget)(void* ctx, int context, uint64_t remote_off, void* remote_mh, size_t size, uint64_t local_off,
                      void* local_mh, uint32_t rank, void** request);
  RMA_TAIL
} rma_v13;

#define RMA_V14_REG                                                                               \
  nccl_result (*create_context)(void* coll_comm, rma_config_v14* config, void** rma_ctx);         \
  nccl_result (*reg_mr_sym)(void* coll_comm, void* data, size_t size, int type, uint64_t mr_flags, \
                            void** mhandle);                                                      \
  nccl_result (*reg_mr_sym_dma_buf)(void* coll_comm, void* data, size_t size, int type,           \
                                    uint64_t offset, int fd, uint64_t mr_flags, void** mhandle);

typedef struct {
  RMA_HEAD
  RMA_CONNECT
  RMA_V14_REG
  RMA_CLOSE
  nccl_result (*iput)(void* rma_ctx, int context, uint64_t src_off, void* src_mh, size_t size, uint64_t dst_off,
                      void* dst_mh, uint32_t rank, void** request);
  nccl_result (*iput_signal)(void* rma_ctx, int context, uint64_t src_off, void* src_mh, size_t size,
                             uint64_t dst_off, void* dst_mh, uint32_t rank, uint64_t signal_off, void* signal_mh,
                             uint64_t signal_value, uint32_t signal_op, bool is_strong_signal, void** request);
  nccl_result (*iget)(void* rma_ctx, int context, uint64_t remote_off, void* remote_mh, size_t size,
                      uint64_t local_off, void* local_mh, uint32_t rank, void** request);
  RMA_TAIL
} rma_v14;

/* v15 and v16: optFlags just before the request out-param. */
#define RMA_V15_OPS                                                                               \
  nccl_result (*iput)(void* rma_ctx, int context, uint64_t src_off, void* src_mh, size_t size,    \
                      uint64_t dst_off, void* dst_mh, uint32_t rank, uint32_t opt_flags, void** request); \
  nccl_result (*iput_signal)(void* rma_ctx, int context, uint64_t src_off, void* src_mh, size_t size, \
                             uint64_t dst_off, void* dst_mh, uint32_t rank, uint64_t signal_off,  \
                             void* signal_mh, uint64_t signal_value, uint32_t signal_op,          \
                             bool is_strong_signal, uint32_t opt_flags, void** request);          \
  nccl_result (*iget)(void* rma_ctx, int context, uint64_t remote_off, void* remote_mh, size_t size, \
                      uint64_t local_off, void* local_mh, uint32_t rank, uint32_t opt_flags, void** request);

typedef struct {
  RMA_HEAD
  RMA_CONNECT
  RMA_V14_REG
  RMA_CLOSE
  RMA_V15_OPS
  RMA_TAIL
} rma_v15;

typedef struct {
  RMA_HEAD
  nccl_result (*get_rma_properties)(void* coll_comm, rma_properties_v16* props);
  RMA_CONNECT
  RMA_V14_REG
  RMA_CLOSE
  RMA_V15_OPS
  RMA_TAIL
} rma_v16;

#define RMA_SLOT(i) ((size_t)(i) * sizeof(void*))
/* v13 ... v15: name, init, devices, getProperties, listen, connect, createContext, regMrSym,
 * regMrSymDmaBuf, deregMrSym, destroyContext, closeColl, closeListen, iput, iputSignal, iget,
 * iflush, test, progress, queryLastError, finalize. */
#define RMA_ASSERT_LAYOUT(T, shift)                                                               \
  _Static_assert(sizeof(T) == RMA_SLOT(21 + (shift)), #T " size");                                \
  _Static_assert(offsetof(T, init) == RMA_SLOT(1), #T " init");                                   \
  _Static_assert(offsetof(T, devices) == RMA_SLOT(2), #T " devices");                             \
  _Static_assert(offsetof(T, get_properties) == RMA_SLOT(3 + (shift)), #T " getProperties");      \
  _Static_assert(offsetof(T, listen) == RMA_SLOT(4 + (shift)), #T " listen");                     \
  _Static_assert(offsetof(T, connect) == RMA_SLOT(5 + (shift)), #T " connect");                   \
  _Static_assert(offsetof(T, create_context) == RMA_SLOT(6 + (shift)), #T " createContext");      \
  _Static_assert(offsetof(T, reg_mr_sym) == RMA_SLOT(7 + (shift)), #T " regMrSym");               \
  _Static_assert(offsetof(T, reg_mr_sym_dma_buf) == RMA_SLOT(8 + (shift)), #T " regMrSymDmaBuf"); \
  _Static_assert(offsetof(T, dereg_mr_sym) == RMA_SLOT(9 + (shift)), #T " deregMrSym");           \
  _Static_assert(offsetof(T, destroy_context) == RMA_SLOT(10 + (shift)), #T " destroyContext");   \
  _Static_assert(offsetof(T, close_coll) == RMA_SLOT(11 + (shift)), #T " closeColl");             \
  _Static_assert(offsetof(T, close_listen) == RMA_SLOT(12 + (shift)), #T " closeListen");         \
  _Static_assert(offsetof(T, iput) == RMA_SLOT(13 + (shift)), #T " iput");                        \
  _Static_assert(offsetof(T, iput_signal) == RMA_SLOT(14 + (shift)), #T " iputSignal");           \
  _Static_assert(offsetof(T, iget) == RMA_SLOT(15 + (shift)), #T " iget");                        \
  _Static_assert(offsetof(T, iflush) == RMA_SLOT(16 + (shift)), #T " iflush");                    \
  _Static_assert(offsetof(T, test) == RMA_SLOT(17 + (shift)), #T " test");                        \
  _Static_assert(offsetof(T, progress) == RMA_SLOT(18 + (shift)), #T " progress");                \
  _Static_assert(offsetof(T, query_last_error) == RMA_SLOT(19 + (shift)), #T " queryLastError");  \
  _Static_assert(offsetof(T, finalize) == RMA_SLOT(20 + (shift)), #T " finalize");
RMA_ASSERT_LAYOUT(rma_v13, 0)
RMA_ASSERT_LAYOUT(rma_v14, 0)
RMA_ASSERT_LAYOUT(rma_v15, 0)
RMA_ASSERT_LAYOUT(rma_v16, 1)
_Static_assert(offsetof(rma_v16, get_rma_properties) == RMA_SLOT(3), "rma_v16 getRmaProperties");
_Static_assert(sizeof(rma_v13) == 168 && sizeof(rma_v14) == 168 && sizeof(rma_v15) == 168, "v13-v15: 21 slots");
_Static_assert(sizeof(rma_v16) == 176, "v16: 22 slots");
#endif
