/* The step index (docs/scale.md "At scale"): show of a whole step, what ckpt.dcp's
 * read_metadata runs on every rank, after a restart. A step saved by 4
 * ranks is shown by 8 ranks on each of two daemons ("nodes") sharing one
 * storage directory: the first show reads the 4 manifests and writes the
 * step's index; every later show, on either daemon and after a restart,
 * reads no manifest and one index per daemon. A damaged index gives the
 * same answer, from the manifests; rm removes the index too. Counted
 * where it matters: the files ckptd opens (inotify on the step directory)
 * and its metrics. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "harness.h"

#define JOB "ix"
#define SAVED 4 /* world size of the save */
#define RANKS 8 /* ranks that show it, on each daemon */
#define ELEMS (SAVED * 1024)

static struct dctx A, B; /* two "nodes", one storage directory */
static const uint64_t W_SHAPE[1] = { ELEMS };
static const uint64_t R_SHAPE[1] = { 16 };

/* SAVED ranks on d save step 1: "w" sharded by rank, "r" replicated. */
static void save_step(struct dctx *d)
{
	ckpt_client *c[SAVED];
	ckpt_buffer *b[SAVED];
	ckpt_future *f[SAVED];
	uint64_t off[SAVED][1], len[SAVED][1];
	for (uint32_t i = 0; i < SAVED; i++) {
		ckpt_hello h = { .job = JOB, .rank = i, .world_size = SAVED, .attempt_id = "a" };
		int e = ckpt_connect(d->sock, &h, &c[i]);
		if (e < 0)
			fail_msg("connect: %s (%s)", ckpt_strerror(e), ckpt_errmsg());
		off[i][0] = ELEMS / SAVED * i;
		len[i][0] = ELEMS / SAVED;
		assert_int_equal(ckpt_buffer_alloc(c[i], len[i][0] * 4 + 128, &b[i]), 0);
		memset(ckpt_buffer_data(b[i]), (int)i + 1, ckpt_buffer_size(b[i]));
		ckpt_tensor t[2] = {
			{ .name = "w",
			  .dtype = CKPT_F32,
			  .ndim = 1,
			  .global_shape = W_SHAPE,
			  .box_offsets = off[i],
			  .box_lengths = len[i],
			  .buffer = b[i],
			  .nbytes = len[i][0] * 4 },
			{ .name = "r",
			  .dtype = CKPT_F32,
			  .ndim = 1,
			  .global_shape = R_SHAPE,
			  .buffer = b[i],
			  .offset = (len[i][0] * 4 + 63) & ~63ull,
			  .nbytes = 64 },
		};
		static const char extra[] = "this rank's extra state";
		e = ckpt_save(c[i], 1, t, 2, extra, sizeof(extra), &f[i]);
		if (e < 0)
			fail_msg("save: %s (%s)", ckpt_strerror(e), ckpt_errmsg());
	}
	for (uint32_t i = 0; i < SAVED; i++) {
		int e = ckpt_future_wait(f[i], CKPT_DURABLE, 60000);
		if (e != 0)
			fail_msg("save rank %u: %s: %s", i, ckpt_strerror(e), ckpt_future_message(f[i]));
		ckpt_future_free(f[i]);
		ckpt_buffer_free(b[i]);
		ckpt_close(c[i]);
	}
}

static void step_path(char *out, size_t cap, const char *name)
{
	snprintf(out, cap, "%s/" JOB "/step-000000000001%s%s", A.store, name ? "/" : "", name ? name : "");
}

/* inotify on step 1's directory: the objects any process opens. */
static int watch_step(void)
{
	char dir[600];
	step_path(dir, sizeof(dir), NULL);
	int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	assert_true(fd >= 0);
	assert_true(inotify_add_watch(fd, dir, IN_OPEN) >= 0);
	return fd;
}

/* Whether each manifest was opened since watch_step; closes fd. inotify
 * merges identical unread events, so the metrics give the counts. */
static unsigned manifests_opened(int fd)
{
	bool opened[SAVED] = { false };
	char buf[65536] __attribute__((aligned(__alignof__(struct inotify_event))));
	ssize_t n;
	while ((n = read(fd, buf, sizeof(buf))) > 0) {
		for (char *p = buf; p < buf + n;) {
			const struct inotify_event *ev = (const struct inotify_event *)p;
			unsigned rank, ws;
			size_t l = ev->len ? strlen(ev->name) : 0;
			if (l > 9 && strcmp(ev->name + l - 9, ".manifest") == 0 &&
			    sscanf(ev->name, "rank-%5u-of-%5u.", &rank, &ws) == 2 && ws == SAVED && rank < SAVED)
				opened[rank] = true;
			p += sizeof(*ev) + ev->len;
		}
	}
	close(fd);
	unsigned k = 0;
	for (uint32_t i = 0; i < SAVED; i++)
		k += opened[i];
	return k;
}

/* The answer of a show, as far as a reader of the step uses it. */
static char *detail_text(const ckpt_step_detail *sd)
{
	size_t cap = 256 + sd->ntensors * 256, n = 0;
	char *s = malloc(cap);
	assert_non_null(s);
	n += (size_t)snprintf(s + n, cap - n, "%s %" PRIu64 " %d %" PRIu64 " %u/%u %s %zu\n", sd->info.job,
			      sd->info.step, sd->info.complete, sd->info.bytes, sd->info.ranks_present,
			      sd->info.world_size, sd->info.attempt_id, sd->ntensors);
	for (size_t i = 0; i < sd->ntensors; i++) {
		const ckpt_tensor_info *t = &sd->tensors[i];
		n += (size_t)snprintf(s + n, cap - n,
				      "%u %s %d %u %" PRIu64 "+%" PRIu64 " [%" PRIu64 " %" PRIu64 "] @%" PRIu64
				      " %" PRIu64 " %08x\n",
				      t->rank, t->name, t->dtype, t->ndim, t->box_offsets[0], t->box_lengths[0],
				      t->global_shape[0], (uint64_t)t->ndim, t->shard_offset, t->nbytes, t->crc32c);
	}
	return s;
}

struct shower {
	struct dctx *d;
	uint32_t rank;
	char *text;
	int err;
};

static void *show_one(void *arg)
{
	struct shower *w = arg;
	ckpt_hello h = { .job = JOB, .rank = w->rank, .world_size = RANKS };
	ckpt_client *c = NULL;
	w->err = ckpt_connect(w->d->sock, &h, &c);
	if (w->err < 0)
		return NULL;
	ckpt_step_detail *sd = NULL;
	w->err = ckpt_show(c, JOB, 1, &sd);
	if (w->err == 0) {
		w->text = detail_text(sd);
		ckpt_step_detail_free(sd);
	}
	ckpt_close(c);
	return NULL;
}

/* RANKS ranks of d show step 1 at once; each answer must be want (or,
 * want NULL, the same as the others'); returns it. */
static char *show_all(struct dctx *d, const char *want)
{
	struct shower w[RANKS];
	pthread_t t[RANKS];
	for (uint32_t i = 0; i < RANKS; i++) {
		w[i] = (struct shower){ .d = d, .rank = i };
		assert_int_equal(pthread_create(&t[i], NULL, show_one, &w[i]), 0);
	}
	for (uint32_t i = 0; i < RANKS; i++)
		pthread_join(t[i], NULL);
	char *first = NULL;
	for (uint32_t i = 0; i < RANKS; i++) {
		if (w[i].err != 0)
			fail_msg("show on rank %u: %s (%s)", i, ckpt_strerror(w[i].err), ckpt_errmsg());
		const char *ref = want ? want : w[0].text;
		if (strcmp(w[i].text, ref) != 0)
			fail_msg("show on rank %u:\n%s\nwant:\n%s", i, w[i].text, ref);
	}
	first = w[0].text;
	for (uint32_t i = 1; i < RANKS; i++)
		free(w[i].text);
	return first;
}

struct counts {
	uint64_t manifests, index_reads, index_writes;
};

static struct counts counts(struct dctx *d)
{
	return (struct counts){ h_metric(d, "ckptd_manifest_reads_total"), h_metric(d, "ckptd_step_index_reads_total"),
				h_metric(d, "ckptd_step_index_writes_total") };
}

/* Since *c: manifest GETs, index GETs, index PUTs of d; manifests opened
 * (inotify, any daemon) since fd's watch_step. *c is updated. */
/* ixr for shows that race the index's write: a rank that lists the step
 * after another wrote its index reads it instead of the manifests, which
 * the node read once already (0 or 1 GET: the cache shares it). */
#define RACING_INDEX_READS UINT64_MAX

static void assert_counts(struct dctx *d, struct counts *c, int fd, uint64_t man, uint64_t ixr, uint64_t ixw,
			  const char *when)
{
	struct counts now = counts(d);
	unsigned opened = manifests_opened(fd);
	print_message("# %s: %" PRIu64 " manifest GETs, %" PRIu64 " index GETs, %" PRIu64 " index PUTs\n", when,
		      now.manifests - c->manifests, now.index_reads - c->index_reads,
		      now.index_writes - c->index_writes);
	if (now.manifests - c->manifests != man || opened != (man ? SAVED : 0))
		fail_msg("%s: %" PRIu64 " manifest GETs (%u manifests opened), want %" PRIu64, when,
			 now.manifests - c->manifests, opened, man);
	if (ixr == RACING_INDEX_READS ? now.index_reads - c->index_reads > 1
				      : now.index_reads - c->index_reads != ixr)
		fail_msg("%s: %" PRIu64 " index GETs, want %" PRIu64, when, now.index_reads - c->index_reads, ixr);
	if (now.index_writes - c->index_writes != ixw)
		fail_msg("%s: %" PRIu64 " index PUTs, want %" PRIu64, when, now.index_writes - c->index_writes, ixw);
	*c = now;
}

static bool index_exists(void)
{
	char p[700];
	step_path(p, sizeof(p), "index");
	struct stat st;
	return stat(p, &st) == 0;
}

static int setup(void **state)
{
	(void)state;
	h_init(&A);
	h_init(&B);
	snprintf(B.store, sizeof(B.store), "%s", A.store);
	h_start(&A, NULL);
	h_start(&B, NULL);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	h_stop(&A);
	h_stop(&B);
	h_cleanup(&A);
	h_cleanup(&B);
	return 0;
}

static void restart(struct dctx *d)
{
	assert_int_equal(h_stop(d), 0);
	h_start(d, NULL);
}

static void test_show_from_index(void **state)
{
	(void)state;
	save_step(&A);
	/* Pinned, as by the restore that comes before read_metadata. */
	ckpt_hello h0 = { 0 };
	ckpt_client *ctl = NULL;
	assert_int_equal(ckpt_connect(A.sock, &h0, &ctl), 0);
	ckpt_step_info si;
	assert_int_equal(ckpt_resolve(ctl, JOB, 1, &si), 0);
	ckpt_close(ctl);
	restart(&A); /* nothing in memory */
	assert_false(index_exists());

	/* The first shows read the manifests (once on this node) and write
	 * the index (shows that list the step after it was written read it). */
	struct counts ca = counts(&A), cb = counts(&B);
	int fd = watch_step();
	char *want = show_all(&A, NULL);
	assert_non_null(strstr(want, " 4/4 a 8\n"));
	uint64_t ix0 = ca.index_reads;
	assert_counts(&A, &ca, fd, SAVED, RACING_INDEX_READS, 1, "first show on 8 ranks of A");
	assert_true(index_exists());

	/* Later shows on the same daemon: the index read once (by now, or by
	 * a first show that raced its write), no manifest. */
	fd = watch_step();
	free(show_all(&A, want));
	assert_counts(&A, &ca, fd, 0, ca.index_reads == ix0 ? 1 : 0, 0, "second show on 8 ranks of A");

	/* The other node, and each after a restart: the same. */
	fd = watch_step();
	free(show_all(&B, want));
	assert_counts(&B, &cb, fd, 0, 1, 0, "show on 8 ranks of B");
	restart(&A);
	restart(&B);
	ca = counts(&A);
	cb = counts(&B);
	fd = watch_step();
	free(show_all(&A, want));
	assert_counts(&A, &ca, fd, 0, 1, 0, "show on 8 ranks of A after a restart");
	fd = watch_step();
	free(show_all(&B, want));
	assert_counts(&B, &cb, fd, 0, 1, 0, "show on 8 ranks of B after a restart");

	/* Keep the index, to make one of another attempt below. */
	char p[700];
	step_path(p, sizeof(p), "index");
	FILE *fp = fopen(p, "rb");
	assert_non_null(fp);
	static uint8_t good[1 << 16];
	size_t good_len = fread(good, 1, sizeof(good), fp);
	fclose(fp);
	assert_true(good_len > 0 && good_len < sizeof(good));

	/* A damaged index: the same answer, from the manifests; not written
	 * again (it exists). */
	int ifd = open(p, O_WRONLY | O_TRUNC);
	if (ifd < 0) { /* created read-only */
		assert_int_equal(chmod(p, 0644), 0);
		ifd = open(p, O_WRONLY | O_TRUNC);
	}
	assert_true(ifd >= 0);
	static const char garbage[] = "\x0a\xff\xff\xff\xff\x0f not a step index at all";
	assert_int_equal(write(ifd, garbage, sizeof(garbage)), (ssize_t)sizeof(garbage));
	close(ifd);
	restart(&B);
	cb = counts(&B);
	fd = watch_step();
	free(show_all(&B, want));
	/* The ranks that meet the damaged index in flight share its GET; one
	 * that comes after the first found it damaged does not GET it. */
	struct counts now = counts(&B);
	assert_true(now.index_reads - cb.index_reads >= 1);
	assert_counts(&B, &cb, fd, SAVED, now.index_reads - cb.index_reads, 0, "show on 8 ranks of B, index damaged");
	fd = watch_step();
	free(show_all(&B, want));
	assert_counts(&B, &cb, fd, 0, 0, 0, "again: manifests from B's cache, the damaged index not read again");

	/* A well-formed index of another attempt (every manifest says so
	 * too) than the commit pins: ignored, the same answer from the
	 * manifests (B's cache holds them now). */
	Ckpt__StepIndex *ix = ckpt__step_index__unpack(NULL, good_len, good);
	assert_non_null(ix);
	assert_string_equal(ix->attempt_id, "a");
	assert_int_equal(ix->n_manifests, SAVED);
	ix->attempt_id[0] = 'b';
	for (size_t i = 0; i < ix->n_manifests; i++)
		ix->manifests[i]->attempt_id[0] = 'b';
	size_t blen = ckpt__step_index__get_packed_size(ix);
	uint8_t *bbuf = malloc(blen);
	assert_non_null(bbuf);
	ckpt__step_index__pack(ix, bbuf);
	ckpt__step_index__free_unpacked(ix, NULL);
	ifd = open(p, O_WRONLY | O_TRUNC);
	assert_true(ifd >= 0);
	assert_int_equal(write(ifd, bbuf, blen), (ssize_t)blen);
	close(ifd);
	free(bbuf);
	fd = watch_step();
	free(show_all(&B, want));
	assert_counts(&B, &cb, fd, 0, 1, 0, "show on 8 ranks of B, index of another attempt");

	/* rm removes the index with the step. */
	assert_int_equal(ckpt_connect(A.sock, &h0, &ctl), 0);
	assert_int_equal(ckpt_delete(ctl, JOB, 1), 0);
	ckpt_close(ctl);
	assert_false(index_exists());
	char dir[700];
	step_path(dir, sizeof(dir), NULL);
	struct stat st;
	assert_int_not_equal(stat(dir, &st), 0);
	free(want);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_show_from_index),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
