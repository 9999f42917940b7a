/*
 * Verbs objects: PD, MR, CQ, completion channels, async events, SRQ, QP and
 * the posting/polling ops that verbs.h's inline functions call.
 */
#include "fabric.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#undef ibv_reg_mr
#undef ibv_reg_mr_iova
#undef ibv_query_port

/* --------------------------------------------------------------- events -- */

struct fab_async_rec {
	void *obj;
	int type;
	int pad;
};

void fab_async_event(struct fab_context *ctx, enum ibv_event_type type, void *obj)
{
	struct fab_async_rec r = {.obj = obj, .type = (int)type};
	fab_log("async event %s", ibv_event_type_str(type));
	if (write(ctx->async_wfd, &r, sizeof(r)) != (ssize_t)sizeof(r))
		fab_log("async event queue full: event dropped");
}

FAB_EXPORT int ibv_get_async_event(struct ibv_context *context, struct ibv_async_event *event)
{
	struct fab_async_rec r;
	ssize_t n = read(context->async_fd, &r, sizeof(r));
	if (n != (ssize_t)sizeof(r))
		return -1;
	event->event_type = (enum ibv_event_type)r.type;
	switch (event->event_type) {
	case IBV_EVENT_CQ_ERR: event->element.cq = r.obj; break;
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED: event->element.qp = r.obj; break;
	case IBV_EVENT_SRQ_ERR:
	case IBV_EVENT_SRQ_LIMIT_REACHED: event->element.srq = r.obj; break;
	default: event->element.port_num = (int)(uintptr_t)r.obj; break;
	}
	return 0;
}

FAB_EXPORT void ibv_ack_async_event(struct ibv_async_event *event)
{
	(void)event;
}

/* ------------------------------------------------------------------- PD -- */

FAB_EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
	struct fab_pd *pd = calloc(1, sizeof(*pd));
	if (!pd) {
		errno = ENOMEM;
		return NULL;
	}
	pd->pd.context = context;
	return &pd->pd;
}

FAB_EXPORT int ibv_dealloc_pd(struct ibv_pd *pd)
{
	free(pd);
	return 0;
}

/* ------------------------------------------------------------------- MR -- */

/* The fabric cannot write GPU or otherwise inaccessible memory: refuse to register it,
 * as a NIC without peer-memory support would. Sampled, not exhaustive. */
static int range_readable(const void *addr, size_t len)
{
	char b;
	size_t step = 2u << 20;
	for (size_t off = 0;; off += step) {
		if (off >= len)
			off = len - 1;
		struct iovec l = {.iov_base = &b, .iov_len = 1};
		struct iovec r = {.iov_base = (char *)addr + off, .iov_len = 1};
		if (process_vm_readv(getpid(), &l, 1, &r, 1, 0) != 1)
			return 0;
		if (off == len - 1)
			return 1;
	}
}

static struct ibv_mr *reg_mr(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned int access)
{
	struct fab_context *ctx = fab_ctx(pd->context);
	unsigned int known = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			     IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND | IBV_ACCESS_ZERO_BASED |
			     IBV_ACCESS_ON_DEMAND | IBV_ACCESS_HUGETLB | IBV_ACCESS_RELAXED_ORDERING |
			     IBV_ACCESS_OPTIONAL_RANGE;
	if ((access & ~known) ||
	    ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE)) ||
	    length == 0) {
		errno = EINVAL;
		return NULL;
	}
	if (!range_readable(addr, length)) {
		errno = EFAULT;
		return NULL;
	}
	struct fab_mr *mr = calloc(1, sizeof(*mr));
	if (!mr) {
		errno = ENOMEM;
		return NULL;
	}
	pthread_rwlock_wrlock(&ctx->mr_lock);
	uint32_t idx = 1;
	while (idx < ctx->mr_cap && ctx->mr_tab[idx])
		idx++;
	if (idx >= ctx->mr_cap) {
		uint32_t old = ctx->mr_cap, ncap = old ? old * 2 : 64;
		struct fab_mr **t = ncap <= (1u << 24) ? realloc(ctx->mr_tab, ncap * sizeof(*t)) : NULL;
		if (t)
			ctx->mr_tab = t;
		uint8_t *g = t ? realloc(ctx->mr_gen, ncap) : NULL;
		if (!t || !g) {
			pthread_rwlock_unlock(&ctx->mr_lock);
			free(mr);
			errno = ENOMEM;
			return NULL;
		}
		memset(t + old, 0, (ncap - old) * sizeof(*t));
		memset(g + old, 0, ncap - old);
		ctx->mr_gen = g;
		ctx->mr_cap = ncap;
		idx = old ? old : 1;
	}
	uint32_t key = (idx << 8) | ++ctx->mr_gen[idx];
	mr->mr.context = pd->context;
	mr->mr.pd = pd;
	mr->mr.addr = addr;
	mr->mr.length = length;
	mr->mr.handle = idx;
	mr->mr.lkey = key;
	mr->mr.rkey = key;
	mr->iova = iova;
	mr->access = access;
	ctx->mr_tab[idx] = mr;
	pthread_rwlock_unlock(&ctx->mr_lock);
	return &mr->mr;
}

int fab_mr_find(struct fab_context *ctx, struct ibv_pd *pd, uint32_t key, uint64_t iova, uint64_t len,
		unsigned int access, uint64_t *va)
{
	uint32_t idx = key >> 8;
	if (idx == 0 || idx >= ctx->mr_cap)
		return -1;
	struct fab_mr *mr = ctx->mr_tab[idx];
	if (!mr || mr->mr.lkey != key || mr->mr.pd != pd || (mr->access & access) != access)
		return -1;
	if (iova < mr->iova || len > mr->mr.length || iova - mr->iova > mr->mr.length - len)
		return -1;
	if (va)
		*va = (uint64_t)(uintptr_t)mr->mr.addr + (iova - mr->iova);
	return 0;
}

int fab_mr_check(struct fab_context *ctx, struct ibv_pd *pd, uint32_t key, uint64_t iova, uint64_t len,
		 unsigned int access)
{
	pthread_rwlock_rdlock(&ctx->mr_lock);
	int r = fab_mr_find(ctx, pd, key, iova, len, access, NULL);
	pthread_rwlock_unlock(&ctx->mr_lock);
	return r;
}

FAB_EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
					   unsigned int access)
{
	return reg_mr(pd, addr, length, iova, access);
}

FAB_EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return reg_mr(pd, addr, length, (uintptr_t)addr, (unsigned int)access);
}

FAB_EXPORT struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access)
{
	return reg_mr(pd, addr, length, iova, (unsigned int)access);
}

FAB_EXPORT struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova,
					    int fd, int access)
{
	(void)pd;
	(void)offset;
	(void)length;
	(void)iova;
	(void)fd;
	(void)access;
	errno = EOPNOTSUPP;
	return NULL;
}

FAB_EXPORT int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t length,
			    int access)
{
	(void)mr;
	(void)flags;
	(void)pd;
	(void)addr;
	(void)length;
	(void)access;
	errno = EOPNOTSUPP;
	return IBV_REREG_MR_ERR_INPUT;
}

FAB_EXPORT int ibv_dereg_mr(struct ibv_mr *ibmr)
{
	struct fab_context *ctx = fab_ctx(ibmr->context);
	struct fab_mr *mr = (struct fab_mr *)ibmr;
	pthread_rwlock_wrlock(&ctx->mr_lock);
	uint32_t idx = ibmr->lkey >> 8;
	if (idx >= ctx->mr_cap || ctx->mr_tab[idx] != mr) {
		pthread_rwlock_unlock(&ctx->mr_lock);
		return EINVAL;
	}
	ctx->mr_tab[idx] = NULL;
	pthread_rwlock_unlock(&ctx->mr_lock);
	free(mr);
	return 0;
}

/* ------------------------------------------------------------------- CQ -- */

void fab_cq_push(struct fab_cq *cq, const struct ibv_wc *wc)
{
	int notify = 0, overrun = 0;
	pthread_mutex_lock(&cq->lock);
	if (cq->count == cq->cap) {
		overrun = !cq->overrun_reported;
		cq->overrun_reported = 1;
	} else {
		cq->ring[(cq->head + cq->count) % cq->cap] = *wc;
		cq->count++;
		if (cq->armed && cq->cq.channel) {
			cq->armed = 0;
			notify = 1;
		}
	}
	pthread_mutex_unlock(&cq->lock);
	if (overrun)
		fab_async_event(fab_ctx(cq->cq.context), IBV_EVENT_CQ_ERR, &cq->cq);
	if (notify) {
		struct fab_channel *ch = (struct fab_channel *)cq->cq.channel;
		struct fab_cq *p = cq;
		if (write(ch->wfd, &p, sizeof(p)) != (ssize_t)sizeof(p))
			fab_log("completion channel full");
	}
}

static int poll_cq(struct ibv_cq *ibcq, int num_entries, struct ibv_wc *wc)
{
	struct fab_cq *cq = (struct fab_cq *)ibcq;
	if (num_entries <= 0)
		return 0;
	int n = 0;
	for (int round = 0; round < 2; round++) {
		pthread_mutex_lock(&cq->lock);
		while (n < num_entries && cq->count) {
			wc[n++] = cq->ring[cq->head];
			cq->head = (cq->head + 1) % cq->cap;
			cq->count--;
		}
		pthread_mutex_unlock(&cq->lock);
		if (n || round)
			break;
		fab_poll_progress(fab_ctx(ibcq->context));
	}
	return n;
}

static int req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
	struct fab_cq *cq = (struct fab_cq *)ibcq;
	(void)solicited_only;
	pthread_mutex_lock(&cq->lock);
	cq->armed = 1;
	pthread_mutex_unlock(&cq->lock);
	return 0;
}

FAB_EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
					struct ibv_comp_channel *channel, int comp_vector)
{
	if (cqe < 1 || cqe > FAB_MAX_CQE || comp_vector < 0 || comp_vector >= context->num_comp_vectors) {
		errno = EINVAL;
		return NULL;
	}
	struct fab_cq *cq = calloc(1, sizeof(*cq));
	uint32_t cap = 1;
	while (cap < (uint32_t)cqe + 1)
		cap <<= 1;
	struct ibv_wc *ring = calloc(cap, sizeof(*ring));
	if (!cq || !ring) {
		free(cq);
		free(ring);
		errno = ENOMEM;
		return NULL;
	}
	cq->ring = ring;
	cq->cap = cap;
	pthread_mutex_init(&cq->lock, NULL);
	cq->cq.context = context;
	cq->cq.channel = channel;
	cq->cq.cq_context = cq_context;
	cq->cq.cqe = (int)cap - 1;
	pthread_mutex_init(&cq->cq.mutex, NULL);
	pthread_cond_init(&cq->cq.cond, NULL);
	if (channel)
		__atomic_add_fetch(&channel->refcnt, 1, __ATOMIC_SEQ_CST);
	return &cq->cq;
}

static struct ibv_cq_ex *create_cq_ex(struct ibv_context *context, struct ibv_cq_init_attr_ex *attr)
{
	(void)context;
	(void)attr;
	errno = EOPNOTSUPP;
	return NULL;
}

FAB_EXPORT int ibv_resize_cq(struct ibv_cq *ibcq, int cqe)
{
	(void)ibcq;
	(void)cqe;
	return EOPNOTSUPP;
}

FAB_EXPORT int ibv_destroy_cq(struct ibv_cq *ibcq)
{
	struct fab_cq *cq = (struct fab_cq *)ibcq;
	if (__atomic_load_n(&cq->users, __ATOMIC_SEQ_CST))
		return EBUSY;
	if (ibcq->channel)
		__atomic_sub_fetch(&ibcq->channel->refcnt, 1, __ATOMIC_SEQ_CST);
	free(cq->ring);
	free(cq);
	return 0;
}

FAB_EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context)
{
	struct fab_channel *ch = calloc(1, sizeof(*ch));
	int p[2];
	if (!ch || pipe2(p, O_CLOEXEC)) {
		free(ch);
		return NULL;
	}
	fcntl(p[1], F_SETFL, O_NONBLOCK);
	ch->ch.context = context;
	ch->ch.fd = p[0];
	ch->wfd = p[1];
	return &ch->ch;
}

FAB_EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
	struct fab_channel *ch = (struct fab_channel *)channel;
	if (__atomic_load_n(&channel->refcnt, __ATOMIC_SEQ_CST))
		return EBUSY;
	close(ch->ch.fd);
	close(ch->wfd);
	free(ch);
	return 0;
}

FAB_EXPORT int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context)
{
	struct fab_cq *p;
	if (read(channel->fd, &p, sizeof(p)) != (ssize_t)sizeof(p))
		return -1;
	*cq = &p->cq;
	*cq_context = p->cq.cq_context;
	return 0;
}

FAB_EXPORT void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	pthread_mutex_lock(&cq->mutex);
	cq->comp_events_completed += nevents;
	pthread_cond_signal(&cq->cond);
	pthread_mutex_unlock(&cq->mutex);
}

/* ---------------------------------------------------------- receive queue -- */

static int rq_init(struct fab_rq *rq, uint32_t cap, uint32_t max_sge)
{
	rq->cap = cap ? cap : 1;
	rq->max_sge = max_sge ? max_sge : 1;
	rq->ring = calloc(rq->cap, sizeof(*rq->ring));
	rq->sges = calloc((size_t)rq->cap * rq->max_sge, sizeof(*rq->sges));
	if (!rq->ring || !rq->sges) {
		free(rq->ring);
		free(rq->sges);
		return -1;
	}
	for (uint32_t i = 0; i < rq->cap; i++)
		rq->ring[i].sge = rq->sges + (size_t)i * rq->max_sge;
	return 0;
}

static void rq_free(struct fab_rq *rq)
{
	free(rq->ring);
	free(rq->sges);
}

/* 0, or an errno with *bad set */
static int rq_post(struct fab_rq *rq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	for (; wr; wr = wr->next) {
		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > rq->max_sge) {
			*bad = wr;
			return EINVAL;
		}
		if (rq->count == rq->cap) {
			*bad = wr;
			return ENOMEM;
		}
		struct fab_rwqe *e = &rq->ring[(rq->head + rq->count) % rq->cap];
		e->wr_id = wr->wr_id;
		e->nsge = (uint32_t)wr->num_sge;
		if (e->nsge)
			memcpy(e->sge, wr->sg_list, sizeof(*e->sge) * e->nsge);
		rq->count++;
	}
	return 0;
}

/* ------------------------------------------------------------------ SRQ -- */

static int post_srq_recv(struct ibv_srq *ibsrq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct fab_srq *srq = (struct fab_srq *)ibsrq;
	pthread_mutex_lock(&srq->lock);
	int r = rq_post(&srq->rq, wr, bad);
	int wake = srq->stalled;
	srq->stalled = 0;
	pthread_mutex_unlock(&srq->lock);
	if (wake)
		fab_wake(fab_ctx(ibsrq->context));
	return r;
}

FAB_EXPORT struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
	if (attr->attr.max_wr < 1 || attr->attr.max_wr > FAB_MAX_QP_WR || attr->attr.max_sge > FAB_MAX_SGE) {
		errno = EINVAL;
		return NULL;
	}
	struct fab_srq *srq = calloc(1, sizeof(*srq));
	if (!srq || rq_init(&srq->rq, attr->attr.max_wr, attr->attr.max_sge)) {
		free(srq);
		errno = ENOMEM;
		return NULL;
	}
	pthread_mutex_init(&srq->lock, NULL);
	srq->srq.context = pd->context;
	srq->srq.srq_context = attr->srq_context;
	srq->srq.pd = pd;
	pthread_mutex_init(&srq->srq.mutex, NULL);
	pthread_cond_init(&srq->srq.cond, NULL);
	srq->limit = attr->attr.srq_limit;
	attr->attr.max_wr = srq->rq.cap;
	attr->attr.max_sge = srq->rq.max_sge;
	return &srq->srq;
}

FAB_EXPORT int ibv_modify_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr, int mask)
{
	struct fab_srq *srq = (struct fab_srq *)ibsrq;
	if (mask & IBV_SRQ_MAX_WR)
		return EINVAL;
	if (mask & IBV_SRQ_LIMIT)
		srq->limit = attr->srq_limit;
	return 0;
}

FAB_EXPORT int ibv_query_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr)
{
	struct fab_srq *srq = (struct fab_srq *)ibsrq;
	attr->max_wr = srq->rq.cap;
	attr->max_sge = srq->rq.max_sge;
	attr->srq_limit = srq->limit;
	return 0;
}

FAB_EXPORT int ibv_destroy_srq(struct ibv_srq *ibsrq)
{
	struct fab_srq *srq = (struct fab_srq *)ibsrq;
	rq_free(&srq->rq);
	free(srq);
	return 0;
}

/* ------------------------------------------------------------------- QP -- */

static void wc_flush(struct fab_qp *qp, struct fab_cq *cq, uint64_t wr_id, enum ibv_wc_opcode op)
{
	struct ibv_wc wc;
	memset(&wc, 0, sizeof(wc));
	wc.wr_id = wr_id;
	wc.status = IBV_WC_WR_FLUSH_ERR;
	wc.opcode = op;
	wc.qp_num = qp->qp.qp_num;
	fab_cq_push(cq, &wc);
}

/* with qp->lock: every receive of a QP in ERR completes with a flush error */
static void rq_flush(struct fab_qp *qp)
{
	if (qp->srq)
		return;
	while (qp->rq.count) {
		wc_flush(qp, (struct fab_cq *)qp->qp.recv_cq, qp->rq.ring[qp->rq.head].wr_id, IBV_WC_RECV);
		qp->rq.head = (qp->rq.head + 1) % qp->rq.cap;
		qp->rq.count--;
	}
}

void fab_sq_settle(struct fab_qp *qp)
{
	struct fab_cq *scq = (struct fab_cq *)qp->qp.send_cq;
	if (qp->qp.state == IBV_QPS_ERR) {
		while (qp->sq_head < qp->sq_tail) {
			struct fab_swqe *w = &qp->sq[qp->sq_head % qp->sq_cap];
			wc_flush(qp, scq, w->wr_id, (enum ibv_wc_opcode)w->wc_op);
			qp->sq_head++;
		}
		qp->sq_tx = qp->sq_tail;
		qp->tx_off = 0;
		rq_flush(qp);
		return;
	}
	if (qp->sq_head == qp->sq_tx && qp->sq_tx < qp->sq_tail) {
		struct fab_swqe *w = &qp->sq[qp->sq_head % qp->sq_cap];
		if (w->lerr || qp->link_down) {
			struct ibv_wc wc;
			memset(&wc, 0, sizeof(wc));
			wc.wr_id = w->wr_id;
			wc.status = w->lerr ? (enum ibv_wc_status)w->lerr : IBV_WC_RETRY_EXC_ERR;
			wc.opcode = (enum ibv_wc_opcode)w->wc_op;
			wc.qp_num = qp->qp.qp_num;
			fab_cq_push(scq, &wc);
			qp->sq_head++;
			qp->sq_tx = qp->sq_head;
			qp->tx_off = 0;
			fab_qp_to_err(qp);
		}
	}
}

static int post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct fab_qp *qp = (struct fab_qp *)ibqp;
	struct fab_context *ctx = fab_ctx(ibqp->context);
	int r = 0, port_failed = 0;
	pthread_mutex_lock(&qp->lock);
	if (qp->qp.state != IBV_QPS_RTS && qp->qp.state != IBV_QPS_ERR && qp->qp.state != IBV_QPS_SQD) {
		*bad = wr;
		r = EINVAL;
		goto out;
	}
	for (; wr; wr = wr->next) {
		uint8_t op, wc_op;
		switch (wr->opcode) {
		case IBV_WR_RDMA_WRITE: op = FAB_OP_WRITE; wc_op = IBV_WC_RDMA_WRITE; break;
		case IBV_WR_RDMA_WRITE_WITH_IMM: op = FAB_OP_WRITE_IMM; wc_op = IBV_WC_RDMA_WRITE; break;
		case IBV_WR_SEND: op = FAB_OP_SEND; wc_op = IBV_WC_SEND; break;
		case IBV_WR_SEND_WITH_IMM: op = FAB_OP_SEND_IMM; wc_op = IBV_WC_SEND; break;
		case IBV_WR_RDMA_READ: op = FAB_OP_READ; wc_op = IBV_WC_RDMA_READ; break;
		case IBV_WR_ATOMIC_CMP_AND_SWP: op = FAB_OP_CMP_SWP; wc_op = IBV_WC_COMP_SWAP; break;
		case IBV_WR_ATOMIC_FETCH_AND_ADD: op = FAB_OP_FETCH_ADD; wc_op = IBV_WC_FETCH_ADD; break;
		default: *bad = wr; r = EINVAL; goto out;
		}
		/* an atomic returns the 8-byte original value into its one SGE */
		if (fab_op_atomic(op) && (wr->num_sge != 1 || wr->sg_list[0].length != 8)) {
			*bad = wr;
			r = EINVAL;
			goto out;
		}
		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->sq_max_sge) {
			*bad = wr;
			r = EINVAL;
			goto out;
		}
		uint64_t total = 0;
		for (int i = 0; i < wr->num_sge; i++)
			total += wr->sg_list[i].length;
		int inl = (wr->send_flags & IBV_SEND_INLINE) && !fab_op_answered(op);
		if (total > FAB_MAX_MSG || (inl && total > qp->sq_max_inl)) {
			*bad = wr;
			r = EINVAL;
			goto out;
		}
		if (qp->sq_tail - qp->sq_head >= qp->sq_cap) {
			*bad = wr;
			r = ENOMEM;
			goto out;
		}
		/* RIVET_FABRIC_FAIL_PORT=...@<n>wr: this WR and the later ones never leave */
		if (fab_port_count_send(ctx->fdev, qp->port)) {
			port_failed = 1;
			fab_qp_cut(qp);
		}
		struct fab_swqe *w = &qp->sq[qp->sq_tail % qp->sq_cap];
		memset(&w->hdr, 0, sizeof(w->hdr));
		w->hdr.op = op;
		w->hdr.flags = (uint8_t)(FAB_REQ_RNR_SET | (qp->rnr_retry & FAB_REQ_RNR_RETRY));
		w->hdr.len = (uint32_t)total;
		w->hdr.raddr = wr->wr.rdma.remote_addr;
		w->hdr.rkey = wr->wr.rdma.rkey;
		if (fab_op_atomic(op)) {
			w->hdr.raddr = wr->wr.atomic.remote_addr;
			w->hdr.rkey = wr->wr.atomic.rkey;
			w->atomic_args[0] = wr->wr.atomic.compare_add;
			w->atomic_args[1] = wr->wr.atomic.swap;
		}
		w->hdr.imm = (op == FAB_OP_WRITE_IMM || op == FAB_OP_SEND_IMM) ? wr->imm_data : 0;
		w->wr_id = wr->wr_id;
		w->len = (uint32_t)total;
		w->wc_op = wc_op;
		w->signaled = qp->sq_sig_all || (wr->send_flags & IBV_SEND_SIGNALED);
		w->inl = (uint8_t)inl;
		w->lerr = 0;
		w->nsge = 0;
		if (inl) {
			uint32_t off = 0;
			for (int i = 0; i < wr->num_sge; i++) {
				memcpy(w->inl_buf + off, (void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
				off += wr->sg_list[i].length;
			}
		} else {
			unsigned int need = fab_op_answered(op) ? IBV_ACCESS_LOCAL_WRITE : 0;
			pthread_rwlock_rdlock(&ctx->mr_lock);
			for (int i = 0; i < wr->num_sge; i++) {
				const struct ibv_sge *s = &wr->sg_list[i];
				if (s->length == 0)
					continue;
				uint64_t va;
				if (fab_mr_find(ctx, ibqp->pd, s->lkey, s->addr, s->length, need, &va)) {
					w->lerr = IBV_WC_LOC_PROT_ERR;
					break;
				}
				/* keep the local address: the stream reads and writes it directly */
				w->sge[w->nsge].addr = va;
				w->sge[w->nsge].length = s->length;
				w->sge[w->nsge].lkey = s->lkey;
				w->nsge++;
			}
			pthread_rwlock_unlock(&ctx->mr_lock);
		}
		qp->sq_tail++;
	}
out:
	fab_sq_settle(qp);
	fab_qp_tx(qp);
	if (qp->link_cut && !qp->cut_clock_ns && qp->sq_head < qp->sq_tail)
		qp->cut_clock_ns = fab_now_ns(); /* the retry timer of a WR posted to an idle cut QP */
	pthread_mutex_unlock(&qp->lock);
	if (port_failed)
		fab_wake_device(ctx->fdev); /* the progress threads cut the port's other QPs */
	return r;
}

static int post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct fab_qp *qp = (struct fab_qp *)ibqp;
	if (qp->srq) {
		*bad = wr;
		return EINVAL;
	}
	pthread_mutex_lock(&qp->lock);
	int r;
	if (qp->qp.state == IBV_QPS_RESET) {
		*bad = wr;
		r = EINVAL;
	} else {
		r = rq_post(&qp->rq, wr, bad);
	}
	if (qp->qp.state == IBV_QPS_ERR)
		rq_flush(qp);
	else if (qp->rnr_stalled)
		fab_qp_enable_in(qp);
	pthread_mutex_unlock(&qp->lock);
	return r;
}

static void cq_use(struct ibv_cq *cq, int d)
{
	if (cq)
		__atomic_add_fetch(&((struct fab_cq *)cq)->users, d, __ATOMIC_SEQ_CST);
}

static struct ibv_qp *create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	struct ibv_context *context = pd->context;
	struct fab_context *ctx = fab_ctx(context);
	struct ibv_qp_cap *c = &attr->cap;
	if (attr->qp_type != IBV_QPT_RC) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (!attr->send_cq || !attr->recv_cq || c->max_send_wr > FAB_MAX_QP_WR || c->max_recv_wr > FAB_MAX_QP_WR ||
	    c->max_send_sge > FAB_MAX_SGE || c->max_recv_sge > FAB_MAX_SGE || c->max_inline_data > FAB_MAX_INLINE) {
		errno = EINVAL;
		return NULL;
	}
	struct fab_qp *qp = calloc(1, sizeof(*qp));
	if (!qp) {
		errno = ENOMEM;
		return NULL;
	}
	qp->sq_cap = c->max_send_wr ? c->max_send_wr : 1;
	qp->sq_max_sge = c->max_send_sge ? c->max_send_sge : 1;
	qp->sq_max_inl = c->max_inline_data;
	qp->sq = calloc(qp->sq_cap, sizeof(*qp->sq));
	qp->sq_sges = calloc((size_t)qp->sq_cap * qp->sq_max_sge, sizeof(*qp->sq_sges));
	qp->sq_inl = qp->sq_max_inl ? malloc((size_t)qp->sq_cap * qp->sq_max_inl) : NULL;
	int bad = !qp->sq || !qp->sq_sges || (qp->sq_max_inl && !qp->sq_inl);
	if (!bad && !attr->srq)
		bad = rq_init(&qp->rq, c->max_recv_wr, c->max_recv_sge) != 0;
	if (bad) {
		free(qp->sq);
		free(qp->sq_sges);
		free(qp->sq_inl);
		free(qp);
		errno = ENOMEM;
		return NULL;
	}
	for (uint32_t i = 0; i < qp->sq_cap; i++) {
		qp->sq[i].sge = qp->sq_sges + (size_t)i * qp->sq_max_sge;
		qp->sq[i].inl_buf = qp->sq_inl ? qp->sq_inl + (size_t)i * qp->sq_max_inl : NULL;
	}
	pthread_mutex_init(&qp->lock, NULL);
	qp->srq = (struct fab_srq *)attr->srq;
	qp->sq_sig_all = attr->sq_sig_all;
	qp->cap = *c;
	qp->cap.max_send_wr = qp->sq_cap;
	qp->cap.max_send_sge = qp->sq_max_sge;
	if (!attr->srq) {
		qp->cap.max_recv_wr = qp->rq.cap;
		qp->cap.max_recv_sge = qp->rq.max_sge;
	}
	qp->qp.context = context;
	qp->qp.qp_context = attr->qp_context;
	qp->qp.pd = pd;
	qp->qp.send_cq = attr->send_cq;
	qp->qp.recv_cq = attr->recv_cq;
	qp->qp.srq = attr->srq;
	qp->qp.state = IBV_QPS_RESET;
	qp->qp.qp_type = IBV_QPT_RC;
	pthread_mutex_init(&qp->qp.mutex, NULL);
	pthread_cond_init(&qp->qp.cond, NULL);
	fab_sock_init(&qp->lsn, FAB_SK_LISTEN, qp);
	fab_sock_init(&qp->in, FAB_SK_IN, qp);
	fab_sock_init(&qp->out, FAB_SK_OUT, qp);
	int e = fab_engine_start(ctx);
	if (!e)
		e = fab_qp_listen(qp);
	if (e) {
		if (!attr->srq)
			rq_free(&qp->rq);
		free(qp->sq);
		free(qp->sq_sges);
		free(qp->sq_inl);
		free(qp);
		errno = e;
		return NULL;
	}
	cq_use(attr->send_cq, 1);
	cq_use(attr->recv_cq, 1);
	pthread_mutex_lock(&ctx->lock);
	qp->next = ctx->qps;
	ctx->qps = qp;
	pthread_mutex_unlock(&ctx->lock);
	*c = qp->cap;
	fab_log("created QP %u", qp->qp.qp_num);
	return &qp->qp;
}

FAB_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	return create_qp(pd, attr);
}

static struct ibv_qp *create_qp_ex(struct ibv_context *context, struct ibv_qp_init_attr_ex *ax)
{
	(void)context;
	if ((ax->comp_mask & ~(uint32_t)(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS)) ||
	    !(ax->comp_mask & IBV_QP_INIT_ATTR_PD) ||
	    ((ax->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && ax->create_flags)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_context = ax->qp_context;
	a.send_cq = ax->send_cq;
	a.recv_cq = ax->recv_cq;
	a.srq = ax->srq;
	a.cap = ax->cap;
	a.qp_type = ax->qp_type;
	a.sq_sig_all = ax->sq_sig_all;
	struct ibv_qp *qp = create_qp(ax->pd, &a);
	if (qp)
		ax->cap = a.cap;
	return qp;
}

enum {
	M_STATE = IBV_QP_STATE,
	M_RESET_INIT = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
	M_INIT_RTR_REQ = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
			 IBV_QP_MIN_RNR_TIMER,
	M_INIT_RTR_OPT = IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX,
	M_RTR_RTS_REQ = IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC,
	M_RTS_OPT = IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
		    IBV_QP_PATH_MIG_STATE,
};

/* the kernel's table for RC: required and optional attributes of each transition */
static int transition_ok(enum ibv_qp_state cur, enum ibv_qp_state nxt, int mask)
{
	int req = 0, opt = 0;
	if (nxt == IBV_QPS_RESET || nxt == IBV_QPS_ERR) {
		opt = 0;
	} else {
		switch (cur) {
		case IBV_QPS_RESET:
			if (nxt != IBV_QPS_INIT)
				return 0;
			req = M_RESET_INIT;
			break;
		case IBV_QPS_INIT:
			if (nxt == IBV_QPS_INIT) {
				opt = M_RESET_INIT;
			} else if (nxt == IBV_QPS_RTR) {
				req = M_INIT_RTR_REQ;
				opt = M_INIT_RTR_OPT;
			} else {
				return 0;
			}
			break;
		case IBV_QPS_RTR:
			if (nxt != IBV_QPS_RTS)
				return 0;
			req = M_RTR_RTS_REQ;
			opt = M_RTS_OPT;
			break;
		case IBV_QPS_RTS:
			if (nxt != IBV_QPS_RTS)
				return 0;
			opt = M_RTS_OPT;
			break;
		default: return 0;
		}
	}
	int given = mask & ~M_STATE;
	return (given & req) == req && (given & ~(req | opt)) == 0;
}

static int modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask)
{
	struct fab_qp *qp = (struct fab_qp *)ibqp;
	int r = 0;
	pthread_mutex_lock(&qp->lock);
	enum ibv_qp_state cur = qp->qp.state;
	if ((mask & IBV_QP_CUR_STATE) && attr->cur_qp_state != cur) {
		r = EINVAL;
		goto out;
	}
	enum ibv_qp_state nxt = (mask & IBV_QP_STATE) ? attr->qp_state : cur;
	if (!transition_ok(cur, nxt, mask)) {
		r = EINVAL;
		goto out;
	}
	if ((mask & IBV_QP_PORT) && (attr->port_num < 1 || attr->port_num > fab_ctx(ibqp->context)->fdev->nports)) {
		r = EINVAL;
		goto out;
	}
	if ((mask & IBV_QP_PKEY_INDEX) && attr->pkey_index != 0) {
		r = EINVAL;
		goto out;
	}
	if ((mask & IBV_QP_DEST_QPN) && attr->dest_qp_num > 0xffffff) {
		r = EINVAL;
		goto out;
	}
	if ((mask & IBV_QP_PATH_MTU) && (attr->path_mtu < IBV_MTU_256 || attr->path_mtu > IBV_MTU_4096)) {
		r = EINVAL;
		goto out;
	}
	if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && attr->max_rd_atomic > 16) {
		r = EINVAL;
		goto out;
	}
	if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && attr->max_dest_rd_atomic > 16) {
		r = EINVAL;
		goto out;
	}
	if ((mask & IBV_QP_TIMEOUT) && attr->timeout > 31) {
		r = EINVAL;
		goto out;
	}
	if ((mask & IBV_QP_RETRY_CNT) && attr->retry_cnt > 7) {
		r = EINVAL;
		goto out;
	}
	if ((mask & IBV_QP_RNR_RETRY) && attr->rnr_retry > 7) {
		r = EINVAL;
		goto out;
	}
	if (mask & IBV_QP_PORT)
		qp->port = attr->port_num;
	if (mask & IBV_QP_PKEY_INDEX)
		qp->pkey_index = attr->pkey_index;
	if (mask & IBV_QP_ACCESS_FLAGS)
		qp->access = attr->qp_access_flags;
	if (mask & IBV_QP_PATH_MTU)
		qp->mtu = attr->path_mtu;
	if (mask & IBV_QP_DEST_QPN)
		qp->dest_qpn = attr->dest_qp_num;
	if (mask & IBV_QP_RQ_PSN)
		qp->rq_psn = attr->rq_psn;
	if (mask & IBV_QP_SQ_PSN)
		qp->sq_psn = attr->sq_psn;
	if (mask & IBV_QP_AV)
		qp->ah = attr->ah_attr;
	if (mask & IBV_QP_TIMEOUT)
		qp->timeout = attr->timeout;
	if (mask & IBV_QP_RETRY_CNT)
		qp->retry_cnt = attr->retry_cnt;
	if (mask & IBV_QP_RNR_RETRY)
		qp->rnr_retry = attr->rnr_retry;
	if (mask & IBV_QP_MIN_RNR_TIMER)
		qp->min_rnr_timer = attr->min_rnr_timer;
	if (mask & IBV_QP_MAX_QP_RD_ATOMIC)
		qp->max_rd_atomic = attr->max_rd_atomic;
	if (mask & IBV_QP_MAX_DEST_RD_ATOMIC)
		qp->max_dest_rd_atomic = attr->max_dest_rd_atomic;
	if ((mask & IBV_QP_PORT) && fab_port_is_down(fab_ctx(ibqp->context)->fdev, qp->port))
		fab_qp_cut(qp); /* bound to a failed port: it never gets an answer */
	if (nxt == cur)
		goto out;
	switch (nxt) {
	case IBV_QPS_RESET:
		fab_qp_close_socks(qp);
		qp->sq_head = qp->sq_tx = qp->sq_tail = 0;
		qp->tx_off = 0;
		qp->rq.head = qp->rq.count = 0;
		qp->link_down = qp->rnr_waiting = qp->rnr_stalled = qp->rnr_nakked = 0;
		qp->rnr_deadline_ns = 0;
		qp->link_cut = 0;
		qp->cut_clock_ns = 0;
		qp->qp.state = IBV_QPS_RESET;
		break;
	case IBV_QPS_ERR: fab_qp_to_err(qp); break;
	case IBV_QPS_RTR:
		qp->qp.state = IBV_QPS_RTR;
		if (!qp->link_cut)
			fab_qp_connect(qp);
		fab_qp_enable_in(qp);
		break;
	default: qp->qp.state = nxt; break;
	}
	fab_log("QP %u: %d -> %d", qp->qp.qp_num, cur, nxt);
out:
	pthread_mutex_unlock(&qp->lock);
	return r;
}

FAB_EXPORT int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask)
{
	return modify_qp(qp, attr, attr_mask);
}

FAB_EXPORT int ibv_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int attr_mask,
			    struct ibv_qp_init_attr *init_attr)
{
	struct fab_qp *qp = (struct fab_qp *)ibqp;
	(void)attr_mask;
	pthread_mutex_lock(&qp->lock);
	memset(attr, 0, sizeof(*attr));
	attr->qp_state = qp->qp.state;
	attr->cur_qp_state = qp->qp.state;
	attr->path_mtu = qp->mtu;
	attr->path_mig_state = IBV_MIG_MIGRATED;
	attr->rq_psn = qp->rq_psn;
	attr->sq_psn = qp->sq_psn;
	attr->dest_qp_num = qp->dest_qpn;
	attr->qp_access_flags = qp->access;
	attr->cap = qp->cap;
	attr->ah_attr = qp->ah;
	attr->pkey_index = qp->pkey_index;
	attr->max_rd_atomic = qp->max_rd_atomic;
	attr->max_dest_rd_atomic = qp->max_dest_rd_atomic;
	attr->min_rnr_timer = qp->min_rnr_timer;
	attr->port_num = qp->port;
	attr->timeout = qp->timeout;
	attr->retry_cnt = qp->retry_cnt;
	attr->rnr_retry = qp->rnr_retry;
	if (init_attr) {
		memset(init_attr, 0, sizeof(*init_attr));
		init_attr->qp_context = ibqp->qp_context;
		init_attr->send_cq = ibqp->send_cq;
		init_attr->recv_cq = ibqp->recv_cq;
		init_attr->srq = ibqp->srq;
		init_attr->cap = qp->cap;
		init_attr->qp_type = IBV_QPT_RC;
		init_attr->sq_sig_all = qp->sq_sig_all;
	}
	pthread_mutex_unlock(&qp->lock);
	return 0;
}

FAB_EXPORT int ibv_destroy_qp(struct ibv_qp *ibqp)
{
	struct fab_qp *qp = (struct fab_qp *)ibqp;
	struct fab_context *ctx = fab_ctx(ibqp->context);
	pthread_mutex_lock(&ctx->lock);
	for (struct fab_qp **pp = &ctx->qps; *pp; pp = &(*pp)->next)
		if (*pp == qp) {
			*pp = qp->next;
			break;
		}
	pthread_mutex_lock(&qp->lock);
	qp->dead = 1;
	fab_qp_close_socks(qp);
	fab_qp_close_listen(qp);
	pthread_mutex_unlock(&qp->lock);
	cq_use(ibqp->send_cq, -1);
	cq_use(ibqp->recv_cq, -1);
	qp->grave_next = ctx->grave;
	ctx->grave = qp;
	pthread_mutex_unlock(&ctx->lock);
	fab_wake(ctx); /* the engine frees the graveyard after its current batch */
	return 0;
}

FAB_EXPORT struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
	(void)qp;
	return NULL;
}

FAB_EXPORT int ibv_query_qp_data_in_order(struct ibv_qp *qp, enum ibv_wr_opcode op, uint32_t flags)
{
	(void)qp;
	(void)op;
	(void)flags;
	return 0;
}

FAB_EXPORT int ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	(void)qp;
	(void)ece;
	return EOPNOTSUPP;
}

FAB_EXPORT int ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	(void)qp;
	(void)ece;
	return EOPNOTSUPP;
}

void fab_device_ops(struct fab_context *ctx);

void fab_context_ops(struct fab_context *ctx)
{
	struct ibv_context_ops *o = &ctx->vctx.context.ops;
	o->poll_cq = poll_cq;
	o->req_notify_cq = req_notify_cq;
	o->post_send = post_send;
	o->post_recv = post_recv;
	o->post_srq_recv = post_srq_recv;
	ctx->vctx.create_qp_ex = create_qp_ex;
	ctx->vctx.create_cq_ex = create_cq_ex;
	fab_device_ops(ctx);
}
