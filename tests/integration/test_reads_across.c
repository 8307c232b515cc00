/* Issue 38: restores' storage reads shared across nodes
 * (daemon/peer/peer_range.c). Three daemons linked as peers (TLS with
 * client certificates from a CA made here) stand for three nodes of a
 * data-parallel job; a fourth, alone, saved the model (one 32 MiB
 * tensor: two reads of 16 MiB) to the store they share. When all three
 * restore it at once, the three read 32 MiB from storage between them,
 * not 96 (ckptd_store_read_bytes_total), and pass the rest over the peer
 * links; restored again, nothing is read. Bytes a peer sends that fail
 * the manifest's CRC32C make the restore read the step from storage alone,
 * still bit-exact; a holder killed leaves the others reading for
 * themselves; a job whose trainers give a secret never shares. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "harness.h"

#define N (32u << 20)
#define NODES 3

static char certs[256];

/* A CA and one certificate it signed for every node. */
static int make_certs(void **state)
{
	(void)state;
	snprintf(certs, sizeof(certs), "/tmp/ckpt-across-XXXXXX");
	return h_peer_certs(certs);
}

static int drop_certs(void **state)
{
	(void)state;
	return h_sh("rm -rf '%s'", certs) == 0 ? 0 : -1;
}

/* The saver (alone, no peers) and the three nodes, on one store. */
struct cluster {
	struct dctx saver;
	struct dctx n[NODES];
	bool up[NODES];
};

static void cluster_start(struct cluster *c, const char *extra)
{
	int ports[NODES];
	char list[256] = "";
	size_t used = 0;
	for (int i = 0; i < NODES; i++) {
		ports[i] = h_free_port();
		used += (size_t)snprintf(list + used, sizeof(list) - used, "%s127.0.0.1:%d", i ? "," : "", ports[i]);
	}
	h_init(&c->saver);
	h_start(&c->saver, NULL);
	for (int i = 0; i < NODES; i++) {
		char conf[2048];
		snprintf(conf, sizeof(conf),
			 "[peers]\nlisten = 127.0.0.1:%d\npeers = %s\ncert = %s/node.crt\nkey = %s/node.key\n"
			 "ca = %s/ca.crt\ntimeout_ms = 3000\n"
			 /* Each leader waits before its read: the three nodes' loads
			  * surely meet (the second and third find the first's
			  * claim, and its read in flight or done). */
			 "[debug]\nread_delay_ms = 200\n%s",
			 ports[i], list, certs, certs, certs, extra ? extra : "");
		h_init(&c->n[i]);
		snprintf(c->n[i].store, sizeof(c->n[i].store), "%s", c->saver.store);
		h_start(&c->n[i], conf);
		c->up[i] = true;
	}
}

static void cluster_stop(struct cluster *c)
{
	for (int i = NODES - 1; i >= 0; i--)
		h_cleanup(&c->n[i]);
	h_cleanup(&c->saver);
}

/* Pattern seed with each byte masked by mask (0x0F: compressible). */
static void fill_masked(uint8_t *p, uint64_t seed, uint8_t mask)
{
	h_fill(p, N, seed);
	for (size_t i = 0; i < N; i++)
		p[i] &= mask;
}

/* One rank on each node that is up restores all of "blob.0" at once (the
 * whole model on every rank, as data-parallel replicas do); each must
 * find pattern seed, masked by mask. */
static void restore_masked(struct cluster *c, const char *job, uint64_t seed, uint8_t mask)
{
	struct h_rank r[NODES];
	ckpt_future *f[NODES] = { 0 };
	uint8_t *want = malloc(N);
	assert_non_null(want);
	fill_masked(want, seed, mask);
	for (int i = 0; i < NODES; i++) {
		if (!c->up[i])
			continue;
		h_rank_open(&c->n[i], &r[i], job, (uint32_t)i, NODES, N, "b", NULL, false);
		snprintf(r[i].name, sizeof(r[i].name), "blob.0");
		memset(ckpt_buffer_data(r[i].b), 0xEE, N);
	}
	for (int i = 0; i < NODES; i++)
		if (c->up[i])
			assert_int_equal(ckpt_load(r[i].c, 1, &r[i].t, 1, &f[i]), 0);
	for (int i = 0; i < NODES; i++) {
		if (!c->up[i])
			continue;
		int e = ckpt_future_wait(f[i], CKPT_LOADED, 60000);
		if (e != 0)
			fail_msg("node %d: %s: %s", i, ckpt_strerror(e), ckpt_future_message(f[i]));
		if (memcmp(ckpt_buffer_data(r[i].b), want, N) != 0)
			fail_msg("node %d: blob.0 is not what was saved", i);
		ckpt_future_free(f[i]);
		h_rank_close(&r[i]);
	}
	free(want);
}

static void restore_all(struct cluster *c, const char *job, uint64_t seed)
{
	restore_masked(c, job, seed, 0xFF);
}

/* A metric summed over the nodes that are up. */
static uint64_t total(struct cluster *c, const char *name)
{
	uint64_t v = 0;
	for (int i = 0; i < NODES; i++)
		if (c->up[i])
			v += h_metric(&c->n[i], name);
	return v;
}

struct counts {
	uint64_t read, in, out, fallbacks;
};

static struct counts counts_now(struct cluster *c)
{
	return (struct counts){ total(c, "ckptd_store_read_bytes_total"), total(c, "ckptd_range_bytes_in_total"),
				total(c, "ckptd_range_bytes_out_total"), total(c, "ckptd_range_fallbacks_total") };
}

static void print_counts(const char *what, struct counts a, struct counts b)
{
	print_message("# %s: %" PRIu64 " MiB read from storage, %" PRIu64 " MiB from peers, %" PRIu64
		      " MiB sent, %" PRIu64 " fallbacks\n",
		      what, (b.read - a.read) >> 20, (b.in - a.in) >> 20, (b.out - a.out) >> 20,
		      b.fallbacks - a.fallbacks);
}

static void test_replicas_read_once(void **state)
{
	(void)state;
	struct cluster c;
	cluster_start(&c, NULL);
	h_save_blob(&c.saver, "across", N, 38);
	struct counts a = counts_now(&c);
	restore_all(&c, "across", 38);
	struct counts b = counts_now(&c);
	print_counts("3 nodes restore 32 MiB at once", a, b);
	/* Each byte read from storage once for the three nodes; the two
	 * others got it from the node that read it. */
	assert_int_equal(b.read - a.read, (uint64_t)N);
	assert_int_equal(b.in - a.in, 2ull * N);
	assert_int_equal(b.out - a.out, 2ull * N);
	assert_int_equal(b.fallbacks, a.fallbacks);
	/* Again: the ranges are still kept where they were read. */
	restore_all(&c, "across", 38);
	struct counts d = counts_now(&c);
	print_counts("again", b, d);
	assert_int_equal(d.read, b.read);
	assert_int_equal(d.fallbacks, b.fallbacks);
	assert_true(h_metric(&c.n[0], "ckptd_range_kept_bytes") + h_metric(&c.n[1], "ckptd_range_kept_bytes") +
			    h_metric(&c.n[2], "ckptd_range_kept_bytes") ==
		    (uint64_t)N);
	cluster_stop(&c);
}

/* A step stored compressed (docs/format.md "Pieces"): the nodes share its
 * stored bytes, read from storage once between them, and each decodes
 * them for itself. */
static void test_compressed_read_once(void **state)
{
	(void)state;
	struct cluster c;
	cluster_start(&c, NULL);
	struct h_rank r;
	h_rank_open(&c.saver, &r, "zip", 0, 1, N, "a", NULL, false);
	fill_masked(ckpt_buffer_data(r.b), 41, 0x0F);
	ckpt_save_opts o = { .compress = CKPT_ON };
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_save_ex(r.c, 1, &r.t, 1, NULL, 0, &o, &f), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 60000), 0);
	ckpt_future_free(f);
	h_rank_close(&r);
	uint64_t stored = h_metric(&c.saver, "ckptd_bytes_stored_total");
	assert_true(stored < (uint64_t)N * 3 / 4);
	struct counts a = counts_now(&c);
	restore_masked(&c, "zip", 41, 0x0F);
	struct counts b = counts_now(&c);
	print_counts("3 nodes restore 32 MiB stored compressed", a, b);
	assert_int_equal(b.read - a.read, stored);
	assert_int_equal(b.in - a.in, 2 * stored);
	assert_int_equal(b.fallbacks, a.fallbacks);
	cluster_stop(&c);
}

/* An incremental step (docs/format.md "Pieces"): its pieces lie in its
 * own shard and in step 1's; the nodes restore it at once, bit-exact, each
 * range read from storage once between them, from both shards. */
static void test_incremental_read_once(void **state)
{
	(void)state;
	struct cluster c;
	cluster_start(&c, NULL);
	struct h_rank r;
	h_rank_open(&c.saver, &r, "inc", 0, 1, N, "a", NULL, false);
	uint8_t *p = ckpt_buffer_data(r.b);
	ckpt_save_opts o = { .incremental = CKPT_ON };
	for (uint64_t step = 1; step <= 2; step++) {
		fill_masked(p, 42, 0xFF);
		if (step == 2)
			memset(p + N / 2, 0x5A, N / 4); /* a quarter changed */
		ckpt_future *f = NULL;
		assert_int_equal(ckpt_save_ex(r.c, step, &r.t, 1, NULL, 0, &o, &f), 0);
		assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 60000), 0);
		ckpt_future_free(f);
	}
	h_rank_close(&r);
	uint64_t stored = h_metric(&c.saver, "ckptd_bytes_stored_total");
	assert_true(stored < (uint64_t)N * 3 / 2); /* step 2 stored its changed quarter */
	struct counts a = counts_now(&c);
	struct h_rank q[NODES];
	ckpt_future *f[NODES];
	uint8_t *want = malloc(N);
	fill_masked(want, 42, 0xFF);
	memset(want + N / 2, 0x5A, N / 4);
	for (int i = 0; i < NODES; i++) {
		h_rank_open(&c.n[i], &q[i], "inc", (uint32_t)i, NODES, N, "b", NULL, false);
		snprintf(q[i].name, sizeof(q[i].name), "blob.0");
		assert_int_equal(ckpt_load(q[i].c, 2, &q[i].t, 1, &f[i]), 0);
	}
	for (int i = 0; i < NODES; i++) {
		int e = ckpt_future_wait(f[i], CKPT_LOADED, 60000);
		if (e != 0)
			fail_msg("node %d: %s", i, ckpt_future_message(f[i]));
		assert_memory_equal(ckpt_buffer_data(q[i].b), want, N);
		ckpt_future_free(f[i]);
		h_rank_close(&q[i]);
	}
	free(want);
	struct counts b = counts_now(&c);
	print_counts("3 nodes restore an incremental step of 32 MiB", a, b);
	assert_int_equal(b.read - a.read, (uint64_t)N);
	assert_int_equal(b.in - a.in, 2ull * N);
	assert_int_equal(b.fallbacks, a.fallbacks);
	cluster_stop(&c);
}

/* A peer's bytes that fail the manifest's CRC32C (flipped on the wire by
 * its [debug] corrupt_range): the restore reads the step from storage
 * alone, bit-exact, and says so in its fallbacks. */
static void test_bad_bytes_read_again(void **state)
{
	(void)state;
	struct cluster c;
	cluster_start(&c, "corrupt_range = true\n");
	h_save_blob(&c.saver, "bad", N, 39);
	struct counts a = counts_now(&c);
	restore_all(&c, "bad", 39);
	struct counts b = counts_now(&c);
	print_counts("every range sent corrupt", a, b);
	assert_true(b.in - a.in > 0);
	/* Both nodes that got bytes from a peer read the step again. */
	assert_true(b.fallbacks - a.fallbacks >= 2);
	assert_true(b.read - a.read >= 3ull * N);
	cluster_stop(&c);
}

/* The node that read the ranges killed: the others restore on, reading
 * what it held for themselves. */
static void test_holder_killed(void **state)
{
	(void)state;
	struct cluster c;
	cluster_start(&c, NULL);
	h_save_blob(&c.saver, "gone", N, 40);
	restore_all(&c, "gone", 40);
	int holder = -1;
	for (int i = 0; i < NODES && holder < 0; i++)
		if (h_metric(&c.n[i], "ckptd_range_bytes_out_total") > 0)
			holder = i;
	assert_true(holder >= 0);
	kill(c.n[holder].pid, SIGKILL);
	waitpid(c.n[holder].pid, NULL, 0);
	c.n[holder].pid = -1;
	c.up[holder] = false;
	struct counts a = counts_now(&c);
	restore_all(&c, "gone", 40);
	struct counts b = counts_now(&c);
	print_counts("holder killed", a, b);
	assert_true(b.fallbacks - a.fallbacks >= 1);
	assert_true(b.read - a.read >= (uint64_t)N / 2);
	cluster_stop(&c);
}

/* A job whose trainers give a secret: its bytes never cross the network
 * in the clear, so each node reads for itself. */
static void test_secret_not_shared(void **state)
{
	(void)state;
	struct cluster c;
	cluster_start(&c, NULL);
	h_save_blob(&c.saver, "secret", N, 41);
	setenv("CKPT_JOB_KEY", "a secret of the job", 1);
	struct counts a = counts_now(&c);
	restore_all(&c, "secret", 41);
	struct counts b = counts_now(&c);
	unsetenv("CKPT_JOB_KEY");
	print_counts("a job with a secret", a, b);
	assert_int_equal(b.read - a.read, 3ull * N);
	assert_int_equal(b.in, a.in);
	cluster_stop(&c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_compressed_read_once), cmocka_unit_test(test_incremental_read_once),
		cmocka_unit_test(test_replicas_read_once),   cmocka_unit_test(test_bad_bytes_read_again),
		cmocka_unit_test(test_holder_killed),        cmocka_unit_test(test_secret_not_shared),
	};
	return cmocka_run_group_tests(tests, make_certs, drop_certs);
}
