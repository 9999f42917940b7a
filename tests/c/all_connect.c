/* Every rank connects to every other at the same moment, as NCCL's proxy does when a
 * communicator sets up its p2p connections: one listen comm per peer, the handles published
 * (here: files in a directory every host sees), then one thread per rank polling the non-blocking
 * connect and accept of every peer, in a rank-dependent order, until all are established. Then
 * each rank sends every peer a message naming both ends and checks what it received.
 *
 * usage: all_connect LIB --ranks N [--first-rank F] [--local K] --dir DIR [--limit SECONDS]
 *   This host runs ranks F .. F+K-1 of N (forked processes); DIR is shared by every host
 *   (vm/multi.sh's $RIVET_VM_SET) and must start empty of h.* files. --limit (default 120):
 *   set-up that takes longer fails (a deadlock shows as that failure, never a hang).
 * Prints "PASS [rank R] ..." or "FAIL [rank R] ..." per rank; the last line is
 * "all_connect: ..."; exits non-zero if any local rank failed. */
#define _GNU_SOURCE
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include "harness.h"

#define MAX_RANKS 64
#define MSG 64

static int g_rank, g_nranks;
static const char* g_dir;

static void path_of(char* out, size_t n, int from, int to) { snprintf(out, n, "%s/h.%d.%d", g_dir, from, to); }

/* Publish the handle rank `g_rank` listens on for peer `to` (written aside, then renamed, so a
 * reader never sees half a handle). */
static int publish(int to, const char* handle) {
  char path[512], tmp[520];
  path_of(path, sizeof path, g_rank, to);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE* f = fopen(tmp, "wb");
  if (!f) return 0;
  int ok = fwrite(handle, 1, NET_HANDLE_MAXSIZE, f) == NET_HANDLE_MAXSIZE;
  ok = fclose(f) == 0 && ok;
  return ok && rename(tmp, path) == 0;
}

/* The handle peer `from` published for this rank, if it is there yet. */
static int fetch(int from, char* handle) {
  char path[512];
  path_of(path, sizeof path, from, g_rank);
  FILE* f = fopen(path, "rb");
  if (!f) return 0;
  int ok = fread(handle, 1, NET_HANDLE_MAXSIZE, f) == NET_HANDLE_MAXSIZE;
  fclose(f);
  return ok;
}

static int run_rank(const char* lib, double limit) {
  void* ctx = h_load_and_init(lib);
  if (!ctx) return 1;
  void* listens[MAX_RANKS] = {0};
  void* sends[MAX_RANKS] = {0};
  void* recvs[MAX_RANKS] = {0};
  char handles[MAX_RANKS][NET_HANDLE_MAXSIZE];
  int have_handle[MAX_RANKS] = {0};
  for (int p = 0; p < g_nranks; p++) {
    if (p == g_rank) continue;
    char handle[NET_HANDLE_MAXSIZE];
    if (h_net->listen(ctx, 0, handle, &listens[p]) != NCCL_OK || !publish(p, handle)) {
      h_fail("listen/publish for rank %d: %s", p, h_last_warn);
      return 1;
    }
  }
  /* Each rank walks its peers in its own rotation, so connects and accepts interleave
   * differently on every rank. */
  int order[MAX_RANKS], n = 0;
  for (int k = 1; k < g_nranks; k++) order[n++] = (g_rank + k * (g_rank % 2 ? 1 : g_nranks - 1)) % g_nranks;
  double start = h_now();
  int pending = 2 * (g_nranks - 1);
  while (pending > 0 && h_now() - start < limit) {
    for (int k = 0; k < n; k++) {
      int p = order[k];
      if (!sends[p]) {
        if (!have_handle[p]) have_handle[p] = fetch(p, handles[p]);
        if (have_handle[p]) {
          if (h_net->connect(ctx, 0, handles[p], &sends[p], NULL) != NCCL_OK) {
            h_fail("connect to rank %d: %s", p, h_last_warn);
            return 1;
          }
          if (sends[p]) pending--;
        }
      }
      if (!recvs[p]) {
        if (h_net->accept(listens[p], &recvs[p], NULL) != NCCL_OK) {
          h_fail("accept from rank %d: %s", p, h_last_warn);
          return 1;
        }
        if (recvs[p]) pending--;
      }
    }
  }
  if (pending > 0) {
    h_fail("%d of %d connections not established after %.0f s", pending, 2 * (g_nranks - 1), limit);
    return 1;
  }
  double setup = h_now() - start;
  for (int p = 0; p < g_nranks; p++)
    if (listens[p]) h_net->close_listen(listens[p]);
  /* One message each way per peer: "<from> -> <to>". */
  static char out[MAX_RANKS][MSG], in[MAX_RANKS][MSG];
  void *smh[MAX_RANKS] = {0}, *rmh[MAX_RANKS] = {0}, *sreq[MAX_RANKS] = {0}, *rreq[MAX_RANKS] = {0};
  for (int p = 0; p < g_nranks; p++) {
    if (p == g_rank) continue;
    snprintf(out[p], MSG, "%d -> %d", g_rank, p);
    memset(in[p], 0, MSG);
    if (h_net->reg_mr(sends[p], out[p], MSG, PTR_HOST, &smh[p]) != NCCL_OK ||
        h_net->reg_mr(recvs[p], in[p], MSG, PTR_HOST, &rmh[p]) != NCCL_OK) {
      h_fail("regMr for rank %d: %s", p, h_last_warn);
      return 1;
    }
    void* data = in[p];
    size_t size = MSG;
    int tag = 1;
    while (!rreq[p])
      if (h_net->irecv(recvs[p], 1, &data, &size, &tag, &rmh[p], NULL, &rreq[p]) != NCCL_OK) {
        h_fail("irecv from rank %d: %s", p, h_last_warn);
        return 1;
      }
  }
  pending = 2 * (g_nranks - 1);
  start = h_now();
  while (pending > 0 && h_now() - start < limit) {
    for (int p = 0; p < g_nranks; p++) {
      if (p == g_rank) continue;
      int done = 0;
      if (!sreq[p] && h_net->isend(sends[p], out[p], MSG, 1, smh[p], NULL, &sreq[p]) != NCCL_OK) {
        h_fail("isend to rank %d: %s", p, h_last_warn);
        return 1;
      }
      if (sreq[p] && sreq[p] != (void*)1) {
        if (h_net->test(sreq[p], &done, NULL) != NCCL_OK) {
          h_fail("test of the send to rank %d: %s", p, h_last_warn);
          return 1;
        }
        if (done) sreq[p] = (void*)1, pending--;
      }
      if (rreq[p] && rreq[p] != (void*)1) {
        int size = 0;
        if (h_net->test(rreq[p], &done, &size) != NCCL_OK) {
          h_fail("test of the receive from rank %d: %s", p, h_last_warn);
          return 1;
        }
        if (done) {
          char want[MSG];
          snprintf(want, MSG, "%d -> %d", p, g_rank);
          if (size != MSG || strcmp(in[p], want)) h_fail("from rank %d: got \"%.*s\" (%d bytes), expected \"%s\"", p, MSG, in[p], size, want);
          rreq[p] = (void*)1, pending--;
        }
      }
    }
  }
  if (pending > 0) h_fail("%d messages not done after %.0f s", pending, limit);
  for (int p = 0; p < g_nranks; p++) {
    if (p == g_rank) continue;
    h_net->dereg_mr(sends[p], smh[p]);
    h_net->dereg_mr(recvs[p], rmh[p]);
    h_net->close_send(sends[p]);
    h_net->close_recv(recvs[p]);
  }
  h_net->finalize(ctx);
  if (!h_failures)
    h_pass("connected to and from all %d peers at once in %.2f s, one verified message each way", g_nranks - 1, setup);
  return h_failures ? 1 : 0;
}

int main(int argc, char** argv) {
  const char* lib = NULL;
  int first = 0, local = -1;
  double limit = 120;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--ranks") && i + 1 < argc) g_nranks = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--first-rank") && i + 1 < argc) first = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--local") && i + 1 < argc) local = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--dir") && i + 1 < argc) g_dir = argv[++i];
    else if (!strcmp(argv[i], "--limit") && i + 1 < argc) limit = atof(argv[++i]);
    else lib = argv[i];
  }
  if (local < 0) local = g_nranks - first;
  if (!lib || !g_dir || g_nranks < 2 || g_nranks > MAX_RANKS || first < 0 || local < 1 || first + local > g_nranks) {
    fprintf(stderr, "usage: %s LIB --ranks N [--first-rank F] [--local K] --dir DIR [--limit SECONDS]\n", argv[0]);
    return 2;
  }
  double start = h_now();
  pid_t pids[MAX_RANKS];
  for (int r = first; r < first + local; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      g_rank = r;
      char role[32];
      snprintf(role, sizeof role, "rank %d", r);
      h_role = strdup(role);
      alarm((unsigned)(2 * limit + 30));
      _exit(run_rank(lib, limit));
    }
  }
  int bad = 0;
  for (int r = first; r < first + local; r++) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "FAIL [rank %d] exited with status %d\n", r, status);
      bad++;
    }
  }
  fprintf(stderr, "all_connect: ranks %d..%d of %d, %d failed, %.1f s\n", first, first + local - 1, g_nranks, bad,
          h_now() - start);
  return bad ? 1 : 0;
}
