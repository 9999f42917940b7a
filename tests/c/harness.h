/* Shared pieces of the C programs that drive a net plugin through ncclNetPlugin_v12 as NCCL's
 * proxy does: loading, logging, connection set-up, posting and waiting with deadlines. */
#ifndef RIVET_HARNESS_H
#define RIVET_HARNESS_H
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "nccl_net_abi.h"

static const char* h_role = "?";
/* The device h_connect and the programs' listens use (0, or a fused device from h_fuse). */
static int h_dev = 0;
static int h_failures;
static net_v12* h_net;
static char h_last_warn[1024];
static int h_warns;

static inline double h_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* One line to stderr in one write(2): ranks and roles of one test share the stream, and a line
 * built from several stdio calls can be cut in two by another process's line. */
static inline void h_vline(const char* prefix, const char* fmt, va_list ap) {
  char line[1200];
  int n = snprintf(line, sizeof line, "%s", prefix);
  if (n < 0) return;
  if ((size_t)n < sizeof line) {
    int m = vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    if (m > 0) n += m;
  }
  if ((size_t)n >= sizeof line - 1) n = (int)sizeof line - 2;
  line[n++] = '\n';
  ssize_t w = write(2, line, (size_t)n);
  (void)w;
}

static inline void h_line(const char* prefix, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  h_vline(prefix, fmt, ap);
  va_end(ap);
}

static inline void h_fail(const char* fmt, ...) {
  char prefix[96];
  snprintf(prefix, sizeof prefix, "FAIL [%s] ", h_role);
  va_list ap;
  va_start(ap, fmt);
  h_vline(prefix, fmt, ap);
  va_end(ap);
  h_failures++;
}

static inline void h_pass(const char* fmt, ...) {
  char prefix[96];
  snprintf(prefix, sizeof prefix, "PASS [%s] ", h_role);
  va_list ap;
  va_start(ap, fmt);
  h_vline(prefix, fmt, ap);
  va_end(ap);
}

/* NCCL's logger: WARN lines are printed and remembered; INFO only with HARNESS_VERBOSE. */
static inline void h_logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags; (void)file; (void)line;
  char text[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  if (level == LOG_WARN) {
    h_warns++;
    snprintf(h_last_warn, sizeof h_last_warn, "%s", text);
  }
  if (level == LOG_WARN || getenv("HARNESS_VERBOSE")) h_line("", "[%s] plugin: %s", h_role, text);
}

static inline unsigned char h_pattern(unsigned seed, size_t i) { return (unsigned char)(seed * 131u + i * 7u + (i >> 12)); }
static inline void h_fill(unsigned char* p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) p[i] = h_pattern(seed, i);
}
static inline int h_verify(const unsigned char* p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != h_pattern(seed, i)) return 0;
  return 1;
}

/* dlopen the plugin and init it through v12; returns the context or NULL. */
static inline void* h_load_and_init(const char* path) {
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    h_fail("dlopen %s: %s", path, dlerror());
    return NULL;
  }
  h_net = dlsym(lib, "ncclNetPlugin_v12");
  if (!h_net) {
    h_fail("dlsym ncclNetPlugin_v12");
    return NULL;
  }
  void* ctx = NULL;
  comm_config cfg = {.traffic_class = -1};
  nccl_result r = h_net->init(&ctx, 7, &cfg, h_logger, NULL);
  if (r != NCCL_OK) {
    h_fail("init returned %d", r);
    return NULL;
  }
  return ctx;
}

/* makeVDevice (through the v12 table `net`) over the comma-separated device list `list`, as NCCL
 * 2.24+ fuses NICs; checks getProperties lists the members; the new device, or -1 (a FAIL line). */
static inline int h_fuse(net_v12* net, const char* list) {
  vdevice_props_v12 props = {0};
  for (const char* p = list; *p && props.ndevs < 8;) {
    props.devs[props.ndevs++] = atoi(p);
    const char* comma = strchr(p, ',');
    if (!comma) break;
    p = comma + 1;
  }
  int dev = -1;
  nccl_result r = net->make_vdevice ? net->make_vdevice(&dev, &props) : NCCL_INTERNAL_ERROR;
  if (r != NCCL_OK) {
    h_fail("makeVDevice of %s returned %d: %s", list, r, h_last_warn);
    return -1;
  }
  props_v12 got;
  memset(&got, 0, sizeof got);
  if (net->get_properties(dev, &got) != NCCL_OK || got.vprops.ndevs != props.ndevs) {
    h_fail("getProperties of fused device %d does not list its %d members", dev, props.ndevs);
    return -1;
  }
  h_pass("fused devices %s into device %d (%s, %d Mb/s)", list, dev, got.name, got.speed);
  return dev;
}

/* Poll connect until it yields a comm, fails, or `limit` seconds pass; returns the result code
 * (NCCL_OK with *comm == NULL means the time ran out). */
static inline nccl_result h_connect(void* ctx, void* handle, void** comm, double limit) {
  double start = h_now();
  *comm = NULL;
  while (!*comm && h_now() - start < limit) {
    nccl_result r = h_net->connect(ctx, h_dev, handle, comm, NULL);
    if (r != NCCL_OK) return r;
  }
  return NCCL_OK;
}

static inline nccl_result h_accept(void* listen_comm, void** comm, double limit) {
  double start = h_now();
  *comm = NULL;
  while (!*comm && h_now() - start < limit) {
    nccl_result r = h_net->accept(listen_comm, comm, NULL);
    if (r != NCCL_OK) return r;
  }
  return NCCL_OK;
}

/* listen -> connect -> accept to itself from one thread, as NCCL's loopback probe does; the
 * listen comm is closed once accepted. Returns 1 when both comms exist within `limit` seconds. */
static inline int h_self_connect(void* ctx, void** send, void** recv, double limit) {
  char handle[NET_HANDLE_MAXSIZE];
  void* listen_comm = NULL;
  *send = *recv = NULL;
  if (h_net->listen(ctx, h_dev, handle, &listen_comm) != NCCL_OK) return 0;
  double start = h_now();
  while ((!*send || !*recv) && h_now() - start < limit) {
    if (!*send && h_net->connect(ctx, h_dev, handle, send, NULL) != NCCL_OK) break;
    if (!*recv && h_net->accept(listen_comm, recv, NULL) != NCCL_OK) break;
  }
  h_net->close_listen(listen_comm);
  return *send && *recv;
}

/* Spin on test until done, an error, or `limit` seconds; returns the result code and sets
 * *elapsed. A timeout returns NCCL_OK with *done == 0. */
static inline nccl_result h_wait(void* req, int* done, int* sizes, double limit, double* elapsed) {
  double start = h_now();
  *done = 0;
  nccl_result r = NCCL_OK;
  while (!*done && h_now() - start < limit) {
    r = h_net->test(req, done, sizes);
    if (r != NCCL_OK) break;
  }
  *elapsed = h_now() - start;
  return r;
}

/* Cross-host rendezvous (two VMs): the 128-byte handle travels over a TCP control connection on
 * the link network, where a socketpair or pipe carries it between two processes of one host.
 * h_control_accept: listen on PORT (any address), accept one connection, return its fd.
 * h_control_dial: connect to "A.B.C.D:PORT", retrying while the peer is not listening yet (it may
 * still be booting), up to `limit` seconds. Both return -1 (with a FAIL line) on failure. */
static inline int h_control_accept(int port) {
  int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
  if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
      bind(fd, (struct sockaddr*)&sin, sizeof sin) || listen(fd, 1)) {
    h_fail("control: cannot listen on port %d", port);
    return -1;
  }
  int conn = accept(fd, NULL, NULL);
  close(fd);
  if (conn < 0) h_fail("control: accept on port %d", port);
  return conn;
}

static inline int h_control_dial(const char* peer, double limit) {
  char host[64];
  const char* colon = strrchr(peer, ':');
  struct sockaddr_in sin = {.sin_family = AF_INET};
  if (!colon || (size_t)(colon - peer) >= sizeof host) {
    h_fail("control: bad peer address %s (want A.B.C.D:PORT)", peer);
    return -1;
  }
  memcpy(host, peer, (size_t)(colon - peer));
  host[colon - peer] = 0;
  sin.sin_port = htons((unsigned short)atoi(colon + 1));
  if (inet_pton(AF_INET, host, &sin.sin_addr) != 1) {
    h_fail("control: bad peer address %s", peer);
    return -1;
  }
  double start = h_now();
  for (;;) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr*)&sin, sizeof sin) == 0) return fd;
    if (fd >= 0) close(fd);
    if (h_now() - start > limit) {
      h_fail("control: %s not reachable after %.0f s", peer, limit);
      return -1;
    }
    usleep(200000);
  }
}

/* Whole-buffer read/write on the control connection; 1 on success. */
static inline int h_control_send(int fd, const void* buf, size_t n) {
  const char* p = buf;
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return 0;
    p += w;
    n -= (size_t)w;
  }
  return 1;
}

static inline int h_control_recv(int fd, void* buf, size_t n) {
  char* p = buf;
  while (n) {
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return 0;
    p += r;
    n -= (size_t)r;
  }
  return 1;
}

/* Multi-rank programs across hosts (collnet.c, rma.c): the host that serves the out-of-band exchange
 * accepts the ranks of the other hosts (h_rank_accept: each says its rank first; fds[r] for each rank
 * not local), and a rank on another host dials it (h_rank_dial: it may not be up yet) and says its
 * rank. */
static inline int h_rank_dial(const char* addr_port, int rank) {
  int fd = h_control_dial(addr_port, 60);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  uint32_t r = (uint32_t)rank;
  if (!h_control_send(fd, &r, sizeof r)) {
    close(fd);
    return -1;
  }
  return fd;
}

static inline int h_rank_accept(int port, int* fds, const int* local, int nranks) {
  int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  if (ls < 0 || bind(ls, (struct sockaddr*)&sa, sizeof sa) || listen(ls, 16)) {
    h_fail("exchange server on port %d: %s", port, strerror(errno));
    return 0;
  }
  int remote = 0;
  for (int r = 0; r < nranks; r++) remote += !local[r];
  while (remote > 0) {
    int fd = accept(ls, NULL, NULL);
    if (fd < 0) {
      if (errno == EINTR) continue;
      break;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    uint32_t r = 0;
    if (!h_control_recv(fd, &r, sizeof r) || r >= (uint32_t)nranks || local[r] || fds[r] >= 0) {
      h_fail("exchange server: a connection claimed rank %u", r);
      close(fd);
      continue;
    }
    fds[r] = fd;
    remote--;
  }
  close(ls);
  return remote == 0;
}
#endif
