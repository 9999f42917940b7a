/* benches/callgrind_pingpong.c: the instructions Rivet (or any net plugin) spends per 8-byte
 * round trip, counted by callgrind, for benches/callgrind_pingpong.sh.
 *
 * One process, one thread, two connections made with listen -> connect -> accept to itself
 * (A sends to B over the first, B to A over the second). Each round, in lockstep:
 *   B irecv, A irecv; A isend (ping); A test (send), B test (receive);
 *   B isend (pong); B test (send), A test (receive).
 * So per round trip each side makes one isend, one irecv and two tests. Between the steps the
 * program sleeps with callgrind's collection off, long enough for Soft-RoCE to finish the
 * operation, so that every counted call finds its work done: no empty polls are counted. A call
 * that still finds nothing (an isend returning no request, a test returning done = 0) is
 * retried after another sleep and reported as "empty calls": when that number is not 0 the
 * figure includes them.
 *
 * usage: callgrind_pingpong PLUGIN.so [ROUNDS=2000] [WARMUP=50] [SETTLE_US=1000]
 * Run under `valgrind --tool=callgrind --collect-atstart=no`; without valgrind it runs the same
 * loop and the client requests do nothing. */
#include "../tests/c/harness.h"
#include <unistd.h>
#include <valgrind/callgrind.h>

static int collecting;
static void collect(int on) {
  if (on != collecting) {
    CALLGRIND_TOGGLE_COLLECT;
    collecting = on;
  }
}
static unsigned settle_us = 1000;
static long empty_calls;
static int counting;

static void settle(void) {
  int was = collecting;
  collect(0);
  usleep(settle_us);
  collect(was);
}

/* One call of a plugin function; returns 1 when it did its work (a request, or done). */
typedef struct {
  void *comm, *buf, *mh, *req;
  int tag;
} call_args;
typedef int (*attempt_fn)(call_args*);

/* How NCCL calls (PROFILER in the environment):
 *   unset or "nccl": NCCL's convention without a profiler plugin, the default and the figure docs
 *     quote: init gets NCCL's callback, every isend/irecv a non-NULL pHandle, and the callback
 *     returns without an event handle (NCCL's ncclProfilerCallback with no profiler loaded writes
 *     nothing and returns ncclSuccess);
 *   "1": a profiler plugin attached: the callback hands out an event handle, as a minimal
 *     profiler does, so the plugin's events are counted too;
 *   "0": no callback and NULL pHandles (what NCCL never does; for comparison). */
static int profiling;  /* callback given and pHandles non-NULL */
static int profiler_returns_handles;
static int profiler_events;
static nccl_result bench_profiler(void** eh, int type, void* ph, int64_t id, void* ext) {
  (void)ph;
  (void)id;
  (void)ext;
  if (!profiler_returns_handles) return NCCL_OK;
  if (type == PROFILER_NET_EVENT_START && eh) *eh = &profiler_events;
  profiler_events++;
  return NCCL_OK;
}
static int phandle_target;

static int attempt_isend(call_args* a) {
  void* phandle = profiling ? &phandle_target : NULL;
  if (h_net->isend(a->comm, a->buf, 8, a->tag, a->mh, phandle, &a->req) != NCCL_OK) {
    h_fail("isend failed");
    exit(1);
  }
  return a->req != NULL;
}

static int attempt_irecv(call_args* a) {
  void* data[1] = {a->buf};
  size_t sizes[1] = {8};
  int tags[1] = {a->tag};
  void* mhs[1] = {a->mh};
  void* phandles[1] = {&phandle_target};
  if (h_net->irecv(a->comm, 1, data, sizes, tags, mhs, profiling ? phandles : NULL, &a->req) != NCCL_OK) {
    h_fail("irecv failed");
    exit(1);
  }
  return a->req != NULL;
}

static int attempt_test(call_args* a) {
  int done = 0, size = 0;
  if (h_net->test(a->req, &done, &size) != NCCL_OK) {
    h_fail("test failed");
    exit(1);
  }
  return done;
}

/* Call until it does its work; each call that does not counts as an empty call. */
static void* until_done(attempt_fn attempt, call_args a, const char* what) {
  for (int tries = 0; tries < 10000; tries++) {
    if (attempt(&a)) return a.req;
    if (counting) empty_calls++;
    settle();
  }
  h_fail("%s never did its work", what);
  exit(1);
}

static void* do_isend(void* comm, void* buf, void* mh, int tag) {
  return until_done(attempt_isend, (call_args){.comm = comm, .buf = buf, .mh = mh, .tag = tag}, "isend");
}
static void* do_irecv(void* comm, void* buf, void* mh, int tag) {
  return until_done(attempt_irecv, (call_args){.comm = comm, .buf = buf, .mh = mh, .tag = tag}, "irecv");
}
static void do_test(void* req) { until_done(attempt_test, (call_args){.req = req}, "test"); }

int main(int argc, char** argv) {
  h_role = "pingpong";
  if (argc < 2) {
    fprintf(stderr, "usage: %s PLUGIN.so [ROUNDS] [WARMUP] [SETTLE_US]\n", argv[0]);
    return 2;
  }
  int rounds = argc > 2 ? atoi(argv[2]) : 2000;
  int warmup = argc > 3 ? atoi(argv[3]) : 50;
  if (argc > 4) settle_us = (unsigned)atoi(argv[4]);
  const char* mode = getenv("PROFILER");
  profiling = !mode || strcmp(mode, "0") != 0;
  profiler_returns_handles = mode && !strcmp(mode, "1");
  void* ctx = h_load_and_init(argv[1]);
  if (!ctx) return 1;
  if (profiling) {
    /* Re-initialise with the callback (finalize the plain context first). */
    h_net->finalize(ctx);
    comm_config cfg = {.traffic_class = -1};
    if (h_net->init(&ctx, 7, &cfg, h_logger, bench_profiler) != NCCL_OK) {
      h_fail("init with a profiler callback failed");
      return 1;
    }
  }
  /* PINGPONG_FUSE=0,1: over a device fused from those (a multi-lane connection, as a fused
   * device's always is; with NCCL_IB_RESILIENCY_PORT_FAILOVER=1 it fails over). */
  const char* fuse = getenv("PINGPONG_FUSE");
  if (fuse && (h_dev = h_fuse(h_net, fuse)) < 0) {
    h_fail("fusing %s", fuse);
    return 1;
  }
  void *a_send, *b_recv, *b_send, *a_recv;
  if (!h_self_connect(ctx, &a_send, &b_recv, 30) || !h_self_connect(ctx, &b_send, &a_recv, 30)) {
    h_fail("connections not made within 30 s");
    return 1;
  }
  static unsigned char a_out[8], a_in[8], b_out[8], b_in[8];
  void *mh_as, *mh_ar, *mh_bs, *mh_br;
  if (h_net->reg_mr(a_send, a_out, sizeof a_out, PTR_HOST, &mh_as) != NCCL_OK ||
      h_net->reg_mr(a_recv, a_in, sizeof a_in, PTR_HOST, &mh_ar) != NCCL_OK ||
      h_net->reg_mr(b_send, b_out, sizeof b_out, PTR_HOST, &mh_bs) != NCCL_OK ||
      h_net->reg_mr(b_recv, b_in, sizeof b_in, PTR_HOST, &mh_br) != NCCL_OK) {
    h_fail("regMr");
    return 1;
  }
  for (int r = 0; r < warmup + rounds; r++) {
    if (r == warmup) {
      counting = 1;
      collect(1);
    }
    a_out[0] = (unsigned char)r;
    b_out[0] = (unsigned char)(r + 1);
    void* rb = do_irecv(b_recv, b_in, mh_br, 1);
    void* ra = do_irecv(a_recv, a_in, mh_ar, 2);
    settle(); /* the clear-to-sends reach the senders */
    void* sa = do_isend(a_send, a_out, mh_as, 1);
    settle();
    do_test(sa);
    do_test(rb);
    void* sb = do_isend(b_send, b_out, mh_bs, 2);
    settle();
    do_test(sb);
    do_test(ra);
    if (b_in[0] != (unsigned char)r || a_in[0] != (unsigned char)(r + 1)) {
      h_fail("round %d: wrong data", r);
      return 1;
    }
  }
  collect(0);
  printf("pingpong: rounds=%d empty_calls=%ld profiler=%d profiler_events=%d\n", rounds, empty_calls,
         profiling, profiler_events);
  h_net->dereg_mr(a_send, mh_as);
  h_net->dereg_mr(a_recv, mh_ar);
  h_net->dereg_mr(b_send, mh_bs);
  h_net->dereg_mr(b_recv, mh_br);
  h_net->close_send(a_send);
  h_net->close_send(b_send);
  h_net->close_recv(a_recv);
  h_net->close_recv(b_recv);
  if (h_net->finalize) h_net->finalize(ctx);
  return h_failures ? 1 : 0;
}
