/* CollNet conformance: N ranks (forked processes of one host) drive the plugin's
 * ncclCollNetPlugin_vN tables the way NCCL's proxy does (listen, handles exchanged out of band,
 * connect(handles[], nranks, rank), regMr, iallreduce/iallgather/ireducescatter, test until done,
 * deregMr, closeColl), and check every result bit for bit against a reference computed here, in C,
 * in the documented order: an element owned by rank q is the left fold over ranks q+1, ..., q
 * (then avg divides by n); fp16/bf16/fp8 steps are correctly rounded in the narrow type (computed
 * in double, rounded once, by an encoder written independently of the plugin's); NaN results are
 * the canonical quiet NaN with the sign clear; max(+0,-0) = +0, min(+0,-0) = -0.
 *
 * usage: collnet LIB [--ranks N] [--quick] [--kill] [--missing] [--bench]
 *                    [--serve PORT | --server ADDR:PORT] [--first-rank F] [--local K]
 *   default: every type x op x count (0, 1, 13, not divisible, 1 Mi elements for a few), in place,
 *            8 operations in flight, two groups at once, allgather/reduce-scatter with windows and
 *            scatter-gather parts, and one operation through each of the v6, v8 and v9 tables.
 *   --kill:    rank N-1 exits in the middle of an operation; the others must see an error within
 *              the bound (RIVET_HANDSHAKE_TIMEOUT_MS is irrelevant there: the peer-loss watch).
 *   --missing: rank N-1 never calls connect; the others' connect must fail within the handshake
 *              deadline (set to 3 s here) with an error naming it.
 *   --bench:   allreduce (float32 sum) of 64 KiB, 1 MiB and 4 MiB per rank, timed; rank 0 prints
 *              "BENCH ..." lines with the algorithm bandwidth and the bus bandwidth (x 2(n-1)/n).
 *   across hosts: this host runs ranks F .. F+K-1 of N (default: all of them). One host passes
 *              --serve PORT and serves the handle exchange over TCP; the others pass
 *              --server ADDR:PORT and their ranks connect to it (retrying for 60 s).
 * Results go to stderr ("PASS ..."/"FAIL ..."); the last line is "collnet: ..." and the exit
 * status is 0 only if every rank passed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "harness.h"
#include "nccl_collnet_abi.h"

static int g_rank = -1, g_nranks = 0, g_checks = 0, g_fd = -1, g_quick = 0;
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

/* ---- out-of-band exchange through the parent: every rank gives `len` bytes, gets n*len ---- */

static int exchange(const void* mine, uint32_t len, void* all) {
  return h_control_send(g_fd, &len, sizeof len) && h_control_send(g_fd, mine, len) &&
         h_control_recv(g_fd, all, (size_t)len * (size_t)g_nranks);
}

/* ---- reference arithmetic, independent of the plugin ---- */

typedef struct { int exp_bits, man_bits, ieee, saturate; uint32_t nan, max_bits; } narrow_fmt;
static const narrow_fmt FMT_F16 = {5, 10, 1, 0, 0x7e00, 0x7bff};
static const narrow_fmt FMT_BF16 = {8, 7, 1, 0, 0x7fc0, 0x7f7f};
static const narrow_fmt FMT_E4M3 = {4, 3, 0, 1, 0x7f, 0x7e};
static const narrow_fmt FMT_E5M2 = {5, 2, 1, 1, 0x7f, 0x7b};

static const narrow_fmt* narrow_of(int dt) {
  switch (dt) {
    case DT_FLOAT16: return &FMT_F16;
    case DT_BFLOAT16: return &FMT_BF16;
    case DT_FP8E4M3: return &FMT_E4M3;
    case DT_FP8E5M2: return &FMT_E5M2;
    default: return NULL;
  }
}

static int bias_of(const narrow_fmt* f) { return (1 << (f->exp_bits - 1)) - 1; }

static double narrow_decode(const narrow_fmt* f, uint32_t bits) {
  int m = f->man_bits, e_all = (1 << f->exp_bits) - 1;
  uint32_t sign = (bits >> (f->exp_bits + m)) & 1, exp = (bits >> m) & (uint32_t)e_all;
  uint32_t man = bits & ((1u << m) - 1);
  double v;
  if ((int)exp == e_all && f->ieee) v = man ? NAN : INFINITY;
  else if ((int)exp == e_all && man == (1u << m) - 1) v = NAN;
  else if (exp == 0) v = ldexp((double)man, 1 - bias_of(f) - m);
  else v = ldexp(1.0 + (double)man / (double)(1u << m), (int)exp - bias_of(f));
  return sign ? -v : v;
}

/* Round `x` to the format: nearest, ties to even (nearbyint in the default rounding mode). */
static uint32_t narrow_encode(const narrow_fmt* f, double x) {
  if (isnan(x)) return f->nan;
  int m = f->man_bits, bias = bias_of(f), emin = 1 - bias;
  uint32_t sign = signbit(x) ? 1u << (f->exp_bits + m) : 0;
  double a = fabs(x), max = narrow_decode(f, f->max_bits);
  uint32_t overflow = f->saturate ? f->max_bits : ((1u << f->exp_bits) - 1) << m;
  if (isinf(a)) return sign | overflow;
  if (a == 0) return sign;
  int e = ilogb(a);
  if (e < emin) e = emin;
  double q = ldexp(1.0, e - m);
  double r = nearbyint(a / q) * q;
  if (r > max) return sign | overflow;
  if (r < ldexp(1.0, emin)) return sign | (uint32_t)(r / ldexp(1.0, emin - m));
  int e2 = ilogb(r);
  uint32_t man = (uint32_t)(r / ldexp(1.0, e2 - m)) - (1u << m);
  return sign | ((uint32_t)(e2 + bias) << m) | man;
}

static int type_size(int dt) {
  switch (dt) {
    case DT_INT8: case DT_UINT8: case DT_FP8E4M3: case DT_FP8E5M2: return 1;
    case DT_FLOAT16: case DT_BFLOAT16: return 2;
    case DT_INT32: case DT_UINT32: case DT_FLOAT32: return 4;
    default: return 8;
  }
}

static const char* type_name(int dt) {
  static const char* names[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16",
                                "float32", "float64", "bfloat16", "fp8e4m3", "fp8e5m2"};
  return names[dt];
}
static const char* op_name(int op) {
  static const char* names[] = {"sum", "prod", "max", "min", "avg"};
  return names[op];
}

static uint64_t load(const unsigned char* p, int size) {
  uint64_t v = 0;
  memcpy(&v, p, (size_t)size); /* little-endian host */
  return v;
}
static void store(unsigned char* p, int size, uint64_t v) { memcpy(p, &v, (size_t)size); }

static int64_t sext(uint64_t v, int size) {
  int shift = 64 - 8 * size;
  return (int64_t)(v << shift) >> shift;
}

static uint64_t mask_of(int size) { return size == 8 ? ~0ull : (1ull << (8 * size)) - 1; }

static float f32_of(uint64_t b) { uint32_t u = (uint32_t)b; float f; memcpy(&f, &u, 4); return f; }
static uint64_t bits_f32(float f) {
  if (isnan(f)) return 0x7fc00000u;
  uint32_t u; memcpy(&u, &f, 4); return u;
}
static double f64_of(uint64_t b) { double d; memcpy(&d, &b, 8); return d; }
static uint64_t bits_f64(double d) {
  if (isnan(d)) return 0x7ff8000000000000ull;
  uint64_t u; memcpy(&u, &d, 8); return u;
}

/* IEEE 754-2019 maximum/minimum: NaN propagates (as canonical), +0 > -0. */
#define MINMAX(T, x, y, is_max, bits_of, and_or)                                   \
  ((isnan(x) || isnan(y)) ? (T)NAN                                                  \
   : (x) > (y) ? ((is_max) ? (x) : (y))                                             \
   : (y) > (x) ? ((is_max) ? (y) : (x))                                             \
   : and_or)

static float f32_minmax(float x, float y, int is_max) {
  uint32_t a, b; memcpy(&a, &x, 4); memcpy(&b, &y, 4);
  uint32_t c = is_max ? (a & b) : (a | b);
  float eq; memcpy(&eq, &c, 4);
  return MINMAX(float, x, y, is_max, 0, eq);
}
static double f64_minmax(double x, double y, int is_max) {
  uint64_t a, b; memcpy(&a, &x, 8); memcpy(&b, &y, 8);
  uint64_t c = is_max ? (a & b) : (a | b);
  double eq; memcpy(&eq, &c, 8);
  return MINMAX(double, x, y, is_max, 0, eq);
}

/* One fold step a (+) b on bit patterns. */
static uint64_t ref_step(int dt, int op, uint64_t a, uint64_t b) {
  int size = type_size(dt);
  const narrow_fmt* f = narrow_of(dt);
  if (dt == DT_FLOAT32) {
    float x = f32_of(a), y = f32_of(b);
    switch (op) {
      case OP_SUM: case OP_AVG: return bits_f32(x + y);
      case OP_PROD: return bits_f32(x * y);
      default: return bits_f32(f32_minmax(x, y, op == OP_MAX));
    }
  }
  if (dt == DT_FLOAT64) {
    double x = f64_of(a), y = f64_of(b);
    switch (op) {
      case OP_SUM: case OP_AVG: return bits_f64(x + y);
      case OP_PROD: return bits_f64(x * y);
      default: return bits_f64(f64_minmax(x, y, op == OP_MAX));
    }
  }
  if (f) {
    double x = narrow_decode(f, (uint32_t)a), y = narrow_decode(f, (uint32_t)b);
    switch (op) {
      case OP_SUM: case OP_AVG: return narrow_encode(f, x + y);
      case OP_PROD: return narrow_encode(f, x * y);
      default: return narrow_encode(f, f64_minmax(x, y, op == OP_MAX));
    }
  }
  int is_signed = dt == DT_INT8 || dt == DT_INT32 || dt == DT_INT64;
  uint64_t m = mask_of(size);
  switch (op) {
    case OP_SUM: case OP_AVG: return (a + b) & m;
    case OP_PROD: return (a * b) & m;
    default: {
      int a_greater = is_signed ? sext(a, size) > sext(b, size) : a > b;
      int b_greater = is_signed ? sext(b, size) > sext(a, size) : b > a;
      if (op == OP_MAX) return b_greater ? b : a;
      return a_greater ? b : a;
    }
  }
}

static uint64_t ref_finish(int dt, int op, uint64_t a, int n) {
  if (op != OP_AVG) return a;
  int size = type_size(dt);
  const narrow_fmt* f = narrow_of(dt);
  if (dt == DT_FLOAT32) return bits_f32(f32_of(a) / (float)n);
  if (dt == DT_FLOAT64) return bits_f64(f64_of(a) / (double)n);
  if (f) return narrow_encode(f, narrow_decode(f, (uint32_t)a) / (double)n);
  int is_signed = dt == DT_INT8 || dt == DT_INT32 || dt == DT_INT64;
  if (is_signed) return (uint64_t)(sext(a, size) / (int64_t)n) & mask_of(size);
  return a / (uint64_t)n;
}

/* ---- inputs: deterministic per (seed, rank, index), so every rank knows every rank's ---- */

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* A value with a spread of exponents (so sums round and the order shows), values near 1 for
 * products, and a few specials (zeros of both signs, infinities, non-canonical NaNs). */
static double value_of(uint64_t h, int op, int emin, int emax) {
  if (op == OP_PROD) return 1.0 + ((double)(int)(h % 201) - 100.0) / 1024.0;
  if ((h >> 58) == 0) {
    static const double specials[] = {0.0, -0.0, INFINITY, -INFINITY};
    return specials[(h >> 8) & 3];
  }
  double mant = 0.5 + (double)(h % (1u << 24)) / (double)(1u << 25);
  int e = emin + (int)((h >> 32) % (uint64_t)(emax - emin + 1));
  return ((h >> 57) & 1 ? -1.0 : 1.0) * ldexp(mant, e);
}

static uint64_t input(int dt, int op, uint64_t seed, int rank, size_t i) {
  uint64_t h = mix(seed ^ mix((uint64_t)rank * 0x1000003 + i * 0x9e37 + (uint64_t)dt * 31 + (uint64_t)op));
  int nan = (h & 0x3ff) == 7; /* about 1 in 1000: a NaN with a payload and the sign set */
  switch (dt) {
    case DT_FLOAT32: {
      if (nan) return 0xffc01234u;
      float v = (float)value_of(h, op, -20, 20);
      uint32_t u; memcpy(&u, &v, 4); return u;
    }
    case DT_FLOAT64: {
      if (nan) return 0xfff8000000abcdefull;
      double v = value_of(h, op, -60, 60);
      uint64_t u; memcpy(&u, &v, 8); return u;
    }
    case DT_FLOAT16: return nan ? 0xfe01 : narrow_encode(&FMT_F16, value_of(h, op, -16, 12));
    case DT_BFLOAT16: return nan ? 0xffc1 : narrow_encode(&FMT_BF16, value_of(h, op, -20, 20));
    case DT_FP8E4M3: return nan ? 0xff : narrow_encode(&FMT_E4M3, value_of(h, op, -8, 6));
    case DT_FP8E5M2: return nan ? 0xfe : narrow_encode(&FMT_E5M2, value_of(h, op, -16, 12));
    default: return h & mask_of(type_size(dt));
  }
}

static void fill_input(unsigned char* buf, int dt, int op, uint64_t seed, int rank, size_t first, size_t count) {
  int size = type_size(dt);
  for (size_t i = 0; i < count; i++) store(buf + i * size, size, input(dt, op, seed, rank, first + i));
}

/* The reference value of element `i` owned by rank `owner`. */
static uint64_t reference(int dt, int op, uint64_t seed, size_t i, int owner) {
  int n = g_nranks;
  uint64_t acc = input(dt, op, seed, (owner + 1) % n, i);
  for (int k = 2; k <= n; k++) acc = ref_step(dt, op, acc, input(dt, op, seed, (owner + k) % n, i));
  return ref_finish(dt, op, acc, n);
}

static int owner_of(size_t i, size_t count) {
  size_t n = (size_t)g_nranks, base = count / n, rem = count % n;
  if (i < rem * (base + 1)) return (int)(i / (base + 1));
  return (int)(rem + (i - rem * (base + 1)) / base);
}

/* ---- driving the v12 table ---- */

static collnet_v12* cn;
static void* g_ctx;

static int wait_req(void* req, int* size, double limit, const char* what) {
  double start = h_now();
  int done = 0;
  while (!done) {
    nccl_result r = cn->test(req, &done, size);
    if (r != NCCL_OK) {
      h_fail("%s: test returned %d: %s", what, r, h_last_warn);
      return 0;
    }
    if (h_now() - start > limit) {
      h_fail("%s: not done after %.0f s", what, limit);
      return 0;
    }
  }
  return 1;
}

/* Post an allreduce, retrying while the group's queue is full; NULL (with a FAIL) on an error. */
static void* post_allreduce(void* coll, void* send, void* recv, size_t count, int dt, int op, void* smh, void* rmh) {
  void* req = NULL;
  double start = h_now();
  while (!req) {
    nccl_result r = cn->iallreduce(coll, send, recv, count, dt, op, smh, rmh, &req);
    if (r != NCCL_OK) {
      h_fail("iallreduce %s %s count %zu returned %d: %s", type_name(dt), op_name(op), count, r, h_last_warn);
      return NULL;
    }
    if (h_now() - start > 30) {
      h_fail("iallreduce never accepted the operation");
      return NULL;
    }
  }
  return req;
}

/* listen, exchange handles, connect: one group; NULL on failure. */
static void* form_group(void) {
  char handle[NET_HANDLE_MAXSIZE];
  void* listen_comm = NULL;
  if (cn->listen(g_ctx, 0, handle, &listen_comm) != NCCL_OK) {
    h_fail("listen: %s", h_last_warn);
    return NULL;
  }
  char* all = malloc((size_t)NET_HANDLE_MAXSIZE * g_nranks);
  void** ptrs = malloc(sizeof(void*) * g_nranks);
  if (!exchange(handle, NET_HANDLE_MAXSIZE, all)) {
    h_fail("handle exchange");
    return NULL;
  }
  for (int i = 0; i < g_nranks; i++) ptrs[i] = all + (size_t)i * NET_HANDLE_MAXSIZE;
  void* coll = NULL;
  nccl_result r = cn->connect(ptrs, g_nranks, g_rank, listen_comm, &coll);
  cn->close_listen(listen_comm);
  free(all);
  free(ptrs);
  if (r != NCCL_OK || !coll) {
    h_fail("connect returned %d: %s", r, h_last_warn);
    return NULL;
  }
  return coll;
}

typedef struct { unsigned char* send; unsigned char* recv; void* send_mh; void* recv_mh; size_t bytes; } bufs;

static int alloc_bufs(void* coll, bufs* b, size_t bytes) {
  b->bytes = bytes;
  b->send = aligned_alloc(4096, bytes);
  b->recv = aligned_alloc(4096, bytes);
  if (!b->send || !b->recv) return 0;
  memset(b->send, 0, bytes);
  memset(b->recv, 0, bytes);
  if (cn->reg_mr(coll, b->send, bytes, PTR_HOST, &b->send_mh) != NCCL_OK ||
      cn->reg_mr(coll, b->recv, bytes, PTR_HOST, &b->recv_mh) != NCCL_OK) {
    h_fail("regMr of %zu bytes: %s", bytes, h_last_warn);
    return 0;
  }
  return 1;
}

static void free_bufs(void* coll, bufs* b) {
  if (cn->dereg_mr(coll, b->send_mh) != NCCL_OK || cn->dereg_mr(coll, b->recv_mh) != NCCL_OK)
    h_fail("deregMr: %s", h_last_warn);
  free(b->send);
  free(b->recv);
}

/* Check `count` elements of `out` against the reference; report the first mismatch. */
static int check_allreduce(const unsigned char* out, int dt, int op, uint64_t seed, size_t count, const char* what) {
  int size = type_size(dt);
  for (size_t i = 0; i < count; i++) {
    uint64_t want = reference(dt, op, seed, i, owner_of(i, count));
    uint64_t got = load(out + i * size, size);
    if (got != want) {
      h_fail("%s %s %s count %zu: element %zu (owner %d) is %#llx, the reference %#llx", what, type_name(dt),
           op_name(op), count, i, owner_of(i, count), (unsigned long long)got, (unsigned long long)want);
      return 0;
    }
  }
  return 1;
}

static int allreduce_once(void* coll, bufs* b, int dt, int op, size_t count, uint64_t seed, int in_place) {
  int size = type_size(dt);
  unsigned char* out = in_place ? b->send : b->recv;
  void* out_mh = in_place ? b->send_mh : b->recv_mh;
  fill_input(b->send, dt, op, seed, g_rank, 0, count);
  if (!in_place) memset(b->recv, 0xa5, count * size);
  void* req = post_allreduce(coll, b->send, out, count, dt, op, b->send_mh, out_mh);
  if (!req) return 0;
  int reported = -1;
  if (!wait_req(req, &reported, 120, "iallreduce")) return 0;
  if ((size_t)reported != count * size) {
    h_fail("iallreduce reported %d bytes for %zu", reported, count * size);
    return 0;
  }
  return check_allreduce(out, dt, op, seed, count, in_place ? "in place" : "iallreduce");
}

static void test_allreduce_matrix(void* coll, bufs* b) {
  size_t counts[] = {0, 1, 13, 5001, 100003};
  int ncounts = g_quick ? 4 : 5;
  int ok = 1, ops = 0;
  for (int dt = 0; dt < DT_COUNT; dt++)
    for (int op = 0; op < OP_COUNT; op++)
      for (int c = 0; c < ncounts; c++) {
        ok &= allreduce_once(coll, b, dt, op, counts[c], 1000 + dt * 10 + op, 0);
        ops++;
      }
  if (ok) pass("iallreduce: %d types x 5 ops x %d counts (0, 1, 13, 5001%s) bit-exact on %d ranks (%d operations)",
               DT_COUNT, ncounts, g_quick ? "" : ", 100003", g_nranks, ops);
  /* 1 Mi elements for a few. */
  struct { int dt, op; } large[] = {{DT_FLOAT32, OP_SUM}, {DT_BFLOAT16, OP_AVG}, {DT_INT64, OP_PROD}, {DT_FP8E4M3, OP_MAX}};
  int nlarge = g_quick ? 1 : 4;
  ok = 1;
  for (int k = 0; k < nlarge; k++) ok &= allreduce_once(coll, b, large[k].dt, large[k].op, 1 << 20, 77 + k, 0);
  if (ok) pass("iallreduce of 1 Mi elements (%d type/op pairs) bit-exact", nlarge);
  ok = allreduce_once(coll, b, DT_FLOAT32, OP_SUM, 100003, 5, 1) & allreduce_once(coll, b, DT_FLOAT16, OP_MIN, 7, 6, 1);
  if (ok) pass("iallreduce in place (sendData == recvData), large and small");
}

/* Eight operations posted before the first test, completed in order. */
static void test_in_flight(void* coll, bufs* b) {
  enum { K = 8 };
  size_t count = 20000;
  int dt = DT_FLOAT32, size = 4;
  void* reqs[K];
  for (int k = 0; k < K; k++) {
    fill_input(b->send + k * count * size, dt, OP_SUM, 900 + k, g_rank, 0, count);
    reqs[k] = NULL;
    while (!reqs[k]) {
      if (cn->iallreduce(coll, b->send + k * count * size, b->recv + k * count * size, count, dt, OP_SUM,
                         b->send_mh, b->recv_mh, &reqs[k]) != NCCL_OK) {
        h_fail("iallreduce %d of %d: %s", k, K, h_last_warn);
        return;
      }
    }
  }
  int ok = 1;
  for (int k = K - 1; k >= 0; k--) { /* tested newest first: they finish in order anyway */
    int size_out = 0;
    ok &= wait_req(reqs[k], &size_out, 120, "in-flight iallreduce");
  }
  for (int k = 0; k < K && ok; k++)
    ok &= check_allreduce(b->recv + k * count * size, dt, OP_SUM, 900 + k, count, "in flight");
  if (ok) pass("%d iallreduce operations in flight at once, tested out of order", K);
}

/* Allgather and reduce-scatter over windows of an n x bytesPerRank vector, with parts. */
static void test_windows(void* coll, bufs* b) {
  size_t bpr = 24000; /* bytes per rank; multiple of 8 */
  size_t total = bpr * (size_t)g_nranks;
  size_t windows[][2] = {{0, total}, {bpr / 2, bpr}, {bpr - 8, 16}, {total - 4000, 4000}, {8, total - 16}};
  int ok = 1, nwin = (int)(sizeof windows / sizeof windows[0]);
  /* Three receive parts over the recv buffer, at gaps so they are not contiguous. */
  for (int w = 0; w < nwin; w++) {
    size_t off = windows[w][0], len = windows[w][1];
    /* Allgather: rank r's bytes are the global vector's [r*bpr, (r+1)*bpr) from a pattern. */
    size_t lo = (size_t)g_rank * bpr, hi = lo + bpr;
    size_t s = off > lo ? off : lo, e = off + len < hi ? off + len : hi;
    size_t own = e > s ? e - s : 0;
    for (size_t i = 0; i < own; i++) b->send[i] = (unsigned char)mix(s + i);
    size_t cut1 = len / 3, cut2 = 2 * len / 3;
    sge_v9 parts[3] = {{b->recv_mh, b->recv, cut1},
                       {b->recv_mh, b->recv + cut1 + 64, cut2 - cut1},
                       {b->recv_mh, b->recv + cut2 + 128, len - cut2}};
    memset(b->recv, 0, len + 192);
    void* req = NULL;
    while (!req)
      if (cn->iallgather(coll, b->send, 3, parts, bpr, off, len, b->send_mh, &req) != NCCL_OK) {
        h_fail("iallgather window %zu+%zu: %s", off, len, h_last_warn);
        return;
      }
    int reported = 0;
    if (!wait_req(req, &reported, 60, "iallgather")) return;
    for (size_t i = 0; i < len && ok; i++) {
      unsigned char got = i < cut1 ? b->recv[i] : i < cut2 ? b->recv[i + 64] : b->recv[i + 128];
      if (got != (unsigned char)mix(off + i)) {
        h_fail("iallgather window %zu+%zu: byte %zu is %d, want %d", off, len, i, got, (unsigned char)mix(off + i));
        ok = 0;
      }
    }
    ok &= (size_t)reported == len;
    /* Reduce-scatter of int32 sums and fp16 avgs: the input is the window, in two parts. */
    int dts[] = {DT_INT32, DT_FLOAT16}, opsv[] = {OP_SUM, OP_AVG};
    for (int k = 0; k < 2 && ok; k++) {
      int dt = dts[k], op = opsv[k], size = type_size(dt);
      uint64_t seed = 4242 + w * 2 + k;
      fill_input(b->send, dt, op, seed, g_rank, off / size, len / size);
      size_t half = (len / 2) & ~(size_t)7;
      /* The second part sits apart from the first, and is registered on its own. */
      memmove(b->send + half + 256, b->send + half, len - half);
      sge_v9 sparts[2] = {{b->send_mh, b->send, half}, {b->send_mh, b->send + half + 256, len - half}};
      memset(b->recv, 0xee, bpr);
      req = NULL;
      while (!req)
        if (cn->ireducescatter(coll, 2, sparts, b->recv, bpr, off, len, dt, op, b->recv_mh, &req) != NCCL_OK) {
          h_fail("ireducescatter window %zu+%zu: %s", off, len, h_last_warn);
          return;
        }
      if (!wait_req(req, &reported, 60, "ireducescatter")) return;
      for (size_t g = s; g < e && ok; g += size) {
        uint64_t want = reference(dt, op, seed, g / size, g_rank);
        uint64_t got = load(b->recv + (g - s), size);
        if (got != want) {
          h_fail("ireducescatter %s %s window %zu+%zu: byte %zu is %#llx, want %#llx", type_name(dt), op_name(op), off,
               len, g, (unsigned long long)got, (unsigned long long)want);
          ok = 0;
        }
      }
      if ((size_t)reported != own) {
        h_fail("ireducescatter reported %d bytes, own part %zu", reported, own);
        ok = 0;
      }
    }
  }
  if (ok) pass("iallgather (3 receive parts) and ireducescatter (2 send parts; int32 sum, fp16 avg) over %d windows", nwin);
}

/* Two groups at once, operations interleaved. */
static void test_two_groups(void* coll_a, bufs* a) {
  void* coll_b = form_group();
  if (!coll_b) return;
  bufs b;
  if (!alloc_bufs(coll_b, &b, 1 << 20)) return;
  size_t count = 30000;
  fill_input(a->send, DT_FLOAT64, OP_SUM, 31, g_rank, 0, count);
  fill_input(b.send, DT_INT32, OP_MAX, 32, g_rank, 0, count);
  void* ra = post_allreduce(coll_a, a->send, a->recv, count, DT_FLOAT64, OP_SUM, a->send_mh, a->recv_mh);
  void* rb = post_allreduce(coll_b, b.send, b.recv, count, DT_INT32, OP_MAX, b.send_mh, b.recv_mh);
  if (!ra || !rb) return;
  int da = 0, db = 0, sz;
  double start = h_now();
  while ((!da || !db) && h_now() - start < 60) {
    if (!db && cn->test(rb, &db, &sz) != NCCL_OK) break;
    if (!da && cn->test(ra, &da, &sz) != NCCL_OK) break;
  }
  int ok = da && db && check_allreduce(a->recv, DT_FLOAT64, OP_SUM, 31, count, "group A") &&
           check_allreduce(b.recv, DT_INT32, OP_MAX, 32, count, "group B");
  if (!da || !db) h_fail("two groups: operations did not finish (%d %d): %s", da, db, h_last_warn);
  free_bufs(coll_b, &b);
  if (cn->close_coll(coll_b) != NCCL_OK) h_fail("closeColl of the second group");
  if (ok) pass("two groups formed and used at once");
}

/* ---- the older tables: one group each, an allreduce (and windows where they exist) ---- */

#define OLDER_TABLE(v, type, count_t, sge_t, has_windows, init_expr, listen_expr)                      \
  do {                                                                                                \
    type* t = dlsym(lib, "ncclCollNetPlugin_v" #v);                                                   \
    if (!t) { h_fail("no ncclCollNetPlugin_v" #v); break; }                                             \
    if (init_expr != NCCL_OK) { h_fail("v" #v " init: %s", h_last_warn); break; }                       \
    char handle[NET_HANDLE_MAXSIZE];                                                                  \
    void* lc = NULL;                                                                                  \
    if (listen_expr != NCCL_OK) { h_fail("v" #v " listen: %s", h_last_warn); break; }                   \
    char* all = malloc((size_t)NET_HANDLE_MAXSIZE * g_nranks);                                        \
    void* ptrs[64];                                                                                   \
    if (!exchange(handle, NET_HANDLE_MAXSIZE, all)) { h_fail("exchange"); break; }                      \
    for (int i = 0; i < g_nranks; i++) ptrs[i] = all + (size_t)i * NET_HANDLE_MAXSIZE;                \
    void* coll = NULL;                                                                                \
    nccl_result r = t->connect(ptrs, g_nranks, g_rank, lc, &coll);                                    \
    t->close_listen(lc);                                                                              \
    free(all);                                                                                        \
    if (r != NCCL_OK) { h_fail("v" #v " connect: %s", h_last_warn); break; }                            \
    size_t count = 4099;                                                                              \
    unsigned char* s = aligned_alloc(4096, 65536);                                                    \
    unsigned char* o = aligned_alloc(4096, 65536);                                                    \
    void *smh = NULL, *omh = NULL;                                                                    \
    t->reg_mr(coll, s, 65536, PTR_HOST, &smh);                                                        \
    t->reg_mr(coll, o, 65536, PTR_HOST, &omh);                                                        \
    fill_input(s, DT_FLOAT32, OP_SUM, 600 + v, g_rank, 0, count);                                     \
    void* req = NULL;                                                                                 \
    while (!req)                                                                                      \
      if (t->iallreduce(coll, s, o, (count_t)count, DT_FLOAT32, OP_SUM, smh, omh, &req) != NCCL_OK) {  \
        h_fail("v" #v " iallreduce: %s", h_last_warn); break;                                           \
      }                                                                                               \
    int done = 0, sz = 0;                                                                             \
    double start = h_now();                                                                           \
    while (req && !done && h_now() - start < 60)                                                      \
      if (t->test(req, &done, &sz) != NCCL_OK) break;                                                 \
    int ok = done && check_allreduce(o, DT_FLOAT32, OP_SUM, 600 + v, count, "v" #v);                  \
    if (has_windows && ok) ok = older_windows_##v(t, coll, s, o, smh, omh);                           \
    t->dereg_mr(coll, smh);                                                                           \
    t->dereg_mr(coll, omh);                                                                           \
    free(s);                                                                                          \
    free(o);                                                                                          \
    if (t->close_coll(coll) != NCCL_OK) h_fail("v" #v " closeColl");                                    \
    if (ok) pass("ncclCollNetPlugin_v" #v ": group, iallreduce%s", has_windows ? ", iallgather" : "");  \
  } while (0)

#define OLDER_WINDOWS(v, type, sge_t)                                                                 \
  static int older_windows_##v(type* t, void* coll, unsigned char* s, unsigned char* o, void* smh,     \
                               void* omh) {                                                           \
    size_t bpr = 1000;                                                                                \
    for (size_t i = 0; i < bpr; i++) s[i] = (unsigned char)mix(g_rank * bpr + i);                     \
    sge_t part = {omh, o, (uint32_t)(bpr * g_nranks)};                                                \
    void* req = NULL;                                                                                 \
    while (!req)                                                                                      \
      if (t->iallgather(coll, s, 1, &part, bpr, 0, bpr * g_nranks, smh, &req) != NCCL_OK) return 0;  \
    int done = 0, sz = 0;                                                                             \
    double start = h_now();                                                                           \
    while (!done && h_now() - start < 60)                                                             \
      if (t->test(req, &done, &sz) != NCCL_OK) return 0;                                              \
    for (size_t i = 0; i < bpr * g_nranks; i++)                                                       \
      if (o[i] != (unsigned char)mix(i)) {                                                            \
        h_fail("v" #v " iallgather: byte %zu", i);                                                      \
        return 0;                                                                                     \
      }                                                                                               \
    return done;                                                                                      \
  }
OLDER_WINDOWS(8, collnet_v8, sge_v8)
OLDER_WINDOWS(9, collnet_v9, sge_v9)
static int older_windows_6(collnet_v6* t, void* c, unsigned char* s, unsigned char* o, void* a, void* b) {
  (void)t; (void)c; (void)s; (void)o; (void)a; (void)b;
  return 1;
}

static void test_older_tables(void* lib) {
  OLDER_TABLE(6, collnet_v6, int, sge_v8, 0, t->init(h_logger), t->listen(0, handle, &lc));
  OLDER_TABLE(8, collnet_v8, int, sge_v8, 1, t->init(h_logger), t->listen(0, handle, &lc));
  OLDER_TABLE(9, collnet_v9, size_t, sge_v9, 1, t->init(h_logger), t->listen(0, handle, &lc));
}

/* ---- failure modes ---- */

/* The last rank dies with a large operation in flight; the others must fail, not hang. */
static void test_kill(void* coll, bufs* b) {
  size_t count = (b->bytes / 4);
  fill_input(b->send, DT_FLOAT32, OP_SUM, 1, g_rank, 0, count);
  void* req = NULL;
  char sync = 0, all[64];
  exchange(&sync, 1, all); /* everyone is here */
  if (g_rank == g_nranks - 1) {
    usleep(100000);
    _exit(0); /* in the middle: the others posted and wait for this rank's data */
  }
  req = post_allreduce(coll, b->send, b->recv, count, DT_FLOAT32, OP_SUM, b->send_mh, b->recv_mh);
  if (!req) return;
  double start = h_now();
  int done = 0, size = 0;
  nccl_result r = NCCL_OK;
  while (!done && h_now() - start < 60) {
    r = cn->test(req, &done, &size);
    if (r != NCCL_OK) break;
  }
  double took = h_now() - start;
  if (r != NCCL_OK && took < 20)
    pass("a member killed mid-operation fails the others in %.1f s (error %d: %s)", took, r, h_last_warn);
  else
    h_fail("a member killed mid-operation: test returned %d after %.1f s, done %d", r, took, done);
  /* Later calls report the same failure; close still works. */
  void* again = NULL;
  if (cn->iallreduce(coll, b->send, b->recv, 16, DT_FLOAT32, OP_SUM, b->send_mh, b->recv_mh, &again) == NCCL_OK)
    h_fail("an operation posted on a failed group was accepted");
  else
    pass("the failure is sticky: a later iallreduce is refused");
}

/* ---- figures: allreduce algorithm bandwidth ---- */

static void bench_allreduce(void* coll, bufs* b) {
  size_t sizes[] = {64 << 10, 1 << 20, 4 << 20};
  for (int k = 0; k < 3; k++) {
    size_t bytes = sizes[k], count = bytes / 4;
    int iters = bytes >= (1 << 20) ? 5 : 20;
    fill_input(b->send, DT_FLOAT32, OP_SUM, 77, g_rank, 0, count);
    char sync = 0, all[64];
    double best = 1e30, total = 0;
    for (int it = 0; it <= iters; it++) {
      exchange(&sync, 1, all); /* start together */
      double t0 = h_now();
      void* req = post_allreduce(coll, b->send, b->recv, count, DT_FLOAT32, OP_SUM, b->send_mh, b->recv_mh);
      int reported = -1;
      if (!req || !wait_req(req, &reported, 120, "bench iallreduce")) return;
      double took = h_now() - t0;
      if (it == 0) continue; /* warm-up */
      total += took;
      if (took < best) best = took;
    }
    if (!check_allreduce(b->recv, DT_FLOAT32, OP_SUM, 77, count, "bench")) return;
    double mean = total / iters, bus = 2.0 * (g_nranks - 1) / g_nranks;
    if (g_rank == 0)
      h_line("", "BENCH allreduce float32 sum %zu B x %d ranks: mean %.0f us, best %.0f us, algbw %.1f MB/s, "
             "busbw %.1f MB/s",
             bytes, g_nranks, mean * 1e6, best * 1e6, bytes / mean / 1e6, bytes / mean / 1e6 * bus);
  }
  pass("allreduce bandwidth measured (%d ranks)", g_nranks);
}

static int run_rank(const char* path, int mode) {
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    h_fail("dlopen %s: %s", path, dlerror());
    return 1;
  }
  cn = dlsym(lib, "ncclCollNetPlugin_v12");
  if (!cn) {
    h_fail("no ncclCollNetPlugin_v12");
    return 1;
  }
  if (cn->init(&g_ctx, 42, h_logger) != NCCL_OK) {
    h_fail("init: %s", h_last_warn);
    return 1;
  }
  if (mode == 2) { /* --missing */
    char handle[NET_HANDLE_MAXSIZE];
    void* lc = NULL;
    if (cn->listen(g_ctx, 0, handle, &lc) != NCCL_OK) return 1;
    char* all = malloc((size_t)NET_HANDLE_MAXSIZE * g_nranks);
    void* ptrs[64];
    exchange(handle, NET_HANDLE_MAXSIZE, all);
    for (int i = 0; i < g_nranks; i++) ptrs[i] = all + (size_t)i * NET_HANDLE_MAXSIZE;
    if (g_rank == g_nranks - 1) {
      sleep(8); /* never connects */
      return h_failures;
    }
    void* coll = NULL;
    double start = h_now();
    nccl_result r = cn->connect(ptrs, g_nranks, g_rank, lc, &coll);
    double took = h_now() - start;
    char want[32], want_list[32];
    snprintf(want, sizeof want, "rank %d", g_nranks - 1);
    snprintf(want_list, sizeof want_list, "rank(s) %d", g_nranks - 1);
    if (r != NCCL_OK && took < 10 && (strstr(h_last_warn, want) || strstr(h_last_warn, want_list)))
      pass("a member that never connects fails connect in %.1f s: %s", took, h_last_warn);
    else
      h_fail("missing member: connect returned %d after %.1f s: %s", r, took, h_last_warn);
    cn->close_listen(lc);
    return h_failures;
  }
  void* coll = form_group();
  if (!coll) return 1;
  pass("a group of %d ranks formed", g_nranks);
  bufs b;
  if (!alloc_bufs(coll, &b, 8 << 20)) return 1;
  if (mode == 0) {
    /* The reductions run on the host CPU: host memory only, whatever the net table offers. */
    props_v12 props;
    void* gpu_mh = NULL;
    if (cn->get_properties(0, &props) != NCCL_OK || props.ptr_support != PTR_HOST)
      h_fail("CollNet getProperties: ptrSupport %#x, expected host memory only", props.ptr_support);
    else if (cn->reg_mr(coll, b.send, 4096, 0x2 /* NCCL_PTR_CUDA */, &gpu_mh) == NCCL_OK)
      h_fail("CollNet regMr accepted memory of type NCCL_PTR_CUDA");
    else if (!strstr(h_last_warn, "host memory only"))
      h_fail("CollNet regMr of NCCL_PTR_CUDA: the message does not say why: %s", h_last_warn);
    else
      pass("host memory only: getProperties offers NCCL_PTR_HOST, regMr refuses NCCL_PTR_CUDA");
  }
  if (mode == 1) {
    test_kill(coll, &b);
    return h_failures;
  }
  if (mode == 3) {
    bench_allreduce(coll, &b);
    free_bufs(coll, &b);
    if (cn->close_coll(coll) != NCCL_OK) h_fail("closeColl: %s", h_last_warn);
    return h_failures;
  }
  test_allreduce_matrix(coll, &b);
  test_in_flight(coll, &b);
  test_windows(coll, &b);
  test_two_groups(coll, &b);
  free_bufs(coll, &b);
  if (cn->close_coll(coll) != NCCL_OK) h_fail("closeColl: %s", h_last_warn);
  else pass("closeColl");
  test_older_tables(lib);
  if (cn->finalize(g_ctx) != NCCL_OK) h_fail("finalize");
  return h_failures;
}

int main(int argc, char** argv) {
  h_role = g_role;
  if (argc < 2) {
    fprintf(stderr,
            "usage: %s LIB [--ranks N] [--quick] [--kill] [--missing] [--bench] [--serve PORT | --server "
            "ADDR:PORT] [--first-rank F] [--local K]\n",
            argv[0]);
    return 2;
  }
  int nranks = 3, mode = 0, serve_port = 0, first = 0, nlocal = -1;
  const char* server = NULL;
  for (int i = 2; i < argc; i++) {
    if (!strcmp(argv[i], "--ranks") && i + 1 < argc) nranks = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--quick")) g_quick = 1;
    else if (!strcmp(argv[i], "--kill")) mode = 1;
    else if (!strcmp(argv[i], "--missing")) mode = 2;
    else if (!strcmp(argv[i], "--bench")) mode = 3;
    else if (!strcmp(argv[i], "--serve") && i + 1 < argc) serve_port = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--server") && i + 1 < argc) server = argv[++i];
    else if (!strcmp(argv[i], "--first-rank") && i + 1 < argc) first = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--local") && i + 1 < argc) nlocal = atoi(argv[++i]);
    else {
      fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (nranks < 2 || nranks > 8) {
    fprintf(stderr, "--ranks takes 2..8\n");
    return 2;
  }
  if (nlocal < 0) nlocal = nranks - first;
  if (first < 0 || nlocal < 1 || first + nlocal > nranks || (serve_port && server) ||
      (nlocal < nranks && !serve_port && !server)) {
    fprintf(stderr, "--first-rank/--local must name ranks of 0..N-1; a partial host needs --serve or --server\n");
    return 2;
  }
  if (mode == 2) setenv("RIVET_HANDSHAKE_TIMEOUT_MS", "3000", 1);
  g_nranks = nranks;
  int fds[8], local[8] = {0};
  pid_t pids[8];
  for (int r = 0; r < 8; r++) fds[r] = -1;
  double start = h_now();
  for (int r = first; r < first + nlocal; r++) {
    int sv[2] = {-1, -1};
    if (!server && socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) return 2;
    pid_t pid = fork();
    if (pid == 0) {
      for (int k = 0; k < 8; k++)
        if (fds[k] >= 0) close(fds[k]);
      g_rank = r;
      snprintf(g_role, sizeof g_role, "rank %d", r);
      if (server) {
        g_fd = h_rank_dial(server, r);
        if (g_fd < 0) {
          h_fail("cannot reach the exchange server %s", server);
          _exit(1);
        }
      } else {
        close(sv[0]);
        g_fd = sv[1];
      }
      alarm(mode == 3 ? 300 : mode ? 60 : 900); /* a hang ends as a failure, not a stuck lane */
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
  /* Serve exchanges until a rank closes its end (the clients' parents only wait). */
  while (!server && !bad) {
    uint32_t len = 0, first_len = 0;
    char* blob = NULL;
    int broken = 0;
    for (int r = 0; r < nranks && !broken; r++) {
      if (!h_control_recv(fds[r], &len, sizeof len)) { broken = 1; break; }
      if (r == 0) {
        first_len = len;
        blob = malloc((size_t)len * nranks);
      } else if (len != first_len) {
        h_fail("ranks exchanged different sizes (%u, %u)", first_len, len);
        broken = 1;
        break;
      }
      if (!h_control_recv(fds[r], blob + (size_t)r * len, len)) broken = 1;
    }
    if (!broken)
      for (int r = 0; r < nranks; r++) h_control_send(fds[r], blob, (size_t)len * nranks);
    free(blob);
    if (broken) break;
  }
  for (int r = 0; r < nranks; r++)
    if (fds[r] >= 0) close(fds[r]);
  for (int r = first; r < first + nlocal; r++) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    int expected_exit = (mode == 1 || mode == 2) && r == nranks - 1; /* the victim's own result does not count */
    if (!expected_exit && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      h_fail("rank %d: %s %d", r, WIFSIGNALED(status) ? "killed by signal" : "exit status",
             WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
      bad++;
    }
  }
  fprintf(stderr, "collnet: %d ranks (%d here), %s, %d rank(s) failed, %.1f s\n", nranks, nlocal,
          mode == 1 ? "killed member" : mode == 2 ? "missing member" : mode == 3 ? "bench" : g_quick ? "quick" : "full",
          bad, h_now() - start);
  return bad ? 1 : 0;
}
