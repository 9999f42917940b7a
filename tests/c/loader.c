/* Loads a net plugin the way NCCL's loader does (dlopen RTLD_NOW|RTLD_LOCAL, dlsym of each
 * ncclNetPlugin_vN), then checks every exported table: name, non-NULL mandatory entries,
 * init/devices behaviour, getProperties writing exactly sizeof(props) bytes, errors (not crashes)
 * for NULL and bogus handles, no thread left behind, and unload/reload. The CollNet tables
 * (ncclCollNetPlugin_vN) are checked the same way, and against the net table of their version:
 * the same devices and properties, reduceSupport for every type and operation. The RMA tables
 * (ncclRmaPlugin_v13 ... v16, host-proxy one-sided operations) are checked for their name, every
 * entry set, init/devices/getProperties(0) answering as NCCL's RMA loader wants (a GIN_PROXY
 * device), and errors for bogus handles; with --minimal, the CollNet and RMA tables must be absent.
 *
 * usage: loader LIB {no-device|devices} [--minimal]
 * Results go to stderr ("PASS ..."/"FAIL ..."), so a test can assert the plugin printed nothing
 * on stdout. Exit status 0 only if every check passed. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "nccl_collnet_abi.h"
#include "nccl_rma_abi.h"

static int failures;
static int expect_devices;
/* --minimal: the library built without the default features (scripts/build-dist.sh --minimal):
 * the net tables alone, no CollNet and no RMA table. */
static int expect_minimal;

#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (cond) {                                            \
      fprintf(stderr, "PASS ");                            \
    } else {                                               \
      fprintf(stderr, "FAIL ");                            \
      failures++;                                          \
    }                                                      \
    fprintf(stderr, __VA_ARGS__);                          \
    fprintf(stderr, "\n");                                 \
  } while (0)

/* The logger NCCL would pass: count lines per level and keep the last one. Rivet's version line
 * ("NET/Rivet: Rivet <version> commit ...", INFO, NET subsystem), which `init` logs before
 * anything can fail, is counted on its own. */
static int log_lines[6];
static int version_lines;
static char last_line[1024];
static void logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)file; (void)line;
  char text[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  if (strncmp(text, "NET/Rivet: Rivet ", 17) == 0 && strstr(text, " commit ") != NULL &&
      level == LOG_INFO && (flags & 0x10) != 0) {
    version_lines++;
    return;
  }
  memcpy(last_line, text, sizeof last_line);
  if (level >= 0 && level < 6) log_lines[level]++;
}
static void reset_log(void) {
  memset(log_lines, 0, sizeof log_lines);
  version_lines = 0;
  last_line[0] = 0;
}

static int thread_count(void) {
  DIR* d = opendir("/proc/self/task");
  int n = 0;
  struct dirent* e;
  if (!d) return -1;
  while ((e = readdir(d))) if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

/* Check an init result against the expected machine. */
static void check_init(int v, nccl_result r) {
  if (expect_devices) {
    CHECK(r == NCCL_OK, "v%d init succeeds on a machine with RDMA devices (got %d: %s)", v, r, last_line);
  } else {
    CHECK(r != NCCL_OK, "v%d init fails cleanly without RDMA devices (got %d)", v, r);
    CHECK(version_lines == 1, "v%d init logs the version line once, at INFO for NET (got %d)", v, version_lines);
    CHECK(log_lines[LOG_WARN] + log_lines[LOG_INFO] == 1, "v%d init logs exactly one line besides it (got %d): %s", v,
          log_lines[LOG_WARN] + log_lines[LOG_INFO], last_line);
    CHECK(strstr(last_line, "RDMA") != NULL || strstr(last_line, "disabled") != NULL,
          "v%d the line says why: %s", v, last_line);
  }
}

/* getProperties(0) into a canary-filled buffer: exactly sizeof(props) bytes may change. */
#define CHECK_PROPS(v, table, props_t)                                                          \
  do {                                                                                          \
    int ndev = -1;                                                                              \
    nccl_result r = table->devices(&ndev);                                                      \
    if (!expect_devices) {                                                                      \
      CHECK(r != NCCL_OK || ndev == 0, "v%d devices() reports none (r=%d n=%d)", v, r, ndev);   \
      break;                                                                                    \
    }                                                                                           \
    CHECK(r == NCCL_OK && ndev >= 1, "v%d devices() >= 1 (r=%d n=%d)", v, r, ndev);             \
    unsigned char buf[sizeof(props_t) + 64];                                                    \
    memset(buf, 0xa5, sizeof buf);                                                              \
    r = table->get_properties(0, (props_t*)buf);                                                \
    props_t p;                                                                                  \
    memcpy(&p, buf, sizeof p);                                                                  \
    int untouched = 1;                                                                          \
    for (size_t i = sizeof(props_t); i < sizeof buf; i++) untouched &= buf[i] == 0xa5;          \
    CHECK(r == NCCL_OK, "v%d getProperties(0) succeeds", v);                                    \
    CHECK(untouched, "v%d getProperties writes no byte past sizeof(props)=%zu", v,              \
          sizeof(props_t));                                                                     \
    CHECK(p.name && p.name[0], "v%d device 0 has a name (%s)", v, p.name ? p.name : "(null)");  \
    CHECK(p.max_recvs == 8 && (p.ptr_support & PTR_HOST) && p.speed > 0,                        \
          "v%d maxRecvs=8, host pointers, speed %d Mb/s", v, p.speed);                          \
    CHECK(table->get_properties(ndev, (props_t*)buf) != NCCL_OK,                                \
          "v%d getProperties(out of range) is an error", v);                                    \
  } while (0)

/* Calls NCCL never makes with valid state must return errors, not crash. */
#define CHECK_BOGUS(v, table, isend_call, irecv_call)                                           \
  do {                                                                                          \
    int done = 0, size = 0;                                                                     \
    void* bogus = (void*)0x12345678;                                                            \
    CHECK(isend_call != NCCL_OK, "v%d isend on a NULL comm is an error", v);                    \
    CHECK(irecv_call != NCCL_OK, "v%d irecv on a bogus comm is an error", v);                   \
    CHECK(table->test(NULL, &done, &size) != NCCL_OK && done == 0, "v%d test(NULL) is an error", v); \
    CHECK(table->test(bogus, &done, &size) != NCCL_OK, "v%d test(bogus) is an error", v);       \
    CHECK(table->close_send(bogus) != NCCL_OK, "v%d closeSend(bogus) is an error", v);          \
    CHECK(table->close_recv(NULL) != NCCL_OK, "v%d closeRecv(NULL) is an error", v);            \
    CHECK(table->close_listen(bogus) != NCCL_OK, "v%d closeListen(bogus) is an error", v);      \
    CHECK(table->dereg_mr(bogus, bogus) != NCCL_OK, "v%d deregMr(bogus) is an error", v);       \
  } while (0)

#define CHECK_COMMON(v, table)                                                                  \
  do {                                                                                          \
    CHECK(table != NULL, "v%d symbol ncclNetPlugin_v%d resolves", v, v);                        \
    if (!table) break;                                                                          \
    CHECK(table->name && strcmp(table->name, "Rivet") == 0, "v%d name is \"Rivet\"", v);        \
    CHECK(table->init && table->devices && table->get_properties && table->listen &&            \
              table->connect && table->accept && table->reg_mr && table->reg_mr_dma_buf &&      \
              table->dereg_mr && table->isend && table->irecv && table->iflush && table->test && \
              table->close_send && table->close_recv && table->close_listen,                    \
          "v%d every mandatory entry is set", v);                                               \
  } while (0)

/* CollNet table of version v beside the net table of the same version: entries set, the same
 * devices and device properties, reduceSupport answers, errors for bogus handles. */
#define CHECK_COLLNET(v, cn, net, props_t, has_fp8, init_expr, done_expr)                        \
  do {                                                                                          \
    CHECK(cn != NULL, "collnet v%d symbol ncclCollNetPlugin_v%d resolves", v, v);               \
    if (!cn || !net) break;                                                                     \
    CHECK(cn->name && strcmp(cn->name, "Rivet") == 0, "collnet v%d name is \"Rivet\"", v);      \
    CHECK(cn->init && cn->devices && cn->get_properties && cn->listen && cn->connect &&         \
              cn->reduce_support && cn->reg_mr && cn->reg_mr_dma_buf && cn->dereg_mr &&         \
              cn->iallreduce && cn->iflush && cn->test && cn->close_coll && cn->close_listen,   \
          "collnet v%d every entry is set", v);                                                 \
    reset_log();                                                                                \
    nccl_result ri = init_expr;                                                                 \
    CHECK(expect_devices ? ri == NCCL_OK : ri != NCCL_OK, "collnet v%d init %s (got %d)", v,    \
          expect_devices ? "succeeds" : "fails cleanly without RDMA devices", ri);              \
    int nd_net = -1, nd_cn = -1;                                                                \
    nccl_result rn = net->devices(&nd_net), rc = cn->devices(&nd_cn);                           \
    CHECK(rn == rc && nd_net == nd_cn, "collnet v%d devices() agrees with the net table (%d, %d)", \
          v, nd_net, nd_cn);                                                                    \
    if (expect_devices && rc == NCCL_OK && nd_cn > 0) {                                         \
      props_t a, b;                                                                             \
      nccl_result ra = net->get_properties(0, &a), rb = cn->get_properties(0, &b);              \
      CHECK(ra == NCCL_OK && rb == NCCL_OK && strcmp(a.name, b.name) == 0 && a.guid == b.guid && \
                a.speed == b.speed && a.port == b.port && b.ptr_support == PTR_HOST &&          \
                a.max_comms == b.max_comms && a.latency == b.latency,                           \
            "collnet v%d getProperties(0): the net table's, host memory only (%s)", v, b.name);\
    }                                                                                           \
    int all = 1;                                                                                \
    for (int dt = 0; dt < DT_COUNT; dt++)                                                       \
      for (int op = 0; op < OP_COUNT; op++) {                                                   \
        int sup = -1;                                                                           \
        int want = dt >= DT_FP8E4M3 ? (has_fp8) : 1;                                            \
        all &= cn->reduce_support(dt, op, &sup) == NCCL_OK && sup == want;                      \
      }                                                                                         \
    CHECK(all, "collnet v%d reduceSupport: every type x op%s", v,                               \
          (has_fp8) ? " (fp8 included)" : " (no fp8 before v9)");                               \
    int sup = -1;                                                                               \
    CHECK(cn->reduce_support(DT_FLOAT32, OP_COUNT, &sup) == NCCL_OK && sup == 0 &&              \
              cn->reduce_support(DT_COUNT, OP_SUM, &sup) == NCCL_OK && sup == 0,                \
          "collnet v%d reduceSupport: 0 for a user-defined op and an unknown type", v);          \
    CHECK(cn->reduce_support(DT_FLOAT32, OP_SUM, NULL) != NCCL_OK,                              \
          "collnet v%d reduceSupport(NULL) is an error", v);                                    \
    void* bogus = (void*)0x12345678;                                                            \
    void* req = bogus;                                                                          \
    int done = 0, size = 0;                                                                     \
    CHECK(cn->test(NULL, &done, &size) != NCCL_OK && cn->test(bogus, &done, &size) != NCCL_OK,  \
          "collnet v%d test(NULL/bogus) is an error", v);                                       \
    CHECK(cn->close_coll(bogus) != NCCL_OK && cn->close_listen(bogus) != NCCL_OK &&             \
              cn->dereg_mr(bogus, bogus) != NCCL_OK && cn->iflush(bogus, NULL, 0, NULL, &req) != NCCL_OK, \
          "collnet v%d closeColl/closeListen/deregMr/iflush on bogus handles are errors", v);   \
    CHECK(cn->iallreduce(bogus, NULL, NULL, 0, DT_FLOAT32, OP_SUM, NULL, NULL, &req) != NCCL_OK, \
          "collnet v%d iallreduce on a bogus collComm is an error", v);                         \
    done_expr;                                                                                  \
  } while (0)

static void run_collnet(void* lib) {
  collnet_v6* c6 = dlsym(lib, "ncclCollNetPlugin_v6");
  net_v6* n6 = dlsym(lib, "ncclNetPlugin_v6");
  CHECK_COLLNET(6, c6, n6, props_v6, 0, c6->init(logger), (void)0);
  collnet_v7* c7 = dlsym(lib, "ncclCollNetPlugin_v7");
  net_v7* n7 = dlsym(lib, "ncclNetPlugin_v7");
  CHECK_COLLNET(7, c7, n7, props_v7, 0, c7->init(logger), (void)0);
  collnet_v8* c8 = dlsym(lib, "ncclCollNetPlugin_v8");
  net_v8* n8 = dlsym(lib, "ncclNetPlugin_v8");
  CHECK_COLLNET(8, c8, n8, props_v8, 0, c8->init(logger), (void)0);
  if (c8) CHECK(c8->iallgather && c8->ireducescatter, "collnet v8 iallgather and ireducescatter are set");
  collnet_v9* c9 = dlsym(lib, "ncclCollNetPlugin_v9");
  net_v9* n9 = dlsym(lib, "ncclNetPlugin_v9");
  CHECK_COLLNET(9, c9, n9, props_v9, 1, c9->init(logger), (void)0);
  if (c9) CHECK(c9->iallgather && c9->ireducescatter && !c9->make_vdevice,
                "collnet v9 iallgather, ireducescatter set; makeVDevice NULL (no CollNet fusion)");
  collnet_v9* c10 = dlsym(lib, "ncclCollNetPlugin_v10");
  net_v10* n10 = dlsym(lib, "ncclNetPlugin_v10");
  CHECK_COLLNET(10, c10, n10, props_v9, 1, c10->init(logger), (void)0);
  if (c10) CHECK(!c10->make_vdevice, "collnet v10 makeVDevice NULL");
  collnet_v11* c11 = dlsym(lib, "ncclCollNetPlugin_v11");
  net_v11* n11 = dlsym(lib, "ncclNetPlugin_v11");
  void* ctx = NULL;
  CHECK_COLLNET(11, c11, n11, props_v11, 1, c11->init(&ctx, 11, logger),
                CHECK(!ctx || c11->finalize(ctx) == NCCL_OK, "collnet v11 finalize"));
  if (c11) CHECK(c11->finalize && !c11->make_vdevice, "collnet v11 finalize set, makeVDevice NULL");
  collnet_v12* c12 = dlsym(lib, "ncclCollNetPlugin_v12");
  net_v12* n12 = dlsym(lib, "ncclNetPlugin_v12");
  ctx = NULL;
  CHECK_COLLNET(12, c12, n12, props_v12, 1, c12->init(&ctx, 12, logger),
                CHECK(!ctx || c12->finalize(ctx) == NCCL_OK, "collnet v12 finalize"));
  if (c12) {
    CHECK(c12->finalize && !c12->make_vdevice, "collnet v12 finalize set, makeVDevice NULL");
    CHECK(c12->finalize((void*)0x4242) != NCCL_OK, "collnet v12 finalize(bogus) is an error");
  }
}

/* RMA table of version v (ncclRmaPlugin_vN): every entry set (Rivet implements them all, v13's
 * GIN layout included); init, devices and getProperties(0) as NCCL's RMA loader calls them, which
 * keeps the table only when device 0 is a GIN_PROXY device; bogus handles refused; init/finalize
 * per communicator. `bogus_iput` is an iput on a bogus context in version v's spelling. */
#define CHECK_RMA(v, t, bogus_iput)                                                              \
  do {                                                                                          \
    CHECK(t != NULL, "rma v%d symbol ncclRmaPlugin_v%d resolves", v, v);                        \
    if (!t) break;                                                                              \
    CHECK(t->name && strcmp(t->name, "Rivet") == 0, "rma v%d name is \"Rivet\"", v);            \
    CHECK(t->init && t->devices && t->get_properties && t->listen && t->connect &&              \
              t->create_context && t->reg_mr_sym && t->reg_mr_sym_dma_buf && t->dereg_mr_sym && \
              t->destroy_context && t->close_coll && t->close_listen && t->iput &&              \
              t->iput_signal && t->iget && t->iflush && t->test && t->progress &&               \
              t->query_last_error && t->finalize,                                               \
          "rma v%d every entry is set", v);                                                     \
    void* ctx = NULL;                                                                           \
    reset_log();                                                                                \
    nccl_result ri = t->init(&ctx, 0x5100 + v, logger);                                         \
    int ndev = -1;                                                                              \
    nccl_result rd = ri == NCCL_OK ? t->devices(&ndev) : NCCL_INTERNAL_ERROR;                   \
    if (!expect_devices) {                                                                      \
      CHECK(ri != NCCL_OK || (rd == NCCL_OK && ndev == 0),                                      \
            "rma v%d without RDMA devices: init fails or devices() is 0 (init %d, devices %d, n %d)", \
            v, ri, rd, ndev);                                                                   \
    } else {                                                                                    \
      CHECK(ri == NCCL_OK && ctx != NULL, "rma v%d init succeeds (got %d: %s)", v, ri, last_line); \
      CHECK(rd == NCCL_OK && ndev >= 1, "rma v%d devices() >= 1 (r=%d n=%d)", v, rd, ndev);     \
      unsigned char buf[sizeof(props_v12) + 64];                                                \
      memset(buf, 0xa5, sizeof buf);                                                            \
      nccl_result rp = t->get_properties(0, (props_v12*)buf);                                   \
      props_v12 p;                                                                              \
      memcpy(&p, buf, sizeof p);                                                                \
      int untouched = 1;                                                                        \
      for (size_t i = sizeof(props_v12); i < sizeof buf; i++) untouched &= buf[i] == 0xa5;      \
      CHECK(rp == NCCL_OK && untouched, "rma v%d getProperties(0) succeeds, writes no byte past %zu", \
            v, sizeof(props_v12));                                                              \
      CHECK(rp == NCCL_OK && p.dev_type == NET_DEVICE_GIN_PROXY,                                \
            "rma v%d device 0 is a GIN_PROXY device (netDeviceType %d, want %d)", v, p.dev_type, \
            NET_DEVICE_GIN_PROXY);                                                              \
      CHECK(rp == NCCL_OK && p.name && p.name[0] && (p.ptr_support & RMA_PTR_HOST) && p.speed > 0, \
            "rma v%d device 0: a name (%s), host memory, speed %d Mb/s", v,                     \
            rp == NCCL_OK && p.name ? p.name : "(null)", p.speed);                              \
      if (ndev >= 1)                                                                            \
        CHECK(t->get_properties(ndev, (props_v12*)buf) != NCCL_OK,                              \
              "rma v%d getProperties(out of range) is an error", v);                            \
    }                                                                                           \
    void* bogus = (void*)0x12345678;                                                            \
    void* req = (void*)0x5a5a5a5a;                                                              \
    int done = 0;                                                                               \
    bool has_error = false;                                                                     \
    char handle[RMA_HANDLE_MAXSIZE];                                                            \
    void* lc = NULL;                                                                            \
    CHECK(t->test(bogus, bogus, &done) != NCCL_OK && t->test(NULL, NULL, &done) != NCCL_OK,     \
          "rma v%d test(bogus/NULL) is an error", v);                                           \
    CHECK(t->close_coll(bogus) != NCCL_OK && t->close_listen(bogus) != NCCL_OK &&               \
              t->dereg_mr_sym(bogus, bogus) != NCCL_OK && t->destroy_context(bogus) != NCCL_OK,  \
          "rma v%d closeColl/closeListen/deregMrSym/destroyContext on bogus handles are errors", v); \
    CHECK(t->query_last_error(bogus, &has_error) != NCCL_OK && t->progress(bogus) != NCCL_OK,    \
          "rma v%d queryLastError/progress on a bogus context are errors", v);                  \
    CHECK(t->iflush(bogus, 0, bogus, 0, &req) != NCCL_OK && (bogus_iput) != NCCL_OK &&          \
              (req == NULL || req == (void*)0x5a5a5a5a),                                        \
          "rma v%d iput/iflush on a bogus context are errors and hand out no request", v);      \
    CHECK(t->listen(bogus, 0, handle, &lc) != NCCL_OK || t->close_listen(lc) == NCCL_OK,        \
          "rma v%d listen on a bogus context is an error (or harmless)", v);                    \
    if (ctx) {                                                                                  \
      CHECK(t->finalize(ctx) == NCCL_OK, "rma v%d finalize", v);                                \
      CHECK(t->finalize(ctx) != NCCL_OK, "rma v%d finalize twice is an error", v);              \
    }                                                                                           \
    CHECK(t->finalize(bogus) != NCCL_OK, "rma v%d finalize(bogus) is an error", v);             \
    if (expect_devices) {                                                                       \
      int ok = 1;                                                                               \
      for (int i = 0; i < 50; i++) {                                                            \
        void* c = NULL;                                                                         \
        ok &= t->init(&c, (uint64_t)i, logger) == NCCL_OK && c != NULL && t->finalize(c) == NCCL_OK; \
      }                                                                                         \
      CHECK(ok, "rma v%d init/finalize per communicator, 50 times", v);                         \
    }                                                                                           \
  } while (0)

static void run_rma(void* lib) {
  static const char* names[] = {"ncclRmaPlugin_v13", "ncclRmaPlugin_v14", "ncclRmaPlugin_v15",
                                "ncclRmaPlugin_v16"};
  if (expect_minimal) {
    int none = 1;
    for (int i = 0; i < 4; i++) none &= dlsym(lib, names[i]) == NULL;
    CHECK(none, "minimal build: no ncclRmaPlugin_v13 ... v16 table");
    return;
  }
  rma_v13* t13 = dlsym(lib, "ncclRmaPlugin_v13");
  CHECK_RMA(13, t13, t13->iput(bogus, 0, 0, bogus, 8, 0, bogus, 0, &req));
  rma_v14* t14 = dlsym(lib, "ncclRmaPlugin_v14");
  CHECK_RMA(14, t14, t14->iput(bogus, 0, 0, bogus, 8, 0, bogus, 0, &req));
  rma_v15* t15 = dlsym(lib, "ncclRmaPlugin_v15");
  CHECK_RMA(15, t15, t15->iput(bogus, 0, 0, bogus, 8, 0, bogus, 0, RMA_OPT_DEFAULT, &req));
  rma_v16* t16 = dlsym(lib, "ncclRmaPlugin_v16");
  CHECK_RMA(16, t16, t16->iput(bogus, 0, 0, bogus, 8, 0, bogus, 0, RMA_OPT_AGGREGATE_REQUESTS, &req));
  if (t16) {
    rma_properties_v16 props = {0};
    CHECK(t16->get_rma_properties != NULL, "rma v16 getRmaProperties is set");
    if (t16->get_rma_properties)
      CHECK(t16->get_rma_properties((void*)0x12345678, &props) != NCCL_OK,
            "rma v16 getRmaProperties on a bogus collComm is an error");
  }
}

static void run(void* lib) {
  int threads_before = thread_count();

  net_v6* v6 = dlsym(lib, "ncclNetPlugin_v6");
  CHECK_COMMON(6, v6);
  if (v6) {
    reset_log();
    check_init(6, v6->init(logger));
    CHECK_PROPS(6, v6, props_v6);
    void* buf[1] = {0}; int sz[1] = {8}, tag[1] = {0}; void* mh[1] = {0}; void* req = NULL;
    CHECK_BOGUS(6, v6, v6->isend(NULL, buf, 8, 0, NULL, &req),
                v6->irecv((void*)0x999, 1, buf, sz, tag, mh, &req));
    CHECK(v6->isend(NULL, buf, -1, 0, NULL, &req) != NCCL_OK, "v6 isend with a negative int size is rejected");
  }

  net_v7* v7 = dlsym(lib, "ncclNetPlugin_v7");
  CHECK_COMMON(7, v7);
  if (v7) {
    reset_log();
    check_init(7, v7->init(logger));
    CHECK_PROPS(7, v7, props_v7);
    void* buf[1] = {0}; int sz[1] = {8}, tag[1] = {0}; void* mh[1] = {0}; void* req = NULL;
    CHECK_BOGUS(7, v7, v7->isend(NULL, buf, 8, 0, NULL, &req),
                v7->irecv((void*)0x999, 1, buf, sz, tag, mh, &req));
  }

  net_v8* v8 = dlsym(lib, "ncclNetPlugin_v8");
  CHECK_COMMON(8, v8);
  if (v8) {
    reset_log();
    check_init(8, v8->init(logger));
    CHECK_PROPS(8, v8, props_v8);
    void* buf[1] = {0}; int sz[1] = {8}, tag[1] = {0}; void* mh[1] = {0}; void* req = NULL;
    CHECK_BOGUS(8, v8, v8->isend(NULL, buf, 8, 0, NULL, &req),
                v8->irecv((void*)0x999, 1, buf, sz, tag, mh, &req));
  }

  net_v9* v9 = dlsym(lib, "ncclNetPlugin_v9");
  CHECK_COMMON(9, v9);
  if (v9) {
    reset_log();
    check_init(9, v9->init(logger));
    CHECK_PROPS(9, v9, props_v9);
    void* buf[1] = {0}; size_t sz[1] = {8}; int tag[1] = {0}; void* mh[1] = {0}; void* req = NULL;
    CHECK_BOGUS(9, v9, v9->isend(NULL, buf, 8, 0, NULL, &req),
                v9->irecv((void*)0x999, 1, buf, sz, tag, mh, &req));
    CHECK(v9->make_vdevice != NULL, "v9 makeVDevice is set (NIC fusion)");
    CHECK(v9->isend(NULL, buf, (size_t)1 << 31, 0, NULL, &req) != NCCL_OK,
          "v9 isend larger than maxP2pBytes is rejected");
  }

  net_v10* v10 = dlsym(lib, "ncclNetPlugin_v10");
  CHECK_COMMON(10, v10);
  if (v10) {
    reset_log();
    check_init(10, v10->init(logger, NULL));
    CHECK_PROPS(10, v10, props_v9);
    void* buf[1] = {0}; size_t sz[1] = {8}; int tag[1] = {0}; void* mh[1] = {0}; void* ph[1] = {0};
    void* req = NULL;
    CHECK_BOGUS(10, v10, v10->isend(NULL, buf, 8, 0, NULL, NULL, &req),
                v10->irecv((void*)0x999, 1, buf, sz, tag, mh, ph, &req));
    comm_config cfg = {.traffic_class = -1};
    char handle[NET_HANDLE_MAXSIZE] = {0};
    void* send = NULL;
    CHECK(v10->connect(99, &cfg, handle, &send, NULL) != NCCL_OK && send == NULL,
          "v10 connect to a device that does not exist is an error");
  }

  net_v11* v11 = dlsym(lib, "ncclNetPlugin_v11");
  CHECK_COMMON(11, v11);
  if (v11) {
    CHECK(v11->finalize && v11->set_net_attr && v11->make_vdevice, "v11 finalize, setNetAttr, makeVDevice set");
    reset_log();
    void* ctx = NULL;
    comm_config cfg = {.traffic_class = -1};
    check_init(11, v11->init(&ctx, 0x1234, &cfg, logger, NULL));
    CHECK_PROPS(11, v11, props_v11);
    if (ctx) {
      net_attr attr;
      memset(&attr, 0xff, sizeof attr);
      CHECK(v11->set_net_attr(ctx, &attr) == NCCL_OK, "v11 setNetAttr on a live context");
      CHECK(v11->finalize(ctx) == NCCL_OK, "v11 finalize");
      CHECK(v11->finalize(ctx) != NCCL_OK, "v11 finalize twice is an error");
    }
    if (!expect_devices) {
      /* NCCL 2.28 finalizes comm->netContext (still NULL) after a failed init. */
      reset_log();
      nccl_result r = v11->finalize(NULL);
      CHECK(r == NCCL_OK && log_lines[LOG_WARN] == 0,
            "v11 finalize(NULL) after a failed init succeeds without a WARN (r=%d, %d WARN: %s)", r,
            log_lines[LOG_WARN], last_line);
    }
    CHECK(v11->finalize((void*)0x4242) != NCCL_OK, "v11 finalize(bogus) is an error");
  }

  net_v12* v12 = dlsym(lib, "ncclNetPlugin_v12");
  CHECK_COMMON(12, v12);
  if (v12) {
    CHECK(v12->finalize && v12->set_net_attr && v12->make_vdevice, "v12 finalize, setNetAttr, makeVDevice set");
    /* NCCL 2.30 inits and finalizes once per communicator. */
    int ok = 1;
    for (int i = 0; i < 100; i++) {
      void* ctx = NULL;
      comm_config cfg = {.traffic_class = 3};
      reset_log();
      nccl_result r = v12->init(&ctx, (uint64_t)i, &cfg, logger, NULL);
      if (expect_devices) {
        ok &= r == NCCL_OK && ctx != NULL && v12->finalize(ctx) == NCCL_OK;
      } else {
        ok &= r != NCCL_OK;
      }
    }
    CHECK(ok, "v12 init/finalize per communicator, 100 times");
    void* ctx = NULL;
    comm_config cfg = {.traffic_class = -1};
    reset_log();
    check_init(12, v12->init(&ctx, 7, &cfg, logger, NULL));
    CHECK_PROPS(12, v12, props_v12);
    if (expect_devices) {
      props_v12 p;
      if (v12->get_properties(0, &p) == NCCL_OK)
        CHECK(p.vprops.ndevs == 1 && p.vprops.devs[0] == 0 && p.max_p2p_bytes > 0,
              "v12 device 0 lists itself as its only member");
    }
    if (ctx) CHECK(v12->finalize(ctx) == NCCL_OK, "v12 finalize");
  }

  if (expect_minimal) {
    int none = 1;
    for (int v = 6; v <= 12; v++) {
      char sym[32];
      snprintf(sym, sizeof sym, "ncclCollNetPlugin_v%d", v);
      none &= dlsym(lib, sym) == NULL;
    }
    CHECK(none, "minimal build: no ncclCollNetPlugin_v6 ... v12 table");
  } else {
    run_collnet(lib);
  }
  run_rma(lib);

  CHECK(thread_count() == threads_before, "no thread left behind (%d before, %d after)", threads_before,
        thread_count());
}

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4 || (strcmp(argv[2], "no-device") && strcmp(argv[2], "devices")) ||
      (argc == 4 && strcmp(argv[3], "--minimal"))) {
    fprintf(stderr, "usage: %s LIB {no-device|devices} [--minimal]\n", argv[0]);
    return 2;
  }
  expect_minimal = argc == 4;
  expect_devices = strcmp(argv[2], "devices") == 0;
  for (int round = 1; round <= 2; round++) {
    void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    CHECK(lib != NULL, "round %d: dlopen(%s, RTLD_NOW|RTLD_LOCAL): %s", round, argv[1], lib ? "ok" : dlerror());
    if (!lib) break;
    run(lib);
    CHECK(dlclose(lib) == 0, "round %d: dlclose", round);
  }
  fprintf(stderr, "%d failure(s)\n", failures);
  return failures ? 1 : 0;
}
