/*
 * Rivet's user-space verbs fabric: a stand-in for libibverbs.so.1 whose RC queue
 * pairs connect processes of one host through Unix stream sockets. A test
 * instrument only: never shipped in the plugin, never installed system-wide.
 *
 * Internal declarations shared by the translation units.
 */
#ifndef RIVET_FABRIC_H
#define RIVET_FABRIC_H

#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#define FAB_EXPORT __attribute__((visibility("default")))

#define FAB_MAX_SGE 30
#define FAB_MAX_INLINE 512
#define FAB_MAX_QP_WR 32768
#define FAB_MAX_CQE (4 * 1024 * 1024)
#define FAB_MAX_PORTS 16
#define FAB_STAGE 65536
#define FAB_STAGE_READ 8192
#define FAB_RESP_RING 64
#define FAB_MAX_MSG (1u << 31)

/* ---------------------------------------------------------------- wire -- */

enum fab_req_op {
	FAB_OP_WRITE = 1,
	FAB_OP_WRITE_IMM,
	FAB_OP_SEND,
	FAB_OP_SEND_IMM,
	FAB_OP_READ,
	FAB_OP_CMP_SWP,   /* payload: compare, swap (2 x u64) */
	FAB_OP_FETCH_ADD, /* payload: add, unused (2 x u64) */
};

static inline int fab_op_atomic(uint8_t op)
{
	return op == FAB_OP_CMP_SWP || op == FAB_OP_FETCH_ADD;
}

/* ops the responder answers with data (not with an ACK) */
static inline int fab_op_answered(uint8_t op)
{
	return op == FAB_OP_READ || fab_op_atomic(op);
}

/* fab_wire_req.flags: the requester's rnr_retry (7: forever), which its RNR NAKs need; without
 * FAB_REQ_RNR_SET (a requester built before it) the retries are endless */
#define FAB_REQ_RNR_RETRY 0x07
#define FAB_REQ_RNR_SET 0x08

/* requester -> responder, followed by `len` payload bytes for WRITE/SEND */
struct fab_wire_req {
	uint8_t op;
	uint8_t flags;
	uint16_t rsv;
	uint32_t len;
	uint64_t raddr;
	uint32_t rkey;
	uint32_t imm; /* network byte order, as the application gave it */
};

enum fab_resp_kind {
	FAB_R_ACK = 1,    /* val = number of requests completed */
	FAB_R_NAK_ACCESS, /* remote access error for the next request */
	FAB_R_NAK_INV,    /* remote invalid request (e.g. too long for the receive) */
	FAB_R_NAK_OP,     /* remote operation error (responder's local error) */
	FAB_R_READ,       /* val = length, followed by the data */
	FAB_R_RNR,        /* responder waits for a receive: not a completion */
	FAB_R_ATOMIC,     /* val = 8, followed by the original value */
	FAB_R_RNR_EXC,    /* no receive within the requester's RNR retries: the next request failed */
	FAB_R_CUT,        /* the link is cut (a failed port): nothing more comes on either stream */
};

struct fab_wire_resp {
	uint8_t kind;
	uint8_t rsv[3];
	uint32_t val;
};

#define FAB_HELLO_MAGIC 0x52564642u /* "RVFB" */
struct fab_wire_hello {
	uint32_t magic;
	uint32_t src_qpn;
	uint32_t dst_qpn;
	uint16_t dst_lid;
	uint16_t src_lid;
};

/* ------------------------------------------------------------- objects -- */

struct fab_device {
	/* verbs_device prefix: mlx5dv/efadv look at the pointer after ibv_device */
	struct ibv_device dev;
	const void *verbs_ops; /* always NULL: not a provider device */
	int index;
	int nports;
	uint32_t ports_down; /* __atomic: bit p set once port p failed in this process (port.c) */
	uint64_t node_guid; /* host order */
	char pci_dir[IBV_SYSFS_PATH_MAX];
};

struct fab_context;

struct fab_mr {
	struct ibv_mr mr;
	uint64_t iova; /* remote and local (sge) addresses are in this space */
	unsigned int access;
};

struct fab_cq {
	struct ibv_cq cq;
	pthread_mutex_t lock;
	struct ibv_wc *ring;
	uint32_t cap, head, count;
	int armed;
	int overrun_reported;
	int users;
};

struct fab_channel {
	struct ibv_comp_channel ch;
	int wfd;
};

struct fab_rwqe {
	uint64_t wr_id;
	uint32_t nsge;
	struct ibv_sge *sge;
};

struct fab_rq {
	struct fab_rwqe *ring;
	struct ibv_sge *sges;
	uint32_t cap, max_sge, head, count;
};

struct fab_srq {
	struct ibv_srq srq;
	pthread_mutex_t lock;
	struct fab_rq rq;
	uint32_t limit;
	int stalled; /* some QP waits for a receive on this SRQ */
};

struct fab_swqe {
	struct fab_wire_req hdr;
	uint64_t wr_id;
	uint32_t len;
	uint32_t nsge;
	uint8_t wc_op;
	uint8_t signaled;
	uint8_t inl;
	uint8_t lerr; /* nonzero: complete with this ibv_wc_status when it reaches the head */
	uint64_t atomic_args[2];
	struct ibv_sge *sge;
	uint8_t *inl_buf;
};

/* one destination segment of an incoming payload, re-validated per chunk */
struct fab_dseg {
	uint64_t addr;
	uint32_t len;
	uint32_t key;
};

enum fab_sock_kind { FAB_SK_LISTEN = 1, FAB_SK_IN, FAB_SK_OUT, FAB_SK_WAKE };
enum fab_rstate { FAB_RS_HELLO = 1, FAB_RS_HDR, FAB_RS_PAYLOAD };

struct fab_resp {
	struct fab_wire_resp hdr;
	uint32_t hdr_off;
	uint32_t rkey;
	uint64_t src;
	uint32_t len;
	uint32_t off;
	int owned;    /* the payload is `own` (an atomic's original value), not region memory */
	uint64_t own;
};

struct fab_qp;

struct fab_sock {
	/* identity: set when the QP is created and never written again, because the
	 * progress threads read them before taking the QP's lock */
	int kind;
	struct fab_qp *qp;
	/* state: cleared from here on when the socket opens or closes */
	int fd;
	uint32_t ev; /* events registered with epoll */
	uint8_t *st;
	uint32_t sb, se; /* staged bytes [sb, se) */
	int rd_capped;    /* read no more than rd_left bytes from the socket (a drain before ERR) */
	uint64_t rd_left;
	int rstate;
	/* payload being placed */
	struct fab_dseg dst[FAB_MAX_SGE];
	int ndst, di;
	uint32_t doff;
	uint64_t remaining;
	int discard;
	uint32_t pay_key_access; /* access the destination needs */
	/* responder: what completes when the payload is placed */
	uint8_t cur_op;
	uint64_t cur_raddr;
	uint32_t cur_rkey;
	uint64_t atomic_args[2];
	uint32_t cur_len;
	uint32_t cur_imm;
	int cur_has_rwqe;
	uint64_t cur_wr_id;
	/* responder output */
	struct fab_resp resp[FAB_RESP_RING];
	uint32_t rhead, rcount;
	uint32_t pending_ack;
	int closing; /* close once the responses are out */
	uint64_t last_ns;
};

struct fab_qp {
	struct ibv_qp qp;
	struct fab_qp *next; /* context list */
	struct fab_qp *grave_next;
	pthread_mutex_t lock;
	int dead;
	struct ibv_qp_cap cap;
	int sq_sig_all;
	/* attributes */
	uint8_t port;
	uint16_t pkey_index;
	unsigned int access;
	enum ibv_mtu mtu;
	uint32_t dest_qpn;
	uint32_t rq_psn, sq_psn;
	struct ibv_ah_attr ah;
	uint8_t timeout, retry_cnt, rnr_retry, min_rnr_timer;
	uint8_t max_rd_atomic, max_dest_rd_atomic;
	/* send queue: [head, tx) sent and unanswered, [tx, tail) not yet sent */
	struct fab_swqe *sq;
	struct ibv_sge *sq_sges;
	uint8_t *sq_inl;
	uint32_t sq_cap, sq_max_sge, sq_max_inl;
	uint64_t sq_head, sq_tx, sq_tail;
	uint64_t tx_off;
	struct fab_rq rq;
	struct fab_srq *srq;
	/* transport */
	struct fab_sock lsn, in, out;
	int link_down;
	pid_t out_peer_pid; /* the process that owns dest_qpn */
	int rnr_waiting;  /* requester: the responder holds our next request for want of a receive */
	int rnr_stalled;  /* responder: the request at the head of `in` waits for a receive */
	int rnr_nakked;   /* responder: ...and the requester was told (its RNR retries run) */
	uint64_t rnr_deadline_ns; /* responder: give up on it then; 0 = never (rnr_retry 7) */
	int err_draining; /* fab_qp_to_err is executing what had arrived before the transition */
	int link_cut;     /* its port, or its peer's, failed: nothing passes, WRs wait for the retry timer */
	uint64_t cut_clock_ns; /* link_cut: when the send queue's head began waiting; 0 = nothing waits */
};

struct fab_pd {
	struct ibv_pd pd;
};

struct fab_context {
	struct fab_device *fdev;
	struct fab_context *next; /* every open context, for fork */
	pthread_mutex_t lock;  /* qp list, graveyard, thread start */
	pthread_mutex_t plock; /* one round of progress at a time (engine or a polling thread) */
	uint64_t last_poll_ns; /* last progress round run by a polling thread */
	pthread_rwlock_t mr_lock;
	struct fab_mr **mr_tab;
	uint8_t *mr_gen;
	uint32_t mr_cap;
	int async_wfd;
	int epfd;
	struct fab_sock wake;
	pthread_t thread;
	int thread_started;
	int stop; /* __atomic */
	uint64_t rnr_due_ns; /* __atomic: earliest RNR deadline of a QP of this context, 0 = none */
	uint32_t ports_cut;  /* __atomic, written under lock: failed ports whose QPs this context cut */
	struct fab_qp *qps;
	struct fab_qp *grave;
	struct verbs_context vctx; /* must stay last: ibv_context ends the struct */
};

static inline struct fab_context *fab_ctx(struct ibv_context *c)
{
	return (struct fab_context *)((char *)c - __builtin_offsetof(struct fab_context, vctx.context));
}

/* ------------------------------------------------------------ settings -- */

struct fab_config {
	int ndevs;
	int nports;
	int eth; /* RoCE link layer */
	uint64_t timeout_cap_ns;
	char root[160];
	char prefix[24];
};

const struct fab_config *fab_config(void);
uint16_t fab_lid(int dev, int port);
void fab_port_gid(int dev, int port, union ibv_gid *gid);
int fab_lid_known(uint16_t lid);
struct fab_device *fab_device_named(const char *name);
void fab_wake_device(struct fab_device *d);
uint64_t fab_now_ns(void);
void fab_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* objects.c */
void fab_cq_push(struct fab_cq *cq, const struct ibv_wc *wc);
void fab_async_event(struct fab_context *ctx, enum ibv_event_type type, void *obj);
/* with ctx->mr_lock held: 0 and the local address, or -1 */
int fab_mr_find(struct fab_context *ctx, struct ibv_pd *pd, uint32_t key, uint64_t iova, uint64_t len,
		unsigned int access, uint64_t *va);
int fab_mr_check(struct fab_context *ctx, struct ibv_pd *pd, uint32_t key, uint64_t iova, uint64_t len,
		 unsigned int access);
void fab_context_ops(struct fab_context *ctx);

/* port.c */
void fab_port_init(void);
int fab_port_is_down(struct fab_device *d, int port);
int fab_port_fail(struct fab_device *d, int port);
void fab_port_poll(void);
int fab_port_count_send(struct fab_device *d, int port);

/* engine.c */
int fab_engine_start(struct fab_context *ctx);
void fab_engine_stop(struct fab_context *ctx);
int fab_qp_listen(struct fab_qp *qp);
int fab_qp_connect(struct fab_qp *qp);
void fab_qp_close_socks(struct fab_qp *qp);
void fab_qp_close_listen(struct fab_qp *qp);
void fab_qp_enable_in(struct fab_qp *qp);
void fab_qp_tx(struct fab_qp *qp);
void fab_qp_to_err(struct fab_qp *qp);
void fab_qp_cut(struct fab_qp *qp);
void fab_ports_apply(struct fab_context *ctx);
void fab_sq_settle(struct fab_qp *qp);
void fab_sock_set_events(struct fab_sock *s, uint32_t ev);
void fab_sock_init(struct fab_sock *s, int kind, struct fab_qp *qp);
void fab_wake(struct fab_context *ctx);
void fab_poll_progress(struct fab_context *ctx);

#endif
