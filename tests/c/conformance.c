/* Conformance suite for NCCL net plugins: drives any libnccl-net*.so the way NCCL's proxy does,
 * through every exported ncclNetPlugin_vN (v6 … v12), from two processes, and checks the contract
 * of shared/reference/nccl-net-api.md §1.5.
 *
 * usage: conformance LIB [--dev D] [--versions 6,7,...] [--quick] [--verbose]
 *                        [--across receiver:PORT | --across sender:A.B.C.D:PORT]
 *
 * --across runs the two-process checks with the two sides on different hosts: this process runs
 * one side of each (the receiver listens for a TCP control connection on PORT for every check,
 * the sender dials it), the other host runs the same command with the other role, and the
 * one-process checks are left to a single-host run. The control connection carries exactly what
 * the socketpair carries in a single-host run.
 *
 * The newest exported version gets the full suite; every older one gets the API checks (bogus
 * handles), the one-thread loopback probe and a connect + transfer + close subset. v11 and newer
 * also get per-communicator init/finalize and dlclose/dlopen. Every check runs in a forked child
 * (a crash becomes a FAIL, not the end of the run); two-process checks fork a receiver and a
 * sender, which load the library after the fork and pass the 128-byte listen handle over a
 * socketpair, as NCCL's bootstrap would.
 *
 * Output (stdout): one "PASS <check>" or "FAIL <check>: <reason>" line per check as it finishes,
 * then a summary. Exit status: 0 all passed, 1 any failure, 2 usage. CONFORMANCE_TIMEOUT_S (default
 * 60) bounds every single wait; a 1800 s watchdog bounds the run. CONFORMANCE_UNPINNED_DEVICE=1: the
 * device pins no pages (see unpinned_device). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "nccl_net_abi.h"

#define KIB 1024
#define MIB (1024 * 1024)
#define MAX_CHECKS 256
#define REASON_LEN 320

/* ---------------------------------------------------------------- results (shared memory) */

enum { ST_RUNNING = 0, ST_PASS = 1, ST_FAIL = 2 };
typedef struct {
  char name[96];
  int status;
  int sides;      /* how many processes take part */
  int sides_done; /* how many finished their part */
  char reason[REASON_LEN];
} check_rec;
typedef struct {
  int lock;
  int n;
  check_rec checks[MAX_CHECKS];
} results_t;
static results_t* results;

static void lock_results(void) {
  while (__atomic_exchange_n(&results->lock, 1, __ATOMIC_ACQUIRE)) sched_yield();
}
static void unlock_results(void) { __atomic_store_n(&results->lock, 0, __ATOMIC_RELEASE); }

static const char* side_name = "main";
static int verbose;
static double timeout_s = 60;

/* Register a check (orchestrator, before the fork) and return its index. */
static int check_new(int sides, const char* fmt, ...) {
  lock_results();
  int i = results->n < MAX_CHECKS ? results->n++ : MAX_CHECKS - 1;
  check_rec* c = &results->checks[i];
  memset(c, 0, sizeof *c);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->name, sizeof c->name, fmt, ap);
  va_end(ap);
  c->sides = sides;
  unlock_results();
  return i;
}

static void check_fail(int i, const char* fmt, ...) {
  char reason[REASON_LEN - 32];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(reason, sizeof reason, fmt, ap);
  va_end(ap);
  lock_results();
  check_rec* c = &results->checks[i];
  if (c->status != ST_FAIL) {
    c->status = ST_FAIL;
    snprintf(c->reason, sizeof c->reason, "[%.16s] %s", side_name, reason);
  }
  unlock_results();
  if (verbose) fprintf(stderr, "  [%s] %s: %s\n", side_name, c->name, reason);
}

/* This side finished its part of check i (a failure, if any, was recorded already). */
static void check_done(int i) {
  lock_results();
  results->checks[i].sides_done++;
  unlock_results();
}

static int check_failed(int i) { return __atomic_load_n(&results->checks[i].status, __ATOMIC_ACQUIRE) == ST_FAIL; }

/* Orchestrator: settle check i after its processes ended, print its line. */
static void check_settle(int i) {
  check_rec* c = &results->checks[i];
  if (c->status != ST_FAIL) {
    if (c->sides_done >= c->sides) c->status = ST_PASS;
    else {
      c->status = ST_FAIL;
      snprintf(c->reason, sizeof c->reason, "did not finish (a process crashed, hung or was killed; see above)");
    }
  }
  if (c->status == ST_PASS) printf("PASS %s\n", c->name);
  else printf("FAIL %s: %s\n", c->name, c->reason);
  fflush(stdout);
}

/* ---------------------------------------------------------------- helpers */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int thread_count(void) {
  DIR* d = opendir("/proc/self/task");
  int n = 0;
  struct dirent* e;
  if (!d) return -1;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

static char last_log[512];
static void logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags; (void)file; (void)line;
  va_list ap;
  va_start(ap, fmt);
  char buf[512];
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (level == LOG_WARN || level == LOG_INFO) snprintf(last_log, sizeof last_log, "%s", buf);
  if (verbose || level == LOG_WARN) fprintf(stderr, "  [%s] plugin log %d: %s\n", side_name, level, buf);
}

static unsigned char pattern(unsigned seed, size_t i) { return (unsigned char)(seed * 131u + i * 7u + (i >> 12) + 1); }
static void fill(unsigned char* p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) p[i] = pattern(seed, i);
}
/* 1 if p[0..n) carries seed's pattern; otherwise reason says where it differs. */
static int matches(const unsigned char* p, size_t n, unsigned seed, char* reason, size_t rlen) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != pattern(seed, i)) {
      snprintf(reason, rlen, "byte %zu of %zu is %u, expected %u", i, n, p[i], pattern(seed, i));
      return 0;
    }
  return 1;
}

/* Small messages between the two processes of a pair (handles, go/done flags). */
static int peer_fd = -1;
static int peer_send(const void* buf, size_t len) {
  const char* p = buf;
  while (len) {
    ssize_t w = write(peer_fd, p, len);
    if (w <= 0) {
      if (w < 0 && errno == EINTR) continue;
      return 0;
    }
    p += w;
    len -= (size_t)w;
  }
  return 1;
}
static int peer_recv(void* buf, size_t len) {
  char* p = buf;
  double start = now_s();
  while (len) {
    struct pollfd pfd = {.fd = peer_fd, .events = POLLIN};
    int r = poll(&pfd, 1, 200);
    if (r < 0 && errno != EINTR) return 0;
    if (r > 0) {
      ssize_t got = read(peer_fd, p, len);
      if (got <= 0) return 0; /* the peer exited */
      p += got;
      len -= (size_t)got;
    }
    if (now_s() - start > timeout_s) return 0;
  }
  return 1;
}
/* Exchange one status int with the peer: both learn whether the other side is still fine. */
static int peer_sync(int mine) {
  int theirs = 0;
  if (!peer_send(&mine, sizeof mine) || !peer_recv(&theirs, sizeof theirs)) return 0;
  return theirs;
}

/* ---------------------------------------------------------------- one API over v6 … v12 */

static int version;
static void* table;
static void* lib_handle;
static void* ctx;
static int dev;

#define T(v) ((net_v##v*)table)

/* -- profiler (v10+): the suite attaches its own profiler callback and passes a pHandle with every
 * isend/irecv; each event must be an IB QP event, and each completed request must have started
 * and stopped its events with the sizes posted. */
#define PROF_MAGIC 0x70726f66u
struct prof_event { unsigned magic; size_t length; };
static struct { long starts, stops, bad; size_t start_bytes, stop_bytes; } prof;
static int prof_phandle;
static nccl_result profiler_cb(void** eh, int type, void* ph, int64_t id, void* ext) {
  if (type == PROFILER_NET_EVENT_START) {
    const profiler_net_ib_descr_v1* d = ext;
    if (!eh || ph != &prof_phandle || id != (PROFILER_NET_TYPE_IB | PROFILER_NET_IB_VER) || !d ||
        d->type != PROFILE_QP || d->qp.device != 0 || d->qp.qp_num <= 0) {
      prof.bad++;
      if (eh) *eh = NULL;
      return NCCL_OK;
    }
    struct prof_event* e = malloc(sizeof *e);
    if (!e) return NCCL_SYSTEM_ERROR;
    e->magic = PROF_MAGIC;
    e->length = d->qp.length;
    *eh = e;
    prof.starts++;
    prof.start_bytes += d->qp.length;
  } else if (type == PROFILER_NET_EVENT_STOP) {
    struct prof_event* e = eh ? *eh : NULL;
    if (!e || e->magic != PROF_MAGIC) {
      prof.bad++;
      return NCCL_OK;
    }
    prof.stops++;
    prof.stop_bytes += e->length;
    e->magic = 0;
    free(e);
  } else {
    prof.bad++;
  }
  return NCCL_OK;
}
/* Events since `before` must be n started and stopped, `bytes` in all, none malformed. */
static int prof_check(int ck, const char* what, long before_starts, long before_stops, size_t before_bytes,
                      size_t before_stop_bytes, long n, size_t bytes) {
  if (version < 10) return 1;
  long starts = prof.starts - before_starts, stops = prof.stops - before_stops;
  size_t sb = prof.start_bytes - before_bytes, pb = prof.stop_bytes - before_stop_bytes;
  if (prof.bad || starts != n || stops != n || sb != bytes || pb != bytes) {
    check_fail(ck, "profiler events of the %s: %ld started, %ld stopped (want %ld), %zu/%zu bytes (want %zu), %ld malformed",
               what, starts, stops, n, sb, pb, bytes, prof.bad);
    return 0;
  }
  return 1;
}

static nccl_result p_init(void** out_ctx, uint64_t comm_id) {
  comm_config cfg = {.traffic_class = -1};
  switch (version) {
    case 6: return T(6)->init(logger);
    case 7: return T(7)->init(logger);
    case 8: return T(8)->init(logger);
    case 9: return T(9)->init(logger);
    case 10: return T(10)->init(logger, profiler_cb);
    default: return T(12)->init(out_ctx, comm_id, &cfg, logger, profiler_cb);
  }
}
static nccl_result p_finalize(void* c) { return version >= 11 ? T(12)->finalize(c) : NCCL_OK; }
static nccl_result p_devices(int* n) { return T(6)->devices(n); } /* same slot in every version */

/* maxRecvs and ptrSupport of device d, whatever the props version. */
static nccl_result p_props(int d, int* max_recvs, int* ptr_support, const char** name) {
  union { props_v6 a; props_v7 b; props_v8 c; props_v9 e; props_v11 f; props_v12 g; } u;
  memset(&u, 0, sizeof u);
  nccl_result r;
  switch (version) {
    case 6: r = T(6)->get_properties(d, &u.a); *max_recvs = u.a.max_recvs; *ptr_support = u.a.ptr_support; *name = u.a.name; break;
    case 7: r = T(7)->get_properties(d, &u.b); *max_recvs = u.b.max_recvs; *ptr_support = u.b.ptr_support; *name = u.b.name; break;
    case 8: r = T(8)->get_properties(d, &u.c); *max_recvs = u.c.max_recvs; *ptr_support = u.c.ptr_support; *name = u.c.name; break;
    case 9: r = T(9)->get_properties(d, &u.e); *max_recvs = u.e.max_recvs; *ptr_support = u.e.ptr_support; *name = u.e.name; break;
    case 10: r = T(10)->get_properties(d, &u.e); *max_recvs = u.e.max_recvs; *ptr_support = u.e.ptr_support; *name = u.e.name; break;
    case 11: r = T(11)->get_properties(d, &u.f); *max_recvs = u.f.max_recvs; *ptr_support = u.f.ptr_support; *name = u.f.name; break;
    default: r = T(12)->get_properties(d, &u.g); *max_recvs = u.g.max_recvs; *ptr_support = u.g.ptr_support; *name = u.g.name; break;
  }
  return r;
}

static nccl_result p_listen(void* c, int d, void* handle, void** comm) {
  return version >= 11 ? T(12)->listen(c, d, handle, comm) : T(6)->listen(d, handle, comm);
}
static nccl_result p_connect(void* c, int d, void* handle, void** comm) {
  comm_config cfg = {.traffic_class = -1};
  switch (version) {
    case 6: return T(6)->connect(d, handle, comm);
    case 7: case 8: case 9: return T(7)->connect(d, handle, comm, NULL);
    case 10: return T(10)->connect(d, &cfg, handle, comm, NULL);
    default: return T(12)->connect(c, d, handle, comm, NULL);
  }
}
static nccl_result p_accept(void* l, void** comm) {
  return version == 6 ? T(6)->accept(l, comm) : T(7)->accept(l, comm, NULL);
}
static nccl_result p_reg_mr(void* comm, void* data, size_t size, void** mh) {
  if (version <= 7) return T(6)->reg_mr(comm, data, (int)size, PTR_HOST, mh);
  return T(8)->reg_mr(comm, data, size, PTR_HOST, mh);
}
static nccl_result p_dereg_mr(void* comm, void* mh) { return T(6)->dereg_mr(comm, mh); }
static nccl_result p_isend(void* comm, void* data, size_t size, int tag, void* mh, void** req) {
  if (version <= 8) return T(6)->isend(comm, data, (int)size, tag, mh, req);
  if (version == 9) return T(9)->isend(comm, data, size, tag, mh, req);
  return T(10)->isend(comm, data, size, tag, mh, &prof_phandle, req);
}
static nccl_result p_irecv(void* comm, int n, void** data, size_t* sizes, int* tags, void** mhs, void** req) {
  if (version <= 8) {
    int isz[8];
    for (int i = 0; i < n && i < 8; i++) isz[i] = (int)sizes[i];
    return T(6)->irecv(comm, n, data, isz, tags, mhs, req);
  }
  if (version == 9) return T(9)->irecv(comm, n, data, sizes, tags, mhs, req);
  void* ph[8] = {&prof_phandle, &prof_phandle, &prof_phandle, &prof_phandle,
                 &prof_phandle, &prof_phandle, &prof_phandle, &prof_phandle};
  return T(10)->irecv(comm, n, data, sizes, tags, mhs, ph, req);
}
static nccl_result p_iflush(void* comm, int n, void** data, int* sizes, void** mhs, void** req) {
  return T(6)->iflush(comm, n, data, sizes, mhs, req);
}
static nccl_result p_test(void* req, int* done, int* sizes) { return T(6)->test(req, done, sizes); }
static nccl_result p_close_send(void* c) { return T(6)->close_send(c); }
static nccl_result p_close_recv(void* c) { return T(6)->close_recv(c); }
static nccl_result p_close_listen(void* c) { return T(6)->close_listen(c); }

/* Load the library and init it (in this process); records a failure on check `ck`. */
static int load_and_init(const char* path, int ck, uint64_t comm_id) {
  lib_handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib_handle) {
    check_fail(ck, "dlopen(%s): %s", path, dlerror());
    return 0;
  }
  char sym[32];
  snprintf(sym, sizeof sym, "ncclNetPlugin_v%d", version);
  table = dlsym(lib_handle, sym);
  if (!table) {
    check_fail(ck, "dlsym(%s) found nothing", sym);
    return 0;
  }
  last_log[0] = 0;
  nccl_result r = p_init(&ctx, comm_id);
  if (r != NCCL_OK) {
    check_fail(ck, "no device: init returned %d (%s)", r, last_log[0] ? last_log : "the plugin logged no reason");
    return 0;
  }
  if (version >= 11 && !ctx) {
    check_fail(ck, "init succeeded but left ctx NULL");
    return 0;
  }
  int n = 0;
  r = p_devices(&n);
  if (r != NCCL_OK || n < 1) {
    check_fail(ck, "no device: devices() returned %d with %d device(s)", r, n);
    return 0;
  }
  if (dev >= n) {
    check_fail(ck, "--dev %d but the plugin has %d device(s)", dev, n);
    return 0;
  }
  return 1;
}

/* ---------------------------------------------------------------- waiting on the plugin */

/* Spin on test until done; 1 on success. sizes may be NULL. */
static int wait_req(int ck, void* req, int* sizes, const char* what) {
  int done = 0;
  double start = now_s();
  while (!done) {
    nccl_result r = p_test(req, &done, sizes);
    if (r != NCCL_OK) {
      check_fail(ck, "%s: test returned %d", what, r);
      return 0;
    }
    if (!done && now_s() - start > timeout_s) {
      check_fail(ck, "%s: not complete after %.0f s", what, timeout_s);
      return 0;
    }
  }
  return 1;
}

/* isend, retrying while the plugin answers "try later" (NULL request). */
static void* post_send(int ck, void* comm, void* data, size_t size, int tag, void* mh, const char* what) {
  void* req = NULL;
  double start = now_s();
  for (;;) {
    nccl_result r = p_isend(comm, data, size, tag, mh, &req);
    if (r != NCCL_OK) {
      check_fail(ck, "%s: isend of %zu bytes returned %d", what, size, r);
      return NULL;
    }
    if (req) return req;
    if (now_s() - start > timeout_s) {
      check_fail(ck, "%s: isend still answers \"try later\" after %.0f s", what, timeout_s);
      return NULL;
    }
  }
}

static void* post_recv(int ck, void* comm, int n, void** data, size_t* sizes, int* tags, void** mhs, void* preset,
                       const char* what) {
  void* req = NULL;
  double start = now_s();
  for (;;) {
    req = preset;
    nccl_result r = p_irecv(comm, n, data, sizes, tags, mhs, &req);
    if (r != NCCL_OK) {
      check_fail(ck, "%s: irecv of n=%d returned %d", what, n, r);
      return NULL;
    }
    if (req && req != preset) return req;
    if (req == preset && preset) {
      check_fail(ck, "%s: irecv left the optional-completion hint %p in *request instead of a request", what, preset);
      return NULL;
    }
    if (now_s() - start > timeout_s) {
      check_fail(ck, "%s: irecv still answers \"try later\" after %.0f s", what, timeout_s);
      return NULL;
    }
  }
}

/* ---------------------------------------------------------------- connection setup */

typedef struct {
  void* send;
  void* recv;
  double max_call_s; /* the slowest single connect/accept call */
} conn_t;

/* Receiver side: listen, a few accepts before the peer connects (each must return at once with
 * NULL), hand the handle over, then poll accept; closeListen right after it completes. */
static int recv_establish(int ck, conn_t* c) {
  char handle[NET_HANDLE_MAXSIZE];
  memset(handle, 0, sizeof handle);
  void* lcomm = NULL;
  nccl_result r = p_listen(ctx, dev, handle, &lcomm);
  if (r != NCCL_OK || !lcomm) {
    check_fail(ck, "listen returned %d, listenComm %p", r, lcomm);
    return 0; /* the sender sees EOF when this process exits */
  }
  c->max_call_s = 0;
  for (int i = 0; i < 3; i++) {
    void* rc = NULL;
    double t0 = now_s();
    r = p_accept(lcomm, &rc);
    double dt = now_s() - t0;
    if (dt > c->max_call_s) c->max_call_s = dt;
    if (r != NCCL_OK || rc) {
      check_fail(ck, "accept before any connect: returned %d, recvComm %p (expected success and NULL)", r, rc);
      return 0;
    }
  }
  if (!peer_send(handle, sizeof handle)) {
    check_fail(ck, "sending the handle to the sender process");
    return 0;
  }
  /* Accept only after the sender has polled connect a few times: connect must not wait for the
   * peer's accept. */
  char polled = 0;
  if (!peer_recv(&polled, 1)) {
    check_fail(ck, "the sender's first connect calls did not return within %.0f s (connect blocks until the peer "
               "accepts?)", timeout_s);
    p_close_listen(lcomm);
    return 0;
  }
  double start = now_s();
  void* rc = NULL;
  while (!rc) {
    double t0 = now_s();
    r = p_accept(lcomm, &rc);
    double dt = now_s() - t0;
    if (dt > c->max_call_s) c->max_call_s = dt;
    if (r != NCCL_OK) {
      check_fail(ck, "accept returned %d", r);
      p_close_listen(lcomm);
      return 0;
    }
    if (!rc && now_s() - start > timeout_s) {
      check_fail(ck, "accept did not complete in %.0f s", timeout_s);
      p_close_listen(lcomm);
      return 0;
    }
  }
  r = p_close_listen(lcomm);
  if (r != NCCL_OK) {
    check_fail(ck, "closeListen right after accept returned %d", r);
    return 0;
  }
  c->recv = rc;
  return 1;
}

/* Sender side: receive the handle, poll connect with the same handle buffer. */
static int send_establish(int ck, conn_t* c) {
  char handle[NET_HANDLE_MAXSIZE];
  if (!peer_recv(handle, sizeof handle)) {
    check_fail(ck, "no handle from the receiver process");
    return 0;
  }
  double start = now_s();
  c->max_call_s = 0;
  void* sc = NULL;
  int calls = 0;
  while (!sc) {
    double t0 = now_s();
    nccl_result r = p_connect(ctx, dev, handle, &sc); /* the same buffer on every retry */
    if (++calls == 3 || (sc && calls < 3)) {
      char polled = 1;
      peer_send(&polled, 1); /* the receiver starts accepting now */
    }
    double dt = now_s() - t0;
    if (dt > c->max_call_s) c->max_call_s = dt;
    if (r != NCCL_OK) {
      check_fail(ck, "connect returned %d", r);
      if (sc) p_close_send(sc);
      return 0;
    }
    if (!sc && now_s() - start > timeout_s) {
      check_fail(ck, "connect did not complete in %.0f s", timeout_s);
      return 0;
    }
  }
  c->send = sc;
  return 1;
}

/* ---------------------------------------------------------------- two-process checks */

typedef struct {
  const char* name;
  /* Each returns 1 if this side's part went well (failures recorded on ck). */
  int (*sender)(int ck, void* comm);
  int (*receiver)(int ck, void* comm);
} pair_check;

static int quick;

/* A buffer registered on comm, freed by buf_free. */
typedef struct {
  unsigned char* p;
  size_t size;
  void* mh;
  void* comm;
} regbuf;
static int buf_alloc(int ck, regbuf* b, void* comm, size_t size) {
  b->size = size;
  b->comm = comm;
  b->mh = NULL;
  b->p = aligned_alloc(4096, (size + 4095) / 4096 * 4096);
  if (!b->p) {
    check_fail(ck, "out of memory for %zu bytes", size);
    return 0;
  }
  memset(b->p, 0, size);
  nccl_result r = p_reg_mr(comm, b->p, size, &b->mh);
  if (r != NCCL_OK || !b->mh) {
    check_fail(ck, "regMr of %zu bytes returned %d", size, r);
    free(b->p);
    b->p = NULL;
    return 0;
  }
  return 1;
}
static void buf_free(int ck, regbuf* b) {
  if (!b->p) return;
  nccl_result r = p_dereg_mr(b->comm, b->mh);
  if (r != NCCL_OK) check_fail(ck, "deregMr returned %d", r);
  free(b->p);
  b->p = NULL;
}

/* -- sizes: a sweep of sizes, receive buffers larger than the messages. */
static const size_t sweep[] = {1, 8, 63, 4096, 4097, 65536, 1 * MIB, 4 * MIB};
#define NSWEEP (sizeof sweep / sizeof sweep[0])
#define SLACK 64
static int sweep_send(int ck, void* comm) {
  regbuf b;
  if (!buf_alloc(ck, &b, comm, 4 * MIB)) return 0;
  int ok = 1;
  long s0 = prof.starts, p0 = prof.stops;
  size_t b0 = prof.start_bytes, q0 = prof.stop_bytes, bytes = 0;
  for (size_t k = 0; k < NSWEEP && ok; k++) {
    fill(b.p, sweep[k], 10 + (unsigned)k);
    void* req = post_send(ck, comm, b.p, sweep[k], 1, b.mh, "size sweep");
    int got = -1;
    ok = req && wait_req(ck, req, &got, "size sweep send");
    bytes += sweep[k];
  }
  ok = ok && prof_check(ck, "sends", s0, p0, b0, q0, (long)NSWEEP, bytes);
  buf_free(ck, &b);
  return ok;
}
static int sweep_recv(int ck, void* comm) {
  regbuf b;
  if (!buf_alloc(ck, &b, comm, 4 * MIB + SLACK)) return 0;
  int ok = 1;
  long s0 = prof.starts, p0 = prof.stops;
  size_t b0 = prof.start_bytes, q0 = prof.stop_bytes, bytes = 0;
  for (size_t k = 0; k < NSWEEP && ok; k++) {
    bytes += sweep[k] + SLACK;
    memset(b.p, 0xee, sweep[k] + SLACK);
    void* data[1] = {b.p};
    size_t sz[1] = {sweep[k] + SLACK};
    int tags[1] = {1}, got[1] = {-1};
    void* mhs[1] = {b.mh};
    void* req = post_recv(ck, comm, 1, data, sz, tags, mhs, NULL, "size sweep");
    ok = req && wait_req(ck, req, got, "size sweep recv");
    char why[128];
    if (ok && (size_t)got[0] != sweep[k]) {
      check_fail(ck, "message of %zu bytes: test reported %d", sweep[k], got[0]);
      ok = 0;
    } else if (ok && !matches(b.p, sweep[k], 10 + (unsigned)k, why, sizeof why)) {
      check_fail(ck, "message of %zu bytes corrupted: %s", sweep[k], why);
      ok = 0;
    } else if (ok && b.p[sweep[k]] != 0xee) {
      check_fail(ck, "message of %zu bytes: bytes written past the message", sweep[k]);
      ok = 0;
    }
  }
  /* receive events carry the posted buffer size (as NCCL's IB transport posts them) */
  ok = ok && prof_check(ck, "receives", s0, p0, b0, q0, (long)NSWEEP, bytes);
  buf_free(ck, &b);
  return ok;
}

/* -- 0-byte messages: into a larger buffer, into a 0-byte buffer, and between two normal ones. */
static int zero_send(int ck, void* comm) {
  regbuf b;
  if (!buf_alloc(ck, &b, comm, 4096)) return 0;
  size_t sizes[4] = {0, 0, 100, 0};
  int ok = 1;
  for (int i = 0; i < 4 && ok; i++) {
    fill(b.p, sizes[i], 50 + i);
    void* req = post_send(ck, comm, b.p, sizes[i], 0, b.mh, "0-byte send");
    int got = -1;
    ok = req && wait_req(ck, req, &got, "0-byte send");
    if (ok && (size_t)got != sizes[i]) {
      check_fail(ck, "send %d of %zu bytes: test reported size %d", i, sizes[i], got);
      ok = 0;
    }
  }
  buf_free(ck, &b);
  return ok;
}
static int zero_recv(int ck, void* comm) {
  regbuf b;
  if (!buf_alloc(ck, &b, comm, 4096)) return 0;
  size_t bufsz[4] = {4096, 0, 4096, 4096};
  size_t want[4] = {0, 0, 100, 0};
  int ok = 1;
  for (int i = 0; i < 4 && ok; i++) {
    memset(b.p, 0xee, 4096);
    void* data[1] = {b.p};
    size_t sz[1] = {bufsz[i]};
    int tags[1] = {0}, got[1] = {-1};
    void* mhs[1] = {b.mh};
    void* req = post_recv(ck, comm, 1, data, sz, tags, mhs, NULL, "0-byte recv");
    ok = req && wait_req(ck, req, got, "0-byte recv");
    char why[128];
    if (ok && (size_t)got[0] != want[i]) {
      check_fail(ck, "receive %d (message of %zu bytes into %zu): test reported %d", i, want[i], bufsz[i], got[0]);
      ok = 0;
    } else if (ok && !matches(b.p, want[i], 50 + i, why, sizeof why)) {
      check_fail(ck, "receive %d: %s", i, why);
      ok = 0;
    } else if (ok && b.p[want[i]] != 0xee) {
      check_fail(ck, "receive %d of %zu bytes wrote past the message", i, want[i]);
      ok = 0;
    }
  }
  buf_free(ck, &b);
  return ok;
}

/* -- grouped receive: n = 1 … 8, tags sent in shuffled order, sizes per tag (some 0), buffers
 * larger than the messages; test must report each buffer's size. */
static const int shuffle8[8] = {5, 2, 7, 0, 3, 6, 1, 4};
static size_t group_size(int n, int tag) { return (tag % 3 == 1) ? 0 : (size_t)(1000 * (tag + 1) + n); }
static int max_recvs = 8;
static int grouped_send(int ck, void* comm) {
  regbuf b;
  if (!buf_alloc(ck, &b, comm, 8 * 16 * KIB)) return 0;
  int ok = 1;
  for (int n = 1; n <= max_recvs && ok; n++) {
    void* reqs[8];
    int k = 0;
    for (int i = 0; i < 8 && ok; i++) {
      int tag = shuffle8[i];
      if (tag >= n) continue;
      unsigned char* p = b.p + (size_t)tag * 16 * KIB;
      fill(p, group_size(n, tag), 100 * n + tag);
      reqs[k] = post_send(ck, comm, p, group_size(n, tag), 1000 + tag, b.mh, "grouped send");
      ok = reqs[k++] != NULL;
    }
    for (int i = 0; i < k && ok; i++) ok = wait_req(ck, reqs[i], NULL, "grouped send");
  }
  buf_free(ck, &b);
  return ok;
}
static int grouped_recv(int ck, void* comm) {
  regbuf b;
  if (!buf_alloc(ck, &b, comm, 8 * 16 * KIB)) return 0;
  int ok = 1;
  for (int n = 1; n <= max_recvs && ok; n++) {
    void* data[8];
    size_t sz[8];
    int tags[8], got[8];
    void* mhs[8];
    memset(b.p, 0xee, 8 * 16 * KIB);
    for (int t = 0; t < n; t++) {
      /* buffer i takes tag (n-1-i): tag order differs from buffer order */
      int tag = n - 1 - t;
      data[t] = b.p + (size_t)tag * 16 * KIB;
      sz[t] = 16 * KIB;
      tags[t] = 1000 + tag;
      mhs[t] = b.mh;
      got[t] = -1;
    }
    void* req = post_recv(ck, comm, n, data, sz, tags, mhs, NULL, "grouped recv");
    ok = req && wait_req(ck, req, got, "grouped recv");
    for (int t = 0; t < n && ok; t++) {
      int tag = n - 1 - t;
      size_t want = group_size(n, tag);
      char why[128];
      if ((size_t)got[t] != want) {
        check_fail(ck, "group of n=%d: buffer %d (tag %d) reported %d bytes, expected %zu", n, t, 1000 + tag, got[t],
                   want);
        ok = 0;
      } else if (!matches(data[t], want, 100 * n + tag, why, sizeof why)) {
        check_fail(ck, "group of n=%d: buffer %d (tag %d): %s", n, t, 1000 + tag, why);
        ok = 0;
      }
    }
  }
  buf_free(ck, &b);
  return ok;
}

/* -- 32 grouped receives of 8 posted at once; the sender then posts all 256 isends before testing
 * any (NCCL_NET_MAX_REQUESTS x maxRecvs). Sizes differ per tag; tags shuffled per group. */
#define BURST_GROUPS 32
#define BURST_SLOT (8 * KIB)
static size_t burst_size(int g, int tag) { return (size_t)(512 * (tag + 1) + g); }
static int burst_send(int ck, void* comm) {
  regbuf b;
  if (!buf_alloc(ck, &b, comm, (size_t)BURST_GROUPS * 8 * BURST_SLOT)) return 0;
  static void* reqs[BURST_GROUPS * 8];
  int ok = 1, posted = 0;
  for (int g = 0; g < BURST_GROUPS && ok; g++)
    for (int i = 0; i < 8 && ok; i++) {
      int tag = shuffle8[(i + g) % 8];
      unsigned char* p = b.p + ((size_t)g * 8 + (size_t)tag) * BURST_SLOT;
      fill(p, burst_size(g, tag), 7 * g + tag);
      char what[64];
      snprintf(what, sizeof what, "isend %d of 256 (none tested yet)", posted + 1);
      reqs[posted] = post_send(ck, comm, p, burst_size(g, tag), tag, b.mh, what);
      ok = reqs[posted++] != NULL;
    }
  for (int i = 0; i < posted && ok; i++) ok = wait_req(ck, reqs[i], NULL, "burst send");
  buf_free(ck, &b);
  return ok;
}
static int burst_recv(int ck, void* comm) {
  regbuf b;
  if (!buf_alloc(ck, &b, comm, (size_t)BURST_GROUPS * 8 * BURST_SLOT)) return 0;
  memset(b.p, 0xee, b.size);
  static void* reqs[BURST_GROUPS];
  static int got[BURST_GROUPS][8];
  int ok = 1;
  for (int g = 0; g < BURST_GROUPS && ok; g++) {
    void* data[8];
    size_t sz[8];
    int tags[8];
    void* mhs[8];
    for (int t = 0; t < 8; t++) {
      data[t] = b.p + ((size_t)g * 8 + (size_t)t) * BURST_SLOT;
      sz[t] = BURST_SLOT;
      tags[t] = t;
      mhs[t] = b.mh;
    }
    char what[64];
    snprintf(what, sizeof what, "grouped irecv %d of 32 (none tested yet)", g + 1);
    reqs[g] = post_recv(ck, comm, 8, data, sz, tags, mhs, NULL, what);
    ok = reqs[g] != NULL;
  }
  for (int g = 0; g < BURST_GROUPS && ok; g++) {
    ok = wait_req(ck, reqs[g], got[g], "burst recv");
    for (int t = 0; t < 8 && ok; t++) {
      char why[128];
      unsigned char* p = b.p + ((size_t)g * 8 + (size_t)t) * BURST_SLOT;
      if ((size_t)got[g][t] != burst_size(g, t)) {
        check_fail(ck, "group %d tag %d: reported %d bytes, expected %zu", g, t, got[g][t], burst_size(g, t));
        ok = 0;
      } else if (!matches(p, burst_size(g, t), 7 * g + t, why, sizeof why)) {
        check_fail(ck, "group %d tag %d: %s", g, t, why);
        ok = 0;
      }
    }
  }
  buf_free(ck, &b);
  return ok;
}

/* -- channels: C channels share one comm, each keeping 8 transfers in flight (NCCL_STEPS). The
 * receiver groups 8 channels per irecv (as NCCL's proxy does), 8 steps deep per group. */
#define CHANNELS 16
#define CH_MSG (16 * KIB)
static int ch_rounds(void) { return quick ? 4 : 16; }
static unsigned ch_seed(int round, int step, int ch) { return (unsigned)(round * 1000 + step * 37 + ch); }
static size_t ch_size(int round, int step, int ch) { return (size_t)(CH_MSG - 64 * ((round + step + ch) % 17)); }
static int channels_send(int ck, void* comm) {
  regbuf b;
  if (!buf_alloc(ck, &b, comm, (size_t)CHANNELS * 8 * CH_MSG)) return 0;
  void* reqs[CHANNELS * 8] = {0};
  int ok = 1;
  int rounds = ch_rounds();
  /* slot (step, ch); for every round, in fixed order, wait for the slot's previous send, then post */
  for (int round = 0; round <= rounds && ok; round++)
    for (int step = 0; step < 8 && ok; step++)
      for (int ch = 0; ch < CHANNELS && ok; ch++) {
        int slot = step * CHANNELS + ch;
        unsigned char* p = b.p + (size_t)slot * CH_MSG;
        if (reqs[slot]) {
          ok = wait_req(ck, reqs[slot], NULL, "channel send");
          reqs[slot] = NULL;
        }
        if (!ok || round == rounds) continue;
        size_t size = ch_size(round, step, ch);
        fill(p, size, ch_seed(round, step, ch));
        reqs[slot] = post_send(ck, comm, p, size, ch, b.mh, "channel send");
        ok = reqs[slot] != NULL;
      }
  buf_free(ck, &b);
  return ok;
}
static int channels_recv(int ck, void* comm) {
  regbuf b;
  if (!buf_alloc(ck, &b, comm, (size_t)CHANNELS * 8 * CH_MSG)) return 0;
  int groups = CHANNELS / 8;
  void* reqs[8][CHANNELS / 8] = {{0}};
  int got[8][CHANNELS / 8][8];
  int ok = 1;
  int rounds = ch_rounds();
  for (int round = 0; round <= rounds && ok; round++)
    for (int step = 0; step < 8 && ok; step++)
      for (int g = 0; g < groups && ok; g++) {
        if (reqs[step][g]) {
          ok = wait_req(ck, reqs[step][g], got[step][g], "channel recv");
          reqs[step][g] = NULL;
          for (int t = 0; t < 8 && ok; t++) {
            int ch = g * 8 + t;
            unsigned char* p = b.p + (size_t)(step * CHANNELS + ch) * CH_MSG;
            size_t want = ch_size(round - 1, step, ch);
            char why[128];
            if ((size_t)got[step][g][t] != want) {
              check_fail(ck, "round %d step %d channel %d: %d bytes, expected %zu", round - 1, step, ch,
                         got[step][g][t], want);
              ok = 0;
            } else if (!matches(p, want, ch_seed(round - 1, step, ch), why, sizeof why)) {
              check_fail(ck, "round %d step %d channel %d: %s", round - 1, step, ch, why);
              ok = 0;
            }
          }
        }
        if (!ok || round == rounds) continue;
        void* data[8];
        size_t sz[8];
        int tags[8];
        void* mhs[8];
        for (int t = 0; t < 8; t++) {
          int ch = g * 8 + t;
          data[t] = b.p + (size_t)(step * CHANNELS + ch) * CH_MSG;
          sz[t] = CH_MSG;
          tags[t] = ch;
          mhs[t] = b.mh;
        }
        reqs[step][g] = post_recv(ck, comm, 8, data, sz, tags, mhs, NULL, "channel recv");
        ok = reqs[step][g] != NULL;
      }
  buf_free(ck, &b);
  return ok;
}

/* -- registration on a service thread while the progress thread moves data on the same comm. */
typedef struct {
  int ck;
  void* comm;
  volatile int stop;
  int iterations;
  int failed;
} reg_thread_arg;
static void* reg_thread(void* argp) {
  reg_thread_arg* a = argp;
  size_t size = 4096;
  while (!a->stop) {
    unsigned char* p = aligned_alloc(4096, size);
    if (!p) break;
    void* mh = NULL;
    nccl_result r = p_reg_mr(a->comm, p, size, &mh);
    if (r != NCCL_OK || !mh) {
      check_fail(a->ck, "regMr on the service thread (iteration %d, %zu bytes) returned %d while data moved", a->iterations, size, r);
      a->failed = 1;
      free(p);
      break;
    }
    r = p_dereg_mr(a->comm, mh);
    free(p);
    if (r != NCCL_OK) {
      check_fail(a->ck, "deregMr on the service thread (iteration %d) returned %d while data moved", a->iterations, r);
      a->failed = 1;
      break;
    }
    a->iterations++;
    size = size >= 1 * MIB ? 4096 : size * 4;
  }
  return NULL;
}
#define MT_MSGS(q) ((q) ? 200 : 1000)
#define MT_SIZE (64 * KIB)
static int mt_run(int ck, void* comm, int sender) {
  regbuf b;
  if (!buf_alloc(ck, &b, comm, 8 * MT_SIZE)) return 0;
  reg_thread_arg a = {.ck = ck, .comm = comm};
  pthread_t th;
  if (pthread_create(&th, NULL, reg_thread, &a)) {
    check_fail(ck, "pthread_create");
    buf_free(ck, &b);
    return 0;
  }
  void* win[8] = {0};
  int ok = 1, n = MT_MSGS(quick);
  for (int i = 0; i < n + 8 && ok; i++) {
    int w = i % 8;
    unsigned char* p = b.p + (size_t)w * MT_SIZE;
    if (win[w]) {
      int got[1] = {-1};
      ok = wait_req(ck, win[w], got, sender ? "send" : "recv");
      win[w] = NULL;
      char why[128];
      if (ok && !sender && !matches(p, MT_SIZE, (unsigned)(i - 8), why, sizeof why)) {
        check_fail(ck, "message %d: %s", i - 8, why);
        ok = 0;
      }
    }
    if (!ok || i >= n) continue;
    if (sender) {
      fill(p, MT_SIZE, (unsigned)i);
      win[w] = post_send(ck, comm, p, MT_SIZE, 0, b.mh, "isend beside regMr");
    } else {
      void* data[1] = {p};
      size_t sz[1] = {MT_SIZE};
      int tags[1] = {0};
      void* mhs[1] = {b.mh};
      win[w] = post_recv(ck, comm, 1, data, sz, tags, mhs, NULL, "irecv beside regMr");
    }
    ok = win[w] != NULL;
  }
  a.stop = 1;
  pthread_join(th, NULL);
  if (ok && !a.failed && a.iterations < 2) {
    check_fail(ck, "the service thread managed only %d regMr/deregMr pairs during the transfers", a.iterations);
    ok = 0;
  }
  if (verbose) fprintf(stderr, "  [%s] %d regMr/deregMr pairs beside %d transfers\n", side_name, a.iterations, n);
  buf_free(ck, &b);
  return ok && !a.failed;
}
static int mt_send(int ck, void* comm) { return mt_run(ck, comm, 1); }
static int mt_recv(int ck, void* comm) { return mt_run(ck, comm, 0); }

/* -- optional receive completion hint (v9+): *request preset to 0x1; the plugin must return a
 * real request and the data must arrive. Then iflush with nothing to flush. */
static int hint_send(int ck, void* comm) {
  regbuf b;
  if (!buf_alloc(ck, &b, comm, 64 * KIB)) return 0;
  int ok = 1;
  for (int i = 0; i < 8 && ok; i++) {
    size_t size = i == 3 ? 0 : (size_t)(i + 1) * 4096;
    fill(b.p, size, 300 + i);
    void* req = post_send(ck, comm, b.p, size, 2, b.mh, "send for the hinted receive");
    ok = req && wait_req(ck, req, NULL, "send for the hinted receive");
  }
  buf_free(ck, &b);
  return ok;
}
static int hint_recv(int ck, void* comm) {
  regbuf b;
  if (!buf_alloc(ck, &b, comm, 64 * KIB)) return 0;
  int ok = 1;
  for (int i = 0; i < 8 && ok; i++) {
    size_t want = i == 3 ? 0 : (size_t)(i + 1) * 4096;
    void* data[1] = {b.p};
    size_t sz[1] = {64 * KIB};
    int tags[1] = {2}, got[1] = {-1};
    void* mhs[1] = {b.mh};
    void* req = post_recv(ck, comm, 1, data, sz, tags, mhs, OPTIONAL_RECV_COMPLETION, "hinted irecv");
    ok = req && wait_req(ck, req, got, "hinted irecv");
    char why[128];
    if (ok && (size_t)got[0] != want) {
      /* with the hint the plugin may complete early, but the size it reports must still be right */
      check_fail(ck, "hinted receive %d: test reported %d bytes, expected %zu", i, got[0], want);
      ok = 0;
    } else if (ok && !matches(b.p, want, 300 + i, why, sizeof why)) {
      check_fail(ck, "hinted receive %d: %s", i, why);
      ok = 0;
    }
  }
  buf_free(ck, &b);
  return ok;
}

static int flush_send(int ck, void* comm) {
  regbuf b;
  if (!buf_alloc(ck, &b, comm, 64 * KIB)) return 0;
  fill(b.p, 64 * KIB, 77);
  void* req = post_send(ck, comm, b.p, 64 * KIB, 0, b.mh, "send before iflush");
  int ok = req && wait_req(ck, req, NULL, "send before iflush");
  buf_free(ck, &b);
  return ok;
}
static int flush_recv(int ck, void* comm) {
  regbuf b;
  if (!buf_alloc(ck, &b, comm, 64 * KIB)) return 0;
  void* data[1] = {b.p};
  size_t sz[1] = {64 * KIB};
  int tags[1] = {0}, got[1] = {-1};
  void* mhs[1] = {b.mh};
  void* req = post_recv(ck, comm, 1, data, sz, tags, mhs, NULL, "recv before iflush");
  int ok = req && wait_req(ck, req, got, "recv before iflush");
  char why[128];
  if (ok && !matches(b.p, 64 * KIB, 77, why, sizeof why)) {
    check_fail(ck, "data before iflush: %s", why);
    ok = 0;
  }
  if (ok) {
    int isz[1] = {got[0]};
    void* freq = (void*)0xdead; /* must be overwritten: NULL (nothing to flush) or a request */
    nccl_result r = p_iflush(comm, 1, data, isz, mhs, &freq);
    if (r != NCCL_OK) {
      check_fail(ck, "iflush of a host buffer returned %d", r);
      ok = 0;
    } else if (freq == (void*)0xdead) {
      check_fail(ck, "iflush returned success but did not write *request");
      ok = 0;
    } else if (freq) {
      ok = wait_req(ck, freq, NULL, "iflush request");
    }
  }
  buf_free(ck, &b);
  return ok;
}

/* Run one two-process check: fork receiver and sender, each loads the library, connects, runs its
 * part, closes. The connection check itself ("connect") verifies non-blocking polling. */
static const char* lib_path;

static int close_checked(int ck, conn_t* c) {
  int ok = 1;
  if (c->send) {
    nccl_result r = p_close_send(c->send);
    if (r != NCCL_OK) {
      check_fail(ck, "closeSend returned %d", r);
      ok = 0;
    }
  }
  if (c->recv) {
    nccl_result r = p_close_recv(c->recv);
    if (r != NCCL_OK) {
      check_fail(ck, "closeRecv returned %d", r);
      ok = 0;
    }
  }
  return ok;
}

static void pair_side(int ck, const pair_check* pc, int is_sender) {
  side_name = is_sender ? "sender" : "receiver";
  alarm((unsigned)(timeout_s * 4 + 60));
  int ok = load_and_init(lib_path, ck, (uint64_t)0xc0ffee + (uint64_t)is_sender);
  /* Both sides learn whether the other one is ready, so a failed init does not leave the peer
   * waiting for a handle. */
  if (!peer_sync(ok) || !ok) {
    if (ok) check_fail(ck, "the other process could not start (see its reason)");
    _exit(1);
  }
  conn_t c = {0};
  ok = is_sender ? send_establish(ck, &c) : recv_establish(ck, &c);
  if (ok && c.max_call_s > 5) {
    check_fail(ck, "a single %s call blocked for %.1f s (it must return at once and be polled)",
               is_sender ? "connect" : "accept", c.max_call_s);
    ok = 0;
  }
  if (!peer_sync(ok) || !ok) {
    close_checked(ck, &c);
    _exit(1);
  }
  if (pc->sender) ok = is_sender ? pc->sender(ck, c.send) : pc->receiver(ck, c.recv);
  /* tell the peer we are done before closing, so neither closes under the other's last test */
  int peer_ok = peer_sync(ok);
  ok &= close_checked(ck, &c);
  if (version >= 11 && p_finalize(ctx) != NCCL_OK) {
    check_fail(ck, "finalize after closing the comms returned an error");
    ok = 0;
  }
  (void)peer_ok;
  check_done(ck);
  _exit(ok ? 0 : 1);
}

/* --across: -1 both sides here (socketpair), 0 this host is the receiver, 1 the sender. */
static int across_role = -1;
static int across_port;
static struct sockaddr_in across_peer;

/* The control connection of one check across hosts: the receiver accepts one on across_port,
 * the sender dials the receiver (retrying while it does not listen yet). -1 after timeout_s. */
static int across_connect(int ck) {
  double start = now_s();
  if (across_role == 0) {
    int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((unsigned short)across_port)};
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
        bind(fd, (struct sockaddr*)&sin, sizeof sin) || listen(fd, 1)) {
      check_fail(ck, "control: cannot listen on port %d: %s", across_port, strerror(errno));
      if (fd >= 0) close(fd);
      return -1;
    }
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int conn = poll(&pfd, 1, (int)(timeout_s * 4 * 1000)) == 1 ? accept(fd, NULL, NULL) : -1;
    close(fd);
    if (conn < 0) check_fail(ck, "control: no sender connected to port %d", across_port);
    return conn;
  }
  for (;;) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr*)&across_peer, sizeof across_peer) == 0) return fd;
    if (fd >= 0) close(fd);
    if (now_s() - start > timeout_s * 4) {
      check_fail(ck, "control: the receiver host is not reachable");
      return -1;
    }
    usleep(100000);
  }
}

/* One side of a two-process check, the other side on another host (--across). */
static void run_pair_across(const pair_check* pc) {
  int ck = check_new(1, "v%d %s (across hosts, %s)", version, pc->name, across_role ? "sender" : "receiver");
  int fd = across_connect(ck);
  if (fd < 0) {
    check_settle(ck);
    return;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    peer_fd = fd;
    pair_side(ck, pc, across_role);
  }
  close(fd);
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    check_fail(ck, "the %s process was killed by signal %d (%s)%s", across_role ? "sender" : "receiver", sig,
               strsignal(sig), sig == SIGALRM ? ": watchdog, the check hung" : "");
  }
  check_settle(ck);
}

static void run_pair(const pair_check* pc) {
  if (across_role >= 0) {
    run_pair_across(pc);
    return;
  }
  int ck = check_new(2, "v%d %s", version, pc->name);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) {
    check_fail(ck, "socketpair: %s", strerror(errno));
    check_settle(ck);
    return;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t recv_pid = fork();
  if (recv_pid == 0) {
    close(sv[1]);
    peer_fd = sv[0];
    pair_side(ck, pc, 0);
  }
  pid_t send_pid = fork();
  if (send_pid == 0) {
    close(sv[0]);
    peer_fd = sv[1];
    pair_side(ck, pc, 1);
  }
  close(sv[0]);
  close(sv[1]);
  /* reap both; when one dies of a signal, say so */
  for (int k = 0; k < 2; k++) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) break;
    const char* who = pid == recv_pid ? "receiver" : "sender";
    if (WIFSIGNALED(status)) {
      int sig = WTERMSIG(status);
      check_fail(ck, "the %s process was killed by signal %d (%s)%s", who, sig, strsignal(sig),
                 sig == SIGALRM ? ": watchdog, the check hung" : "");
    }
  }
  check_settle(ck);
}

/* ---------------------------------------------------------------- one-process checks */

typedef int (*solo_fn)(int ck);

static void run_solo(const char* name, solo_fn fn, int needs_init) {
  int ck = check_new(1, "v%d %s", version, name);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    side_name = "solo";
    alarm((unsigned)(timeout_s * 4 + 60));
    if (needs_init && !load_and_init(lib_path, ck, 0xabc)) _exit(1);
    int ok = fn(ck);
    if (ok) check_done(ck);
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    check_fail(ck, "the process was killed by signal %d (%s)%s", sig, strsignal(sig),
               sig == SIGALRM ? ": watchdog, the check hung" : "");
  }
  check_settle(ck);
}

/* NULL and bogus handles: every call must return an error (a crash is reported by run_solo). */
#define EXPECT_ERR(call, what)                                                                \
  do {                                                                                        \
    nccl_result r_ = (call);                                                                  \
    if (r_ == NCCL_OK) {                                                                      \
      check_fail(ck, "%s returned success", what);                                            \
      ok = 0;                                                                                 \
    }                                                                                         \
  } while (0)

static int bogus_calls(int ck) {
  int ok = 1;
  void* bogus = (void*)0x12345678;
  void* heap = malloc(4096); /* readable memory that is not a plugin object */
  memset(heap, 0x5a, 4096);
  char buf[64];
  void* data[1] = {buf};
  size_t sz[1] = {sizeof buf};
  int tags[1] = {0}, isz[1] = {sizeof buf};
  void* mhs[1] = {bogus};
  void* req = NULL;
  void* out = NULL;
  int done = 0, dsz[8];
  void* objs[3] = {NULL, bogus, heap};
  const char* names[3] = {"NULL", "bogus", "heap (not a plugin object)"};
  for (int k = 0; k < 3; k++) {
    void* o = objs[k];
    char what[96];
#define W(fmt) (snprintf(what, sizeof what, fmt, names[k]), what)
    EXPECT_ERR(p_isend(o, buf, 8, 0, bogus, &req), W("isend on a %s sendComm"));
    EXPECT_ERR(p_irecv(o, 1, data, sz, tags, mhs, &req), W("irecv on a %s recvComm"));
    EXPECT_ERR(p_iflush(o, 1, data, isz, mhs, &req), W("iflush on a %s recvComm"));
    EXPECT_ERR(p_test(o, &done, dsz), W("test on a %s request"));
    EXPECT_ERR(p_reg_mr(o, buf, sizeof buf, &out), W("regMr on a %s comm"));
    EXPECT_ERR(p_dereg_mr(o, bogus), W("deregMr on a %s comm"));
    EXPECT_ERR(p_accept(o, &out), W("accept on a %s listenComm"));
    EXPECT_ERR(p_close_send(o), W("closeSend of a %s comm"));
    EXPECT_ERR(p_close_recv(o), W("closeRecv of a %s comm"));
    EXPECT_ERR(p_close_listen(o), W("closeListen of a %s comm"));
    if (version >= 11 && o) {
      char handle[NET_HANDLE_MAXSIZE] = {0};
      EXPECT_ERR(T(12)->finalize(o), W("finalize of a %s ctx"));
      EXPECT_ERR(T(12)->listen(o, dev, handle, &out), W("listen with a %s ctx"));
      net_attr attr;
      memset(&attr, 0xff, sizeof attr);
      EXPECT_ERR(T(12)->set_net_attr(o, &attr), W("setNetAttr with a %s ctx"));
    }
#undef W
  }
  int n = 0;
  p_devices(&n);
  {
    char handle[NET_HANDLE_MAXSIZE] = {0};
    EXPECT_ERR(p_listen(ctx, n, handle, &out), "listen on a device index that does not exist");
    EXPECT_ERR(p_listen(ctx, -1, handle, &out), "listen on device -1");
  }
  /* stale objects: a closed listenComm, a deregistered mhandle */
  {
    char handle[NET_HANDLE_MAXSIZE] = {0};
    void* l = NULL;
    if (p_listen(ctx, dev, handle, &l) == NCCL_OK && l) {
      if (p_close_listen(l) != NCCL_OK) {
        check_fail(ck, "closeListen of a fresh listenComm failed");
        ok = 0;
      }
      EXPECT_ERR(p_close_listen(l), "closeListen of an already closed listenComm");
      EXPECT_ERR(p_accept(l, &out), "accept on a closed listenComm");
    } else {
      check_fail(ck, "listen failed");
      ok = 0;
    }
  }
  free(heap);
  return ok;
}

/* Listen, then connect and accept to itself interleaved in this one thread, then closeListen.
 * Returns 1 with both comms, or 0 after failing the check. */
static int connect_to_self(int ck, void** send, void** recv) {
  char handle[NET_HANDLE_MAXSIZE] = {0};
  void *l = NULL, *s = NULL, *r = NULL;
  nccl_result rc = p_listen(ctx, dev, handle, &l);
  if (rc != NCCL_OK || !l) {
    check_fail(ck, "listen returned %d", rc);
    return 0;
  }
  double start = now_s();
  while (!s || !r) {
    if (!s && (rc = p_connect(ctx, dev, handle, &s)) != NCCL_OK) {
      check_fail(ck, "connect to itself returned %d", rc);
      return 0;
    }
    if (!r && (rc = p_accept(l, &r)) != NCCL_OK) {
      check_fail(ck, "accept from itself returned %d", rc);
      return 0;
    }
    if (now_s() - start > timeout_s) {
      check_fail(ck, "connecting to itself from one thread did not finish in %.0f s (connect %s, accept %s)",
                 timeout_s, s ? "done" : "pending", r ? "done" : "pending");
      return 0;
    }
  }
  *send = s;
  *recv = r;
  if ((rc = p_close_listen(l)) != NCCL_OK) {
    check_fail(ck, "closeListen returned %d", rc);
    return 0;
  }
  return 1;
}

/* Free both buffers, close both comms of a connection to itself and (v11+) finalize. */
static int release_self(int ck, regbuf* sb, regbuf* rb, void* s, void* r) {
  buf_free(ck, sb);
  buf_free(ck, rb);
  conn_t c = {.send = s, .recv = r};
  int ok = close_checked(ck, &c);
  if (version >= 11 && p_finalize(ctx) != NCCL_OK) {
    check_fail(ck, "finalize returned an error");
    ok = 0;
  }
  return ok;
}

/* Receives posted back to back must all reach the sender without any further call on the
 * receiving comm (NCCL's IB transport writes each clear-to-send in irecv): from one thread, post
 * 16 receives, then isend 16 messages calling nothing but isend until each is taken, then test. */
#define POSTED_AHEAD 16
static int posted_receives_reach_the_sender(int ck) {
  void *s = NULL, *r = NULL;
  if (!connect_to_self(ck, &s, &r)) return 0;
  const size_t msg = 4096;
  regbuf sb, rb;
  if (!buf_alloc(ck, &sb, s, POSTED_AHEAD * msg)) return 0;
  if (!buf_alloc(ck, &rb, r, POSTED_AHEAD * msg)) return 0;
  void *rreq[POSTED_AHEAD] = {0}, *sreq[POSTED_AHEAD] = {0};
  char what[64];
  for (int i = 0; i < POSTED_AHEAD; i++) {
    fill(sb.p + i * msg, msg, 20 + i);
    void* data[1] = {rb.p + i * msg};
    size_t sz[1] = {msg};
    int tags[1] = {i};
    void* mhs[1] = {rb.mh};
    snprintf(what, sizeof what, "receive %d of %d", i, POSTED_AHEAD);
    if (!(rreq[i] = post_recv(ck, r, 1, data, sz, tags, mhs, NULL, what))) return 0;
  }
  /* Nothing but isend from here until every send is taken: the receives must already be known. */
  for (int i = 0; i < POSTED_AHEAD; i++) {
    snprintf(what, sizeof what, "send %d of %d, its receive posted, nothing else called", i, POSTED_AHEAD);
    if (!(sreq[i] = post_send(ck, s, sb.p + i * msg, msg, i, sb.mh, what))) return 0;
  }
  int ok = 1;
  for (int i = 0; i < POSTED_AHEAD; i++) {
    int got[1] = {-1};
    char why[128];
    if (!wait_req(ck, sreq[i], NULL, "send") || !wait_req(ck, rreq[i], got, "receive")) return 0;
    if (got[0] != (int)msg || !matches(rb.p + i * msg, msg, 20 + i, why, sizeof why)) {
      check_fail(ck, "message %d: %d bytes, %s", i, got[0], got[0] == (int)msg ? why : "wrong size");
      ok = 0;
    }
  }
  return release_self(ck, &sb, &rb, s, r) && ok;
}

/* NCCL's loopback probe: listen, then connect and accept to itself interleaved in one thread,
 * regMr on both comms; then a message through it. */
static int loopback_one_thread(int ck) {
  void *s = NULL, *r = NULL;
  double start;
  if (!connect_to_self(ck, &s, &r)) return 0;
  int ok = 1;
  regbuf sb, rb;
  if (!buf_alloc(ck, &sb, s, 2 * MIB)) return 0;
  if (!buf_alloc(ck, &rb, r, 2 * MIB)) return 0;
  fill(sb.p, 2 * MIB, 9);
  void* data[1] = {rb.p};
  size_t sz[1] = {2 * MIB};
  int tags[1] = {0}, got[1] = {-1};
  void* mhs[1] = {rb.mh};
  void *rreq = NULL, *sreq = NULL;
  start = now_s();
  /* both ends from this one thread: post, then test both until both are done */
  while (!rreq || !sreq) {
    if (!rreq && p_irecv(r, 1, data, sz, tags, mhs, &rreq) != NCCL_OK) {
      check_fail(ck, "irecv on the loopback comm failed");
      return 0;
    }
    if (!sreq && p_isend(s, sb.p, 2 * MIB, 0, sb.mh, &sreq) != NCCL_OK) {
      check_fail(ck, "isend on the loopback comm failed");
      return 0;
    }
    if (now_s() - start > timeout_s) {
      check_fail(ck, "loopback isend/irecv still refused after %.0f s", timeout_s);
      return 0;
    }
  }
  int sdone = 0, rdone = 0;
  while (!sdone || !rdone) {
    if (!sdone && p_test(sreq, &sdone, NULL) != NCCL_OK) {
      check_fail(ck, "test of the loopback send failed");
      return 0;
    }
    if (!rdone && p_test(rreq, &rdone, got) != NCCL_OK) {
      check_fail(ck, "test of the loopback receive failed");
      return 0;
    }
    if (now_s() - start > timeout_s) {
      check_fail(ck, "loopback transfer did not complete in %.0f s (send %s, recv %s)", timeout_s,
                 sdone ? "done" : "pending", rdone ? "done" : "pending");
      return 0;
    }
  }
  char why[128];
  if (got[0] != 2 * MIB || !matches(rb.p, 2 * MIB, 9, why, sizeof why)) {
    check_fail(ck, "loopback message: %d bytes, %s", got[0], got[0] == 2 * MIB ? why : "wrong size");
    ok = 0;
  }
  return release_self(ck, &sb, &rb, s, r) && ok;
}

/* The GPU flush path, run on host memory with the test switch RIVET_TEST_FLUSH_HOST_MEMORY=1 (set
 * here, before init, so discovery sees it): after each receive iflush returns a request that
 * completes (a 1-byte RDMA READ over the comm's loopback queue pair), and is stale after it
 * completed; a receive of 0 bytes needs no flush (NULL); a grouped receive is flushed once. */
static int flush_on_host_memory(int ck) {
  setenv("RIVET_TEST_FLUSH_HOST_MEMORY", "1", 1);
  if (!load_and_init(lib_path, ck, 0xf1)) return 0;
  void *s = NULL, *r = NULL;
  if (!connect_to_self(ck, &s, &r)) return 0;
  const size_t msg = 65536;
  regbuf sb, rb;
  if (!buf_alloc(ck, &sb, s, 2 * msg) || !buf_alloc(ck, &rb, r, 2 * msg)) return 0;
  for (int round = 0; round < 3; round++) {
    fill(sb.p, msg, 40 + round);
    void* data[2] = {rb.p, rb.p + msg};
    size_t sz[2] = {msg, msg};
    int tags[2] = {round, 100 + round}, got[2] = {-1, -1};
    void* mhs[2] = {rb.mh, rb.mh};
    int n = round == 2 ? 2 : 1; /* the last round a grouped receive, its second buffer empty */
    void* rreq = post_recv(ck, r, n, data, sz, tags, mhs, NULL, "receive");
    void* sreq = rreq ? post_send(ck, s, sb.p, msg, round, sb.mh, "send") : NULL;
    void* sreq2 = NULL;
    if (sreq && n == 2) sreq2 = post_send(ck, s, sb.p, 0, 100 + round, sb.mh, "empty send");
    if (!sreq || (n == 2 && !sreq2) || !wait_req(ck, sreq, NULL, "send") ||
        (sreq2 && !wait_req(ck, sreq2, NULL, "empty send")) || !wait_req(ck, rreq, got, "receive"))
      return 0;
    int isz[2] = {got[0], n == 2 ? got[1] : 0};
    void* freq = (void*)0xdead;
    nccl_result rc = p_iflush(r, n, data, isz, mhs, &freq);
    if (rc != NCCL_OK || !freq || freq == (void*)0xdead) {
      check_fail(ck, "round %d: iflush after a %d-byte receive returned %d with request %p (a flush request expected)",
                 round, got[0], rc, freq);
      return 0;
    }
    if (!wait_req(ck, freq, NULL, "flush")) return 0;
    int done = 0;
    if (p_test(freq, &done, NULL) == NCCL_OK) {
      check_fail(ck, "round %d: test of a completed flush request succeeded again (stale request accepted)", round);
      return 0;
    }
    char why[128];
    if (got[0] != (int)msg || !matches(rb.p, msg, 40 + round, why, sizeof why)) {
      check_fail(ck, "round %d: %d bytes, %s", round, got[0], why);
      return 0;
    }
  }
  int zero[1] = {0};
  void* data0[1] = {rb.p};
  void* mhs0[1] = {rb.mh};
  void* freq = (void*)0xdead;
  if (p_iflush(r, 1, data0, zero, mhs0, &freq) != NCCL_OK || freq != NULL) {
    check_fail(ck, "iflush after a 0-byte receive must return a NULL request (got %p)", freq);
    return 0;
  }
  return release_self(ck, &sb, &rb, s, r);
}

/* A device whose registrations pin no pages (a user-space provider such as the project's verbs
 * fabric, which moves memory with process_vm_writev): CONFORMANCE_UNPINNED_DEVICE=1. VmPin then
 * stays 0 and the page accounting of registration_cache is not measurable; the rest of that check
 * (handles shared across comms, deregistration order) still runs. */
static int unpinned_device(void) {
  const char* v = getenv("CONFORMANCE_UNPINNED_DEVICE");
  return v && !strcmp(v, "1");
}

/* KiB that registering `bytes` new bytes must add to VmPin on this device. */
static long pinned_kib(size_t bytes) { return unpinned_device() ? 0 : (long)(bytes / 1024); }

/* Pinned memory of this process (VmPin in /proc/self/status), in KiB; -1 if unreadable. */
static long vm_pin_kib(void) {
  FILE* f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long kib = -1;
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, "VmPin:", 6)) kib = strtol(line + 6, NULL, 10);
  fclose(f);
  return kib;
}

/* regIsGlobal = 1 backed by a registration cache: the same 64 MiB buffer registered twice on each
 * of 100 comms of the device (200 registrations) is pinned once; a range inside a registration pins nothing more,
 * an adjacent one pins its own pages; an mhandle from one comm moves data on another comm of the
 * device; the last deregMr unpins. */
#define CACHE_CONNS 50
#define CACHE_REGS_PER_COMM 2
static int registration_cache(int ck) {
  void *s[CACHE_CONNS] = {0}, *r[CACHE_CONNS] = {0};
  for (int i = 0; i < CACHE_CONNS; i++)
    if (!connect_to_self(ck, &s[i], &r[i])) return 0;
  const size_t big = 64 * MIB;
  unsigned char* buf = aligned_alloc(4096, 2 * big);
  if (!buf) {
    check_fail(ck, "out of memory");
    return 0;
  }
  memset(buf, 0, 2 * big);
  long pin0 = vm_pin_kib();
  if (pin0 < 0) {
    check_fail(ck, "no VmPin line in /proc/self/status");
    return 0;
  }
  void* mh[2 * CACHE_CONNS][CACHE_REGS_PER_COMM];
  void* comm[2 * CACHE_CONNS];
  for (int i = 0; i < CACHE_CONNS; i++) comm[2 * i] = s[i], comm[2 * i + 1] = r[i];
  for (int c = 0; c < 2 * CACHE_CONNS; c++)
    for (int k = 0; k < CACHE_REGS_PER_COMM; k++)
      if (p_reg_mr(comm[c], buf, big, &mh[c][k]) != NCCL_OK || !mh[c][k]) {
        check_fail(ck, "regMr %d of the same buffer on comm %d failed", c * CACHE_REGS_PER_COMM + k, c);
        return 0;
      }
  long pin1 = vm_pin_kib();
  long once = pinned_kib(big);
  if (pin1 - pin0 != once) {
    check_fail(ck, "%d registrations of one 64 MiB buffer on %d comms pinned %ld KiB (once is %ld KiB)",
               2 * CACHE_CONNS * CACHE_REGS_PER_COMM, 2 * CACHE_CONNS, pin1 - pin0, once);
    return 0;
  }
  void *inside = NULL, *adjacent = NULL;
  if (p_reg_mr(s[0], buf + MIB + 123, 4 * MIB, &inside) != NCCL_OK ||
      p_reg_mr(r[0], buf + big, MIB, &adjacent) != NCCL_OK) {
    check_fail(ck, "regMr of a contained or an adjacent range failed");
    return 0;
  }
  long pin2 = vm_pin_kib();
  if (pin2 - pin1 != pinned_kib(MIB)) {
    check_fail(ck, "a contained and an adjacent 1 MiB range pinned %ld KiB more (expected %ld)", pin2 - pin1,
               pinned_kib(MIB));
    return 0;
  }
  /* A message on connection 1 with the handles registered on connection 0's comms. */
  fill(buf, 4096, 31);
  void* data[1] = {buf + 2 * MIB};
  size_t sz[1] = {4096};
  int tags[1] = {0}, got[1] = {-1};
  void* mhs[1] = {mh[1][0]};
  void* rreq = post_recv(ck, r[1], 1, data, sz, tags, mhs, NULL, "receive with connection 0's handle");
  void* sreq = rreq ? post_send(ck, s[1], buf, 4096, 0, mh[0][0], "send with connection 0's handle") : NULL;
  if (!sreq || !wait_req(ck, sreq, NULL, "send") || !wait_req(ck, rreq, got, "receive")) return 0;
  char why[128];
  if (got[0] != 4096 || !matches(buf + 2 * MIB, 4096, 31, why, sizeof why)) {
    check_fail(ck, "message through another comm's handles: %d bytes, %s", got[0], why);
    return 0;
  }
  /* Each deregMr on the comm that registered it; the pages stay pinned until the last. */
  for (int c = 0; c < 2 * CACHE_CONNS; c++)
    for (int k = 0; k < CACHE_REGS_PER_COMM; k++) {
      if (p_dereg_mr(comm[c], mh[c][k]) != NCCL_OK) {
        check_fail(ck, "deregMr %d failed", c * CACHE_REGS_PER_COMM + k);
        return 0;
      }
      long pin = vm_pin_kib();
      int last = c == 2 * CACHE_CONNS - 1 && k == CACHE_REGS_PER_COMM - 1;
      if (!last && pin != pin2) {
        check_fail(ck, "deregMr %d of %d changed VmPin by %ld KiB before the last", c * CACHE_REGS_PER_COMM + k,
                   2 * CACHE_CONNS * CACHE_REGS_PER_COMM,
                   pin - pin2);
        return 0;
      }
    }
  /* `inside` was a hit on the 64 MiB registration: that stays pinned until it goes too. */
  long pin3 = vm_pin_kib();
  if (pin3 != pin2) {
    check_fail(ck, "the contained registration did not keep the 64 MiB pinned (%ld KiB released)", pin2 - pin3);
    return 0;
  }
  if (p_dereg_mr(s[0], inside) != NCCL_OK || p_dereg_mr(r[0], adjacent) != NCCL_OK) {
    check_fail(ck, "deregMr of the contained or adjacent range failed");
    return 0;
  }
  long pin4 = vm_pin_kib();
  if (pin4 != pin0) {
    check_fail(ck, "after the last deregMr %ld KiB are still pinned", pin4 - pin0);
    return 0;
  }
  free(buf);
  int ok = 1;
  for (int i = 0; i < CACHE_CONNS; i++) {
    conn_t c = {.send = s[i], .recv = r[i]};
    ok &= close_checked(ck, &c);
  }
  if (version >= 11 && p_finalize(ctx) != NCCL_OK) {
    check_fail(ck, "finalize returned an error");
    ok = 0;
  }
  return ok;
}

/* v11+: 100 init/finalize cycles (each with a listen on its ctx), then 100 live contexts at once,
 * no thread left behind, finalize twice is an error; then dlclose, dlopen, init and a loopback
 * connection again. */
static int lifecycle(int ck) {
  int threads0 = thread_count();
  if (!load_and_init(lib_path, ck, 1)) return 0;
  int ok = 1;
  if (p_finalize(ctx) != NCCL_OK) {
    check_fail(ck, "first finalize failed");
    return 0;
  }
  for (int i = 0; i < 100 && ok; i++) {
    void* c = NULL;
    nccl_result r = p_init(&c, (uint64_t)i + 100);
    if (r != NCCL_OK || !c) {
      check_fail(ck, "init #%d returned %d, ctx %p", i + 1, r, c);
      return 0;
    }
    char handle[NET_HANDLE_MAXSIZE] = {0};
    void* l = NULL;
    r = p_listen(c, dev, handle, &l);
    if (r != NCCL_OK || !l || p_close_listen(l) != NCCL_OK) {
      check_fail(ck, "listen/closeListen under ctx #%d failed (%d)", i + 1, r);
      ok = 0;
    }
    if (p_finalize(c) != NCCL_OK) {
      check_fail(ck, "finalize #%d failed", i + 1);
      ok = 0;
    }
    if (ok && p_finalize(c) == NCCL_OK) {
      check_fail(ck, "finalize #%d a second time returned success", i + 1);
      ok = 0;
    }
  }
  static void* many[100];
  for (int i = 0; i < 100 && ok; i++) {
    nccl_result r = p_init(&many[i], (uint64_t)i + 1000);
    if (r != NCCL_OK || !many[i]) {
      check_fail(ck, "init of live context #%d returned %d", i + 1, r);
      ok = 0;
    }
    for (int j = 0; j < i && ok; j++)
      if (many[j] == many[i]) {
        check_fail(ck, "contexts #%d and #%d are the same pointer", j + 1, i + 1);
        ok = 0;
      }
  }
  for (int i = 99; i >= 0; i--)
    if (many[i] && p_finalize(many[i]) != NCCL_OK) {
      check_fail(ck, "finalize of live context #%d failed", i + 1);
      ok = 0;
    }
  int threads1 = thread_count();
  if (threads1 != threads0) {
    check_fail(ck, "%d thread(s) before init, %d after the last finalize", threads0, threads1);
    ok = 0;
  }
  if (dlclose(lib_handle) != 0) {
    check_fail(ck, "dlclose: %s", dlerror());
    return 0;
  }
  if (verbose)
    fprintf(stderr, "  [solo] after dlclose the library is %s\n",
            dlopen(lib_path, RTLD_NOW | RTLD_NOLOAD) ? "still mapped" : "unmapped");
  if (!load_and_init(lib_path, ck, 2)) {
    check_fail(ck, "init after dlclose + dlopen failed");
    return 0;
  }
  ok &= loopback_one_thread(ck);
  if (thread_count() != threads0) {
    check_fail(ck, "%d thread(s) before, %d after the reloaded library's last finalize", threads0, thread_count());
    ok = 0;
  }
  return ok;
}

/* ---------------------------------------------------------------- driver */

static const pair_check connect_only = {"connect/accept polled (same handle buffer), closeListen after accept, close",
                                        NULL, NULL};
static const pair_check pair_checks_subset[] = {
    {"transfer: size sweep 1 B .. 4 MiB, receive buffers larger than sends", sweep_send, sweep_recv},
};
static const pair_check pair_checks_full[] = {
    {"0-byte messages", zero_send, zero_recv},
    {"grouped receives n=1..maxRecvs: tag selection, larger buffers, per-buffer sizes", grouped_send, grouped_recv},
    {"32 grouped receives of 8 and 256 isends in flight on one comm", burst_send, burst_recv},
    {"16 channels x 8 in flight sharing one comm (grouped receives of 8 channels)", channels_send, channels_recv},
    {"regMr/deregMr on a service thread while isend/irecv/test run on the same comm", mt_send, mt_recv},
    {"iflush with nothing to flush (NULL request = done)", flush_send, flush_recv},
};
static const pair_check hint_check = {"optional receive completion hint (*request = 0x1 before irecv)", hint_send,
                                      hint_recv};

/* Properties of dev in this version: learn maxRecvs (solo, needs init). */
static int props_check(int ck) {
  int mr = 0, ptr = 0;
  const char* name = NULL;
  nccl_result r = p_props(dev, &mr, &ptr, &name);
  if (r != NCCL_OK) {
    check_fail(ck, "getProperties(%d) returned %d", dev, r);
    return 0;
  }
  if (mr < 1 || !(ptr & PTR_HOST) || !name) {
    check_fail(ck, "device %d: maxRecvs %d, ptrSupport %#x, name %s", dev, mr, ptr, name ? name : "NULL");
    return 0;
  }
  results->checks[ck].reason[0] = 0;
  snprintf(results->checks[ck].reason, REASON_LEN, "%d", mr); /* handed to the orchestrator */
  return 1;
}

static int run_version(int v, int full) {
  version = v;
  int ck = check_new(1, "v%d init, devices, getProperties(%d)", v, dev);
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    side_name = "solo";
    alarm(120);
    int ok = load_and_init(lib_path, ck, 0x77) && props_check(ck);
    if (ok) check_done(ck);
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) check_fail(ck, "killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
  int usable = !check_failed(ck) && results->checks[ck].sides_done == 1;
  if (usable) {
    max_recvs = atoi(results->checks[ck].reason);
    if (max_recvs > 8) max_recvs = 8;
    results->checks[ck].reason[0] = 0;
  }
  check_settle(ck);
  if (!usable) return 0; /* no device: the reason is in the line above */

  if (across_role < 0) { /* one-process checks: a single-host run has them */
    run_solo("NULL, bogus and stale handles give errors, not crashes", bogus_calls, 1);
    run_solo("listen -> connect -> accept to itself from one thread, regMr on both, a message", loopback_one_thread, 1);
    run_solo("16 receives posted back to back reach the sender with no further receiver call",
             posted_receives_reach_the_sender, 1);
    if (full)
      run_solo("GPU flush path on host memory (test switch): iflush requests complete, 0 bytes need none",
               flush_on_host_memory, 0);
    if (full)
      run_solo("one 64 MiB buffer registered on 100 comms (twice each) is pinned once; handles serve every comm",
               registration_cache, 1);
    if (v >= 11) run_solo("init/finalize per communicator x100, 100 live contexts, dlclose + dlopen + init", lifecycle, 0);
  }
  run_pair(&connect_only);
  for (size_t i = 0; i < sizeof pair_checks_subset / sizeof pair_checks_subset[0]; i++)
    run_pair(&pair_checks_subset[i]);
  if (full) {
    for (size_t i = 0; i < sizeof pair_checks_full / sizeof pair_checks_full[0]; i++) {
      if (pair_checks_full[i].sender == burst_send && max_recvs < 8) {
        int c2 = check_new(0, "v%d %s", v, pair_checks_full[i].name);
        check_fail(c2, "maxRecvs is %d; NCCL groups up to 8 receives", max_recvs);
        check_settle(c2);
        continue;
      }
      run_pair(&pair_checks_full[i]);
    }
    if (v >= 9) run_pair(&hint_check);
  }
  return 1;
}

int main(int argc, char** argv) {
  int versions[16], nversions = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--dev") && i + 1 < argc) dev = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--quick")) quick = 1;
    else if (!strcmp(argv[i], "--verbose")) verbose = 1;
    else if (!strcmp(argv[i], "--versions") && i + 1 < argc) {
      char* s = argv[++i];
      for (char* tok = strtok(s, ","); tok && nversions < 16; tok = strtok(NULL, ",")) versions[nversions++] = atoi(tok);
    } else if (!strcmp(argv[i], "--across") && i + 1 < argc) {
      const char* spec = argv[++i];
      const char* colon = strrchr(spec, ':');
      char host[64] = {0};
      if (!strncmp(spec, "receiver:", 9)) {
        across_role = 0;
        across_port = atoi(spec + 9);
      } else if (!strncmp(spec, "sender:", 7) && colon && colon > spec + 7 && (size_t)(colon - spec - 7) < sizeof host) {
        across_role = 1;
        memcpy(host, spec + 7, (size_t)(colon - spec - 7));
        across_peer.sin_family = AF_INET;
        across_peer.sin_port = htons((unsigned short)atoi(colon + 1));
        if (inet_pton(AF_INET, host, &across_peer.sin_addr) != 1) across_role = -2;
      } else across_role = -2;
      if (across_role == -2 || (across_role == 0 && across_port <= 0)) {
        fprintf(stderr, "conformance: --across wants receiver:PORT or sender:A.B.C.D:PORT, not %s\n", spec);
        lib_path = NULL;
        break;
      }
    } else if (argv[i][0] != '-' && !lib_path) lib_path = argv[i];
    else {
      fprintf(stderr, "conformance: unknown argument %s\n", argv[i]);
      lib_path = NULL;
      break;
    }
  }
  if (!lib_path) {
    fprintf(stderr,
            "usage: %s LIB [--dev D] [--versions 12,11,...] [--quick] [--verbose]"
            " [--across receiver:PORT | --across sender:A.B.C.D:PORT]\n",
            argv[0]);
    return 2;
  }
  if (getenv("CONFORMANCE_TIMEOUT_S")) timeout_s = atof(getenv("CONFORMANCE_TIMEOUT_S"));
  if (timeout_s < 1) timeout_s = 60;
  setvbuf(stdout, NULL, _IOLBF, 0);
  results = mmap(NULL, sizeof *results, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (results == MAP_FAILED) return 2;
  memset(results, 0, sizeof *results);
  signal(SIGPIPE, SIG_IGN);
  alarm(1800);

  /* Which versions the library exports (probed in a child: the orchestrator never loads it). */
  int exported = 0; /* bit v */
  {
    int ck = check_new(1, "dlopen %s and find ncclNetPlugin_v6..v12", lib_path);
    int pfd[2];
    if (pipe(pfd)) return 2;
    pid_t pid = fork();
    if (pid == 0) {
      side_name = "solo";
      close(pfd[0]);
      void* h = dlopen(lib_path, RTLD_NOW | RTLD_LOCAL);
      int bits = 0;
      if (!h) check_fail(ck, "dlopen: %s", dlerror());
      else {
        for (int v = 6; v <= 12; v++) {
          char sym[32];
          snprintf(sym, sizeof sym, "ncclNetPlugin_v%d", v);
          const char** t = dlsym(h, sym);
          if (t && !(t[0] && t[0][0])) check_fail(ck, "%s has no name", sym);
          if (t) bits |= 1 << v;
        }
        if (!bits) check_fail(ck, "no ncclNetPlugin_v6..v12 symbol");
      }
      if (write(pfd[1], &bits, sizeof bits) != sizeof bits) _exit(1);
      if (!check_failed(ck)) check_done(ck);
      _exit(0);
    }
    close(pfd[1]);
    if (read(pfd[0], &exported, sizeof exported) != sizeof exported) exported = 0;
    waitpid(pid, NULL, 0);
    check_settle(ck);
  }
  if (nversions == 0)
    for (int v = 12; v >= 6; v--)
      if (exported & (1 << v)) versions[nversions++] = v;
  int newest = 0;
  for (int i = 0; i < nversions; i++)
    if (exported & (1 << versions[i]) && versions[i] > newest) newest = versions[i];
  for (int i = 0; i < nversions; i++) {
    int v = versions[i];
    if (v < 6 || v > 12 || !(exported & (1 << v))) {
      int ck = check_new(0, "v%d exported", v);
      check_fail(ck, "ncclNetPlugin_v%d is not exported by %s", v, lib_path);
      check_settle(ck);
      continue;
    }
    printf("== ncclNetPlugin_v%d (%s)\n", v, v == newest ? "full suite" : "subset");
    if (!run_version(v, v == newest)) {
      /* no device (or no usable init): nothing else can run, and every version would say the same */
      break;
    }
  }
  int pass = 0, fail = 0;
  for (int i = 0; i < results->n; i++) {
    if (results->checks[i].status == ST_PASS) pass++;
    else fail++;
  }
  printf("conformance: %d passed, %d failed\n", pass, fail);
  return fail ? 1 : 0;
}
