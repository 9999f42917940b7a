/*
 * The transport: each QP owns an abstract Unix listening socket named after its
 * QPN (the kernel keeps names unique and frees them when the process dies). At
 * RTR a QP connects to its peer's socket: the connection it makes carries its
 * requests and the peer's responses ("out"); the one it accepts carries the
 * peer's requests and its responses ("in"). A responder checks every request
 * against its own registered regions and places the data itself. One progress
 * thread per open device reads the sockets (epoll); posting threads write
 * requests directly when the socket has room.
 */
#include "fabric.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static struct fab_context *qctx(struct fab_qp *qp)
{
	return fab_ctx(qp->qp.context);
}

static int epfd_of(struct fab_sock *s)
{
	return s->kind == FAB_SK_WAKE ? -1 : qctx(s->qp)->epfd;
}

void fab_sock_set_events(struct fab_sock *s, uint32_t ev)
{
	if (s->fd < 0 || s->ev == ev)
		return;
	struct epoll_event e = {.events = ev, .data.ptr = s};
	if (epoll_ctl(epfd_of(s), EPOLL_CTL_MOD, s->fd, &e) == 0)
		s->ev = ev;
}

static void sock_clear(struct fab_sock *s)
{
	size_t from = __builtin_offsetof(struct fab_sock, fd);
	memset((char *)s + from, 0, sizeof(*s) - from);
	s->fd = -1;
}

void fab_sock_init(struct fab_sock *s, int kind, struct fab_qp *qp)
{
	s->kind = kind;
	s->qp = qp;
	sock_clear(s);
}

static int sock_open(struct fab_sock *s, int fd, uint32_t ev)
{
	int kind = s->kind;
	struct fab_qp *qp = s->qp;
	sock_clear(s);
	s->fd = fd;
	s->rstate = kind == FAB_SK_IN ? FAB_RS_HELLO : FAB_RS_HDR;
	s->last_ns = fab_now_ns();
	if (kind == FAB_SK_IN || kind == FAB_SK_OUT) {
		s->st = malloc(FAB_STAGE);
		if (!s->st)
			return ENOMEM;
	}
	struct epoll_event e = {.events = ev, .data.ptr = s};
	if (epoll_ctl(qctx(qp)->epfd, EPOLL_CTL_ADD, fd, &e)) {
		int err = errno;
		free(s->st);
		s->st = NULL;
		return err;
	}
	s->ev = ev;
	return 0;
}

static void sock_close(struct fab_sock *s)
{
	if (s->fd >= 0) {
		epoll_ctl(qctx(s->qp)->epfd, EPOLL_CTL_DEL, s->fd, NULL);
		close(s->fd);
	}
	free(s->st);
	sock_clear(s);
}

/* DEL before close: a forked child may hold the same socket open, and epoll would keep
 * reporting it, with a pointer into a freed QP */
void fab_qp_close_listen(struct fab_qp *qp)
{
	if (qp->lsn.fd >= 0)
		sock_close(&qp->lsn);
}

void fab_qp_close_socks(struct fab_qp *qp)
{
	if (qp->in.fd >= 0)
		sock_close(&qp->in);
	if (qp->out.fd >= 0)
		sock_close(&qp->out);
}

static void qp_sockaddr(uint32_t qpn, struct sockaddr_un *a, socklen_t *len)
{
	memset(a, 0, sizeof(*a));
	a->sun_family = AF_UNIX;
	/* one QPN space per host (network namespace), as on one HCA; no uid in the name, so
	 * processes inside and outside a user namespace (unshare -r) still find each other */
	int n = snprintf(a->sun_path + 1, sizeof(a->sun_path) - 1, "rivet-fabric.qp.%u", qpn);
	*len = (socklen_t)(__builtin_offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

int fab_qp_listen(struct fab_qp *qp)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return errno;
	for (int tries = 0;; tries++) {
		uint32_t r;
		if (getrandom(&r, sizeof(r), 0) != (ssize_t)sizeof(r))
			r = (uint32_t)rand();
		uint32_t qpn = 0x100 + r % (0xffffffu - 0x100);
		struct sockaddr_un a;
		socklen_t len;
		qp_sockaddr(qpn, &a, &len);
		if (bind(fd, (struct sockaddr *)&a, len) == 0) {
			qp->qp.qp_num = qpn;
			break;
		}
		if (errno != EADDRINUSE || tries > 1000) {
			int e = errno;
			close(fd);
			return e;
		}
	}
	if (listen(fd, 16)) {
		int e = errno;
		close(fd);
		return e;
	}
	return sock_open(&qp->lsn, fd, EPOLLIN);
}

static uint16_t my_lid(struct fab_qp *qp)
{
	return fab_lid(qctx(qp)->fdev->index, qp->port ? qp->port : 1);
}

static uint16_t dest_lid(struct fab_qp *qp)
{
	if (!fab_config()->eth)
		return qp->ah.dlid;
	const uint8_t *g = qp->ah.grh.dgid.raw;
	static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	if (!qp->ah.is_global || memcmp(g, mapped, 12) || g[12] != 127 || g[13] != 0)
		return 0xffff;
	return fab_lid(g[14], g[15]);
}

int fab_qp_connect(struct fab_qp *qp)
{
	if (qp->out.fd >= 0)
		return 0;
	qp->link_down = 0;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		goto down;
	struct sockaddr_un a;
	socklen_t len;
	qp_sockaddr(qp->dest_qpn, &a, &len);
	int sz = 4 << 20;
	setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
	if (connect(fd, (struct sockaddr *)&a, len)) {
		fab_log("QP %u: no QP %u to connect to (%s)", qp->qp.qp_num, qp->dest_qpn, strerror(errno));
		close(fd);
		goto down;
	}
	struct fab_wire_hello h = {.magic = FAB_HELLO_MAGIC,
				   .src_qpn = qp->qp.qp_num,
				   .dst_qpn = qp->dest_qpn,
				   .dst_lid = dest_lid(qp),
				   .src_lid = my_lid(qp)};
	if (send(fd, &h, sizeof(h), MSG_NOSIGNAL) != (ssize_t)sizeof(h)) {
		close(fd);
		goto down;
	}
	if (fcntl(fd, F_SETFL, O_NONBLOCK)) {
		close(fd);
		goto down;
	}
	if (sock_open(&qp->out, fd, EPOLLIN)) {
		close(fd);
		qp->out.fd = -1;
		goto down;
	}
	struct ucred cred;
	socklen_t cl = sizeof(cred);
	qp->out_peer_pid = getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0 ? cred.pid : 0;
	return 0;
down:
	qp->link_down = 1;
	return -1;
}

/* ------------------------------------------------------------- helpers -- */

/* What a read that moved no bytes (r <= 0) means to a stream reader: -1 the peer closed or the
 * socket failed, 0 nothing more for now (it would block), 1 interrupted: read again. */
static int recv_nothing(ssize_t r)
{
	if (r == 0)
		return -1;
	if (errno == EAGAIN || errno == EWOULDBLOCK)
		return 0;
	return errno == EINTR ? 1 : -1;
}

/* make `need` bytes available in the stage: 1 yes, 0 would block, -1 EOF or error */
static int stage_fill(struct fab_sock *s, uint32_t need)
{
	while (s->se - s->sb < need) {
		if (s->sb + need > FAB_STAGE || s->se == FAB_STAGE) {
			memmove(s->st, s->st + s->sb, s->se - s->sb);
			s->se -= s->sb;
			s->sb = 0;
		}
		/* a few KiB at a time: enough for a batch of small requests, while the
		 * bulk of a large payload goes straight to its destination (place()) */
		uint32_t room = FAB_STAGE - s->se;
		uint32_t want = room < FAB_STAGE_READ ? room : FAB_STAGE_READ;
		if (s->rd_capped) {
			if (s->rd_left == 0)
				return 0;
			if (want > s->rd_left)
				want = (uint32_t)s->rd_left;
		}
		ssize_t r = recv(s->fd, s->st + s->se, want, MSG_DONTWAIT);
		if (r > 0) {
			s->se += (uint32_t)r;
			if (s->rd_capped)
				s->rd_left -= (uint64_t)r;
			s->last_ns = fab_now_ns();
		} else {
			int why = recv_nothing(r);
			if (why <= 0)
				return why;
		}
	}
	return 1;
}

/* local address of the current destination segment chunk, or NULL if the region is gone */
static void *dst_va(struct fab_sock *s, uint32_t take)
{
	struct fab_dseg *d = &s->dst[s->di];
	if (d->key == 0)
		return (void *)(uintptr_t)(d->addr + s->doff);
	uint64_t va;
	struct fab_qp *qp = s->qp;
	if (fab_mr_find(qctx(qp), qp->qp.pd, d->key, d->addr + s->doff, take, s->pay_key_access, &va))
		return NULL;
	return (void *)(uintptr_t)va;
}

static void dst_advance(struct fab_sock *s, uint32_t n)
{
	s->remaining -= n;
	while (n) {
		uint32_t left = s->dst[s->di].len - s->doff;
		uint32_t t = n < left ? n : left;
		s->doff += t;
		n -= t;
		if (s->doff == s->dst[s->di].len) {
			s->di++;
			s->doff = 0;
		}
	}
	while (s->di < s->ndst && s->dst[s->di].len == 0)
		s->di++;
}

/* place the current payload: 1 done, 0 would block, -1 EOF/error, -2 destination region gone */
static int place(struct fab_sock *s)
{
	struct fab_context *ctx = qctx(s->qp);
	while (s->remaining) {
		uint32_t avail = s->se - s->sb;
		if (avail) {
			uint32_t n = avail < s->remaining ? avail : (uint32_t)s->remaining;
			if (s->discard) {
				s->sb += n;
				s->remaining -= n;
				continue;
			}
			pthread_rwlock_rdlock(&ctx->mr_lock);
			while (n) {
				uint32_t left = s->dst[s->di].len - s->doff;
				uint32_t t = n < left ? n : left;
				void *va = dst_va(s, t);
				if (!va) {
					pthread_rwlock_unlock(&ctx->mr_lock);
					return -2;
				}
				memcpy(va, s->st + s->sb, t);
				s->sb += t;
				n -= t;
				dst_advance(s, t);
			}
			pthread_rwlock_unlock(&ctx->mr_lock);
			continue;
		}
		if (s->remaining < 16384 || s->discard) {
			int r = stage_fill(s, 1);
			if (r <= 0)
				return r;
			continue;
		}
		/* large remainder: straight from the socket into the destination */
		struct iovec iov[FAB_MAX_SGE];
		int k = 0;
		uint64_t want = s->remaining;
		if (s->rd_capped) {
			if (s->rd_left == 0)
				return 0;
			if (want > s->rd_left)
				want = s->rd_left;
		}
		pthread_rwlock_rdlock(&ctx->mr_lock);
		int di = s->di;
		uint32_t doff = s->doff;
		while (want && di < s->ndst && k < FAB_MAX_SGE) {
			uint32_t left = s->dst[di].len - doff;
			uint32_t t = want < left ? (uint32_t)want : left;
			if (t) {
				int sdi = s->di;
				uint32_t sdoff = s->doff;
				s->di = di;
				s->doff = doff;
				void *va = dst_va(s, t);
				s->di = sdi;
				s->doff = sdoff;
				if (!va) {
					pthread_rwlock_unlock(&ctx->mr_lock);
					return -2;
				}
				iov[k].iov_base = va;
				iov[k].iov_len = t;
				k++;
				want -= t;
			}
			di++;
			doff = 0;
		}
		struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)k};
		ssize_t r = recvmsg(s->fd, &m, MSG_DONTWAIT);
		pthread_rwlock_unlock(&ctx->mr_lock);
		if (r > 0) {
			s->last_ns = fab_now_ns();
			if (s->rd_capped)
				s->rd_left -= (uint64_t)r;
			dst_advance(s, (uint32_t)r);
		} else {
			int why = recv_nothing(r);
			if (why <= 0)
				return why;
		}
	}
	return 1;
}

/* ------------------------------------------------------- responder side -- */

static int resp_busy(struct fab_sock *s)
{
	if (s->rcount >= FAB_RESP_RING - 4)
		return 1;
	for (uint32_t i = 0; i < s->rcount; i++)
		if (s->resp[(s->rhead + i) % FAB_RESP_RING].len)
			return 1;
	return 0;
}

static void resp_push(struct fab_sock *s, uint8_t kind, uint32_t val, uint64_t src, uint32_t rkey, uint32_t len)
{
	if (kind == FAB_R_ACK && s->rcount) {
		struct fab_resp *last = &s->resp[(s->rhead + s->rcount - 1) % FAB_RESP_RING];
		if (last->hdr.kind == FAB_R_ACK && last->hdr_off == 0) {
			last->hdr.val += val;
			return;
		}
	}
	if (s->rcount == FAB_RESP_RING)
		return; /* cannot happen: reading stops while the ring is nearly full */
	struct fab_resp *r = &s->resp[(s->rhead + s->rcount) % FAB_RESP_RING];
	memset(r, 0, sizeof(*r));
	r->hdr.kind = kind;
	r->hdr.val = val;
	r->src = src;
	r->rkey = rkey;
	r->len = len;
	s->rcount++;
}

static void resp_push_value(struct fab_sock *s, uint8_t kind, uint64_t value)
{
	resp_push(s, kind, sizeof(value), 0, 0, sizeof(value));
	struct fab_resp *r = &s->resp[(s->rhead + s->rcount - 1) % FAB_RESP_RING];
	r->owned = 1;
	r->own = value;
}

static void ack_pending(struct fab_sock *s)
{
	if (s->pending_ack) {
		resp_push(s, FAB_R_ACK, s->pending_ack, 0, 0, 0);
		s->pending_ack = 0;
	}
}

static void in_update_events(struct fab_qp *qp)
{
	struct fab_sock *s = &qp->in;
	if (s->fd < 0)
		return;
	uint32_t ev = 0;
	enum ibv_qp_state st = qp->qp.state;
	if (s->closing == 2) {
		fab_sock_set_events(s, EPOLLIN);
		return;
	}
	if (!s->closing && (st == IBV_QPS_RTR || st == IBV_QPS_RTS || st == IBV_QPS_SQD) && !qp->rnr_stalled &&
	    !resp_busy(s))
		ev |= EPOLLIN;
	if (s->rcount)
		ev |= EPOLLOUT;
	fab_sock_set_events(s, ev);
}

void fab_qp_enable_in(struct fab_qp *qp)
{
	/* the stalled request sits in the stage: the engine has to look at it */
	if (qp->rnr_stalled)
		fab_wake(qctx(qp));
	else
		in_update_events(qp);
}

/* After an error the responder says nothing more: end its direction (the requester
 * reads the last responses, then EOF) and discard requests until the requester
 * closes. Closing with unread data would reset the stream and could destroy the
 * final NAK before the requester reads it. */
static void in_half_close(struct fab_qp *qp)
{
	struct fab_sock *s = &qp->in;
	shutdown(s->fd, SHUT_WR);
	s->closing = 2;
	fab_sock_set_events(s, EPOLLIN);
}

static void in_drain(struct fab_qp *qp)
{
	struct fab_sock *s = &qp->in;
	for (;;) {
		ssize_t r = recv(s->fd, s->st, FAB_STAGE, MSG_DONTWAIT);
		if (r > 0)
			continue;
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		if (r < 0 && errno == EINTR)
			continue;
		sock_close(s);
		return;
	}
}

/* send queued responses; -1 if the connection is gone */
static int resp_flush(struct fab_qp *qp)
{
	struct fab_sock *s = &qp->in;
	struct fab_context *ctx = qctx(qp);
	while (s->rcount && s->fd >= 0) {
		struct iovec iov[64];
		int k = 0;
		pthread_rwlock_rdlock(&ctx->mr_lock);
		for (uint32_t i = 0; i < s->rcount && k < 62; i++) {
			struct fab_resp *r = &s->resp[(s->rhead + i) % FAB_RESP_RING];
			if (r->hdr_off < sizeof(r->hdr)) {
				iov[k].iov_base = (char *)&r->hdr + r->hdr_off;
				iov[k].iov_len = sizeof(r->hdr) - r->hdr_off;
				k++;
			}
			if (r->len > r->off && r->owned) {
				iov[k].iov_base = (char *)&r->own + r->off;
				iov[k].iov_len = r->len - r->off;
				k++;
			} else if (r->len > r->off) {
				uint64_t va;
				uint32_t chunk = r->len - r->off;
				if (fab_mr_find(ctx, qp->qp.pd, r->rkey, r->src + r->off, chunk, IBV_ACCESS_REMOTE_READ,
						&va)) {
					/* the region went away under a READ: nothing sensible to send */
					pthread_rwlock_unlock(&ctx->mr_lock);
					sock_close(s);
					fab_async_event(ctx, IBV_EVENT_QP_FATAL, &qp->qp);
					fab_qp_to_err(qp);
					return -1;
				}
				iov[k].iov_base = (void *)(uintptr_t)va;
				iov[k].iov_len = chunk;
				k++;
			}
		}
		struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)k};
		ssize_t n = sendmsg(s->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
		pthread_rwlock_unlock(&ctx->mr_lock);
		if (n < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			if (errno == EINTR)
				continue;
			sock_close(s);
			return -1;
		}
		s->last_ns = fab_now_ns();
		uint64_t left = (uint64_t)n;
		while (left && s->rcount) {
			struct fab_resp *r = &s->resp[s->rhead];
			uint32_t h = (uint32_t)sizeof(r->hdr) - r->hdr_off;
			uint32_t t = left < h ? (uint32_t)left : h;
			r->hdr_off += t;
			left -= t;
			if (left) {
				uint32_t p = r->len - r->off;
				uint32_t u = left < p ? (uint32_t)left : p;
				r->off += u;
				left -= u;
			}
			if (r->hdr_off == sizeof(r->hdr) && r->off == r->len) {
				s->rhead = (s->rhead + 1) % FAB_RESP_RING;
				s->rcount--;
			}
		}
	}
	if (s->closing == 1 && s->rcount == 0 && s->fd >= 0)
		in_half_close(qp);
	return 0;
}

/* The link is cut: the requester at the other end gets nothing more but a notice, so that its WRs
 * wait for its own retry timer instead of failing at once as on a dead process (which is all the
 * end of the stream would say). Responses not yet begun are lost with the link; one already partly
 * sent is finished first, as the notice must start at a message boundary. */
static void in_send_cut(struct fab_qp *qp)
{
	struct fab_sock *s = &qp->in;
	if (s->fd < 0 || s->closing)
		return;
	s->rcount = s->rcount && s->resp[s->rhead].hdr_off ? 1 : 0;
	s->pending_ack = 0;
	resp_push(s, FAB_R_CUT, 0, 0, 0, 0);
	s->closing = 1;
	resp_flush(qp);
	in_update_events(qp);
}

static void recv_wc(struct fab_qp *qp, uint64_t wr_id, enum ibv_wc_status st, enum ibv_wc_opcode op, uint32_t len,
		    int has_imm, uint32_t imm)
{
	struct ibv_wc wc;
	memset(&wc, 0, sizeof(wc));
	wc.wr_id = wr_id;
	wc.status = st;
	wc.opcode = op;
	wc.byte_len = len;
	wc.qp_num = qp->qp.qp_num;
	wc.src_qp = qp->dest_qpn;
	wc.slid = qp->ah.dlid;
	if (has_imm) {
		wc.wc_flags = IBV_WC_WITH_IMM;
		wc.imm_data = imm;
	}
	fab_cq_push((struct fab_cq *)qp->qp.recv_cq, &wc);
}

/* peek at (take == 0) or take the next receive; 0 if there is none */
static int rq_next(struct fab_qp *qp, struct fab_rwqe *out, int take)
{
	struct fab_rq *rq = qp->srq ? &qp->srq->rq : &qp->rq;
	if (qp->srq)
		pthread_mutex_lock(&qp->srq->lock);
	int ok = rq->count > 0;
	if (ok) {
		*out = rq->ring[rq->head];
		if (take) {
			rq->head = (rq->head + 1) % rq->cap;
			rq->count--;
		}
	} else if (qp->srq) {
		qp->srq->stalled = 1;
	}
	if (qp->srq)
		pthread_mutex_unlock(&qp->srq->lock);
	return ok;
}

/* The IB spec's RNR NAK timer, by min_rnr_timer code, in microseconds (code 0 is the longest). */
static const uint32_t rnr_timer_us[32] = {
	655360, 10,    20,    30,    40,    60,    80,     120,    160,    240,    320,
	480,    640,   960,   1280,  1920,  2560,  3840,   5120,   7680,   10240,  15360,
	20480,  30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520,
};

/* the engine must look at RNR deadlines by `t`; 1 if that is sooner than it knew */
static int rnr_note(struct fab_context *ctx, uint64_t t)
{
	uint64_t cur = __atomic_load_n(&ctx->rnr_due_ns, __ATOMIC_RELAXED);
	while (cur == 0 || t < cur)
		if (__atomic_compare_exchange_n(&ctx->rnr_due_ns, &cur, t, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
			return 1;
	return 0;
}

static void rnr_arm(struct fab_context *ctx, uint64_t t)
{
	if (rnr_note(ctx, t))
		fab_wake(ctx); /* it may sleep in a longer epoll_wait */
}

/* The requester's RNR retries are spent and still no receive: its request fails with
 * RNR_RETRY_EXC_ERR there (and its QP goes to ERR). This QP is not in error, as on RC, but
 * executes nothing more of the stream: the stalled request and whatever follows it are
 * discarded until the requester, now in ERR, closes the connection. */
static void rnr_give_up(struct fab_qp *qp)
{
	struct fab_sock *s = &qp->in;
	fab_log("QP %u: RNR retries of QP %u exceeded", qp->qp.qp_num, qp->dest_qpn);
	qp->rnr_stalled = qp->rnr_nakked = 0;
	qp->rnr_deadline_ns = 0;
	ack_pending(s);
	resp_push(s, FAB_R_RNR_EXC, 0, 0, 0, 0);
	s->closing = 1;
}

/* a request the responder refuses: NAK it, then the QP goes to error */
static void responder_error(struct fab_qp *qp, uint8_t nak, enum ibv_event_type ev)
{
	struct fab_sock *s = &qp->in;
	ack_pending(s);
	resp_push(s, nak, 0, 0, 0, 0);
	s->closing = 1;
	fab_log("QP %u: responder error %d", qp->qp.qp_num, nak);
	fab_async_event(qctx(qp), ev, &qp->qp);
	fab_qp_to_err(qp);
}

static void in_read(struct fab_qp *qp)
{
	struct fab_sock *s = &qp->in;
	struct fab_context *ctx = qctx(qp);
	for (;;) {
		if (s->fd < 0 || s->closing)
			return;
		enum ibv_qp_state st = qp->qp.state;
		if (st != IBV_QPS_RTR && st != IBV_QPS_RTS && st != IBV_QPS_SQD)
			return;
		if (s->rstate == FAB_RS_PAYLOAD) {
			int r = place(s);
			if (r == 0)
				return;
			if (r == -1)
				goto gone;
			if (r == -2) {
				if (s->cur_has_rwqe)
					recv_wc(qp, s->cur_wr_id, IBV_WC_LOC_PROT_ERR, IBV_WC_RECV, 0, 0, 0);
				responder_error(qp, FAB_R_NAK_OP, IBV_EVENT_QP_FATAL);
				return;
			}
			s->rstate = FAB_RS_HDR;
			if (fab_op_atomic(s->cur_op)) {
				uint64_t va, old;
				pthread_rwlock_rdlock(&ctx->mr_lock);
				int bad = fab_mr_find(ctx, qp->qp.pd, s->cur_rkey, s->cur_raddr, 8, IBV_ACCESS_REMOTE_ATOMIC, &va);
				if (!bad) {
					uint64_t *p = (uint64_t *)(uintptr_t)va;
					if (s->cur_op == FAB_OP_CMP_SWP) {
						old = s->atomic_args[0];
						__atomic_compare_exchange_n(p, &old, s->atomic_args[1], 0, __ATOMIC_SEQ_CST,
									    __ATOMIC_SEQ_CST);
					} else {
						old = __atomic_fetch_add(p, s->atomic_args[0], __ATOMIC_SEQ_CST);
					}
				}
				pthread_rwlock_unlock(&ctx->mr_lock);
				if (bad) {
					responder_error(qp, FAB_R_NAK_ACCESS, IBV_EVENT_QP_ACCESS_ERR);
					return;
				}
				ack_pending(s);
				resp_push_value(s, FAB_R_ATOMIC, old);
				continue;
			}
			if (s->cur_has_rwqe) {
				int imm = s->cur_op == FAB_OP_WRITE_IMM || s->cur_op == FAB_OP_SEND_IMM;
				enum ibv_wc_opcode op = s->cur_op == FAB_OP_WRITE_IMM ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
				recv_wc(qp, s->cur_wr_id, IBV_WC_SUCCESS, op, s->cur_len, imm, s->cur_imm);
			}
			s->pending_ack++;
			continue;
		}
		if (resp_busy(s))
			return;
		if (s->rstate == FAB_RS_HELLO) {
			int r = stage_fill(s, sizeof(struct fab_wire_hello));
			if (r == 0)
				return;
			if (r < 0)
				goto gone;
			struct fab_wire_hello h;
			memcpy(&h, s->st + s->sb, sizeof(h));
			s->sb += sizeof(h);
			if (h.magic != FAB_HELLO_MAGIC || h.dst_qpn != qp->qp.qp_num || h.src_qpn != qp->dest_qpn ||
			    h.dst_lid != my_lid(qp)) {
				fab_log("QP %u: refusing a connection from QP %u (for QP %u, LID 0x%x; expected QP %u, LID 0x%x)",
					qp->qp.qp_num, h.src_qpn, h.dst_qpn, h.dst_lid, qp->dest_qpn, my_lid(qp));
				goto gone;
			}
			s->rstate = FAB_RS_HDR;
			continue;
		}
		int r = stage_fill(s, sizeof(struct fab_wire_req));
		if (r == 0)
			return;
		if (r < 0)
			goto gone;
		struct fab_wire_req h;
		memcpy(&h, s->st + s->sb, sizeof(h));
		s->cur_op = h.op;
		s->cur_len = h.len;
		s->cur_imm = h.imm;
		s->cur_has_rwqe = 0;
		s->discard = 0;
		s->di = 0;
		s->doff = 0;
		s->ndst = 0;
		switch (h.op) {
		case FAB_OP_WRITE:
		case FAB_OP_WRITE_IMM:
		case FAB_OP_READ: {
			unsigned int need = h.op == FAB_OP_READ ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
			if (h.len && (!(qp->access & need) || fab_mr_check(ctx, qp->qp.pd, h.rkey, h.raddr, h.len, need))) {
				s->sb += sizeof(h);
				responder_error(qp, FAB_R_NAK_ACCESS, IBV_EVENT_QP_ACCESS_ERR);
				return;
			}
			if (h.op == FAB_OP_READ) {
				s->sb += sizeof(h);
				ack_pending(s);
				resp_push(s, FAB_R_READ, h.len, h.raddr, h.rkey, h.len);
				s->pending_ack = 0;
				continue;
			}
			if (h.op == FAB_OP_WRITE_IMM) {
				struct fab_rwqe w;
				if (!rq_next(qp, &w, 1))
					goto rnr;
				s->cur_has_rwqe = 1;
				s->cur_wr_id = w.wr_id;
			}
			s->sb += sizeof(h);
			s->dst[0].addr = h.raddr;
			s->dst[0].len = h.len;
			s->dst[0].key = h.rkey;
			s->ndst = 1;
			s->pay_key_access = IBV_ACCESS_REMOTE_WRITE;
			break;
		}
		case FAB_OP_CMP_SWP:
		case FAB_OP_FETCH_ADD: {
			s->sb += sizeof(h);
			if (!(qp->access & IBV_ACCESS_REMOTE_ATOMIC) || h.len != 8 ||
			    fab_mr_check(ctx, qp->qp.pd, h.rkey, h.raddr, 8, IBV_ACCESS_REMOTE_ATOMIC)) {
				responder_error(qp, FAB_R_NAK_ACCESS, IBV_EVENT_QP_ACCESS_ERR);
				return;
			}
			if (h.raddr % 8) {
				responder_error(qp, FAB_R_NAK_INV, IBV_EVENT_QP_REQ_ERR);
				return;
			}
			/* the operands follow: take them into the socket's scratch, then operate */
			s->cur_raddr = h.raddr;
			s->cur_rkey = h.rkey;
			s->dst[0].addr = (uintptr_t)s->atomic_args;
			s->dst[0].len = sizeof(s->atomic_args);
			s->dst[0].key = 0;
			s->ndst = 1;
			s->remaining = sizeof(s->atomic_args);
			s->rstate = FAB_RS_PAYLOAD;
			continue;
		}
		case FAB_OP_SEND:
		case FAB_OP_SEND_IMM: {
			struct fab_rwqe w;
			if (!rq_next(qp, &w, 0))
				goto rnr;
			uint64_t room = 0;
			for (uint32_t i = 0; i < w.nsge; i++)
				room += w.sge[i].length;
			rq_next(qp, &w, 1);
			s->sb += sizeof(h);
			if (room < h.len) {
				recv_wc(qp, w.wr_id, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV, 0, 0, 0);
				responder_error(qp, FAB_R_NAK_INV, IBV_EVENT_QP_REQ_ERR);
				return;
			}
			uint32_t left = h.len;
			for (uint32_t i = 0; i < w.nsge && left; i++) {
				uint32_t t = w.sge[i].length < left ? w.sge[i].length : left;
				if (fab_mr_check(ctx, qp->qp.pd, w.sge[i].lkey, w.sge[i].addr, t, IBV_ACCESS_LOCAL_WRITE)) {
					recv_wc(qp, w.wr_id, IBV_WC_LOC_PROT_ERR, IBV_WC_RECV, 0, 0, 0);
					responder_error(qp, FAB_R_NAK_OP, IBV_EVENT_QP_FATAL);
					return;
				}
				s->dst[s->ndst].addr = w.sge[i].addr;
				s->dst[s->ndst].len = t;
				s->dst[s->ndst].key = w.sge[i].lkey;
				s->ndst++;
				left -= t;
			}
			s->cur_has_rwqe = 1;
			s->cur_wr_id = w.wr_id;
			s->pay_key_access = IBV_ACCESS_LOCAL_WRITE;
			break;
		}
		default:
			s->sb += sizeof(h);
			responder_error(qp, FAB_R_NAK_INV, IBV_EVENT_QP_REQ_ERR);
			return;
		}
		qp->rnr_nakked = 0; /* a request that had waited for a receive got one */
		qp->rnr_deadline_ns = 0;
		s->remaining = h.len;
		while (s->di < s->ndst && s->dst[s->di].len == 0)
			s->di++;
		s->rstate = FAB_RS_PAYLOAD;
		continue;
	rnr:
		/* No receive posted: an RNR NAK. The stream holds here, so nothing behind this request
		 * passes it, and it goes on as soon as a receive is posted (a real requester would
		 * retry after min_rnr_timer). The requester is told, so it does not take the silence
		 * for a dead peer; with rnr_retry < 7 its retries end rnr_retry timers after the NAK. */
		if (!qp->rnr_nakked) {
			uint8_t tries = (h.flags & FAB_REQ_RNR_SET) ? h.flags & FAB_REQ_RNR_RETRY : 7;
			fab_log("QP %u: RNR wait (rnr_retry %u, min_rnr_timer %u)", qp->qp.qp_num, tries,
				qp->min_rnr_timer);
			qp->rnr_nakked = 1;
			qp->rnr_deadline_ns = 0;
			if (tries != 7) {
				qp->rnr_deadline_ns =
					fab_now_ns() + (uint64_t)tries * rnr_timer_us[qp->min_rnr_timer & 31] * 1000ull;
				if (tries)
					rnr_arm(ctx, qp->rnr_deadline_ns);
			}
			ack_pending(s);
			resp_push(s, FAB_R_RNR, 0, 0, 0, 0);
		}
		if (qp->rnr_deadline_ns && fab_now_ns() >= qp->rnr_deadline_ns) {
			rnr_give_up(qp);
			return;
		}
		qp->rnr_stalled = 1;
		return;
	}
gone:
	/* the requester went away: a responder does not notice that on real RC */
	sock_close(s);
}

static void in_event(struct fab_qp *qp, uint32_t events)
{
	struct fab_sock *s = &qp->in;
	if (s->closing == 2) {
		in_drain(qp);
		return;
	}
	if (events & EPOLLOUT)
		resp_flush(qp);
	if (s->fd >= 0 && (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) && !(s->ev & EPOLLIN) && !(events & EPOLLIN)) {
		/* hang-up while we were not reading */
		sock_close(s);
		return;
	}
	/* requests already staged do not make the socket readable again: keep going
	 * while they can be served */
	int read = (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) != 0;
	while (s->fd >= 0 && !qp->rnr_stalled && !s->closing && (read || s->se > s->sb)) {
		uint32_t sb = s->sb, se = s->se, rcount = s->rcount;
		int rstate = s->rstate;
		uint64_t rem = s->remaining;
		read = 0;
		in_read(qp);
		ack_pending(s);
		resp_flush(qp);
		if (s->fd < 0 || resp_busy(s))
			break;
		if (s->sb == sb && s->se == se && s->rstate == rstate && s->remaining == rem && s->rcount >= rcount)
			break;
	}
	in_update_events(qp);
}

/* ------------------------------------------------------- requester side -- */

static uint32_t wire_len(const struct fab_swqe *w)
{
	if (w->hdr.op == FAB_OP_READ)
		return (uint32_t)sizeof(w->hdr);
	if (fab_op_atomic(w->hdr.op))
		return (uint32_t)(sizeof(w->hdr) + sizeof(w->atomic_args));
	return (uint32_t)sizeof(w->hdr) + w->len;
}

static void send_wc(struct fab_qp *qp, struct fab_swqe *w, enum ibv_wc_status st)
{
	struct ibv_wc wc;
	memset(&wc, 0, sizeof(wc));
	wc.wr_id = w->wr_id;
	wc.status = st;
	wc.opcode = (enum ibv_wc_opcode)w->wc_op;
	wc.byte_len = w->len;
	wc.qp_num = qp->qp.qp_num;
	fab_cq_push((struct fab_cq *)qp->qp.send_cq, &wc);
}

static void link_fail(struct fab_qp *qp)
{
	fab_log("QP %u: connection to QP %u lost", qp->qp.qp_num, qp->dest_qpn);
	qp->link_down = 1;
	if (qp->out.fd >= 0)
		sock_close(&qp->out);
	if (qp->sq_head < qp->sq_tx || (qp->sq_head < qp->sq_tail && qp->tx_off)) {
		send_wc(qp, &qp->sq[qp->sq_head % qp->sq_cap], IBV_WC_RETRY_EXC_ERR);
		qp->sq_head++;
		if (qp->sq_tx < qp->sq_head) {
			qp->sq_tx = qp->sq_head;
			qp->tx_off = 0;
		}
		fab_qp_to_err(qp);
		return;
	}
	fab_sq_settle(qp);
}

void fab_qp_tx(struct fab_qp *qp)
{
	struct fab_sock *s = &qp->out;
	if (qp->qp.state != IBV_QPS_RTS)
		return;
	if (s->fd < 0) {
		fab_sq_settle(qp);
		return;
	}
	int blocked = 0;
	while (qp->sq_tx < qp->sq_tail) {
		struct iovec iov[64];
		int k = 0;
		uint64_t off = qp->tx_off;
		for (uint64_t i = qp->sq_tx; i < qp->sq_tail && k < 60; i++) {
			struct fab_swqe *w = &qp->sq[i % qp->sq_cap];
			if (w->lerr)
				break;
			uint64_t pos = 0; /* position within this WR's wire message */
			uint64_t skip = i == qp->sq_tx ? off : 0;
			if (skip < sizeof(w->hdr)) {
				iov[k].iov_base = (char *)&w->hdr + skip;
				iov[k].iov_len = sizeof(w->hdr) - skip;
				k++;
			}
			pos = sizeof(w->hdr);
			if (w->hdr.op == FAB_OP_READ)
				continue;
			if (w->inl || fab_op_atomic(w->hdr.op)) {
				/* one buffer of the WR's own: the inline copy or the atomic's operands */
				uint8_t *buf = w->inl ? w->inl_buf : (uint8_t *)w->atomic_args;
				uint64_t blen = w->inl ? w->len : sizeof(w->atomic_args);
				if (skip < pos + blen) {
					uint64_t from = skip > pos ? skip - pos : 0;
					iov[k].iov_base = buf + from;
					iov[k].iov_len = blen - from;
					k++;
				}
				continue;
			}
			for (uint32_t j = 0; j < w->nsge && k < 63; j++) {
				uint64_t end = pos + w->sge[j].length;
				if (skip < end) {
					uint64_t from = skip > pos ? skip - pos : 0;
					iov[k].iov_base = (char *)(uintptr_t)w->sge[j].addr + from;
					iov[k].iov_len = w->sge[j].length - from;
					k++;
				}
				pos = end;
			}
			if (k >= 60)
				break;
		}
		if (k == 0)
			break;
		struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)k};
		ssize_t n = sendmsg(s->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				blocked = 1;
				break;
			}
			if (errno == EINTR)
				continue;
			link_fail(qp);
			return;
		}
		s->last_ns = fab_now_ns();
		uint64_t left = (uint64_t)n;
		while (left) {
			struct fab_swqe *w = &qp->sq[qp->sq_tx % qp->sq_cap];
			uint64_t rest = wire_len(w) - qp->tx_off;
			if (left >= rest) {
				left -= rest;
				qp->sq_tx++;
				qp->tx_off = 0;
			} else {
				qp->tx_off += left;
				left = 0;
			}
		}
	}
	fab_sock_set_events(s, EPOLLIN | (blocked ? EPOLLOUT : 0));
	fab_sq_settle(qp);
}

static enum ibv_wc_status nak_status(uint8_t kind)
{
	switch (kind) {
	case FAB_R_NAK_ACCESS: return IBV_WC_REM_ACCESS_ERR;
	case FAB_R_NAK_INV: return IBV_WC_REM_INV_REQ_ERR;
	default: return IBV_WC_REM_OP_ERR;
	}
}

static void out_read(struct fab_qp *qp)
{
	struct fab_sock *s = &qp->out;
	for (;;) {
		if (s->fd < 0)
			return;
		if (s->rstate == FAB_RS_PAYLOAD) {
			int r = place(s);
			if (r == 0)
				return;
			if (r < 0) {
				link_fail(qp);
				return;
			}
			struct fab_swqe *w = &qp->sq[qp->sq_head % qp->sq_cap];
			if (w->signaled)
				send_wc(qp, w, IBV_WC_SUCCESS);
			qp->sq_head++;
			s->rstate = FAB_RS_HDR;
			continue;
		}
		int r = stage_fill(s, sizeof(struct fab_wire_resp));
		if (r == 0)
			return;
		if (r < 0) {
			link_fail(qp);
			return;
		}
		struct fab_wire_resp h;
		memcpy(&h, s->st + s->sb, sizeof(h));
		s->sb += sizeof(h);
		qp->rnr_waiting = h.kind == FAB_R_RNR;
		switch (h.kind) {
		case FAB_R_ACK:
			for (uint32_t i = 0; i < h.val; i++) {
				struct fab_swqe *w = &qp->sq[qp->sq_head % qp->sq_cap];
				if (qp->sq_head >= qp->sq_tx || fab_op_answered(w->hdr.op)) {
					link_fail(qp);
					return;
				}
				if (w->signaled)
					send_wc(qp, w, IBV_WC_SUCCESS);
				qp->sq_head++;
			}
			break;
		case FAB_R_NAK_ACCESS:
		case FAB_R_NAK_INV:
		case FAB_R_NAK_OP:
			if (qp->sq_head >= qp->sq_tx) {
				link_fail(qp);
				return;
			}
			send_wc(qp, &qp->sq[qp->sq_head % qp->sq_cap], nak_status(h.kind));
			qp->sq_head++;
			fab_qp_to_err(qp);
			return;
		case FAB_R_READ:
		case FAB_R_ATOMIC: {
			struct fab_swqe *w = &qp->sq[qp->sq_head % qp->sq_cap];
			int match = h.kind == FAB_R_READ ? w->hdr.op == FAB_OP_READ : fab_op_atomic(w->hdr.op);
			if (qp->sq_head >= qp->sq_tx || !match || w->len != h.val) {
				link_fail(qp);
				return;
			}
			s->ndst = 0;
			for (uint32_t j = 0; j < w->nsge; j++) {
				s->dst[s->ndst].addr = w->sge[j].addr;
				s->dst[s->ndst].len = w->sge[j].length;
				s->dst[s->ndst].key = 0; /* translated and checked when posted */
				s->ndst++;
			}
			s->di = 0;
			s->doff = 0;
			while (s->di < s->ndst && s->dst[s->di].len == 0)
				s->di++;
			s->discard = 0;
			s->remaining = h.val;
			s->rstate = FAB_RS_PAYLOAD;
			break;
		}
		case FAB_R_RNR: break;
		case FAB_R_RNR_EXC:
			if (qp->sq_head >= qp->sq_tx) {
				link_fail(qp);
				return;
			}
			send_wc(qp, &qp->sq[qp->sq_head % qp->sq_cap], IBV_WC_RNR_RETRY_EXC_ERR);
			qp->sq_head++;
			fab_qp_to_err(qp);
			return;
		case FAB_R_CUT:
			fab_log("QP %u: the link to QP %u is cut", qp->qp.qp_num, qp->dest_qpn);
			fab_qp_cut(qp);
			return;
		default: link_fail(qp); return;
		}
	}
}

static void out_event(struct fab_qp *qp, uint32_t events)
{
	if (events & EPOLLOUT)
		fab_qp_tx(qp);
	if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
		out_read(qp);
		fab_sq_settle(qp);
	}
}

/* Before the QP leaves RTR/RTS, what its peer had sent arrived at the "HCA": execute, in wire
 * order, every request already in the stage or in the socket now, and nothing sent later
 * (their receive completions then precede the flushes, and the requester gets their ACKs). A
 * request whose receive is still missing stops it, as does one refused: nothing behind it is
 * executed. */
static void in_drain_before_err(struct fab_qp *qp)
{
	struct fab_sock *s = &qp->in;
	enum ibv_qp_state st = qp->qp.state;
	if (qp->err_draining || s->fd < 0 || s->closing ||
	    (st != IBV_QPS_RTR && st != IBV_QPS_RTS && st != IBV_QPS_SQD))
		return;
	int queued = 0;
	if (ioctl(s->fd, FIONREAD, &queued) || queued < 0)
		queued = 0;
	qp->err_draining = 1;
	s->rd_capped = 1;
	s->rd_left = (uint64_t)queued;
	qp->rnr_stalled = 0; /* a receive may have been posted since the stall */
	in_event(qp, EPOLLIN);
	s->rd_capped = 0; /* (sock_close clears it too) */
	qp->err_draining = 0;
}

void fab_qp_to_err(struct fab_qp *qp)
{
	if (qp->qp.state == IBV_QPS_ERR)
		return;
	in_drain_before_err(qp);
	if (qp->qp.state == IBV_QPS_ERR) /* the drain met an error of its own */
		return;
	qp->qp.state = IBV_QPS_ERR;
	qp->rnr_stalled = qp->rnr_nakked = 0;
	qp->rnr_deadline_ns = 0;
	if (qp->out.fd >= 0)
		sock_close(&qp->out);
	if (qp->in.fd >= 0 && !qp->in.closing) {
		if (qp->in.rcount) {
			qp->in.closing = 1;
			in_update_events(qp);
		} else {
			in_half_close(qp);
		}
	}
	fab_sq_settle(qp);
}

/* As a cut cable looks to an RC QP: nothing passes any more in either direction. The requests the
 * peer sent are not executed, its connection is dropped (the peer is told, in_send_cut), and the
 * WRs here, outstanding or posted later, wait for the retry timer (check_timers) instead of failing
 * at once. Receives stay posted until the QP enters ERR. */
void fab_qp_cut(struct fab_qp *qp)
{
	if (qp->link_cut)
		return;
	fab_log("QP %u: link cut", qp->qp.qp_num);
	qp->link_cut = 1;
	qp->rnr_waiting = qp->rnr_stalled = qp->rnr_nakked = 0;
	qp->rnr_deadline_ns = 0;
	qp->cut_clock_ns = qp->sq_head < qp->sq_tail ? fab_now_ns() : 0;
	if (qp->out.fd >= 0)
		sock_close(&qp->out);
	in_send_cut(qp);
}

/* -------------------------------------------------------------- engine -- */

static void do_accept(struct fab_qp *qp)
{
	for (;;) {
		int fd = accept4(qp->lsn.fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0)
			return;
		/* abstract sockets have no file permissions: only our own user may connect */
		struct ucred cred = {0, (uid_t)-1, (gid_t)-1};
		socklen_t cl = sizeof(cred);
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) || cred.uid != getuid()) {
			fab_log("QP %u: refusing a connection from uid %d", qp->qp.qp_num, (int)cred.uid);
			close(fd);
			continue;
		}
		if (qp->in.fd >= 0 || qp->qp.state == IBV_QPS_ERR) {
			close(fd);
			continue;
		}
		int sz = 4 << 20; /* READ responses are bulk data too */
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
		if (sock_open(&qp->in, fd, 0)) {
			close(fd);
			qp->in.fd = -1;
			continue;
		}
		if (qp->link_cut)
			in_send_cut(qp); /* a peer connecting to a QP on a failed port learns it at once */
		else
			in_update_events(qp);
	}
}

static uint64_t qp_timeout_ns(struct fab_qp *qp)
{
	uint64_t cap = fab_config()->timeout_cap_ns;
	if (qp->timeout == 0)
		return cap;
	uint64_t t = (4096ull << qp->timeout) * (uint64_t)(qp->retry_cnt + 1);
	return t < cap ? t : cap;
}

/* Is the peer process stopped (SIGSTOP, a debugger) or gone? */
static int peer_stopped(pid_t pid)
{
	char path[64], buf[256];
	if (pid <= 0)
		return 1;
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return 1;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	const char *p = strrchr(buf, ')'); /* the state follows the command name */
	if (!p || p[1] != ' ')
		return 0;
	char st = p[2];
	return st == 'T' || st == 't' || st == 'Z' || st == 'X';
}

/* A silent peer: the QP's timeout x (retry_cnt + 1) without a byte moving if the peer
 * process is stopped, as a real requester would see it. A peer that is merely not
 * getting the CPU on a loaded host is not a dead link: it gets the cap before its
 * requester gives up, so load does not fail transfers that real hardware would finish.
 * A cut link is known to be dead: the same timeout, counted from when the head WR began
 * waiting on it. */
static void check_timers(struct fab_context *ctx)
{
	uint64_t cap = fab_config()->timeout_cap_ns;
	pthread_mutex_lock(&ctx->lock);
	for (struct fab_qp *qp = ctx->qps; qp; qp = qp->next) {
		pthread_mutex_lock(&qp->lock);
		uint64_t now = fab_now_ns(); /* after the lock: posting threads move last_ns */
		int waiting = qp->qp.state == IBV_QPS_RTS && qp->sq_head < qp->sq_tail;
		if (waiting && qp->link_cut) {
			if (now > qp->cut_clock_ns && now - qp->cut_clock_ns > qp_timeout_ns(qp)) {
				fab_log("QP %u: retries exceeded on a cut link after %llu ms", qp->qp.qp_num,
					(unsigned long long)((now - qp->cut_clock_ns) / 1000000));
				link_fail(qp);
			}
		} else if (waiting && qp->out.fd >= 0 && !qp->rnr_waiting && now > qp->out.last_ns) {
			uint64_t quiet = now - qp->out.last_ns;
			if (quiet > qp_timeout_ns(qp) && (quiet > cap || peer_stopped(qp->out_peer_pid))) {
				fab_log("QP %u: no answer from QP %u for %llu ms", qp->qp.qp_num, qp->dest_qpn,
					(unsigned long long)(quiet / 1000000));
				link_fail(qp);
			}
		}
		pthread_mutex_unlock(&qp->lock);
	}
	pthread_mutex_unlock(&ctx->lock);
}

/* Ports of the device that failed since this context last looked: every QP bound to one is cut,
 * then IBV_EVENT_PORT_ERR is queued (a program that sees the event finds the QPs cut). */
void fab_ports_apply(struct fab_context *ctx)
{
	uint32_t down = __atomic_load_n(&ctx->fdev->ports_down, __ATOMIC_ACQUIRE);
	if (!(down & ~__atomic_load_n(&ctx->ports_cut, __ATOMIC_RELAXED)))
		return;
	pthread_mutex_lock(&ctx->lock);
	uint32_t fresh = down & ~ctx->ports_cut;
	__atomic_store_n(&ctx->ports_cut, ctx->ports_cut | fresh, __ATOMIC_RELAXED);
	for (struct fab_qp *qp = ctx->qps; qp; qp = qp->next) {
		pthread_mutex_lock(&qp->lock);
		enum ibv_qp_state st = qp->qp.state;
		if (st != IBV_QPS_RESET && st != IBV_QPS_ERR && (fresh >> qp->port & 1))
			fab_qp_cut(qp);
		pthread_mutex_unlock(&qp->lock);
	}
	pthread_mutex_unlock(&ctx->lock);
	for (int p = 1; p < FAB_MAX_PORTS; p++)
		if (fresh >> p & 1)
			fab_async_event(ctx, IBV_EVENT_PORT_ERR, (void *)(uintptr_t)p);
}

static void wake_scan(struct fab_context *ctx)
{
	fab_ports_apply(ctx); /* a port may have failed (fab_wake_device) */
	pthread_mutex_lock(&ctx->lock);
	for (struct fab_qp *qp = ctx->qps; qp; qp = qp->next) {
		pthread_mutex_lock(&qp->lock);
		if (qp->rnr_stalled && qp->in.fd >= 0) {
			fab_log("QP %u: RNR resume", qp->qp.qp_num);
			qp->rnr_stalled = 0;
			in_event(qp, EPOLLIN);
		}
		pthread_mutex_unlock(&qp->lock);
	}
	pthread_mutex_unlock(&ctx->lock);
}

/* A QP whose RNR deadline passed gets its last retry: the request goes on if a receive is
 * there by now, else it fails at the requester (rnr_give_up). */
static void rnr_scan(struct fab_context *ctx)
{
	__atomic_store_n(&ctx->rnr_due_ns, 0, __ATOMIC_RELAXED);
	pthread_mutex_lock(&ctx->lock);
	for (struct fab_qp *qp = ctx->qps; qp; qp = qp->next) {
		pthread_mutex_lock(&qp->lock);
		if (qp->rnr_stalled && qp->rnr_deadline_ns && qp->in.fd >= 0) {
			if (fab_now_ns() >= qp->rnr_deadline_ns) {
				qp->rnr_stalled = 0;
				in_event(qp, EPOLLIN);
			} else {
				rnr_note(ctx, qp->rnr_deadline_ns);
			}
		}
		pthread_mutex_unlock(&qp->lock);
	}
	pthread_mutex_unlock(&ctx->lock);
}

/* how long the engine may sleep in epoll_wait: 50 ms, less when an RNR deadline comes first */
static int engine_wait_ms(struct fab_context *ctx, uint64_t now)
{
	uint64_t due = __atomic_load_n(&ctx->rnr_due_ns, __ATOMIC_RELAXED);
	if (!due)
		return 50;
	if (due <= now)
		return 0;
	uint64_t ms = (due - now + 999999) / 1000000;
	return ms < 50 ? (int)ms : 50;
}

static void free_qp(struct fab_qp *qp)
{
	if (!qp->srq) {
		free(qp->rq.ring);
		free(qp->rq.sges);
	}
	free(qp->sq);
	free(qp->sq_sges);
	free(qp->sq_inl);
	free(qp);
}

static void bury(struct fab_context *ctx)
{
	pthread_mutex_lock(&ctx->lock);
	struct fab_qp *g = ctx->grave;
	ctx->grave = NULL;
	pthread_mutex_unlock(&ctx->lock);
	while (g) {
		struct fab_qp *n = g->grave_next;
		free_qp(g);
		g = n;
	}
}

/* with ctx->plock: handle what one epoll_wait returned; 1 if the wake fd fired */
static int handle_events(struct epoll_event *evs, int n)
{
	int scan = 0;
	for (int i = 0; i < n; i++) {
		struct fab_sock *s = evs[i].data.ptr;
		if (s->kind == FAB_SK_WAKE) {
			uint64_t v;
			if (read(s->fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
				fab_log("eventfd read: %s", strerror(errno));
			scan = 1;
			continue;
		}
		struct fab_qp *qp = s->qp;
		pthread_mutex_lock(&qp->lock);
		if (!qp->dead) {
			switch (s->kind) {
			case FAB_SK_LISTEN: do_accept(qp); break;
			case FAB_SK_IN:
				if (s->fd >= 0)
					in_event(qp, evs[i].events);
				break;
			case FAB_SK_OUT:
				if (s->fd >= 0)
					out_event(qp, evs[i].events);
				break;
			default: break;
			}
		}
		pthread_mutex_unlock(&qp->lock);
	}
	return scan;
}

/* An application thread that polled an empty CQ this recently is still in its poll
 * loop; the progress thread then naps, longer each time it finds the poller busy. */
#define FAB_POLLER_NS 5000ull
#define FAB_NAP_MIN_NS 10000
#define FAB_NAP_MAX_NS 160000

/* A thread that polls an empty CQ does a round of progress itself instead of
 * waiting for the progress thread to be scheduled (on a busy host that wait is
 * most of the latency). Only the progress thread frees destroyed QPs, and only
 * under plock after handling its own batch, so no batch sees a freed QP. */
void fab_poll_progress(struct fab_context *ctx)
{
	static int enabled = -1;
	int en = __atomic_load_n(&enabled, __ATOMIC_RELAXED);
	if (en < 0) {
		const char *v = getenv("RIVET_FABRIC_POLL_PROGRESS");
		en = !(v && strcmp(v, "0") == 0);
		__atomic_store_n(&enabled, en, __ATOMIC_RELAXED);
	}
	if (!en || !__atomic_load_n(&ctx->thread_started, __ATOMIC_ACQUIRE) || pthread_mutex_trylock(&ctx->plock))
		return;
	__atomic_store_n(&ctx->last_poll_ns, fab_now_ns(), __ATOMIC_RELAXED);
	struct epoll_event evs[16];
	int n = epoll_wait(ctx->epfd, evs, 16, 0);
	if (n > 0 && handle_events(evs, n))
		wake_scan(ctx);
	pthread_mutex_unlock(&ctx->plock);
}

static void *engine_main(void *arg)
{
	struct fab_context *ctx = arg;
	struct epoll_event evs[64];
	uint64_t last_timer = fab_now_ns();
	long nap_ns = FAB_NAP_MIN_NS;
	prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0); /* naps of microseconds must not become 50 us */
	while (!__atomic_load_n(&ctx->stop, __ATOMIC_ACQUIRE)) {
		int n = epoll_wait(ctx->epfd, evs, 64, engine_wait_ms(ctx, fab_now_ns()));
		/* while an application thread polls (and so moves the data itself), stay out
		 * of its way: on a host with few cores a second runnable thread per process
		 * costs more latency than it saves */
		if (n > 0 && fab_now_ns() - __atomic_load_n(&ctx->last_poll_ns, __ATOMIC_RELAXED) < FAB_POLLER_NS) {
			struct timespec t = {0, nap_ns};
			nanosleep(&t, NULL);
			if (nap_ns < FAB_NAP_MAX_NS)
				nap_ns *= 2;
			if (fab_now_ns() - __atomic_load_n(&ctx->last_poll_ns, __ATOMIC_RELAXED) < FAB_POLLER_NS)
				n = 0; /* the poller handles them; timers are still ours */
		}
		if (n > 0)
			nap_ns = FAB_NAP_MIN_NS;
		uint64_t now = fab_now_ns();
		int timers = now - last_timer > 50000000ull;
		uint64_t rnr_due = __atomic_load_n(&ctx->rnr_due_ns, __ATOMIC_RELAXED);
		int rnr = rnr_due && now >= rnr_due;
		if (n <= 0 && !timers && !rnr)
			continue;
		pthread_mutex_lock(&ctx->plock);
		if (n > 0 && handle_events(evs, n))
			wake_scan(ctx);
		if (rnr)
			rnr_scan(ctx);
		if (timers) {
			last_timer = now;
			fab_port_poll();
			fab_ports_apply(ctx);
			check_timers(ctx);
		}
		bury(ctx);
		pthread_mutex_unlock(&ctx->plock);
	}
	return NULL;
}

int fab_engine_start(struct fab_context *ctx)
{
	int r = 0;
	pthread_mutex_lock(&ctx->lock);
	if (ctx->thread_started)
		goto out;
	ctx->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (ctx->epfd < 0) {
		r = errno;
		goto out;
	}
	ctx->wake.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	ctx->wake.kind = FAB_SK_WAKE;
	struct epoll_event e = {.events = EPOLLIN, .data.ptr = &ctx->wake};
	if (ctx->wake.fd < 0 || epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, ctx->wake.fd, &e)) {
		r = errno;
		goto fail;
	}
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	r = pthread_create(&ctx->thread, NULL, engine_main, ctx);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (r)
		goto fail;
	__atomic_store_n(&ctx->thread_started, 1, __ATOMIC_RELEASE);
	goto out;
fail:
	if (ctx->wake.fd >= 0)
		close(ctx->wake.fd);
	close(ctx->epfd);
	ctx->wake.fd = -1;
	ctx->epfd = -1;
out:
	pthread_mutex_unlock(&ctx->lock);
	return r;
}

void fab_wake(struct fab_context *ctx)
{
	uint64_t one = 1;
	if (ctx->wake.fd >= 0 && write(ctx->wake.fd, &one, sizeof(one)) < 0)
		fab_log("eventfd write: %s", strerror(errno));
}

void fab_engine_stop(struct fab_context *ctx)
{
	if (!ctx->thread_started)
		return;
	__atomic_store_n(&ctx->stop, 1, __ATOMIC_RELEASE);
	fab_wake(ctx);
	pthread_join(ctx->thread, NULL);
	ctx->thread_started = 0;
	bury(ctx);
	/* QPs the application did not destroy: close their sockets so peers see EOF */
	for (struct fab_qp *qp = ctx->qps; qp; qp = qp->next) {
		fab_qp_close_socks(qp);
		fab_qp_close_listen(qp);
	}
	close(ctx->wake.fd);
	close(ctx->epfd);
	ctx->wake.fd = -1;
	ctx->epfd = -1;
}
