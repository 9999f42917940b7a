/*
 * Conformance tests of the user-space verbs fabric: two processes (fork) per
 * case, one initiator and one target, exchanging QP numbers, LIDs and keys
 * over a socketpair. Run through fabric/test.sh (LD_LIBRARY_PATH points at the
 * fabric). Usage: fabtest [case ...]; no argument runs every case.
 */
#define _GNU_SOURCE
#include <infiniband/verbs.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHECK(c)                                                                                           \
	do {                                                                                               \
		if (!(c)) {                                                                                \
			fprintf(stderr, "FAIL [%d] %s:%d: %s (errno %d %s)\n", getpid(), __func__, __LINE__, #c, \
				errno, strerror(errno));                                                   \
			exit(1);                                                                           \
		}                                                                                          \
	} while (0)

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

struct info {
	uint32_t qpn;
	uint16_t lid;
	uint64_t addr;
	uint32_t rkey;
	uint64_t addr2;
	uint32_t rkey2;
};

struct end {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *scq, *rcq;
	struct ibv_srq *srq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	uint8_t *mem; /* buffer with guard bytes around the registered part */
	uint8_t *buf; /* registered part */
	size_t len;
	int sock;
};

#define GUARD 4096
#define GUARD_BYTE 0xa5

static void xwrite(int fd, const void *p, size_t n)
{
	CHECK(write(fd, p, n) == (ssize_t)n);
}

static void xread(int fd, void *p, size_t n)
{
	size_t got = 0;
	while (got < n) {
		ssize_t r = read(fd, (char *)p + got, n - got);
		CHECK(r > 0);
		got += (size_t)r;
	}
}

static void sync_peer(int fd)
{
	char c = 's';
	xwrite(fd, &c, 1);
	xread(fd, &c, 1);
}

static void open_end(struct end *e, size_t len, int mr_access, int use_srq, int sig_all)
{
	int n;
	struct ibv_device **l = ibv_get_device_list(&n);
	CHECK(l && n >= 1);
	e->ctx = ibv_open_device(l[0]);
	CHECK(e->ctx);
	ibv_free_device_list(l);
	e->pd = ibv_alloc_pd(e->ctx);
	CHECK(e->pd);
	e->scq = ibv_create_cq(e->ctx, 1024, NULL, NULL, 0);
	e->rcq = ibv_create_cq(e->ctx, 1024, NULL, NULL, 0);
	CHECK(e->scq && e->rcq);
	e->len = len;
	e->mem = malloc(len + 2 * GUARD);
	CHECK(e->mem);
	memset(e->mem, GUARD_BYTE, len + 2 * GUARD);
	e->buf = e->mem + GUARD;
	memset(e->buf, 0, len);
	e->mr = ibv_reg_mr(e->pd, e->buf, len, mr_access);
	CHECK(e->mr);
	if (use_srq) {
		struct ibv_srq_init_attr sa = {.attr = {.max_wr = 64, .max_sge = 2}};
		e->srq = ibv_create_srq(e->pd, &sa);
		CHECK(e->srq);
	}
	struct ibv_qp_init_attr qa = {
		.send_cq = e->scq,
		.recv_cq = e->rcq,
		.srq = e->srq,
		.cap = {.max_send_wr = 256, .max_recv_wr = 256, .max_send_sge = 4, .max_recv_sge = 4,
			.max_inline_data = 64},
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = sig_all,
	};
	e->qp = ibv_create_qp(e->pd, &qa);
	CHECK(e->qp);
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT,
				.pkey_index = 0,
				.port_num = 1,
				.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
						   IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_LOCAL_WRITE};
	CHECK(ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
}

static struct info my_info(struct end *e)
{
	struct ibv_port_attr pa;
	CHECK(ibv_query_port(e->ctx, 1, &pa) == 0);
	struct info i = {.qpn = e->qp->qp_num, .lid = pa.lid, .addr = (uintptr_t)e->buf, .rkey = e->mr->rkey};
	return i;
}

/* what rtr_rts gives a QP: the responder's RNR NAK timer (RTR) and the requester's RNR retry count
 * (RTS); a case's role sets them before pair_up (each role is its own process) */
static uint8_t qp_min_rnr_timer = 12;
static uint8_t qp_rnr_retry = 7;

static void rtr_rts(struct end *e, const struct info *peer, uint8_t timeout, uint8_t retry)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_4096;
	a.dest_qp_num = peer->qpn;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 16;
	a.min_rnr_timer = qp_min_rnr_timer;
	a.ah_attr.dlid = peer->lid;
	a.ah_attr.port_num = 1;
	CHECK(ibv_modify_qp(e->qp, &a,
			    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = timeout;
	a.retry_cnt = retry;
	a.rnr_retry = qp_rnr_retry;
	a.sq_psn = 0;
	a.max_rd_atomic = 16;
	CHECK(ibv_modify_qp(e->qp, &a,
			    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				    IBV_QP_MAX_QP_RD_ATOMIC) == 0);
}

/* both sides: exchange info and connect */
static struct info pair_up(struct end *e, uint8_t timeout, uint8_t retry)
{
	struct info mine = my_info(e), peer;
	xwrite(e->sock, &mine, sizeof(mine));
	xread(e->sock, &peer, sizeof(peer));
	rtr_rts(e, &peer, timeout, retry);
	sync_peer(e->sock);
	return peer;
}

static void close_end(struct end *e)
{
	CHECK(ibv_destroy_qp(e->qp) == 0);
	if (e->srq)
		CHECK(ibv_destroy_srq(e->srq) == 0);
	CHECK(ibv_dereg_mr(e->mr) == 0);
	CHECK(ibv_destroy_cq(e->scq) == 0);
	CHECK(ibv_destroy_cq(e->rcq) == 0);
	CHECK(ibv_dealloc_pd(e->pd) == 0);
	CHECK(ibv_close_device(e->ctx) == 0);
	free(e->mem);
}

static int poll_wc(struct ibv_cq *cq, struct ibv_wc *wc, double timeout_ms)
{
	double end = now_ms() + timeout_ms;
	for (;;) {
		int n = ibv_poll_cq(cq, 1, wc);
		CHECK(n >= 0);
		if (n == 1)
			return 1;
		if (now_ms() > end)
			return 0;
		usleep(50);
	}
}

static void expect_wc(struct ibv_cq *cq, uint64_t wr_id, enum ibv_wc_status st, struct ibv_wc *out)
{
	struct ibv_wc wc;
	CHECK(poll_wc(cq, &wc, 5000));
	if (wc.wr_id != wr_id || wc.status != st)
		fprintf(stderr, "got wr_id %llu status %s, want wr_id %llu status %s\n", (unsigned long long)wc.wr_id,
			ibv_wc_status_str(wc.status), (unsigned long long)wr_id, ibv_wc_status_str(st));
	CHECK(wc.wr_id == wr_id);
	CHECK(wc.status == st);
	if (out)
		*out = wc;
}

static void expect_no_wc(struct ibv_cq *cq, double ms)
{
	struct ibv_wc wc;
	CHECK(!poll_wc(cq, &wc, ms));
}

static void post(struct end *e, enum ibv_wr_opcode op, uint64_t wr_id, void *laddr, uint32_t len, uint32_t lkey,
		 uint64_t raddr, uint32_t rkey, int flags, uint32_t imm)
{
	struct ibv_sge sge = {.addr = (uintptr_t)laddr, .length = len, .lkey = lkey};
	struct ibv_send_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = len ? 1 : 0, .opcode = op,
				 .send_flags = (unsigned)flags, .imm_data = imm};
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	struct ibv_send_wr *bad;
	CHECK(ibv_post_send(e->qp, &wr, &bad) == 0);
}

static void post_recv(struct end *e, uint64_t wr_id, void *addr, uint32_t len)
{
	struct ibv_sge sge = {.addr = (uintptr_t)addr, .length = len, .lkey = e->mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1}, *bad;
	if (e->srq)
		CHECK(ibv_post_srq_recv(e->srq, &wr, &bad) == 0);
	else
		CHECK(ibv_post_recv(e->qp, &wr, &bad) == 0);
}

static int guards_intact(struct end *e)
{
	for (size_t i = 0; i < GUARD; i++)
		if (e->mem[i] != GUARD_BYTE || e->buf[e->len + i] != GUARD_BYTE)
			return 0;
	return 1;
}

typedef void (*role_fn)(struct end *e);

/* run `target` in a child process and `initiator` here; both must succeed */
static int run_pair(const char *name, role_fn initiator, role_fn target)
{
	int sv[2];
	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
	double t0 = now_ms();
	fflush(stdout);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		close(sv[0]);
		struct end e = {.sock = sv[1]};
		target(&e);
		exit(0);
	}
	close(sv[1]);
	pid_t ip = fork();
	CHECK(ip >= 0);
	if (ip == 0) {
		struct end e = {.sock = sv[0]};
		char pidbuf[32];
		snprintf(pidbuf, sizeof(pidbuf), "%d", pid);
		setenv("FABTEST_PEER_PID", pidbuf, 1);
		initiator(&e);
		exit(0);
	}
	close(sv[0]);
	int st1, st2;
	waitpid(ip, &st1, 0);
	int ok1 = WIFEXITED(st1) && WEXITSTATUS(st1) == 0;
	if (!ok1)
		kill(pid, SIGKILL);
	waitpid(pid, &st2, 0);
	int ok2 = (WIFEXITED(st2) && WEXITSTATUS(st2) == 0) || (WIFSIGNALED(st2) && WTERMSIG(st2) == SIGKILL && ok1);
	if (WIFSIGNALED(st1))
		printf("     initiator killed by signal %d\n", WTERMSIG(st1));
	if (WIFSIGNALED(st2) && WTERMSIG(st2) != SIGKILL)
		printf("     target killed by signal %d\n", WTERMSIG(st2));
	printf("%s %-28s %8.1f ms\n", ok1 && ok2 ? "ok  " : "FAIL", name, now_ms() - t0);
	fflush(stdout);
	return ok1 && ok2 ? 0 : 1;
}

/* ---------------------------------------------------------------- cases -- */

#define ALL_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

/* every opcode, inline, immediate, byte_len, READ */
static void opcodes_init(struct end *e)
{
	open_end(e, 1 << 20, ALL_ACCESS, 0, 0);
	struct info p = pair_up(e, 14, 7);
	uint8_t *b = e->buf;
	for (int i = 0; i < 4096; i++)
		b[i] = (uint8_t)(i * 7 + 1);
	/* WRITE 4096 bytes to the target's offset 0 */
	post(e, IBV_WR_RDMA_WRITE, 1, b, 4096, e->mr->lkey, p.addr, p.rkey, IBV_SEND_SIGNALED, 0);
	struct ibv_wc wc;
	expect_wc(e->scq, 1, IBV_WC_SUCCESS, &wc);
	CHECK(wc.opcode == IBV_WC_RDMA_WRITE);
	CHECK(wc.qp_num == e->qp->qp_num);
	/* WRITE_WITH_IMM 1000 bytes to offset 8192 */
	post(e, IBV_WR_RDMA_WRITE_WITH_IMM, 2, b + 100, 1000, e->mr->lkey, p.addr + 8192, p.rkey, IBV_SEND_SIGNALED,
	     htonl(0xdeadbeef));
	expect_wc(e->scq, 2, IBV_WC_SUCCESS, &wc);
	CHECK(wc.opcode == IBV_WC_RDMA_WRITE);
	/* SEND 777 bytes, SEND_WITH_IMM 5 bytes */
	post(e, IBV_WR_SEND, 3, b + 1, 777, e->mr->lkey, 0, 0, IBV_SEND_SIGNALED, 0);
	expect_wc(e->scq, 3, IBV_WC_SUCCESS, &wc);
	CHECK(wc.opcode == IBV_WC_SEND);
	post(e, IBV_WR_SEND_WITH_IMM, 4, b + 2, 5, e->mr->lkey, 0, 0, IBV_SEND_SIGNALED, htonl(42));
	expect_wc(e->scq, 4, IBV_WC_SUCCESS, NULL);
	/* inline: the source is copied when posted, so changing it afterwards must not matter */
	uint8_t src[48];
	memset(src, 0x5c, sizeof(src));
	post(e, IBV_WR_RDMA_WRITE, 5, src, sizeof(src), 0 /* lkey ignored for inline */, p.addr + 16384, p.rkey,
	     IBV_SEND_SIGNALED | IBV_SEND_INLINE, 0);
	memset(src, 0, sizeof(src));
	expect_wc(e->scq, 5, IBV_WC_SUCCESS, NULL);
	memset(src, 0x6d, sizeof(src));
	post(e, IBV_WR_SEND, 6, src, sizeof(src), 0, 0, 0, IBV_SEND_SIGNALED | IBV_SEND_INLINE, 0);
	memset(src, 0, sizeof(src));
	expect_wc(e->scq, 6, IBV_WC_SUCCESS, NULL);
	/* zero-length WRITE_WITH_IMM (NCCL's completion signal) */
	post(e, IBV_WR_RDMA_WRITE_WITH_IMM, 7, NULL, 0, 0, 0, 0, IBV_SEND_SIGNALED, htonl(7));
	expect_wc(e->scq, 7, IBV_WC_SUCCESS, NULL);
	sync_peer(e->sock); /* target checked its side and filled offset 65536 */
	/* READ 3000 bytes from the target's offset 65536 into ours at 200000 */
	post(e, IBV_WR_RDMA_READ, 8, b + 200000, 3000, e->mr->lkey, p.addr + 65536, p.rkey, IBV_SEND_SIGNALED, 0);
	expect_wc(e->scq, 8, IBV_WC_SUCCESS, &wc);
	CHECK(wc.opcode == IBV_WC_RDMA_READ);
	CHECK(wc.byte_len == 3000);
	for (int i = 0; i < 3000; i++)
		CHECK(b[200000 + i] == (uint8_t)(i ^ 0x3c));
	/* a large READ and a large WRITE (several socket buffers) */
	post(e, IBV_WR_RDMA_READ, 9, b + 512 * 1024, 512 * 1024, e->mr->lkey, p.addr + 512 * 1024, p.rkey,
	     IBV_SEND_SIGNALED, 0);
	expect_wc(e->scq, 9, IBV_WC_SUCCESS, NULL);
	for (int i = 0; i < 512 * 1024; i += 4093)
		CHECK(b[512 * 1024 + i] == (uint8_t)(i % 251));
	sync_peer(e->sock);
	close_end(e);
}

static void opcodes_target(struct end *e)
{
	open_end(e, 1 << 20, ALL_ACCESS, 0, 0);
	post_recv(e, 100, e->buf + 20000, 1000); /* consumed by WRITE_WITH_IMM */
	post_recv(e, 101, e->buf + 30000, 1000);
	post_recv(e, 102, e->buf + 40000, 1000);
	post_recv(e, 103, e->buf + 50000, 1000);
	post_recv(e, 104, e->buf + 60000, 1000);
	struct info p = pair_up(e, 14, 7);
	struct ibv_wc wc;
	expect_wc(e->rcq, 100, IBV_WC_SUCCESS, &wc);
	CHECK(wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM);
	CHECK(wc.wc_flags & IBV_WC_WITH_IMM);
	CHECK(ntohl(wc.imm_data) == 0xdeadbeef);
	CHECK(wc.byte_len == 1000);
	CHECK(wc.qp_num == e->qp->qp_num);
	CHECK(wc.src_qp == p.qpn);
	expect_wc(e->rcq, 101, IBV_WC_SUCCESS, &wc);
	CHECK(wc.opcode == IBV_WC_RECV);
	CHECK(wc.byte_len == 777);
	CHECK(!(wc.wc_flags & IBV_WC_WITH_IMM));
	expect_wc(e->rcq, 102, IBV_WC_SUCCESS, &wc);
	CHECK(wc.byte_len == 5);
	CHECK((wc.wc_flags & IBV_WC_WITH_IMM) && ntohl(wc.imm_data) == 42);
	expect_wc(e->rcq, 103, IBV_WC_SUCCESS, &wc);
	CHECK(wc.byte_len == 48);
	expect_wc(e->rcq, 104, IBV_WC_SUCCESS, &wc);
	CHECK(wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM && wc.byte_len == 0 && ntohl(wc.imm_data) == 7);
	uint8_t *b = e->buf;
	for (int i = 0; i < 4096; i++)
		CHECK(b[i] == (uint8_t)(i * 7 + 1));
	for (int i = 0; i < 1000; i++)
		CHECK(b[8192 + i] == (uint8_t)((i + 100) * 7 + 1));
	for (int i = 0; i < 777; i++)
		CHECK(b[30000 + i] == (uint8_t)((i + 1) * 7 + 1));
	CHECK(b[30777] == 0);
	for (int i = 0; i < 48; i++)
		CHECK(b[16384 + i] == 0x5c && b[50000 + i] == 0x6d);
	for (int i = 0; i < 3000; i++)
		b[65536 + i] = (uint8_t)(i ^ 0x3c);
	for (int i = 0; i < 512 * 1024; i++)
		b[512 * 1024 + i] = (uint8_t)(i % 251);
	sync_peer(e->sock);
	sync_peer(e->sock);
	CHECK(guards_intact(e));
	close_end(e);
}

/* atomics: FETCH_AND_ADD and CMP_AND_SWP return the original value; a region without
 * REMOTE_ATOMIC is a remote access error */
static void atomic_post(struct end *e, enum ibv_wr_opcode op, uint64_t wr_id, uint64_t *result, uint64_t raddr,
			uint32_t rkey, uint64_t compare_add, uint64_t swap)
{
	struct ibv_sge sge = {(uintptr_t)result, 8, e->mr->lkey};
	struct ibv_send_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = op,
				 .send_flags = IBV_SEND_SIGNALED}, *bad;
	wr.wr.atomic.remote_addr = raddr;
	wr.wr.atomic.rkey = rkey;
	wr.wr.atomic.compare_add = compare_add;
	wr.wr.atomic.swap = swap;
	CHECK(ibv_post_send(e->qp, &wr, &bad) == 0);
}

static void atomics_init(struct end *e)
{
	open_end(e, 4096, ALL_ACCESS, 0, 0);
	struct info p = pair_up(e, 14, 7);
	uint64_t *res = (uint64_t *)e->buf;
	struct ibv_wc wc;
	atomic_post(e, IBV_WR_ATOMIC_FETCH_AND_ADD, 1, &res[0], p.addr, p.rkey, 3, 0);
	expect_wc(e->scq, 1, IBV_WC_SUCCESS, &wc);
	CHECK(wc.opcode == IBV_WC_FETCH_ADD && wc.byte_len == 8 && res[0] == 5);
	atomic_post(e, IBV_WR_ATOMIC_CMP_AND_SWP, 2, &res[1], p.addr, p.rkey, 8, 100);
	expect_wc(e->scq, 2, IBV_WC_SUCCESS, &wc);
	CHECK(wc.opcode == IBV_WC_COMP_SWAP && res[1] == 8);
	atomic_post(e, IBV_WR_ATOMIC_CMP_AND_SWP, 3, &res[2], p.addr, p.rkey, 7, 1); /* no match */
	expect_wc(e->scq, 3, IBV_WC_SUCCESS, NULL);
	CHECK(res[2] == 100);
	/* a WRITE between atomics stays ordered with them */
	res[3] = 1000;
	post(e, IBV_WR_RDMA_WRITE, 4, &res[3], 8, e->mr->lkey, p.addr, p.rkey, 0, 0);
	atomic_post(e, IBV_WR_ATOMIC_FETCH_AND_ADD, 5, &res[4], p.addr, p.rkey, 1, 0);
	expect_wc(e->scq, 5, IBV_WC_SUCCESS, NULL);
	CHECK(res[4] == 1000);
	/* a region registered without REMOTE_ATOMIC */
	atomic_post(e, IBV_WR_ATOMIC_FETCH_AND_ADD, 6, &res[5], p.addr2, p.rkey2, 1, 0);
	expect_wc(e->scq, 6, IBV_WC_REM_ACCESS_ERR, NULL);
	sync_peer(e->sock);
	close_end(e);
}

static void atomics_target(struct end *e)
{
	open_end(e, 4096, ALL_ACCESS | IBV_ACCESS_REMOTE_ATOMIC, 0, 0);
	uint64_t *v = (uint64_t *)e->buf;
	v[0] = 5;
	struct ibv_mr *mr2 = ibv_reg_mr(e->pd, e->buf + 2048, 64, ALL_ACCESS);
	CHECK(mr2);
	struct info mine = my_info(e), peer;
	mine.addr2 = (uintptr_t)e->buf + 2048;
	mine.rkey2 = mr2->rkey;
	xwrite(e->sock, &mine, sizeof(mine));
	xread(e->sock, &peer, sizeof(peer));
	rtr_rts(e, &peer, 14, 7);
	sync_peer(e->sock);
	sync_peer(e->sock);
	CHECK(v[0] == 1001);
	CHECK(ibv_dereg_mr(mr2) == 0);
	close_end(e);
}

/* unsignaled WRs complete silently; completions come in posting order; sq_sig_all */
static void order_init(struct end *e)
{
	open_end(e, 1 << 20, ALL_ACCESS, 0, 0);
	struct info p = pair_up(e, 14, 7);
	uint32_t *w = (uint32_t *)e->buf;
	/* 200 WRITEs of 4 bytes to consecutive slots, only every 50th signaled */
	for (int i = 0; i < 200; i++) {
		w[i] = (uint32_t)i + 1;
		post(e, IBV_WR_RDMA_WRITE, (uint64_t)i, &w[i], 4, e->mr->lkey, p.addr + 4 * (uint64_t)i, p.rkey,
		     (i % 50 == 49) ? IBV_SEND_SIGNALED : 0, 0);
	}
	for (int i = 49; i < 200; i += 50)
		expect_wc(e->scq, (uint64_t)i, IBV_WC_SUCCESS, NULL);
	expect_no_wc(e->scq, 100);
	/* a READ after writes to the same place sees them (per-QP ordering) */
	post(e, IBV_WR_RDMA_WRITE, 300, &w[0], 4, e->mr->lkey, p.addr + 4096, p.rkey, 0, 0);
	post(e, IBV_WR_RDMA_READ, 301, &w[1000], 4, e->mr->lkey, p.addr + 4096, p.rkey, IBV_SEND_SIGNALED, 0);
	expect_wc(e->scq, 301, IBV_WC_SUCCESS, NULL);
	CHECK(w[1000] == 1);
	sync_peer(e->sock);
	close_end(e);
	/* sq_sig_all: every WR completes, in order */
	open_end(e, 1 << 20, ALL_ACCESS, 0, 1);
	p = pair_up(e, 14, 7);
	for (int i = 0; i < 100; i++)
		post(e, i % 3 == 2 ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE, (uint64_t)i, e->buf + 64 * i, 64,
		     e->mr->lkey, p.addr + 64 * (uint64_t)i, p.rkey, 0, 0);
	for (int i = 0; i < 100; i++)
		expect_wc(e->scq, (uint64_t)i, IBV_WC_SUCCESS, NULL);
	sync_peer(e->sock);
	close_end(e);
}

static void order_target(struct end *e)
{
	open_end(e, 1 << 20, ALL_ACCESS, 0, 0);
	pair_up(e, 14, 7);
	sync_peer(e->sock);
	uint32_t *w = (uint32_t *)e->buf;
	for (int i = 0; i < 200; i++)
		CHECK(w[i] == (uint32_t)i + 1);
	close_end(e);
	open_end(e, 1 << 20, ALL_ACCESS, 0, 0);
	pair_up(e, 14, 7);
	sync_peer(e->sock);
	close_end(e);
}

/* SEND/RECV through an SRQ, a scatter over two SGEs, and a SEND that waits for its receive */
static void srq_init(struct end *e)
{
	open_end(e, 1 << 16, ALL_ACCESS, 0, 0);
	pair_up(e, 14, 7);
	for (int i = 0; i < 3000; i++)
		e->buf[i] = (uint8_t)(i % 253);
	post(e, IBV_WR_SEND, 1, e->buf, 3000, e->mr->lkey, 0, 0, IBV_SEND_SIGNALED, 0);
	expect_wc(e->scq, 1, IBV_WC_SUCCESS, NULL);
	/* no receive posted yet on the target: the SEND waits (RNR retried without end) */
	post(e, IBV_WR_SEND_WITH_IMM, 2, e->buf, 10, e->mr->lkey, 0, 0, IBV_SEND_SIGNALED, htonl(9));
	expect_no_wc(e->scq, 300);
	sync_peer(e->sock); /* target posts the receive now */
	expect_wc(e->scq, 2, IBV_WC_SUCCESS, NULL);
	sync_peer(e->sock);
	close_end(e);
}

static void srq_target(struct end *e)
{
	open_end(e, 1 << 16, ALL_ACCESS, 1, 0);
	struct ibv_sge sg[2] = {{(uintptr_t)e->buf + 10000, 1000, e->mr->lkey},
				{(uintptr_t)e->buf + 20000, 4000, e->mr->lkey}};
	struct ibv_recv_wr wr = {.wr_id = 7, .sg_list = sg, .num_sge = 2}, *bad;
	CHECK(ibv_post_srq_recv(e->srq, &wr, &bad) == 0);
	pair_up(e, 14, 7);
	struct ibv_wc wc;
	expect_wc(e->rcq, 7, IBV_WC_SUCCESS, &wc);
	CHECK(wc.byte_len == 3000 && wc.qp_num == e->qp->qp_num);
	for (int i = 0; i < 1000; i++)
		CHECK(e->buf[10000 + i] == (uint8_t)(i % 253));
	for (int i = 1000; i < 3000; i++)
		CHECK(e->buf[20000 + i - 1000] == (uint8_t)(i % 253));
	sync_peer(e->sock);
	usleep(100000); /* let the initiator's SEND sit in the stalled stream */
	post_recv(e, 8, e->buf + 30000, 100);
	expect_wc(e->rcq, 8, IBV_WC_SUCCESS, &wc);
	CHECK(wc.byte_len == 10 && ntohl(wc.imm_data) == 9);
	sync_peer(e->sock);
	close_end(e);
}

/* remote access violations: REM_ACCESS_ERR at the initiator, then flushes; at the target an
 * async QP_ACCESS_ERR, its receives flush, and no byte outside the region changes */
enum bad_kind { BAD_RKEY, BAD_BOUNDS, BAD_NO_RW, BAD_NO_RR, BAD_READ_BOUNDS };
static enum bad_kind bad_case;

static void access_init(struct end *e)
{
	open_end(e, 1 << 16, ALL_ACCESS, 0, 0);
	struct info p = pair_up(e, 14, 7);
	memset(e->buf, 0x11, e->len);
	/* one good WRITE first */
	post(e, IBV_WR_RDMA_WRITE, 1, e->buf, 64, e->mr->lkey, p.addr, p.rkey, IBV_SEND_SIGNALED, 0);
	expect_wc(e->scq, 1, IBV_WC_SUCCESS, NULL);
	enum ibv_wr_opcode op = IBV_WR_RDMA_WRITE;
	uint64_t raddr = p.addr;
	uint32_t rkey = p.rkey, len = 4096;
	switch (bad_case) {
	case BAD_RKEY: rkey = p.rkey ^ 0x4400; break;
	case BAD_BOUNDS: raddr = p.addr + (1 << 16) - 100; break; /* 3996 bytes past the end */
	case BAD_NO_RW: rkey = p.rkey2; raddr = p.addr2; break;
	case BAD_NO_RR: rkey = p.rkey2; raddr = p.addr2; op = IBV_WR_RDMA_READ; break;
	case BAD_READ_BOUNDS: raddr = p.addr - 8; op = IBV_WR_RDMA_READ; break;
	}
	post(e, op, 2, e->buf, len, e->mr->lkey, raddr, rkey, 0 /* unsignaled: errors complete anyway */, 0);
	post(e, IBV_WR_RDMA_WRITE, 3, e->buf, 64, e->mr->lkey, p.addr, p.rkey, IBV_SEND_SIGNALED, 0);
	expect_wc(e->scq, 2, IBV_WC_REM_ACCESS_ERR, NULL);
	expect_wc(e->scq, 3, IBV_WC_WR_FLUSH_ERR, NULL);
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	CHECK(ibv_query_qp(e->qp, &qa, IBV_QP_STATE, &qi) == 0);
	CHECK(qa.qp_state == IBV_QPS_ERR);
	/* posting to a QP in error: flushed */
	post(e, IBV_WR_RDMA_WRITE, 4, e->buf, 64, e->mr->lkey, p.addr, p.rkey, 0, 0);
	expect_wc(e->scq, 4, IBV_WC_WR_FLUSH_ERR, NULL);
	sync_peer(e->sock);
	close_end(e);
}

static void access_target(struct end *e)
{
	open_end(e, 1 << 16, ALL_ACCESS, 0, 0);
	/* a second region with local access only, guarded too */
	uint8_t *mem2 = malloc(8192 + 2 * GUARD);
	CHECK(mem2);
	memset(mem2, GUARD_BYTE, 8192 + 2 * GUARD);
	struct ibv_mr *mr2 = ibv_reg_mr(e->pd, mem2 + GUARD, 8192, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr2);
	post_recv(e, 50, e->buf + 1024, 64);
	post_recv(e, 51, e->buf + 2048, 64);
	struct info mine = my_info(e), peer;
	mine.addr2 = (uintptr_t)(mem2 + GUARD);
	mine.rkey2 = mr2->rkey;
	xwrite(e->sock, &mine, sizeof(mine));
	xread(e->sock, &peer, sizeof(peer));
	rtr_rts(e, &peer, 14, 7);
	sync_peer(e->sock);
	struct pollfd pfd = {.fd = e->ctx->async_fd, .events = POLLIN};
	CHECK(poll(&pfd, 1, 5000) == 1);
	struct ibv_async_event ev;
	CHECK(ibv_get_async_event(e->ctx, &ev) == 0);
	CHECK(ev.event_type == IBV_EVENT_QP_ACCESS_ERR);
	CHECK(ev.element.qp == e->qp);
	ibv_ack_async_event(&ev);
	expect_wc(e->rcq, 50, IBV_WC_WR_FLUSH_ERR, NULL);
	expect_wc(e->rcq, 51, IBV_WC_WR_FLUSH_ERR, NULL);
	sync_peer(e->sock);
	CHECK(guards_intact(e));
	for (size_t i = 64; i < e->len; i++)
		CHECK(e->buf[i] == 0); /* only the first good WRITE landed */
	for (size_t i = 0; i < 8192 + 2 * GUARD; i++)
		CHECK(mem2[i] == GUARD_BYTE);
	CHECK(ibv_dereg_mr(mr2) == 0);
	free(mem2);
	close_end(e);
}

/* local protection: an unknown lkey completes with LOC_PROT_ERR and the QP flushes */
static void lkey_init(struct end *e)
{
	open_end(e, 1 << 16, ALL_ACCESS, 0, 0);
	struct info p = pair_up(e, 14, 7);
	post(e, IBV_WR_RDMA_WRITE, 1, e->buf, 64, e->mr->lkey, p.addr, p.rkey, 0, 0);
	post(e, IBV_WR_RDMA_WRITE, 2, e->buf, 64, e->mr->lkey + 0x100, p.addr, p.rkey, 0, 0);
	post(e, IBV_WR_RDMA_WRITE, 3, e->buf, 64, e->mr->lkey, p.addr, p.rkey, IBV_SEND_SIGNALED, 0);
	expect_wc(e->scq, 2, IBV_WC_LOC_PROT_ERR, NULL);
	expect_wc(e->scq, 3, IBV_WC_WR_FLUSH_ERR, NULL);
	/* READ into a region without LOCAL_WRITE */
	sync_peer(e->sock);
	close_end(e);
}

static void lkey_target(struct end *e)
{
	open_end(e, 1 << 16, ALL_ACCESS, 0, 0);
	pair_up(e, 14, 7);
	sync_peer(e->sock);
	close_end(e);
}

/* the peer is killed: outstanding and later WRs fail with RETRY_EXC_ERR within a bound */
/* the QPs time out after 10 s (timeout 20 x 8 tries, capped): only the connection's EOF meets
 * the bound, which leaves room for a loaded host's scheduling stalls */
static double kill_bound_ms = 3000;

static uint8_t killed_qp_timeout = 20;

static void killed_init(struct end *e)
{
	open_end(e, 1 << 16, ALL_ACCESS, 0, 0);
	struct info p = pair_up(e, killed_qp_timeout, 7);
	post(e, IBV_WR_RDMA_WRITE, 1, e->buf, 64, e->mr->lkey, p.addr, p.rkey, IBV_SEND_SIGNALED, 0);
	expect_wc(e->scq, 1, IBV_WC_SUCCESS, NULL);
	/* a SEND the target never receives stays outstanding */
	post(e, IBV_WR_SEND, 2, e->buf, 64, e->mr->lkey, 0, 0, IBV_SEND_SIGNALED, 0);
	expect_no_wc(e->scq, 100);
	pid_t peer = (pid_t)atoi(getenv("FABTEST_PEER_PID"));
	double t0 = now_ms();
	CHECK(kill(peer, SIGKILL) == 0);
	expect_wc(e->scq, 2, IBV_WC_RETRY_EXC_ERR, NULL);
	double dt = now_ms() - t0;
	printf("     peer SIGKILLed: outstanding SEND -> RETRY_EXC_ERR after %.2f ms (bound %.0f ms)\n", dt,
	       kill_bound_ms);
	CHECK(dt < kill_bound_ms);
	post(e, IBV_WR_RDMA_WRITE, 3, e->buf, 64, e->mr->lkey, p.addr, p.rkey, IBV_SEND_SIGNALED, 0);
	expect_wc(e->scq, 3, IBV_WC_WR_FLUSH_ERR, NULL);
	close_end(e);
}

static void killed_target(struct end *e)
{
	open_end(e, 1 << 16, ALL_ACCESS, 0, 0);
	pair_up(e, 14, 7);
	pause();
}

/* the target forked a child (which lives on) before being killed: the child must not hold the
 * target's connections open, so the initiator still sees the death at once */
static void killed_forked_target(struct end *e)
{
	open_end(e, 1 << 16, ALL_ACCESS, 0, 0);
	pair_up(e, 14, 7);
	pid_t c = fork();
	CHECK(c >= 0);
	if (c == 0) {
		sleep(8);
		_exit(0);
	}
	pause();
}

static void killed_forked_init(struct end *e)
{
	killed_init(e);
}

/* a peer that is killed while idle: the next post fails at once */
static void killed_idle_init(struct end *e)
{
	open_end(e, 1 << 16, ALL_ACCESS, 0, 0);
	struct info p = pair_up(e, 14, 7);
	pid_t peer = (pid_t)atoi(getenv("FABTEST_PEER_PID"));
	CHECK(kill(peer, SIGKILL) == 0);
	usleep(50000);
	double t0 = now_ms();
	post(e, IBV_WR_RDMA_WRITE, 1, e->buf, 64, e->mr->lkey, p.addr, p.rkey, 0, 0);
	expect_wc(e->scq, 1, IBV_WC_RETRY_EXC_ERR, NULL);
	printf("     idle peer SIGKILLed: next WRITE -> RETRY_EXC_ERR after %.2f ms\n", now_ms() - t0);
	close_end(e);
}

/* a peer that stops answering (SIGSTOP): RETRY_EXC_ERR after the QP's timeout * (retry_cnt + 1) */
static void stopped_init(struct end *e)
{
	open_end(e, 1 << 16, ALL_ACCESS, 0, 0);
	/* timeout 14: 4.096 us << 14 = 67 ms; retry_cnt 2: 3 tries = 201 ms */
	struct info p = pair_up(e, 14, 2);
	pid_t peer = (pid_t)atoi(getenv("FABTEST_PEER_PID"));
	CHECK(kill(peer, SIGSTOP) == 0);
	usleep(20000);
	double t0 = now_ms();
	post(e, IBV_WR_RDMA_WRITE, 1, e->buf, 64, e->mr->lkey, p.addr, p.rkey, IBV_SEND_SIGNALED, 0);
	/* spin on the CQ, as a proxy thread does: the progress thread defers to a poller, yet its
	 * timers must still run */
	struct ibv_wc wc;
	int n;
	while ((n = ibv_poll_cq(e->scq, 1, &wc)) == 0 && now_ms() - t0 < 5000)
		;
	CHECK(n == 1 && wc.wr_id == 1 && wc.status == IBV_WC_RETRY_EXC_ERR);
	double dt = now_ms() - t0;
	printf("     peer SIGSTOPped: WRITE -> RETRY_EXC_ERR after %.1f ms (QP timeout x tries = 201 ms)\n", dt);
	CHECK(dt > 150 && dt < 5000); /* the cap (10 s) would mean the stop went unnoticed */
	CHECK(kill(peer, SIGKILL) == 0);
	close_end(e);
}

/* the parameter of a case (cases[].param), set before the roles fork */
static int case_param;

/* A QP entering ERR first executes, in wire order, the requests its peer had already sent: a
 * stream of WRITEs and WRITE_WITH_IMMs sits in the target's socket behind the first WRITE_WITH_IMM
 * (no receive posted: the stream stalls there), the target posts its receives and at once moves
 * its QP to ERR (param 0) or makes it fail with a local error (param 1). Every receive a
 * WRITE_WITH_IMM had reached completes successfully, in order, before the spare receives flush;
 * every WRITE is placed; the initiator's WRs were acknowledged. */
#define DRAIN_N 8
#define DRAIN_BIG_AT 8192
#define DRAIN_BIG (48 * 1024)
enum { DRAIN_BY_MODIFY, DRAIN_BY_LOCAL_ERROR };

/* Keep this process's other threads (the fabric's progress thread) off the CPU while this one
 * runs without blocking: all on this thread's CPU, the others SCHED_IDLE, which never preempts
 * a normal thread. Then nothing but this thread's own verbs calls touches the QP. `undo`
 * gives every thread `all` CPUs again (an unprivileged thread cannot leave SCHED_IDLE). */
static void starve_other_threads(const cpu_set_t *all, int undo)
{
	cpu_set_t one;
	CPU_ZERO(&one);
	CPU_SET(sched_getcpu(), &one);
	const cpu_set_t *set = undo ? all : &one;
	CHECK(sched_setaffinity(0, sizeof(*set), set) == 0);
	DIR *d = opendir("/proc/self/task");
	CHECK(d);
	int others = 0;
	for (struct dirent *de; (de = readdir(d));) {
		pid_t t = (pid_t)atoi(de->d_name);
		if (t <= 0 || t == gettid())
			continue;
		CHECK(sched_setaffinity(t, sizeof(*set), set) == 0);
		struct sched_param sp = {0};
		if (!undo)
			CHECK(sched_setscheduler(t, SCHED_IDLE, &sp) == 0);
		others++;
	}
	closedir(d);
	CHECK(others >= 1);
}

static void err_drain_init(struct end *e)
{
	open_end(e, 1 << 16, ALL_ACCESS, 0, 0);
	struct info p = pair_up(e, 14, 7); /* rnr_retry 7: waits for the target's receives */
	for (int i = 0; i < DRAIN_N; i++) {
		uint8_t *src = e->buf + i * 512;
		memset(src, 0x40 + i, 512);
		post(e, IBV_WR_RDMA_WRITE_WITH_IMM, (uint64_t)i, src, 256, e->mr->lkey, p.addr + (uint64_t)i * 512,
		     p.rkey, IBV_SEND_SIGNALED, htonl(1000u + (uint32_t)i));
		post(e, IBV_WR_RDMA_WRITE, 100u + (uint64_t)i, src + 256, 256, e->mr->lkey,
		     p.addr + (uint64_t)i * 512 + 256, p.rkey, 0, 0);
	}
	/* a large WRITE too: its payload goes from the socket straight into the region */
	for (int i = 0; i < DRAIN_BIG; i++)
		e->buf[DRAIN_BIG_AT + i] = (uint8_t)(i % 251);
	post(e, IBV_WR_RDMA_WRITE, 99, e->buf + DRAIN_BIG_AT, DRAIN_BIG, e->mr->lkey, p.addr + DRAIN_BIG_AT, p.rkey,
	     IBV_SEND_SIGNALED, 0);
	/* posted: a WR goes into the socket when posted, so the target's socket holds them all now */
	sync_peer(e->sock);
	for (int i = 0; i < DRAIN_N; i++)
		expect_wc(e->scq, (uint64_t)i, IBV_WC_SUCCESS, NULL);
	expect_wc(e->scq, 99, IBV_WC_SUCCESS, NULL);
	sync_peer(e->sock);
	close_end(e);
}

static void err_drain_target(struct end *e)
{
	open_end(e, 1 << 16, ALL_ACCESS, 0, 0);
	pair_up(e, 14, 7);
	sync_peer(e->sock);
	usleep(50000); /* the first WRITE_WITH_IMM finds no receive: everything behind it waits */
	struct ibv_wc wc;
	CHECK(ibv_poll_cq(e->rcq, 1, &wc) == 0);
	cpu_set_t all;
	CHECK(sched_getaffinity(0, sizeof(all), &all) == 0);
	/* posting a receive wakes the progress thread to resume the stream; without this, it
	 * could do so before the transition below, and the case would test nothing */
	starve_other_threads(&all, 0);
	for (int i = 0; i < DRAIN_N; i++)
		CHECK(e->buf[i * 512 + 256] == 0); /* nothing behind the stalled request was placed */
	CHECK(e->buf[DRAIN_BIG_AT] == 0 && e->buf[DRAIN_BIG_AT + DRAIN_BIG - 1] == 0);
	/* receives for every WRITE_WITH_IMM and two more, then at once to ERR */
	struct ibv_recv_wr rw[DRAIN_N + 2], *bad;
	for (int i = 0; i < DRAIN_N + 2; i++) {
		memset(&rw[i], 0, sizeof(rw[i]));
		rw[i].wr_id = (uint64_t)i;
		rw[i].next = i + 1 < DRAIN_N + 2 ? &rw[i + 1] : NULL;
	}
	CHECK(ibv_post_recv(e->qp, rw, &bad) == 0);
	if (case_param == DRAIN_BY_MODIFY) {
		struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
		CHECK(ibv_modify_qp(e->qp, &a, IBV_QP_STATE) == 0);
	} else {
		post(e, IBV_WR_RDMA_WRITE, 77, e->buf, 64, e->mr->lkey + 0x100, 0, 0, IBV_SEND_SIGNALED, 0);
	}
	starve_other_threads(&all, 1);
	if (case_param == DRAIN_BY_LOCAL_ERROR)
		expect_wc(e->scq, 77, IBV_WC_LOC_PROT_ERR, NULL);
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	CHECK(ibv_query_qp(e->qp, &qa, IBV_QP_STATE, &qi) == 0);
	CHECK(qa.qp_state == IBV_QPS_ERR);
	for (int i = 0; i < DRAIN_N; i++) {
		expect_wc(e->rcq, (uint64_t)i, IBV_WC_SUCCESS, &wc);
		CHECK(wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM);
		CHECK(wc.byte_len == 256 && (wc.wc_flags & IBV_WC_WITH_IMM) && ntohl(wc.imm_data) == 1000u + (uint32_t)i);
	}
	expect_wc(e->rcq, DRAIN_N, IBV_WC_WR_FLUSH_ERR, NULL);
	expect_wc(e->rcq, DRAIN_N + 1, IBV_WC_WR_FLUSH_ERR, NULL);
	expect_no_wc(e->rcq, 20);
	for (int i = 0; i < DRAIN_N; i++)
		for (int j = 0; j < 512; j++)
			CHECK(e->buf[i * 512 + j] == 0x40 + i);
	for (int i = 0; i < DRAIN_BIG; i++)
		CHECK(e->buf[DRAIN_BIG_AT + i] == (uint8_t)(i % 251));
	CHECK(guards_intact(e));
	sync_peer(e->sock);
	close_end(e);
}

/* Receiver not ready. The target posts no receive; the initiator posts a SEND, a WRITE_WITH_IMM
 * and a WRITE behind it. The case's parameter is the initiator's rnr_retry:
 * - 7 (rnr-forever): with the shortest RNR timer (code 1, 0.01 ms) the SEND still waits, and
 *   succeeds once the target posts receives 300 ms later; the WRITE behind it was not placed
 *   before (nothing passes the stalled request), and then is.
 * - RNR_IN_TIME (rnr-in-time): rnr_retry 3 with timer code 0 (655.36 ms, the longest): the
 *   receives come after 100 ms, within the retries, and everything succeeds.
 * - 0, 3, 6 (rnr-retry-exceeded-N): timer code 20 (10.24 ms): the SEND completes with
 *   RNR_RETRY_EXC_ERR no sooner than rnr_retry timers after it was posted and within
 *   (rnr_retry + 1) timers plus a slack for a loaded host; the WRs behind it flush, the QP is
 *   in ERR. The target stays in RTS and never sees the SEND or the WRITE_WITH_IMM: receives it
 *   posts afterwards stay unused, the WRITE's bytes never land. */
#define RNR_IN_TIME 8
#define RNR_EXC_TIMER 20 /* 10.24 ms */
#define RNR_SLACK_MS 2000.0

static void rnr_init(struct end *e)
{
	int exceed = case_param < 7;
	qp_rnr_retry = (uint8_t)(case_param == RNR_IN_TIME ? 3 : case_param);
	open_end(e, 1 << 16, ALL_ACCESS, 0, 0);
	struct info p = pair_up(e, 14, 7);
	memset(e->buf, 0x5a, 4096);
	double t0 = now_ms();
	post(e, IBV_WR_SEND, 1, e->buf, 100, e->mr->lkey, 0, 0, IBV_SEND_SIGNALED, 0);
	post(e, IBV_WR_RDMA_WRITE_WITH_IMM, 2, e->buf, 64, e->mr->lkey, p.addr + 8192, p.rkey, IBV_SEND_SIGNALED,
	     htonl(5));
	post(e, IBV_WR_RDMA_WRITE, 3, e->buf, 64, e->mr->lkey, p.addr + 4096, p.rkey, 0, 0);
	if (exceed) {
		struct ibv_wc wc;
		CHECK(poll_wc(e->scq, &wc, 5000));
		double dt = now_ms() - t0;
		double timer = 10.24, lo = qp_rnr_retry * timer, hi = (qp_rnr_retry + 1) * timer + RNR_SLACK_MS;
		printf("     rnr_retry %u, min_rnr_timer 10.24 ms: SEND -> %s after %.1f ms (at least %.1f ms)\n",
		       qp_rnr_retry, ibv_wc_status_str(wc.status), dt, lo);
		CHECK(wc.wr_id == 1 && wc.status == IBV_WC_RNR_RETRY_EXC_ERR && wc.opcode == IBV_WC_SEND);
		CHECK(dt >= lo && dt <= hi);
		expect_wc(e->scq, 2, IBV_WC_WR_FLUSH_ERR, NULL);
		expect_wc(e->scq, 3, IBV_WC_WR_FLUSH_ERR, NULL);
		struct ibv_qp_attr qa;
		struct ibv_qp_init_attr qi;
		CHECK(ibv_query_qp(e->qp, &qa, IBV_QP_STATE, &qi) == 0);
		CHECK(qa.qp_state == IBV_QPS_ERR);
		post(e, IBV_WR_RDMA_WRITE, 4, e->buf, 64, e->mr->lkey, p.addr + 4096, p.rkey, IBV_SEND_SIGNALED, 0);
		expect_wc(e->scq, 4, IBV_WC_WR_FLUSH_ERR, NULL);
		sync_peer(e->sock);
	} else {
		expect_no_wc(e->scq, case_param == RNR_IN_TIME ? 100 : 300);
		sync_peer(e->sock); /* the target checks the WRITE did not pass, then posts receives */
		expect_wc(e->scq, 1, IBV_WC_SUCCESS, NULL);
		expect_wc(e->scq, 2, IBV_WC_SUCCESS, NULL);
	}
	sync_peer(e->sock);
	close_end(e);
}

static void rnr_target(struct end *e)
{
	int exceed = case_param < 7;
	qp_min_rnr_timer = exceed ? RNR_EXC_TIMER : case_param == RNR_IN_TIME ? 0 : 1;
	open_end(e, 1 << 16, ALL_ACCESS, 0, 0);
	pair_up(e, 14, 7);
	sync_peer(e->sock); /* the initiator is done waiting (or failing) */
	for (int i = 0; i < 64; i++)
		CHECK(e->buf[4096 + i] == 0 && e->buf[8192 + i] == 0); /* nothing passed the SEND */
	post_recv(e, 10, e->buf + 1024, 1024);
	post_recv(e, 11, e->buf + 2048, 1024);
	struct ibv_wc wc;
	if (exceed) {
		expect_no_wc(e->rcq, 100);
		struct ibv_qp_attr qa;
		struct ibv_qp_init_attr qi;
		CHECK(ibv_query_qp(e->qp, &qa, IBV_QP_STATE, &qi) == 0);
		CHECK(qa.qp_state == IBV_QPS_RTS);
		for (int i = 0; i < 64; i++)
			CHECK(e->buf[4096 + i] == 0 && e->buf[8192 + i] == 0);
	} else {
		expect_wc(e->rcq, 10, IBV_WC_SUCCESS, &wc);
		CHECK(wc.opcode == IBV_WC_RECV && wc.byte_len == 100 && e->buf[1024] == 0x5a);
		expect_wc(e->rcq, 11, IBV_WC_SUCCESS, &wc);
		CHECK(wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM && ntohl(wc.imm_data) == 5);
	}
	sync_peer(e->sock);
	if (!exceed)
		for (int i = 0; i < 64; i++)
			CHECK(e->buf[4096 + i] == 0x5a && e->buf[8192 + i] == 0x5a);
	CHECK(guards_intact(e));
	close_end(e);
}

/* the QP state machine refuses what real verbs refuse */
static void states_init(struct end *e)
{
	open_end(e, 4096, ALL_ACCESS, 0, 0); /* leaves the QP in INIT */
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr qi;
	memset(&a, 0, sizeof(a));
	struct ibv_send_wr wr = {.opcode = IBV_WR_RDMA_WRITE}, *bad;
	CHECK(ibv_post_send(e->qp, &wr, &bad) == EINVAL); /* not RTS */
	a.qp_state = IBV_QPS_RTS;
	CHECK(ibv_modify_qp(e->qp, &a, IBV_QP_STATE) == EINVAL); /* INIT -> RTS skips RTR */
	a.qp_state = IBV_QPS_RTR;
	CHECK(ibv_modify_qp(e->qp, &a, IBV_QP_STATE) == EINVAL); /* RTR without its attributes */
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 9;
	CHECK(ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_PORT) == EINVAL); /* no port 9 */
	a.port_num = 1;
	a.timeout = 14;
	CHECK(ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT) == EINVAL); /* TIMEOUT not for INIT */
	CHECK(ibv_query_qp(e->qp, &a, IBV_QP_STATE, &qi) == 0);
	CHECK(a.qp_state == IBV_QPS_INIT);
	struct info me = my_info(e);
	rtr_rts(e, &me, 14, 7); /* a loopback QP: connected to itself */
	CHECK(ibv_query_qp(e->qp, &a, IBV_QP_STATE, &qi) == 0);
	CHECK(a.qp_state == IBV_QPS_RTS && a.dest_qp_num == me.qpn && a.timeout == 14 && a.retry_cnt == 7);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	CHECK(ibv_modify_qp(e->qp, &a, IBV_QP_STATE) == EINVAL); /* RTS -> INIT */
	/* loopback WRITE and READ on the one QP */
	memset(e->buf, 3, 16);
	post(e, IBV_WR_RDMA_WRITE, 1, e->buf, 16, e->mr->lkey, (uintptr_t)e->buf + 1024, e->mr->rkey,
	     IBV_SEND_SIGNALED, 0);
	expect_wc(e->scq, 1, IBV_WC_SUCCESS, NULL);
	CHECK(e->buf[1024 + 15] == 3);
	a.qp_state = IBV_QPS_ERR;
	CHECK(ibv_modify_qp(e->qp, &a, IBV_QP_STATE) == 0);
	a.qp_state = IBV_QPS_RESET;
	CHECK(ibv_modify_qp(e->qp, &a, IBV_QP_STATE) == 0);
	a.qp_state = IBV_QPS_RTR;
	CHECK(ibv_modify_qp(e->qp, &a, IBV_QP_STATE) == EINVAL); /* RESET -> RTR */
	/* dmabuf registration is not supported; MR access rules */
	CHECK(ibv_reg_dmabuf_mr(e->pd, 0, 4096, 0, -1, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EOPNOTSUPP);
	CHECK(ibv_reg_mr(e->pd, e->buf, 64, IBV_ACCESS_REMOTE_WRITE) == NULL && errno == EINVAL);
	close_end(e);
	sync_peer(e->sock);
}

static void states_target(struct end *e)
{
	sync_peer(e->sock);
}

/* several threads, each with its own QP on one shared context and CQ pair per thread, stream
 * WRITE_WITH_IMM + SEND concurrently; the polling threads also drive progress */
#define NTHREADS 4
#define NMSG 2000
struct tctx {
	struct end *e;
	struct ibv_qp *qp;
	struct ibv_cq *scq, *rcq;
	struct info peer;
	int idx;
	int target;
};

static struct ibv_qp *mk_qp(struct end *e, struct ibv_cq *scq, struct ibv_cq *rcq, uint8_t port)
{
	struct ibv_qp_init_attr qa = {.send_cq = scq, .recv_cq = rcq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 128, .max_recv_wr = 256, .max_send_sge = 1,
					      .max_recv_sge = 1}};
	struct ibv_qp *qp = ibv_create_qp(e->pd, &qa);
	CHECK(qp);
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = port,
				.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE};
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
	return qp;
}

static void *thread_main(void *arg)
{
	struct tctx *t = arg;
	struct end *e = t->e;
	uint8_t *slot = e->buf + (size_t)t->idx * 65536;
	struct ibv_wc wc;
	if (t->target) {
		/* receives are reposted as they complete; the immediates must arrive in order */
		/* 256 receive buffers of 4 bytes, each reposted when its receive completed */
		struct ibv_sge sge = {0, 4, e->mr->lkey};
		struct ibv_recv_wr wr = {.sg_list = &sge, .num_sge = 1}, *bad;
		for (int i = 0; i < 256; i++) {
			wr.wr_id = (uint64_t)i;
			sge.addr = (uintptr_t)slot + 32768 + 4 * (uint64_t)i;
			CHECK(ibv_post_recv(t->qp, &wr, &bad) == 0);
		}
		for (uint32_t got = 0; got < 2 * NMSG;) {
			if (!poll_wc(t->rcq, &wc, 10000)) {
				fprintf(stderr, "receiver: got %u\n", got);
				CHECK(!"receive timed out");
			}
			CHECK(wc.status == IBV_WC_SUCCESS);
			uint32_t want = got / 2;
			if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
				CHECK(got % 2 == 0 && ntohl(wc.imm_data) == want);
				CHECK(*(uint32_t *)(slot + 4 * want) == want);
			} else {
				CHECK(got % 2 == 1 && wc.byte_len == 4);
				CHECK(*(uint32_t *)(slot + 32768 + 4 * wc.wr_id) == want);
			}
			got++;
			wr.wr_id = wc.wr_id;
			sge.addr = (uintptr_t)slot + 32768 + 4 * wc.wr_id;
			CHECK(ibv_post_recv(t->qp, &wr, &bad) == 0);
		}
		return NULL;
	}
	int outstanding = 0;
	for (uint32_t i = 0; i < NMSG; i++) {
		uint32_t *src = (uint32_t *)(slot + 4 * i); /* 8000 bytes: no word is reused */
		*src = i;
		struct ibv_sge sge = {(uintptr_t)src, 4, e->mr->lkey};
		struct ibv_send_wr w2 = {.wr_id = 2 * i + 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
					 .send_flags = IBV_SEND_SIGNALED};
		struct ibv_send_wr w1 = {.wr_id = 2 * i, .sg_list = &sge, .num_sge = 1,
					 .opcode = IBV_WR_RDMA_WRITE_WITH_IMM, .send_flags = IBV_SEND_SIGNALED,
					 .imm_data = htonl(i), .next = &w2};
		w1.wr.rdma.remote_addr = t->peer.addr + (uint64_t)t->idx * 65536 + 4 * (uint64_t)i;
		w1.wr.rdma.rkey = t->peer.rkey;
		struct ibv_send_wr *bad;
		while (outstanding > 120) {
			if (!poll_wc(t->scq, &wc, 10000)) {
				fprintf(stderr, "sender: i %u outstanding %d\n", i, outstanding);
				CHECK(!"send completion timed out");
			}
			CHECK(wc.status == IBV_WC_SUCCESS);
			outstanding--;
		}
		CHECK(ibv_post_send(t->qp, &w1, &bad) == 0);
		outstanding += 2;
	}
	while (outstanding) {
		CHECK(poll_wc(t->scq, &wc, 10000));
		CHECK(wc.status == IBV_WC_SUCCESS);
		outstanding--;
	}
	return NULL;
}

static void threads_run(struct end *e, int target)
{
	open_end(e, NTHREADS * 65536, ALL_ACCESS, 0, 0);
	struct tctx t[NTHREADS];
	struct info mine[NTHREADS], peer[NTHREADS];
	for (int i = 0; i < NTHREADS; i++) {
		t[i].e = e;
		t[i].idx = i;
		t[i].target = target;
		t[i].scq = ibv_create_cq(e->ctx, 256, NULL, NULL, 0);
		t[i].rcq = ibv_create_cq(e->ctx, 512, NULL, NULL, 0);
		CHECK(t[i].scq && t[i].rcq);
		t[i].qp = mk_qp(e, t[i].scq, t[i].rcq, 1);
		mine[i] = my_info(e);
		mine[i].qpn = t[i].qp->qp_num;
	}
	xwrite(e->sock, mine, sizeof(mine));
	xread(e->sock, peer, sizeof(peer));
	for (int i = 0; i < NTHREADS; i++) {
		struct end tmp = *e;
		tmp.qp = t[i].qp;
		rtr_rts(&tmp, &peer[i], 14, 7);
		t[i].peer = peer[i];
	}
	sync_peer(e->sock);
	pthread_t th[NTHREADS];
	double t0 = now_ms();
	for (int i = 0; i < NTHREADS; i++)
		CHECK(pthread_create(&th[i], NULL, thread_main, &t[i]) == 0);
	for (int i = 0; i < NTHREADS; i++)
		pthread_join(th[i], NULL);
	if (!target)
		printf("     %d threads x %d (WRITE_WITH_IMM + SEND): %.1f ms\n", NTHREADS, NMSG, now_ms() - t0);
	sync_peer(e->sock);
	for (int i = 0; i < NTHREADS; i++) {
		CHECK(ibv_destroy_qp(t[i].qp) == 0);
		CHECK(ibv_destroy_cq(t[i].scq) == 0);
		CHECK(ibv_destroy_cq(t[i].rcq) == 0);
	}
	close_end(e);
}

static void threads_init(struct end *e)
{
	threads_run(e, 0);
}

static void threads_target(struct end *e)
{
	threads_run(e, 1);
}

/* many QPs between two processes: create, connect, one transfer each, destroy */
#define MANY 200
static void many_run(struct end *e, int target)
{
	open_end(e, MANY * 64, ALL_ACCESS, 0, 0);
	static struct ibv_qp *qps[MANY];
	static struct info mine[MANY], peer[MANY];
	for (int i = 0; i < MANY; i++) {
		qps[i] = mk_qp(e, e->scq, e->rcq, 1);
		mine[i] = my_info(e);
		mine[i].qpn = qps[i]->qp_num;
	}
	xwrite(e->sock, mine, sizeof(mine));
	xread(e->sock, peer, sizeof(peer));
	for (int i = 0; i < MANY; i++) {
		struct end tmp = *e;
		tmp.qp = qps[i];
		rtr_rts(&tmp, &peer[i], 14, 7);
	}
	sync_peer(e->sock);
	if (!target) {
		for (int i = 0; i < MANY; i++) {
			struct end tmp = *e;
			tmp.qp = qps[i];
			e->buf[64 * i] = (uint8_t)i;
			post(&tmp, IBV_WR_RDMA_WRITE, (uint64_t)i, e->buf + 64 * i, 1, e->mr->lkey, peer[i].addr + 64 * (uint64_t)i,
			     peer[i].rkey, IBV_SEND_SIGNALED, 0);
		}
		for (int i = 0; i < MANY; i++) {
			struct ibv_wc wc;
			CHECK(poll_wc(e->scq, &wc, 10000));
			CHECK(wc.status == IBV_WC_SUCCESS);
		}
	}
	sync_peer(e->sock);
	if (target)
		for (int i = 0; i < MANY; i++)
			CHECK(e->buf[64 * i] == (uint8_t)i);
	for (int i = 0; i < MANY; i++)
		CHECK(ibv_destroy_qp(qps[i]) == 0);
	close_end(e);
}

static void many_init(struct end *e)
{
	many_run(e, 0);
}

static void many_target(struct end *e)
{
	many_run(e, 1);
}

/* SEND ping-pong with busy polling on both sides: prints the round-trip distribution */
#define PINGS 1000
static void pingpong_run(struct end *e, int target)
{
	open_end(e, 4096, ALL_ACCESS, 0, 0);
	for (int i = 0; i < 64; i++)
		post_recv(e, 1000 + (uint64_t)i, e->buf + 1024, 64);
	pair_up(e, 14, 7);
	static double rtt[PINGS];
	struct ibv_wc wc;
	for (int i = 0; i < PINGS; i++) {
		double t0 = now_ms();
		if (!target)
			post(e, IBV_WR_SEND, (uint64_t)i, e->buf, 8, e->mr->lkey, 0, 0, 0, 0);
		int n;
		while ((n = ibv_poll_cq(e->rcq, 1, &wc)) == 0)
			;
		CHECK(n == 1 && wc.status == IBV_WC_SUCCESS);
		post_recv(e, wc.wr_id, e->buf + 1024, 64);
		if (target)
			post(e, IBV_WR_SEND, (uint64_t)i, e->buf, 8, e->mr->lkey, 0, 0, 0, 0);
		rtt[i] = now_ms() - t0;
		if (i % 32 == 31) { /* an occasional signaled SEND keeps the send queue drained */
			post(e, IBV_WR_SEND, 1u << 20, e->buf, 0, 0, 0, 0, IBV_SEND_SIGNALED, 0);
			while ((n = ibv_poll_cq(e->scq, 1, &wc)) == 0)
				;
			CHECK(wc.status == IBV_WC_SUCCESS);
			while ((n = ibv_poll_cq(e->rcq, 1, &wc)) == 0)
				;
			post_recv(e, wc.wr_id, e->buf + 1024, 64);
		}
	}
	if (!target) {
		double sorted[PINGS];
		memcpy(sorted, rtt, sizeof(sorted));
		for (int i = 1; i < PINGS; i++) { /* insertion sort is fine for a few thousand values */
			double v = sorted[i];
			int j = i - 1;
			while (j >= 0 && sorted[j] > v) {
				sorted[j + 1] = sorted[j];
				j--;
			}
			sorted[j + 1] = v;
		}
		printf("     SEND ping-pong, %d round trips: median %.1f us, p99 %.1f us, p99.9 %.1f us, max %.1f us\n",
		       PINGS, sorted[PINGS / 2] * 1e3, sorted[PINGS * 99 / 100] * 1e3, sorted[PINGS * 999 / 1000] * 1e3,
		       sorted[PINGS - 1] * 1e3);
	}
	sync_peer(e->sock);
	close_end(e);
}

static void pingpong_init(struct end *e)
{
	pingpong_run(e, 0);
}

static void pingpong_target(struct end *e)
{
	pingpong_run(e, 1);
}

/* completion channel: an armed CQ fires once; a CQ too small overruns with IBV_EVENT_CQ_ERR */
static void cqs_init(struct end *e)
{
	open_end(e, 4096, ALL_ACCESS, 0, 0);
	struct ibv_comp_channel *ch = ibv_create_comp_channel(e->ctx);
	CHECK(ch);
	struct ibv_cq *ccq = ibv_create_cq(e->ctx, 16, (void *)0x1234, ch, 0);
	struct ibv_cq *tiny = ibv_create_cq(e->ctx, 1, NULL, NULL, 0);
	CHECK(ccq && tiny && tiny->cqe >= 1);
	struct ibv_qp_init_attr qa = {.send_cq = ccq, .recv_cq = tiny, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp *qp = ibv_create_qp(e->pd, &qa);
	CHECK(qp);
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1,
				.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE};
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
	struct end lo = *e;
	lo.qp = qp;
	struct info me = my_info(e);
	me.qpn = qp->qp_num;
	rtr_rts(&lo, &me, 14, 7); /* loopback */
	CHECK(ibv_req_notify_cq(ccq, 0) == 0);
	post(&lo, IBV_WR_RDMA_WRITE, 1, e->buf, 8, e->mr->lkey, (uintptr_t)e->buf + 64, e->mr->rkey,
	     IBV_SEND_SIGNALED, 0);
	struct pollfd pfd = {.fd = ch->fd, .events = POLLIN};
	CHECK(poll(&pfd, 1, 5000) == 1);
	struct ibv_cq *evcq;
	void *evctx;
	CHECK(ibv_get_cq_event(ch, &evcq, &evctx) == 0);
	CHECK(evcq == ccq && evctx == (void *)0x1234);
	ibv_ack_cq_events(ccq, 1);
	expect_wc(ccq, 1, IBV_WC_SUCCESS, NULL);
	/* not re-armed: a second completion raises no event */
	post(&lo, IBV_WR_RDMA_WRITE, 2, e->buf, 8, e->mr->lkey, (uintptr_t)e->buf + 64, e->mr->rkey,
	     IBV_SEND_SIGNALED, 0);
	expect_wc(ccq, 2, IBV_WC_SUCCESS, NULL);
	CHECK(poll(&pfd, 1, 100) == 0);
	/* eight receives completed into a CQ of (at least) one entry that nobody polls */
	for (int i = 0; i < 8; i++)
		post_recv(&lo, (uint64_t)i, e->buf + 1024, 64);
	for (int i = 0; i < 8; i++)
		post(&lo, IBV_WR_SEND, 10 + (uint64_t)i, e->buf, 8, e->mr->lkey, 0, 0, 0, 0);
	pfd.fd = e->ctx->async_fd;
	CHECK(poll(&pfd, 1, 5000) == 1);
	struct ibv_async_event ev;
	CHECK(ibv_get_async_event(e->ctx, &ev) == 0);
	CHECK(ev.event_type == IBV_EVENT_CQ_ERR && ev.element.cq == tiny);
	ibv_ack_async_event(&ev);
	CHECK(ibv_destroy_cq(ccq) == EBUSY); /* still used by the QP */
	CHECK(ibv_destroy_qp(qp) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == EBUSY); /* still used by the CQ */
	CHECK(ibv_destroy_cq(ccq) == 0);
	CHECK(ibv_destroy_cq(tiny) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == 0);
	close_end(e);
	sync_peer(e->sock);
}

/* a SEND longer than the receive: LOC_LEN_ERR on the target's receive, REM_INV_REQ_ERR at the
 * initiator, IBV_EVENT_QP_REQ_ERR at the target */
static void toolong_init(struct end *e)
{
	open_end(e, 1 << 16, ALL_ACCESS, 0, 0);
	pair_up(e, 14, 7);
	post(e, IBV_WR_SEND, 1, e->buf, 100, e->mr->lkey, 0, 0, IBV_SEND_SIGNALED, 0);
	post(e, IBV_WR_SEND, 2, e->buf, 200, e->mr->lkey, 0, 0, IBV_SEND_SIGNALED, 0);
	expect_wc(e->scq, 1, IBV_WC_SUCCESS, NULL);
	expect_wc(e->scq, 2, IBV_WC_REM_INV_REQ_ERR, NULL);
	sync_peer(e->sock);
	close_end(e);
}

static void toolong_target(struct end *e)
{
	open_end(e, 1 << 16, ALL_ACCESS, 0, 0);
	post_recv(e, 1, e->buf + 1000, 100);
	post_recv(e, 2, e->buf + 2000, 100);
	post_recv(e, 3, e->buf + 3000, 100);
	pair_up(e, 14, 7);
	struct ibv_wc wc;
	expect_wc(e->rcq, 1, IBV_WC_SUCCESS, &wc);
	CHECK(wc.byte_len == 100);
	expect_wc(e->rcq, 2, IBV_WC_LOC_LEN_ERR, NULL);
	expect_wc(e->rcq, 3, IBV_WC_WR_FLUSH_ERR, NULL);
	struct pollfd pfd = {.fd = e->ctx->async_fd, .events = POLLIN};
	CHECK(poll(&pfd, 1, 5000) == 1);
	struct ibv_async_event ev;
	CHECK(ibv_get_async_event(e->ctx, &ev) == 0);
	CHECK(ev.event_type == IBV_EVENT_QP_REQ_ERR && ev.element.qp == e->qp);
	ibv_ack_async_event(&ev);
	for (int i = 0; i < 100; i++)
		CHECK(e->buf[2000 + i] == 0); /* nothing of the refused SEND landed */
	CHECK(guards_intact(e));
	sync_peer(e->sock);
	close_end(e);
}

/* NCCL 2.28.9's IB transport, replayed (src/transport/net_ib.cc): its QP capacities, access
 * flags and modify masks, relaxed-ordering MRs through ibv_reg_mr_iova2, ECE probed, the
 * receiver's CTS written into the sender's FIFO (signaled every 16th), receives without SGEs,
 * and the data as one RDMA_WRITE_WITH_IMM whose immediate is the size (0 bytes: no SGE) */
#define NCCL_MSGS 300
struct nccl_fifo_entry {
	uint64_t addr;
	uint32_t rkey;
	uint32_t size;
	uint64_t idx; /* written last by the CTS: the sender waits on it */
};

static struct ibv_qp *nccl_qp(struct end *e, int access)
{
	struct ibv_qp_init_attr qa;
	memset(&qa, 0, sizeof(qa));
	qa.send_cq = e->scq;
	qa.recv_cq = e->scq; /* one CQ for both, as NCCL */
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = 2 * 32;
	qa.cap.max_recv_wr = 32;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	qa.cap.max_inline_data = 0;
	struct ibv_qp *qp = ibv_create_qp(e->pd, &qa);
	CHECK(qp);
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = 1;
	a.qp_access_flags = (unsigned)access;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
	struct ibv_ece ece;
	int r = ibv_query_ece(qp, &ece);
	CHECK(r == 0 || r == EOPNOTSUPP);
	return qp;
}

static void nccl_connect(struct ibv_qp *qp, const struct info *peer)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_4096;
	a.dest_qp_num = peer->qpn;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 0;
	a.ah_attr.dlid = peer->lid;
	a.ah_attr.sl = 0;
	a.ah_attr.src_path_bits = 0;
	a.ah_attr.port_num = 1;
	CHECK(ibv_modify_qp(qp, &a,
			    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 20;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	CHECK(ibv_modify_qp(qp, &a,
			    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				    IBV_QP_MAX_QP_RD_ATOMIC) == 0);
}

static uint32_t nccl_size(int i)
{
	return i % 7 == 0 ? 0 : (uint32_t)((i * 2654435761u) % 200000);
}

static void nccl_run(struct end *e, int receiver)
{
	open_end(e, 256 * 1024, ALL_ACCESS, 0, 0);
	struct ibv_qp *qp = nccl_qp(e, receiver ? IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC
						 : IBV_ACCESS_REMOTE_WRITE);
	/* the FIFO lives in its own MR, the data buffer is registered with relaxed ordering */
	static struct nccl_fifo_entry fifo[NCCL_MSGS];
	memset(fifo, 0, sizeof(fifo));
	struct ibv_mr *fifo_mr = ibv_reg_mr(e->pd, fifo, sizeof(fifo),
					    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	CHECK(fifo_mr);
	uint8_t *data = malloc(200000);
	CHECK(data);
	struct ibv_mr *data_mr = ibv_reg_mr_iova2(e->pd, data, 200000, (uintptr_t)data,
						  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
							  IBV_ACCESS_REMOTE_READ | IBV_ACCESS_RELAXED_ORDERING);
	CHECK(data_mr);
	struct info mine = my_info(e), peer;
	mine.qpn = qp->qp_num;
	mine.addr2 = (uintptr_t)fifo;
	mine.rkey2 = fifo_mr->rkey;
	xwrite(e->sock, &mine, sizeof(mine));
	xread(e->sock, &peer, sizeof(peer));
	nccl_connect(qp, &peer);
	sync_peer(e->sock);
	struct ibv_wc wc;
	int n;
	if (receiver) {
		for (int i = 0; i < NCCL_MSGS; i++) {
			uint32_t size = nccl_size(i);
			struct ibv_recv_wr rwr, *rbad;
			memset(&rwr, 0, sizeof(rwr));
			rwr.wr_id = (uint64_t)i;
			rwr.sg_list = NULL;
			rwr.num_sge = 0;
			CHECK(ibv_post_recv(qp, &rwr, &rbad) == 0);
			memset(data, 0, size);
			/* the CTS: our buffer's address, rkey and size, into the sender's FIFO slot */
			struct nccl_fifo_entry *cts = (struct nccl_fifo_entry *)e->buf;
			cts->addr = (uintptr_t)data;
			cts->rkey = data_mr->rkey;
			cts->size = size;
			cts->idx = (uint64_t)i + 1;
			struct ibv_sge sge = {(uintptr_t)cts, sizeof(*cts), e->mr->lkey};
			struct ibv_send_wr wr, *bad;
			memset(&wr, 0, sizeof(wr));
			wr.wr_id = 1000000 + (uint64_t)i;
			wr.sg_list = &sge;
			wr.num_sge = 1;
			wr.opcode = IBV_WR_RDMA_WRITE;
			wr.send_flags = i % 16 == 15 ? IBV_SEND_SIGNALED : 0;
			wr.wr.rdma.remote_addr = peer.addr2 + (uint64_t)i * sizeof(struct nccl_fifo_entry);
			wr.wr.rdma.rkey = peer.rkey2;
			CHECK(ibv_post_send(qp, &wr, &bad) == 0);
			/* one CQ: the CTS completions and the data's receive arrive in any order */
			for (int got = 0; !got;) {
				while ((n = ibv_poll_cq(e->scq, 1, &wc)) == 0)
					;
				CHECK(n == 1 && wc.status == IBV_WC_SUCCESS);
				if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
					CHECK(wc.wr_id == (uint64_t)i && wc.imm_data == size && wc.qp_num == qp->qp_num);
					got = 1;
				} else {
					CHECK(wc.opcode == IBV_WC_RDMA_WRITE && wc.wr_id >= 1000000);
				}
			}
			for (uint32_t j = 0; j < size; j += 97)
				CHECK(data[j] == (uint8_t)(i + j));
		}
	} else {
		int unacked = 0;
		for (int i = 0; i < NCCL_MSGS; i++) {
			volatile struct nccl_fifo_entry *slot = &fifo[i];
			while (__atomic_load_n(&slot->idx, __ATOMIC_ACQUIRE) != (uint64_t)i + 1) {
				/* NCCL's proxy keeps polling its CQ while it waits */
				if ((n = ibv_poll_cq(e->scq, 1, &wc)) == 1) {
					CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_WRITE);
					unacked--;
				}
			}
			uint32_t size = slot->size;
			CHECK(size == nccl_size(i));
			for (uint32_t j = 0; j < size; j++)
				data[j] = (uint8_t)(i + j);
			struct ibv_sge sge = {(uintptr_t)data, size, data_mr->lkey};
			struct ibv_send_wr wr, *bad;
			memset(&wr, 0, sizeof(wr));
			wr.wr_id = (uint64_t)i;
			wr.sg_list = size ? &sge : NULL;
			wr.num_sge = size ? 1 : 0;
			wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
			wr.imm_data = size; /* NCCL's immediate: the size, in host order */
			wr.send_flags = IBV_SEND_SIGNALED;
			wr.wr.rdma.remote_addr = slot->addr;
			wr.wr.rdma.rkey = slot->rkey;
			CHECK(ibv_post_send(qp, &wr, &bad) == 0);
			unacked++;
			/* the data buffer is reused: wait for this send as NCCL waits for its request */
			while (unacked) {
				while ((n = ibv_poll_cq(e->scq, 1, &wc)) == 0)
					;
				CHECK(n == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_WRITE);
				unacked--;
			}
		}
	}
	sync_peer(e->sock);
	CHECK(ibv_destroy_qp(qp) == 0);
	CHECK(ibv_dereg_mr(fifo_mr) == 0);
	CHECK(ibv_dereg_mr(data_mr) == 0);
	free(data);
	close_end(e);
}

static void nccl_init(struct end *e)
{
	nccl_run(e, 0);
}

static void nccl_target(struct end *e)
{
	nccl_run(e, 1);
}

/* ------------------------------------------------------- failing a port -- */

/* Each role gives its device two ports (before its first verbs call: each role is its own
 * process) and connects a QP on port 1 (e->qp) and one on port 2 to the peer's. Their retry
 * budget: timeout 14 (4.096 us << 14 = 67.1 ms) x (retry_cnt 2 + 1) = 201.3 ms. */
#define CUT_TIMEOUT 14
#define CUT_RETRY 2
#define CUT_BUDGET_MS 201.3
#define CUT_SLACK_MS 2000.0 /* a loaded host's stalls; the fabric's timer adds up to 50 ms */
#define CUT_MEM (4u << 20)
#define CUT_CTL_LEN 64

static struct end on_qp(struct end *e, struct ibv_qp *qp)
{
	struct end q = *e;
	q.qp = qp;
	return q;
}

static struct ibv_port_attr port_attr(struct ibv_context *c, uint8_t port)
{
	struct ibv_port_attr pa;
	CHECK(ibv_query_port(c, port, &pa) == 0);
	return pa;
}

static enum ibv_qp_state qp_state(struct ibv_qp *qp)
{
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	CHECK(ibv_query_qp(qp, &qa, IBV_QP_STATE, &qi) == 0);
	return qa.qp_state;
}

/* the next async event within `ms`: 1, or 0 if none came */
static int next_async_event(struct ibv_context *c, struct ibv_async_event *ev, int ms)
{
	struct pollfd p = {.fd = c->async_fd, .events = POLLIN};
	if (poll(&p, 1, ms) != 1)
		return 0;
	CHECK(ibv_get_async_event(c, ev) == 0);
	ibv_ack_async_event(ev);
	return 1;
}

static void expect_port_err(struct ibv_context *c, int port, int ms)
{
	struct ibv_async_event ev;
	CHECK(next_async_event(c, &ev, ms));
	CHECK(ev.event_type == IBV_EVENT_PORT_ERR && ev.element.port_num == port);
}

/* qps[i] (bound to ports[i]) meets the peer's qps[i] */
static void pair_qps(struct end *e, struct ibv_qp **qps, const uint8_t *ports, int n, struct info *peer)
{
	struct info mine[4];
	CHECK(n <= 4);
	for (int i = 0; i < n; i++) {
		mine[i] = my_info(e);
		mine[i].qpn = qps[i]->qp_num;
		mine[i].lid = port_attr(e->ctx, ports[i]).lid;
	}
	xwrite(e->sock, mine, (size_t)n * sizeof(mine[0]));
	xread(e->sock, peer, (size_t)n * sizeof(peer[0]));
	for (int i = 0; i < n; i++) {
		struct end q = on_qp(e, qps[i]);
		rtr_rts(&q, &peer[i], CUT_TIMEOUT, CUT_RETRY);
	}
	sync_peer(e->sock);
}

static uint8_t cut_byte(size_t i, int who)
{
	return (uint8_t)(i * 31 + (size_t)who * 101 + i / 4093);
}

/* Both ends WRITE `len` bytes to each other's offset `at` over `qp`, then SEND 100 bytes behind
 * it into a receive at `at + len`; the SEND's arrival says the WRITE landed (RC order), and each
 * end checks what it got, byte for byte. `who`: 1 the initiator, 2 the target. */
static void move_data(struct end *e, struct ibv_qp *qp, const struct info *peer, size_t at, uint32_t len, int who)
{
	struct end q = on_qp(e, qp);
	for (size_t i = 0; i < len; i++)
		e->buf[i] = cut_byte(i, who);
	post_recv(&q, 500, e->buf + at + len, 4096);
	sync_peer(e->sock);
	post(&q, IBV_WR_RDMA_WRITE, 501, e->buf, len, e->mr->lkey, peer->addr + at, peer->rkey, IBV_SEND_SIGNALED, 0);
	post(&q, IBV_WR_SEND, 502, e->buf, 100, e->mr->lkey, 0, 0, IBV_SEND_SIGNALED, 0);
	expect_wc(e->scq, 501, IBV_WC_SUCCESS, NULL);
	expect_wc(e->scq, 502, IBV_WC_SUCCESS, NULL);
	struct ibv_wc wc;
	expect_wc(e->rcq, 500, IBV_WC_SUCCESS, &wc);
	CHECK(wc.byte_len == 100 && wc.qp_num == qp->qp_num);
	for (size_t i = 0; i < len; i++)
		CHECK(e->buf[at + i] == cut_byte(i, 3 - who));
	for (size_t i = 0; i < 100; i++)
		CHECK(e->buf[at + len + i] == cut_byte(i, 3 - who));
	sync_peer(e->sock);
}

/* a signaled WR's completion: RETRY_EXC_ERR, no sooner than the retry budget after `since`
 * (at or before the moment the link was cut, or the WR posted) and not much later */
static void expect_retry_exceeded(struct ibv_cq *cq, uint64_t wr_id, double since, const char *what)
{
	expect_wc(cq, wr_id, IBV_WC_RETRY_EXC_ERR, NULL);
	double dt = now_ms() - since;
	printf("     %s: RETRY_EXC_ERR after %.1f ms (retry budget %.1f ms)\n", what, dt, CUT_BUDGET_MS);
	CHECK(dt >= CUT_BUDGET_MS && dt < CUT_BUDGET_MS + CUT_SLACK_MS);
}

static void zero_at(const uint8_t *p, size_t len)
{
	for (size_t i = 0; i < len; i++)
		CHECK(p[i] == 0);
}

/* offsets of the regions both ends use */
#define AT_PORT1 (1u << 20)                 /* before the cut, port 1 */
#define AT_PORT2 ((1u << 20) + (128u << 10)) /* before the cut, port 2 */
#define AT_BEHIND ((1u << 20) + (256u << 10)) /* the WRITE behind the held SEND: never lands */
#define AT_AFTER (2u << 20)                 /* after the cut, port 2: 1 MiB */
#define AT_NEW ((3u << 20) + (256u << 10))  /* a QP created after the cut on a working port */
#define AT_NEW_CUT ((3u << 20) + (512u << 10)) /* ...and on the failed port: never lands */

/* port-fail: the target process commands the initiator's port 1 down through the initiator's
 * control file, from outside it. Both hold a SEND on the port-1 pair that the other end has no
 * receive for (RNR, rnr_retry 7: it would wait for ever); the initiator a WRITE behind it. The
 * initiator sees IBV_EVENT_PORT_ERR for port 1, the port DOWN, port 2 ACTIVE; its SEND completes
 * with RETRY_EXC_ERR after the retry budget counted from the command, the WRITE and the receives
 * it posted after the event flush, the QP is in ERR. The target, whose ports are fine, sees the
 * same on its end of the cut link, and no event. Port 2's pair moves 1 MiB each way byte-exact
 * afterwards; new QPs work where they are bound to a working port and time out on the failed one,
 * at both ends. */
static void port_fail_run(struct end *e, int who)
{
	char ctl[CUT_CTL_LEN] = "/tmp/fabtest-ctl.XXXXXX";
	int initiator = who == 1;
	if (initiator) {
		int fd = mkstemp(ctl);
		CHECK(fd >= 0);
		close(fd);
		setenv("RIVET_FABRIC_CTL", ctl, 1);
	}
	setenv("RIVET_FABRIC_PORTS", "2", 1);
	open_end(e, CUT_MEM, ALL_ACCESS, 0, 0);
	struct ibv_qp *qps[2] = {e->qp, mk_qp(e, e->scq, e->rcq, 2)};
	uint8_t ports[2] = {1, 2};
	struct info peer[2];
	pair_qps(e, qps, ports, 2, peer);
	if (initiator)
		xwrite(e->sock, ctl, sizeof(ctl));
	else
		xread(e->sock, ctl, sizeof(ctl));
	move_data(e, qps[0], &peer[0], AT_PORT1, 64 << 10, who);
	move_data(e, qps[1], &peer[1], AT_PORT2, 64 << 10, who);

	struct end q1 = on_qp(e, qps[0]);
	double t_cut;
	if (initiator) {
		post(&q1, IBV_WR_SEND, 10, e->buf, 64, e->mr->lkey, 0, 0, IBV_SEND_SIGNALED, 0);
		post(&q1, IBV_WR_RDMA_WRITE, 11, e->buf, 64, e->mr->lkey, peer[0].addr + AT_BEHIND, peer[0].rkey,
		     IBV_SEND_SIGNALED, 0);
		expect_no_wc(e->scq, 50);
		sync_peer(e->sock);
		xread(e->sock, &t_cut, sizeof(t_cut));
		/* nothing but the control file told this process: its progress thread found the line */
		expect_port_err(e->ctx, 1, 5000);
		printf("     IBV_EVENT_PORT_ERR %.1f ms after the command\n", now_ms() - t_cut);
		struct ibv_port_attr pa = port_attr(e->ctx, 1);
		CHECK(pa.state == IBV_PORT_DOWN && pa.phys_state == 2);
		CHECK(port_attr(e->ctx, 2).state == IBV_PORT_ACTIVE);
		/* the target's held SEND does not take these: nothing arrives on a cut link */
		post_recv(&q1, 20, e->buf, 64);
		post_recv(&q1, 21, e->buf, 64);
		expect_retry_exceeded(e->scq, 10, t_cut, "port 1 failed, SEND outstanding");
		expect_wc(e->scq, 11, IBV_WC_WR_FLUSH_ERR, NULL);
		expect_wc(e->rcq, 20, IBV_WC_WR_FLUSH_ERR, NULL);
		expect_wc(e->rcq, 21, IBV_WC_WR_FLUSH_ERR, NULL);
	} else {
		sync_peer(e->sock);
		post(&q1, IBV_WR_SEND, 30, e->buf, 64, e->mr->lkey, 0, 0, IBV_SEND_SIGNALED, 0);
		expect_no_wc(e->scq, 50);
		t_cut = now_ms();
		int fd = open(ctl, O_WRONLY | O_APPEND);
		CHECK(fd >= 0);
		CHECK(dprintf(fd, "fail-port %s 1\n", ibv_get_device_name(e->ctx->device)) > 0);
		close(fd);
		xwrite(e->sock, &t_cut, sizeof(t_cut));
		expect_retry_exceeded(e->scq, 30, t_cut, "peer's port 1 failed, SEND outstanding");
		CHECK(port_attr(e->ctx, 1).state == IBV_PORT_ACTIVE && port_attr(e->ctx, 2).state == IBV_PORT_ACTIVE);
	}
	CHECK(qp_state(qps[0]) == IBV_QPS_ERR);
	post(&q1, IBV_WR_RDMA_WRITE, 12, e->buf, 64, e->mr->lkey, peer[0].addr, peer[0].rkey, IBV_SEND_SIGNALED, 0);
	expect_wc(e->scq, 12, IBV_WC_WR_FLUSH_ERR, NULL);
	expect_no_wc(e->rcq, 0);
	sync_peer(e->sock);
	if (!initiator)
		zero_at(e->buf + AT_BEHIND, 64);

	/* the surviving port */
	move_data(e, qps[1], &peer[1], AT_AFTER, 1 << 20, who);

	/* new QPs: the initiator's on port 2 and on the failed port 1, the target's on 1 and 2 */
	uint8_t new_ports[2] = {(uint8_t)(initiator ? 2 : 1), (uint8_t)(initiator ? 1 : 2)};
	struct ibv_qp *fresh[2] = {mk_qp(e, e->scq, e->rcq, new_ports[0]), mk_qp(e, e->scq, e->rcq, new_ports[1])};
	struct info fpeer[2];
	pair_qps(e, fresh, new_ports, 2, fpeer);
	move_data(e, fresh[0], &fpeer[0], AT_NEW, 64 << 10, who);
	struct end q4 = on_qp(e, fresh[1]);
	double t_post = now_ms();
	post(&q4, IBV_WR_RDMA_WRITE, 40, e->buf, 64, e->mr->lkey, fpeer[1].addr + AT_NEW_CUT, fpeer[1].rkey,
	     IBV_SEND_SIGNALED, 0);
	expect_retry_exceeded(e->scq, 40, t_post,
			      initiator ? "new QP on the failed port" : "new QP facing the failed port");
	CHECK(qp_state(fresh[1]) == IBV_QPS_ERR);
	sync_peer(e->sock);
	zero_at(e->buf + AT_NEW_CUT, 64);
	CHECK(port_attr(e->ctx, 2).state == IBV_PORT_ACTIVE);
	struct ibv_async_event ev;
	CHECK(!next_async_event(e->ctx, &ev, 0)); /* one PORT_ERR at the initiator, none at the target */
	CHECK(guards_intact(e));
	sync_peer(e->sock);
	for (int i = 0; i < 2; i++)
		CHECK(ibv_destroy_qp(fresh[i]) == 0);
	CHECK(ibv_destroy_qp(qps[1]) == 0);
	close_end(e);
	if (initiator)
		unlink(ctl);
}

static void port_fail_init(struct end *e)
{
	port_fail_run(e, 1);
}

static void port_fail_target(struct end *e)
{
	port_fail_run(e, 2);
}

/* port-fail-after-wr: RIVET_FABRIC_FAIL_PORT=<dev>:1@100wr in the initiator, which streams 120
 * signaled 4 KiB WRITEs on each port's QP, interleaved; the first 50 of each complete before it
 * posts the rest. Port 1's QP then completes some more in order, then one with RETRY_EXC_ERR after
 * the retry budget, then flushes; the 100th never succeeds, and it and those after it never land
 * (a WR the target executed whose ACK was still on the way may fail too, as on a cut cable).
 * Every WRITE that succeeded landed byte-exact, and port 2's 120 all succeed. The target's next
 * WRITE on its port-1 QP times out too; port 2 still moves data both ways. */
#define WR_STREAM 120
#define WR_SETTLED 50
#define WR_FAIL_AT 100
#define WR_LEN 4096u
#define AT_STREAM1 (1u << 20)
#define AT_STREAM2 (2u << 20)

/* WRITEs [from, to) on both QPs, interleaved; *t_cut: the time before port 1's WR_FAIL_AT-th */
static void post_stream(struct end *e, struct ibv_qp **qps, const struct info *peer, int from, int to,
			double *t_cut)
{
	for (int i = from; i < to; i++)
		for (int k = 0; k < 2; k++) {
			struct end q = on_qp(e, qps[k]);
			uint64_t at = (k ? AT_STREAM2 : AT_STREAM1) + (uint64_t)i * WR_LEN;
			if (k == 0 && i == WR_FAIL_AT - 1)
				*t_cut = now_ms();
			post(&q, IBV_WR_RDMA_WRITE, (uint64_t)(k * 1000 + i), e->buf + (size_t)i * WR_LEN, WR_LEN,
			     e->mr->lkey, peer[k].addr + at, peer[k].rkey, IBV_SEND_SIGNALED, 0);
		}
}

static void fail_after_wr_run(struct end *e, int who)
{
	int initiator = who == 1;
	setenv("RIVET_FABRIC_PORTS", "2", 1);
	if (initiator) {
		char v[64];
		snprintf(v, sizeof(v), "rfab0:1@%dwr", WR_FAIL_AT);
		setenv("RIVET_FABRIC_FAIL_PORT", v, 1);
	}
	open_end(e, CUT_MEM, ALL_ACCESS, 0, 0);
	struct ibv_qp *qps[2] = {e->qp, mk_qp(e, e->scq, e->rcq, 2)};
	uint8_t ports[2] = {1, 2};
	struct info peer[2];
	pair_qps(e, qps, ports, 2, peer);
	int ok1 = WR_SETTLED;
	if (initiator) {
		for (size_t i = 0; i < WR_STREAM * WR_LEN; i++)
			e->buf[i] = cut_byte(i, who);
		double t_cut = 0;
		struct ibv_wc wc;
		post_stream(e, qps, peer, 0, WR_SETTLED, &t_cut);
		for (int got = 0; got < 2 * WR_SETTLED; got++) {
			CHECK(poll_wc(e->scq, &wc, 5000));
			CHECK(wc.status == IBV_WC_SUCCESS);
		}
		post_stream(e, qps, peer, WR_SETTLED, WR_STREAM, &t_cut);
		int next[2] = {WR_SETTLED, WR_SETTLED}, failed = 0;
		for (int got = 0; got < 2 * (WR_STREAM - WR_SETTLED); got++) {
			CHECK(poll_wc(e->scq, &wc, 5000));
			int k = wc.qp_num == qps[1]->qp_num;
			CHECK(wc.wr_id == (uint64_t)(k * 1000 + next[k]));
			next[k]++;
			if (k == 1 || (!failed && wc.status == IBV_WC_SUCCESS)) {
				CHECK(wc.status == IBV_WC_SUCCESS);
				ok1 += !k;
				continue;
			}
			if (!failed) {
				double dt = now_ms() - t_cut;
				printf("     port 1 failed at its WR %d: %d WRs succeeded, the next RETRY_EXC_ERR after %.1f ms "
				       "(retry budget %.1f ms)\n",
				       WR_FAIL_AT, ok1, dt, CUT_BUDGET_MS);
				CHECK(wc.status == IBV_WC_RETRY_EXC_ERR);
				CHECK(dt >= CUT_BUDGET_MS && dt < CUT_BUDGET_MS + CUT_SLACK_MS);
				failed = 1;
			} else {
				CHECK(wc.status == IBV_WC_WR_FLUSH_ERR);
			}
		}
		CHECK(failed && ok1 < WR_FAIL_AT);
		CHECK(qp_state(qps[0]) == IBV_QPS_ERR && qp_state(qps[1]) == IBV_QPS_RTS);
		CHECK(port_attr(e->ctx, 1).state == IBV_PORT_DOWN && port_attr(e->ctx, 2).state == IBV_PORT_ACTIVE);
		expect_port_err(e->ctx, 1, 5000);
		xwrite(e->sock, &ok1, sizeof(ok1));
	} else {
		xread(e->sock, &ok1, sizeof(ok1));
		for (int i = 0; i < WR_STREAM; i++)
			for (size_t j = 0; j < WR_LEN; j++) {
				size_t src = (size_t)i * WR_LEN + j;
				CHECK(e->buf[AT_STREAM2 + src] == cut_byte(src, 3 - who));
				if (i < ok1)
					CHECK(e->buf[AT_STREAM1 + src] == cut_byte(src, 3 - who));
				else if (i >= WR_FAIL_AT - 1)
					CHECK(e->buf[AT_STREAM1 + src] == 0);
			}
		struct end q1 = on_qp(e, qps[0]);
		double t_post = now_ms();
		post(&q1, IBV_WR_RDMA_WRITE, 50, e->buf, 64, e->mr->lkey, peer[0].addr, peer[0].rkey, IBV_SEND_SIGNALED, 0);
		expect_retry_exceeded(e->scq, 50, t_post, "peer's port 1 failed, next WRITE");
		CHECK(qp_state(qps[0]) == IBV_QPS_ERR);
	}
	sync_peer(e->sock);
	move_data(e, qps[1], &peer[1], AT_AFTER, 1 << 20, who);
	CHECK(guards_intact(e));
	CHECK(ibv_destroy_qp(qps[1]) == 0);
	close_end(e);
}

static void fail_after_wr_init(struct end *e)
{
	fail_after_wr_run(e, 1);
}

static void fail_after_wr_target(struct end *e)
{
	fail_after_wr_run(e, 2);
}

/* port-fail-after-ms: RIVET_FABRIC_FAIL_PORT=<dev>:2@300ms in the initiator: IBV_EVENT_PORT_ERR
 * for port 2 no sooner than 300 ms after the fabric initialised, found by the progress thread
 * alone; port 2 DOWN, port 1 ACTIVE; a WRITE on port 2's QP times out. Then, from inside the
 * process, a "fail-port <dev> 1" line in its own control file: the next ibv_query_port finds
 * port 1 DOWN, its PORT_ERR is already queued, and a WRITE on port 1's QP times out too. */
#define MS_FAIL_AT 300.0

static void fail_after_ms_init(struct end *e)
{
	char ctl[] = "/tmp/fabtest-ctl.XXXXXX";
	int fd = mkstemp(ctl);
	CHECK(fd >= 0);
	close(fd);
	setenv("RIVET_FABRIC_CTL", ctl, 1);
	setenv("RIVET_FABRIC_PORTS", "2", 1);
	setenv("RIVET_FABRIC_FAIL_PORT", "rfab0:2@300ms", 1);
	double t_init = now_ms(); /* open_end's ibv_get_device_list initialises the fabric */
	open_end(e, CUT_MEM, ALL_ACCESS, 0, 0);
	struct ibv_qp *qps[2] = {e->qp, mk_qp(e, e->scq, e->rcq, 2)};
	uint8_t ports[2] = {1, 2};
	struct info peer[2];
	pair_qps(e, qps, ports, 2, peer);
	expect_port_err(e->ctx, 2, 5000);
	double dt = now_ms() - t_init;
	printf("     RIVET_FABRIC_FAIL_PORT=rfab0:2@300ms: IBV_EVENT_PORT_ERR after %.1f ms\n", dt);
	CHECK(dt >= MS_FAIL_AT && dt < MS_FAIL_AT + CUT_SLACK_MS);
	CHECK(port_attr(e->ctx, 2).state == IBV_PORT_DOWN && port_attr(e->ctx, 1).state == IBV_PORT_ACTIVE);
	struct end q2 = on_qp(e, qps[1]);
	double t_post = now_ms();
	post(&q2, IBV_WR_RDMA_WRITE, 60, e->buf, 64, e->mr->lkey, peer[1].addr, peer[1].rkey, IBV_SEND_SIGNALED, 0);
	expect_retry_exceeded(e->scq, 60, t_post, "port 2 failed by time, next WRITE");

	fd = open(ctl, O_WRONLY | O_APPEND);
	CHECK(fd >= 0);
	CHECK(dprintf(fd, "# from inside the process\nfail-port rfab0 1\n") > 0);
	close(fd);
	CHECK(port_attr(e->ctx, 1).state == IBV_PORT_DOWN);
	expect_port_err(e->ctx, 1, 0);
	t_post = now_ms();
	post(e, IBV_WR_RDMA_WRITE, 61, e->buf, 64, e->mr->lkey, peer[0].addr, peer[0].rkey, IBV_SEND_SIGNALED, 0);
	expect_retry_exceeded(e->scq, 61, t_post, "port 1 failed from inside, next WRITE");
	sync_peer(e->sock);
	CHECK(ibv_destroy_qp(qps[1]) == 0);
	close_end(e);
	unlink(ctl);
}

static void fail_after_ms_target(struct end *e)
{
	setenv("RIVET_FABRIC_PORTS", "2", 1);
	open_end(e, CUT_MEM, ALL_ACCESS, 0, 0);
	struct ibv_qp *qps[2] = {e->qp, mk_qp(e, e->scq, e->rcq, 2)};
	uint8_t ports[2] = {1, 2};
	struct info peer[2];
	pair_qps(e, qps, ports, 2, peer);
	sync_peer(e->sock);
	zero_at(e->buf, 64); /* neither WRITE landed */
	CHECK(ibv_destroy_qp(qps[1]) == 0);
	close_end(e);
}

/* device, port, GID, sysfs tree */
static void device_init(struct end *e)
{
	int n;
	struct ibv_device **l = ibv_get_device_list(&n);
	CHECK(l && n >= 1);
	struct ibv_context *c = ibv_open_device(l[0]);
	CHECK(c);
	struct ibv_port_attr pa;
	CHECK(ibv_query_port(c, 1, &pa) == 0);
	CHECK(pa.state == IBV_PORT_ACTIVE && pa.link_layer == IBV_LINK_LAYER_INFINIBAND && pa.lid != 0);
	CHECK(ibv_query_port(c, 2, &pa) != 0);
	struct ibv_device_attr da;
	CHECK(ibv_query_device(c, &da) == 0 && da.phys_port_cnt == 1);
	union ibv_gid gid;
	CHECK(ibv_query_gid(c, 1, 0, &gid) == 0 && gid.raw[0] == 0xfe && gid.raw[1] == 0x80);
	char path[512], buf[64];
	snprintf(path, sizeof(path), "%s/ports/1/link_layer", l[0]->ibdev_path);
	FILE *f = fopen(path, "r");
	CHECK(f && fgets(buf, sizeof(buf), f) && strcmp(buf, "InfiniBand\n") == 0);
	fclose(f);
	snprintf(path, sizeof(path), "%s/device/numa_node", l[0]->ibdev_path);
	struct stat st;
	CHECK(stat(path, &st) == 0);
	CHECK(ibv_close_device(c) == 0);
	ibv_free_device_list(l);
	sync_peer(e->sock);
}

static void device_target(struct end *e)
{
	sync_peer(e->sock);
}

int main(int argc, char **argv)
{
	int fails = 0;
	setvbuf(stdout, NULL, _IOLBF, 0);
	struct {
		const char *name;
		role_fn init, target;
		int bad;
	} cases[] = {
		{"device", device_init, device_target, -1},
		{"states", states_init, states_target, -1},
		{"opcodes", opcodes_init, opcodes_target, -1},
		{"atomics", atomics_init, atomics_target, -1},
		{"cq-channel-overrun", cqs_init, states_target, -1},
		{"send-too-long", toolong_init, toolong_target, -1},
		{"order", order_init, order_target, -1},
		{"srq-rnr", srq_init, srq_target, -1},
		{"access-bad-rkey", access_init, access_target, BAD_RKEY},
		{"access-out-of-bounds", access_init, access_target, BAD_BOUNDS},
		{"access-no-remote-write", access_init, access_target, BAD_NO_RW},
		{"access-no-remote-read", access_init, access_target, BAD_NO_RR},
		{"access-read-out-of-bounds", access_init, access_target, BAD_READ_BOUNDS},
		{"local-prot", lkey_init, lkey_target, -1},
		{"nccl-pattern", nccl_init, nccl_target, -1},
		{"threads", threads_init, threads_target, -1},
		{"pingpong", pingpong_init, pingpong_target, -1},
		{"many-qps", many_init, many_target, -1},
		{"peer-killed", killed_init, killed_target, -1},
		{"peer-killed-idle", killed_idle_init, killed_target, -1},
		{"peer-killed-forked", killed_forked_init, killed_forked_target, -1},
		{"peer-stopped", stopped_init, killed_target, -1},
		{"err-drain", err_drain_init, err_drain_target, DRAIN_BY_MODIFY},
		{"err-drain-local-error", err_drain_init, err_drain_target, DRAIN_BY_LOCAL_ERROR},
		{"rnr-forever", rnr_init, rnr_target, 7},
		{"rnr-in-time", rnr_init, rnr_target, RNR_IN_TIME},
		{"rnr-retry-exceeded-0", rnr_init, rnr_target, 0},
		{"rnr-retry-exceeded-3", rnr_init, rnr_target, 3},
		{"rnr-retry-exceeded-6", rnr_init, rnr_target, 6},
		{"port-fail", port_fail_init, port_fail_target, -1},
		{"port-fail-after-wr", fail_after_wr_init, fail_after_wr_target, -1},
		{"port-fail-after-ms", fail_after_ms_init, fail_after_ms_target, -1},
	};
	if (argc == 2 && strcmp(argv[1], "--list") == 0) {
		for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
			printf("%s\n", cases[i].name);
		return 0;
	}
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int want = argc == 1;
		for (int a = 1; a < argc; a++)
			want |= strcmp(argv[a], cases[i].name) == 0;
		if (!want)
			continue;
		if (cases[i].bad >= 0)
			bad_case = (enum bad_kind)cases[i].bad;
		case_param = cases[i].bad;
		fails += run_pair(cases[i].name, cases[i].init, cases[i].target);
	}
	return fails ? 1 : 0;
}
