/* Peer replication (docs/tiers.md "Tiers"): three daemons on loopback stand for
 * three nodes, each with its own socket and pool, sharing one file://
 * store, linked by TLS with client certificates from a CA made here.
 * A replicated save is held by the next node of the ring; a node whose
 * daemon and trainer are SIGKILLed is replaced by a fresh daemon with an
 * empty pool, and its rank restores bit-exact from the peer's memory
 * (source "peer"). A peer with a certificate of another CA is refused; a
 * peer killed or stopped during a transfer, or whose replica share is
 * full, leaves the save kept (and later durable) with the failure
 * reported; garbage on the peer port harms nothing. Every address is
 * 127.0.0.1. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "harness.h"

#define MIB (1u << 20)
#define NODES 3

static char certs[256]; /* ca.crt, node.crt, node.key; rogue.crt, rogue.key, rogue-ca.crt */
static int ports[NODES + 1];

/* A CA and a certificate it signed for the nodes; another CA and one of
 * its own for the rogue peer. */
static int make_certs(void **state)
{
	(void)state;
	snprintf(certs, sizeof(certs), "/tmp/ckpt-peers-XXXXXX");
	if (h_peer_certs(certs) < 0)
		return -1;
	const char *ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
	int r = h_sh(
		"cd '%s' && "
		"openssl req -x509 %s -keyout rogue-ca.key -out rogue-ca.crt -days 2 -subj /CN=rogue-ca 2>/dev/null && "
		"openssl req %s -keyout rogue.key -out rogue.csr -subj /CN=ckptd-peer 2>/dev/null && "
		"openssl x509 -req -in rogue.csr -CA rogue-ca.crt -CAkey rogue-ca.key -CAcreateserial -out rogue.crt "
		"-days 2 2>/dev/null && "
		/* Certificates that name their host ([peers] verify_names). */
		"for n in 1 2; do echo subjectAltName=IP:127.0.0.$n > ip$n.ext && "
		"openssl req %s -keyout ip$n.key -out ip$n.csr -subj /CN=ckptd-peer-$n 2>/dev/null && "
		"openssl x509 -req -in ip$n.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out ip$n.crt -days 2 "
		"-extfile ip$n.ext 2>/dev/null || exit 1; done",
		certs, ec, ec, ec);
	return r == 0 ? 0 : -1;
}

static int drop_certs(void **state)
{
	(void)state;
	return h_sh("rm -rf '%s'", certs) == 0 ? 0 : -1;
}

/* The [peers] section of node i (NODES: the rogue one) among nodes 0..n-1. */
static void peers_conf(char *out, size_t len, int i, int n, const char *extra)
{
	char list[256] = "";
	size_t used = 0;
	for (int k = 0; k < n; k++)
		used += (size_t)snprintf(list + used, sizeof(list) - used, "%s127.0.0.1:%d", k ? "," : "", ports[k]);
	bool rogue = i == NODES;
	snprintf(out, len,
		 "[pool]\nstaging_bytes = 64M\n[peers]\nlisten = 127.0.0.1:%d\npeers = %s\nreplicas = 1\n"
		 "cert = %s/%s.crt\nkey = %s/%s.key\nca = %s/%s.crt\ntimeout_ms = 3000\n%s",
		 ports[i], list, certs, rogue ? "rogue" : "node", certs, rogue ? "rogue" : "node", certs,
		 rogue ? "rogue-ca" : "ca", extra ? extra : "");
}

struct cluster {
	struct dctx n[NODES + 1];
	char conf[NODES + 1][1024];
};

/* Nodes 0..n-1 on one store; extra[i] more config for node i (or NULL). */
static void cluster_start(struct cluster *c, int n, const char *const *extra)
{
	for (int i = 0; i <= NODES; i++)
		ports[i] = h_free_port();
	for (int i = 0; i < n; i++) {
		h_init(&c->n[i]);
		if (i > 0)
			snprintf(c->n[i].store, sizeof(c->n[i].store), "%s", c->n[0].store);
		peers_conf(c->conf[i], sizeof(c->conf[i]), i, n, extra ? extra[i] : NULL);
		h_start(&c->n[i], c->conf[i]);
	}
}

/* Node i's daemon SIGKILLed (its pool lost). */
static void node_kill(struct cluster *c, int i)
{
	kill(c->n[i].pid, SIGKILL);
	waitpid(c->n[i].pid, NULL, 0);
	c->n[i].pid = -1;
}

static void cluster_stop(struct cluster *c, int n)
{
	for (int i = n - 1; i >= 0; i--)
		h_cleanup(&c->n[i]);
}

/* The node that holds node i's replicas: the next port in sorted order of
 * "127.0.0.1:PORT" names (the ring compares names as strings). */
static int successor(int i, int n)
{
	char names[NODES][32];
	int order[NODES];
	for (int k = 0; k < n; k++) {
		snprintf(names[k], sizeof(names[k]), "127.0.0.1:%d", ports[k]);
		order[k] = k;
	}
	for (int a = 0; a < n; a++)
		for (int b = a + 1; b < n; b++)
			if (strcmp(names[order[b]], names[order[a]]) < 0) {
				int t = order[a];
				order[a] = order[b];
				order[b] = t;
			}
	for (int k = 0; k < n; k++)
		if (order[k] == i)
			return order[(k + 1) % n];
	return -1;
}

#define fill h_fill
#define rank_client h_rank
#define rc_close h_rank_close

/* Each rank's own box of one global tensor "blob" (harness.h). */
static double secs_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void rc_open(struct dctx *d, struct rank_client *rc, const char *job, uint32_t rank, uint32_t world, size_t n)
{
	h_rank_open(d, rc, job, rank, world, n, "p", NULL, true);
}

static ckpt_future *rc_save(struct rank_client *rc, uint64_t step, uint32_t rank, int tier)
{
	fill(ckpt_buffer_data(rc->b), rc->n, step * 1000 + rank);
	ckpt_save_opts o = { .tier = tier };
	ckpt_future *f = NULL;
	int r = ckpt_save_ex(rc->c, step, &rc->t, 1, "x", 1, &o, &f);
	if (r < 0)
		fail_msg("save: %s (%s)", ckpt_strerror(r), ckpt_errmsg());
	return f;
}

/* Save step at tier and wait until it reaches phase (0 expected). */
static void rc_save_wait(struct rank_client *rc, uint64_t step, uint32_t rank, int tier, int phase)
{
	ckpt_future *f = rc_save(rc, step, rank, tier);
	int r = ckpt_future_wait(f, phase, 30000);
	if (r != 0)
		fail_msg("save %llu: %s (%s)", (unsigned long long)step, ckpt_strerror(r), ckpt_future_message(f));
	ckpt_future_free(f);
}

/* Persist step through c and wait until durable (0 expected). */
static void persist_wait(ckpt_client *c, const char *job, uint64_t step, unsigned flags)
{
	ckpt_future *p = NULL;
	assert_int_equal(ckpt_persist_ex(c, job, step, flags, &p), 0);
	int r = ckpt_future_wait(p, CKPT_DURABLE, 30000);
	if (r != 0)
		fail_msg("persist %llu: %s (%s)", (unsigned long long)step, ckpt_strerror(r), ckpt_future_message(p));
	ckpt_future_free(p);
}

/* Load step; checked bit-exact; its source (and peer) copied out. */
static void rc_load(struct rank_client *rc, uint64_t step, uint32_t rank, char *src, size_t srclen, char *peer,
		    size_t peerlen)
{
	memset(ckpt_buffer_data(rc->b), 0, rc->n);
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_load(rc->c, (int64_t)step, &rc->t, 1, &f), 0);
	int r = ckpt_future_wait(f, CKPT_LOADED, 60000);
	if (r != 0)
		fail_msg("load %llu: %s (%s)", (unsigned long long)step, ckpt_strerror(r), ckpt_future_message(f));
	uint8_t *want = malloc(rc->n);
	fill(want, rc->n, step * 1000 + rank);
	assert_memory_equal(ckpt_buffer_data(rc->b), want, rc->n);
	free(want);
	snprintf(src, srclen, "%s", ckpt_future_source(f));
	if (peer)
		snprintf(peer, peerlen, "%s", ckpt_future_peer(f));
	ckpt_future_free(f);
}

static size_t held_all(struct dctx *d, const char *job, ckpt_held_info **v)
{
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(d->sock, NULL, &c), 0);
	size_t n = 0;
	assert_int_equal(ckpt_held(c, job, 1, v, &n), 0);
	ckpt_close(c);
	return n;
}

/* A replicated save is kept, then replicated to the next node, which
 * holds it (counted in the metrics of both). */
static void test_replicated_save_held_by_next_node(void **state)
{
	(void)state;
	struct cluster c;
	cluster_start(&c, NODES, NULL);
	struct rank_client rc;
	rc_open(&c.n[0], &rc, "rep", 0, 1, 3 * MIB + 5);
	ckpt_future *f = rc_save(&rc, 5, 0, CKPT_TIER_REPLICATED);
	assert_int_equal(ckpt_future_wait(f, CKPT_KEPT, 30000), 0);
	int r = ckpt_future_wait(f, CKPT_REPLICATED, 30000);
	if (r != 0)
		fail_msg("replicated: %s (%s)", ckpt_strerror(r), ckpt_future_message(f));
	assert_int_equal(ckpt_future_replicas(f), 1);
	ckpt_future_free(f);
	int s = successor(0, NODES);
	ckpt_held_info *h = NULL;
	assert_int_equal(held_all(&c.n[s], "rep", &h), 1);
	assert_int_equal(h[0].step, 5);
	assert_int_equal(h[0].bytes, 3 * MIB + 5);
	free(h);
	int other = 3 - s; /* neither 0 nor s */
	assert_int_equal(held_all(&c.n[other], "rep", &h), 0);
	free(h);
	assert_true(h_metric(&c.n[0], "ckptd_peer_replicated_bytes_total") >= 3 * MIB);
	/* ckptctl ls says where the copies are. */
	ckpt_step_info *steps = NULL;
	size_t ns = 0;
	ckpt_client *lc = NULL;
	assert_int_equal(ckpt_connect(c.n[0].sock, NULL, &lc), 0);
	assert_int_equal(ckpt_list(lc, "rep", &steps, &ns), 0);
	assert_int_equal(ns, 1);
	char where[128];
	snprintf(where, sizeof(where), "memory here: 1 of 1 ranks; replicas on 127.0.0.1:%d", ports[s]);
	assert_string_equal(steps[0].where, where);
	assert_string_equal(steps[0].tier, "replicated");
	free(steps);
	ckpt_close(lc);
	assert_int_equal(h_metric(&c.n[s], "ckptd_peer_replicas_held"), 1);
	/* The replica is the peer's, not its own: ckptctl persist there does
	 * not write it. */
	ckpt_client *ctl = NULL;
	assert_int_equal(ckpt_connect(c.n[s].sock, NULL, &ctl), 0);
	ckpt_future *p = NULL;
	assert_int_equal(ckpt_persist(ctl, "rep", 5, &p), 0);
	assert_int_equal(ckpt_future_wait(p, CKPT_DURABLE, 10000), -ENOENT);
	ckpt_future_free(p);
	ckpt_close(ctl);
	rc_close(&rc);
	/* A stop drains and exits 0 with peers on, holder and sender alike. */
	assert_int_equal(h_stop(&c.n[s]), 0);
	assert_int_equal(h_stop(&c.n[0]), 0);
	cluster_stop(&c, NODES);
}

/* Three ranks, one per node, save step 6 durable and step 7 replicated.
 * Node 0's trainer and daemon are SIGKILLed; a fresh daemon with an empty
 * pool takes its place, and rank 0 restores step 7 from its peer, bit-exact,
 * while the other ranks restore it from their own memory. */
static void test_killed_node_restores_from_peer(void **state)
{
	(void)state;
	struct cluster c;
	cluster_start(&c, NODES, NULL);
	const size_t n = 5 * MIB;
	int pipefd[2];
	assert_int_equal(pipe(pipefd), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		/* Node 0's trainer: save, wait until replicated, then die. */
		struct rank_client rc;
		rc_open(&c.n[0], &rc, "kill", 0, NODES, n);
		ckpt_future *f = rc_save(&rc, 6, 0, CKPT_TIER_DURABLE);
		if (ckpt_future_wait(f, CKPT_DURABLE, 30000) != 0)
			_exit(3);
		f = rc_save(&rc, 7, 0, CKPT_TIER_REPLICATED);
		if (ckpt_future_wait(f, CKPT_REPLICATED, 30000) != 0)
			_exit(4);
		if (write(pipefd[1], "r", 1) != 1)
			_exit(5);
		raise(SIGKILL);
		_exit(6);
	}
	close(pipefd[1]);
	struct rank_client others[NODES];
	for (int i = 1; i < NODES; i++) {
		rc_open(&c.n[i], &others[i], "kill", (uint32_t)i, NODES, n);
		ckpt_future *f = rc_save(&others[i], 6, (uint32_t)i, CKPT_TIER_DURABLE);
		assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 30000), 0);
		ckpt_future_free(f);
		f = rc_save(&others[i], 7, (uint32_t)i, CKPT_TIER_REPLICATED);
		assert_int_equal(ckpt_future_wait(f, CKPT_REPLICATED, 30000), 0);
		ckpt_future_free(f);
	}
	char ch = 0;
	assert_int_equal(read(pipefd[0], &ch, 1), 1);
	close(pipefd[0]);
	int st = 0;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFSIGNALED(st));
	node_kill(&c, 0);
	/* The replacement: same name, same store, an empty pool. */
	h_start(&c.n[0], c.conf[0]);
	struct rank_client rc;
	rc_open(&c.n[0], &rc, "kill", 0, NODES, n);
	/* What it could restore: nothing of its own; step 7 from its peer. */
	ckpt_held_info *h = NULL;
	size_t nh = 0;
	assert_int_equal(ckpt_held(rc.c, NULL, 0, &h, &nh), 0);
	assert_int_equal(nh, 1);
	assert_int_equal(h[0].step, 7);
	char want_peer[64];
	snprintf(want_peer, sizeof(want_peer), "127.0.0.1:%d", ports[successor(0, NODES)]);
	assert_string_equal(h[0].peer, want_peer);
	free(h);
	char src[16], peer[128];
	rc_load(&rc, 7, 0, src, sizeof(src), peer, sizeof(peer));
	assert_string_equal(src, "peer");
	assert_string_equal(peer, want_peer);
	assert_int_equal(h_metric(&c.n[0], "ckptd_restores_from_peers_total"), 1);
	/* Now held here again: a second load is from memory. */
	rc_load(&rc, 7, 0, src, sizeof(src), NULL, 0);
	assert_string_equal(src, "memory");
	for (int i = 1; i < NODES; i++) {
		rc_load(&others[i], 7, (uint32_t)i, src, sizeof(src), NULL, 0);
		assert_string_equal(src, "memory");
	}
	/* Storage has step 6 only; it restores too. */
	rc_load(&rc, 6, 0, src, sizeof(src), NULL, 0);
	assert_string_equal(src, "storage");
	rc_close(&rc);
	/* Again, the way ckpt.torch restores: it shows its rank's manifest
	 * first, which brings the copy back from the peer; the load then
	 * reads it here, and says where its bytes came from: the peer (a
	 * second load: memory). */
	node_kill(&c, 0);
	h_start(&c.n[0], c.conf[0]);
	rc_open(&c.n[0], &rc, "kill", 0, NODES, n);
	ckpt_step_detail *det = NULL;
	int r = ckpt_show_rank(rc.c, "kill", 7, 0, &det);
	if (r < 0)
		fail_msg("show: %s (%s)", ckpt_strerror(r), ckpt_errmsg());
	assert_int_equal(det->ntensors, 1);
	assert_string_equal(det->info.tier, "replicated");
	ckpt_step_detail_free(det);
	rc_load(&rc, 7, 0, src, sizeof(src), peer, sizeof(peer));
	assert_string_equal(src, "peer");
	assert_string_equal(peer, want_peer);
	assert_int_equal(h_metric(&c.n[0], "ckptd_restores_from_peers_total"), 1);
	rc_load(&rc, 7, 0, src, sizeof(src), peer, sizeof(peer));
	assert_string_equal(src, "memory");
	assert_string_equal(peer, "");
	/* A step nobody has: not found, saying where it looked. */
	r = ckpt_show_rank(rc.c, "kill", 99, 0, &det);
	assert_int_equal(r, -ENOENT);
	assert_non_null(strstr(ckpt_errmsg(), "nor from the peers"));
	rc_close(&rc);
	for (int i = 1; i < NODES; i++)
		rc_close(&others[i]);
	cluster_stop(&c, NODES);
}

/* A port free now, as close below want as can be found (so that its name
 * sorts right before want's in the ring). */
static int free_port_below(int want)
{
	for (int port = want - 1; port > want - 50 && port > 1024; port--) {
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		struct sockaddr_in sa = { .sin_family = AF_INET,
					  .sin_port = htons((uint16_t)port),
					  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		int ok = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
		close(fd);
		if (ok)
			return port;
	}
	return -1;
}

/* Node 0 is lost and replaced by a node of another name, placed in the
 * ring right before it, so that its successor is the dead node: it finds
 * its rank's copy by asking the rest of the ring, then restores it. */
static void test_replacement_under_another_name(void **state)
{
	(void)state;
	struct cluster c;
	cluster_start(&c, NODES, NULL);
	struct rank_client rc;
	rc_open(&c.n[0], &rc, "moved", 0, 1, 2 * MIB);
	ckpt_future *f = rc_save(&rc, 3, 0, CKPT_TIER_REPLICATED);
	assert_int_equal(ckpt_future_wait(f, CKPT_REPLICATED, 30000), 0);
	ckpt_future_free(f);
	rc_close(&rc);
	node_kill(&c, 0);
	int port = free_port_below(ports[0]);
	if (port < 0)
		skip();
	ports[NODES] = port;
	struct dctx fresh;
	h_init(&fresh);
	snprintf(fresh.store, sizeof(fresh.store), "%s", c.n[0].store);
	char conf[1024], list[256];
	snprintf(list, sizeof(list), "127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", ports[0], ports[1],
		 ports[2], port);
	snprintf(conf, sizeof(conf),
		 "[pool]\nstaging_bytes = 64M\n[peers]\nlisten = 127.0.0.1:%d\npeers = %s\nreplicas = 1\n"
		 "cert = %s/node.crt\nkey = %s/node.key\nca = %s/ca.crt\ntimeout_ms = 3000\n",
		 port, list, certs, certs, certs);
	h_start(&fresh, conf);
	rc_open(&fresh, &rc, "moved", 0, 1, 2 * MIB);
	ckpt_held_info *h = NULL;
	size_t nh = 0;
	assert_int_equal(ckpt_held(rc.c, NULL, 0, &h, &nh), 0);
	assert_int_equal(nh, 1);
	char want_peer[64];
	snprintf(want_peer, sizeof(want_peer), "127.0.0.1:%d", ports[successor(0, NODES)]);
	assert_string_equal(h[0].peer, want_peer);
	free(h);
	char src[16], peer[128];
	rc_load(&rc, 3, 0, src, sizeof(src), peer, sizeof(peer));
	assert_string_equal(src, "peer");
	assert_string_equal(peer, want_peer);
	rc_close(&rc);
	h_cleanup(&fresh);
	cluster_stop(&c, NODES);
}

/* A replicated step, persisted later, is in storage and in the peer's
 * memory: a replacement node's load takes it from the peer (local memory,
 * then peer memory, then storage, per shard), holds it as durable (no
 * memory-only bytes), then serves it from its own memory. A step the
 * peers never held comes from storage. */
static void test_persisted_step_restores_from_peer_first(void **state)
{
	(void)state;
	struct cluster c;
	cluster_start(&c, NODES, NULL);
	struct rank_client rc;
	rc_open(&c.n[0], &rc, "pers", 0, 1, 3 * MIB);
	rc_save_wait(&rc, 7, 0, CKPT_TIER_DURABLE, CKPT_DURABLE);
	rc_save_wait(&rc, 8, 0, CKPT_TIER_REPLICATED, CKPT_REPLICATED);
	persist_wait(rc.c, "pers", 8, 0);
	/* Step 9: replicated here, but what storage has of it is another
	 * attempt's save (from the third node): the peer's copy is not that
	 * one. */
	rc_save_wait(&rc, 9, 0, CKPT_TIER_REPLICATED, CKPT_REPLICATED);
	rc_close(&rc);
	struct rank_client other; /* on the node that holds no replica of node 0's */
	h_rank_open(&c.n[3 - successor(0, NODES)], &other, "pers", 0, 1, 3 * MIB, "q", NULL, true);
	rc_save_wait(&other, 9, 0, CKPT_TIER_DURABLE, CKPT_DURABLE);
	rc_close(&other);
	node_kill(&c, 0);
	h_start(&c.n[0], c.conf[0]);
	rc_open(&c.n[0], &rc, "pers", 0, 1, 3 * MIB);
	char src[16], peer[128], want_peer[64];
	snprintf(want_peer, sizeof(want_peer), "127.0.0.1:%d", ports[successor(0, NODES)]);
	rc_load(&rc, 8, 0, src, sizeof(src), peer, sizeof(peer));
	assert_string_equal(src, "peer");
	assert_string_equal(peer, want_peer);
	assert_int_equal(h_metric(&c.n[0], "ckptd_restores_from_peers_total"), 1);
	assert_int_equal(h_metric(&c.n[0], "ckptd_pool_memory_only_bytes"), 0);
	rc_load(&rc, 8, 0, src, sizeof(src), NULL, 0);
	assert_string_equal(src, "memory");
	rc_load(&rc, 7, 0, src, sizeof(src), NULL, 0);
	assert_string_equal(src, "storage");
	rc_load(&rc, 9, 0, src, sizeof(src), NULL, 0);
	assert_string_equal(src, "storage");
	assert_int_equal(h_metric(&c.n[0], "ckptd_restores_from_peers_total"), 1);
	rc_close(&rc);
	cluster_stop(&c, NODES);
}

/* persist --replicas on a holder: a lost node's replicated step is
 * uploaded from its replica, and restores from storage; a replica whose
 * rank its origin persisted first counts as durable. */
static void test_holder_persists_lost_nodes_replicas(void **state)
{
	(void)state;
	struct cluster c;
	cluster_start(&c, NODES, NULL);
	int s = successor(0, NODES), other = 3 - s;
	struct rank_client rc;
	rc_open(&c.n[0], &rc, "lost", 0, 1, 3 * MIB + 11);
	rc_save_wait(&rc, 10, 0, CKPT_TIER_REPLICATED, CKPT_REPLICATED);
	rc_save_wait(&rc, 11, 0, CKPT_TIER_REPLICATED, CKPT_REPLICATED);
	/* The origin persists step 11 itself, then is lost. */
	persist_wait(rc.c, "lost", 11, 0);
	rc_close(&rc);
	node_kill(&c, 0);
	ckpt_client *ctl = NULL;
	assert_int_equal(ckpt_connect(c.n[s].sock, NULL, &ctl), 0);
	ckpt_future *p = NULL;
	assert_int_equal(ckpt_persist(ctl, "lost", 10, &p), 0);
	assert_int_equal(ckpt_future_wait(p, CKPT_DURABLE, 10000), -ENOENT);
	assert_non_null(strstr(ckpt_future_message(p), "--replicas"));
	ckpt_future_free(p);
	for (uint64_t step = 10; step <= 11; step++)
		persist_wait(ctl, "lost", step, CKPT_PERSIST_REPLICAS);
	ckpt_close(ctl);
	/* Both steps are in storage: another node restores them from there. */
	rc_open(&c.n[other], &rc, "lost", 0, 1, 3 * MIB + 11);
	for (uint64_t step = 10; step <= 11; step++) {
		memset(ckpt_buffer_data(rc.b), 0, rc.n);
		ckpt_future *l = NULL;
		assert_int_equal(ckpt_load_ex(rc.c, (int64_t)step, &rc.t, 1, CKPT_LOAD_STORAGE_ONLY, &l), 0);
		assert_int_equal(ckpt_future_wait(l, CKPT_LOADED, 30000), 0);
		assert_string_equal(ckpt_future_source(l), "storage");
		uint8_t *want = malloc(rc.n);
		fill(want, rc.n, step * 1000);
		assert_memory_equal(ckpt_buffer_data(rc.b), want, rc.n);
		free(want);
		ckpt_future_free(l);
	}
	rc_close(&rc);
	cluster_stop(&c, NODES);
}

/* One rank's piece [off, off + len) of the global tensor "blob" of
 * 4 x 2 MiB that ranks 0..3 of step 4 saved, each its quarter filled with
 * fill(seed 4000 + rank). */
#define RS_PART (2 * MIB)
static void rs_expected(uint8_t *out, uint64_t off, uint64_t len)
{
	uint8_t *part = malloc(RS_PART);
	for (uint32_t r = 0; r < 4; r++) {
		uint64_t lo = (uint64_t)r * RS_PART, hi = lo + RS_PART;
		uint64_t a = off > lo ? off : lo, b = off + len < hi ? off + len : hi;
		if (a >= b)
			continue;
		fill(part, RS_PART, 4000 + r);
		memcpy(out + (a - off), part + (a - lo), b - a);
	}
	free(part);
}

/* Rank rank of world world of job loads its even share of "blob" at step
 * 4 from node d; checked bit-exact; its source and extra state copied out. */
static void rs_load_job(struct dctx *d, const char *job, uint32_t rank, uint32_t world, char *src, size_t srclen,
			char *extra, size_t extralen, char *peer, size_t peerlen)
{
	ckpt_hello h = { .job = job, .rank = rank, .world_size = world, .attempt_id = "q" };
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(d->sock, &h, &c), 0);
	uint64_t len = 4 * RS_PART / world, gshape[1] = { 4 * RS_PART }, off[1] = { rank * len }, lens[1] = { len };
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_buffer_alloc(c, len, &b), 0);
	ckpt_tensor t = { .name = "blob",
			  .dtype = CKPT_U8,
			  .ndim = 1,
			  .global_shape = gshape,
			  .box_offsets = off,
			  .box_lengths = lens,
			  .buffer = b,
			  .nbytes = len };
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_load(c, 4, &t, 1, &f), 0);
	int r = ckpt_future_wait(f, CKPT_LOADED, 60000);
	if (r != 0)
		fail_msg("rank %u of %u: %s (%s)", rank, world, ckpt_strerror(r), ckpt_future_message(f));
	uint8_t *want = malloc(len);
	rs_expected(want, off[0], len);
	assert_memory_equal(ckpt_buffer_data(b), want, len);
	free(want);
	snprintf(src, srclen, "%s", ckpt_future_source(f));
	snprintf(peer, peerlen, "%s", ckpt_future_peer(f) ? ckpt_future_peer(f) : "");
	size_t n = 0;
	const void *x = ckpt_future_extra(f, &n);
	snprintf(extra, extralen, "%.*s", (int)n, x ? (const char *)x : "");
	ckpt_future_free(f);
	ckpt_buffer_free(b);
	ckpt_close(c);
}

static void rs_load(struct dctx *d, uint32_t rank, uint32_t world, char *src, size_t srclen, char *extra,
		    size_t extralen, char *peer, size_t peerlen)
{
	rs_load_job(d, "reshard", rank, world, src, srclen, extra, extralen, peer, peerlen);
}

/* Four ranks of job save step 4 replicated, rank r on node r % nodes,
 * each its part of "blob" (rs_expected) and "rank-R" as extra state. */
static void rs_save_all(struct cluster *c, int nodes, const char *job)
{
	for (uint32_t r = 0; r < 4; r++) {
		ckpt_hello h = { .job = job, .rank = r, .world_size = 4, .attempt_id = "p" };
		ckpt_client *cl = NULL;
		assert_int_equal(ckpt_connect(c->n[r % nodes].sock, &h, &cl), 0);
		ckpt_buffer *b = NULL;
		assert_int_equal(ckpt_buffer_alloc(cl, RS_PART, &b), 0);
		fill(ckpt_buffer_data(b), RS_PART, 4000 + r);
		uint64_t gshape[1] = { 4 * RS_PART }, off[1] = { r * RS_PART }, lens[1] = { RS_PART };
		ckpt_tensor t = { .name = "blob",
				  .dtype = CKPT_U8,
				  .ndim = 1,
				  .global_shape = gshape,
				  .box_offsets = off,
				  .box_lengths = lens,
				  .buffer = b,
				  .nbytes = RS_PART };
		char extra[16];
		snprintf(extra, sizeof(extra), "rank-%u", r);
		ckpt_save_opts o = { .tier = CKPT_TIER_REPLICATED };
		ckpt_future *f = NULL;
		assert_int_equal(ckpt_save_ex(cl, 4, &t, 1, extra, strlen(extra), &o, &f), 0);
		int rr = ckpt_future_wait(f, CKPT_REPLICATED, 30000);
		if (rr != 0)
			fail_msg("rank %u: %s (%s)", r, ckpt_strerror(rr), ckpt_future_message(f));
		ckpt_future_free(f);
		ckpt_buffer_free(b);
		ckpt_close(cl);
	}
}

/* Resharding from peer copies: four ranks on three nodes (rank r on node
 * r % 3) save step 4 replicated, nothing in storage. Node 0 is SIGKILLed
 * and replaced by an empty daemon, where a world of two ranks restores
 * (with the default config: the replica of the killed node's predecessor's
 * rank died with it, and that rank's own copy, a replicated save of a job
 * without a secret, is served by its node; found by the chaos soak, where
 * it needed [peers] serve_own):
 * each brings back the saved ranks its share needs (two each) from the
 * peers that hold them, wherever they are in the ring, bit-exact, and
 * gets its own rank's extra state (rank 1: from a peer's manifest alone,
 * its shard not needed). Then a world of eight on node 1 (which holds
 * rank 1's copy and others' replicas) restores too. */
static void test_reshard_from_peers(void **state)
{
	(void)state;
	struct cluster c;
	cluster_start(&c, NODES, NULL);
	rs_save_all(&c, NODES, "reshard");
	node_kill(&c, 0);
	h_start(&c.n[0], c.conf[0]);
	char src[16], extra[32], peer[128];
	/* Rank 1 of 2 first: saved ranks 2 and 3; its extra state is rank
	 * 1's, whose shard it does not need. */
	rs_load(&c.n[0], 1, 2, src, sizeof(src), extra, sizeof(extra), peer, sizeof(peer));
	assert_string_equal(src, "peer");
	assert_string_equal(extra, "rank-1");
	assert_true(peer[0] != '\0');
	assert_int_equal(h_metric(&c.n[0], "ckptd_restores_from_peers_total"), 2);
	rs_load(&c.n[0], 0, 2, src, sizeof(src), extra, sizeof(extra), peer, sizeof(peer));
	assert_string_equal(src, "peer");
	assert_string_equal(extra, "rank-0");
	assert_int_equal(h_metric(&c.n[0], "ckptd_restores_from_peers_total"), 4);
	/* Every copy is here now: the same world again reads memory only. */
	rs_load(&c.n[0], 1, 2, src, sizeof(src), extra, sizeof(extra), peer, sizeof(peer));
	assert_string_equal(src, "memory");
	assert_int_equal(h_metric(&c.n[0], "ckptd_restores_from_peers_total"), 4);
	/* A world of eight on node 1: rank 1 of 4's own copy is held there,
	 * the rest come from its peers. */
	for (uint32_t r = 0; r < 8; r++) {
		rs_load(&c.n[1], r, 8, src, sizeof(src), extra, sizeof(extra), peer, sizeof(peer));
		char want[16];
		snprintf(want, sizeof(want), "rank-%u", r < 4 ? r : 0);
		assert_string_equal(extra, want);
	}
	cluster_stop(&c, NODES);
}

/* A daemon whose certificate another CA signed cannot replicate to the
 * nodes, and they refuse it (and count it); nothing else is harmed. */
static void test_wrong_certificate_refused(void **state)
{
	(void)state;
	struct cluster c;
	cluster_start(&c, 2, NULL);
	h_init(&c.n[NODES]);
	snprintf(c.n[NODES].store, sizeof(c.n[NODES].store), "%s", c.n[0].store);
	char conf[1024];
	/* The rogue's ring: the two nodes and itself. */
	char list_extra[64];
	snprintf(list_extra, sizeof(list_extra), "127.0.0.1:%d", ports[NODES]);
	peers_conf(conf, sizeof(conf), NODES, 2, NULL);
	char *pl = strstr(conf, "peers = ");
	assert_non_null(pl);
	char *eol = strchr(pl, '\n');
	char tail[900];
	snprintf(tail, sizeof(tail), "%s", eol);
	snprintf(eol, sizeof(conf) - (size_t)(eol - conf), ",%s%s", list_extra, tail);
	h_start(&c.n[NODES], conf);
	struct rank_client rc;
	rc_open(&c.n[NODES], &rc, "rogue", 0, 1, MIB);
	ckpt_future *f = rc_save(&rc, 1, 0, CKPT_TIER_REPLICATED);
	assert_int_equal(ckpt_future_wait(f, CKPT_KEPT, 30000), 0);
	int r = ckpt_future_wait(f, CKPT_REPLICATED, 30000);
	assert_true(r < 0);
	assert_non_null(strstr(ckpt_future_message(f), "replicated to 0 of 1 peers"));
	ckpt_future_free(f);
	/* The node counts its refusal on its own thread, maybe just after the
	 * rogue heard of it. */
	uint64_t refused = 0;
	for (int i = 0; i < 100 && refused == 0; i++) {
		refused = h_metric(&c.n[0], "ckptd_peer_link_errors_total") +
			  h_metric(&c.n[1], "ckptd_peer_link_errors_total");
		if (refused == 0)
			usleep(50 * 1000);
	}
	assert_true(refused >= 1);
	ckpt_held_info *h = NULL;
	assert_int_equal(held_all(&c.n[0], "rogue", &h), 0);
	free(h);
	assert_int_equal(held_all(&c.n[1], "rogue", &h), 0);
	free(h);
	h_assert_serves(&c.n[0]);
	h_assert_serves(&c.n[1]);
	rc_close(&rc);
	h_cleanup(&c.n[NODES]);
	cluster_stop(&c, 2);
}

/* The peer is stopped (SIGSTOP) while a save goes to it, then killed: the
 * save is kept, reported not replicated with the reason, and persisted
 * later. A peer that never answers (stopped) times out the same way. */
static void test_peer_dies_mid_transfer(void **state)
{
	(void)state;
	struct cluster c;
	cluster_start(&c, 2, NULL);
	int s = successor(0, 2);
	struct rank_client rc;
	rc_open(&c.n[0], &rc, "mid", 0, 1, 24 * MIB);
	kill(c.n[s].pid, SIGSTOP);
	ckpt_future *f = rc_save(&rc, 1, 0, CKPT_TIER_REPLICATED);
	assert_int_equal(ckpt_future_wait(f, CKPT_STAGED, 30000), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_KEPT, 30000), 0);
	usleep(300 * 1000); /* the transfer has begun: it waits on the stopped peer */
	assert_int_equal(ckpt_future_poll(f, CKPT_REPLICATED), 0);
	kill(c.n[s].pid, SIGKILL);
	waitpid(c.n[s].pid, NULL, 0);
	c.n[s].pid = -1;
	int r = ckpt_future_wait(f, CKPT_REPLICATED, 30000);
	assert_true(r < 0);
	assert_non_null(strstr(ckpt_future_message(f), "replicated to 0 of 1 peers"));
	ckpt_future_free(f);
	/* Kept all the same, and persisted. */
	ckpt_future *p = NULL;
	assert_int_equal(ckpt_persist(rc.c, NULL, 1, &p), 0);
	assert_int_equal(ckpt_future_wait(p, CKPT_DURABLE, 30000), 0);
	ckpt_future_free(p);
	/* A peer that never answers: the timeout (3 s here). */
	h_start(&c.n[s], c.conf[s]);
	kill(c.n[s].pid, SIGSTOP);
	f = rc_save(&rc, 2, 0, CKPT_TIER_REPLICATED);
	assert_int_equal(ckpt_future_wait(f, CKPT_KEPT, 30000), 0);
	r = ckpt_future_wait(f, CKPT_REPLICATED, 30000);
	assert_true(r < 0);
	if (strstr(ckpt_future_message(f), "timed out") == NULL)
		fail_msg("%s", ckpt_future_message(f));
	ckpt_future_free(f);
	/* Its silence is remembered: the next save does not wait for it. */
	f = rc_save(&rc, 3, 0, CKPT_TIER_REPLICATED);
	assert_int_equal(ckpt_future_wait(f, CKPT_KEPT, 30000), 0);
	assert_true(ckpt_future_wait(f, CKPT_REPLICATED, 30000) < 0);
	if (strstr(ckpt_future_message(f), "not asked again") == NULL)
		fail_msg("%s", ckpt_future_message(f));
	ckpt_future_free(f);
	kill(c.n[s].pid, SIGCONT);
	h_assert_serves(&c.n[0]);
	rc_close(&rc);
	cluster_stop(&c, 2);
}

static int rc_load_fails(struct rank_client *rc, uint64_t step, char *msg, size_t msglen);

/* A link that flapped (found by the chaos soak, tests/chaos/run): node 0
 * is replaced while its holder is silent (stopped: it accepts the
 * connection and never answers), so the replacement's restore of its
 * replicated step, in no storage, times out and marks the holder down.
 * The holder answers again: the next restore, within the 10 s a down
 * peer is not asked, still asks it (a step in no storage has no other
 * source) and restores bit-exact; and from then on the holder is asked
 * by all again. */
static void test_restore_right_after_holder_silence(void **state)
{
	(void)state;
	struct cluster c;
	cluster_start(&c, 2, NULL);
	int s = successor(0, 2);
	struct rank_client rc;
	rc_open(&c.n[0], &rc, "flap", 0, 1, 2 * MIB);
	rc_save_wait(&rc, 1, 0, CKPT_TIER_REPLICATED, CKPT_REPLICATED);
	rc_close(&rc);
	node_kill(&c, 0);
	h_start(&c.n[0], c.conf[0]);
	kill(c.n[s].pid, SIGSTOP);
	rc_open(&c.n[0], &rc, "flap", 0, 1, 2 * MIB);
	char msg[512];
	assert_true(rc_load_fails(&rc, 1, msg, sizeof(msg)) < 0);
	if (strstr(msg, "timed out") == NULL)
		fail_msg("%s", msg);
	kill(c.n[s].pid, SIGCONT);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	char src[16];
	rc_load(&rc, 1, 0, src, sizeof(src), NULL, 0);
	assert_string_equal(src, "peer");
	clock_gettime(CLOCK_MONOTONIC, &t1);
	assert_true(t1.tv_sec - t0.tv_sec < 10); /* within the down time */
	/* Asked by all again: a replicated save goes to it at once. */
	rc_save_wait(&rc, 2, 0, CKPT_TIER_REPLICATED, CKPT_REPLICATED);
	rc_close(&rc);
	cluster_stop(&c, 2);
}

/* The peer's replica share (2 MiB) is full: a 4 MiB replica is refused,
 * saying so; the save is kept. */
static void test_replica_share_full(void **state)
{
	(void)state;
	struct cluster c;
	const char *extra[NODES] = { "share = 2M\n", "share = 2M\n", NULL };
	cluster_start(&c, 2, extra);
	struct rank_client rc;
	rc_open(&c.n[0], &rc, "share", 0, 1, 4 * MIB);
	ckpt_future *f = rc_save(&rc, 1, 0, CKPT_TIER_REPLICATED);
	assert_int_equal(ckpt_future_wait(f, CKPT_KEPT, 30000), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_REPLICATED, 30000), -ENOSPC);
	assert_non_null(strstr(ckpt_future_message(f), "replica share"));
	ckpt_future_free(f);
	char src[16];
	rc_load(&rc, 1, 0, src, sizeof(src), NULL, 0);
	assert_string_equal(src, "memory");
	rc_close(&rc);
	cluster_stop(&c, 2);
}

/* A replica damaged on the way ([debug] corrupt_replica on the sender) is
 * refused by its CRC32C on arrival: not held, and the save reported not
 * replicated, naming the chunk. */
static void test_replica_damaged_on_the_way(void **state)
{
	(void)state;
	struct cluster c;
	const char *extra[NODES] = { "[debug]\ncorrupt_replica = true\n", NULL, NULL };
	cluster_start(&c, 2, extra);
	int s = successor(0, 2);
	struct rank_client rc;
	rc_open(&c.n[0], &rc, "bad", 0, 1, 2 * MIB);
	ckpt_future *f = rc_save(&rc, 1, 0, CKPT_TIER_REPLICATED);
	assert_int_equal(ckpt_future_wait(f, CKPT_KEPT, 30000), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_REPLICATED, 30000), -EIO);
	assert_non_null(strstr(ckpt_future_message(f), "failed its CRC32C on arrival"));
	ckpt_future_free(f);
	ckpt_held_info *h = NULL;
	assert_int_equal(held_all(&c.n[s], "bad", &h), 0);
	free(h);
	rc_close(&rc);
	cluster_stop(&c, 2);
}

/* Bytes that are not TLS, a TLS hello cut short, and a connection left
 * open are refused or time out; the daemon serves on, and replication
 * still works. */
static void test_garbage_on_the_peer_port(void **state)
{
	(void)state;
	struct cluster c;
	cluster_start(&c, 2, NULL);
	int s = successor(0, 2);
	struct sockaddr_in sa = { .sin_family = AF_INET,
				  .sin_port = htons((uint16_t)ports[s]),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	const char *junk[] = { "GET / HTTP/1.1\r\nHost: x\r\n\r\n", "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
			       "\x00\x00\x00\x05hello" };
	for (size_t i = 0; i < sizeof(junk) / sizeof(junk[0]); i++) {
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
		assert_true(write(fd, junk[i], strlen(junk[i]) ? strlen(junk[i]) : 9) > 0);
		usleep(100 * 1000);
		close(fd);
	}
	int idle = socket(AF_INET, SOCK_STREAM, 0);
	assert_int_equal(connect(idle, (struct sockaddr *)&sa, sizeof(sa)), 0);
	h_assert_serves(&c.n[s]);
	struct rank_client rc;
	rc_open(&c.n[0], &rc, "junk", 0, 1, MIB);
	ckpt_future *f = rc_save(&rc, 1, 0, CKPT_TIER_REPLICATED);
	assert_int_equal(ckpt_future_wait(f, CKPT_REPLICATED, 30000), 0);
	ckpt_future_free(f);
	assert_true(h_metric(&c.n[s], "ckptd_peer_link_errors_total") >= 2);
	close(idle);
	h_assert_serves(&c.n[s]);
	rc_close(&rc);
	cluster_stop(&c, 2);
}

/* peer_rogue (a peer with a certificate the CA signed) run with args;
 * its exit status, its output in out (may be NULL). */
static int rogue(char *out, size_t outlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int rogue(char *out, size_t outlen, const char *fmt, ...)
{
	const char *bin = getenv("PEER_ROGUE_BIN");
	assert_non_null(bin);
	char args[1024], cmd[1400];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	snprintf(cmd, sizeof(cmd), "'%s' %s 2>&1", bin, args);
	FILE *f = popen(cmd, "r");
	assert_non_null(f);
	char buf[4096];
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = '\0';
	int st = pclose(f);
	if (out)
		snprintf(out, outlen, "%s", buf);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* peer_rogue with args in the background, its output discarded: its pid,
 * to kill when the test is done with it (a lying peer serves for a fixed
 * time otherwise). */
static pid_t rogue_spawn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static pid_t rogue_spawn(const char *fmt, ...)
{
	const char *bin = getenv("PEER_ROGUE_BIN");
	assert_non_null(bin);
	char args[1024], cmd[1400];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	snprintf(cmd, sizeof(cmd), "exec '%s' %s >/dev/null 2>&1", bin, args);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	usleep(300 * 1000); /* listening */
	return pid;
}

static void rogue_kill(pid_t pid)
{
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
}

/* Put a rogue replica of job's (step, rank 0 of 1) of n bytes on node i,
 * said to come from the node named from: filled by seed, its tensor
 * claiming claim's CRC. Expected to be held (ack 0). */
static void rogue_put(int i, int from, const char *job, uint64_t step, size_t n, uint64_t seed, uint64_t claim)
{
	char out[1024];
	int r = rogue(out, sizeof(out), "put 127.0.0.1:%d '%s' 127.0.0.1:%d %s %llu 0 1 %zu %llu %llu", ports[i], certs,
		      ports[from], job, (unsigned long long)step, n, (unsigned long long)seed,
		      (unsigned long long)claim);
	if (r != 0)
		fail_msg("rogue put of %s step %llu: %s", job, (unsigned long long)step, out);
}

/* Load step expecting failure; its status. */
static int rc_load_fails(struct rank_client *rc, uint64_t step, char *msg, size_t msglen)
{
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_load(rc->c, (int64_t)step, &rc->t, 1, &f), 0);
	int r = ckpt_future_wait(f, CKPT_LOADED, 60000);
	snprintf(msg, msglen, "%s", ckpt_future_message(f));
	ckpt_future_free(f);
	return r;
}

/* A node's own data is its own: replicas a peer with a valid certificate
 * puts for this node's own (job, rank), at its steps or newer, with other
 * bytes and matching CRCs, are held apart from the node's copies. They
 * never replace one (a memory-only step and a durable one loaded by
 * number restore the node's bytes), never evict one (two tiny puts of
 * newer steps leave the memory-only step that is the only copy), never
 * refuse one of the rank's later saves, and never stand in for the rank
 * (its held list and a load of the injected step do not see them). */
static void test_replica_never_replaces_own_copy(void **state)
{
	(void)state;
	struct cluster c;
	cluster_start(&c, 2, NULL);
	struct rank_client rc;
	rc_open(&c.n[0], &rc, "mine", 0, 1, MIB);
	char src[16], msg[512];
	rc_save_wait(&rc, 10, 0, CKPT_TIER_MEMORY, CKPT_KEPT);
	rogue_put(0, 1, "mine", 10, MIB, 0xbad, 0xbad);
	rc_load(&rc, 10, 0, src, sizeof(src), NULL, 0);
	assert_string_equal(src, "memory");
	/* Newer steps, tiny: the memory-only step 10 is the only copy. */
	rogue_put(0, 1, "mine", 11, 4096, 0xbad, 0xbad);
	rogue_put(0, 1, "mine", 12, 4096, 0xbad, 0xbad);
	rc_load(&rc, 10, 0, src, sizeof(src), NULL, 0);
	assert_string_equal(src, "memory");
	ckpt_held_info *h = NULL;
	size_t nh = 0;
	assert_int_equal(ckpt_held(rc.c, "mine", 0, &h, &nh), 0);
	assert_int_equal(nh, 1);
	assert_int_equal(h[0].step, 10);
	free(h);
	assert_int_equal(held_all(&c.n[0], "mine", &h), 3); /* ckptctl sees all */
	free(h);
	int r = rc_load_fails(&rc, 12, msg, sizeof(msg));
	if (r != -ENOENT)
		fail_msg("load of a step only a rogue replica has: %d (%s)", r, msg);
	/* A durable step loaded by number. */
	rc_save_wait(&rc, 30, 0, CKPT_TIER_DURABLE, CKPT_DURABLE);
	rogue_put(0, 1, "mine", 30, MIB, 0xbad, 0xbad);
	rc_load(&rc, 30, 0, src, sizeof(src), NULL, 0);
	/* A later save of the rank is not refused as older than a replica. */
	rogue_put(0, 1, "mine", 100, 4096, 0xbad, 0xbad);
	rc_save_wait(&rc, 31, 0, CKPT_TIER_MEMORY, CKPT_KEPT);
	rc_load(&rc, 31, 0, src, sizeof(src), NULL, 0);
	assert_string_equal(src, "memory");
	rc_close(&rc);
	cluster_stop(&c, 2);
}

/* Bytes from a peer for a step in storage are checked against the stored
 * manifest whatever [pool] verify_held says: a holder whose copy of the
 * step claims the stored CRC over other bytes (its chunk CRCs match them)
 * is caught, and the replacement node reads the step from storage at
 * once, bit-exact, the bad copy counted. */
static void test_peer_bytes_proven_against_storage(void **state)
{
	(void)state;
	struct cluster c;
	const char *extra[NODES] = { "[pool]\nverify_held = false\n", NULL, NULL };
	cluster_start(&c, 2, extra);
	struct rank_client rc;
	rc_open(&c.n[0], &rc, "proof", 0, 1, 2 * MIB);
	rc_save_wait(&rc, 7, 0, CKPT_TIER_DURABLE, CKPT_DURABLE);
	rc_close(&rc);
	rogue_put(successor(0, 2), 0, "proof", 7, 2 * MIB, 0xbad, 7000);
	node_kill(&c, 0);
	h_start(&c.n[0], c.conf[0]);
	rc_open(&c.n[0], &rc, "proof", 0, 1, 2 * MIB);
	char src[16];
	for (int i = 0; i < 2; i++) {
		rc_load(&rc, 7, 0, src, sizeof(src), NULL, 0);
		assert_string_equal(src, "storage");
		assert_int_equal(h_metric(&c.n[0], "ckptd_memory_copies_failed_total"), (uint64_t)i + 1);
	}
	rc_close(&rc);
	cluster_stop(&c, 2);
}

/* 64 connections with no certificate that send a TLS record header and
 * then a byte every half second, as the replicated save starts: the
 * handshake has one deadline (3 s here), the dripping connections may
 * hold max_handshakes slots at most, the oldest giving way to a new one,
 * so the save's own connection gets through and the step is replicated;
 * every dripping connection is closed within its deadline. */
static void test_dripping_connections_do_not_stop_replication(void **state)
{
	(void)state;
	struct cluster c;
	cluster_start(&c, 2, NULL);
	int s = successor(0, 2);
	const char *bin = getenv("PEER_ROGUE_BIN");
	char cmd[512], out[256] = "";
	snprintf(cmd, sizeof(cmd), "'%s' drip 127.0.0.1:%d 64 5", bin, ports[s]);
	FILE *drip = popen(cmd, "r");
	assert_non_null(drip);
	usleep(500 * 1000); /* all 64 are open and dripping */
	struct rank_client rc;
	rc_open(&c.n[0], &rc, "drip", 0, 1, 2 * MIB);
	ckpt_future *f = rc_save(&rc, 1, 0, CKPT_TIER_REPLICATED);
	int r = ckpt_future_wait(f, CKPT_REPLICATED, 20000);
	if (r != 0)
		fail_msg("replicated: %s (%s)", ckpt_strerror(r), ckpt_future_message(f));
	ckpt_future_free(f);
	size_t n = fread(out, 1, sizeof(out) - 1, drip);
	out[n] = '\0';
	pclose(drip);
	assert_string_equal(out, "open 0\n");
	/* On loopback the drippers and the peer share one address: its cap
	 * ([peers] max_per_address) is met first. */
	assert_true(h_metric(&c.n[s], "ckptd_refused_total{limit=\"peer_handshakes\"}") +
			    h_metric(&c.n[s], "ckptd_refused_total{limit=\"peer_per_address\"}") >=
		    48);
	assert_true(h_metric(&c.n[s], "ckptd_refused_total{limit=\"peer_deadline\"}") >= 1);
	h_assert_serves(&c.n[s]);
	rc_close(&rc);
	cluster_stop(&c, 2);
}

/* A peer with a valid certificate that begins a frame and drips it is cut
 * at the frame's deadline (timeout_ms 3 s + its bytes at min_rate); one
 * that claims a frame larger than a manifest this node's limits allow is
 * closed at once, nothing buffered. */
static void test_peer_frames_have_deadlines_and_bounds(void **state)
{
	(void)state;
	struct cluster c;
	cluster_start(&c, 2, NULL);
	char out[256];
	int r = rogue(out, sizeof(out), "frame 127.0.0.1:%d '%s' 1000 200 10", ports[0], certs);
	unsigned ms = 0;
	if (r != 0 || sscanf(out, "closed after %u", &ms) != 1 || ms < 2500 || ms > 6000)
		fail_msg("a dripped frame: %s", out);
	r = rogue(out, sizeof(out), "frame 127.0.0.1:%d '%s' 200000000 200 10", ports[0], certs);
	if (r != 0 || sscanf(out, "closed after %u", &ms) != 1 || ms > 1000)
		fail_msg("a frame of 200 MB: %s", out);
	assert_int_equal(h_metric(&c.n[0], "ckptd_refused_total{limit=\"peer_frame_bytes\"}"), 1);
	assert_true(h_metric(&c.n[0], "ckptd_peer_link_errors_total") >= 1);
	h_assert_serves(&c.n[0]);
	cluster_stop(&c, 2);
}

/* Replicas' extra state counts in the share, and their number is capped
 * ([peers] max_replicas): puts of tiny shards (a pool slot each) with
 * 1 MB of extra state each hold at most the share (2 of them in 2500K),
 * status counts the extra state, and the oldest give way; tiny replicas
 * without extra state stop at the count. Ranks differ, so that none
 * trims another. */
static void test_replica_extra_state_and_count_are_capped(void **state)
{
	(void)state;
	struct cluster c;
	const char *extra[NODES] = { "share = 2500K\nmax_replicas = 3\n", NULL, NULL };
	cluster_start(&c, 2, extra);
	char o[512];
	for (int rank = 0; rank < 4; rank++)
		assert_int_equal(rogue(o, sizeof(o), "put 127.0.0.1:%d '%s' 127.0.0.1:%d xs 1 %d 8 4096 1", ports[0],
				       certs, ports[1], rank),
				 0);
	assert_int_equal(h_metric(&c.n[0], "ckptd_peer_replicas_held"), 3);
	assert_true(setenv("ROGUE_EXTRA", "1000000", 1) == 0);
	for (int rank = 0; rank < 4; rank++)
		assert_int_equal(rogue(o, sizeof(o), "put 127.0.0.1:%d '%s' 127.0.0.1:%d xt 1 %d 8 4096 1", ports[0],
				       certs, ports[1], rank),
				 0);
	unsetenv("ROGUE_EXTRA");
	uint64_t held = h_metric(&c.n[0], "ckptd_peer_replicas_held");
	uint64_t b = h_metric(&c.n[0], "ckptd_peer_replica_bytes");
	if (held != 2 || b < 2000000 || b > 2500 * 1024)
		fail_msg("%llu replicas held, %llu bytes", (unsigned long long)held, (unsigned long long)b);
	cluster_stop(&c, 2);
}

/* What is served to peers: a peer with a valid certificate asking for a
 * node's own memory-only step (another tenant's, say) gets nothing, by
 * ReplicaGet or ReplicaList, nor for its own copy of a replicated step of
 * a job with a secret; its own copy of a replicated step of a job
 * without one is served (its bytes went to its successor in the clear),
 * and a replica the node holds for a peer is (to the node that lost it). A peer that puts replicas
 * must be one whose replicas go to this node: one that is not among its
 * ring predecessors is refused. */
static void test_own_copies_served_only_as_replicated(void **state)
{
	(void)state;
	struct cluster c;
	cluster_start(&c, 2, NULL);
	struct rank_client rc;
	rc_open(&c.n[0], &rc, "secret", 0, 1, MIB);
	rc_save_wait(&rc, 5, 0, CKPT_TIER_MEMORY, CKPT_KEPT);
	rc_close(&rc);
	char out[1024];
	assert_int_equal(rogue(out, sizeof(out), "get 127.0.0.1:%d '%s' secret 5 0 1", ports[0], certs), 1);
	if (strncmp(out, "data 2 0 ", 9) != 0)
		fail_msg("a node's own copy asked for: %s", out);
	assert_int_equal(rogue(out, sizeof(out), "list 127.0.0.1:%d '%s' secret", ports[0], certs), 0);
	assert_string_equal(out, "listed 0\n");
	/* Its own copy of a replicated save is served (its replica went to
	 * the successor in the clear: a resharding load still finds it once
	 * that successor is lost), but not one of a job with a secret. */
	rc_open(&c.n[0], &rc, "clear", 0, 1, MIB);
	rc_save_wait(&rc, 3, 0, CKPT_TIER_REPLICATED, CKPT_REPLICATED);
	rc_close(&rc);
	assert_int_equal(rogue(out, sizeof(out), "get 127.0.0.1:%d '%s' clear 3 0 1", ports[0], certs), 0);
	assert_int_equal(strncmp(out, "data 0 1048576 ", 15), 0);
	assert_int_equal(setenv("CKPT_JOB_KEY", "a secret", 1), 0);
	rc_open(&c.n[0], &rc, "keyed", 0, 1, MIB);
	rc_save_wait(&rc, 3, 0, CKPT_TIER_REPLICATED, CKPT_REPLICATED);
	rc_close(&rc);
	unsetenv("CKPT_JOB_KEY");
	assert_int_equal(rogue(out, sizeof(out), "get 127.0.0.1:%d '%s' keyed 3 0 1", ports[0], certs), 1);
	if (strncmp(out, "data 2 0 ", 9) != 0)
		fail_msg("a node's own copy of a job with a secret asked for: %s", out);
	/* Node 1's replicated step, held on node 0 for it. */
	rc_open(&c.n[1], &rc, "shared", 0, 1, MIB);
	rc_save_wait(&rc, 1, 0, CKPT_TIER_REPLICATED, CKPT_REPLICATED);
	rc_close(&rc);
	assert_int_equal(rogue(out, sizeof(out), "get 127.0.0.1:%d '%s' shared 1 0 1", ports[0], certs), 0);
	assert_int_equal(strncmp(out, "data 0 1048576 ", 15), 0);
	/* Not a ring predecessor of node 0. */
	assert_int_equal(
		rogue(out, sizeof(out), "put 127.0.0.1:%d '%s' 127.0.0.1:1 secret 6 0 1 4096 1", ports[0], certs), 1);
	if (strstr(out, "not one of the 1 peers before this node") == NULL)
		fail_msg("a put from outside the ring: %s", out);
	cluster_stop(&c, 2);
}

/* [peers] verify_names: a peer's certificate must name the host it
 * advertises, both ways; by default (auto) wherever a node's own
 * certificate names it. Nodes with certificates for 127.0.0.1 replicate;
 * a peer whose valid certificate names 127.0.0.2 cannot speak as a node
 * of 127.0.0.1 (its put is closed after PeerHello), nor can one whose
 * certificate names no host. With verify_names = false, or a certificate
 * that names no node (one for all, as test_lying_peer_is_bounded's), the
 * log says at start that names are not checked. */
static void test_names_bound_to_certificates(void **state)
{
	(void)state;
	struct dctx n[2];
	int port[2] = { h_free_port(), h_free_port() };
	char conf[2][1024];
	for (int i = 0; i < 2; i++) {
		h_init(&n[i]);
		if (i > 0)
			snprintf(n[i].store, sizeof(n[i].store), "%s", n[0].store);
		snprintf(conf[i], sizeof(conf[i]),
			 "[pool]\nstaging_bytes = 64M\n[peers]\nlisten = 127.0.0.1:%d\npeers = "
			 "127.0.0.1:%d,127.0.0.1:%d\n"
			 "replicas = 1\ncert = %s/ip1.crt\nkey = %s/ip1.key\nca = %s/ca.crt\ntimeout_ms = 3000\n",
			 port[i], port[0], port[1], certs, certs, certs);
		h_start(&n[i], conf[i]);
	}
	struct rank_client rc;
	rc_open(&n[0], &rc, "named", 0, 1, MIB);
	rc_save_wait(&rc, 1, 0, CKPT_TIER_REPLICATED, CKPT_REPLICATED);
	rc_close(&rc);
	char out[1024];
	assert_true(setenv("ROGUE_CERT", "ip2", 1) == 0);
	int r = rogue(out, sizeof(out), "put 127.0.0.1:%d '%s' 127.0.0.1:%d named 9 0 1 4096 1", port[0], certs,
		      port[1]);
	unsetenv("ROGUE_CERT");
	assert_int_equal(r, 1);
	assert_null(strstr(out, "ack 0"));
	r = rogue(out, sizeof(out), "put 127.0.0.1:%d '%s' 127.0.0.1:%d named 9 0 1 4096 1", port[0], certs, port[1]);
	assert_int_equal(r, 1);
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "grep -c 'which its certificate does not name' '%s/ckptd.log' | grep -qx 2",
		 n[0].dir);
	assert_int_equal(system(cmd), 0);
	snprintf(cmd, sizeof(cmd), "grep -q 'verify_names = auto: this node.s certificate names it' '%s/ckptd.log'",
		 n[0].dir);
	assert_int_equal(system(cmd), 0);
	/* Off by choice: the put under another's name is taken (it is node
	 * 0's predecessor, 127.0.0.1:port[1]), and the log said so. */
	h_stop(&n[0]);
	char off[1100];
	snprintf(off, sizeof(off), "%sverify_names = false\n", conf[0]);
	h_start(&n[0], off);
	assert_true(setenv("ROGUE_CERT", "ip2", 1) == 0);
	r = rogue(out, sizeof(out), "put 127.0.0.1:%d '%s' 127.0.0.1:%d named 9 0 1 4096 1", port[0], certs, port[1]);
	unsetenv("ROGUE_CERT");
	assert_int_equal(r, 0);
	snprintf(cmd, sizeof(cmd),
		 "grep -q 'names are not checked against certificates (.peers. verify_names = false)' "
		 "'%s/ckptd.log'",
		 n[0].dir);
	assert_int_equal(system(cmd), 0);
	h_assert_serves(&n[0]);
	h_cleanup(&n[1]);
	h_cleanup(&n[0]);
}

/* A peer that lies in its answers (peer_rogue serve, node 0's successor):
 * a world size of 2000 it claims for a memory-only step is not asked for
 * rank by rank (the load gives up after [peers] max_missing_ranks saved
 * ranks found nowhere, in seconds); a list reply of 2,000,000 copies (4 MB
 * of empty entries) is refused at its header ([peers] max_list), not
 * decoded into a gigabyte; one of 3 copies, 2 of them not of the job
 * asked, is not used at all; answers dripped a byte at a time are cut at
 * their deadline. */
static void test_lying_peer_is_bounded(void **state)
{
	(void)state;
	struct dctx n;
	int port[2] = { h_free_port(), h_free_port() };
	char conf[1024];
	h_init(&n);
	snprintf(conf, sizeof(conf),
		 "[pool]\nstaging_bytes = 64M\n[peers]\nlisten = 127.0.0.1:%d\npeers = 127.0.0.1:%d,127.0.0.1:%d\n"
		 "replicas = 1\ncert = %s/node.crt\nkey = %s/node.key\nca = %s/ca.crt\ntimeout_ms = 1500\n"
		 "max_missing_ranks = 4\n",
		 port[0], port[0], port[1], certs, certs, certs);
	h_start(&n, conf);
	char log[600];
	snprintf(log, sizeof(log),
		 "grep -q 'verify_names = auto, and this node.s certificate does not name it' '%s/ckptd.log'", n.dir);
	assert_int_equal(system(log), 0);
	pid_t liar = rogue_spawn("serve %d '%s' 30 50 2000 1", port[1], certs);
	struct rank_client rc;
	rc_open(&n, &rc, "lie", 0, 1, MIB);
	double t0 = secs_now();
	char msg[512];
	int r = rc_load_fails(&rc, 50, msg, sizeof(msg));
	double s = secs_now() - t0;
	if (r != -ENOENT || strstr(msg, "no more asked: [peers] max_missing_ranks") == NULL || s > 5)
		fail_msg("a claimed world of 2000: %d in %.1f s (%s)", r, s, msg);
	assert_int_equal(h_metric(&n, "ckptd_refused_total{limit=\"peer_missing_ranks\"}"), 1);
	snprintf(log, sizeof(log), "grep -q 'no more asked: .peers. max_missing_ranks' '%s/ckptd.log'", n.dir);
	assert_int_equal(system(log), 0);
	rc_close(&rc);
	rogue_kill(liar);
	liar = rogue_spawn("serve %d '%s' 30 50 2000 2000000", port[1], certs);
	rc_open(&n, &rc, "lie", 0, 1, MIB);
	ckpt_held_info *h = NULL;
	size_t nh = 0;
	assert_int_equal(ckpt_held(rc.c, NULL, 0, &h, &nh), 0);
	assert_int_equal(nh, 0);
	free(h);
	rc_close(&rc);
	uint64_t lists = h_metric(&n, "ckptd_refused_total{limit=\"peer_list\"}");
	assert_true(lists >= 1);
	uint64_t rss = h_metric(&n, "ckptd_peak_rss_bytes");
	if (rss > 400u * MIB)
		fail_msg("peak RSS %llu MiB after a 4 MB list reply", (unsigned long long)(rss >> 20));
	rogue_kill(liar);
	liar = rogue_spawn("serve %d '%s' 30 50 2 3", port[1], certs);
	rc_open(&n, &rc, "lie", 0, 1, MIB);
	assert_int_equal(ckpt_held(rc.c, NULL, 0, &h, &nh), 0);
	assert_int_equal(nh, 0); /* its one true-looking copy not used either */
	free(h);
	rc_close(&rc);
	assert_true(h_metric(&n, "ckptd_refused_total{limit=\"peer_list\"}") > lists);
	snprintf(log, sizeof(log), "grep -q 'with copies not asked for; not used' '%s/ckptd.log'", n.dir);
	assert_int_equal(system(log), 0);
	rogue_kill(liar);
	/* A peer that drips its answers: a replicated save's put and a
	 * restore's get are cut at their frame's deadline (1.5 s here), not
	 * held for as long as it drips (30 s). */
	assert_int_equal(setenv("ROGUE_DRIP", "1", 1), 0);
	liar = rogue_spawn("serve %d '%s' 30 50 1 1", port[1], certs);
	unsetenv("ROGUE_DRIP");
	rc_open(&n, &rc, "drip", 0, 1, MIB);
	t0 = secs_now();
	ckpt_future *f = rc_save(&rc, 1, 0, CKPT_TIER_REPLICATED);
	assert_true(ckpt_future_wait(f, CKPT_REPLICATED, 30000) < 0);
	ckpt_future_free(f);
	s = secs_now() - t0;
	if (s > 8)
		fail_msg("a put to a dripping peer ended after %.1f s", s);
	t0 = secs_now();
	r = rc_load_fails(&rc, 70, msg, sizeof(msg));
	s = secs_now() - t0;
	if (r == 0 || s > 8)
		fail_msg("a restore from a dripping peer: %d after %.1f s (%s)", r, s, msg);
	rc_close(&rc);
	rogue_kill(liar);
	h_assert_serves(&n);
	h_cleanup(&n);
}

/* Load step expecting failure: its message holds want. */
static void rc_load_refused(struct rank_client *rc, uint64_t step, const char *want)
{
	char msg[512];
	int r = rc_load_fails(rc, step, msg, sizeof(msg));
	if (r == 0 || strstr(msg, want) == NULL)
		fail_msg("load of step %llu: %d (%s), want a failure saying '%s'", (unsigned long long)step, r, msg,
			 want);
}

/* A job whose trainers give a secret (CKPT_JOB_KEY) has its replicas
 * sealed: the holder keeps ciphertext it cannot read, persist, or hand to
 * a rank without the key; a replacement node whose rank gives the key
 * restores the step bit-exact from it; one with another key, or none, is
 * refused and says why; a replica put unsealed under the node's name (a
 * peer with a valid certificate) is not taken by a rank with the key. */
static void test_sealed_replicas(void **state)
{
	(void)state;
	struct cluster c;
	cluster_start(&c, 2, NULL);
	int s = successor(0, 2);
	assert_int_equal(setenv("CKPT_JOB_KEY", "tenant-a secret", 1), 0);
	struct rank_client rc;
	rc_open(&c.n[0], &rc, "sealed", 0, 1, 2 * MIB + 3);
	rc_save_wait(&rc, 5, 0, CKPT_TIER_REPLICATED, CKPT_REPLICATED);
	rc_close(&rc);
	char out[1024];
	assert_int_equal(rogue(out, sizeof(out), "get 127.0.0.1:%d '%s' sealed 5 0 1", ports[s], certs), 0);
	if (strstr(out, " sealed ") == NULL)
		fail_msg("the holder's copy: %s", out);
	ckpt_client *ctl = NULL;
	assert_int_equal(ckpt_connect(c.n[s].sock, NULL, &ctl), 0);
	ckpt_future *p = NULL;
	assert_int_equal(ckpt_persist_ex(ctl, "sealed", 5, CKPT_PERSIST_REPLICAS, &p), 0);
	assert_int_equal(ckpt_future_wait(p, CKPT_DURABLE, 10000), -EACCES);
	ckpt_future_free(p);
	ckpt_close(ctl);
	node_kill(&c, 0);
	h_start(&c.n[0], c.conf[0]);
	unsetenv("CKPT_JOB_KEY");
	rc_open(&c.n[0], &rc, "sealed", 0, 1, 2 * MIB + 3);
	rc_load_refused(&rc, 5, "sealed with its job's key");
	rc_close(&rc);
	assert_int_equal(setenv("CKPT_JOB_KEY", "another secret", 1), 0);
	rc_open(&c.n[0], &rc, "sealed", 0, 1, 2 * MIB + 3);
	rc_load_refused(&rc, 5, "does not open with this job's key");
	rc_close(&rc);
	assert_int_equal(setenv("CKPT_JOB_KEY", "tenant-a secret", 1), 0);
	rc_open(&c.n[0], &rc, "sealed", 0, 1, 2 * MIB + 3);
	char src[16], peer[128];
	rc_load(&rc, 5, 0, src, sizeof(src), peer, sizeof(peer));
	assert_string_equal(src, "peer");
	/* Unsealed, under node 0's name, on its holder. */
	rogue_put(s, 0, "sealed", 6, 2 * MIB + 3, 0xbad, 0xbad);
	rc_load_refused(&rc, 6, "not sealed");
	rc_close(&rc);
	unsetenv("CKPT_JOB_KEY");
	cluster_stop(&c, 2);
}

/* Resharding a sealed job on one node, nothing in storage and no
 * serve_own: four ranks on two nodes save step 4 replicated with a
 * secret, so each node holds its own ranks' copies and the other node's
 * as sealed replicas. A world of one on node 1 restores the whole blob:
 * its own ranks 1 and 3 from memory, ranks 0 and 2 opened from the sealed
 * replicas it holds, with the ranks' key (no peer asked: node 0 serves no
 * own copy), and rank 0's extra state from the sealed manifest. Without
 * the key, first, it cannot (once opened, the copies are this node's own,
 * in the clear, as the ranks' own saves are). */
static void test_sealed_reshard_from_replicas_held_here(void **state)
{
	(void)state;
	struct cluster c;
	cluster_start(&c, 2, NULL);
	int s = successor(0, 2);
	assert_int_equal(setenv("CKPT_JOB_KEY", "reshard secret", 1), 0);
	rs_save_all(&c, 2, "sealrs");
	unsetenv("CKPT_JOB_KEY");
	ckpt_hello h = { .job = "sealrs", .rank = 0, .world_size = 1, .attempt_id = "q" };
	ckpt_client *cl = NULL;
	assert_int_equal(ckpt_connect(c.n[s].sock, &h, &cl), 0);
	ckpt_buffer *b = NULL;
	uint64_t gshape[1] = { 4 * RS_PART };
	assert_int_equal(ckpt_buffer_alloc(cl, 4 * RS_PART, &b), 0);
	ckpt_tensor t = {
		.name = "blob", .dtype = CKPT_U8, .ndim = 1, .global_shape = gshape, .buffer = b, .nbytes = 4 * RS_PART
	};
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_load(cl, 4, &t, 1, &f), 0);
	assert_true(ckpt_future_wait(f, CKPT_LOADED, 60000) < 0);
	ckpt_future_free(f);
	ckpt_buffer_free(b);
	ckpt_close(cl);
	assert_int_equal(setenv("CKPT_JOB_KEY", "reshard secret", 1), 0);
	char src[16], extra[32], peer[128];
	uint64_t got = h_metric(&c.n[s], "ckptd_peer_received_bytes_total");
	rs_load_job(&c.n[s], "sealrs", 0, 1, src, sizeof(src), extra, sizeof(extra), peer, sizeof(peer));
	assert_string_equal(src, "mixed");
	assert_string_equal(extra, "rank-0");
	assert_int_equal(h_metric(&c.n[s], "ckptd_restores_from_peers_total"), 2);
	assert_int_equal(h_metric(&c.n[s], "ckptd_peer_received_bytes_total"), got); /* none over the network */
	unsetenv("CKPT_JOB_KEY");
	cluster_stop(&c, 2);
}

/* With tenants, a tenant's replicas leave the node sealed or not at all:
 * a replicated save of a tenant's job whose trainer gives no key is kept
 * and reported not replicated (EACCES, saying why); with a key it is
 * replicated sealed. serve_own never serves a tenant's own copies. */
static void test_tenant_replicas_are_sealed(void **state)
{
	(void)state;
	struct cluster c;
	char extra[2][256], tsock[2][128];
	for (int i = 0; i < 2; i++) {
		snprintf(tsock[i], sizeof(tsock[i]), "/tmp/ckpt-ta-%d-%d.sock", (int)getpid(), i);
		snprintf(extra[i], sizeof(extra[i]), "serve_own = true\n[tenant.ta]\nsocket = %s\n", tsock[i]);
	}
	const char *ex[NODES] = { extra[0], extra[1], NULL };
	cluster_start(&c, 2, ex);
	struct dctx t = c.n[0];
	snprintf(t.sock, sizeof(t.sock), "%s", tsock[0]);
	struct rank_client rc;
	rc_open(&t, &rc, "j", 0, 1, MIB);
	ckpt_future *f = rc_save(&rc, 1, 0, CKPT_TIER_REPLICATED);
	assert_int_equal(ckpt_future_wait(f, CKPT_KEPT, 30000), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_REPLICATED, 30000), -EACCES);
	if (strstr(ckpt_future_message(f), "sealed with its job's key") == NULL)
		fail_msg("%s", ckpt_future_message(f));
	ckpt_future_free(f);
	rc_close(&rc);
	char out[1024];
	/* Its own copy, with serve_own: not served. */
	assert_int_equal(rogue(out, sizeof(out), "get 127.0.0.1:%d '%s' ta/j 1 0 1", ports[0], certs), 1);
	assert_int_equal(strncmp(out, "data 2 ", 7), 0);
	assert_int_equal(setenv("CKPT_JOB_KEY", "ta secret", 1), 0);
	rc_open(&t, &rc, "j", 0, 1, MIB);
	rc_save_wait(&rc, 2, 0, CKPT_TIER_REPLICATED, CKPT_REPLICATED);
	rc_close(&rc);
	unsetenv("CKPT_JOB_KEY");
	assert_int_equal(rogue(out, sizeof(out), "get 127.0.0.1:%d '%s' ta/j 2 0 1", ports[successor(0, 2)], certs), 0);
	if (strstr(out, " sealed ") == NULL)
		fail_msg("the holder's copy: %s", out);
	cluster_stop(&c, 2);
	unlink(tsock[0]);
	unlink(tsock[1]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_replicated_save_held_by_next_node),
		cmocka_unit_test(test_killed_node_restores_from_peer),
		cmocka_unit_test(test_replacement_under_another_name),
		cmocka_unit_test(test_reshard_from_peers),
		cmocka_unit_test(test_persisted_step_restores_from_peer_first),
		cmocka_unit_test(test_holder_persists_lost_nodes_replicas),
		cmocka_unit_test(test_wrong_certificate_refused),
		cmocka_unit_test(test_peer_dies_mid_transfer),
		cmocka_unit_test(test_restore_right_after_holder_silence),
		cmocka_unit_test(test_replica_share_full),
		cmocka_unit_test(test_replica_damaged_on_the_way),
		cmocka_unit_test(test_garbage_on_the_peer_port),
		cmocka_unit_test(test_replica_never_replaces_own_copy),
		cmocka_unit_test(test_peer_bytes_proven_against_storage),
		cmocka_unit_test(test_dripping_connections_do_not_stop_replication),
		cmocka_unit_test(test_peer_frames_have_deadlines_and_bounds),
		cmocka_unit_test(test_replica_extra_state_and_count_are_capped),
		cmocka_unit_test(test_own_copies_served_only_as_replicated),
		cmocka_unit_test(test_names_bound_to_certificates),
		cmocka_unit_test(test_lying_peer_is_bounded),
		cmocka_unit_test(test_sealed_replicas),
		cmocka_unit_test(test_sealed_reshard_from_replicas_held_here),
		cmocka_unit_test(test_tenant_replicas_are_sealed),
	};
	return cmocka_run_group_tests(tests, make_certs, drop_certs);
}
