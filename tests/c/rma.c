/* RMA conformance: N ranks (forked processes of one host, or spread over hosts) drive the plugin's
 * ncclRmaPlugin_vN table the way NCCL's RMA / GIN proxy does: init, devices, getProperties(0) (a
 * GIN_PROXY device), listen on the RMA context, the 128-byte handles exchanged out of band,
 * connect(netCtx, handles[], nranks, rank, listenComm) with a context that is NOT the RMA one
 * (NCCL passes its NET plugin's; here NULL or a garbage pointer, which the plugin must not use),
 * closeListen, createContext, collective regMrSym of symmetric windows, one-sided operations
 * (iput, iputSignal, iget, iflush) tested until done with rmaProgress on every pass, and the
 * teardown (deregMrSym, destroyContext, closeColl, finalize). Every result is checked against what
 * this program knows each rank wrote: data bytes, the 64-bit signal words (exact sums), guard
 * bytes around every registered window.
 *
 * usage: rma LIB [--ranks N] [--version 13|14|15|16] [--quick] [--kill] [--bench] [--big]
 *                [--serve PORT | --server ADDR:PORT] [--first-rank F] [--local K]
 *   default: iput, iputSignal (INC, ADD), iget at 0, 1, 8, 4095, 64 KiB and 4 MiB from every rank
 *            to every rank at once (itself included), iflush to every rank; signal words exact
 *            with 64 signals per pair in flight over every context; 1,000 random operations per
 *            rank against a model; the promised ncclInvalidArgument cases; guard bytes.
 *   --version: which table drives the run (default 16); the checks are the same.
 *   --quick:  fewer signals per pair (the sizes, the random operations and 4 MiB stay).
 *   --kill:   rank N-1 exits after setup while the others have puts in flight towards it; they
 *             must see an error from test within 60 s (NCCL_IB_TIMEOUT=12 NCCL_IB_RETRY_CNT=2
 *             unless set), queryLastError then says so, and operations between the survivors
 *             still complete and move the right bytes.
 *   --big:    one iput and one iget of 2 GiB + 5 bytes between ranks 0 and 1 (posted in pieces of
 *             at most 1 GiB); needs ~10 GiB of memory, not run in CI.
 *   --bench:  rank 0 puts to rank 1 (64 KiB, 1 MiB, 4 MiB; 8 in flight): "BENCH rma put <size>
 *             <GB/s>"; the 8-byte put-with-signal round trip rank 0 -> 1 -> 0: "BENCH rma
 *             putsignal-rtt 8 <usec>" and "BENCH rma putsignal-half-rtt 8 <usec>".
 *   across hosts: this host runs ranks F .. F+K-1 of N (default: all). One host passes --serve
 *             PORT and serves the exchange over TCP; the others pass --server ADDR:PORT.
 * Results go to stderr ("PASS ..."/"FAIL ..."); the last line is "rma: ..." and the exit status
 * is 0 only if every rank passed. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include "harness.h"
#include "nccl_rma_abi.h"

enum { MAX_RANKS = 8, GUARD = 4096 };
/* Contexts per RMA context: 2 through the v13 and v14 tables, 3 through v15 and v16. */
static int g_nctx = 3;
#define NCTX g_nctx
/* Rank s's part of every window: room for the 4 MiB transfers plus misaligned offsets. */
#define SLOT (((size_t)4 << 20) + ((size_t)64 << 10))
#define SIGNAL_BYTES ((size_t)4096)
/* Signal words (8 bytes each) of the signal window, per source rank s. */
#define WORD_SWEEP_INC(s) (s)
#define WORD_SWEEP_ADD(s) (16 + (s))
#define WORD_PAIR_INC(s) (32 + (s))
#define WORD_PAIR_ADD(s) (48 + (s))
#define WORD_RANDOM(s, j) (64 + (s) * 4 + (j))
#define WORD_BENCH 128
#define WORD_BITS(s) (144 + (s))

static int g_rank = -1, g_nranks = 0, g_fd = -1, g_quick = 0, g_version = 16, g_checks = 0;
static int g_victim = -1; /* --kill: the rank that dies (its death is no failure of the exchange) */
static char g_role[16] = "parent";

/* PASS lines from rank 0 only (every rank checks its own results; failures print from any). */
static void pass(const char* fmt, ...) {
  g_checks++;
  if (g_rank != 0) return;
  va_list ap;
  va_start(ap, fmt);
  h_vline("PASS ", fmt, ap);
  va_end(ap);
}
#define FAIL(...) h_fail(__VA_ARGS__)

/* ---- out-of-band exchange through the parent: every rank gives `len` bytes, gets n*len and the
 * mask of ranks that had died (their part zeroed) ---- */

static int exchange(const void* mine, uint32_t len, void* all, uint32_t* dead) {
  uint32_t mask = 0;
  int ok = h_control_send(g_fd, &len, sizeof len) && h_control_send(g_fd, mine, len) &&
           h_control_recv(g_fd, &mask, sizeof mask) && h_control_recv(g_fd, all, (size_t)len * (size_t)g_nranks);
  if (dead) *dead = mask;
  return ok;
}

/* A barrier; 0 (with a FAIL) if the exchange broke or a rank other than the --kill victim died. */
static int barrier(const char* where) {
  char mine = 1, all[MAX_RANKS];
  uint32_t dead = 0;
  if (!exchange(&mine, 1, all, &dead)) {
    FAIL("barrier %s: the exchange broke", where);
    return 0;
  }
  uint32_t allowed = g_victim >= 0 ? 1u << g_victim : 0;
  if (dead & ~allowed) {
    FAIL("barrier %s: rank(s) %#x died", where, dead & ~allowed);
    return 0;
  }
  return 1;
}

/* ---- deterministic bytes ---- */

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
/* Byte i of the pattern `seed` is byte i % 8 of mix(seed ^ (i / 8) << 20): filled and checked a
 * word at a time (the VM lane runs this under TCG, where a byte at a time is too slow). */
static uint64_t pat_word(uint64_t seed, size_t j) { return mix(seed ^ ((uint64_t)j << 20)); }
static unsigned char pat(uint64_t seed, size_t i) { return (unsigned char)(pat_word(seed, i >> 3) >> (8 * (i & 7))); }
static void pat_fill(unsigned char* p, size_t n, uint64_t seed) {
  size_t words = n / 8;
  for (size_t j = 0; j < words; j++) {
    uint64_t w = pat_word(seed, j); /* little-endian host: byte k of w is byte 8j + k */
    memcpy(p + 8 * j, &w, 8);
  }
  for (size_t i = 8 * words; i < n; i++) p[i] = pat(seed, i);
}
/* Index of the first byte of p[0..n) that differs from the pattern, or n. */
static size_t pat_check(const unsigned char* p, size_t n, uint64_t seed) {
  size_t words = n / 8;
  for (size_t j = 0; j < words; j++) {
    uint64_t w = pat_word(seed, j), got;
    memcpy(&got, p + 8 * j, 8);
    if (got != w)
      for (size_t i = 8 * j;; i++)
        if (p[i] != pat(seed, i)) return i;
  }
  for (size_t i = 8 * words; i < n; i++)
    if (p[i] != pat(seed, i)) return i;
  return n;
}
/* Index of the first byte of p[0..n) that is not `byte`, or n. */
static size_t first_not(const unsigned char* p, size_t n, unsigned char byte) {
  uint64_t want = 0x0101010101010101ull * byte;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t got;
    memcpy(&got, p + i, 8);
    if (got != want) break;
  }
  for (; i < n; i++)
    if (p[i] != byte) return i;
  return n;
}
static uint64_t seed_of(int writer, int target, int a, int b) {
  return mix(((uint64_t)writer << 48) ^ ((uint64_t)target << 32) ^ ((uint64_t)a << 16) ^ (uint64_t)b ^ 0x52697665);
}

/* xorshift64*: the random phase's generator, seeded per rank. */
static uint64_t g_rng;
static uint64_t rnd(void) {
  g_rng ^= g_rng >> 12;
  g_rng ^= g_rng << 25;
  g_rng ^= g_rng >> 27;
  return g_rng * 2685821657736338717ull;
}

/* ---- one internal table over the four ABI versions ---- */

typedef struct {
  nccl_result (*init)(void**, uint64_t, nccl_logger);
  nccl_result (*devices)(int*);
  nccl_result (*get_properties)(int, props_v12*);
  nccl_result (*listen)(void*, int, void*, void**);
  nccl_result (*connect)(void*, void**, int, int, void*, void**);
  nccl_result (*create_context)(void* coll, int ncontexts, int traffic_class, void** rma_ctx);
  nccl_result (*reg)(void* coll, void* data, size_t size, int type, uint64_t flags, void** mh);
  nccl_result (*dereg)(void*, void*);
  nccl_result (*destroy_context)(void*);
  nccl_result (*close_coll)(void*);
  nccl_result (*close_listen)(void*);
  nccl_result (*iput)(void* rctx, int c, uint64_t src_off, void* src_mh, size_t size, uint64_t dst_off, void* dst_mh,
                      uint32_t rank, uint32_t opt, void** req);
  nccl_result (*iput_signal)(void* rctx, int c, uint64_t src_off, void* src_mh, size_t size, uint64_t dst_off,
                             void* dst_mh, uint32_t rank, uint64_t sig_off, void* sig_mh, uint64_t value, uint32_t op,
                             bool strong, uint32_t opt, void** req);
  nccl_result (*iget)(void* rctx, int c, uint64_t remote_off, void* remote_mh, size_t size, uint64_t local_off,
                      void* local_mh, uint32_t rank, uint32_t opt, void** req);
  nccl_result (*iflush)(void*, int, void*, uint32_t, void**);
  nccl_result (*test)(void*, void*, int*);
  nccl_result (*progress)(void*);
  nccl_result (*query_last_error)(void*, bool*);
  nccl_result (*finalize)(void*);
  nccl_result (*get_rma_properties)(void*, rma_properties_v16*); /* v16 only */
} rma_ops;

static rma_ops R;
static rma_v13* t13;
static rma_v14* t14;
static rma_v15* t15;
static rma_v16* t16;
/* What v13's out-params came back as (initialised to a sentinel before each call). */
#define UNSET_PTR ((void*)0x5e5e5e5e5e5eull)
static net_device_handle* g_dev_handle;
static void* g_gin_handle;
static int g_gin_handles_set, g_gin_handles_total;

static nccl_result cc13(void* coll, int n, int tc, void** ctx) {
  gin_config_v13 cfg = {.n_signals = 64, .n_counters = 64, .n_contexts = n, .queue_depth = 256, .traffic_class = tc};
  g_dev_handle = UNSET_PTR;
  return t13->create_context(coll, &cfg, ctx, &g_dev_handle);
}
static nccl_result reg13(void* coll, void* data, size_t size, int type, uint64_t flags, void** mh) {
  g_gin_handle = UNSET_PTR;
  nccl_result r = t13->reg_mr_sym(coll, data, size, type, flags, mh, &g_gin_handle);
  if (r == NCCL_OK) {
    g_gin_handles_total++;
    g_gin_handles_set += g_gin_handle != UNSET_PTR;
  }
  return r;
}
static nccl_result put13(void* x, int c, uint64_t so, void* smh, size_t n, uint64_t d, void* dmh, uint32_t rk,
                         uint32_t opt, void** req) {
  (void)opt;
  return t13->iput(x, c, so, smh, n, d, dmh, rk, req);
}
static nccl_result sig13(void* x, int c, uint64_t so, void* smh, size_t n, uint64_t d, void* dmh, uint32_t rk,
                         uint64_t sg, void* sgmh, uint64_t v, uint32_t op, bool strong, uint32_t opt, void** req) {
  (void)strong; (void)opt;
  return t13->iput_signal(x, c, so, smh, n, d, dmh, rk, sg, sgmh, v, op, req);
}
static nccl_result get13(void* x, int c, uint64_t ro, void* rmh, size_t n, uint64_t lo, void* lmh, uint32_t rk,
                         uint32_t opt, void** req) {
  (void)opt;
  return t13->iget(x, c, ro, rmh, n, lo, lmh, rk, req);
}

/* v14 ... v16 share createContext and regMrSym; v14 has no optFlags. */
#define V14_LIKE(v, t)                                                                                      \
  static nccl_result cc##v(void* coll, int n, int tc, void** ctx) {                                          \
    rma_config_v14 cfg = {.n_contexts = n, .traffic_class = tc, .rank_stride = 1};                          \
    return t->create_context(coll, &cfg, ctx);                                                              \
  }                                                                                                         \
  static nccl_result reg##v(void* coll, void* data, size_t size, int type, uint64_t flags, void** mh) {     \
    return t->reg_mr_sym(coll, data, size, type, flags, mh);                                                \
  }
V14_LIKE(14, t14)
V14_LIKE(15, t15)
V14_LIKE(16, t16)
static nccl_result put14(void* x, int c, uint64_t so, void* smh, size_t n, uint64_t d, void* dmh, uint32_t rk,
                         uint32_t opt, void** req) {
  (void)opt;
  return t14->iput(x, c, so, smh, n, d, dmh, rk, req);
}
static nccl_result sig14(void* x, int c, uint64_t so, void* smh, size_t n, uint64_t d, void* dmh, uint32_t rk,
                         uint64_t sg, void* sgmh, uint64_t v, uint32_t op, bool strong, uint32_t opt, void** req) {
  (void)opt;
  return t14->iput_signal(x, c, so, smh, n, d, dmh, rk, sg, sgmh, v, op, strong, req);
}
static nccl_result get14(void* x, int c, uint64_t ro, void* rmh, size_t n, uint64_t lo, void* lmh, uint32_t rk,
                         uint32_t opt, void** req) {
  (void)opt;
  return t14->iget(x, c, ro, rmh, n, lo, lmh, rk, req);
}

#define COMMON_SLOTS(t)                                                                                     \
  R.init = t->init;                                                                                         \
  R.devices = t->devices;                                                                                   \
  R.get_properties = t->get_properties;                                                                     \
  R.listen = t->listen;                                                                                     \
  R.connect = t->connect;                                                                                   \
  R.dereg = t->dereg_mr_sym;                                                                                \
  R.destroy_context = t->destroy_context;                                                                   \
  R.close_coll = t->close_coll;                                                                             \
  R.close_listen = t->close_listen;                                                                         \
  R.iflush = t->iflush;                                                                                     \
  R.test = t->test;                                                                                         \
  R.progress = t->progress;                                                                                 \
  R.query_last_error = t->query_last_error;                                                                 \
  R.finalize = t->finalize;

/* dlopen the library and fill R from the table of g_version; 0 (with a FAIL) if it is missing. */
static int load_table(const char* path) {
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    FAIL("dlopen %s: %s", path, dlerror());
    return 0;
  }
  char sym[32];
  snprintf(sym, sizeof sym, "ncclRmaPlugin_v%d", g_version);
  void* t = dlsym(lib, sym);
  if (!t) {
    FAIL("symbol %s not found in %s", sym, path);
    return 0;
  }
  memset(&R, 0, sizeof R);
  switch (g_version) {
    case 13:
      t13 = t;
      COMMON_SLOTS(t13);
      R.create_context = cc13;
      R.reg = reg13;
      R.iput = put13;
      R.iput_signal = sig13;
      R.iget = get13;
      break;
    case 14:
      t14 = t;
      COMMON_SLOTS(t14);
      R.create_context = cc14;
      R.reg = reg14;
      R.iput = put14;
      R.iput_signal = sig14;
      R.iget = get14;
      break;
    case 15:
      t15 = t;
      COMMON_SLOTS(t15);
      R.create_context = cc15;
      R.reg = reg15;
      R.iput = t15->iput;
      R.iput_signal = t15->iput_signal;
      R.iget = t15->iget;
      break;
    default:
      t16 = t;
      COMMON_SLOTS(t16);
      R.create_context = cc16;
      R.reg = reg16;
      R.iput = t16->iput;
      R.iput_signal = t16->iput_signal;
      R.iget = t16->iget;
      R.get_rma_properties = t16->get_rma_properties;
      break;
  }
  const char* name = *(const char* const*)t;
  if (!name || strcmp(name, "Rivet") != 0) FAIL("%s name is %s, not Rivet", sym, name ? name : "(null)");
  return 1;
}

/* ---- windows: registered regions with 4 KiB guards on both sides ---- */

typedef struct {
  unsigned char* alloc; /* GUARD + size + GUARD */
  unsigned char* base;  /* the registered window */
  size_t size;
  void* mh;
  const char* name;
} window;

static unsigned char guard_byte(size_t i) { return (unsigned char)(0xa5 ^ (i * 13)); }

static void* g_ctx;    /* the RMA plugin context (init) */
static void* g_coll;   /* the group (connect) */
static void* g_rctx;   /* the RMA context (createContext) */
static window W, S, G; /* data window, source/landing window, signal window */

static int win_alloc(window* w, size_t size, uint64_t flags, const char* name) {
  w->name = name;
  w->size = size;
  w->alloc = aligned_alloc(4096, size + 2 * GUARD);
  if (!w->alloc) {
    FAIL("cannot allocate the %s window (%zu bytes)", name, size);
    return 0;
  }
  w->base = w->alloc + GUARD;
  for (size_t i = 0; i < GUARD; i++) w->alloc[i] = w->base[size + i] = guard_byte(i);
  memset(w->base, 0, size);
  w->mh = NULL;
  nccl_result r = R.reg(g_coll, w->base, size, RMA_PTR_HOST, flags, &w->mh);
  if (r != NCCL_OK || !w->mh) {
    FAIL("regMrSym of the %s window (%zu bytes, flags %#llx) returned %d: %s", name, size, (unsigned long long)flags,
         r, h_last_warn);
    return 0;
  }
  return 1;
}

static int guards_intact(const window* w) {
  for (size_t i = 0; i < GUARD; i++) {
    if (w->alloc[i] != guard_byte(i)) {
      FAIL("guard byte %zu before the %s window was overwritten", GUARD - i, w->name);
      return 0;
    }
    if (w->base[w->size + i] != guard_byte(i)) {
      FAIL("guard byte %zu after the %s window was overwritten", i, w->name);
      return 0;
    }
  }
  return 1;
}

static uint64_t signal_word(int word) {
  return __atomic_load_n((uint64_t*)(G.base + (size_t)word * 8), __ATOMIC_ACQUIRE);
}

/* ---- requests ---- */

static int g_progress_errors;
static void progress(void) {
  if (R.progress(g_rctx) != NCCL_OK) g_progress_errors++;
}

/* Test `req` until done (progress on every pass); 1 when done, 0 on an error or after `limit`. */
static int wait_one(void* req, double limit, const char* what) {
  double start = h_now();
  for (;;) {
    int done = 0;
    progress();
    nccl_result r = R.test(g_coll, req, &done);
    if (r != NCCL_OK) {
      FAIL("%s: test returned %d: %s", what, r, h_last_warn);
      return 0;
    }
    if (done) return 1;
    if (h_now() - start > limit) {
      FAIL("%s: not done after %.0f s", what, limit);
      return 0;
    }
  }
}

/* Test every non-NULL request of reqs[0..n) until all are done (each set to NULL once done). */
static int wait_all(void** reqs, int n, double limit, const char* what) {
  double start = h_now();
  int left = 0;
  for (int i = 0; i < n; i++) left += reqs[i] != NULL;
  while (left > 0) {
    progress();
    for (int i = 0; i < n; i++) {
      if (!reqs[i]) continue;
      int done = 0;
      nccl_result r = R.test(g_coll, reqs[i], &done);
      if (r != NCCL_OK) {
        FAIL("%s: request %d of %d: test returned %d: %s", what, i, n, r, h_last_warn);
        return 0;
      }
      if (done) {
        reqs[i] = NULL;
        left--;
      }
    }
    if (left > 0 && h_now() - start > limit) {
      FAIL("%s: %d of %d request(s) not done after %.0f s", what, left, n, limit);
      return 0;
    }
  }
  return 1;
}

/* A post's result: OK with a request, else a FAIL naming `what`. */
static int posted(nccl_result r, void* req, const char* what, int target, size_t size) {
  if (r != NCCL_OK) {
    FAIL("%s to rank %d (%zu bytes) returned %d: %s", what, target, size, r, h_last_warn);
    return 0;
  }
  if (!req) {
    FAIL("%s to rank %d (%zu bytes) returned success without a request", what, target, size);
    return 0;
  }
  return 1;
}

static uint32_t opt_flags(int i) { return (g_version >= 15 && (i & 1)) ? RMA_OPT_AGGREGATE_REQUESTS : RMA_OPT_DEFAULT; }

/* ---- setup and teardown ---- */

static int setup(void) {
  if (R.init(&g_ctx, 0x7269766574ull, h_logger) != NCCL_OK || !g_ctx) {
    FAIL("init: %s", h_last_warn);
    return 0;
  }
  int ndev = 0;
  if (R.devices(&ndev) != NCCL_OK || ndev < 1) {
    FAIL("devices() returned %d device(s): %s", ndev, h_last_warn);
    return 0;
  }
  props_v12 props;
  memset(&props, 0, sizeof props);
  if (R.get_properties(0, &props) != NCCL_OK) {
    FAIL("getProperties(0): %s", h_last_warn);
    return 0;
  }
  if (props.dev_type != NET_DEVICE_GIN_PROXY) {
    FAIL("getProperties(0): netDeviceType %d, NCCL drops an RMA table unless it is %d (GIN_PROXY)", props.dev_type,
         NET_DEVICE_GIN_PROXY);
    return 0;
  }
  if (!(props.ptr_support & RMA_PTR_HOST)) FAIL("getProperties(0): ptrSupport %#x lacks host memory", props.ptr_support);
  pass("ncclRmaPlugin_v%d: init, %d device(s), device 0 %s is a GIN_PROXY device", g_version, ndev, props.name);

  char handle[RMA_HANDLE_MAXSIZE];
  memset(handle, 0, sizeof handle);
  void* lc = NULL;
  if (R.listen(g_ctx, 0, handle, &lc) != NCCL_OK || !lc) {
    FAIL("listen: %s", h_last_warn);
    return 0;
  }
  char all[RMA_HANDLE_MAXSIZE * MAX_RANKS];
  uint32_t dead = 0;
  if (!exchange(handle, RMA_HANDLE_MAXSIZE, all, &dead) || dead) {
    FAIL("handle exchange");
    return 0;
  }
  void* ptrs[MAX_RANKS];
  for (int i = 0; i < g_nranks; i++) ptrs[i] = all + (size_t)i * RMA_HANDLE_MAXSIZE;
  /* NCCL passes its NET plugin's context here, not this plugin's: the plugin must not use it. */
  void* net_ctx = (g_rank & 1) ? (void*)0x1 : NULL;
  double start = h_now();
  nccl_result r = R.connect(net_ctx, ptrs, g_nranks, g_rank, lc, &g_coll);
  double took = h_now() - start;
  if (R.close_listen(lc) != NCCL_OK) FAIL("closeListen right after connect: %s", h_last_warn);
  if (r != NCCL_OK || !g_coll) {
    FAIL("connect(ctx=%p, %d ranks, rank %d) returned %d: %s", net_ctx, g_nranks, g_rank, r, h_last_warn);
    return 0;
  }
  pass("a group of %d ranks connected in %.2f s (connect given a NULL / garbage NET context)", g_nranks, took);
  if (R.get_rma_properties) {
    rma_properties_v16 rp;
    memset(&rp, 0x77, sizeof rp);
    r = R.get_rma_properties(g_coll, &rp);
    unsigned char raw;
    memcpy(&raw, &rp, 1);
    if (r != NCCL_OK || raw > 1) FAIL("getRmaProperties returned %d, flushesAllPutsOnAnySignal byte %#x", r, raw);
    else pass("getRmaProperties: flushesAllPutsOnAnySignal = %d", raw);
  }
  /* Traffic class: INT_MIN (unset) or -1 (NCCL's two spellings of "none"), by version. */
  int tc = (g_version & 1) ? -1 : INT_MIN;
  r = R.create_context(g_coll, NCTX, tc, &g_rctx);
  if (r != NCCL_OK || !g_rctx) {
    FAIL("createContext(%d contexts, trafficClass %d) returned %d: %s", NCTX, tc, r, h_last_warn);
    return 0;
  }
  if (g_version == 13) {
    if (g_dev_handle == UNSET_PTR) FAIL("v13 createContext did not write *devHandle");
    else if (g_dev_handle)
      pass("v13 createContext: devHandle type %d version %d needsProxyProgress %d", g_dev_handle->type,
           g_dev_handle->version, g_dev_handle->needs_proxy_progress);
    else
      pass("v13 createContext: devHandle NULL (proxy progress)");
  }
  if (!win_alloc(&W, (size_t)g_nranks * SLOT, 0, "data") ||
      !win_alloc(&S, (size_t)g_nranks * SLOT, RMA_MR_FLAG_FORCE_SO, "source") ||
      !win_alloc(&G, SIGNAL_BYTES, RMA_MR_FLAG_SIGNAL_NEVER_RESET, "signal"))
    return 0;
  if (g_version == 13) {
    if (g_gin_handles_set != g_gin_handles_total) FAIL("v13 regMrSym left *ginHandle unset (%d of %d set)",
                                                       g_gin_handles_set, g_gin_handles_total);
    else pass("v13 regMrSym wrote *ginHandle for all %d windows", g_gin_handles_total);
  }
  bool has = true;
  r = R.query_last_error(g_rctx, &has);
  if (r != NCCL_OK || has) FAIL("queryLastError after setup: returned %d, hasError %d", r, has);
  if (!barrier("after setup")) return 0;
  pass("createContext (%d contexts), three windows registered (%zu, %zu, %zu bytes)", NCTX, W.size, S.size, G.size);
  return 1;
}

static void teardown(int strict) {
  nccl_result a = R.dereg(g_coll, W.mh), b = R.dereg(g_coll, S.mh), c = R.dereg(g_coll, G.mh);
  int guards = guards_intact(&W) & guards_intact(&S) & guards_intact(&G);
  nccl_result d = R.destroy_context(g_rctx), e = R.close_coll(g_coll), f = R.finalize(g_ctx);
  if (a || b || c || d || e || f)
    FAIL("teardown: deregMrSym %d %d %d, destroyContext %d, closeColl %d, finalize %d: %s", a, b, c, d, e, f,
         h_last_warn);
  else if (guards)
    pass("the 4 KiB guards around every window untouched; deregMrSym, destroyContext, closeColl, finalize%s",
         strict ? "" : " (after the peer's death)");
}

/* ---- the size sweep: every operation at every size, every rank to every rank at once ---- */

static const size_t SIZES[] = {0, 1, 8, 4095, 65536, (size_t)4 << 20};
enum { NSIZES = 6 };
enum { OP_PUT, OP_SIGNAL_INC, OP_SIGNAL_ADD, OP_GET, NOPS };
static const char* OP_NAMES[] = {"iput", "iputSignal INC", "iputSignal ADD", "iget"};

static size_t src_off(int t, int si) { return (size_t)t * SLOT + (size_t)(si * 5 % 64); }
static size_t dst_off(int writer, int si) { return (size_t)writer * SLOT + (size_t)(si * 3 % 64); }
static uint64_t add_value(int writer, int si) { return ((uint64_t)(si + 1) << 32) + 0xfffffff0ull + (uint64_t)writer; }

/* Check what `writer` put into this rank's window at size index si; 1 if intact. */
static int check_landed(int writer, int si, int op) {
  size_t size = SIZES[si], off = dst_off(writer, si);
  size_t bad = pat_check(W.base + off, size, seed_of(writer, g_rank, si, op));
  if (bad < size) {
    FAIL("%s %zu bytes from rank %d: byte %zu is %#x, want %#x", OP_NAMES[op], size, writer, bad,
         W.base[off + bad], pat(seed_of(writer, g_rank, si, op), bad));
    return 0;
  }
  if ((off > (size_t)writer * SLOT && W.base[off - 1] != 0xee) || W.base[off + size] != 0xee ||
      W.base[off + size + 1] != 0xee) {
    FAIL("%s %zu bytes from rank %d wrote outside [%zu, %zu)", OP_NAMES[op], size, writer, off, off + size);
    return 0;
  }
  return 1;
}

static int sweep_step(int op, int si) {
  size_t size = SIZES[si];
  int n = g_nranks;
  /* Each slot's first 64 + size + 64 bytes: everything this step writes, and the bytes beside. */
  for (int s2 = 0; s2 < n; s2++) {
    memset(W.base + (size_t)s2 * SLOT, 0xee, size + 128);
    memset(S.base + (size_t)s2 * SLOT, 0xdd, size + 128);
  }
  if (op == OP_GET)
    for (int g = 0; g < n; g++) pat_fill(W.base + dst_off(g, si), size, seed_of(g_rank, g, si, op));
  if (!barrier("before a sweep step")) return 0;
  void* reqs[MAX_RANKS] = {0};
  char what[64];
  snprintf(what, sizeof what, "%s (sweep)", OP_NAMES[op]);
  for (int k = 0; k < n; k++) {
    int t = (g_rank + 1 + k) % n, c = (t + si) % NCTX;
    size_t so = src_off(t, si), d = dst_off(g_rank, si);
    nccl_result r;
    if (op != OP_GET) pat_fill(S.base + so, size, seed_of(g_rank, t, si, op));
    if (op == OP_PUT) {
      r = R.iput(g_rctx, c, so, S.mh, size, d, W.mh, (uint32_t)t, opt_flags(k), &reqs[k]);
    } else if (op == OP_GET) {
      r = R.iget(g_rctx, c, dst_off(g_rank, si), W.mh, size, so, S.mh, (uint32_t)t, opt_flags(k), &reqs[k]);
    } else {
      /* A zero-byte iputSignal is a signal alone: NCCL passes no data handles. */
      int word = op == OP_SIGNAL_INC ? WORD_SWEEP_INC(g_rank) : WORD_SWEEP_ADD(g_rank);
      uint32_t sop = op == OP_SIGNAL_INC ? RMA_SIGNAL_OP_INC : RMA_SIGNAL_OP_ADD;
      r = R.iput_signal(g_rctx, c, size ? so : 0, size ? S.mh : NULL, size, size ? d : 0, size ? W.mh : NULL,
                        (uint32_t)t, (uint64_t)word * 8, G.mh, op == OP_SIGNAL_ADD ? add_value(g_rank, si) : 0, sop,
                        (k & 1) != 0, opt_flags(k + 1), &reqs[k]);
    }
    if (!posted(r, reqs[k], what, t, size)) return 0;
  }
  if (!wait_all(reqs, n, 60, what)) return 0;
  /* iflush towards every rank of the data window: a request that completes. */
  for (int t = 0; t < n; t++) {
    nccl_result r = R.iflush(g_rctx, t % NCTX, W.mh, (uint32_t)t, &reqs[t]);
    if (!posted(r, reqs[t], "iflush", t, 0)) return 0;
  }
  if (!wait_all(reqs, n, 60, "iflush")) return 0;
  int ok = 1;
  if (op == OP_PUT) {
    if (!barrier("after the puts")) return 0;
    for (int s = 0; s < n; s++) ok &= check_landed(s, si, op);
  } else if (op == OP_GET) {
    for (int t = 0; t < n; t++) {
      size_t so = src_off(t, si);
      size_t bad = pat_check(S.base + so, size, seed_of(t, g_rank, si, op));
      if (bad < size) {
        FAIL("iget %zu bytes from rank %d: byte %zu is %#x, want %#x", size, t, bad, S.base[so + bad],
             pat(seed_of(t, g_rank, si, op), bad));
        ok = 0;
      } else if (S.base[so + size] != 0xdd || (so > (size_t)t * SLOT && S.base[so - 1] != 0xdd)) {
        FAIL("iget %zu bytes from rank %d wrote outside its landing area", size, t);
        ok = 0;
      }
    }
    if (!barrier("after the gets")) return 0;
  } else {
    /* Wait for each source's signal to reach its exact running total, then its data must be there. */
    for (int s = 0; s < n; s++) {
      int word = op == OP_SIGNAL_INC ? WORD_SWEEP_INC(s) : WORD_SWEEP_ADD(s);
      uint64_t want = 0;
      for (int k = 0; k <= si; k++) want += op == OP_SIGNAL_INC ? 1 : add_value(s, k);
      double start = h_now();
      uint64_t got;
      while ((got = signal_word(word)) != want && h_now() - start < 30) progress();
      if (got != want) {
        FAIL("%s %zu bytes from rank %d: signal word %llu, want %llu", OP_NAMES[op], size, s,
             (unsigned long long)got, (unsigned long long)want);
        ok = 0;
        continue;
      }
      ok &= check_landed(s, si, op);
    }
    if (!barrier("after the signals")) return 0;
    for (int s = 0; s < n; s++) {
      int word = op == OP_SIGNAL_INC ? WORD_SWEEP_INC(s) : WORD_SWEEP_ADD(s);
      uint64_t want = 0;
      for (int k = 0; k <= si; k++) want += op == OP_SIGNAL_INC ? 1 : add_value(s, k);
      if (signal_word(word) != want) {
        FAIL("%s: signal word of rank %d moved past %llu to %llu", OP_NAMES[op], s, (unsigned long long)want,
             (unsigned long long)signal_word(word));
        ok = 0;
      }
    }
  }
  return ok;
}

static void test_sweep(void) {
  for (int op = 0; op < NOPS; op++) {
    int ok = 1;
    for (int si = 0; si < NSIZES && ok; si++) ok &= sweep_step(op, si);
    if (ok)
      pass("%s at 0, 1, 8, 4095, 65536 and 4194304 bytes, every rank to every rank (itself included) at once, "
           "then iflush to every rank (%d ranks)", OP_NAMES[op], g_nranks);
    if (!ok) return;
  }
}

/* ---- signals: K per pair in flight over every context, sums exact, data before each signal ---- */

static size_t pair_off(int writer, int i) { return (size_t)writer * SLOT + (size_t)i * 128; }
static size_t pair_len(int i) { return 1 + (size_t)(i * 37 % 127); }
static uint64_t pair_add(int writer, int i) { return (uint64_t)(i + 1) * 0x100000001ull + (uint64_t)writer * 1000; }

static void test_signals(void) {
  int K = g_quick ? 32 : 64, n = g_nranks;
  memset(W.base, 0xee, W.size);
  if (!barrier("before the signals")) return;
  void** reqs = calloc((size_t)K * n, sizeof(void*));
  for (int i = 0; i < K; i++)
    for (int k = 0; k < n; k++) {
      int t = (g_rank + k) % n, c = i % NCTX, is_add = i & 1;
      size_t len = pair_len(i), so = (size_t)t * SLOT + (size_t)i * 128;
      pat_fill(S.base + so, len, seed_of(g_rank, t, i, 100));
      int word = is_add ? WORD_PAIR_ADD(g_rank) : WORD_PAIR_INC(g_rank);
      void** req = &reqs[i * n + k];
      nccl_result r = R.iput_signal(g_rctx, c, so, S.mh, len, pair_off(g_rank, i), W.mh, (uint32_t)t,
                                    (uint64_t)word * 8, G.mh, is_add ? pair_add(g_rank, i) : 0,
                                    is_add ? RMA_SIGNAL_OP_ADD : RMA_SIGNAL_OP_INC, (i % 3) == 0, opt_flags(i), req);
      if (!posted(r, *req, "iputSignal (pairs)", t, len)) {
        free(reqs);
        return;
      }
    }
  int ok = 1;
  /* The target side first (its own requests progress meanwhile through rmaProgress). */
  for (int s = 0; s < n && ok; s++) {
    uint64_t want_inc = (uint64_t)(K / 2), want_add = 0;
    for (int i = 1; i < K; i += 2) want_add += pair_add(s, i);
    double start = h_now();
    while ((signal_word(WORD_PAIR_INC(s)) != want_inc || signal_word(WORD_PAIR_ADD(s)) != want_add) &&
           h_now() - start < 60) {
      progress();
      /* Keep our own requests moving too. */
      for (int q = 0; q < K * n; q++)
        if (reqs[q]) {
          int done = 0;
          if (R.test(g_coll, reqs[q], &done) != NCCL_OK) {
            FAIL("iputSignal (pairs): test returned an error: %s", h_last_warn);
            ok = 0;
            break;
          }
          if (done) reqs[q] = NULL;
        }
      if (!ok) break;
    }
    uint64_t inc = signal_word(WORD_PAIR_INC(s)), add = signal_word(WORD_PAIR_ADD(s));
    if (ok && (inc != want_inc || add != want_add)) {
      FAIL("%d signals from rank %d: INC word %llu (want %llu), ADD word %#llx (want %#llx)", K, s,
           (unsigned long long)inc, (unsigned long long)want_inc, (unsigned long long)add,
           (unsigned long long)want_add);
      ok = 0;
    }
    for (int i = 0; i < K && ok; i++) {
      size_t len = pair_len(i), off = pair_off(s, i);
      size_t bad = pat_check(W.base + off, len, seed_of(s, g_rank, i, 100));
      if (bad < len || W.base[off + len] != 0xee) {
        FAIL("signal %d from rank %d is in, but its put's bytes are not (byte %zu of %zu)", i, s, bad, len);
        ok = 0;
      }
    }
  }
  if (ok) ok = wait_all(reqs, K * n, 60, "iputSignal (pairs)");
  free(reqs);
  if (!barrier("after the signals")) return;
  for (int s = 0; s < n && ok; s++) {
    uint64_t want_add = 0;
    for (int i = 1; i < K; i += 2) want_add += pair_add(s, i);
    if (signal_word(WORD_PAIR_INC(s)) != (uint64_t)(K / 2) || signal_word(WORD_PAIR_ADD(s)) != want_add) {
      FAIL("signal words of rank %d changed after every signal was counted", s);
      ok = 0;
    }
  }
  /* NCCL's waiter resets a signal word with a plain store: later signals add to what it stored. */
  if (ok) {
    for (int s2 = 0; s2 < n; s2++) {
      __atomic_store_n((uint64_t*)(G.base + (size_t)WORD_PAIR_INC(s2) * 8), 0, __ATOMIC_RELEASE);
      __atomic_store_n((uint64_t*)(G.base + (size_t)WORD_PAIR_ADD(s2) * 8), 1000, __ATOMIC_RELEASE);
    }
    if (!barrier("after the local reset")) return;
    void* again[2 * MAX_RANKS] = {0};
    for (int t = 0; t < n && ok; t++) {
      nccl_result r1 = R.iput_signal(g_rctx, t % NCTX, 0, NULL, 0, 0, NULL, (uint32_t)t,
                                     (uint64_t)WORD_PAIR_INC(g_rank) * 8, G.mh, 0, RMA_SIGNAL_OP_INC, true, 0, &again[2 * t]);
      nccl_result r2 = R.iput_signal(g_rctx, (t + 1) % NCTX, 0, NULL, 0, 0, NULL, (uint32_t)t,
                                     (uint64_t)WORD_PAIR_ADD(g_rank) * 8, G.mh, 24, RMA_SIGNAL_OP_ADD, false, 0,
                                     &again[2 * t + 1]);
      ok = posted(r1, again[2 * t], "signal after a local reset", t, 0) &&
           posted(r2, again[2 * t + 1], "signal after a local reset", t, 0);
    }
    if (ok) ok = wait_all(again, 2 * n, 30, "signals after a local reset");
    for (int s2 = 0; s2 < n && ok; s2++) {
      double start = h_now();
      while ((signal_word(WORD_PAIR_INC(s2)) != 1 || signal_word(WORD_PAIR_ADD(s2)) != 1024) && h_now() - start < 30)
        progress();
      if (signal_word(WORD_PAIR_INC(s2)) != 1 || signal_word(WORD_PAIR_ADD(s2)) != 1024) {
        FAIL("after a local store of 0 / 1000 into the signal words, an INC and an ADD of 24 from rank %d give %llu "
             "and %llu (want 1 and 1024)", s2, (unsigned long long)signal_word(WORD_PAIR_INC(s2)),
             (unsigned long long)signal_word(WORD_PAIR_ADD(s2)));
        ok = 0;
      }
    }
    if (!barrier("after the signals on reset words")) return;
  }
  if (ok)
    pass("%d iputSignal per ordered pair in flight at once (INC and ADD of 64-bit values, %d contexts, strong and "
         "not): every sum exact, every put's bytes there once its signal is; signals after the waiter's own store add to it",
         K, NCTX);
}

/* ---- per-signal visibility: signal i of a source adds 1 << i, so the target knows exactly which
 * signals are in and checks each one's put (up to 64 KiB) the moment its bit shows ---- */

enum { BITS = 48 };
static size_t bits_off(int writer, int i) { return (size_t)writer * SLOT + (size_t)i * 65600; }
static size_t bits_len(int i) { return i % 4 == 0 ? 65536 : (size_t)(1 + i * 211 % 8000); }

static void test_signal_bits(void) {
  int n = g_nranks;
  memset(W.base, 0xee, W.size);
  if (!barrier("before the bit signals")) return;
  void** reqs = calloc((size_t)BITS * n, sizeof(void*));
  int ok = 1;
  for (int i = 0; i < BITS && ok; i++)
    for (int k = 0; k < n && ok; k++) {
      int t = (g_rank + k) % n;
      size_t len = bits_len(i), so = (size_t)t * SLOT + (size_t)i * 65600;
      pat_fill(S.base + so, len, seed_of(g_rank, t, i, 200));
      void** req = &reqs[i * n + k];
      nccl_result r = R.iput_signal(g_rctx, (i * 7 + k) % NCTX, so, S.mh, len, bits_off(g_rank, i), W.mh, (uint32_t)t,
                                    (uint64_t)WORD_BITS(g_rank) * 8, G.mh, 1ull << i, RMA_SIGNAL_OP_ADD, (i & 1) != 0,
                                    opt_flags(i), req);
      ok = posted(r, *req, "iputSignal (bit signals)", t, len);
    }
  uint64_t seen[MAX_RANKS] = {0}, all = (1ull << BITS) - 1;
  int checked = 0;
  double start = h_now();
  while (ok && checked < n * BITS && h_now() - start < 60) {
    progress();
    for (int s = 0; s < n && ok; s++) {
      uint64_t word = signal_word(WORD_BITS(s)), fresh = word & ~seen[s];
      if (word & ~all) {
        FAIL("bit signals from rank %d: the word %#llx has bits no signal carries", s, (unsigned long long)word);
        ok = 0;
      }
      for (int i = 0; i < BITS && ok; i++)
        if (fresh & (1ull << i)) {
          size_t len = bits_len(i), bad = pat_check(W.base + bits_off(s, i), len, seed_of(s, g_rank, i, 200));
          if (bad < len) {
            FAIL("signal %d (bit %d) from rank %d is visible but byte %zu of its %zu-byte put is not", i, i, s, bad,
                 len);
            ok = 0;
          }
          checked++;
        }
      seen[s] = word;
    }
    for (int q = 0; q < BITS * n && ok; q++)
      if (reqs[q]) {
        int done = 0;
        if (R.test(g_coll, reqs[q], &done) != NCCL_OK) {
          FAIL("iputSignal (bit signals): test returned an error: %s", h_last_warn);
          ok = 0;
        } else if (done) {
          reqs[q] = NULL;
        }
      }
  }
  if (ok && checked != n * BITS) {
    FAIL("bit signals: %d of %d seen after 60 s", checked, n * BITS);
    ok = 0;
  }
  if (ok) ok = wait_all(reqs, BITS * n, 60, "iputSignal (bit signals)");
  free(reqs);
  if (!barrier("after the bit signals")) return;
  if (ok)
    pass("%d put-with-signal per ordered pair (puts up to 64 KiB, signal i adds 1 << i): each put's bytes are "
         "there the moment its own signal is",
         BITS);
}

/* ---- one put and one get of a whole window (n x 4.06 MiB), and a second group beside the first ---- */

static void test_whole_window(void) {
  int n = g_nranks, peer = (g_rank + 1) % n, from = (g_rank + n - 1) % n;
  /* --quick: two slots' worth (8.1 MiB), still past 4 MiB, instead of n slots. */
  size_t size = g_quick ? 2 * SLOT : W.size;
  memset(W.base, 0, size);
  pat_fill(S.base, size, seed_of(g_rank, peer, 0, 400));
  if (!barrier("before the whole-window put")) return;
  void* req = NULL;
  nccl_result r = R.iput(g_rctx, 0, 0, S.mh, size, 0, W.mh, (uint32_t)peer, 0, &req);
  if (!posted(r, req, "iput of a whole window", peer, size) || !wait_one(req, 120, "iput of a whole window")) return;
  if (!barrier("after the whole-window put")) return;
  size_t bad = pat_check(W.base, size, seed_of(from, g_rank, 0, 400));
  if (bad < size) {
    FAIL("an iput of the whole %zu-byte window from rank %d: byte %zu is wrong", size, from, bad);
    return;
  }
  memset(S.base, 0, size);
  req = NULL;
  r = R.iget(g_rctx, NCTX - 1, 0, W.mh, size, 0, S.mh, (uint32_t)peer, 0, &req);
  if (!posted(r, req, "iget of a whole window", peer, size) || !wait_one(req, 120, "iget of a whole window")) return;
  bad = pat_check(S.base, size, seed_of(g_rank, peer, 0, 400));
  if (bad < size) {
    FAIL("an iget of rank %d's whole %zu-byte window: byte %zu is wrong", peer, size, bad);
    return;
  }
  if (!barrier("after the whole-window get")) return;
  pass("one iput and one iget of %zu bytes (%s)", size, size == W.size ? "a whole window" : "two slots");
}

static void test_second_group(void) {
  int n = g_nranks, peer = (g_rank + 1) % n, from = (g_rank + n - 1) % n;
  char handle[RMA_HANDLE_MAXSIZE], all[RMA_HANDLE_MAXSIZE * MAX_RANKS];
  memset(handle, 0, sizeof handle);
  void *lc = NULL, *coll = NULL, *rctx = NULL, *wmh = NULL, *gmh = NULL;
  uint32_t dead = 0;
  if (R.listen(g_ctx, 0, handle, &lc) != NCCL_OK || !exchange(handle, RMA_HANDLE_MAXSIZE, all, &dead) || dead) {
    FAIL("second group: listen or exchange: %s", h_last_warn);
    return;
  }
  void* ptrs[MAX_RANKS];
  for (int i = 0; i < n; i++) ptrs[i] = all + (size_t)i * RMA_HANDLE_MAXSIZE;
  nccl_result r = R.connect((void*)0x2, ptrs, n, g_rank, lc, &coll);
  R.close_listen(lc);
  if (r != NCCL_OK || !coll) {
    FAIL("second group: connect returned %d: %s", r, h_last_warn);
    return;
  }
  size_t wsize = (size_t)n * 65536;
  unsigned char* w2 = aligned_alloc(4096, wsize);
  uint64_t* g2 = aligned_alloc(4096, 4096);
  memset(w2, 0, wsize);
  memset(g2, 0, 4096);
  void* coll1 = g_coll;
  g_coll = coll; /* the window helpers register on g_coll */
  r = R.create_context(coll, 1, -1, &rctx);
  nccl_result ra = R.reg(coll, w2, wsize, RMA_PTR_HOST, 0, &wmh), rb = R.reg(coll, g2, 4096, RMA_PTR_HOST, 0, &gmh);
  g_coll = coll1;
  if (r != NCCL_OK || ra != NCCL_OK || rb != NCCL_OK) {
    FAIL("second group: createContext %d, regMrSym %d %d: %s", r, ra, rb, h_last_warn);
    return;
  }
  if (!barrier("second group formed")) return;
  /* One put-with-signal on each group at once, the same offsets: each lands in its own window. */
  pat_fill(S.base, 4096, seed_of(g_rank, peer, 2, 600));
  void* reqs[2] = {0};
  int ok = 1;
  {
    /* The second group's source is its own window (a handle belongs to the group that registered it). */
    memcpy(w2 + (size_t)g_rank * 65536 + 32768, S.base, 4096);
    r = R.iput_signal(rctx, 0, (size_t)g_rank * 65536 + 32768, wmh, 4096, (size_t)g_rank * 65536, wmh, (uint32_t)peer,
                      8 * (uint64_t)g_rank, gmh, 7, RMA_SIGNAL_OP_ADD, true, 0, &reqs[0]);
    nccl_result r1 = R.iput_signal(g_rctx, 0, 0, S.mh, 16, (size_t)g_rank * SLOT, W.mh, (uint32_t)peer,
                                   (uint64_t)WORD_BITS(g_rank) * 8, G.mh, 5, RMA_SIGNAL_OP_ADD, true, 0, &reqs[1]);
    ok = posted(r, reqs[0], "second group iputSignal", peer, 4096) && posted(r1, reqs[1], "first group iputSignal", peer, 16);
    double start = h_now();
    void* coll_of[2] = {coll, g_coll};
    while (ok && (reqs[0] || reqs[1]) && h_now() - start < 30) {
      R.progress(rctx);
      progress();
      for (int i = 0; i < 2; i++)
        if (reqs[i]) {
          int done = 0;
          if (R.test(coll_of[i], reqs[i], &done) != NCCL_OK) ok = 0;
          else if (done) reqs[i] = NULL;
        }
    }
    if (ok && (reqs[0] || reqs[1])) FAIL("second group: the two puts-with-signal did not complete in 30 s");
    else if (!ok) FAIL("second group: test of a put-with-signal returned an error: %s", h_last_warn);
    if (reqs[0] || reqs[1]) ok = 0;
    start = h_now();
    while (ok && __atomic_load_n(&g2[from], __ATOMIC_ACQUIRE) != 7 && h_now() - start < 30) R.progress(rctx);
    while (ok && signal_word(WORD_BITS(from)) != ((1ull << BITS) - 1) + 5 && h_now() - start < 30) progress();
    if (ok && (g2[from] != 7 || pat_check(w2 + (size_t)from * 65536, 4096, seed_of(from, g_rank, 2, 600)) < 4096)) {
      FAIL("second group: the put-with-signal from rank %d (signal %llu) did not land in the second group's window",
           from, (unsigned long long)g2[from]);
      ok = 0;
    }
    if (ok && signal_word(WORD_BITS(from)) != ((1ull << BITS) - 1) + 5) {
      FAIL("second group: the first group's signal from rank %d is %#llx", from,
           (unsigned long long)signal_word(WORD_BITS(from)));
      ok = 0;
    }
  }
  if (!barrier("second group used")) return;
  nccl_result a = R.dereg(coll, wmh), b = R.dereg(coll, gmh), c = R.destroy_context(rctx), d = R.close_coll(coll);
  if (a || b || c || d) FAIL("second group teardown: %d %d %d %d: %s", a, b, c, d, h_last_warn);
  else if (ok) pass("a second group (1 context) beside the first: each put-with-signal lands in its own group's windows");
  free(w2);
  free(g2);
}

/* ---- 256 requests in flight towards one peer (NCCL's bound: 32 x 8 per peer), and NCCL's flush:
 * an 8-byte iput from a window to itself (the same handle as source and destination) ---- */

enum { DEPTH = 256 };

static void test_depth(void) {
  int n = g_nranks, peer = (g_rank + 1) % n, from = (g_rank + n - 1) % n;
  memset(W.base, 0xee, W.size);
  if (!barrier("before the depth test")) return;
  void** reqs = calloc(DEPTH, sizeof(void*));
  int ok = 1;
  for (int i = 0; i < DEPTH && ok; i++) {
    size_t so = (size_t)i * 64;
    pat_fill(S.base + so, 64, seed_of(g_rank, peer, i, 300));
    nccl_result r = R.iput(g_rctx, i % NCTX, so, S.mh, 64, (size_t)g_rank * SLOT + so, W.mh, (uint32_t)peer,
                           opt_flags(i), &reqs[i]);
    ok = posted(r, reqs[i], "iput (256 in flight to one peer)", peer, 64);
  }
  if (ok) ok = wait_all(reqs, DEPTH, 60, "iput (256 in flight to one peer)");
  free(reqs);
  if (!barrier("after the depth test")) return;
  for (int i = 0; i < DEPTH && ok; i++) {
    size_t off = (size_t)from * SLOT + (size_t)i * 64;
    if (pat_check(W.base + off, 64, seed_of(from, g_rank, i, 300)) < 64) {
      FAIL("put %d of %d in flight from rank %d did not land", i, DEPTH, from);
      ok = 0;
    }
  }
  if (ok) pass("%d iput requests in flight towards one peer at once, all complete and land", DEPTH);
  /* The flush NCCL issues: 8 bytes from the window to itself on this rank, then to a peer. */
  /* Past the bytes the 256 puts wrote (a slow rank may still be checking them). */
  size_t a = (size_t)g_rank * SLOT + 20480, b = (size_t)g_rank * SLOT + 24576;
  pat_fill(W.base + a, 8, seed_of(g_rank, g_rank, 1, 301));
  void* req = NULL;
  nccl_result r = R.iput(g_rctx, 0, a, W.mh, 8, b, W.mh, (uint32_t)g_rank, 0, &req);
  ok = posted(r, req, "flush-style self iput", g_rank, 8) && wait_one(req, 30, "flush-style self iput");
  if (ok && pat_check(W.base + b, 8, seed_of(g_rank, g_rank, 1, 301)) < 8) {
    FAIL("an 8-byte iput from the window to itself (NCCL's flush) did not copy the bytes");
    ok = 0;
  }
  req = NULL;
  r = R.iput(g_rctx, 1 % NCTX, a, W.mh, 8, (size_t)g_rank * SLOT + 28672, W.mh, (uint32_t)peer, 0, &req);
  ok = ok && posted(r, req, "iput with one handle as source and destination", peer, 8) &&
       wait_one(req, 30, "iput with one handle as source and destination");
  if (!barrier("after the flush-style puts")) return;
  if (ok && pat_check(W.base + (size_t)from * SLOT + 28672, 8, seed_of(from, from, 1, 301)) < 8) {
    FAIL("an iput from rank %d's window into this rank's same window did not land", from);
    ok = 0;
  }
  if (ok) pass("NCCL's flush: an 8-byte iput within one window to this rank itself, and to a peer");
}

/* ---- 1,000 random operations per rank against a model of this rank's part of every window ---- */

enum { RANDOM_OPS = 1000, REGION = 256 << 10, RING = 16, RING_AREA = 64 << 10 };

typedef struct {
  void* req;
  int target, kind; /* 0 put, 1 INC, 2 ADD, 3 get, 4 flush */
  size_t off, size;
  int ring;
} op_rec;

static unsigned char* g_model;   /* [target][REGION]: what this rank's region on each target holds */
static uint64_t g_model_sig[MAX_RANKS][4];
static op_rec g_flight[RING];
static int g_nflight;

static int complete_op(op_rec* o) {
  if (o->kind == 3) {
    const unsigned char* got = S.base + (size_t)o->ring * RING_AREA;
    const unsigned char* want = g_model + (size_t)o->target * REGION + o->off;
    if (memcmp(got, want, o->size) != 0) {
      size_t i = 0;
      while (got[i] == want[i]) i++;
      FAIL("random iget of %zu bytes at %zu from rank %d: byte %zu is %#x, the model says %#x", o->size, o->off,
           o->target, i, got[i], want[i]);
      return 0;
    }
  }
  return 1;
}

/* Test every in-flight operation until none is left (`all`) or at least one finished. */
static int drain(int all) {
  double start = h_now();
  while (g_nflight > 0) {
    progress();
    int finished = 0;
    for (int i = 0; i < g_nflight;) {
      int done = 0;
      nccl_result r = R.test(g_coll, g_flight[i].req, &done);
      if (r != NCCL_OK) {
        FAIL("random operation (kind %d, %zu bytes to rank %d): test returned %d: %s", g_flight[i].kind,
             g_flight[i].size, g_flight[i].target, r, h_last_warn);
        return 0;
      }
      if (done) {
        if (!complete_op(&g_flight[i])) return 0;
        g_flight[i] = g_flight[--g_nflight];
        finished++;
      } else {
        i++;
      }
    }
    if (finished && !all) return 1;
    if (h_now() - start > 60) {
      FAIL("random operations: %d not done after 60 s", g_nflight);
      return 0;
    }
  }
  return 1;
}

static int ring_free(void) {
  for (int q = 0; q < RING; q++) {
    int used = 0;
    for (int i = 0; i < g_nflight; i++) used |= g_flight[i].ring == q;
    if (!used) return q;
  }
  return -1;
}

static void test_random(void) {
  int n = g_nranks;
  g_rng = mix(0xc0ffee ^ (uint64_t)g_rank) | 1;
  g_model = calloc((size_t)n, REGION);
  memset(g_model_sig, 0, sizeof g_model_sig);
  memset(W.base, 0, W.size);
  if (!barrier("before the random operations")) return;
  int counts[5] = {0};
  for (int k = 0; k < RANDOM_OPS; k++) {
    op_rec o = {0};
    o.target = (int)(rnd() % (uint64_t)n);
    uint64_t pick = rnd() % 10;
    o.kind = pick < 4 ? 0 : pick < 5 ? 1 : pick < 6 ? 2 : pick < 9 ? 3 : (rnd() & 1) ? 4 : 3;
    switch (rnd() % 4) {
      case 0: o.size = rnd() % 17; break;
      case 1: o.size = rnd() % 512; break;
      case 2: o.size = rnd() % 8192; break;
      default: o.size = rnd() % (RING_AREA + 1); break;
    }
    o.off = rnd() % (REGION - o.size + 1);
    int c = (int)(rnd() % NCTX);
    bool strong = rnd() & 1;
    uint32_t opt = opt_flags((int)rnd());
    /* No two operations in flight on overlapping bytes of one target: the model stays exact. */
    int clash = 0;
    for (int i = 0; i < g_nflight; i++)
      clash |= g_flight[i].target == o.target && o.off < g_flight[i].off + g_flight[i].size + 1 &&
               g_flight[i].off < o.off + o.size + 1;
    if (clash && !drain(1)) return;
    while ((o.ring = ring_free()) < 0)
      if (!drain(0)) return;
    size_t local = (size_t)o.ring * RING_AREA;
    size_t remote = (size_t)g_rank * SLOT + o.off;
    unsigned char* model = g_model + (size_t)o.target * REGION + o.off;
    nccl_result r;
    if (o.kind == 4) {
      o.size = 0;
      r = R.iflush(g_rctx, c, (rnd() & 1) ? W.mh : S.mh, (uint32_t)o.target, &o.req);
    } else if (o.kind == 3) {
      memset(S.base + local, 0xdd, o.size);
      r = R.iget(g_rctx, c, remote, W.mh, o.size, local, S.mh, (uint32_t)o.target, opt, &o.req);
    } else {
      for (size_t i = 0; i < o.size; i++) S.base[local + i] = (unsigned char)rnd();
      memcpy(model, S.base + local, o.size);
      if (o.kind == 0) {
        r = R.iput(g_rctx, c, local, S.mh, o.size, remote, W.mh, (uint32_t)o.target, opt, &o.req);
      } else {
        int j = (int)(rnd() % 4);
        uint64_t value = o.kind == 2 ? rnd() : 0;
        g_model_sig[o.target][j] += o.kind == 2 ? value : 1;
        r = R.iput_signal(g_rctx, c, o.size ? local : 0, o.size ? S.mh : NULL, o.size, o.size ? remote : 0,
                          o.size ? W.mh : NULL, (uint32_t)o.target, (uint64_t)WORD_RANDOM(g_rank, j) * 8, G.mh, value,
                          o.kind == 2 ? RMA_SIGNAL_OP_ADD : RMA_SIGNAL_OP_INC, strong, opt, &o.req);
      }
    }
    static const char* kinds[] = {"random iput", "random iputSignal INC", "random iputSignal ADD", "random iget",
                                  "random iflush"};
    if (!posted(r, o.req, kinds[o.kind], o.target, o.size)) return;
    counts[o.kind]++;
    g_flight[g_nflight++] = o;
  }
  if (!drain(1) || !barrier("after the random operations")) return;
  /* Read back this rank's whole region and its signal words on every target. */
  int ok = 1;
  for (int t = 0; t < n && ok; t++) {
    void* reqs[2] = {0};
    memset(S.base, 0xdd, REGION + 64);
    nccl_result r = R.iget(g_rctx, t % NCTX, (size_t)g_rank * SLOT, W.mh, REGION, 0, S.mh, (uint32_t)t, 0, &reqs[0]);
    if (!posted(r, reqs[0], "iget of the random region", t, REGION)) return;
    r = R.iget(g_rctx, (t + 1) % NCTX, (uint64_t)WORD_RANDOM(g_rank, 0) * 8, G.mh, 32, REGION, S.mh, (uint32_t)t, 0,
               &reqs[1]);
    if (!posted(r, reqs[1], "iget of the signal words", t, 32)) return;
    if (!wait_all(reqs, 2, 60, "final igets")) return;
    const unsigned char* want = g_model + (size_t)t * REGION;
    if (memcmp(S.base, want, REGION) != 0) {
      size_t i = 0;
      while (S.base[i] == want[i]) i++;
      FAIL("after 1,000 random operations, byte %zu of this rank's region on rank %d is %#x, the model says %#x", i,
           t, S.base[i], want[i]);
      ok = 0;
    }
    uint64_t words[4];
    memcpy(words, S.base + REGION, sizeof words);
    for (int j = 0; j < 4 && ok; j++)
      if (words[j] != g_model_sig[t][j]) {
        FAIL("after the random operations, signal word %d on rank %d is %#llx, the model says %#llx", j, t,
             (unsigned long long)words[j], (unsigned long long)g_model_sig[t][j]);
        ok = 0;
      }
  }
  free(g_model);
  /* Nobody wrote outside their region: the rest of every slot is still zero. */
  for (int s = 0; s < n && ok; s++) {
    size_t i = REGION + first_not(W.base + (size_t)s * SLOT + REGION, SLOT - REGION, 0);
    if (i < SLOT) {
      FAIL("after the random operations, byte %zu of rank %d's slot (outside its region) is %#x", i, s,
           W.base[(size_t)s * SLOT + i]);
      ok = 0;
    }
  }
  if (!barrier("after the random check")) return;
  if (ok)
    pass("%d random operations per rank (%d iput, %d INC, %d ADD, %d iget, %d iflush here; random ranks, offsets, "
         "sizes up to 64 KiB, contexts, flags; %d in flight) match the model, read back with iget",
         RANDOM_OPS, counts[0], counts[1], counts[2], counts[3], counts[4], RING);
}

/* ---- the promised errors: ncclInvalidArgument before anything is posted, no request ---- */

#define SENTINEL ((void*)0x5e17e1)

static int g_error_checks, g_error_fails;
static void expect_invalid(nccl_result r, void* req, const char* what) {
  g_error_checks++;
  if (r != NCCL_INVALID_ARGUMENT || (req != NULL && req != SENTINEL)) {
    FAIL("%s: returned %d (want %d, ncclInvalidArgument), request %p (want NULL or untouched)", what, r,
         NCCL_INVALID_ARGUMENT, req);
    g_error_fails++;
  }
}

static void test_errors(void) {
  int n = g_nranks, peer = (g_rank + 1) % n;
  uint32_t p = (uint32_t)peer;
  size_t ws = W.size, ss = S.size, gs = G.size;
  void* req;
#define PUT(c, so, sz, d, rk) R.iput(g_rctx, c, so, S.mh, sz, d, W.mh, rk, 0, &req)
#define GET(c, ro, sz, lo, rk) R.iget(g_rctx, c, ro, W.mh, sz, lo, S.mh, rk, 0, &req)
#define SIG(sz, so, d, rk, sg, op) R.iput_signal(g_rctx, 0, so, S.mh, sz, d, W.mh, rk, sg, G.mh, 1, op, false, 0, &req)
  /* The request out-param holds a sentinel before each call. */
#define INVALID(call, what)             \
  do {                                  \
    req = SENTINEL;                     \
    nccl_result res_ = call;            \
    expect_invalid(res_, req, what);    \
  } while (0)
  INVALID(PUT(0, 0, 8, ws - 4, p), "iput past the end of the target's window");
  INVALID(PUT(0, 0, 8, ws, p), "iput starting at the end of the target's window");
  INVALID(PUT(0, 0, ws + 1, 0, p), "iput larger than the target's window");
  INVALID(PUT(0, 0, 8, UINT64_MAX - 3, p), "iput whose offset + size wraps around");
  INVALID(PUT(0, ss - 4, 8, 0, p), "iput past the end of the local source window");
  INVALID(PUT(0, UINT64_MAX - 3, 8, 0, p), "iput whose source offset + size wraps around");
  INVALID(PUT(NCTX, 0, 8, 0, p), "iput on context nContexts");
  INVALID(PUT(-1, 0, 8, 0, p), "iput on context -1");
  INVALID(PUT(0, 0, 8, 0, (uint32_t)n), "iput to rank nranks");
  INVALID(PUT(0, 0, 8, 0, UINT32_MAX), "iput to rank 2^32-1");
  INVALID(GET(0, ws - 4, 8, 0, p), "iget past the end of the remote window");
  INVALID(GET(0, 0, 8, ss - 4, p), "iget past the end of the local window");
  INVALID(GET(0, UINT64_MAX, 2, 0, p), "iget whose remote offset + size wraps around");
  INVALID(GET(NCTX, 0, 8, 0, p), "iget on context nContexts");
  INVALID(GET(0, 0, 8, 0, (uint32_t)n), "iget from rank nranks");
  INVALID(SIG(8, 0, ws - 4, p, 0, RMA_SIGNAL_OP_INC), "iputSignal whose data lies past the window");
  INVALID(SIG(8, 0, 0, p, 0, 0), "iputSignal with signalOp 0");
  INVALID(SIG(8, 0, 0, p, 0, 3), "iputSignal with signalOp 3");
  INVALID(SIG(0, 0, 0, p, 0, 0x100 | RMA_SIGNAL_OP_ADD), "iputSignal with signalOp 0x102");
  INVALID(SIG(8, 0, 0, p, 4, RMA_SIGNAL_OP_ADD), "iputSignal with a signal offset of 4 (unaligned)");
  INVALID(SIG(0, 0, 0, p, 12, RMA_SIGNAL_OP_INC), "signal alone at an unaligned offset 12");
  INVALID(SIG(8, 0, 0, p, gs, RMA_SIGNAL_OP_ADD), "iputSignal with the signal word past the window");
  INVALID(SIG(8, 0, 0, p, gs - 4, RMA_SIGNAL_OP_ADD), "iputSignal with the signal word across the end");
  INVALID(SIG(8, 0, 0, p, UINT64_MAX - 7, RMA_SIGNAL_OP_ADD), "iputSignal with signal offset 2^64-8");
  INVALID(SIG(8, 0, 0, (uint32_t)n, 0, RMA_SIGNAL_OP_INC), "iputSignal to rank nranks");
  req = SENTINEL;
  nccl_result r = R.iput_signal(g_rctx, NCTX, 0, S.mh, 8, 0, W.mh, p, 0, G.mh, 1, RMA_SIGNAL_OP_INC, false, 0, &req);
  expect_invalid(r, req, "iputSignal on context nContexts");
  req = SENTINEL;
  r = R.iflush(g_rctx, 0, W.mh, (uint32_t)n, &req);
  g_error_checks++;
  if (r == NCCL_OK) {
    FAIL("iflush towards rank nranks succeeded");
    g_error_fails++;
  }
#undef PUT
#undef GET
#undef SIG
#undef INVALID
  /* The edges themselves are valid: a put ending at the window's last byte, the last signal word. */
  if (!barrier("before the edge cases")) return;
  void* edge[2] = {0};
  pat_fill(S.base + ss - 8, 8, seed_of(g_rank, peer, 7, 7));
  r = R.iput(g_rctx, 0, ss - 8, S.mh, 8, ws - 8, W.mh, p, 0, &edge[0]);
  nccl_result r2 = R.iput_signal(g_rctx, NCTX - 1, 0, NULL, 0, 0, NULL, p, gs - 8, G.mh, 3, RMA_SIGNAL_OP_ADD, true,
                                 0, &edge[1]);
  if (!posted(r, edge[0], "iput ending at the last byte of both windows", peer, 8) ||
      !posted(r2, edge[1], "a signal on the last word of the signal window", peer, 0) ||
      !wait_all(edge, 2, 30, "the edge cases") || !barrier("after the edge cases"))
    return;
  {
    int from = (g_rank + n - 1) % n;
    if (pat_check(W.base + ws - 8, 8, seed_of(from, g_rank, 7, 7)) < 8 || signal_word((int)(gs / 8) - 1) != 3) {
      FAIL("the edge cases: the put at the window's end or the signal on its last word did not land");
      g_error_fails++;
    }
  }
  /* Nothing was posted: the context is healthy and moves data. */
  bool has = true;
  r = R.query_last_error(g_rctx, &has);
  if (r != NCCL_OK || has) FAIL("queryLastError after the refused calls: returned %d, hasError %d", r, has);
  memset(W.base, 0, W.size);
  if (!barrier("before the check after the refused calls")) return;
  pat_fill(S.base, 64, seed_of(g_rank, peer, 9, 9));
  req = NULL;
  r = R.iput(g_rctx, NCTX - 1, 0, S.mh, 64, (size_t)g_rank * SLOT, W.mh, p, 0, &req);
  if (posted(r, req, "iput after the refused calls", peer, 64)) wait_one(req, 30, "iput after the refused calls");
  if (!barrier("after the check after the refused calls")) return;
  int from = (g_rank + n - 1) % n;
  size_t bad = pat_check(W.base + (size_t)from * SLOT, 64, seed_of(from, g_rank, 9, 9));
  if (bad < 64) FAIL("an iput after the refused calls did not land (byte %zu)", bad);
  else if (!g_error_fails)
    pass("%d invalid calls (out-of-window offsets and sizes, wrap-around, bad context, rank, signal op, signal "
         "offset) refused with ncclInvalidArgument and no request; the exact edges accepted; the context still works",
         g_error_checks);
}

/* ---- --kill: rank N-1 dies with puts from the others in flight ---- */

static void test_kill(void) {
  int n = g_nranks, victim = n - 1;
  if (!barrier("before the kill")) return;
  if (g_rank == victim) {
    /* Let the others' puts start, then die without a word. */
    double start = h_now();
    while (h_now() - start < 0.3) progress();
    _exit(0);
  }
  enum { INFLIGHT = 8 };
  size_t size = (size_t)1 << 20;
  pat_fill(S.base, size, 77);
  void* reqs[INFLIGHT] = {0};
  double start = h_now(), took = 0;
  nccl_result err = NCCL_OK;
  int at_post = 0, completed = 0;
  while (err == NCCL_OK && h_now() - start < 60) {
    progress();
    for (int i = 0; i < INFLIGHT && err == NCCL_OK; i++) {
      if (!reqs[i]) {
        nccl_result r = R.iput(g_rctx, i % NCTX, 0, S.mh, size, (size_t)g_rank * SLOT, W.mh, (uint32_t)victim,
                               0, &reqs[i]);
        if (r != NCCL_OK) {
          err = r;
          at_post = 1;
          reqs[i] = NULL;
        }
        continue;
      }
      int done = 0;
      nccl_result r = R.test(g_coll, reqs[i], &done);
      if (r != NCCL_OK) {
        err = r;
        reqs[i] = NULL; /* a failed request is finished */
      } else if (done) {
        reqs[i] = NULL;
        completed++;
      }
    }
  }
  took = h_now() - start;
  if (err == NCCL_OK)
    FAIL("puts towards the killed rank %d never failed in %.0f s (%d completed)", victim, took, completed);
  else if (err != NCCL_SYSTEM_ERROR && err != NCCL_INTERNAL_ERROR && err != NCCL_REMOTE_ERROR)
    FAIL("puts towards the killed rank failed with %d (want 2, 3 or 6): %s", err, h_last_warn);
  else
    pass("puts towards the killed rank %d failed at %s with %d after %.1f s (%d completed before): %s", victim,
         at_post ? "the post" : "test", err, took, completed, h_last_warn);
  /* The others in flight towards it end too (an error, or done), within the bound. */
  int left = 0;
  double t0 = h_now();
  do {
    left = 0;
    progress();
    for (int i = 0; i < INFLIGHT; i++)
      if (reqs[i]) {
        int done = 0;
        if (R.test(g_coll, reqs[i], &done) != NCCL_OK || done) reqs[i] = NULL;
        else left++;
      }
  } while (left && h_now() - t0 < 60);
  if (left) FAIL("%d request(s) towards the killed rank never ended", left);
  bool has = false;
  nccl_result r = R.query_last_error(g_rctx, &has);
  if (r != NCCL_OK || !has) FAIL("queryLastError after the peer's death: returned %d, hasError %d", r, has);
  else pass("queryLastError reports the error after the peer's death");
  /* A new operation towards the dead rank fails (at the post, or in test). */
  void* req = NULL;
  r = R.iput(g_rctx, 0, 0, S.mh, 8, (size_t)g_rank * SLOT, W.mh, (uint32_t)victim, 0, &req);
  if (r == NCCL_OK && req) {
    int done = 0;
    double t1 = h_now();
    while ((r = R.test(g_coll, req, &done)) == NCCL_OK && !done && h_now() - t1 < 60) progress();
    if (r == NCCL_OK) FAIL("an iput towards the dead rank posted after its death %s", done ? "completed" : "hung");
    else pass("an iput towards the dead rank posted after its death fails in test (%d)", r);
  } else if (r != NCCL_OK) {
    pass("an iput towards the dead rank posted after its death is refused (%d)", r);
  } else {
    FAIL("an iput towards the dead rank returned success without a request");
  }
  /* The survivors still move data among themselves. */
  memset(W.base, 0, (size_t)victim * SLOT);
  if (!barrier("among the survivors")) return;
  int ok = 1;
  for (int t = 0; t < victim && ok; t++) {
    void* q[2] = {0};
    size_t len = 65536, so = (size_t)t * SLOT;
    pat_fill(S.base + so, len, seed_of(g_rank, t, 1, 500));
    r = R.iput(g_rctx, t % NCTX, so, S.mh, len, (size_t)g_rank * SLOT, W.mh, (uint32_t)t, 0, &q[0]);
    ok = posted(r, q[0], "iput between survivors", t, len) && wait_all(q, 1, 60, "iput between survivors");
    if (!ok) break;
    memset(S.base + so, 0, len);
    r = R.iget(g_rctx, (t + 1) % NCTX, (size_t)g_rank * SLOT, W.mh, len, so, S.mh, (uint32_t)t, 0, &q[1]);
    ok = posted(r, q[1], "iget between survivors", t, len) && wait_all(q, 2, 60, "iget between survivors");
    if (ok && pat_check(S.base + so, len, seed_of(g_rank, t, 1, 500)) < len) {
      FAIL("iput then iget between survivors (rank %d): the bytes read back differ", t);
      ok = 0;
    }
  }
  if (!barrier("after the survivors' transfers")) return;
  for (int s = 0; s < victim && ok; s++)
    if (pat_check(W.base + (size_t)s * SLOT, 65536, seed_of(s, g_rank, 1, 500)) < 65536) {
      FAIL("the put from survivor %d did not land", s);
      ok = 0;
    }
  if (ok) pass("after the death of rank %d, iput and iget between the %d survivors complete with the right bytes",
               victim, victim);
  teardown(0);
}

/* ---- --bench ---- */

static void bench(void) {
  size_t sizes[] = {64 << 10, 1 << 20, 4 << 20};
  enum { INFLIGHT = 8 };
  pat_fill(S.base, (size_t)4 << 20, 3);
  for (int k = 0; k < 3; k++) {
    size_t size = sizes[k];
    int iters = (int)(((size_t)512 << 20) / size);
    if (g_quick) iters /= 8;
    if (!barrier("before a bench size")) return;
    if (g_rank == 0) {
      void* reqs[INFLIGHT] = {0};
      int posted_n = 0, done_n = 0;
      double start = h_now();
      while (done_n < iters) {
        progress();
        for (int i = 0; i < INFLIGHT; i++) {
          if (!reqs[i] && posted_n < iters) {
            nccl_result r = R.iput(g_rctx, 0, 0, S.mh, size, 0, W.mh, 1, opt_flags(i), &reqs[i]);
            if (!posted(r, reqs[i], "bench iput", 1, size)) return;
            posted_n++;
          } else if (reqs[i]) {
            int done = 0;
            if (R.test(g_coll, reqs[i], &done) != NCCL_OK) {
              FAIL("bench iput: test: %s", h_last_warn);
              return;
            }
            if (done) {
              reqs[i] = NULL;
              done_n++;
            }
          }
        }
        if (h_now() - start > 120) {
          FAIL("bench iput of %zu bytes: not done after 120 s", size);
          return;
        }
      }
      double secs = h_now() - start;
      h_line("", "BENCH rma put %zu %.3f", size, (double)size * iters / secs / 1e9);
    }
  }
  /* Put-with-signal round trip: 8 bytes with an ADD of 1 each way. */
  int iters = g_quick ? 200 : 2000;
  if (!barrier("before the round trips")) return;
  if (g_rank <= 1) {
    int peer = 1 - g_rank;
    double start = 0;
    for (int i = 1; i <= iters; i++) {
      if (i == 2) start = h_now(); /* the first trip warms up */
      void* req = NULL;
      if (g_rank == 0) {
        nccl_result r = R.iput_signal(g_rctx, 0, 0, S.mh, 8, 0, W.mh, (uint32_t)peer, WORD_BENCH * 8, G.mh, 1,
                                      RMA_SIGNAL_OP_ADD, true, 0, &req);
        if (!posted(r, req, "bench iputSignal", peer, 8)) return;
      }
      double t0 = h_now();
      while (signal_word(WORD_BENCH) < (uint64_t)i) {
        progress();
        if (req) {
          int done = 0;
          if (R.test(g_coll, req, &done) != NCCL_OK) {
            FAIL("bench iputSignal: test: %s", h_last_warn);
            return;
          }
          if (done) req = NULL;
        }
        if (h_now() - t0 > 30) {
          FAIL("round trip %d: no signal after 30 s", i);
          return;
        }
      }
      if (g_rank == 1) {
        nccl_result r = R.iput_signal(g_rctx, 0, 0, S.mh, 8, 0, W.mh, (uint32_t)peer, WORD_BENCH * 8, G.mh, 1,
                                      RMA_SIGNAL_OP_ADD, true, 0, &req);
        if (!posted(r, req, "bench iputSignal", peer, 8)) return;
      }
      if (req && !wait_one(req, 30, "bench iputSignal")) return;
    }
    if (g_rank == 0) {
      double usec = (h_now() - start) / (iters - 1) * 1e6;
      h_line("", "BENCH rma putsignal-rtt 8 %.2f", usec);
      h_line("", "BENCH rma putsignal-half-rtt 8 %.2f", usec / 2);
    }
  }
  /* The same round trip without the signal (an 8-byte iput, the peer polling the landed bytes)
   * and with the signal alone (size 0), to tell the put's share from the atomic's. */
  for (int variant = 0; variant < 2; variant++) {
    /* Read before the barrier: after it the peer's first signal may already have landed. */
    uint64_t base_sig = signal_word(WORD_BENCH);
    if (!barrier("before a round-trip variant")) return;
    if (g_rank > 1) continue;
    int peer = 1 - g_rank;
    volatile uint64_t* landing = (volatile uint64_t*)(W.base + 64);
    double start = 0;
    for (int i = 1; i <= iters; i++) {
      if (i == 2) start = h_now();
      void* req = NULL;
      uint64_t value = ((uint64_t)g_rank << 32) | (uint64_t)i;
      int mine = (g_rank == 0);
      for (int turn = 0; turn < 2; turn++, mine = !mine) {
        if (mine) {
          nccl_result r;
          if (variant == 0) {
            memcpy(S.base + 64, &value, 8);
            r = R.iput(g_rctx, 0, 64, S.mh, 8, 64, W.mh, (uint32_t)peer, 0, &req);
          } else {
            r = R.iput_signal(g_rctx, 0, 0, NULL, 0, 0, NULL, (uint32_t)peer, WORD_BENCH * 8, G.mh, 1,
                              RMA_SIGNAL_OP_ADD, true, 0, &req);
          }
          if (!posted(r, req, variant == 0 ? "bench put rtt" : "bench signal rtt", peer, 8)) return;
          if (!wait_one(req, 30, "bench round trip")) return;
          req = NULL;
        } else {
          uint64_t want = ((uint64_t)peer << 32) | (uint64_t)i;
          double t0 = h_now();
          while (variant == 0 ? *landing != want : signal_word(WORD_BENCH) < base_sig + (uint64_t)i) {
            progress();
            if (h_now() - t0 > 30) {
              FAIL("round trip variant %d, %d: nothing came after 30 s", variant, i);
              return;
            }
          }
        }
      }
    }
    if (g_rank == 0) {
      double usec = (h_now() - start) / (iters - 1) * 1e6;
      h_line("", "BENCH rma %s-half-rtt 8 %.2f", variant == 0 ? "put" : "signal", usec / 2);
    }
  }
  if (!barrier("after the bench")) return;
  pass("RMA figures measured");
  teardown(1);
}

/* ---- --big: one transfer over 2 GiB, so the plugin posts it in pieces of at most 1 GiB ---- */

/* Rank 0 puts 2 GiB + 5 bytes from its source window into rank 1's data window at offset 3 (three
 * work requests: 1 GiB, 1 GiB, 5 bytes), then gets them back into another part of its own source
 * window; both sides check every byte and the bytes around. Not in CI: 4 windows of 2 GiB. */
static void test_big(void) {
  const size_t size = ((size_t)2 << 30) + 5, off = 3, room = size + 2 * 4096;
  window B, D;
  memset(&B, 0, sizeof B);
  memset(&D, 0, sizeof D);
  if (!win_alloc(&B, 2 * room, 0, "big source") || !win_alloc(&D, room, 0, "big data")) return;
  if (g_rank == 0) pat_fill(B.base, size, 77);
  if (!barrier("before the big put")) return;
  if (g_rank == 0) {
    void* req = NULL;
    double t0 = h_now();
    nccl_result r = R.iput(g_rctx, 0, 0, B.mh, size, off, D.mh, 1, 0, &req);
    if (!posted(r, req, "big iput", 1, size) || !wait_one(req, 300, "big iput")) return;
    double put_s = h_now() - t0;
    req = NULL;
    r = R.iget(g_rctx, 0, off, D.mh, size, room, B.mh, 1, 0, &req);
    if (!posted(r, req, "big iget", 1, size) || !wait_one(req, 300, "big iget")) return;
    size_t bad = pat_check(B.base + room, size, 77);
    if (bad < size) {
      FAIL("big iget: byte %zu of %zu differs", bad, size);
      return;
    }
    pass("a put and a get of %zu bytes (three work requests each) moved every byte (put %.1f s)", size, put_s);
  }
  if (!barrier("after the big put")) return;
  if (g_rank == 1) {
    size_t bad = pat_check(D.base + off, size, 77);
    if (bad < size) {
      FAIL("big iput: byte %zu of %zu differs at the target", bad, size);
      return;
    }
    if (D.base[off - 1] != 0 || D.base[off + size] != 0) {
      FAIL("big iput: a byte next to the %zu put is not zero", size);
      return;
    }
  }
  if (!guards_intact(&B) || !guards_intact(&D)) return;
  if (R.dereg(g_coll, B.mh) != NCCL_OK || R.dereg(g_coll, D.mh) != NCCL_OK) FAIL("big: deregMrSym failed");
  free(B.alloc);
  free(D.alloc);
}

static int run_rank(const char* path, int mode) {
  if (!load_table(path) || !setup()) return 1;
  if (mode == 3) {
    test_big();
    if (!barrier("before the teardown")) return h_failures + 1;
    teardown(1);
    return h_failures;
  }
  if (mode == 1) {
    test_kill();
    return h_failures;
  }
  if (mode == 2) {
    bench();
    return h_failures;
  }
  test_sweep();
  if (!h_failures) test_signals();
  if (!h_failures) test_signal_bits();
  if (!h_failures) test_whole_window();
  if (!h_failures) test_second_group();
  if (!h_failures) test_depth();
  if (!h_failures) test_random();
  if (!h_failures) test_errors();
  bool has = true;
  nccl_result r = R.query_last_error(g_rctx, &has);
  if (r != NCCL_OK || has) FAIL("queryLastError at the end of a healthy run: returned %d, hasError %d", r, has);
  if (g_progress_errors) FAIL("rmaProgress returned an error %d time(s) in a healthy run", g_progress_errors);
  if (!h_failures) pass("a healthy run: queryLastError false, rmaProgress never failed");
  if (!barrier("before the teardown")) return h_failures + 1;
  teardown(1);
  return h_failures;
}

/* ---- the exchange: the parent (or the --serve host) relays every round ---- */

/* Relay rounds until every rank has closed its end. A rank that dies is left out of later rounds:
 * its part is zeroed and its bit set in the mask every rank receives. */
static void serve_exchange(int* fds, int nranks) {
  uint32_t dead = 0;
  for (int r = 0; r < nranks; r++)
    if (fds[r] < 0) dead |= 1u << r;
  while (dead != (1u << nranks) - 1) {
    uint32_t len = 0, first_len = UINT32_MAX;
    char* blob = NULL;
    for (int r = 0; r < nranks; r++) {
      if (dead & (1u << r)) continue;
      if (!h_control_recv(fds[r], &len, sizeof len) || len > (1u << 20) ||
          (first_len != UINT32_MAX && len != first_len)) {
        dead |= 1u << r;
        continue;
      }
      if (first_len == UINT32_MAX) {
        first_len = len;
        blob = calloc((size_t)nranks, len ? len : 1);
      }
      if (!h_control_recv(fds[r], blob + (size_t)r * len, len)) dead |= 1u << r;
    }
    if (first_len == UINT32_MAX) break;
    for (int r = 0; r < nranks; r++)
      if (dead & (1u << r)) memset(blob + (size_t)r * first_len, 0, first_len);
    for (int r = 0; r < nranks; r++) {
      if (dead & (1u << r)) continue;
      if (!h_control_send(fds[r], &dead, sizeof dead) || !h_control_send(fds[r], blob, (size_t)first_len * nranks))
        dead |= 1u << r;
    }
    free(blob);
  }
}

int main(int argc, char** argv) {
  h_role = g_role;
  if (argc < 2) {
    fprintf(stderr,
            "usage: %s LIB [--ranks N] [--version 13|14|15|16] [--quick] [--kill] [--bench] [--big] [--serve PORT | --server "
            "ADDR:PORT] [--first-rank F] [--local K]\n",
            argv[0]);
    return 2;
  }
  int nranks = 3, mode = 0, serve_port = 0, first = 0, nlocal = -1;
  const char* server = NULL;
  for (int i = 2; i < argc; i++) {
    if (!strcmp(argv[i], "--ranks") && i + 1 < argc) nranks = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--version") && i + 1 < argc) g_version = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--quick")) g_quick = 1;
    else if (!strcmp(argv[i], "--kill")) mode = 1;
    else if (!strcmp(argv[i], "--bench")) mode = 2;
    else if (!strcmp(argv[i], "--big")) mode = 3;
    else if (!strcmp(argv[i], "--serve") && i + 1 < argc) serve_port = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--server") && i + 1 < argc) server = argv[++i];
    else if (!strcmp(argv[i], "--first-rank") && i + 1 < argc) first = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--local") && i + 1 < argc) nlocal = atoi(argv[++i]);
    else {
      fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (nranks < 2 || nranks > MAX_RANKS || g_version < 13 || g_version > 16 || (mode == 1 && nranks < 3)) {
    fprintf(stderr, "--ranks takes 2..%d (3.. with --kill), --version 13..16\n", MAX_RANKS);
    return 2;
  }
  if (nlocal < 0) nlocal = nranks - first;
  if (first < 0 || nlocal < 1 || first + nlocal > nranks || (serve_port && server) ||
      (nlocal < nranks && !serve_port && !server)) {
    fprintf(stderr, "--first-rank/--local must name ranks of 0..N-1; a partial host needs --serve or --server\n");
    return 2;
  }
  if (mode == 1) {
    /* Short transport retries, so a dead peer shows within the bound on real NICs too. */
    setenv("NCCL_IB_TIMEOUT", "12", 0);
    setenv("NCCL_IB_RETRY_CNT", "2", 0);
    g_victim = nranks - 1;
  }
  g_nctx = g_version <= 14 ? 2 : 3;
  g_nranks = nranks;
  int fds[MAX_RANKS], local[MAX_RANKS] = {0};
  pid_t pids[MAX_RANKS];
  for (int r = 0; r < MAX_RANKS; r++) fds[r] = -1;
  double start = h_now();
  for (int r = first; r < first + nlocal; r++) {
    int sv[2] = {-1, -1};
    if (!server && socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) return 2;
    pid_t pid = fork();
    if (pid == 0) {
      for (int k = 0; k < MAX_RANKS; k++)
        if (fds[k] >= 0) close(fds[k]);
      g_rank = r;
      snprintf(g_role, sizeof g_role, "rank %d", r);
      if (server) {
        g_fd = h_rank_dial(server, r);
        if (g_fd < 0) {
          FAIL("cannot reach the exchange server %s", server);
          _exit(1);
        }
      } else {
        close(sv[0]);
        g_fd = sv[1];
      }
      alarm(mode == 1 ? 240 : mode == 2 ? 600 : 900); /* a hang ends as a failure, not a stuck lane */
      int failures = run_rank(argv[1], mode);
      h_line("", "[rank %d] %d check(s) passed, %d failure(s)", r, g_checks, failures);
      _exit(failures ? 1 : 0);
    }
    if (!server) {
      close(sv[1]);
      fds[r] = sv[0];
    }
    local[r] = 1;
    pids[r] = pid;
  }
  int bad = 0;
  if (serve_port && !h_rank_accept(serve_port, fds, local, nranks)) bad++;
  if (!server && !bad) serve_exchange(fds, nranks);
  for (int r = 0; r < nranks; r++)
    if (fds[r] >= 0) close(fds[r]);
  for (int r = first; r < first + nlocal; r++) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    if (r == g_victim) continue; /* the victim's own end does not count */
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      FAIL("rank %d: %s %d", r, WIFSIGNALED(status) ? "killed by signal" : "exit status",
           WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
      bad++;
    }
  }
  fprintf(stderr, "rma: v%d, %d ranks (%d here), %s, %d rank(s) failed, %.1f s\n", g_version, nranks, nlocal,
          mode == 1 ? "killed member" : mode == 2 ? "bench" : mode == 3 ? "big" : g_quick ? "quick" : "full", bad, h_now() - start);
  return bad ? 1 : 0;
}
