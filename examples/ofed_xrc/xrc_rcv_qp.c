/*
 * An XRC receive QP shared by several processes, written as an OFED 1.5 user writes it from
 * ibv_create_xrc_rcv_qp(3), ibv_reg_xrc_rcv_qp(3) and their siblings. Built against softrdma's
 * <infiniband/ofed_xrc.h>, which declares that legacy API on top of today's verbs.h; the two
 * lines that differ from a program for OFED 1.5 itself are marked "OFED 1.5:".
 *
 * One program, four roles, meeting through small files in a directory DIR:
 *
 *   xrc_rcv_qp create DIR [--exit-registered]
 *                                    creates the receive QP in the domain of DIR/domain (which
 *                                    registers it), connects it to the sender, waits until the
 *                                    first round of messages went through it, unregisters (or
 *                                    not: its registration then ends with the process) and exits
 *   xrc_rcv_qp recv DIR NAME N [--after NAME...]
 *                                    an XRC SRQ of the same domain; registers for the receive
 *                                    QP, takes N messages per round for two rounds, unregisters;
 *                                    with --after it waits until those receivers unregistered,
 *                                    and after its own unregistration checks that the QP is gone
 *   xrc_rcv_qp send DIR N NAME...    the remote side: a send QP connected to the receive QP;
 *                                    round 1 sends N messages to each named SRQ, round 2 does it
 *                                    again once DIR/creator.gone exists
 *
 * Every wait is bounded (SOFTRDMA_EXAMPLE_WAIT seconds, 30 by default). Exit status 0 when the
 * role did all it should; messages on stderr say what went wrong otherwise.
 */
#include <infiniband/verbs.h>
#include <infiniband/ofed_xrc.h> /* softrdma: the OFED 1.5 XRC calls */

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { kMsgSize = 64, kRounds = 2, kMaxSrqs = 8 };

static const char *g_dir;
static const char *g_role = "?";

static void die(const char *fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "%s: ", g_role);
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(1);
}

static double now_s(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static double wait_limit(void) {
	const char *s = getenv("SOFTRDMA_EXAMPLE_WAIT");
	return s ? atof(s) : 30.0;
}

static void path_of(char *out, size_t n, const char *name) {
	snprintf(out, n, "%s/%s", g_dir, name);
}

/* Writes DIR/name atomically (a reader never sees half of it). */
static void publish(const char *name, const char *fmt, ...) {
	char path[512], tmp[520];
	path_of(path, sizeof path, name);
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	if (!f) die("cannot write %s: %s", tmp, strerror(errno));
	va_list ap;
	va_start(ap, fmt);
	vfprintf(f, fmt, ap);
	va_end(ap);
	if (fclose(f) != 0 || rename(tmp, path) != 0) die("cannot publish %s", path);
}

/* Waits (bounded) until DIR/name exists; returns its contents (static buffer). */
static const char *await(const char *name) {
	static char text[512];
	char path[512];
	path_of(path, sizeof path, name);
	double deadline = now_s() + wait_limit();
	for (;;) {
		FILE *f = fopen(path, "r");
		if (f) {
			size_t n = fread(text, 1, sizeof text - 1, f);
			fclose(f);
			text[n] = 0;
			return text;
		}
		if (now_s() > deadline) die("gave up waiting for %s", path);
		usleep(10000);
	}
}

static struct ibv_context *open_device(void) {
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n == 0) die("no RDMA device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	if (!ctx) die("ibv_open_device: %s", strerror(errno));
	return ctx;
}

static struct ibv_xrc_domain *open_domain(struct ibv_context *ctx, int *fd_out) {
	char path[512];
	path_of(path, sizeof path, "domain");
	int fd = open(path, O_RDWR | O_CREAT, 0600);
	if (fd < 0) die("open %s: %s", path, strerror(errno));
	struct ibv_xrc_domain *d = ibv_open_xrc_domain(ctx, fd, O_CREAT);
	if (!d) die("ibv_open_xrc_domain: %s", strerror(errno));
	*fd_out = fd;
	return d;
}

/* How one side is reached: LID and GID 0 of port 1 (the GID also across namespaces). */
struct address {
	uint32_t qpn;
	uint16_t lid;
	union ibv_gid gid;
};

static struct address local_address(struct ibv_context *ctx, uint32_t qpn) {
	struct address a = {.qpn = qpn};
	struct ibv_port_attr port;
	if (ibv_query_port(ctx, 1, &port)) die("ibv_query_port");
	a.lid = port.lid;
	if (ibv_query_gid(ctx, 1, 0, &a.gid)) die("ibv_query_gid");
	return a;
}

static void publish_address(const char *name, const struct address *a) {
	char gid[33];
	for (int i = 0; i < 16; ++i) sprintf(gid + 2 * i, "%02x", a->gid.raw[i]);
	publish(name, "%u %u %s\n", a->qpn, a->lid, gid);
}

static struct address read_address(const char *name) {
	struct address a;
	unsigned qpn, lid;
	char gid[33];
	if (sscanf(await(name), "%u %u %32s", &qpn, &lid, gid) != 3) die("bad %s", name);
	a.qpn = qpn;
	a.lid = (uint16_t)lid;
	for (int i = 0; i < 16; ++i) {
		unsigned byte;
		sscanf(gid + 2 * i, "%2x", &byte);
		a.gid.raw[i] = (uint8_t)byte;
	}
	return a;
}

static struct ibv_ah_attr path_to(const struct address *peer) {
	struct ibv_ah_attr ah = {0};
	ah.dlid = peer->lid;
	ah.port_num = 1;
	ah.is_global = 1;
	ah.grh.dgid = peer->gid;
	ah.grh.sgid_index = 0;
	ah.grh.hop_limit = 1;
	return ah;
}

/* ---- create: the receive QP's creator. */

static int run_create(int unregister) {
	struct ibv_context *ctx = open_device();
	int fd;
	struct ibv_xrc_domain *dom = open_domain(ctx, &fd);

	/* OFED 1.5: struct ibv_qp_init_attr init; (today's struct has no xrc_domain) */
	struct ibv_xrc_qp_init_attr init;
	memset(&init, 0, sizeof init);
	init.xrc_domain = dom;
	uint32_t qpn;
	int err = ibv_create_xrc_rcv_qp(&init, &qpn);
	if (err) die("ibv_create_xrc_rcv_qp: %s", strerror(err));

	struct address me = local_address(ctx, qpn);
	publish_address("rcv.qp", &me);
	struct address sender = read_address("send.qp");

	struct ibv_qp_attr attr;
	memset(&attr, 0, sizeof attr);
	attr.qp_state = IBV_QPS_INIT;
	attr.pkey_index = 0;
	attr.port_num = 1;
	attr.qp_access_flags = 0;
	err = ibv_modify_xrc_rcv_qp(dom, qpn, &attr,
	                            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
	                                IBV_QP_ACCESS_FLAGS);
	if (err) die("ibv_modify_xrc_rcv_qp(INIT): %s", strerror(err));
	memset(&attr, 0, sizeof attr);
	attr.qp_state = IBV_QPS_RTR;
	attr.path_mtu = IBV_MTU_1024;
	attr.dest_qp_num = sender.qpn;
	attr.rq_psn = 0;
	attr.max_dest_rd_atomic = 1;
	attr.min_rnr_timer = 12;
	attr.ah_attr = path_to(&sender);
	err = ibv_modify_xrc_rcv_qp(dom, qpn, &attr,
	                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
	                                IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
	                                IBV_QP_MIN_RNR_TIMER);
	if (err) die("ibv_modify_xrc_rcv_qp(RTR): %s", strerror(err));

	struct ibv_qp_init_attr seen;
	memset(&attr, 0, sizeof attr);
	err = ibv_query_xrc_rcv_qp(dom, qpn, &attr, IBV_QP_STATE | IBV_QP_DEST_QPN, &seen);
	if (err) die("ibv_query_xrc_rcv_qp: %s", strerror(err));
	if (attr.qp_state != IBV_QPS_RTR || attr.dest_qp_num != sender.qpn)
		die("query: state %d dest qpn %#x", attr.qp_state, attr.dest_qp_num);
	publish("rcv.ready", "%u\n", qpn);
	printf("create: receive QP %#x ready\n", qpn);

	/* Stays until the first round went through the QP while this process served it. */
	await("round1.done");
	if (!unregister) {
		printf("create: leaving registered; QP %#x stays for the others\n", qpn);
		return 0;
	}
	err = ibv_unreg_xrc_rcv_qp(dom, qpn);
	if (err) die("ibv_unreg_xrc_rcv_qp: %s", strerror(err));
	if (ibv_unreg_xrc_rcv_qp(dom, qpn) != EINVAL) die("a second unregistration did not fail");
	err = ibv_close_xrc_domain(dom);
	if (err) die("ibv_close_xrc_domain: %s", strerror(err));
	close(fd);
	ibv_close_device(ctx);
	printf("create: unregistered and leaving; QP %#x stays for the others\n", qpn);
	return 0;
}

/* ---- recv: a process receiving on its XRC SRQ through the shared receive QP. */

static int run_recv(const char *name, int per_round, int nafter, char **after) {
	int last = nafter > 0;
	struct ibv_context *ctx = open_device();
	int fd;
	struct ibv_xrc_domain *dom = open_domain(ctx, &fd);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 2 * per_round, NULL, NULL, 0);
	int total = kRounds * per_round;
	char *buf = calloc((size_t)total, kMsgSize);
	if (!pd || !cq || !buf) die("resources: %s", strerror(errno));
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, (size_t)total * kMsgSize, IBV_ACCESS_LOCAL_WRITE);
	if (!mr) die("ibv_reg_mr: %s", strerror(errno));

	struct ibv_srq_init_attr sattr;
	memset(&sattr, 0, sizeof sattr);
	sattr.attr.max_wr = (uint32_t)total;
	sattr.attr.max_sge = 1;
	struct ibv_srq *srq = ibv_create_xrc_srq(pd, dom, cq, &sattr);
	if (!srq) die("ibv_create_xrc_srq: %s", strerror(errno));
	for (int i = 0; i < total; ++i) {
		struct ibv_sge sge = {(uintptr_t)(buf + i * kMsgSize), kMsgSize, mr->lkey};
		struct ibv_recv_wr wr = {.wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1}, *bad;
		if (ibv_post_srq_recv(srq, &wr, &bad)) die("ibv_post_srq_recv");
	}

	uint32_t qpn;
	if (sscanf(await("rcv.ready"), "%u", &qpn) != 1) die("bad rcv.ready");
	int err = ibv_reg_xrc_rcv_qp(dom, qpn);
	if (err) die("ibv_reg_xrc_rcv_qp: %s", strerror(err));
	/* OFED 1.5: srq->xrc_srq_num */
	char file[64];
	snprintf(file, sizeof file, "srq.%s", name);
	publish(file, "%u\n", ibv_xrc_srq_num(srq));

	int got = 0;
	for (int round = 1; round <= kRounds; ++round) {
		double deadline = now_s() + wait_limit();
		while (got < round * per_round) {
			struct ibv_wc wc;
			int n = ibv_poll_cq(cq, 1, &wc);
			if (n < 0) die("ibv_poll_cq");
			if (n == 0) {
				if (now_s() > deadline)
					die("round %d: %d of %d messages", round, got, round * per_round);
				usleep(100);
				continue;
			}
			if (wc.status != IBV_WC_SUCCESS)
				die("completion %s", ibv_wc_status_str(wc.status));
			if (wc.qp_num != qpn) die("completion names QP %#x, not %#x", wc.qp_num, qpn);
			char want[kMsgSize];
			snprintf(want, sizeof want, "round %d to %s #%d", round, name,
			         got - (round - 1) * per_round);
			const char *msg = buf + wc.wr_id * kMsgSize;
			if (strcmp(msg, want) != 0) die("got '%s', expected '%s'", msg, want);
			++got;
		}
		printf("recv %s: round %d, %d messages through QP %#x\n", name, round, per_round, qpn);
		snprintf(file, sizeof file, "got%d.%s", round, name);
		publish(file, "%d\n", per_round);
	}

	/* The others unregister first: this process is then the last registered one. */
	for (int i = 0; i < nafter; ++i) {
		snprintf(file, sizeof file, "done.%s", after[i]);
		await(file);
	}
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;
	err = ibv_query_xrc_rcv_qp(dom, qpn, &attr, IBV_QP_STATE, &init);
	if (err) die("ibv_query_xrc_rcv_qp while registered: %s", strerror(err));
	err = ibv_unreg_xrc_rcv_qp(dom, qpn);
	if (err) die("ibv_unreg_xrc_rcv_qp: %s", strerror(err));
	if (last) {
		err = ibv_query_xrc_rcv_qp(dom, qpn, &attr, IBV_QP_STATE, &init);
		if (err != EINVAL)
			die("after the last unregistration, query gave %d (%s), not EINVAL", err,
			    strerror(err));
		printf("recv %s: last to unregister; QP %#x is gone (query: EINVAL)\n", name, qpn);
	}
	snprintf(file, sizeof file, "done.%s", name);
	publish(file, "\n");

	if (ibv_destroy_srq(srq) || ibv_dereg_mr(mr) || ibv_destroy_cq(cq) || ibv_dealloc_pd(pd))
		die("teardown");
	if (ibv_close_xrc_domain(dom)) die("ibv_close_xrc_domain");
	close(fd);
	ibv_close_device(ctx);
	free(buf);
	return 0;
}

/* ---- send: the remote node's send QP. */

static int run_send(int per_srq, int nsrq, char **names) {
	struct ibv_context *ctx = open_device();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 2 * per_srq * nsrq, NULL, NULL, 0);
	size_t bytes = (size_t)per_srq * (size_t)nsrq * kMsgSize;
	char *buf = calloc(1, bytes);
	if (!pd || !cq || !buf) die("resources: %s", strerror(errno));
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, bytes, 0);
	if (!mr) die("ibv_reg_mr: %s", strerror(errno));
	/* The sender's own domain: OFED 1.5 bound every XRC QP to one (fd -1: no file). */
	struct ibv_xrc_domain *dom = ibv_open_xrc_domain(ctx, -1, O_CREAT);
	if (!dom) die("ibv_open_xrc_domain: %s", strerror(errno));

	/* OFED 1.5: struct ibv_qp_init_attr init; */
	struct ibv_xrc_qp_init_attr init;
	memset(&init, 0, sizeof init);
	init.send_cq = cq;
	init.recv_cq = cq;
	init.cap.max_send_wr = (uint32_t)(per_srq * nsrq);
	init.cap.max_send_sge = 1;
	init.qp_type = IBV_QPT_XRC;
	init.xrc_domain = dom;
	struct ibv_qp *qp = ibv_create_qp(pd, &init);
	if (!qp) die("ibv_create_qp(IBV_QPT_XRC): %s", strerror(errno));
	struct address me = local_address(ctx, qp->qp_num);
	publish_address("send.qp", &me);

	struct address target = read_address("rcv.qp");
	await("rcv.ready");
	struct ibv_qp_attr attr;
	memset(&attr, 0, sizeof attr);
	attr.qp_state = IBV_QPS_INIT;
	attr.port_num = 1;
	if (ibv_modify_qp(qp, &attr,
	                  IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("modify INIT");
	memset(&attr, 0, sizeof attr);
	attr.qp_state = IBV_QPS_RTR;
	attr.path_mtu = IBV_MTU_1024;
	attr.dest_qp_num = target.qpn;
	attr.ah_attr = path_to(&target);
	attr.min_rnr_timer = 12;
	if (ibv_modify_qp(qp, &attr,
	                  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
	                      IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("modify RTR");
	memset(&attr, 0, sizeof attr);
	attr.qp_state = IBV_QPS_RTS;
	attr.timeout = 14;
	attr.retry_cnt = 7;
	attr.rnr_retry = 7;
	attr.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &attr,
	                  IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
	                      IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		die("modify RTS");

	uint32_t srqn[kMaxSrqs];
	for (int s = 0; s < nsrq; ++s) {
		char file[64];
		snprintf(file, sizeof file, "srq.%s", names[s]);
		if (sscanf(await(file), "%u", &srqn[s]) != 1) die("bad %s", file);
	}

	for (int round = 1; round <= kRounds; ++round) {
		if (round == 2) await("creator.gone");
		int posted = 0;
		for (int i = 0; i < per_srq; ++i) {
			for (int s = 0; s < nsrq; ++s, ++posted) {
				char *msg = buf + (size_t)posted * kMsgSize;
				snprintf(msg, kMsgSize, "round %d to %s #%d", round, names[s], i);
				struct ibv_sge sge = {(uintptr_t)msg, (uint32_t)strlen(msg) + 1, mr->lkey};
				struct ibv_send_wr wr, *bad;
				memset(&wr, 0, sizeof wr);
				wr.wr_id = (uint64_t)posted;
				wr.sg_list = &sge;
				wr.num_sge = 1;
				wr.opcode = IBV_WR_SEND;
				wr.send_flags = IBV_SEND_SIGNALED;
				wr.xrc_remote_srq_num = srqn[s]; /* as in OFED 1.5 */
				if (ibv_post_send(qp, &wr, &bad)) die("ibv_post_send: %s", strerror(errno));
			}
		}
		double deadline = now_s() + wait_limit();
		for (int done = 0; done < posted;) {
			struct ibv_wc wc;
			int n = ibv_poll_cq(cq, 1, &wc);
			if (n < 0) die("ibv_poll_cq");
			if (n == 0) {
				if (now_s() > deadline) die("round %d: %d of %d sends completed", round, done, posted);
				usleep(100);
				continue;
			}
			if (wc.status != IBV_WC_SUCCESS)
				die("round %d: send %llu: %s", round, (unsigned long long)wc.wr_id,
				    ibv_wc_status_str(wc.status));
			++done;
		}
		printf("send: round %d, %d messages acknowledged\n", round, posted);
		char file[32];
		snprintf(file, sizeof file, "round%d.done", round);
		publish(file, "\n");
	}

	if (ibv_destroy_qp(qp) || ibv_close_xrc_domain(dom) || ibv_dereg_mr(mr) ||
	    ibv_destroy_cq(cq) || ibv_dealloc_pd(pd))
		die("teardown");
	ibv_close_device(ctx);
	free(buf);
	return 0;
}

int main(int argc, char **argv) {
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc >= 3 && strcmp(argv[1], "create") == 0) {
		g_role = "create";
		g_dir = argv[2];
		return run_create(!(argc >= 4 && strcmp(argv[3], "--exit-registered") == 0));
	}
	if (argc >= 5 && strcmp(argv[1], "recv") == 0) {
		g_role = "recv";
		g_dir = argv[2];
		int nafter = argc >= 6 && strcmp(argv[5], "--after") == 0 ? argc - 6 : 0;
		return run_recv(argv[3], atoi(argv[4]), nafter, argv + 6);
	}
	if (argc >= 5 && strcmp(argv[1], "send") == 0 && argc - 4 <= kMaxSrqs) {
		g_role = "send";
		g_dir = argv[2];
		return run_send(atoi(argv[3]), argc - 4, argv + 4);
	}
	fprintf(stderr,
	        "usage: %s create DIR [--exit-registered] | recv DIR NAME N [--after NAME...] | send DIR N NAME...\n"
	        "(see the comment at the top of the source)\n",
	        argv[0]);
	return 2;
}
