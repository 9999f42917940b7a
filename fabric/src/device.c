/*
 * Devices, ports, the sysfs-like tree each device's ibdev_path points at, the
 * query verbs and the string helpers.
 */
#include "fabric.h"

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#undef ibv_query_port
#undef ibv_reg_mr

static struct fab_config cfg;
static struct fab_device *devs;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

uint64_t fab_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void fab_log(const char *fmt, ...)
{
	static int verbose = -1;
	int on = __atomic_load_n(&verbose, __ATOMIC_RELAXED);
	if (on < 0) {
		const char *v = getenv("RIVET_FABRIC_DEBUG");
		on = v && *v && strcmp(v, "0") != 0;
		__atomic_store_n(&verbose, on, __ATOMIC_RELAXED);
	}
	if (!on)
		return;
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "rivet-fabric[%d]: ", getpid());
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

static long env_long(const char *name, long def, long lo, long hi)
{
	const char *v = getenv(name);
	if (!v || !*v)
		return def;
	char *end;
	long x = strtol(v, &end, 0);
	if (*end || x < lo || x > hi) {
		fprintf(stderr, "rivet-fabric: %s=%s is out of range [%ld, %ld]; using %ld\n", name, v, lo, hi,
			def);
		return def;
	}
	return x;
}

uint16_t fab_lid(int dev, int port)
{
	return (uint16_t)(dev * FAB_MAX_PORTS + port);
}

int fab_lid_known(uint16_t lid)
{
	for (int d = 0; d < cfg.ndevs; d++)
		for (int p = 1; p <= cfg.nports; p++)
			if (fab_lid(d, p) == lid)
				return 1;
	return 0;
}

static uint64_t port_guid(int dev, int port)
{
	return devs[dev].node_guid + (uint64_t)port;
}

void fab_port_gid(int dev, int port, union ibv_gid *gid)
{
	memset(gid, 0, sizeof(*gid));
	if (cfg.eth) {
		/* IPv4-mapped 127.0.<dev>.<port>: a RoCE v2 GID the way the kernel builds one */
		gid->raw[10] = 0xff;
		gid->raw[11] = 0xff;
		gid->raw[12] = 127;
		gid->raw[13] = 0;
		gid->raw[14] = (uint8_t)dev;
		gid->raw[15] = (uint8_t)port;
	} else {
		gid->global.subnet_prefix = htobe64(0xfe80000000000000ull);
		gid->global.interface_id = htobe64(port_guid(dev, port));
	}
}

/* ------------------------------------------------------------- sysfs tree -- */

static int mkdirs(const char *path)
{
	char tmp[IBV_SYSFS_PATH_MAX * 2];
	snprintf(tmp, sizeof(tmp), "%s", path);
	for (char *p = tmp + 1; *p; p++) {
		if (*p == '/') {
			*p = 0;
			if (mkdir(tmp, 0755) && errno != EEXIST)
				return -1;
			*p = '/';
		}
	}
	if (mkdir(tmp, 0755) && errno != EEXIST)
		return -1;
	return 0;
}

static void put_file(const char *dir, const char *name, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void put_file(const char *dir, const char *name, const char *fmt, ...)
{
	char path[IBV_SYSFS_PATH_MAX * 2], tmp[IBV_SYSFS_PATH_MAX * 2 + 32], body[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(body, sizeof(body), fmt, ap);
	va_end(ap);
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	char *slash = strrchr(path, '/');
	*slash = 0;
	mkdirs(path);
	*slash = '/';
	/* several processes build the same tree at once: write aside, rename into place */
	snprintf(tmp, sizeof(tmp), "%s.%d.tmp", path, getpid());
	FILE *f = fopen(tmp, "w");
	if (!f)
		return;
	fputs(body, f);
	fclose(f);
	rename(tmp, path);
}

static void put_link(const char *target, const char *link)
{
	char tmp[IBV_SYSFS_PATH_MAX * 2 + 32];
	snprintf(tmp, sizeof(tmp), "%s.%d.tmp", link, getpid());
	unlink(tmp);
	if (symlink(target, tmp) == 0)
		rename(tmp, link);
}

static void guid_str(uint64_t g, char *out, size_t n)
{
	snprintf(out, n, "%04x:%04x:%04x:%04x", (unsigned)(g >> 48) & 0xffff, (unsigned)(g >> 32) & 0xffff,
		 (unsigned)(g >> 16) & 0xffff, (unsigned)g & 0xffff);
}

static void build_tree(struct fab_device *d)
{
	char dir[IBV_SYSFS_PATH_MAX * 2], g[64];
	const char *ib = d->dev.ibdev_path;
	mkdirs(ib);
	guid_str(d->node_guid, g, sizeof(g));
	put_file(ib, "node_guid", "%s\n", g);
	put_file(ib, "sys_image_guid", "%s\n", g);
	put_file(ib, "node_type", "1: CA\n");
	put_file(ib, "node_desc", "rivet-fabric %s\n", d->dev.name);
	put_file(ib, "fw_ver", "1.0.0\n");
	put_file(ib, "hca_type", "rivet-fabric\n");
	put_file(ib, "hw_rev", "0\n");
	put_file(ib, "board_id", "RIVET_FABRIC\n");
	for (int p = 1; p <= d->nports; p++) {
		snprintf(dir, sizeof(dir), "%s/ports/%d", ib, p);
		put_file(dir, "state", "4: ACTIVE\n");
		put_file(dir, "phys_state", "5: LinkUp\n");
		put_file(dir, "rate", "100 Gb/sec (4X EDR)\n");
		put_file(dir, "link_layer", cfg.eth ? "Ethernet\n" : "InfiniBand\n");
		put_file(dir, "lid", "0x%x\n", cfg.eth ? 0 : fab_lid(d->index, p));
		put_file(dir, "sm_lid", "0x%x\n", cfg.eth ? 0 : 1);
		put_file(dir, "sm_sl", "0\n");
		put_file(dir, "lid_mask_count", "0\n");
		put_file(dir, "cap_mask", "0x00010000\n");
		put_file(dir, "pkeys/0", "0xffff\n");
		union ibv_gid gid;
		fab_port_gid(d->index, p, &gid);
		char gs[64];
		int n = 0;
		for (int i = 0; i < 16; i += 2)
			n += snprintf(gs + n, sizeof(gs) - (size_t)n, "%s%02x%02x", i ? ":" : "", gid.raw[i],
				      gid.raw[i + 1]);
		put_file(dir, "gids/0", "%s\n", gs);
		if (cfg.eth) {
			put_file(dir, "gid_attrs/types/0", "RoCE v2\n");
			put_file(dir, "gid_attrs/ndevs/0", "lo\n");
		} else {
			/* real sysfs has these files on IB ports but reading them fails; an empty
			 * directory is the closest a plain file tree gets */
			snprintf(dir, sizeof(dir), "%s/ports/%d/gid_attrs/types", ib, p);
			mkdirs(dir);
		}
	}
	/* the PCI function the device hangs off */
	const char *pci = d->pci_dir;
	mkdirs(pci);
	put_file(pci, "vendor", "0x1af4\n");
	put_file(pci, "device", "0x10ff\n");
	put_file(pci, "subsystem_vendor", "0x1af4\n");
	put_file(pci, "subsystem_device", "0x0000\n");
	put_file(pci, "class", "0x020700\n");
	put_file(pci, "numa_node", "-1\n");
	put_file(pci, "local_cpulist", "0-%ld\n", sysconf(_SC_NPROCESSORS_CONF) - 1);
	put_file(pci, "max_link_speed", "16.0 GT/s PCIe\n");
	put_file(pci, "max_link_width", "16\n");
	put_file(pci, "current_link_speed", "16.0 GT/s PCIe\n");
	put_file(pci, "current_link_width", "16\n");
	snprintf(dir, sizeof(dir), "%s/device", ib);
	put_link(pci, dir);
	/* the uverbs class device */
	put_file(d->dev.dev_path, "ibdev", "%s\n", d->dev.name);
	put_file(d->dev.dev_path, "abi_version", "1\n");
}

static void fabric_init(void)
{
	cfg.ndevs = (int)env_long("RIVET_FABRIC_DEVICES", 1, 0, 64);
	cfg.nports = (int)env_long("RIVET_FABRIC_PORTS", 1, 1, FAB_MAX_PORTS - 1);
	const char *ll = getenv("RIVET_FABRIC_LINK_LAYER");
	cfg.eth = ll && (strcasecmp(ll, "ethernet") == 0 || strcasecmp(ll, "eth") == 0 ||
			 strcasecmp(ll, "roce") == 0);
	cfg.timeout_cap_ns =
		(uint64_t)env_long("RIVET_FABRIC_TIMEOUT_CAP_MS", 10000, 1, 3600 * 1000) * 1000000ull;
	const char *pre = getenv("RIVET_FABRIC_NAME");
	snprintf(cfg.prefix, sizeof(cfg.prefix), "%s", pre && *pre ? pre : "rfab");
	const char *root = getenv("RIVET_FABRIC_DIR");
	if (root && *root) {
		snprintf(cfg.root, sizeof(cfg.root), "%s", root);
	} else {
		const char *run = getenv("XDG_RUNTIME_DIR");
		if (run && *run && access(run, W_OK) == 0)
			snprintf(cfg.root, sizeof(cfg.root), "%s/rivet-fabric", run);
		else
			snprintf(cfg.root, sizeof(cfg.root), "/tmp/rivet-fabric-%u", (unsigned)getuid());
	}
	devs = calloc((size_t)(cfg.ndevs ? cfg.ndevs : 1), sizeof(*devs));
	if (!devs) {
		cfg.ndevs = 0;
		return;
	}
	for (int i = 0; i < cfg.ndevs; i++) {
		struct fab_device *d = &devs[i];
		d->index = i;
		d->nports = cfg.nports;
		d->node_guid = 0x5256464200000000ull | ((uint64_t)(i + 1) << 8);
		d->dev.node_type = IBV_NODE_CA;
		d->dev.transport_type = IBV_TRANSPORT_IB;
		snprintf(d->dev.name, sizeof(d->dev.name), "%s%d", cfg.prefix, i);
		snprintf(d->dev.dev_name, sizeof(d->dev.dev_name), "uverbs%d", i);
		snprintf(d->dev.dev_path, sizeof(d->dev.dev_path), "%s/sys/class/infiniband_verbs/uverbs%d",
			 cfg.root, i);
		snprintf(d->dev.ibdev_path, sizeof(d->dev.ibdev_path), "%s/sys/class/infiniband/%s", cfg.root,
			 d->dev.name);
		snprintf(d->pci_dir, sizeof(d->pci_dir), "%s/sys/devices/pci0000:00/0000:00:%02x.0", cfg.root,
			 0x10 + i);
		build_tree(d);
	}
	fab_port_init();
}

const struct fab_config *fab_config(void)
{
	pthread_once(&init_once, fabric_init);
	return &cfg;
}

struct fab_device *fab_device_named(const char *name)
{
	for (int i = 0; i < cfg.ndevs; i++)
		if (strcmp(devs[i].dev.name, name) == 0)
			return &devs[i];
	return NULL;
}

/* ---------------------------------------------------------- device list -- */

FAB_EXPORT struct ibv_device **ibv_get_device_list(int *num_devices)
{
	fab_config();
	struct ibv_device **l = calloc((size_t)cfg.ndevs + 1, sizeof(*l));
	if (!l) {
		errno = ENOMEM;
		return NULL;
	}
	for (int i = 0; i < cfg.ndevs; i++)
		l[i] = &devs[i].dev;
	if (num_devices)
		*num_devices = cfg.ndevs;
	return l;
}

FAB_EXPORT void ibv_free_device_list(struct ibv_device **list)
{
	free(list);
}

FAB_EXPORT const char *ibv_get_device_name(struct ibv_device *device)
{
	return device->name;
}

FAB_EXPORT __be64 ibv_get_device_guid(struct ibv_device *device)
{
	return htobe64(((struct fab_device *)device)->node_guid);
}

FAB_EXPORT int ibv_get_device_index(struct ibv_device *device)
{
	return ((struct fab_device *)device)->index;
}

FAB_EXPORT int ibv_fork_init(void)
{
	return 0;
}

FAB_EXPORT enum ibv_fork_status ibv_is_fork_initialized(void)
{
	return IBV_FORK_UNNEEDED;
}

FAB_EXPORT int ibv_dontfork_range(void *base, size_t size)
{
	(void)base;
	(void)size;
	return 0;
}

FAB_EXPORT int ibv_dofork_range(void *base, size_t size)
{
	(void)base;
	(void)size;
	return 0;
}

/* --------------------------------------------------------- open / close -- */

/* --------------------------------------------------------------- fork -- */

/* Every open context, for the fork handlers. */
static pthread_mutex_t contexts_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fab_context *contexts;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void fork_prepare(void)
{
	pthread_mutex_lock(&contexts_lock);
	for (struct fab_context *c = contexts; c; c = c->next)
		pthread_mutex_lock(&c->lock);
}

static void fork_parent(void)
{
	for (struct fab_context *c = contexts; c; c = c->next)
		pthread_mutex_unlock(&c->lock);
	pthread_mutex_unlock(&contexts_lock);
}

/* The child has no progress thread and, as with rdma-core, may not use the parent's
 * verbs objects. It must not keep the parent's connections open either: the parent's
 * peers would then never see the parent die. Close (never EPOLL_CTL_DEL: the epoll set
 * is shared with the parent) every socket the child inherited. */
static void fork_child(void)
{
	for (struct fab_context *c = contexts; c; c = c->next) {
		for (struct fab_qp *qp = c->qps; qp; qp = qp->next) {
			struct fab_sock *socks[3] = {&qp->lsn, &qp->in, &qp->out};
			for (int i = 0; i < 3; i++)
				if (socks[i]->fd >= 0) {
					close(socks[i]->fd);
					socks[i]->fd = -1;
				}
			qp->link_down = 1;
		}
		c->thread_started = 0;
		pthread_mutex_unlock(&c->lock);
	}
	pthread_mutex_unlock(&contexts_lock);
}

static void register_fork_handlers(void)
{
	pthread_atfork(fork_prepare, fork_parent, fork_child);
}

/* one of the device's ports failed: every open context of it is to cut its QPs (fab_ports_apply) */
void fab_wake_device(struct fab_device *d)
{
	pthread_mutex_lock(&contexts_lock);
	for (struct fab_context *c = contexts; c; c = c->next)
		if (c->fdev == d)
			fab_wake(c);
	pthread_mutex_unlock(&contexts_lock);
}

FAB_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	struct fab_device *d = (struct fab_device *)device;
	fab_config();
	if (!d || d < devs || d >= devs + cfg.ndevs) {
		errno = ENODEV;
		return NULL;
	}
	struct fab_context *ctx = calloc(1, sizeof(*ctx));
	if (!ctx) {
		errno = ENOMEM;
		return NULL;
	}
	int p[2];
	if (pipe2(p, O_CLOEXEC) != 0) {
		free(ctx);
		return NULL;
	}
	fcntl(p[1], F_SETFL, O_NONBLOCK);
	ctx->fdev = d;
	pthread_mutex_init(&ctx->lock, NULL);
	pthread_mutex_init(&ctx->plock, NULL);
	pthread_rwlock_init(&ctx->mr_lock, NULL);
	ctx->async_wfd = p[1];
	ctx->epfd = -1;
	ctx->wake.fd = -1;
	struct ibv_context *c = &ctx->vctx.context;
	c->device = device;
	c->cmd_fd = -1;
	c->async_fd = p[0];
	c->num_comp_vectors = 1;
	pthread_mutex_init(&c->mutex, NULL);
	c->abi_compat = __VERBS_ABI_IS_EXTENDED;
	ctx->vctx.sz = sizeof(struct verbs_context);
	fab_context_ops(ctx);
	pthread_once(&atfork_once, register_fork_handlers);
	pthread_mutex_lock(&contexts_lock);
	ctx->next = contexts;
	contexts = ctx;
	pthread_mutex_unlock(&contexts_lock);
	return c;
}

FAB_EXPORT int ibv_close_device(struct ibv_context *context)
{
	struct fab_context *ctx = fab_ctx(context);
	pthread_mutex_lock(&contexts_lock);
	for (struct fab_context **pp = &contexts; *pp; pp = &(*pp)->next)
		if (*pp == ctx) {
			*pp = ctx->next;
			break;
		}
	pthread_mutex_unlock(&contexts_lock);
	fab_engine_stop(ctx);
	close(context->async_fd);
	close(ctx->async_wfd);
	pthread_rwlock_wrlock(&ctx->mr_lock);
	free(ctx->mr_tab);
	free(ctx->mr_gen);
	pthread_rwlock_unlock(&ctx->mr_lock);
	free(ctx);
	return 0;
}

/* ----------------------------------------------------------------- query -- */

static void fill_device_attr(struct fab_device *d, struct ibv_device_attr *a)
{
	memset(a, 0, sizeof(*a));
	snprintf(a->fw_ver, sizeof(a->fw_ver), "1.0.0");
	a->node_guid = htobe64(d->node_guid);
	a->sys_image_guid = htobe64(d->node_guid);
	a->max_mr_size = UINT64_MAX;
	a->page_size_cap = 0xfffff000;
	a->vendor_id = 0x1af4;
	a->vendor_part_id = 0x10ff;
	a->hw_ver = 0;
	a->max_qp = 1 << 18;
	a->max_qp_wr = FAB_MAX_QP_WR;
	a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SHUTDOWN_PORT | IBV_DEVICE_SYS_IMAGE_GUID |
			      IBV_DEVICE_PORT_ACTIVE_EVENT;
	a->max_sge = FAB_MAX_SGE;
	a->max_sge_rd = FAB_MAX_SGE;
	a->max_cq = 1 << 18;
	a->max_cqe = FAB_MAX_CQE;
	a->max_mr = 1 << 20;
	a->max_pd = 1 << 18;
	a->max_qp_rd_atom = 16;
	a->max_ee_rd_atom = 0;
	a->max_res_rd_atom = 16 << 18;
	a->max_qp_init_rd_atom = 16;
	a->atomic_cap = IBV_ATOMIC_HCA; /* atomic among the fabric's own atomics */
	a->max_srq = 1 << 16;
	a->max_srq_wr = FAB_MAX_QP_WR;
	a->max_srq_sge = FAB_MAX_SGE;
	a->max_pkeys = 1;
	a->local_ca_ack_delay = 16;
	a->phys_port_cnt = (uint8_t)d->nports;
}

FAB_EXPORT int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *device_attr)
{
	fill_device_attr(fab_ctx(context)->fdev, device_attr);
	return 0;
}

static int query_device_ex(struct ibv_context *context, const struct ibv_query_device_ex_input *input,
			   struct ibv_device_attr_ex *attr, size_t attr_size)
{
	(void)input;
	struct ibv_device_attr_ex full;
	memset(&full, 0, sizeof(full));
	fill_device_attr(fab_ctx(context)->fdev, &full.orig_attr);
	full.max_dm_size = 0;
	if (attr_size < sizeof(full.orig_attr))
		return EINVAL;
	memset(attr, 0, attr_size);
	memcpy(attr, &full, attr_size < sizeof(full) ? attr_size : sizeof(full));
	return 0;
}

static void fill_port_attr(struct fab_device *d, uint8_t port, struct ibv_port_attr *a)
{
	memset(a, 0, sizeof(*a));
	a->state = IBV_PORT_ACTIVE;
	a->max_mtu = IBV_MTU_4096;
	a->active_mtu = IBV_MTU_4096;
	a->gid_tbl_len = 1;
	a->port_cap_flags = IBV_PORT_CM_SUP;
	a->max_msg_sz = FAB_MAX_MSG;
	a->pkey_tbl_len = 1;
	a->lid = cfg.eth ? 0 : fab_lid(d->index, port);
	a->sm_lid = cfg.eth ? 0 : 1;
	a->lmc = 0;
	a->max_vl_num = 1;
	a->subnet_timeout = 18;
	a->active_width = 2;  /* 4X */
	a->active_speed = 32; /* EDR: 25 Gb/s per lane */
	a->phys_state = 5;    /* LinkUp */
	a->link_layer = cfg.eth ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
	if (fab_port_is_down(d, port)) {
		a->state = IBV_PORT_DOWN;
		a->phys_state = 2; /* Polling: no link partner, as with the cable pulled */
	}
}

static int port_ok(struct ibv_context *context, uint32_t port)
{
	return port >= 1 && (int)port <= fab_ctx(context)->fdev->nports;
}

static int query_port_sized(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *port_attr,
			    size_t len)
{
	if (!port_ok(context, port_num))
		return EINVAL;
	/* a program that commands a failure and then asks finds the port down and its QPs cut */
	fab_port_poll();
	fab_ports_apply(fab_ctx(context));
	struct ibv_port_attr a;
	fill_port_attr(fab_ctx(context)->fdev, port_num, &a);
	/* a caller built against newer headers passes a larger struct (NCCL's has
	 * active_speed_ex): what this ABI does not know about reads as zero */
	memset(port_attr, 0, len);
	memcpy(port_attr, &a, len < sizeof(a) ? len : sizeof(a));
	return 0;
}

/* the exported symbol gets the old (compat) struct: fill what it has, up to `flags` */
FAB_EXPORT int ibv_query_port(struct ibv_context *context, uint8_t port_num, struct _compat_ibv_port_attr *port_attr)
{
	return query_port_sized(context, port_num, (struct ibv_port_attr *)port_attr,
				__builtin_offsetof(struct ibv_port_attr, port_cap_flags2));
}

FAB_EXPORT int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid)
{
	if (!port_ok(context, port_num) || index != 0) {
		errno = EINVAL;
		return -1;
	}
	fab_port_gid(fab_ctx(context)->fdev->index, port_num, gid);
	return 0;
}

FAB_EXPORT int _ibv_query_gid_ex(struct ibv_context *context, uint32_t port_num, uint32_t gid_index,
				 struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size)
{
	(void)flags;
	if (!port_ok(context, port_num) || entry_size < sizeof(*entry))
		return EINVAL;
	if (gid_index != 0)
		return ENODATA;
	memset(entry, 0, sizeof(*entry));
	fab_port_gid(fab_ctx(context)->fdev->index, (int)port_num, &entry->gid);
	entry->gid_index = 0;
	entry->port_num = port_num;
	entry->gid_type = cfg.eth ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_IB;
	entry->ndev_ifindex = cfg.eth ? 1 : 0;
	return 0;
}

FAB_EXPORT ssize_t _ibv_query_gid_table(struct ibv_context *context, struct ibv_gid_entry *entries,
					size_t max_entries, uint32_t flags, size_t entry_size)
{
	struct fab_device *d = fab_ctx(context)->fdev;
	if (entry_size < sizeof(*entries))
		return -EINVAL;
	size_t n = 0;
	for (int p = 1; p <= d->nports && n < max_entries; p++) {
		int r = _ibv_query_gid_ex(context, (uint32_t)p, 0, &entries[n], flags, entry_size);
		if (r)
			return -r;
		n++;
	}
	return (ssize_t)n;
}

int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index, int *type);
FAB_EXPORT int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index, int *type)
{
	if (!port_ok(context, port_num) || index != 0) {
		errno = EINVAL;
		return -1;
	}
	*type = cfg.eth ? 2 /* RoCE v2 */ : 0 /* IB/RoCE v1 */;
	return 0;
}

FAB_EXPORT int ibv_query_pkey(struct ibv_context *context, uint8_t port_num, int index, __be16 *pkey)
{
	if (!port_ok(context, port_num) || index != 0) {
		errno = EINVAL;
		return -1;
	}
	*pkey = htobe16(0xffff);
	return 0;
}

FAB_EXPORT int ibv_get_pkey_index(struct ibv_context *context, uint8_t port_num, __be16 pkey)
{
	if (!port_ok(context, port_num))
		return -EINVAL;
	return (be16toh(pkey) & 0x7fff) == 0x7fff ? 0 : -ENOENT;
}

/* ----------------------------------------------------- sysfs file access -- */

int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size);
FAB_EXPORT int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size)
{
	char path[IBV_SYSFS_PATH_MAX * 2];
	snprintf(path, sizeof(path), "%s/%s", dir, file);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, size);
	close(fd);
	if (n <= 0)
		return -1;
	if ((size_t)n == size)
		n--;
	buf[n] = 0;
	if (n > 0 && buf[n - 1] == '\n')
		buf[--n] = 0;
	return (int)n;
}

int ibv_get_sysfs_path(char *buf, size_t size);
FAB_EXPORT int ibv_get_sysfs_path(char *buf, size_t size)
{
	fab_config();
	snprintf(buf, size, "%s/sys", cfg.root);
	return 0;
}

/* --------------------------------------------------------------- strings -- */

FAB_EXPORT const char *ibv_node_type_str(enum ibv_node_type node_type)
{
	static const char *const s[] = {"unknown", "InfiniBand channel adapter", "InfiniBand switch",
					"InfiniBand router", "iWARP NIC", "usNIC", "usNIC UDP", "unspecified"};
	int i = node_type + 1;
	if (i < 0 || i >= (int)(sizeof(s) / sizeof(s[0])))
		return "unknown";
	return s[i];
}

FAB_EXPORT const char *ibv_port_state_str(enum ibv_port_state port_state)
{
	static const char *const s[] = {"PORT_NOP", "PORT_DOWN", "PORT_INIT", "PORT_ARMED", "PORT_ACTIVE",
					"PORT_ACTIVE_DEFER"};
	if ((unsigned)port_state >= sizeof(s) / sizeof(s[0]))
		return "unknown";
	return s[port_state];
}

FAB_EXPORT const char *ibv_event_type_str(enum ibv_event_type event)
{
	static const char *const s[] = {
		[IBV_EVENT_CQ_ERR] = "CQ error",
		[IBV_EVENT_QP_FATAL] = "local work queue catastrophic error",
		[IBV_EVENT_QP_REQ_ERR] = "invalid request local work queue error",
		[IBV_EVENT_QP_ACCESS_ERR] = "local access violation work queue error",
		[IBV_EVENT_COMM_EST] = "communication established",
		[IBV_EVENT_SQ_DRAINED] = "send queue drained",
		[IBV_EVENT_PATH_MIG] = "path migrated",
		[IBV_EVENT_PATH_MIG_ERR] = "path migration request error",
		[IBV_EVENT_DEVICE_FATAL] = "local catastrophic error",
		[IBV_EVENT_PORT_ACTIVE] = "port active",
		[IBV_EVENT_PORT_ERR] = "port error",
		[IBV_EVENT_LID_CHANGE] = "LID change",
		[IBV_EVENT_PKEY_CHANGE] = "P_Key change",
		[IBV_EVENT_SM_CHANGE] = "SM change",
		[IBV_EVENT_SRQ_ERR] = "SRQ catastrophic error",
		[IBV_EVENT_SRQ_LIMIT_REACHED] = "SRQ limit reached",
		[IBV_EVENT_QP_LAST_WQE_REACHED] = "last WQE reached",
		[IBV_EVENT_CLIENT_REREGISTER] = "client reregistration",
		[IBV_EVENT_GID_CHANGE] = "GID table change",
		[IBV_EVENT_WQ_FATAL] = "WQ fatal",
	};
	if ((unsigned)event >= sizeof(s) / sizeof(s[0]) || !s[event])
		return "unknown";
	return s[event];
}

FAB_EXPORT const char *ibv_wc_status_str(enum ibv_wc_status status)
{
	static const char *const s[] = {
		[IBV_WC_SUCCESS] = "success",
		[IBV_WC_LOC_LEN_ERR] = "local length error",
		[IBV_WC_LOC_QP_OP_ERR] = "local QP operation error",
		[IBV_WC_LOC_EEC_OP_ERR] = "local EE context operation error",
		[IBV_WC_LOC_PROT_ERR] = "local protection error",
		[IBV_WC_WR_FLUSH_ERR] = "Work Request Flushed Error",
		[IBV_WC_MW_BIND_ERR] = "memory management operation error",
		[IBV_WC_BAD_RESP_ERR] = "bad response error",
		[IBV_WC_LOC_ACCESS_ERR] = "local access error",
		[IBV_WC_REM_INV_REQ_ERR] = "remote invalid request error",
		[IBV_WC_REM_ACCESS_ERR] = "remote access error",
		[IBV_WC_REM_OP_ERR] = "remote operation error",
		[IBV_WC_RETRY_EXC_ERR] = "transport retry counter exceeded",
		[IBV_WC_RNR_RETRY_EXC_ERR] = "RNR retry counter exceeded",
		[IBV_WC_LOC_RDD_VIOL_ERR] = "local RDD violation error",
		[IBV_WC_REM_INV_RD_REQ_ERR] = "remote invalid RD request",
		[IBV_WC_REM_ABORT_ERR] = "aborted error",
		[IBV_WC_INV_EECN_ERR] = "invalid EE context number",
		[IBV_WC_INV_EEC_STATE_ERR] = "invalid EE context state",
		[IBV_WC_FATAL_ERR] = "fatal error",
		[IBV_WC_RESP_TIMEOUT_ERR] = "response timeout error",
		[IBV_WC_GENERAL_ERR] = "general error",
		[IBV_WC_TM_ERR] = "TM error",
		[IBV_WC_TM_RNDV_INCOMPLETE] = "TM software rendezvous",
	};
	if ((unsigned)status >= sizeof(s) / sizeof(s[0]) || !s[status])
		return "unknown";
	return s[status];
}

FAB_EXPORT int ibv_rate_to_mult(enum ibv_rate rate)
{
	switch (rate) {
	case IBV_RATE_2_5_GBPS: return 1;
	case IBV_RATE_5_GBPS: return 2;
	case IBV_RATE_10_GBPS: return 4;
	case IBV_RATE_20_GBPS: return 8;
	case IBV_RATE_30_GBPS: return 12;
	case IBV_RATE_40_GBPS: return 16;
	case IBV_RATE_60_GBPS: return 24;
	case IBV_RATE_80_GBPS: return 32;
	case IBV_RATE_120_GBPS: return 48;
	default: return -1;
	}
}

FAB_EXPORT enum ibv_rate mult_to_ibv_rate(int mult)
{
	switch (mult) {
	case 1: return IBV_RATE_2_5_GBPS;
	case 2: return IBV_RATE_5_GBPS;
	case 4: return IBV_RATE_10_GBPS;
	case 8: return IBV_RATE_20_GBPS;
	case 12: return IBV_RATE_30_GBPS;
	case 16: return IBV_RATE_40_GBPS;
	case 24: return IBV_RATE_60_GBPS;
	case 32: return IBV_RATE_80_GBPS;
	case 48: return IBV_RATE_120_GBPS;
	default: return IBV_RATE_MAX;
	}
}

FAB_EXPORT int ibv_rate_to_mbps(enum ibv_rate rate)
{
	switch (rate) {
	case IBV_RATE_2_5_GBPS: return 2500;
	case IBV_RATE_5_GBPS: return 5000;
	case IBV_RATE_10_GBPS: return 10000;
	case IBV_RATE_20_GBPS: return 20000;
	case IBV_RATE_25_GBPS: return 25000;
	case IBV_RATE_40_GBPS: return 40000;
	case IBV_RATE_50_GBPS: return 50000;
	case IBV_RATE_56_GBPS: return 56250;
	case IBV_RATE_100_GBPS: return 100000;
	case IBV_RATE_200_GBPS: return 200000;
	case IBV_RATE_400_GBPS: return 400000;
	default: return -1;
	}
}

FAB_EXPORT enum ibv_rate mbps_to_ibv_rate(int mbps)
{
	switch (mbps) {
	case 2500: return IBV_RATE_2_5_GBPS;
	case 10000: return IBV_RATE_10_GBPS;
	case 25000: return IBV_RATE_25_GBPS;
	case 40000: return IBV_RATE_40_GBPS;
	case 100000: return IBV_RATE_100_GBPS;
	case 200000: return IBV_RATE_200_GBPS;
	case 400000: return IBV_RATE_400_GBPS;
	default: return IBV_RATE_MAX;
	}
}

void fab_device_ops(struct fab_context *ctx);
void fab_device_ops(struct fab_context *ctx)
{
	ctx->vctx.query_port = query_port_sized;
	ctx->vctx.query_device_ex = query_device_ex;
	ctx->vctx.context.ops._compat_query_device = ibv_query_device;
	ctx->vctx.context.ops._compat_query_port = ibv_query_port;
}
