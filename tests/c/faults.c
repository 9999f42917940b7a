/* Failure behaviour of a net plugin, driven through ncclNetPlugin_v12 as NCCL's proxy would:
 * every fault must end in an error code (never a hang, never a crash) within a bound.
 *
 * usage: faults LIB SCENARIO     (run inside the Soft-RoCE VM; port-down and link-delete need root)
 *   kill-sender        the sender is killed (SIGKILL) while the receiver has a receive outstanding
 *   kill-receiver      the receiver is killed while the sender has a send outstanding
 *   hostile            clients send garbage, a wrong magic, an older wire version, a truncated
 *                      frame, or nothing; the real peer still connects and transfers
 *   handshake-timeout  a connect to a listener that never accepts fails after the deadline
 *   bad-regmr          registering unmapped memory fails with an error, not a crash
 *   fork               a child forked after init does not disturb the parent's transfers
 *   port-down          `ip link set eth0 down` mid-run: both sides get errors (link restored after)
 *   link-delete        `rdma link delete rxe0` mid-run: both sides get errors (destroys rxe0: run last)
 *   memlock            (run unprivileged under `ulimit -l 4096`) registering 64 MiB fails with
 *                      ncclSystemError and the `ulimit -l` hint
 *   reload             finalize, dlclose, dlopen, init 100 times: no growth in fds, threads or RSS
 *   cycles[=N]         N (default 1000) connect/transfer/close cycles: stable fds and RSS
 *   port-flap          `ip link set eth0 down`, 2 s, `up` while both sides poll an idle connection:
 *                      no error (PORT_ERR is not fatal), transfers go on byte-exact
 *   close-inflight[=N] N (default 100) times: the receiver posts 32 x 1 MiB receives and closes at
 *                      once; every send of the peer completes, the data arrives intact, and the
 *                      peer's next send fails cleanly ("the peer closed the connection") in bound
 *   host-death (--listen-port P | --peer A.B.C.D:P)
 *                      across two VMs (vm/multi.sh): the --listen-port side is the receiver and the
 *                      victim: after a verified warm-up it grants 8 receives of 64 MiB, then creates
 *                      $FAULTS_MARKER, on which the host SIGKILLs its whole VM (no FIN, no RDMA close)
 *                      while the --peer side, the sender, is writing those 512 MiB. The sender's writes
 *                      go unanswered: it must fail by RDMA retry exhaustion ("transport retry counter
 *                      exceeded") within 2 x the retry time (4.096 us x 2^NCCL_IB_TIMEOUT x
 *                      (NCCL_IB_RETRY_CNT+1)) + 5 s of the kill (it sees the marker appear on the
 *                      shared directory); later calls fail too.
 *   port-failover      as port-cut, with NCCL_IB_RESILIENCY_PORT_FAILOVER=1: 8 B - 4 MiB messages,
 *                      4 in flight; the stream goes on byte-exact, the longest wait printed
 *                      (FAULTS_MESSAGES, FAULTS_CUT_AT). Also across devices: RIVET_FABRIC_DEVICES=2
 *                      (rfab0 and rfab1, one port each), FAULTS_FUSE=0,1, FAULTS_CUT_PORT="rfab0 1"
 *   port-failover-both as port-failover, and port 2 of rfab0 cut too later: both sides fail in bound
 *   port-cut           the user-space verbs fabric only (RIVET_FABRIC_PORTS=2, FAULTS_FUSE=0,1,
 *                      RIVET_FABRIC_CTL): port 1 of the fused device cut in both processes after 20
 *                      verified messages; without port failover both sides fail within
 *                      2 x the retry time + 5 s. The fabric's port cut (port-cut, port-failover):
 *                      FAULTS_CUT_PORT="<device> <port>" (default "rfab0 1"); FAULTS_CUT_SIDES=receiver
 *                      cuts it in the receiver's process only (default: both obey the control file)
 *   link-cut (--listen-port P | --peer A.B.C.D:P)
 *                      the receiver takes its link NIC ($FAULTS_CUT_IF) down after 20 verified 1 MiB
 *                      messages: it fails at once (rxe flushes its queue pair); the sender, waiting for
 *                      a clear-to-send with nothing in flight, must fail within 2 x the retry time +
 *                      30 s (the handshake socket's TCP keepalive).
 *   link-failover (--listen-port P | --peer A.B.C.D:P)
 *                      across two VMs on a fused device (FAULTS_FUSE) with
 *                      NCCL_IB_RESILIENCY_PORT_FAILOVER=1 at both ends: port-failover's stream, and
 *                      the receiver takes $FAULTS_CUT_IF down after FAULTS_CUT_AT verified messages;
 *                      the stream goes on to the end byte-exact, no call failing, the longest wait for
 *                      one completion printed as the recovery time. The link stays down (the caller
 *                      brings it back).
 * Each prints PASS/FAIL lines with the time the error took; exit status 0 only if all passed. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include "harness.h"

#define BOUND_S 45.0 /* documented bound: RDMA retry (~35 s at NCCL_IB_TIMEOUT=20) plus slack */
#define MSG (1 << 20)

struct pair {
  void* ctx;
  void* comm; /* this process's send or receive comm */
  void* mh;
  unsigned char* buf;
  pid_t child;   /* in the parent: the child's pid; 0 in the child */
  int to_peer;   /* byte pipe to the other process */
  int from_peer; /* byte pipe from the other process */
};

static void signal_peer(int fd) {
  char c = 1;
  if (write(fd, &c, 1) != 1) h_fail("pipe write");
}

static void wait_peer(int fd) {
  char c;
  if (read(fd, &c, 1) != 1) h_fail("pipe read (peer gone?)");
}

/* Listen, hand the handle out on `handle_out` and accept (receiver), or take it from `handle_in`
 * and connect (sender); then register the transfer buffer. The handle travels over a pipe between
 * two processes of one host, over a TCP control connection between hosts. */
static int connect_pair(struct pair* p, int receiver, int handle_out, int handle_in) {
  char handle[NET_HANDLE_MAXSIZE];
  if (receiver) {
    void* listen_comm = NULL;
    if (h_net->listen(p->ctx, h_dev, handle, &listen_comm) != NCCL_OK) return 0;
    if (!h_control_send(handle_out, handle, sizeof handle)) return 0;
    if (h_accept(listen_comm, &p->comm, 60) != NCCL_OK || !p->comm) {
      h_fail("accept");
      return 0;
    }
    h_net->close_listen(listen_comm);
  } else {
    if (!h_control_recv(handle_in, handle, sizeof handle)) return 0;
    if (h_connect(p->ctx, handle, &p->comm, 60) != NCCL_OK || !p->comm) {
      h_fail("connect");
      return 0;
    }
  }
  p->buf = malloc(MSG);
  if (!p->buf || h_net->reg_mr(p->comm, p->buf, MSG, PTR_HOST, &p->mh) != NCCL_OK) {
    h_fail("regMr");
    return 0;
  }
  return 1;
}

/* Fork into a connected pair. The parent is the receiver when parent_receives, else the sender. */
/* Load and init the plugin; with FAULTS_FUSE=A,B connect over the device makeVDevice fuses from
 * them (port-cut, and link-cut on a fused device). 0 on failure. */
static int init_on_env_device(const char* lib, struct pair* p) {
  p->ctx = h_load_and_init(lib);
  if (!p->ctx) return 0;
  const char* fuse = getenv("FAULTS_FUSE");
  return !fuse || (h_dev = h_fuse(h_net, fuse)) >= 0;
}

static int make_pair(const char* lib, int parent_receives, struct pair* p) {
  int handle_pipe[2], down[2], up[2];
  if (pipe(handle_pipe) || pipe(down) || pipe(up)) return 0;
  p->child = fork();
  int is_parent = p->child != 0;
  int receiver = is_parent == parent_receives;
  h_role = receiver ? "receiver" : "sender";
  p->to_peer = is_parent ? down[1] : up[1];
  p->from_peer = is_parent ? up[0] : down[0];
  /* FAULTS_CUT_SIDES=receiver: only the receiver obeys the fabric's control file, so a port it
   * cuts fails in its process alone and the sender meets the cut from its end of the link (as
   * when one host's link goes down). Set before the plugin loads the fabric, which reads it then. */
  const char* sides = getenv("FAULTS_CUT_SIDES");
  if (!receiver && sides && !strcmp(sides, "receiver")) unsetenv("RIVET_FABRIC_CTL");
  if (!init_on_env_device(lib, p)) return 0;
  return connect_pair(p, receiver, handle_pipe[1], handle_pipe[0]);
}

static void* post_send(struct pair* p, size_t n, unsigned seed, double limit) {
  h_fill(p->buf, n, seed);
  void* req = NULL;
  double start = h_now();
  while (!req && h_now() - start < limit) {
    if (h_net->isend(p->comm, p->buf, n, 1, p->mh, NULL, &req) != NCCL_OK) return NULL;
  }
  return req;
}

static void* post_recv(struct pair* p, size_t n) {
  void* data[1] = {p->buf};
  size_t sizes[1] = {n};
  int tags[1] = {1};
  void* mhs[1] = {p->mh};
  void* req = NULL;
  if (h_net->irecv(p->comm, 1, data, sizes, tags, mhs, NULL, &req) != NCCL_OK) return NULL;
  return req;
}

/* A few verified transfers, so the pair is known to work before the fault. */
static int warm_up(struct pair* p, int receiver, int count) {
  for (int i = 0; i < count; i++) {
    void* req = receiver ? post_recv(p, MSG) : post_send(p, MSG, 50 + i, 30);
    int done, size = -1;
    double t;
    if (!req || h_wait(req, &done, &size, 30, &t) != NCCL_OK || !done) {
      h_fail("warm-up transfer %d", i);
      return 0;
    }
    if (receiver && (size != MSG || !h_verify(p->buf, MSG, 50 + i))) {
      h_fail("warm-up transfer %d corrupted", i);
      return 0;
    }
  }
  return 1;
}

/* End a pair: the sender (the child) exits with its verdict; the receiver waits for it. */
static int end_pair(struct pair* p, int receiver) {
  if (!receiver) _exit(h_failures ? 1 : 0);
  int status;
  waitpid(p->child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status)) h_fail("the sender failed (see its lines)");
  return 0;
}

/* Wait until `req` (or, if NULL, repeated isends) fails; pass if it does within BOUND_S. */
static void expect_error(struct pair* p, void* req, const char* what) {
  int done = 0, size;
  double elapsed;
  nccl_result r;
  if (req) {
    r = h_wait(req, &done, &size, BOUND_S + 15, &elapsed);
  } else {
    double start = h_now();
    void* out = NULL;
    r = NCCL_OK;
    while (r == NCCL_OK && !out && h_now() - start < BOUND_S + 15) r = h_net->isend(p->comm, p->buf, 8, 1, p->mh, NULL, &out);
    elapsed = h_now() - start;
    done = out != NULL;
  }
  if (r != NCCL_OK && elapsed <= BOUND_S)
    h_pass("%s: error %d after %.2f s: %s", what, r, elapsed, h_last_warn);
  else if (r != NCCL_OK)
    h_fail("%s: error %d only after %.2f s (bound %.0f s)", what, r, elapsed, BOUND_S);
  else
    h_fail("%s: no error after %.2f s (done=%d)", what, elapsed, done);
  /* Sticky: a later call on the same comm fails too, at once. */
  void* again = NULL;
  int done2 = 0;
  nccl_result later = req ? h_net->test(req, &done2, &size) : h_net->isend(p->comm, p->buf, 8, 1, p->mh, NULL, &again);
  if (later != NCCL_OK) h_pass("%s: later calls fail too (%d)", what, later);
  else h_fail("%s: a later call succeeded", what);
}

static int scenario_kill(const char* lib, int kill_sender) {
  struct pair p;
  /* The survivor is the parent: the receiver when the sender is killed, and vice versa. */
  if (!make_pair(lib, kill_sender, &p)) return 1;
  int receiver = strcmp(h_role, "receiver") == 0;
  if (!warm_up(&p, receiver, 3)) return 1;
  if (p.child == 0) {
    if (receiver) post_recv(&p, MSG); /* a receive outstanding when this process dies */
    signal_peer(p.to_peer);
    pause();
    _exit(0);
  }
  wait_peer(p.from_peer);
  void* req = receiver ? post_recv(&p, MSG) : NULL;
  if (receiver && !req) {
    h_fail("irecv before the kill");
    return 1;
  }
  kill(p.child, SIGKILL);
  waitpid(p.child, NULL, 0);
  if (!receiver) {
    /* The dead receiver's clear-to-send is here: the send is posted, then must fail. */
    void* out = NULL;
    double start = h_now();
    while (!out && h_now() - start < 5) {
      if (h_net->isend(p.comm, p.buf, MSG, 1, p.mh, NULL, &out) != NCCL_OK) break;
    }
    req = out;
  }
  expect_error(&p, req, kill_sender ? "receiver after the sender was killed" : "sender after the receiver was killed");
  if (receiver) h_net->close_recv(p.comm);
  else h_net->close_send(p.comm);
  return 0;
}

/* The listen address from our handle: family @23 (4/6), IPv4 @24, port (LE) @40. */
static int dial(const char* handle) {
  struct sockaddr_in sin = {.sin_family = AF_INET};
  if (handle[23] != 4) return -1;
  memcpy(&sin.sin_addr, handle + 24, 4);
  sin.sin_port = htons((unsigned short)((unsigned char)handle[40] | (unsigned char)handle[41] << 8));
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, (struct sockaddr*)&sin, sizeof sin) != 0) return -1;
  return fd;
}

static int scenario_hostile(const char* lib) {
  /* Fork before loading anything: a process must not use verbs objects its parent created. */
  int hp[2];
  if (pipe(hp)) return 1;
  pid_t child = fork();
  if (child == 0) {
    h_role = "sender";
    char h[NET_HANDLE_MAXSIZE];
    if (read(hp[0], h, sizeof h) != (ssize_t)sizeof h) _exit(1);
    void* cctx = h_load_and_init(lib);
    void* send = NULL;
    if (!cctx || h_connect(cctx, h, &send, 30) != NCCL_OK || !send) _exit(1);
    unsigned char* buf = malloc(4096);
    void* mh = NULL;
    if (h_net->reg_mr(send, buf, 4096, PTR_HOST, &mh) != NCCL_OK) _exit(1);
    h_fill(buf, 4096, 77);
    void* req = NULL;
    while (!req)
      if (h_net->isend(send, buf, 4096, 1, mh, NULL, &req) != NCCL_OK) _exit(1);
    int done, size;
    double t;
    if (h_wait(req, &done, &size, 30, &t) != NCCL_OK || !done) _exit(1);
    _exit(0);
  }
  h_role = "receiver";
  void* ctx = h_load_and_init(lib);
  if (!ctx) return 1;
  char handle[NET_HANDLE_MAXSIZE];
  void* listen_comm = NULL;
  if (h_net->listen(ctx, 0, handle, &listen_comm) != NCCL_OK) return 1;
  /* Hostile clients first: each gets its own handshake machine, none may block the others. */
  static const char garbage[64] = "this is not a rivet handshake frame, just bytes on a socket....";
  static const unsigned char wrong_magic[12] = {'X', 'X', 'X', 'X', 1, 0, 1, 0, 108, 0, 0, 0};
  static const unsigned char old_version[12] = {'R', 'V', 'T', 'F', 0, 0, 1, 0, 108, 0, 0, 0};
  static const unsigned char truncated[6] = {'R', 'V', 'T', 'F', 1, 0};
  struct { const void* bytes; size_t len; int keep_open; } clients[] = {
      {garbage, sizeof garbage, 0}, {wrong_magic, sizeof wrong_magic, 0}, {old_version, sizeof old_version, 1},
      {truncated, sizeof truncated, 0}, {NULL, 0, 1} /* silent */};
  int fds[5];
  for (int i = 0; i < 5; i++) {
    fds[i] = dial(handle);
    if (fds[i] < 0) {
      h_fail("hostile client %d could not connect", i);
      return 1;
    }
    if (clients[i].len && write(fds[i], clients[i].bytes, clients[i].len) != (ssize_t)clients[i].len) h_fail("write");
    if (!clients[i].keep_open) close(fds[i]);
  }
  void* dummy = NULL;
  for (int i = 0; i < 50; i++) h_net->accept(listen_comm, &dummy, NULL); /* let it see them */
  if (dummy) h_fail("accept produced a comm from a hostile client");
  /* Now the real peer. */
  if (write(hp[1], handle, sizeof handle) != (ssize_t)sizeof handle) return 1;
  void* recv = NULL;
  double start = h_now();
  if (h_accept(listen_comm, &recv, 60) != NCCL_OK || !recv) {
    h_fail("the real peer could not connect past the hostile clients");
    kill(child, SIGKILL);
    return 1;
  }
  h_pass("the real peer connected after %d hostile clients (%.2f s), %d WARN line(s) about them", 5,
         h_now() - start, h_warns);
  if (h_warns < 3) h_fail("expected one WARN per refused client, got %d", h_warns);
  unsigned char* buf = malloc(8192);
  void* mh = NULL;
  if (h_net->reg_mr(recv, buf, 8192, PTR_HOST, &mh) != NCCL_OK) return 1;
  void* data[1] = {buf};
  size_t sizes[1] = {8192};
  int tags[1] = {1};
  void* mhs[1] = {mh};
  void* req = NULL;
  while (!req) if (h_net->irecv(recv, 1, data, sizes, tags, mhs, NULL, &req) != NCCL_OK) return 1;
  int done, size = -1;
  double t;
  if (h_wait(req, &done, &size, 30, &t) == NCCL_OK && done && size == 4096 && h_verify(buf, 4096, 77))
    h_pass("a transfer after the hostile clients arrived intact");
  else
    h_fail("transfer after hostile clients");
  int status;
  waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status)) h_fail("sender failed");
  for (int i = 0; i < 5; i++) if (clients[i].keep_open) close(fds[i]);
  h_net->close_listen(listen_comm);
  return 0;
}

static int scenario_handshake_timeout(const char* lib) {
  /* Needs RIVET_HANDSHAKE_TIMEOUT_MS (the lane sets 1500). The listen comm never accepts. */
  h_role = "connector";
  void* ctx = h_load_and_init(lib);
  if (!ctx) return 1;
  char handle[NET_HANDLE_MAXSIZE];
  void* listen_comm = NULL;
  if (h_net->listen(ctx, 0, handle, &listen_comm) != NCCL_OK) return 1;
  void* send = NULL;
  double start = h_now();
  nccl_result r = h_connect(ctx, handle, &send, 20);
  double t = h_now() - start;
  if (r != NCCL_OK && !send && t < 10) h_pass("connect to a listener that never accepts failed after %.2f s: %s", t, h_last_warn);
  else h_fail("connect without accept: result %d after %.2f s", r, t);
  h_net->close_listen(listen_comm);
  return 0;
}

static int scenario_bad_regmr(const char* lib) {
  h_role = "loopback";
  void* ctx = h_load_and_init(lib);
  if (!ctx) return 1;
  /* listen -> connect -> accept to itself from one thread (NCCL's loopback probe). */
  void *send = NULL, *recv = NULL;
  if (!h_self_connect(ctx, &send, &recv, 30)) {
    h_fail("self connection from one thread");
    return 1;
  }
  h_pass("listen/connect/accept to itself from one thread");
  size_t len = 1 << 20;
  void* hole = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  void* mh = NULL;
  h_warns = 0;
  nccl_result r = h_net->reg_mr(send, hole, len, PTR_HOST, &mh);
  if (r == NCCL_SYSTEM_ERROR && h_warns == 1 && strstr(h_last_warn, "regMr"))
    h_pass("regMr of inaccessible memory: ncclSystemError: %s", h_last_warn);
  else
    h_fail("regMr of inaccessible memory: result %d, %d warn(s): %s", r, h_warns, h_last_warn);
  munmap(hole, len);
  r = h_net->reg_mr(send, hole, len, PTR_HOST, &mh);
  if (r != NCCL_OK) h_pass("regMr of unmapped memory: error %d", r);
  else h_fail("regMr of unmapped memory succeeded");
  h_net->close_send(send);
  h_net->close_recv(recv);
  return 0;
}

static int scenario_memlock(const char* lib) {
  h_role = "memlock";
  void* ctx = h_load_and_init(lib);
  if (!ctx) return 1;
  /* Out of lockable memory while setting up a connection (its control regions are registered):
   * connect/accept must fail with an error, not abort, and a later connection must still work. */
  struct rlimit saved, tiny;
  if (getrlimit(RLIMIT_MEMLOCK, &saved) == 0) {
    tiny = saved;
    tiny.rlim_cur = 16 * 1024;
    if (setrlimit(RLIMIT_MEMLOCK, &tiny) == 0) {
      void *s0 = NULL, *r0 = NULL;
      h_warns = 0;
      int connected = h_self_connect(ctx, &s0, &r0, 10);
      if (!connected && h_warns > 0)
        h_pass("connection set-up without lockable memory fails with an error: %s", h_last_warn);
      else
        h_fail("connection set-up without lockable memory: connected=%d, %d warn(s)", connected, h_warns);
      if (s0) h_net->close_send(s0);
      if (r0) h_net->close_recv(r0);
      setrlimit(RLIMIT_MEMLOCK, &saved);
    }
  }
  void *send = NULL, *recv = NULL;
  if (!h_self_connect(ctx, &send, &recv, 30)) {
    h_fail("self connection under the memlock limit: %s", h_last_warn);
    return 1;
  }
  size_t len = (size_t)64 << 20;
  unsigned char* big = malloc(len);
  memset(big, 1, len);
  void* mh = NULL;
  h_warns = 0;
  nccl_result r = h_net->reg_mr(send, big, len, PTR_HOST, &mh);
  if (r == NCCL_SYSTEM_ERROR && strstr(h_last_warn, "ulimit -l"))
    h_pass("regMr over the memlock limit: ncclSystemError with the hint: %s", h_last_warn);
  else
    h_fail("regMr over the memlock limit: result %d: %s", r, h_last_warn);
  h_net->close_send(send);
  h_net->close_recv(recv);
  return 0;
}

static int scenario_fork(const char* lib) {
  struct pair p;
  if (!make_pair(lib, 1, &p)) return 1;
  int receiver = strcmp(h_role, "receiver") == 0;
  if (!warm_up(&p, receiver, 2)) return 1;
  if (receiver) {
    /* A child forked after init and registration, as PyTorch DataLoader workers are. */
    pid_t worker = fork();
    if (worker == 0) {
      unsigned char* scratch = malloc(1 << 20);
      memset(scratch, 0x5a, 1 << 20);
      _exit(0);
    }
    int status;
    waitpid(worker, &status, 0);
  }
  if (warm_up(&p, receiver, 4)) h_pass("transfers after a fork() in the receiver still arrive intact");
  return end_pair(&p, receiver);
}

/* Break the fabric under a working pair; both processes keep transferring and must get an error
 * within the bound. */
static int scenario_fabric(const char* lib, const char* breaker, const char* repair, int removal) {
  struct pair p;
  if (!make_pair(lib, 1, &p)) return 1;
  int receiver = strcmp(h_role, "receiver") == 0;
  if (!warm_up(&p, receiver, 2)) return 1;
  if (receiver) {
    /* In the background: device removal may wait for this very process to let go of rxe0. */
    char cmd[256];
    snprintf(cmd, sizeof cmd, "(%s) >/dev/null 2>&1 &", breaker);
    if (system(cmd) != 0) h_fail("%s", breaker);
    signal_peer(p.to_peer);
  } else {
    wait_peer(p.from_peer);
  }
  double start = h_now();
  nccl_result r = NCCL_OK;
  int transfers = 0;
  while (r == NCCL_OK && h_now() - start < (removal ? 20 : BOUND_S + 15)) {
    void* req = NULL;
    double t0 = h_now();
    while (r == NCCL_OK && !req && h_now() - t0 < 5) {
      if (receiver) {
        void* data[1] = {p.buf};
        size_t sizes[1] = {MSG};
        int tags[1] = {1};
        void* mhs[1] = {p.mh};
        r = h_net->irecv(p.comm, 1, data, sizes, tags, mhs, NULL, &req);
      } else {
        r = h_net->isend(p.comm, p.buf, MSG, 1, p.mh, NULL, &req);
      }
    }
    int done = 0, size;
    while (r == NCCL_OK && req && !done && h_now() - t0 < 10) r = h_net->test(req, &done, &size);
    transfers += done;
  }
  double elapsed = h_now() - start;
  if (removal && r == NCCL_OK && transfers > 0) {
    /* Soft-RoCE defers `rdma link delete` until no process uses the device: the device keeps
     * working meanwhile. No hang, no error is the right outcome; the removal must then complete
     * once the plugin lets go of the device (checked below). */
    h_pass("%s: removal deferred by the kernel while in use; %d transfers kept completing for %.0f s", breaker,
           transfers, elapsed);
    if (receiver) h_net->close_recv(p.comm);
    else h_net->close_send(p.comm);
    if (h_net->finalize(p.ctx) != NCCL_OK) h_fail("finalize");
    if (!receiver) _exit(h_failures ? 1 : 0);
    int status;
    waitpid(p.child, &status, 0);
    double t0 = h_now();
    while (system("rdma link show rxe0 >/dev/null 2>&1") == 0 && h_now() - t0 < 20) usleep(100000);
    if (system("rdma link show rxe0 >/dev/null 2>&1") != 0)
      h_pass("%s completed %.2f s after Rivet released the device", breaker, h_now() - t0);
    else
      h_fail("%s still pending 20 s after Rivet released the device", breaker);
    return 0;
  }
  if (r != NCCL_OK && elapsed <= BOUND_S)
    h_pass("%s: error %d after %.2f s (%d transfers completed meanwhile): %s", breaker, r, elapsed, transfers, h_last_warn);
  else
    h_fail("%s: result %d after %.2f s (%d transfers completed)", breaker, r, elapsed, transfers);
  if (!receiver) _exit(h_failures ? 1 : 0);
  /* After its error the receiver closes the comm, as NCCL does when it aborts the communicator: a
   * sender with nothing in flight (waiting for a clear-to-send the failed queue pair never sends)
   * learns it from the socket. Which side's queue pair fails first depends on which one transmits
   * first while the link is down; the sender exits at once after its own error. */
  h_net->close_recv(p.comm);
  int status;
  waitpid(p.child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status)) h_fail("the sender did not get its error in time");
  if (repair && system(repair) != 0) h_fail("%s", repair);
  return 0;
}

/* A connection that is idle while the link flaps must survive: the receiver has a receive
 * outstanding (its clear-to-send long delivered) and tests it; the sender calls isend with a tag
 * nothing matches, so both sides read the port's asynchronous events during the flap. */
static int scenario_port_flap(const char* lib) {
  struct pair p;
  if (!make_pair(lib, 1, &p)) return 1;
  int receiver = strcmp(h_role, "receiver") == 0;
  if (!warm_up(&p, receiver, 2)) return 1;
  void* req = NULL;
  if (receiver) {
    req = post_recv(&p, MSG);
    if (!req) {
      h_fail("irecv before the flap");
      return 1;
    }
    usleep(200000); /* the clear-to-send write completes before the link goes */
    if (system("ip link set eth0 down") != 0) h_fail("ip link set eth0 down");
    signal_peer(p.to_peer);
  } else {
    wait_peer(p.from_peer);
  }
  /* 2 s down (far below the ~34 s retry budget), polled all along. */
  double start = h_now();
  int warns_before = h_warns, done = 0, size = 0;
  nccl_result r = NCCL_OK;
  while (r == NCCL_OK && h_now() - start < 2.0) {
    if (receiver) {
      r = h_net->test(req, &done, &size);
      if (done) break;
    } else {
      void* none = NULL;
      r = h_net->isend(p.comm, p.buf, 8, 2 /* unmatched tag */, p.mh, NULL, &none);
      if (none) {
        h_fail("an isend with an unmatched tag was accepted");
        break;
      }
    }
  }
  if (receiver) {
    if (system("ip link set eth0 up") != 0) h_fail("ip link set eth0 up");
    signal_peer(p.to_peer);
  } else {
    wait_peer(p.from_peer);
  }
  if (r != NCCL_OK || done)
    h_fail("during the flap: result %d, done %d: %s", r, done, h_last_warn);
  else
    h_pass("2 s link flap polled without an error (%d WARN line(s): %s)", h_warns - warns_before,
           h_warns > warns_before ? h_last_warn : "none");
  /* After the flap: the outstanding receive completes, then more transfers, byte-exact. */
  if (receiver) {
    double t;
    if (h_wait(req, &done, &size, 30, &t) != NCCL_OK || !done || size != MSG || !h_verify(p.buf, MSG, 90))
      h_fail("the receive posted before the flap: done %d size %d: %s", done, size, h_last_warn);
  } else {
    void* s = post_send(&p, MSG, 90, 30);
    double t;
    if (!s || h_wait(s, &done, &size, 30, &t) != NCCL_OK || !done) h_fail("the send after the flap: %s", h_last_warn);
  }
  if (warm_up(&p, receiver, 4)) h_pass("transfers after the flap arrive intact");
  return end_pair(&p, receiver);
}

#define INFLIGHT 32
/* Word-wise patterns: 32 MiB per iteration filled and checked byte by byte costs seconds under TCG. */
static void fill_words(unsigned char* p, size_t n, unsigned seed) {
  uint64_t* w = (uint64_t*)p;
  for (size_t j = 0; j < n / 8; j++) w[j] = ((uint64_t)seed << 40) ^ (j * 0x9E3779B97F4A7C15ull);
}
static int words_intact(const unsigned char* p, size_t n, unsigned seed) {
  const uint64_t* w = (const uint64_t*)p;
  for (size_t j = 0; j < n / 8; j++)
    if (w[j] != (((uint64_t)seed << 40) ^ (j * 0x9E3779B97F4A7C15ull))) return 0;
  return 1;
}
/* closeRecv right after posting 32 x 1 MiB receives (no test), N times, each on a new connection.
 * The sender must see every send complete (no error on the part the receiver posted), the data
 * must be in the receiver's buffers when closeRecv returns, and the sender's next send must fail
 * with "the peer closed the connection" within a bound (no hang). The big buffers are registered
 * once per process through a long-lived loopback comm on the same device (as NCCL's IB transport,
 * Rivet registers memory with the device's protection domain), so 100 connections do not pin
 * 3 GiB. */
static int scenario_close_inflight(const char* lib, int iterations) {
  int handle_pipe[2], done_pipe[2];
  if (pipe(handle_pipe) || pipe(done_pipe)) return 1;
  pid_t child = fork();
  int receiver = child != 0;
  h_role = receiver ? "receiver" : "sender";
  void* ctx = h_load_and_init(lib);
  if (!ctx) return 1;
  void *anchor_send = NULL, *anchor_recv = NULL, *mh = NULL;
  size_t total = (size_t)INFLIGHT * MSG;
  unsigned char* buf = malloc(total);
  if (!buf || !h_self_connect(ctx, &anchor_send, &anchor_recv, 30) ||
      h_net->reg_mr(receiver ? anchor_recv : anchor_send, buf, total, PTR_HOST, &mh) != NCCL_OK) {
    h_fail("set-up: %s", h_last_warn);
    return 1;
  }
  int send_errors = 0, hangs = 0, corrupt = 0, clean = 0;
  double worst_close = 0, worst_next = 0;
  for (int it = 0; it < iterations && h_failures == 0; it++) {
    char handle[NET_HANDLE_MAXSIZE];
    void* comm = NULL;
    if (receiver) {
      void* listen_comm = NULL;
      if (h_net->listen(ctx, 0, handle, &listen_comm) != NCCL_OK ||
          write(handle_pipe[1], handle, sizeof handle) != (ssize_t)sizeof handle ||
          h_accept(listen_comm, &comm, 30) != NCCL_OK || !comm) {
        h_fail("iteration %d: accept: %s", it, h_last_warn);
        break;
      }
      h_net->close_listen(listen_comm);
      memset(buf, 0, total);
      for (int i = 0; i < INFLIGHT; i++) {
        void* data[1] = {buf + (size_t)i * MSG};
        size_t sizes[1] = {MSG};
        int tags[1] = {1};
        void* mhs[1] = {mh};
        void* req = NULL;
        if (h_net->irecv(comm, 1, data, sizes, tags, mhs, NULL, &req) != NCCL_OK || !req) {
          h_fail("iteration %d: irecv %d: %s", it, i, h_last_warn);
          break;
        }
      }
      double t0 = h_now();
      if (h_net->close_recv(comm) != NCCL_OK) h_fail("iteration %d: closeRecv", it);
      double took = h_now() - t0;
      if (took > worst_close) worst_close = took;
      for (int i = 0; i < INFLIGHT; i++)
        if (!words_intact(buf + (size_t)i * MSG, MSG, (unsigned)(it * INFLIGHT + i))) {
          corrupt++;
          h_fail("iteration %d: receive %d is not intact after closeRecv returned", it, i);
          break;
        }
      char c;
      if (read(done_pipe[0], &c, 1) != 1) {
        h_fail("iteration %d: the sender died", it);
        break;
      }
      if (c != 'k') {
        h_fail("iteration %d: the sender reported a failure", it);
        break;
      }
    } else {
      for (int i = 0; i < INFLIGHT; i++) fill_words(buf + (size_t)i * MSG, MSG, (unsigned)(it * INFLIGHT + i));
      if (read(handle_pipe[0], handle, sizeof handle) != (ssize_t)sizeof handle ||
          h_connect(ctx, handle, &comm, 30) != NCCL_OK || !comm) {
        h_fail("iteration %d: connect: %s", it, h_last_warn);
        _exit(1);
      }
      void* reqs[INFLIGHT] = {0};
      for (int i = 0; i < INFLIGHT; i++) {
        unsigned char* m = buf + (size_t)i * MSG;
        double t0 = h_now();
        nccl_result r = NCCL_OK;
        while (r == NCCL_OK && !reqs[i] && h_now() - t0 < 10) r = h_net->isend(comm, m, MSG, 1, mh, NULL, &reqs[i]);
        if (r != NCCL_OK) {
          send_errors++;
          h_fail("iteration %d: isend %d failed (%d): %s", it, i, r, h_last_warn);
          break;
        }
        if (!reqs[i]) {
          hangs++;
          h_fail("iteration %d: the grant for send %d never came", it, i);
          break;
        }
      }
      for (int i = 0; i < INFLIGHT && reqs[i]; i++) {
        int done = 0, size = 0;
        double t;
        nccl_result r = h_wait(reqs[i], &done, &size, 10, &t);
        if (r != NCCL_OK) {
          send_errors++;
          h_fail("iteration %d: send %d of a posted receive failed (%d): %s", it, i, r, h_last_warn);
          break;
        }
        if (!done) {
          hangs++;
          h_fail("iteration %d: send %d never completed", it, i);
          break;
        }
      }
      /* The receiver closed: the next send must fail, in bound, naming the close. An 8-byte send
       * from host memory may go eager (it needs no receive): isend then hands out its request and
       * the failure comes from its test, as NCCL's contract allows. */
      double t0 = h_now();
      void* extra = NULL;
      nccl_result r = NCCL_OK;
      while (r == NCCL_OK && !extra && h_now() - t0 < 10) r = h_net->isend(comm, buf, 8, 1, mh, NULL, &extra);
      int eager = 0;
      if (r == NCCL_OK && extra) {
        int done = 0, size = 0;
        double waited;
        eager = 1;
        r = h_wait(extra, &done, &size, 10, &waited);
        if (r == NCCL_OK) h_fail("iteration %d: the eager send after the peer's close %s", it,
                                 done ? "completed" : "neither completed nor failed");
      }
      double took = h_now() - t0;
      if (took > worst_next) worst_next = took;
      /* An eager write can reach the NIC before the socket shows the close: its failure then names
       * the peer that stopped answering (the fabric fails a write to a closed queue pair at once). */
      if (r != NCCL_OK && (strstr(h_last_warn, "the peer closed the connection") ||
                           (eager && strstr(h_last_warn, "the peer stopped answering"))))
        clean++;
      else
        h_fail("iteration %d: the send after the peer's close: result %d after %.2f s: %s", it, r, took, h_last_warn);
      h_net->close_send(comm);
      char c = h_failures ? 'f' : 'k';
      if (write(done_pipe[1], &c, 1) != 1) _exit(1);
    }
  }
  if (!receiver) {
    if (h_failures == 0)
      h_pass("%d x 32 x 1 MiB sends to a receiver that closed at once: all completed, 0 errors, 0 hangs; "
             "the next send failed cleanly every time (at most %.2f s): %s", iterations, worst_next, h_last_warn);
    else
      h_fail("%d send error(s), %d hang(s)", send_errors, hangs);
    _exit(h_failures ? 1 : 0);
  }
  int status;
  waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status)) h_fail("the sender failed (see its lines)");
  else if (h_failures == 0)
    h_pass("%d x closeRecv right after 32 x 1 MiB irecv: every receive intact when closeRecv returned "
           "(closeRecv took at most %.2f s)", iterations, worst_close);
  (void)clean;
  (void)corrupt;
  h_net->dereg_mr(anchor_recv, mh);
  h_net->close_send(anchor_send);
  h_net->close_recv(anchor_recv);
  return 0;
}

static int count_dir(const char* path) {
  DIR* d = opendir(path);
  int n = 0;
  struct dirent* e;
  if (!d) return -1;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

static long rss_kib(void) {
  FILE* f = fopen("/proc/self/status", "r");
  char line[256];
  long kib = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld kB", &kib) == 1) break;
  if (f) fclose(f);
  return kib;
}

struct usage {
  int fds, threads;
  long rss;
};

static struct usage usage_now(void) {
  struct usage u = {count_dir("/proc/self/fd"), count_dir("/proc/self/task"), rss_kib()};
  return u;
}

/* After a warm-up, resources must not grow with the number of iterations. */
static void check_stable(const char* what, struct usage early, struct usage late, int iterations) {
  long grown = late.rss - early.rss;
  /* Under valgrind RSS is valgrind's own; FAULTS_SKIP_RSS=1 leaves the leak verdict to memcheck. */
  int check_rss = !getenv("FAULTS_SKIP_RSS");
  if (late.fds == early.fds && late.threads == early.threads && (!check_rss || grown < 4096))
    h_pass("%s: %d iterations, fds %d -> %d, threads %d -> %d, RSS %ld -> %ld KiB", what, iterations, early.fds,
           late.fds, early.threads, late.threads, early.rss, late.rss);
  else
    h_fail("%s: growth after %d iterations: fds %d -> %d, threads %d -> %d, RSS %ld -> %ld KiB", what, iterations,
           early.fds, late.fds, early.threads, late.threads, early.rss, late.rss);
}

static int scenario_reload(const char* lib) {
  h_role = "reload";
  struct usage early = {0}, start = usage_now();
  for (int i = 1; i <= 100; i++) {
    void* handle_lib = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!handle_lib) {
      h_fail("dlopen %d: %s", i, dlerror());
      return 1;
    }
    h_net = dlsym(handle_lib, "ncclNetPlugin_v12");
    void* ctx = NULL;
    comm_config cfg = {.traffic_class = -1};
    int ndev = 0;
    char handle[NET_HANDLE_MAXSIZE];
    void* listen_comm = NULL;
    if (!h_net || h_net->init(&ctx, (uint64_t)i, &cfg, h_logger, NULL) != NCCL_OK || h_net->devices(&ndev) != NCCL_OK ||
        ndev < 1 || h_net->listen(ctx, 0, handle, &listen_comm) != NCCL_OK ||
        h_net->close_listen(listen_comm) != NCCL_OK || h_net->finalize(ctx) != NCCL_OK) {
      h_fail("cycle %d of init/listen/finalize", i);
      return 1;
    }
    if (dlclose(handle_lib) != 0) h_fail("dlclose %d", i);
    if (i == 10) early = usage_now();
  }
  h_pass("100 x dlopen/init/listen/finalize/dlclose (before: %d fds, %d threads)", start.fds, start.threads);
  check_stable("reload", early, usage_now(), 90);
  return 0;
}

static int scenario_cycles(const char* lib, int count) {
  h_role = "cycles";
  void* ctx = h_load_and_init(lib);
  if (!ctx) return 1;
  /* Initialised: the NIC's writes into rbuf are invisible to valgrind, which would otherwise call
   * the received bytes uninitialised. */
  unsigned char* sbuf = calloc(1, 4096);
  unsigned char* rbuf = calloc(1, 4096);
  struct usage early = {0};
  double start = h_now();
  for (int i = 1; i <= count; i++) {
    void *send = NULL, *recv = NULL, *smh = NULL, *rmh = NULL;
    if (!h_self_connect(ctx, &send, &recv, 30) || h_net->reg_mr(send, sbuf, 4096, PTR_HOST, &smh) != NCCL_OK ||
        h_net->reg_mr(recv, rbuf, 4096, PTR_HOST, &rmh) != NCCL_OK) {
      h_fail("cycle %d: connect or regMr", i);
      return 1;
    }
    h_fill(sbuf, 4096, (unsigned)i);
    void* data[1] = {rbuf};
    size_t sizes[1] = {4096};
    int tags[1] = {0};
    void* mhs[1] = {rmh};
    void *rreq = NULL, *sreq = NULL;
    if (h_net->irecv(recv, 1, data, sizes, tags, mhs, NULL, &rreq) != NCCL_OK || !rreq) return 1;
    while (!sreq)
      if (h_net->isend(send, sbuf, 4096, 0, smh, NULL, &sreq) != NCCL_OK) return 1;
    int sdone = 0, rdone = 0, size = 0;
    while (!sdone || !rdone) {
      if (!sdone && h_net->test(sreq, &sdone, &size) != NCCL_OK) return 1;
      if (!rdone && h_net->test(rreq, &rdone, &size) != NCCL_OK) return 1;
    }
    if (!h_verify(rbuf, 4096, (unsigned)i)) {
      h_fail("cycle %d: data", i);
      return 1;
    }
    if (h_net->dereg_mr(send, smh) != NCCL_OK || h_net->dereg_mr(recv, rmh) != NCCL_OK ||
        h_net->close_send(send) != NCCL_OK || h_net->close_recv(recv) != NCCL_OK) {
      h_fail("cycle %d: teardown", i);
      return 1;
    }
    if (i == 100 || (count < 100 && i == 1)) early = usage_now();
  }
  h_pass("%d connect/transfer/close cycles in %.1f s", count, h_now() - start);
  check_stable("cycles", early, usage_now(), count);
  free(sbuf);
  free(rbuf);
  return h_net->finalize(ctx) == NCCL_OK ? 0 : 1;
}

/* The documented bound for a silent peer (see the usage text) from the RDMA settings in force. */
static double silent_peer_bound(void) {
  const char* t = getenv("NCCL_IB_TIMEOUT");
  const char* c = getenv("NCCL_IB_RETRY_CNT");
  int timeout = t ? atoi(t) : 20, retries = c ? atoi(c) : 7;
  return 2 * 4.096e-6 * (double)(1L << timeout) * (retries + 1) + 30;
}

/* Cross-host pair: the receiver (listen_port != 0) hands its handle over a TCP control connection. */
static int make_cross_pair(const char* lib, const char* peer, int listen_port, struct pair* p) {
  memset(p, 0, sizeof *p);
  int receiver = listen_port != 0;
  h_role = receiver ? "receiver" : "sender";
  if (!init_on_env_device(lib, p)) return 0;
  int fd = receiver ? h_control_accept(listen_port) : h_control_dial(peer, 120);
  if (fd < 0) return 0;
  p->to_peer = p->from_peer = fd;
  return connect_pair(p, receiver, fd, fd);
}

/* One transfer on the pair, posted and waited for until it completes, fails, or `limit` passes. */
static nccl_result transfer_once(struct pair* p, int receiver, double limit, int* done) {
  nccl_result r = NCCL_OK;
  void* req = NULL;
  int size;
  double t0 = h_now();
  *done = 0;
  while (r == NCCL_OK && !req && h_now() - t0 < limit) {
    if (receiver) {
      void* data[1] = {p->buf};
      size_t sizes[1] = {MSG};
      int tags[1] = {1};
      void* mhs[1] = {p->mh};
      r = h_net->irecv(p->comm, 1, data, sizes, tags, mhs, NULL, &req);
    } else {
      r = h_net->isend(p->comm, p->buf, MSG, 1, p->mh, NULL, &req);
    }
  }
  while (r == NCCL_OK && req && !*done && h_now() - t0 < limit) r = h_net->test(req, done, &size);
  return r;
}

/* The RDMA retry time at the settings in force: 4.096 us x 2^NCCL_IB_TIMEOUT x (NCCL_IB_RETRY_CNT+1). */
static double rdma_retry_s(void) {
  const char* t = getenv("NCCL_IB_TIMEOUT");
  const char* c = getenv("NCCL_IB_RETRY_CNT");
  int timeout = t ? atoi(t) : 20, retries = c ? atoi(c) : 7;
  return 4.096e-6 * (double)(1L << timeout) * (retries + 1);
}

#define BIG (64 << 20)
#define AHEAD 8

/* host-death across two VMs: the victim (receiver) grants AHEAD receives of 64 MiB after the warm-up
 * and creates $FAULTS_MARKER; the host SIGKILLs its VM within ~50 ms, while the survivor (sender)
 * is writing those 512 MiB. The survivor's RDMA writes go unanswered, so its queue pair must fail by
 * retry exhaustion ("transport retry counter exceeded") within 2 x the retry time + 5 s of the
 * kill (the survivor sees the marker appear on the shared directory: that is the kill's time to
 * ~0.1 s), and later calls fail at once. */
static int scenario_host_death(const char* lib, const char* peer, int listen_port) {
  struct pair p;
  if (!make_cross_pair(lib, peer, listen_port, &p)) return 1;
  int receiver = listen_port != 0;
  if (!warm_up(&p, receiver, 3)) return 1;
  const char* marker = getenv("FAULTS_MARKER");
  if (!marker) {
    h_fail("FAULTS_MARKER is not set");
    return 1;
  }
  unsigned char* big = malloc(BIG);
  void* big_mh = NULL;
  if (!big || h_net->reg_mr(p.comm, big, BIG, PTR_HOST, &big_mh) != NCCL_OK) {
    h_fail("regMr of the 64 MiB buffer");
    return 1;
  }
  memset(big, 0x5a, BIG);
  if (receiver) {
    for (int i = 0; i < AHEAD; i++) {
      void* req = NULL;
      void* data[1] = {big};
      size_t sizes[1] = {BIG};
      int tags[1] = {1};
      void* mhs[1] = {big_mh};
      while (!req)
        if (h_net->irecv(p.comm, 1, data, sizes, tags, mhs, NULL, &req) != NCCL_OK) {
          h_fail("irecv %d of 64 MiB", i);
          return 1;
        }
    }
    usleep(300000); /* the clear-to-sends reach the sender; 512 MiB take it seconds to write */
    int fd = open(marker, O_CREAT | O_WRONLY, 0644);
    if (fd < 0) {
      h_fail("cannot create FAULTS_MARKER (%s)", marker);
      return 1;
    }
    close(fd);
    fprintf(stderr, "[receiver] marker created, %d x 64 MiB granted; waiting to be killed\n", AHEAD);
    sleep(120);
    h_fail("the victim was never killed");
    return 1;
  }
  double retry = rdma_retry_s(), bound = 2 * retry + 5;
  double start = h_now(), killed_at = 0, limit = bound + 60;
  int sent = 0;
  nccl_result r = NCCL_OK;
  while (r == NCCL_OK && h_now() - start < limit && (killed_at == 0 || h_now() - killed_at < limit)) {
    void* req = NULL;
    while (r == NCCL_OK && !req && h_now() - start < limit) {
      r = h_net->isend(p.comm, big, BIG, 1, big_mh, NULL, &req);
      if (killed_at == 0 && access(marker, F_OK) == 0) killed_at = h_now();
    }
    int done = 0, size;
    while (r == NCCL_OK && req && !done && h_now() - start < limit) {
      r = h_net->test(req, &done, &size);
      if (killed_at == 0 && access(marker, F_OK) == 0) killed_at = h_now();
    }
    if (done) sent++;
  }
  if (killed_at == 0) {
    h_fail("peer host death: the marker never appeared (result %d, %d sends completed)", r, sent);
    return 1;
  }
  double elapsed = h_now() - killed_at;
  int retry_path = strstr(h_last_warn, "retry counter exceeded") != NULL;
  if (r != NCCL_OK && elapsed <= bound && retry_path)
    h_pass("peer host death: error %d %.2f s after the kill, by RDMA retry exhaustion (retry time %.2f s, bound "
           "%.1f s at NCCL_IB_TIMEOUT=%s, NCCL_IB_RETRY_CNT=%s; %d x 64 MiB completed before): %s",
           r, elapsed, retry, bound, getenv("NCCL_IB_TIMEOUT") ?: "20", getenv("NCCL_IB_RETRY_CNT") ?: "7", sent,
           h_last_warn);
  else if (r != NCCL_OK)
    h_fail("peer host death: error %d %.2f s after the kill (bound %.1f s), %s: %s", r, elapsed, bound,
           retry_path ? "by retry exhaustion" : "not by RDMA retry exhaustion", h_last_warn);
  else
    h_fail("peer host death: no error %.2f s after the kill", elapsed);
  double t0 = h_now();
  void* again = NULL;
  nccl_result later = h_net->isend(p.comm, big, 8, 1, big_mh, NULL, &again);
  if (later != NCCL_OK) h_pass("peer host death: a later call fails too (%d) after %.2f s", later, h_now() - t0);
  else h_fail("peer host death: a later call did not fail");
  h_net->close_send(p.comm);
  if (h_net->finalize(p.ctx) != NCCL_OK) h_fail("finalize");
  return 0;
}

/* Transfer verified 1 MiB messages until the connection fails; after the 20th the receiver calls
 * `cut` (which reports what it did). The failure must come within `bound` of the last completed
 * transfer, named `what` in the lines, and a later call must fail too. */
static void stream_until_cut(struct pair* p, int receiver, double bound, const char* what, void (*cut)(int count)) {
  int count = 0, done = 0;
  nccl_result r = NCCL_OK;
  double last = h_now();
  while (r == NCCL_OK && h_now() - last < bound + 15) {
    r = transfer_once(p, receiver, bound + 15 - (h_now() - last), &done);
    if (!done) continue;
    last = h_now();
    if (receiver && ++count == 20) cut(count);
  }
  double elapsed = h_now() - last;
  if (r != NCCL_OK && elapsed <= bound)
    h_pass("%s: error %d %.2f s after the last completed transfer (bound %.1f s at NCCL_IB_TIMEOUT=%s, "
           "NCCL_IB_RETRY_CNT=%s): %s",
           what, r, elapsed, bound, getenv("NCCL_IB_TIMEOUT") ?: "20", getenv("NCCL_IB_RETRY_CNT") ?: "7",
           h_last_warn);
  else if (r != NCCL_OK)
    h_fail("%s: error %d only %.2f s after the last completed transfer (bound %.1f s)", what, r, elapsed, bound);
  else
    h_fail("%s: no error %.2f s after the last completed transfer", what, elapsed);
  /* Sticky: the next call on the comm fails at once. */
  double t0 = h_now();
  done = 0;
  nccl_result later = transfer_once(p, receiver, 5, &done);
  if (later != NCCL_OK) h_pass("%s: a later call fails too (%d) after %.2f s", what, later, h_now() - t0);
  else h_fail("%s: a later call did not fail (done=%d)", what, done);
}

/* link-cut's cut: the link NIC ($FAULTS_CUT_IF, default eth1) down. */
static void cut_link(int count) {
  char cmd[128];
  const char* nic = getenv("FAULTS_CUT_IF");
  snprintf(cmd, sizeof cmd, "ip link set %s down", nic ? nic : "eth1");
  if (system(cmd) != 0) h_fail("%s", cmd);
  else h_pass("%s mid-stream, after %d verified messages", cmd, count);
}

/* link-cut across two VMs (see the usage text): the receiver takes its link NIC down mid-stream. */
static int scenario_link_cut(const char* lib, const char* peer, int listen_port) {
  struct pair p;
  if (!make_cross_pair(lib, peer, listen_port, &p)) return 1;
  int receiver = listen_port != 0;
  if (!warm_up(&p, receiver, 3)) return 1;
  stream_until_cut(&p, receiver, silent_peer_bound(), "link cut", cut_link);
  if (receiver) h_net->close_recv(p.comm);
  else h_net->close_send(p.comm);
  if (h_net->finalize(p.ctx) != NCCL_OK) h_fail("finalize");
  return 0;
}

/* Fail `port` ("<device> <port>", e.g. "rfab0 1") through the fabric's control file
 * ($RIVET_FABRIC_CTL): every process whose environment names the file obeys it. The fabric takes
 * a control-file line within 50 ms: wait for it, so the cut lands while messages remain (a
 * stream that ends first would never meet it). */
static void fail_port(const char* port, int count) {
  const char* ctl = getenv("RIVET_FABRIC_CTL");
  FILE* f = fopen(ctl, "a");
  if (!f || fprintf(f, "fail-port %s\n", port) < 0 || fclose(f) != 0) h_fail("writing %s", ctl);
  else h_pass("port %s of the fused device cut mid-stream, after %d verified messages", port, count);
  usleep(120000);
}

/* The fabric port that port-cut and port-failover cut: $FAULTS_CUT_PORT ("<device> <port>"),
 * by default port 1 of rfab0, the first member of a device fused from rfab0's two ports
 * (RIVET_FABRIC_PORTS=2) or from rfab0 and rfab1 (RIVET_FABRIC_DEVICES=2). */
static const char* cut_port_name(void) {
  const char* port = getenv("FAULTS_CUT_PORT");
  return port && *port ? port : "rfab0 1";
}

static void cut_port(int count) { fail_port(cut_port_name(), count); }

/* port-failover-both's second cut: port 2 of rfab0 too. */
static void cut_port_2(int count) { fail_port("rfab0 2", count); }

/* port-cut, over the user-space verbs fabric only (RIVET_FABRIC_PORTS=2, FAULTS_FUSE=0,1, and
 * RIVET_FABRIC_CTL naming one control file both processes watch): both connect over the device
 * fused from their two ports, and after 20 verified 1 MiB messages the receiver appends
 * "fail-port rfab0 1" (FAULTS_CUT_PORT) to the control file, so port 1 fails in both processes,
 * as a cable cut between them. Without port failover the connection must fail on both sides
 * within 2 x the retry time + 5 s of the last completed transfer, and later calls fail at once. */
static int scenario_port_cut(const char* lib) {
  if (!getenv("RIVET_FABRIC_CTL") || !getenv("FAULTS_FUSE")) {
    h_fail("port-cut needs RIVET_FABRIC_CTL and FAULTS_FUSE");
    return 1;
  }
  struct pair p;
  if (!make_pair(lib, 1, &p)) return 1;
  int receiver = strcmp(h_role, "receiver") == 0;
  if (!warm_up(&p, receiver, 3)) return 1;
  stream_until_cut(&p, receiver, 2 * rdma_retry_s() + 5, "port cut (no failover)", cut_port);
  /* Closed on the error, as NCCL does: a side with nothing in flight when the port went (a sender
   * waiting for a clear-to-send, a receiver waiting for data) learns it from the peer's socket. */
  if (receiver) h_net->close_recv(p.comm);
  else h_net->close_send(p.comm);
  return end_pair(&p, receiver);
}

/* The failover stream's message sizes, in turn: 8 B to 4 MiB. */
static const size_t FAILOVER_SIZES[] = {8, 4 << 20, 4096, (1 << 20) + 3, 65536, 300000};
#define FAILOVER_WINDOW 4
#define FAILOVER_SLOT (4 << 20)
/* Every FAILOVER_GROUP_EVERY-th message of the stream is a grouped receive of FAILOVER_GROUP
 * buffers (tags 1..FAILOVER_GROUP, a third of the slot each), filled by as many sends. */
#define FAILOVER_GROUP 3
#define FAILOVER_GROUP_EVERY 5

/* Message `m` of the failover stream of `n` bytes: its buffers (1, or FAILOVER_GROUP for a
 * grouped receive), each one's offset in the slot and size. */
static int failover_parts(int m, size_t n, size_t off[FAILOVER_GROUP], size_t len[FAILOVER_GROUP]) {
  if (m % FAILOVER_GROUP_EVERY != FAILOVER_GROUP_EVERY - 1) {
    off[0] = 0;
    len[0] = n;
    return 1;
  }
  if (n > (size_t)3 << 20) n = (size_t)3 << 20; /* each part within its third of the slot */
  for (int i = 0; i < FAILOVER_GROUP; i++) {
    off[i] = (size_t)i * (FAILOVER_SLOT / FAILOVER_GROUP);
    len[i] = i < FAILOVER_GROUP - 1 ? n / FAILOVER_GROUP : n - (FAILOVER_GROUP - 1) * (n / FAILOVER_GROUP);
  }
  return FAILOVER_GROUP;
}

/* The stream of port-failover and link-failover, on a connected pair after its warm-up:
 * FAULTS_MESSAGES (default 100) messages of 8 B to 4 MiB, FAILOVER_WINDOW in flight (as NCCL
 * keeps several steps posted), and after FAULTS_CUT_AT (default 20) verified ones the receiver
 * calls `cut` (named `cut_what` in the lines). The stream must go on: every message must arrive
 * byte-exact (each carries its own pattern; the receiver poisons each buffer before posting it)
 * and in order, with its size, and no call may fail; the longest wait for one completion (the
 * recovery) is reported. With `cut_again`, the receiver calls it FAULTS_CUT_AT messages later,
 * leaving no port: then both sides must fail with an error within 2 x the retry time + 5 s of the
 * last completed message. `what` names the scenario in the lines. 1 if the stream ended as it
 * must. */
static int failover_stream(struct pair* p, int receiver, const char* what, const char* cut_what, void (*cut)(int count),
                           void (*cut_again)(int count)) {
  int both = cut_again != NULL;
  const char* m = getenv("FAULTS_MESSAGES");
  const char* c = getenv("FAULTS_CUT_AT");
  int total = m ? atoi(m) : 100, cut_at = c ? atoi(c) : 20;
  if (both && total < 2 * cut_at + 10) total = 2 * cut_at + 10;
  unsigned char* slots = malloc((size_t)FAILOVER_WINDOW * FAILOVER_SLOT);
  void* mh = NULL;
  if (!slots || h_net->reg_mr(p->comm, slots, (size_t)FAILOVER_WINDOW * FAILOVER_SLOT, PTR_HOST, &mh) != NCCL_OK) {
    h_fail("%s: registering %d x 4 MiB", what, FAILOVER_WINDOW);
    return 0;
  }
  /* Per slot, its message's requests: one receive, or one send per buffer of the receive. */
  void* reqs[FAILOVER_WINDOW][FAILOVER_GROUP] = {{0}};
  int nreqs[FAILOVER_WINDOW] = {0}, sends_posted = 0;
  int posted = 0, completed = 0;
  double worst = 0, t_start = h_now(), last = h_now();
  double bound = 2 * rdma_retry_s() + 5;
  nccl_result r = NCCL_OK;
  while (r == NCCL_OK && completed < total) {
    /* Post up to the window (a group's sends one by one: a send refused for now is tried again). */
    while (r == NCCL_OK && posted < total && posted - completed < FAILOVER_WINDOW) {
      int k = posted % FAILOVER_WINDOW;
      unsigned char* buf = slots + (size_t)k * FAILOVER_SLOT;
      size_t off[FAILOVER_GROUP], len[FAILOVER_GROUP];
      int parts =
          failover_parts(posted, FAILOVER_SIZES[posted % (sizeof FAILOVER_SIZES / sizeof FAILOVER_SIZES[0])], off, len);
      void* req = NULL;
      if (receiver) {
        void* data[FAILOVER_GROUP];
        size_t sizes[FAILOVER_GROUP];
        int tags[FAILOVER_GROUP];
        void* mhs[FAILOVER_GROUP];
        for (int i = 0; i < parts; i++) {
          memset(buf + off[i], 0xEE, len[i]);
          data[i] = buf + off[i];
          sizes[i] = parts == 1 ? FAILOVER_SLOT : FAILOVER_SLOT / FAILOVER_GROUP;
          tags[i] = 1 + i;
          mhs[i] = mh;
        }
        r = h_net->irecv(p->comm, parts, data, sizes, tags, mhs, NULL, &req);
        if (r != NCCL_OK || !req) break;
        reqs[k][0] = req;
        nreqs[k] = 1;
      } else {
        int i = sends_posted;
        if (i == 0)
          for (int j = 0; j < parts; j++) h_fill(buf + off[j], len[j], 2000 + posted * FAILOVER_GROUP + j);
        r = h_net->isend(p->comm, buf + off[i], len[i], 1 + i, mh, NULL, &req);
        if (r != NCCL_OK || !req) break;
        reqs[k][i] = req;
        if (++sends_posted < parts) continue;
        nreqs[k] = parts;
        sends_posted = 0;
      }
      posted++;
    }
    if (r != NCCL_OK) break;
    /* Test the oldest message's requests, in order. */
    int k = completed % FAILOVER_WINDOW, done = 0, sizes[FAILOVER_GROUP] = {-1, -1, -1};
    if (!nreqs[k]) continue;
    int left = 0;
    while (left < nreqs[k] && !reqs[k][left]) left++;
    r = h_net->test(reqs[k][left], &done, sizes);
    if (r != NCCL_OK) break;
    if (!done) {
      if (h_now() - last > (both ? bound + 15 : 60)) break;
      continue;
    }
    reqs[k][left] = NULL;
    if (left + 1 < nreqs[k]) continue;
    nreqs[k] = 0;
    size_t off[FAILOVER_GROUP], len[FAILOVER_GROUP];
    int parts = failover_parts(completed, FAILOVER_SIZES[completed % (sizeof FAILOVER_SIZES / sizeof FAILOVER_SIZES[0])],
                               off, len);
    for (int i = 0; receiver && i < parts; i++) {
      if ((size_t)sizes[i] == len[i] &&
          h_verify(slots + (size_t)k * FAILOVER_SLOT + off[i], len[i], 2000 + completed * FAILOVER_GROUP + i))
        continue;
      h_fail("%s: message %d of %d, buffer %d of %d (%zu B) arrived %s", what, completed, total, i, parts, len[i],
             (size_t)sizes[i] != len[i] ? "with the wrong size" : "with the wrong bytes");
      r = NCCL_INTERNAL_ERROR;
      break;
    }
    if (r != NCCL_OK) break;
    if (h_now() - last > worst) worst = h_now() - last;
    last = h_now();
    completed++;
    if (receiver && completed == cut_at) cut(completed);
    if (receiver && both && completed == 2 * cut_at) cut_again(completed);
  }
  int ok = 0;
  if (both) {
    double elapsed = h_now() - last;
    ok = r != NCCL_OK && elapsed <= bound && completed >= 2 * cut_at;
    if (ok)
      h_pass("%s, both ports cut: error %d %.2f s after the last completed message (%d of them, "
             "byte-exact; bound %.1f s): %s",
             what, r, elapsed, completed, bound, h_last_warn);
    else if (r != NCCL_OK)
      h_fail("%s, both ports cut: error %d after %.2f s, %d messages completed (bound %.1f s)", what, r, elapsed,
             completed, bound);
    else
      h_fail("%s, both ports cut: no error %.2f s after the last completed message", what, elapsed);
  } else if ((ok = completed == total))
    h_pass("%s: %d messages of 8 B to 4 MiB (every %dth a grouped receive of %d), %d in flight, byte-exact and in "
           "order across the cut of %s after %d, "
           "no call failed; recovery: longest wait %.2f s, all %.2f s (NCCL_IB_TIMEOUT=%s, NCCL_IB_RETRY_CNT=%s, "
           "NCCL_IB_QPS_PER_CONNECTION=%s)",
           what, total, FAILOVER_GROUP_EVERY, FAILOVER_GROUP, FAILOVER_WINDOW, cut_what, cut_at, worst, h_now() - t_start,
           getenv("NCCL_IB_TIMEOUT") ?: "20", getenv("NCCL_IB_RETRY_CNT") ?: "7",
           getenv("NCCL_IB_QPS_PER_CONNECTION") ?: "1");
  else
    h_fail("%s: %d of %d messages, then %s (result %d): %s", what, completed, total,
           r != NCCL_OK ? "an error" : "nothing for 60 s", r, h_last_warn);
  /* What the plugin published for `rivet info --stats` (RIVET_STATS_DIR), read before finalize
   * removes it. */
  const char* stats_dir = getenv("RIVET_STATS_DIR");
  if (stats_dir && !both && ok) {
    char path[512], text[512] = {0};
    snprintf(path, sizeof path, "%s/rivet-stats.%d", stats_dir, (int)getpid());
    FILE* f = fopen(path, "r");
    size_t got = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f) fclose(f);
    unsigned long lanes = 0;
    const char* at = got ? strstr(text, "lanes_failed_over ") : NULL;
    if (at) lanes = strtoul(at + strlen("lanes_failed_over "), NULL, 10);
    if (lanes >= 1) h_pass("%s: published for rivet info --stats: %lu lane(s) failed over", what, lanes);
    else h_fail("%s: nothing published in %s", what, path);
  }
  /* With both ports cut the connection failed: its memory stays registered until it is closed. */
  if (!both) {
    h_net->dereg_mr(p->comm, mh);
    free(slots);
  }
  return ok;
}

/* port-failover, over the user-space verbs fabric only (as port-cut, with
 * NCCL_IB_RESILIENCY_PORT_FAILOVER=1 in both processes): the failover stream (failover_stream),
 * the receiver cutting FAULTS_CUT_PORT (default "rfab0 1") through the control file; the stream
 * goes on over the fused device's other member. With `both`, port 2 of rfab0 is cut too
 * FAULTS_CUT_AT messages later: both sides must fail in bound (failover exhausted, no port left). */
static int scenario_port_failover(const char* lib, int both) {
  if (!getenv("RIVET_FABRIC_CTL") || !getenv("FAULTS_FUSE")) {
    h_fail("port-failover needs RIVET_FABRIC_CTL and FAULTS_FUSE");
    return 1;
  }
  struct pair p;
  if (!make_pair(lib, 1, &p)) return 1;
  int receiver = strcmp(h_role, "receiver") == 0;
  if (!warm_up(&p, receiver, 3)) return 1;
  char cut_what[96];
  snprintf(cut_what, sizeof cut_what, "port %s", cut_port_name());
  failover_stream(&p, receiver, "port failover", cut_what, cut_port, both ? cut_port_2 : NULL);
  if (both) {
    /* Closed on the error, as NCCL does. */
    if (receiver) h_net->close_recv(p.comm);
    else h_net->close_send(p.comm);
  }
  return end_pair(&p, receiver);
}

/* link-failover across two VMs (see the usage text): link-cut's cut under port-failover's stream,
 * on a fused device (FAULTS_FUSE) with NCCL_IB_RESILIENCY_PORT_FAILOVER=1 at both ends: the
 * receiver takes $FAULTS_CUT_IF down after FAULTS_CUT_AT verified messages, and the stream must
 * go on over the other member's link to the end, byte-exact, no call failing; the longest wait
 * for one completion is the recovery time. The link stays down: the rig brings it back. */
static int scenario_link_failover(const char* lib, const char* peer, int listen_port) {
  if (!getenv("FAULTS_FUSE")) {
    h_fail("link-failover needs FAULTS_FUSE (a fused device)");
    return 1;
  }
  /* The end's handshake below writes to a peer that may have gone after a failure. */
  signal(SIGPIPE, SIG_IGN);
  struct pair p;
  if (!make_cross_pair(lib, peer, listen_port, &p)) return 1;
  int receiver = listen_port != 0;
  if (!warm_up(&p, receiver, 3)) return 1;
  const char* nic = getenv("FAULTS_CUT_IF");
  char cut_what[96];
  if (receiver) snprintf(cut_what, sizeof cut_what, "link %s", nic ? nic : "eth1");
  else snprintf(cut_what, sizeof cut_what, "the receiver's link");
  if (failover_stream(&p, receiver, "link failover", cut_what, cut_link, NULL)) {
    /* The receiver closes only once the sender saw its last send complete. */
    if (receiver) wait_peer(p.from_peer);
    else signal_peer(p.to_peer);
  }
  if (receiver) h_net->close_recv(p.comm);
  else h_net->close_send(p.comm);
  if (h_net->finalize(p.ctx) != NCCL_OK) h_fail("finalize");
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 5 && (!strcmp(argv[2], "host-death") || !strcmp(argv[2], "link-cut") ||
                    !strcmp(argv[2], "link-failover"))) {
    alarm(600);
    int rc;
    int listen = !strcmp(argv[3], "--listen-port");
    const char* peer = listen ? NULL : argv[4];
    int port = listen ? atoi(argv[4]) : 0;
    if (!listen && strcmp(argv[3], "--peer")) rc = 2;
    else if (!strcmp(argv[2], "link-cut")) rc = scenario_link_cut(argv[1], peer, port);
    else if (!strcmp(argv[2], "link-failover")) rc = scenario_link_failover(argv[1], peer, port);
    else rc = scenario_host_death(argv[1], peer, port);
    if (rc == 2) fprintf(stderr, "usage: %s LIB %s --listen-port P | --peer A.B.C.D:P\n", argv[0], argv[2]);
    return rc || h_failures ? (rc == 2 ? 2 : 1) : 0;
  }
  if (argc != 3) {
    fprintf(stderr, "usage: %s LIB SCENARIO\n", argv[0]);
    return 2;
  }
  alarm(1500);
  const char* lib = argv[1];
  const char* s = argv[2];
  int rc;
  if (!strcmp(s, "kill-sender")) rc = scenario_kill(lib, 1);
  else if (!strcmp(s, "kill-receiver")) rc = scenario_kill(lib, 0);
  else if (!strcmp(s, "hostile")) rc = scenario_hostile(lib);
  else if (!strcmp(s, "handshake-timeout")) rc = scenario_handshake_timeout(lib);
  else if (!strcmp(s, "bad-regmr")) rc = scenario_bad_regmr(lib);
  else if (!strcmp(s, "fork")) rc = scenario_fork(lib);
  else if (!strcmp(s, "memlock")) rc = scenario_memlock(lib);
  else if (!strcmp(s, "port-down"))
    rc = scenario_fabric(lib, "ip link set eth0 down", "ip link set eth0 up && sleep 2", 0);
  else if (!strcmp(s, "link-delete")) rc = scenario_fabric(lib, "rdma link delete rxe0", NULL, 1);
  else if (!strcmp(s, "port-flap")) rc = scenario_port_flap(lib);
  else if (!strncmp(s, "close-inflight", 14)) rc = scenario_close_inflight(lib, s[14] == '=' ? atoi(s + 15) : 100);
  else if (!strcmp(s, "reload")) rc = scenario_reload(lib);
  else if (!strncmp(s, "cycles", 6)) rc = scenario_cycles(lib, s[6] == '=' ? atoi(s + 7) : 1000);
  else if (!strcmp(s, "port-cut")) rc = scenario_port_cut(lib);
  else if (!strcmp(s, "port-failover")) rc = scenario_port_failover(lib, 0);
  else if (!strcmp(s, "port-failover-both")) rc = scenario_port_failover(lib, 1);
  else {
    fprintf(stderr, "unknown scenario %s\n", s);
    return 2;
  }
  return rc || h_failures ? 1 : 0;
}
