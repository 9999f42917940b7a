/*
 * Failing a port on command, the way a cut cable looks to the RC queue pairs bound to it
 * (docs/fabric.md, "Failing a port"). Two ways to command it: RIVET_FABRIC_CTL names a file
 * whose "fail-port <device> <port>" lines this process applies whenever the file changes, and
 * RIVET_FABRIC_FAIL_PORT=<device>:<port>@<n>ms|wr fails a port at a chosen time or send. A
 * failure belongs to this process only and lasts as long as it does. Here is only the port
 * state; the engine cuts the QPs (fab_qp_cut, fab_ports_apply).
 */
#include "fabric.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* RIVET_FABRIC_FAIL_PORT: one port, failed at a time or as a send WR on it is posted */
static struct {
	struct fab_device *dev; /* NULL: no timed failure */
	int port;
	uint64_t at_ns;   /* __atomic: fail at this time; 0: not by time, or done */
	uint64_t at_send; /* fail as the at_send-th send WR on the port is posted; 0: not by count */
	uint64_t sends;   /* __atomic: send WRs posted on the port so far */
} timed;

static const char *ctl_path;
static pthread_mutex_t ctl_lock = PTHREAD_MUTEX_INITIALIZER;
static struct stat ctl_seen; /* the control file as last read: read again when it changes */

static void parse_timed(const char *v)
{
	/* <device>:<port>@<n>ms or <device>:<port>@<n>wr */
	char name[64];
	int port, used = 0;
	unsigned long long n;
	char unit[3];
	if (sscanf(v, "%63[^:]:%d@%llu%2[a-z]%n", name, &port, &n, unit, &used) != 4 || v[used] || n == 0 ||
	    (strcmp(unit, "ms") && strcmp(unit, "wr"))) {
		fprintf(stderr, "rivet-fabric: RIVET_FABRIC_FAIL_PORT=%s is not <device>:<port>@<n>ms or @<n>wr; ignored\n",
			v);
		return;
	}
	struct fab_device *d = fab_device_named(name);
	if (!d || port < 1 || port > d->nports) {
		fprintf(stderr, "rivet-fabric: RIVET_FABRIC_FAIL_PORT=%s: no port %d on a device %s; ignored\n", v, port,
			name);
		return;
	}
	timed.dev = d;
	timed.port = port;
	if (unit[0] == 'm')
		timed.at_ns = fab_now_ns() + n * 1000000ull;
	else
		timed.at_send = n;
}

/* once, when the fabric initialises in this process (the ms count starts here) */
void fab_port_init(void)
{
	const char *v = getenv("RIVET_FABRIC_FAIL_PORT");
	if (v && *v)
		parse_timed(v);
	v = getenv("RIVET_FABRIC_CTL");
	if (v && *v)
		ctl_path = v;
}

int fab_port_is_down(struct fab_device *d, int port)
{
	return port >= 1 && port < FAB_MAX_PORTS && (__atomic_load_n(&d->ports_down, __ATOMIC_ACQUIRE) >> port & 1);
}

/* 1 if the port was up until now; the caller then wakes the device's contexts (fab_wake_device)
 * unless it holds a QP's lock */
int fab_port_fail(struct fab_device *d, int port)
{
	uint32_t bit = 1u << port;
	if (__atomic_fetch_or(&d->ports_down, bit, __ATOMIC_ACQ_REL) & bit)
		return 0;
	fab_log("%s port %d: down", d->dev.name, port);
	return 1;
}

/* one line of the control file; 0 if it is not a command */
static int ctl_line(char *line)
{
	char *save, *cmd = strtok_r(line, " \t\r", &save);
	if (!cmd || cmd[0] == '#')
		return 1;
	char *name = strtok_r(NULL, " \t\r", &save), *port = strtok_r(NULL, " \t\r", &save);
	if (strcmp(cmd, "fail-port") || !name || !port || strtok_r(NULL, " \t\r", &save))
		return 0;
	char *end;
	long p = strtol(port, &end, 10);
	struct fab_device *d = fab_device_named(name);
	if (*end || !d || p < 1 || p > d->nports)
		return 0;
	if (fab_port_fail(d, (int)p))
		fab_wake_device(d);
	return 1;
}

/* Apply the control file if it changed since it was last read. Only whole lines count: a line
 * still being written is taken when its newline arrives (the file changes again then). Failing
 * is idempotent, so the whole file is applied each time; removing a line repairs nothing. */
static void ctl_read(void)
{
	struct stat st;
	if (stat(ctl_path, &st)) {
		memset(&ctl_seen, 0, sizeof(ctl_seen)); /* its creation is a change */
		return;
	}
	if (st.st_ino == ctl_seen.st_ino && st.st_dev == ctl_seen.st_dev && st.st_size == ctl_seen.st_size &&
	    st.st_mtim.tv_sec == ctl_seen.st_mtim.tv_sec && st.st_mtim.tv_nsec == ctl_seen.st_mtim.tv_nsec)
		return;
	FILE *f = fopen(ctl_path, "r");
	if (!f)
		return;
	ctl_seen = st;
	char *line = NULL;
	size_t cap = 0;
	ssize_t n;
	for (int no = 1; (n = getline(&line, &cap, f)) > 0; no++) {
		if (line[n - 1] != '\n')
			break;
		line[n - 1] = 0;
		char shown[128];
		snprintf(shown, sizeof(shown), "%s", line);
		if (!ctl_line(line))
			fprintf(stderr, "rivet-fabric: %s line %d: '%s' is not 'fail-port <device> <port>' naming a port of this fabric; ignored\n",
				ctl_path, no, shown);
	}
	free(line);
	fclose(f);
}

/* Commands due now: the timed failure, the control file. Called by every progress thread's timer
 * (50 ms) and by ibv_query_port; one caller reads the file at a time, the others go on. */
void fab_port_poll(void)
{
	uint64_t at = __atomic_load_n(&timed.at_ns, __ATOMIC_RELAXED);
	if (at && fab_now_ns() >= at && __atomic_compare_exchange_n(&timed.at_ns, &at, 0, 0, __ATOMIC_RELAXED,
								      __ATOMIC_RELAXED)) {
		if (fab_port_fail(timed.dev, timed.port))
			fab_wake_device(timed.dev);
	}
	if (ctl_path && pthread_mutex_trylock(&ctl_lock) == 0) {
		ctl_read();
		pthread_mutex_unlock(&ctl_lock);
	}
}

/* A send WR is being posted on a QP bound to `port` of `d`: 1 if it is the one that fails the port
 * (RIVET_FABRIC_FAIL_PORT=...@<n>wr); the caller cuts that QP before the WR is queued. */
int fab_port_count_send(struct fab_device *d, int port)
{
	if (!timed.at_send || d != timed.dev || port != timed.port)
		return 0;
	if (__atomic_add_fetch(&timed.sends, 1, __ATOMIC_RELAXED) != timed.at_send)
		return 0;
	return fab_port_fail(d, port);
}
