/* Two processes move data through a net plugin exactly as NCCL's proxy would, through the
 * ncclNetPlugin_v12 table (or v9/v10/v11 with --version), and verify every byte.
 *
 * usage: transfer LIB [--version N] [--dev D | --fuse A,B,...] [--quick] [--small N] [--listen-port P | --peer A.B.C.D:P]
 *
 * --fuse A,B,...: fuse devices A, B, ... with makeVDevice (v12) as NCCL 2.24+ does, and run on the
 * device it returns.
 * The parent is the receiver (listen/accept/irecv), the forked child the sender
 * (connect/isend); the listen handle travels over a pipe, as NCCL's bootstrap carries it.
 * Across hosts (two VMs, vm/multi.sh) there is no fork: `--listen-port P` makes this process the
 * receiver, which hands its listen handle to the sender over a TCP control connection accepted on
 * port P; `--peer A.B.C.D:P` makes it the sender, which dials that port (retrying up to 120 s).
 * Checks: sizes 0 B … 64 MiB (receive buffers larger than the sends), a grouped receive of
 * n = 8 with tags sent in shuffled order, and 10,000 (--small N: N) small messages with a window of 8.
 * --quick: sizes up to 255 B only.
 * Prints "PASS ..."/"FAIL ..." lines (set HARNESS_VERBOSE=1 for the plugin's INFO lines); exits non-zero on any failure or after a 600 s watchdog. */
#define _GNU_SOURCE
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include "harness.h"

#define MIB (1024 * 1024)
#define MAX_SIZE (64 * MIB)
#define SLACK 64 /* receive buffers are larger than the sends */

static int verify(const unsigned char* p, size_t n, unsigned seed, const char* what) {
  for (size_t i = 0; i < n; i++) {
    if (p[i] != h_pattern(seed, i)) {
      h_fail("%s: byte %zu is %u, expected %u", what, i, p[i], h_pattern(seed, i));
      return 0;
    }
  }
  return 1;
}

/* The v12 table covers v11 too; for v9/v10 the differing entries are called through the right
 * table below. */
static net_v12* v12;
static net_v10* v10;
static int version = 12;

static nccl_result do_isend(void* comm, void* data, size_t size, int tag, void* mh, void** req) {
  if (version >= 10) return v12->isend(comm, data, size, tag, mh, NULL, req);
  return ((net_v9*)v10)->isend(comm, data, size, tag, mh, req);
}

static nccl_result do_irecv(void* comm, int n, void** data, size_t* sizes, int* tags, void** mhs, void** req) {
  if (version >= 10) return v12->irecv(comm, n, data, sizes, tags, mhs, NULL, req);
  return ((net_v9*)v10)->irecv(comm, n, data, sizes, tags, mhs, req);
}

/* Spin on test() until done; returns 0 on error. */
static int wait_req(void* req, int* sizes, const char* what) {
  int done = 0;
  double start = h_now();
  while (!done) {
    nccl_result r = v12->test(req, &done, sizes);
    if (r != NCCL_OK) {
      h_fail("%s: test returned %d", what, r);
      return 0;
    }
    if (h_now() - start > 120) {
      h_fail("%s: not complete after 120 s", what);
      return 0;
    }
  }
  return 1;
}

static void* post_send(void* comm, void* data, size_t size, int tag, void* mh, const char* what) {
  void* req = NULL;
  double start = h_now();
  while (!req) {
    nccl_result r = do_isend(comm, data, size, tag, mh, &req);
    if (r != NCCL_OK) {
      h_fail("%s: isend returned %d", what, r);
      return NULL;
    }
    if (!req && h_now() - start > 120) {
      h_fail("%s: isend still refused after 120 s", what);
      return NULL;
    }
  }
  return req;
}

static void* post_recv(void* comm, int n, void** data, size_t* sizes, int* tags, void** mhs, const char* what) {
  void* req = NULL;
  double start = h_now();
  while (!req) {
    nccl_result r = do_irecv(comm, n, data, sizes, tags, mhs, &req);
    if (r != NCCL_OK) {
      h_fail("%s: irecv returned %d", what, r);
      return NULL;
    }
    if (!req && h_now() - start > 120) {
      h_fail("%s: irecv still refused after 120 s", what);
      return NULL;
    }
  }
  return req;
}

static const size_t sizes_list[] = {0, 1, 7, 8, 63, 64, 65, 255, 256, 4095, 4096, 4097, 65536, 1 * MIB, 4 * MIB,
                                    16 * MIB, MAX_SIZE};
#define NSIZES (sizeof sizes_list / sizeof sizes_list[0])
static int small_count = 10000; /* --small N */
#define SMALL_COUNT small_count
#define SMALL_SIZE 64
#define WINDOW 8
static const int shuffled_tags[8] = {5, 2, 7, 0, 3, 6, 1, 4};

static int run_sender(void* send, int quick) {
  unsigned char* buf = malloc(MAX_SIZE);
  void* mh = NULL;
  if (!buf || v12->reg_mr(send, buf, MAX_SIZE, PTR_HOST, &mh) != NCCL_OK) {
    h_fail("sender: regMr of %d bytes", MAX_SIZE);
    return 1;
  }
  size_t nsizes = quick ? 8 : NSIZES;
  for (size_t k = 0; k < nsizes; k++) {
    h_fill(buf, sizes_list[k], (unsigned)k + 1);
    void* req = post_send(send, buf, sizes_list[k], 1, mh, "size sweep");
    int sz = -1;
    if (!req || !wait_req(req, &sz, "size sweep send")) return 1;
    if ((size_t)sz != sizes_list[k]) h_fail("send of %zu reported size %d", sizes_list[k], sz);
  }
  /* Grouped: 8 sends of different sizes, in shuffled tag order. */
  void* reqs[8];
  for (int i = 0; i < 8; i++) {
    int tag = shuffled_tags[i];
    size_t size = 1000 * (size_t)(tag + 1);
    unsigned char* p = buf + (size_t)tag * 16384;
    h_fill(p, size, 100 + tag);
    reqs[i] = post_send(send, p, size, tag, mh, "grouped");
    if (!reqs[i]) return 1;
  }
  for (int i = 0; i < 8; i++) {
    int sz;
    if (!wait_req(reqs[i], &sz, "grouped send")) return 1;
  }
  /* Many small messages, window of 8. */
  void* window[WINDOW] = {0};
  double t0 = h_now();
  for (int i = 0; i < SMALL_COUNT + WINDOW; i++) {
    int w = i % WINDOW;
    if (window[w]) {
      int sz;
      if (!wait_req(window[w], &sz, "small send")) return 1;
      window[w] = NULL;
    }
    if (i < SMALL_COUNT) {
      unsigned char* p = buf + (size_t)w * SMALL_SIZE;
      h_fill(p, SMALL_SIZE, 1000 + i);
      window[w] = post_send(send, p, SMALL_SIZE, 9, mh, "small");
      if (!window[w]) return 1;
    }
  }
  double t1 = h_now();
  fprintf(stderr, "[sender] %d x %d B messages with a window of %d: %.1f msg/s\n", SMALL_COUNT, SMALL_SIZE, WINDOW,
          SMALL_COUNT / (t1 - t0));
  if (v12->dereg_mr(send, mh) != NCCL_OK) h_fail("sender deregMr");
  if (v12->close_send(send) != NCCL_OK) h_fail("closeSend");
  free(buf);
  return h_failures != 0;
}

static int run_receiver(void* recv, int quick) {
  size_t cap = MAX_SIZE + SLACK;
  unsigned char* buf = malloc(cap);
  void* mh = NULL;
  if (!buf || v12->reg_mr(recv, buf, cap, PTR_HOST, &mh) != NCCL_OK) {
    h_fail("receiver: regMr of %zu bytes", cap);
    return 1;
  }
  size_t nsizes = quick ? 8 : NSIZES;
  for (size_t k = 0; k < nsizes; k++) {
    memset(buf, 0xee, sizes_list[k] + SLACK);
    void* data[1] = {buf};
    size_t sizes[1] = {sizes_list[k] + SLACK};
    int tags[1] = {1};
    void* mhs[1] = {mh};
    void* req = post_recv(recv, 1, data, sizes, tags, mhs, "size sweep");
    int got = -1;
    if (!req || !wait_req(req, &got, "size sweep recv")) return 1;
    char what[64];
    snprintf(what, sizeof what, "message of %zu bytes", sizes_list[k]);
    if ((size_t)got != sizes_list[k]) h_fail("%s: receiver reported %d bytes", what, got);
    else if (verify(buf, sizes_list[k], (unsigned)k + 1, what) && buf[sizes_list[k]] == 0xee)
      fprintf(stderr, "PASS %s arrived intact\n", what);
    else if (buf[sizes_list[k]] != 0xee)
      h_fail("%s: bytes written past the message", what);
  }
  /* Grouped receive of 8 buffers, tags 0..7, each buffer larger than its message. */
  {
    void* data[8];
    size_t sizes[8];
    int tags[8];
    void* mhs[8];
    for (int t = 0; t < 8; t++) {
      data[t] = buf + (size_t)t * 16384;
      sizes[t] = 16384;
      tags[t] = t;
      mhs[t] = mh;
    }
    memset(buf, 0xee, 8 * 16384);
    void* req = post_recv(recv, 8, data, sizes, tags, mhs, "grouped");
    int got[8] = {0};
    if (!req || !wait_req(req, got, "grouped recv")) return 1;
    int ok = 1;
    for (int t = 0; t < 8; t++) {
      size_t want = 1000 * (size_t)(t + 1);
      char what[64];
      snprintf(what, sizeof what, "grouped buffer for tag %d", t);
      if ((size_t)got[t] != want) {
        h_fail("%s: size %d, expected %zu", what, got[t], want);
        ok = 0;
      } else {
        ok &= verify(data[t], want, 100 + t, what);
      }
    }
    if (ok) fprintf(stderr, "PASS grouped receive of 8 with shuffled tags, per-buffer sizes and bytes\n");
  }
  /* Many small messages, window of 8. */
  void* window[WINDOW] = {0};
  int ok = 1;
  for (int i = 0; i < SMALL_COUNT + WINDOW; i++) {
    int w = i % WINDOW;
    if (window[w]) {
      int got = -1;
      if (!wait_req(window[w], &got, "small recv")) return 1;
      int seq = i - WINDOW;
      char what[64];
      snprintf(what, sizeof what, "small message %d", seq);
      if (got != SMALL_SIZE) {
        h_fail("%s: %d bytes", what, got);
        ok = 0;
      } else {
        ok &= verify(buf + (size_t)w * 128, SMALL_SIZE, 1000 + seq, what);
      }
      window[w] = NULL;
    }
    if (i < SMALL_COUNT) {
      void* data[1] = {buf + (size_t)w * 128};
      size_t sizes[1] = {128};
      int tags[1] = {9};
      void* mhs[1] = {mh};
      window[w] = post_recv(recv, 1, data, sizes, tags, mhs, "small");
      if (!window[w]) return 1;
    }
  }
  if (ok) fprintf(stderr, "PASS %d small messages with a window of %d, every byte verified\n", SMALL_COUNT, WINDOW);
  if (v12->dereg_mr(recv, mh) != NCCL_OK) h_fail("receiver deregMr");
  if (v12->close_recv(recv) != NCCL_OK) h_fail("closeRecv");
  free(buf);
  return h_failures != 0;
}

static void* load(const char* path) {
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    h_fail("dlopen %s: %s", path, dlerror());
    return NULL;
  }
  char sym[32];
  snprintf(sym, sizeof sym, "ncclNetPlugin_v%d", version);
  void* table = dlsym(lib, sym);
  if (!table) h_fail("dlsym %s", sym);
  return table;
}

static int init_plugin(void** ctx) {
  comm_config cfg = {.traffic_class = -1};
  nccl_result r;
  if (version >= 11) r = v12->init(ctx, 42, &cfg, h_logger, NULL);
  else if (version == 10) r = v10->init(h_logger, NULL);
  else r = ((net_v9*)v10)->init(h_logger);
  if (r != NCCL_OK) h_fail("init returned %d", r);
  return r == NCCL_OK;
}

static nccl_result do_listen(void* ctx, int dev, void* handle, void** comm) {
  if (version >= 11) return v12->listen(ctx, dev, handle, comm);
  return v10->listen(dev, handle, comm);
}

static nccl_result do_connect(void* ctx, int dev, void* handle, void** comm) {
  if (version >= 11) return v12->connect(ctx, dev, handle, comm, NULL);
  if (version == 10) {
    comm_config cfg = {.traffic_class = -1};
    return v10->connect(dev, &cfg, handle, comm, NULL);
  }
  return ((net_v9*)v10)->connect(dev, handle, comm, NULL);
}

int main(int argc, char** argv) {
  const char* lib = NULL;
  const char* peer = NULL;
  int dev = 0, quick = 0, listen_port = 0;
  const char* fuse_list = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--version") && i + 1 < argc) version = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--dev") && i + 1 < argc) dev = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--fuse") && i + 1 < argc) fuse_list = argv[++i];
    else if (!strcmp(argv[i], "--quick")) quick = 1;
    else if (!strcmp(argv[i], "--small") && i + 1 < argc) small_count = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--listen-port") && i + 1 < argc) listen_port = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--peer") && i + 1 < argc) peer = argv[++i];
    else lib = argv[i];
  }
  if (!lib || version < 9 || version > 12 || (peer && listen_port) || small_count < 1 ||
      (fuse_list && version != 12)) {
    fprintf(stderr,
            "usage: %s LIB [--version 9..12] [--dev D | --fuse A,B,... (v12)] [--quick] [--small N] [--listen-port P | --peer A.B.C.D:P]\n",
            argv[0]);
    return 2;
  }
  alarm(600);
  int cross_host = peer || listen_port;
  /* handle_fd: where the receiver writes its handle, or the sender reads it. */
  int pipefd[2] = {-1, -1};
  pid_t child;
  if (cross_host) {
    child = peer ? 0 : 1;
  } else {
    if (pipe(pipefd)) return 2;
    child = fork();
  }
  h_role = child == 0 ? "sender" : "receiver";
  void* table = load(lib);
  if (!table) return 1;
  v12 = table;
  v10 = table;
  void* ctx = NULL;
  if (!init_plugin(&ctx)) return 1;
  if (fuse_list && (dev = h_fuse(v12, fuse_list)) < 0) return 1;
  char handle[NET_HANDLE_MAXSIZE];
  double start = h_now();
  if (child == 0) {
    int handle_fd = pipefd[0];
    if (cross_host) handle_fd = h_control_dial(peer, 120);
    else close(pipefd[1]);
    if (handle_fd < 0 || !h_control_recv(handle_fd, handle, sizeof handle)) {
      h_fail("reading the handle from the receiver");
      return 1;
    }
    start = h_now();
    void* send = NULL;
    while (!send) {
      nccl_result r = do_connect(ctx, dev, handle, &send);
      if (r != NCCL_OK) {
        h_fail("connect returned %d", r);
        return 1;
      }
      if (h_now() - start > 60) {
        h_fail("connect not established after 60 s");
        return 1;
      }
    }
    fprintf(stderr, "PASS [sender] connected in %.3f s\n", h_now() - start);
    int rc = run_sender(send, quick);
    if (version >= 11 && v12->finalize(ctx) != NCCL_OK) h_fail("finalize");
    if (cross_host) fprintf(stderr, "%s: %d failure(s)\n", h_failures || rc ? "FAILED" : "OK", h_failures);
    return rc || h_failures;
  }
  void* listen_comm = NULL;
  if (do_listen(ctx, dev, handle, &listen_comm) != NCCL_OK || !listen_comm) {
    h_fail("listen");
    if (!cross_host) kill(child, SIGKILL);
    return 1;
  }
  int handle_fd = pipefd[1];
  if (cross_host) handle_fd = h_control_accept(listen_port);
  else close(pipefd[0]);
  if (handle_fd < 0 || !h_control_send(handle_fd, handle, sizeof handle)) return 1;
  start = h_now();
  void* recv = NULL;
  while (!recv) {
    nccl_result r = v12->accept(listen_comm, &recv, NULL);
    if (r != NCCL_OK) {
      h_fail("accept returned %d", r);
      if (!cross_host) kill(child, SIGKILL);
      return 1;
    }
    if (h_now() - start > 60) {
      h_fail("accept not established after 60 s");
      if (!cross_host) kill(child, SIGKILL);
      return 1;
    }
  }
  if (v12->close_listen(listen_comm) != NCCL_OK) h_fail("closeListen");
  fprintf(stderr, "PASS [receiver] accepted in %.3f s\n", h_now() - start);
  int rc = run_receiver(recv, quick);
  if (!cross_host) {
    int status = 0;
    waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) h_fail("the sender process failed (status %d)", status);
  }
  if (version >= 11 && v12->finalize(ctx) != NCCL_OK) h_fail("finalize");
  fprintf(stderr, "%s: %d failure(s)\n", h_failures || rc ? "FAILED" : "OK", h_failures);
  return rc || h_failures ? 1 : 0;
}
