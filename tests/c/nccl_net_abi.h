/* Rivet's own C declarations of NCCL's net plugin ABI, v6 … v12, written from the documented
 * x86-64 layouts (shared/reference/nccl-net-api.md §1). Used by the loader test and the
 * conformance suite; not copied from NCCL's headers. */
#ifndef RIVET_NCCL_NET_ABI_H
#define RIVET_NCCL_NET_ABI_H

#include <stddef.h>
#include <stdint.h>

typedef int nccl_result;
enum { NCCL_OK = 0, NCCL_SYSTEM_ERROR = 2, NCCL_INTERNAL_ERROR = 3, NCCL_INVALID_ARGUMENT = 4,
       NCCL_INVALID_USAGE = 5, NCCL_REMOTE_ERROR = 6 };
enum { LOG_NONE = 0, LOG_VERSION = 1, LOG_WARN = 2, LOG_INFO = 3, LOG_ABORT = 4, LOG_TRACE = 5 };
#define NET_HANDLE_MAXSIZE 128
#define PTR_HOST 0x1
#define OPTIONAL_RECV_COMPLETION ((void*)0x1)

typedef void (*nccl_logger)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);
typedef nccl_result (*nccl_profiler_cb)(void** ehandle, int type, void* phandle, int64_t plugin_id, void* ext);

/* Profiler events for network work (v10+): the plugin id and descriptor NCCL's IB transport uses
 * (NCCL_PROFILER_NET_TYPE_IB | NCCL_PROFILER_NET_IB_VER, ncclProfilerNetIbDescr_v1_t). */
#define PROFILER_NET_TYPE_IB (1 << 16)
#define PROFILER_NET_IB_VER 1
enum { PROFILER_NET_EVENT_START = 0, PROFILER_NET_EVENT_STOP = 1 };
enum { PROFILE_QP = 1 };
typedef struct {
  uint8_t type;
  union {
    struct { int device; uint64_t wr_id; int opcode; int qp_num; size_t length; } qp;
  };
} profiler_net_ib_descr_v1;
_Static_assert(sizeof(profiler_net_ib_descr_v1) == 40, "ib descr size");
_Static_assert(offsetof(profiler_net_ib_descr_v1, qp.wr_id) == 16, "ib descr wr_id");
_Static_assert(offsetof(profiler_net_ib_descr_v1, qp.opcode) == 24, "ib descr opcode");
_Static_assert(offsetof(profiler_net_ib_descr_v1, qp.qp_num) == 28, "ib descr qp_num");
_Static_assert(offsetof(profiler_net_ib_descr_v1, qp.length) == 32, "ib descr length");

typedef struct { int type; int version; void* handle; size_t size; int needs_proxy_progress; } net_device_handle;
typedef struct { int ndevs; int devs[4]; } vdevice_props_v9;
typedef struct { int ndevs; int devs[8]; } vdevice_props_v12;
typedef struct { int traffic_class; } comm_config;
typedef struct { int32_t max_peers, min_peers, max_flows, min_flows; } comm_attr;
typedef struct { comm_attr send, recv; uint32_t op, algo, proto; } net_attr;

typedef struct { char* name; char* pci_path; uint64_t guid; int ptr_support; int speed; int port; float latency;
                 int max_comms; int max_recvs; } props_v6;
typedef struct { char* name; char* pci_path; uint64_t guid; int ptr_support; int speed; int port; float latency;
                 int max_comms; int max_recvs; int dev_type; int dev_version; } props_v7;
typedef struct { char* name; char* pci_path; uint64_t guid; int ptr_support; int reg_is_global; int speed; int port;
                 float latency; int max_comms; int max_recvs; int dev_type; int dev_version; } props_v8;
typedef struct { char* name; char* pci_path; uint64_t guid; int ptr_support; int reg_is_global; int force_flush;
                 int speed; int port; float latency; int max_comms; int max_recvs; int dev_type; int dev_version;
                 vdevice_props_v9 vprops; size_t max_p2p_bytes; size_t max_coll_bytes; } props_v9; /* = v10 */
typedef struct { char* name; char* pci_path; uint64_t guid; int ptr_support; int reg_is_global; int force_flush;
                 int speed; int port; float latency; int max_comms; int max_recvs; int dev_type; int dev_version;
                 vdevice_props_v9 vprops; size_t max_p2p_bytes; size_t max_coll_bytes;
                 int max_multi_request_size; } props_v11;
typedef struct { char* name; char* pci_path; uint64_t guid; int ptr_support; int reg_is_global; int force_flush;
                 int speed; int port; float latency; int max_comms; int max_recvs; int dev_type; int dev_version;
                 vdevice_props_v12 vprops; size_t max_p2p_bytes; size_t max_coll_bytes;
                 int max_multi_request_size; int16_t rail_id; int16_t plane_id; } props_v12;

_Static_assert(sizeof(props_v6) == 48, "v6 properties");
_Static_assert(sizeof(props_v7) == 56, "v7 properties");
_Static_assert(sizeof(props_v8) == 64, "v8 properties");
_Static_assert(sizeof(props_v9) == 104, "v9/v10 properties");
_Static_assert(sizeof(props_v11) == 112, "v11 properties");
_Static_assert(sizeof(props_v12) == 128, "v12 properties");
_Static_assert(offsetof(props_v12, rail_id) == 124, "v12 railId");

/* Function-table members common to all versions, spelled per version below. */
typedef struct {
  const char* name;
  nccl_result (*init)(nccl_logger);
  nccl_result (*devices)(int*);
  nccl_result (*get_properties)(int, props_v6*);
  nccl_result (*listen)(int, void*, void**);
  nccl_result (*connect)(int, void*, void**);
  nccl_result (*accept)(void*, void**);
  nccl_result (*reg_mr)(void*, void*, int, int, void**);
  nccl_result (*reg_mr_dma_buf)(void*, void*, size_t, int, uint64_t, int, void**);
  nccl_result (*dereg_mr)(void*, void*);
  nccl_result (*isend)(void*, void*, int, int, void*, void**);
  nccl_result (*irecv)(void*, int, void**, int*, int*, void**, void**);
  nccl_result (*iflush)(void*, int, void**, int*, void**, void**);
  nccl_result (*test)(void*, int*, int*);
  nccl_result (*close_send)(void*);
  nccl_result (*close_recv)(void*);
  nccl_result (*close_listen)(void*);
} net_v6;

typedef struct {
  const char* name;
  nccl_result (*init)(nccl_logger);
  nccl_result (*devices)(int*);
  nccl_result (*get_properties)(int, props_v7*);
  nccl_result (*listen)(int, void*, void**);
  nccl_result (*connect)(int, void*, void**, net_device_handle**);
  nccl_result (*accept)(void*, void**, net_device_handle**);
  nccl_result (*reg_mr)(void*, void*, int, int, void**);
  nccl_result (*reg_mr_dma_buf)(void*, void*, size_t, int, uint64_t, int, void**);
  nccl_result (*dereg_mr)(void*, void*);
  nccl_result (*isend)(void*, void*, int, int, void*, void**);
  nccl_result (*irecv)(void*, int, void**, int*, int*, void**, void**);
  nccl_result (*iflush)(void*, int, void**, int*, void**, void**);
  nccl_result (*test)(void*, int*, int*);
  nccl_result (*close_send)(void*);
  nccl_result (*close_recv)(void*);
  nccl_result (*close_listen)(void*);
  nccl_result (*get_device_mr)(void*, void*, void**);
  nccl_result (*irecv_consumed)(void*, int, void*);
} net_v7;

typedef struct {
  const char* name;
  nccl_result (*init)(nccl_logger);
  nccl_result (*devices)(int*);
  nccl_result (*get_properties)(int, props_v8*);
  nccl_result (*listen)(int, void*, void**);
  nccl_result (*connect)(int, void*, void**, net_device_handle**);
  nccl_result (*accept)(void*, void**, net_device_handle**);
  nccl_result (*reg_mr)(void*, void*, size_t, int, void**);
  nccl_result (*reg_mr_dma_buf)(void*, void*, size_t, int, uint64_t, int, void**);
  nccl_result (*dereg_mr)(void*, void*);
  nccl_result (*isend)(void*, void*, int, int, void*, void**);
  nccl_result (*irecv)(void*, int, void**, int*, int*, void**, void**);
  nccl_result (*iflush)(void*, int, void**, int*, void**, void**);
  nccl_result (*test)(void*, int*, int*);
  nccl_result (*close_send)(void*);
  nccl_result (*close_recv)(void*);
  nccl_result (*close_listen)(void*);
  nccl_result (*get_device_mr)(void*, void*, void**);
  nccl_result (*irecv_consumed)(void*, int, void*);
} net_v8;

typedef struct {
  const char* name;
  nccl_result (*init)(nccl_logger);
  nccl_result (*devices)(int*);
  nccl_result (*get_properties)(int, props_v9*);
  nccl_result (*listen)(int, void*, void**);
  nccl_result (*connect)(int, void*, void**, net_device_handle**);
  nccl_result (*accept)(void*, void**, net_device_handle**);
  nccl_result (*reg_mr)(void*, void*, size_t, int, void**);
  nccl_result (*reg_mr_dma_buf)(void*, void*, size_t, int, uint64_t, int, void**);
  nccl_result (*dereg_mr)(void*, void*);
  nccl_result (*isend)(void*, void*, size_t, int, void*, void**);
  nccl_result (*irecv)(void*, int, void**, size_t*, int*, void**, void**);
  nccl_result (*iflush)(void*, int, void**, int*, void**, void**);
  nccl_result (*test)(void*, int*, int*);
  nccl_result (*close_send)(void*);
  nccl_result (*close_recv)(void*);
  nccl_result (*close_listen)(void*);
  nccl_result (*get_device_mr)(void*, void*, void**);
  nccl_result (*irecv_consumed)(void*, int, void*);
  nccl_result (*make_vdevice)(int*, vdevice_props_v9*);
} net_v9;

typedef struct {
  const char* name;
  nccl_result (*init)(nccl_logger, nccl_profiler_cb);
  nccl_result (*devices)(int*);
  nccl_result (*get_properties)(int, props_v9*);
  nccl_result (*listen)(int, void*, void**);
  nccl_result (*connect)(int, comm_config*, void*, void**, net_device_handle**);
  nccl_result (*accept)(void*, void**, net_device_handle**);
  nccl_result (*reg_mr)(void*, void*, size_t, int, void**);
  nccl_result (*reg_mr_dma_buf)(void*, void*, size_t, int, uint64_t, int, void**);
  nccl_result (*dereg_mr)(void*, void*);
  nccl_result (*isend)(void*, void*, size_t, int, void*, void*, void**);
  nccl_result (*irecv)(void*, int, void**, size_t*, int*, void**, void**, void**);
  nccl_result (*iflush)(void*, int, void**, int*, void**, void**);
  nccl_result (*test)(void*, int*, int*);
  nccl_result (*close_send)(void*);
  nccl_result (*close_recv)(void*);
  nccl_result (*close_listen)(void*);
  nccl_result (*get_device_mr)(void*, void*, void**);
  nccl_result (*irecv_consumed)(void*, int, void*);
  nccl_result (*make_vdevice)(int*, vdevice_props_v9*);
} net_v10;

#define NET_V11_LIKE(type_name, props_t, vprops_t)                                              \
  typedef struct {                                                                              \
    const char* name;                                                                           \
    nccl_result (*init)(void**, uint64_t, comm_config*, nccl_logger, nccl_profiler_cb);         \
    nccl_result (*devices)(int*);                                                               \
    nccl_result (*get_properties)(int, props_t*);                                               \
    nccl_result (*listen)(void*, int, void*, void**);                                           \
    nccl_result (*connect)(void*, int, void*, void**, net_device_handle**);                     \
    nccl_result (*accept)(void*, void**, net_device_handle**);                                  \
    nccl_result (*reg_mr)(void*, void*, size_t, int, void**);                                   \
    nccl_result (*reg_mr_dma_buf)(void*, void*, size_t, int, uint64_t, int, void**);            \
    nccl_result (*dereg_mr)(void*, void*);                                                      \
    nccl_result (*isend)(void*, void*, size_t, int, void*, void*, void**);                      \
    nccl_result (*irecv)(void*, int, void**, size_t*, int*, void**, void**, void**);            \
    nccl_result (*iflush)(void*, int, void**, int*, void**, void**);                            \
    nccl_result (*test)(void*, int*, int*);                                                     \
    nccl_result (*close_send)(void*);                                                           \
    nccl_result (*close_recv)(void*);                                                           \
    nccl_result (*close_listen)(void*);                                                         \
    nccl_result (*get_device_mr)(void*, void*, void**);                                         \
    nccl_result (*irecv_consumed)(void*, int, void*);                                           \
    nccl_result (*make_vdevice)(int*, vprops_t*);                                               \
    nccl_result (*finalize)(void*);                                                             \
    nccl_result (*set_net_attr)(void*, net_attr*);                                              \
  } type_name;
NET_V11_LIKE(net_v11, props_v11, vdevice_props_v9)
NET_V11_LIKE(net_v12, props_v12, vdevice_props_v12)

_Static_assert(sizeof(net_v6) == 136, "v6 table");
_Static_assert(sizeof(net_v7) == 152, "v7 table");
_Static_assert(sizeof(net_v8) == 152, "v8 table");
_Static_assert(sizeof(net_v9) == 160, "v9 table");
_Static_assert(sizeof(net_v10) == 160, "v10 table");
_Static_assert(sizeof(net_v11) == 176, "v11 table");
_Static_assert(sizeof(net_v12) == 176, "v12 table");

#endif
