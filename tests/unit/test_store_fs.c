#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <grp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "catalog.h"
#include "journal.h"
#include "manifest.h"
#include "manifest_util.h"
#include "backends.h"
#include "store.h"
#include "storefix.h"
#include "testutil.h"

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted names under prefix, joined by ','. */
static void list_joined(struct store *s, const char *prefix, char *out, size_t cap)
{
	char **names = NULL;
	size_t n = 0;
	assert_int_equal(s->ops->list(s, prefix, &names, &n), 0);
	qsort(names, n, sizeof(*names), cmp_str);
	out[0] = '\0';
	for (size_t i = 0; i < n; i++) {
		strncat(out, names[i], cap - strlen(out) - 1);
		if (i + 1 < n)
			strncat(out, ",", cap - strlen(out) - 1);
	}
	store_names_free(names, n);
}

/* Names actually on disk in dir (including hidden and temporary ones). */
static void disk_joined(const char *dir, char *out, size_t cap)
{
	char *names[64];
	size_t n = 0;
	DIR *d = opendir(dir);
	assert_non_null(d);
	struct dirent *e;
	while ((e = readdir(d)) != NULL && n < 64)
		if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
			names[n++] = strdup(e->d_name);
	closedir(d);
	qsort(names, n, sizeof(*names), cmp_str);
	out[0] = '\0';
	for (size_t i = 0; i < n; i++) {
		strncat(out, names[i], cap - strlen(out) - 1);
		if (i + 1 < n)
			strncat(out, ",", cap - strlen(out) - 1);
		free(names[i]);
	}
}

static int put_str(struct store *s, const char *key, const char *text)
{
	struct iovec iov = { .iov_base = (void *)text, .iov_len = strlen(text) };
	return s->ops->put(s, key, &iov, 1, NULL);
}

static void test_put_get(void **state)
{
	struct store_fixture *f = *state;
	struct store *s = f->s;
	uint64_t seed = 11;
	size_t n0 = 1000, n2 = 70000, total = n0 + n2;
	uint8_t *a = malloc(n0), *c = malloc(n2), *whole = malloc(total);
	assert_true(a && c && whole);
	tu_fill(&seed, a, n0);
	tu_fill(&seed, c, n2);
	memcpy(whole, a, n0);
	memcpy(whole + n0, c, n2);
	struct iovec iov[3] = {
		{ .iov_base = a, .iov_len = n0 },
		{ .iov_base = NULL, .iov_len = 0 },
		{ .iov_base = c, .iov_len = n2 },
	};
	assert_int_equal(s->ops->put(s, "a/b/obj", iov, 3, NULL), 0);

	void *got = NULL;
	size_t len = 0;
	assert_int_equal(s->ops->get_all(s, "a/b/obj", total, &got, &len), 0);
	assert_int_equal(len, total);
	assert_memory_equal(got, whole, total);
	free(got);

	static const struct {
		uint64_t off;
		size_t len;
	} r[] = {
		{ 0, 1 },     { 0, 1000 },  { 999, 2 },      { 500, 70500 },
		{ 70999, 1 }, { 0, 71000 }, { 65536, 4096 }, { 71000, 0 },
	};
	uint8_t *buf = malloc(total);
	assert_non_null(buf);
	for (size_t i = 0; i < sizeof(r) / sizeof(r[0]); i++) {
		memset(buf, 0, total);
		assert_int_equal(s->ops->get_range(s, "a/b/obj", r[i].off, buf, r[i].len), 0);
		assert_memory_equal(buf, whole + r[i].off, r[i].len);
	}
	assert_int_equal(s->ops->get_range(s, "a/b/obj", 70990, buf, 20), -ENODATA);
	assert_int_equal(s->ops->get_range(s, "a/b/obj", 71000, buf, 1), -ENODATA);
	assert_int_equal(s->ops->get_range(s, "a/b/obj", 1ull << 40, buf, 1), -ENODATA);
	assert_int_equal(s->ops->get_range(s, "a/b/missing", 0, buf, 1), -ENOENT);

	/* The object is where the layout says, under the root. */
	char path[256];
	struct stat st;
	snprintf(path, sizeof(path), "%s/a/b/obj", f->dir);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_size, total);

	/* Zero iovecs: an empty object. */
	assert_int_equal(s->ops->put(s, "empty", NULL, 0, NULL), 0);
	assert_int_equal(s->ops->get_all(s, "empty", 0, &got, &len), 0);
	assert_int_equal(len, 0);
	free(got);
	free(buf);
	free(a);
	free(c);
	free(whole);
}

static void test_get_all_limits(void **state)
{
	struct store_fixture *f = *state;
	struct store *s = f->s;
	assert_int_equal(put_str(s, "k", "0123456789"), 0);
	void *got = (void *)0x1;
	size_t len = 77;
	assert_int_equal(s->ops->get_all(s, "k", 9, &got, &len), -EFBIG);
	assert_ptr_equal(got, (void *)0x1);
	assert_int_equal(len, 77);
	assert_int_equal(s->ops->get_all(s, "k", 10, &got, &len), 0);
	assert_int_equal(len, 10);
	assert_memory_equal(got, "0123456789", 10);
	free(got);
	assert_int_equal(s->ops->get_all(s, "nope", 100, &got, &len), -ENOENT);
}

static void test_list(void **state)
{
	struct store_fixture *f = *state;
	struct store *s = f->s;
	char buf[512], path[256];
	assert_int_equal(put_str(s, "d/y", "y"), 0);
	assert_int_equal(put_str(s, "d/x", "x"), 0);
	assert_int_equal(put_str(s, "d/sub/z", "z"), 0);
	/* A leftover temporary file and a hidden one are not listed. */
	snprintf(path, sizeof(path), "%s/d/x.tmp.123.4", f->dir);
	FILE *fp = fopen(path, "w");
	assert_non_null(fp);
	fclose(fp);
	snprintf(path, sizeof(path), "%s/d/.hidden", f->dir);
	fp = fopen(path, "w");
	assert_non_null(fp);
	fclose(fp);

	list_joined(s, "d", buf, sizeof(buf));
	assert_string_equal(buf, "sub,x,y");
	list_joined(s, "d/sub", buf, sizeof(buf));
	assert_string_equal(buf, "z");
	list_joined(s, "", buf, sizeof(buf));
	assert_string_equal(buf, "d");

	char **names = NULL;
	size_t n = 0;
	assert_int_equal(s->ops->list(s, "nope", &names, &n), -ENOENT);
}

static void test_put_leaves_no_temp_and_replaces(void **state)
{
	struct store_fixture *f = *state;
	struct store *s = f->s;
	char dir[128], buf[512], path[256];
	snprintf(dir, sizeof(dir), "%s/j", f->dir);
	snprintf(path, sizeof(path), "%s/j/k", f->dir);

	assert_int_equal(put_str(s, "j/k", "the first, longer version"), 0);
	disk_joined(dir, buf, sizeof(buf));
	assert_string_equal(buf, "k");

	/* A reader that opened the old object keeps seeing it whole: the new
	 * one replaces it by rename, not by rewriting in place. */
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	struct stat before, after;
	assert_int_equal(fstat(fd, &before), 0);

	assert_int_equal(put_str(s, "j/k", "second"), 0);
	disk_joined(dir, buf, sizeof(buf));
	assert_string_equal(buf, "k");

	void *got = NULL;
	size_t len = 0;
	assert_int_equal(s->ops->get_all(s, "j/k", 1024, &got, &len), 0);
	assert_int_equal(len, 6);
	assert_memory_equal(got, "second", 6);
	free(got);

	char old[64] = "";
	assert_int_equal(pread(fd, old, sizeof(old) - 1, 0), 25);
	assert_string_equal(old, "the first, longer version");
	assert_int_equal(stat(path, &after), 0);
	assert_true(after.st_ino != before.st_ino);
	close(fd);

	for (int i = 0; i < 5; i++)
		assert_int_equal(put_str(s, "j/other", "v"), 0);
	disk_joined(dir, buf, sizeof(buf));
	assert_string_equal(buf, "k,other");
}

static void test_bad_keys(void **state)
{
	struct store_fixture *f = *state;
	struct store *s = f->s;
	static const char *bad[] = { "/etc/passwd", "/abs", "../x", "a/../../x", "a/..", "..", "a/../b" };
	char buf[8];
	void *got;
	size_t len;
	char **names;
	size_t n;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(put_str(s, bad[i], "x"), -EINVAL);
		assert_int_equal(s->ops->get_range(s, bad[i], 0, buf, 1), -EINVAL);
		assert_int_equal(s->ops->get_all(s, bad[i], 10, &got, &len), -EINVAL);
		assert_int_equal(s->ops->list(s, bad[i], &names, &n), -EINVAL);
	}
	/* Nothing was written anywhere under the root. */
	char on_disk[256];
	disk_joined(f->dir, on_disk, sizeof(on_disk));
	assert_string_equal(on_disk, "");
}

static void test_open_urls(void **state)
{
	struct store_fixture *f = *state;
	struct store *s = NULL;
	char err[256] = "";
	assert_int_equal(store_open("ftp://x", &s, err, sizeof(err)), -EPROTONOSUPPORT);
	assert_non_null(strstr(err, "ftp://x"));
	assert_int_equal(store_open("/tmp/plain", &s, err, sizeof(err)), -EPROTONOSUPPORT);
	/* s3:// and gs:// URLs are checked before any credential or network. */
	static const struct {
		const char *url, *why;
	} bad[] = {
		{ "s3://x", "bad bucket name" },
		{ "s3://Upper/p", "bad bucket name" },
		{ "gs://bucket/p?part_size=1M", "part_size must be 5M..5G" },
		{ "s3://bucket/p?concurrency=0", "out of range: concurrency=0" },
		{ "s3://bucket/p?nonsense=1", "unknown option" },
		{ "s3://bucket/p?endpoint=ftp://h", "endpoint must start with http:// or https://" },
		{ "s3://bucket/p?payload=md5", "payload must be unsigned or sha256" },
		{ "s3://bucket/p?region", "has no value" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = '\0';
		assert_int_equal(store_open(bad[i].url, &s, err, sizeof(err)), -EINVAL);
		if (strstr(err, bad[i].why) == NULL)
			fail_msg("%s: '%s', want '%s'", bad[i].url, err, bad[i].why);
	}
	err[0] = '\0';
	assert_int_equal(store_open("file://relative", &s, err, sizeof(err)), -EINVAL);
	assert_true(err[0] != '\0');
	assert_int_equal(store_open("file://", &s, err, sizeof(err)), -EINVAL);
	assert_null(s);

	/* A missing root is created; trailing slashes do not matter. */
	char url[256], path[256];
	snprintf(url, sizeof(url), "file://%s/new/root//", f->dir);
	assert_int_equal(store_open(url, &s, err, sizeof(err)), 0);
	assert_non_null(s);
	assert_string_equal(s->url, url);
	assert_int_equal(put_str(s, "k", "v"), 0);
	snprintf(path, sizeof(path), "%s/new/root/k", f->dir);
	assert_int_equal(access(path, R_OK), 0);
	store_free(s);
	store_free(NULL);
}

/* put with the file size limited to max bytes (RLIMIT_FSIZE: the write
 * fails with EFBIG, as a full disk fails with ENOSPC). */
static int put_limited(struct store *s, const char *key, const struct iovec *iov, size_t n, rlim_t max)
{
	struct rlimit saved, lim;
	assert_int_equal(getrlimit(RLIMIT_FSIZE, &saved), 0);
	lim = saved;
	lim.rlim_cur = max;
	void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
	assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
	int r = s->ops->put(s, key, iov, n, NULL);
	assert_int_equal(setrlimit(RLIMIT_FSIZE, &saved), 0);
	signal(SIGXFSZ, old_handler);
	return r;
}

/* A put that fails after its temporary file exists removes that file and
 * leaves the old object alone. RLIMIT_FSIZE makes the write fail. */
static void test_failed_put_cleans_up(void **state)
{
	struct store_fixture *f = *state;
	struct store *s = f->s;
	char dir[128], names[256];
	snprintf(dir, sizeof(dir), "%s/j", f->dir);
	assert_int_equal(put_str(s, "j/k", "old"), 0);

	static char big[64 * 1024];
	memset(big, 'x', sizeof(big));
	struct iovec iov = { .iov_base = big, .iov_len = sizeof(big) };
	assert_int_equal(put_limited(s, "j/k", &iov, 1, 4096), -EFBIG);

	disk_joined(dir, names, sizeof(names));
	assert_string_equal(names, "k");
	void *got = NULL;
	size_t len = 0;
	assert_int_equal(s->ops->get_all(s, "j/k", 1024, &got, &len), 0);
	assert_int_equal(len, 3);
	assert_memory_equal(got, "old", 3);
	free(got);
}

/* The read-only checks, without cmocka asserts so a child process can run
 * them: 0, or the number of the check that failed. */

/* --- catalog --- */

static void put_manifest_as(struct store *s, const char *key, const char *job, uint64_t step, uint32_t rank,
			    uint32_t ws, const char *attempt)
{
	struct tm_manifest x;
	tm_init(&x, job, step, rank, ws, attempt);
	size_t len;
	uint8_t *buf = tm_pack(&x.m, &len);
	assert_non_null(buf);
	struct iovec iov = { .iov_base = buf, .iov_len = len };
	assert_int_equal(s->ops->put(s, key, &iov, 1, NULL), 0);
	free(buf);
}

static void put_manifest(struct store *s, const char *job, uint64_t step, uint32_t rank, uint32_t ws,
			 const char *attempt)
{
	char key[256];
	assert_int_equal(manifest_key(key, sizeof(key), job, step, rank, ws, "manifest"), 0);
	put_manifest_as(s, key, job, step, rank, ws, attempt);
}

static void build_catalog(struct store *s)
{
	/* Written out of order; readdir order is arbitrary anyway. */
	put_manifest(s, "job", 4, 0, 2, "b");
	put_manifest(s, "job", 4, 1, 2, "b");
	put_manifest(s, "job", 4, 0, 3, "a"); /* stale, from a world of 3 */
	put_manifest(s, "job", 1, 1, 2, "a");
	put_manifest(s, "job", 1, 0, 2, "a");
	assert_int_equal(put_str(s, "job/step-000000000001/rank-00000-of-00002.shard", "bytes"), 0);
	put_manifest(s, "job", 3, 0, 2, "a");
	put_manifest(s, "job", 3, 1, 2, "b");
	put_manifest(s, "job", 2, 0, 2, "a");
	/* Step 2's rank 1 is corrupt: it must not complete the step. */
	assert_int_equal(put_str(s, "job/step-000000000002/rank-00001-of-00002.manifest", "not a manifest at all"), 0);
	/* Step 5 holds a manifest whose contents say step 4: ignored. */
	put_manifest_as(s, "job/step-000000000005/rank-00000-of-00001.manifest", "job", 4, 0, 1, "c");
	/* Not a step directory. */
	assert_int_equal(put_str(s, "job/notes/readme", "hi"), 0);
	put_manifest(s, "other", 7, 0, 1, "z");
}

static const struct catalog_group *best(const struct catalog_step *cs)
{
	assert_true(cs->best >= 0 && (size_t)cs->best < cs->ngroups);
	return &cs->groups[cs->best];
}

static void test_catalog_scan(void **state)
{
	struct store_fixture *f = *state;
	struct store *s = f->s;
	struct catalog_step cs;
	build_catalog(s);

	assert_int_equal(catalog_list_step(s, "job", 1, &cs), 0);
	assert_int_equal(cs.step, 1);
	assert_true(catalog_step_complete(&cs));
	assert_int_equal(cs.ngroups, 1);
	assert_string_equal(best(&cs)->attempt, "a");
	assert_int_equal(best(&cs)->count, 2);
	assert_int_equal(best(&cs)->world_size, 2);
	assert_int_equal(best(&cs)->bytes, 2 * TM_SHARD_BYTES);
	assert_non_null(best(&cs)->by_rank[0]);
	assert_non_null(best(&cs)->by_rank[1]);
	assert_int_equal(best(&cs)->by_rank[0]->rank, 0);
	assert_int_equal(best(&cs)->by_rank[1]->rank, 1);
	catalog_step_free(&cs);

	assert_int_equal(catalog_list_step(s, "job", 2, &cs), 0);
	assert_false(catalog_step_complete(&cs));
	assert_int_equal(cs.ngroups, 1);
	assert_int_equal(best(&cs)->count, 1);
	assert_int_equal(best(&cs)->bytes, TM_SHARD_BYTES);
	assert_non_null(best(&cs)->by_rank[0]);
	assert_null(best(&cs)->by_rank[1]);
	catalog_step_free(&cs);

	/* Two attempts, one rank each: not complete; the newer is best. */
	assert_int_equal(catalog_list_step(s, "job", 3, &cs), 0);
	assert_false(catalog_step_complete(&cs));
	assert_int_equal(cs.ngroups, 2);
	assert_int_equal(cs.groups[0].count, 1);
	assert_int_equal(cs.groups[1].count, 1);
	assert_string_equal(best(&cs)->attempt, "b");
	catalog_step_free(&cs);

	/* Complete for attempt "b" despite the stale world-3 manifest. */
	assert_int_equal(catalog_list_step(s, "job", 4, &cs), 0);
	assert_true(catalog_step_complete(&cs));
	assert_int_equal(cs.ngroups, 2);
	assert_string_equal(best(&cs)->attempt, "b");
	assert_int_equal(best(&cs)->count, 2);
	assert_int_equal(best(&cs)->world_size, 2);
	assert_int_equal(best(&cs)->bytes, 2 * TM_SHARD_BYTES);
	const struct catalog_group *stale = &cs.groups[cs.best == 0 ? 1 : 0];
	assert_string_equal(stale->attempt, "a");
	assert_int_equal(stale->world_size, 3);
	assert_int_equal(stale->count, 1);
	catalog_step_free(&cs);

	/* Only a manifest that cannot be trusted: not "no such step" but an
	 * error, so that GC and writers leave it alone. */
	assert_int_equal(catalog_list_step(s, "job", 5, &cs), -EBADMSG);
	assert_int_equal(cs.unreadable, 1);
	assert_false(catalog_step_complete(&cs));
	assert_int_equal(catalog_list_step(s, "job", 99, &cs), -ENOENT);
	assert_int_equal(catalog_list_step(s, "nojob", 1, &cs), -ENOENT);
}

static void test_catalog_steps_latest_jobs(void **state)
{
	struct store_fixture *f = *state;
	struct store *s = f->s;
	struct catalog_step cs;
	build_catalog(s);

	uint64_t *steps = NULL;
	size_t n = 0;
	assert_int_equal(catalog_steps(s, "job", &steps, &n), 0);
	assert_int_equal(n, 5);
	for (size_t i = 0; i < n; i++)
		assert_int_equal(steps[i], i + 1);
	free(steps);

	/* Step 5's only manifest cannot be trusted: latest is not decided
	 * past it (it never silently falls back to step 4). */
	char path[256];
	assert_int_equal(catalog_latest(s, "job", &cs), -EBADMSG);
	snprintf(path, sizeof(path), "%s/job/step-000000000005/rank-00000-of-00001.manifest", f->dir);
	assert_int_equal(unlink(path), 0);

	assert_int_equal(catalog_latest(s, "job", &cs), 0);
	assert_int_equal(cs.step, 4);
	assert_true(catalog_step_complete(&cs));
	assert_true(cs.pinned);
	assert_string_equal(best(&cs)->attempt, "b");
	catalog_step_free(&cs);

	/* Without rank 1 of step 4 (and step 4's pin), step 3 is incomplete
	 * and step 2 has a corrupt manifest: an error again, not step 1. */
	snprintf(path, sizeof(path), "%s/job/step-000000000004/rank-00001-of-00002.manifest", f->dir);
	assert_int_equal(unlink(path), 0);
	snprintf(path, sizeof(path), "%s/job/step-000000000004/commit", f->dir);
	assert_int_equal(unlink(path), 0);
	assert_int_equal(catalog_latest(s, "job", &cs), -EBADMSG);
	snprintf(path, sizeof(path), "%s/job/step-000000000002/rank-00001-of-00002.manifest", f->dir);
	assert_int_equal(unlink(path), 0);
	assert_int_equal(catalog_latest(s, "job", &cs), 0);
	assert_int_equal(cs.step, 1);
	assert_string_equal(best(&cs)->attempt, "a");
	catalog_step_free(&cs);

	assert_int_equal(catalog_latest(s, "other", &cs), 0);
	assert_int_equal(cs.step, 7);
	catalog_step_free(&cs);
	assert_int_equal(catalog_latest(s, "nojob", &cs), -ENOENT);

	/* Only valid job names are jobs. */
	snprintf(path, sizeof(path), "%s/bad name", f->dir);
	assert_int_equal(mkdir(path, 0755), 0);
	char **jobs = NULL;
	assert_int_equal(catalog_jobs(s, NULL, &jobs, &n), 0);
	qsort(jobs, n, sizeof(*jobs), cmp_str);
	assert_int_equal(n, 2);
	assert_string_equal(jobs[0], "job");
	assert_string_equal(jobs[1], "other");
	store_names_free(jobs, n);
}

static void test_catalog_no_complete_step(void **state)
{
	struct store_fixture *f = *state;
	struct store *s = f->s;
	struct catalog_step cs;
	put_manifest(s, "j", 1, 0, 2, "a");
	put_manifest(s, "j", 2, 1, 2, "a");
	assert_int_equal(catalog_latest(s, "j", &cs), -ENOENT);
}

/* --- catalog, format 2: attempts in names, completeness from one LIST --- */

static void put_v2(struct store *s, const char *job, uint64_t step, uint32_t rank, uint32_t ws, const char *attempt,
		   size_t shard_len)
{
	char key[512];
	struct tm_manifest x;
	tm_init(&x, job, step, rank, ws, attempt);
	assert_int_equal(
		manifest_shard_key(key, sizeof(key), job, step, rank, ws, attempt, 0xabcdef0123456789ull + rank, false),
		0);
	snprintf(x.shard, sizeof(x.shard), "%s", strrchr(key, '/') + 1);
	char *bytes = calloc(1, shard_len + 1);
	struct iovec sv = { bytes, shard_len };
	assert_int_equal(s->ops->put(s, key, &sv, 1, NULL), 0);
	free(bytes);
	size_t len;
	uint8_t *buf = tm_pack(&x.m, &len);
	assert_non_null(buf);
	struct iovec iov = { .iov_base = buf, .iov_len = len };
	assert_int_equal(manifest_key_attempt(key, sizeof(key), job, step, rank, ws, attempt), 0);
	assert_int_equal(s->ops->create(s, key, &iov, 1, NULL), 0);
	/* Create-only: a second manifest of this rank and attempt is refused
	 * and leaves the first in place. */
	assert_int_equal(s->ops->create(s, key, &iov, 1, NULL), -EEXIST);
	free(buf);
}

/* Age every manifest of attempt in job/step to t seconds. */
static void set_manifest_time(const char *root, const char *job, uint64_t step, uint32_t ws, const char *attempt,
			      time_t t)
{
	for (uint32_t r = 0; r < ws; r++) {
		char key[512], path[1024];
		assert_int_equal(manifest_key_attempt(key, sizeof(key), job, step, r, ws, attempt), 0);
		snprintf(path, sizeof(path), "%s/%s", root, key);
		struct timespec ts[2] = { { t, 0 }, { t, 0 } };
		assert_int_equal(utimensat(AT_FDCWD, path, ts, 0), 0);
	}
}

static void test_catalog_v2_from_listing(void **state)
{
	struct store_fixture *f = *state;
	struct store *s = f->s;
	struct catalog_step cs;
	put_v2(s, "j", 1, 0, 3, "att.1", 100);
	put_v2(s, "j", 1, 1, 3, "att.1", 200);
	put_v2(s, "j", 1, 2, 3, "att.1", 300);
	put_v2(s, "j", 1, 0, 3, "att-0", 7); /* an older attempt's leftover */
	/* Every manifest made unreadable: the listing alone still decides. */
	for (uint32_t r = 0; r < 3; r++) {
		char key[512];
		assert_int_equal(manifest_key_attempt(key, sizeof(key), "j", 1, r, 3, "att.1"), 0);
		char path[1024];
		snprintf(path, sizeof(path), "%s/%s", f->dir, key);
		assert_int_equal(truncate(path, 3), 0);
	}
	assert_int_equal(catalog_list_step(s, "j", 1, &cs), 0);
	assert_true(catalog_step_complete(&cs));
	assert_int_equal(cs.ngroups, 2);
	assert_string_equal(best(&cs)->attempt, "att.1");
	assert_int_equal(best(&cs)->count, 3);
	assert_int_equal(best(&cs)->bytes, 600);
	assert_false(cs.has_commit);
	/* ... and reading a manifest says it is corrupt, naming it. */
	const Ckpt__Manifest *m;
	char err[512];
	assert_int_equal(catalog_read_manifest(s, "j", &cs, 1, &m, err, sizeof(err)), -EBADMSG);
	assert_non_null(strstr(err, "rank-00001-of-00003.att.1.manifest"));
	catalog_step_free(&cs);
	/* So latest is step 1, and loading it fails: never an older step. */
	assert_int_equal(catalog_latest(s, "j", &cs), 0);
	assert_int_equal(cs.step, 1);
	assert_true(cs.pinned);
	catalog_step_free(&cs);
}

static void test_catalog_v2_pin(void **state)
{
	struct store_fixture *f = *state;
	struct store *s = f->s;
	struct catalog_step cs;
	put_v2(s, "j", 5, 0, 2, "a", 10);
	put_v2(s, "j", 5, 1, 2, "a", 10);
	set_manifest_time(f->dir, "j", 5, 2, "a", 2000000000);
	/* The first reader pins "a". */
	assert_int_equal(catalog_resolve_step(s, "j", 5, &cs), 0);
	assert_true(cs.pinned);
	assert_string_equal(best(&cs)->attempt, "a");
	catalog_step_free(&cs);
	char attempt[130];
	uint32_t ws;
	assert_int_equal(catalog_read_commit(s, "j", 5, attempt, sizeof(attempt), &ws), 0);
	assert_string_equal(attempt, "a");
	assert_int_equal(ws, 2);
	/* A racing attempt "0" completes the same step later, with older
	 * times even: the pin holds, for resolve and for a plain listing. */
	put_v2(s, "j", 5, 0, 2, "0", 10);
	put_v2(s, "j", 5, 1, 2, "0", 10);
	set_manifest_time(f->dir, "j", 5, 2, "0", 1000000000);
	assert_int_equal(catalog_resolve_step(s, "j", 5, &cs), 0);
	assert_string_equal(best(&cs)->attempt, "a");
	catalog_step_free(&cs);
	assert_int_equal(catalog_list_step(s, "j", 5, &cs), 0);
	assert_true(cs.pinned);
	assert_string_equal(best(&cs)->attempt, "a");
	catalog_step_free(&cs);

	/* Unpinned, the attempt that completed first wins. */
	put_v2(s, "j", 6, 0, 1, "late", 10);
	put_v2(s, "j", 6, 0, 1, "early", 10);
	set_manifest_time(f->dir, "j", 6, 1, "late", 2000000000);
	set_manifest_time(f->dir, "j", 6, 1, "early", 1900000000);
	assert_int_equal(catalog_list_step(s, "j", 6, &cs), 0);
	assert_string_equal(best(&cs)->attempt, "early");
	catalog_step_free(&cs);
	/* A commit naming an attempt that is not complete (a step being
	 * removed): not complete, whatever else the step holds. */
	struct iovec junk = { "x", 1 };
	assert_int_equal(s->ops->create(s, "j/step-000000000007/commit", &junk, 1, NULL), 0);
	put_v2(s, "j", 7, 0, 1, "a", 1);
	assert_int_equal(catalog_resolve_step(s, "j", 7, &cs), -EBADMSG);
	char path[1024];
	snprintf(path, sizeof(path), "%s/j/step-000000000007/commit", f->dir);
	assert_int_equal(unlink(path), 0);
	Ckpt__StepCommit c = CKPT__STEP_COMMIT__INIT;
	c.format_version = 1;
	c.job = "j";
	c.step = 7;
	c.attempt_id = "gone";
	c.world_size = 1;
	uint8_t buf[128];
	struct iovec civ = { buf, ckpt__step_commit__pack(&c, buf) };
	assert_int_equal(s->ops->create(s, "j/step-000000000007/commit", &civ, 1, NULL), 0);
	assert_int_equal(catalog_resolve_step(s, "j", 7, &cs), 0);
	assert_false(catalog_step_complete(&cs));
	catalog_step_free(&cs);
}

static void test_catalog_latest_list_error(void **state)
{
	struct store_fixture *f = *state;
	struct store *s = f->s;
	struct catalog_step cs;
	put_v2(s, "j", 1, 0, 1, "a", 1);
	/* A newer step that cannot be listed: an error, not step 1. */
	assert_int_equal(put_str(s, "j/step-000000000002", "a file, not a directory"), 0);
	assert_int_equal(catalog_latest(s, "j", &cs), -ENOTDIR);
}

/* The O_DIRECT offset alignment of this directory's filesystem (statx
 * DIOALIGN), or 0 when it has none. */
static size_t dir_dio_align(const char *dir)
{
	char path[128];
	snprintf(path, sizeof(path), "%s/dio-probe", dir);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	assert_true(fd >= 0);
	struct statx stx;
	size_t al = 0;
#ifdef STATX_DIOALIGN
	/* The daemon's rule; buffers here are 4096-aligned, so a larger
	 * memory alignment means nothing can go direct. */
	if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 && (stx.stx_mask & STATX_DIOALIGN) &&
	    stx.stx_dio_mem_align != 0 && stx.stx_dio_mem_align <= 4096)
		al = stx.stx_dio_offset_align;
#else
	(void)stx;
#endif
	close(fd);
	unlink(path);
	if (al == 0)
		print_message("# %s has no O_DIRECT (statx DIOALIGN): only the buffered path is tested\n", dir);
	return al;
}

static void check_object(struct store *s, const char *key, const uint8_t *want, size_t len)
{
	void *got = NULL;
	size_t glen = 0;
	assert_int_equal(s->ops->get_all(s, key, len, &got, &glen), 0);
	assert_int_equal(glen, len);
	assert_memory_equal(got, want, len);
	free(got);
}

/* Shards go to disk with O_DIRECT while buffers and offsets are aligned;
 * whatever is not (a chunk's tail, an unaligned buffer) goes buffered, and
 * the bytes are the same either way. */
static void test_put_direct_io(void **state)
{
	struct store_fixture *f = *state;
	struct store *s = f->s;
	size_t al = dir_dio_align(f->dir);
	bool dio = al != 0;
	const size_t mib = 1u << 20, tail = 12345;
	uint8_t *a = aligned_alloc(4096, mib), *b = aligned_alloc(4096, mib), *c = aligned_alloc(4096, 2 * mib);
	uint8_t *whole = malloc(3 * mib + tail);
	assert_true(a && b && c && whole);
	uint64_t seed = 5;
	tu_fill(&seed, a, mib);
	tu_fill(&seed, b, mib);
	tu_fill(&seed, c, 2 * mib);

	/* Aligned chunks and a tail: all but the tail directly. */
	struct iovec iov[3] = { { a, mib }, { b, mib }, { c, tail } };
	memcpy(whole, a, mib);
	memcpy(whole + mib, b, mib);
	memcpy(whole + 2 * mib, c, tail);
	unsigned long long before = s->direct_bytes;
	assert_int_equal(s->ops->put(s, "d/aligned", iov, 3, NULL), 0);
	check_object(s, "d/aligned", whole, 2 * mib + tail);
	assert_int_equal(s->direct_bytes - before, dio ? 2 * mib + (tail - tail % al) : 0);

	/* A first chunk whose length is not a multiple of the alignment: the
	 * file offset is unaligned after it, so the rest goes buffered. */
	struct iovec odd[2] = { { a, mib - 100 }, { b, mib } };
	memcpy(whole, a, mib - 100);
	memcpy(whole + mib - 100, b, mib);
	before = s->direct_bytes;
	assert_int_equal(s->ops->put(s, "d/odd", odd, 2, NULL), 0);
	check_object(s, "d/odd", whole, 2 * mib - 100);
	if (dio)
		assert_int_equal(s->direct_bytes - before, (mib - 100) - (mib - 100) % al);

	/* An unaligned buffer: buffered from there on. */
	struct iovec un[2] = { { a, mib }, { c + 1, mib } };
	memcpy(whole, a, mib);
	memcpy(whole + mib, c + 1, mib);
	before = s->direct_bytes;
	assert_int_equal(s->ops->put(s, "d/unaligned", un, 2, NULL), 0);
	check_object(s, "d/unaligned", whole, 2 * mib);
	assert_int_equal(s->direct_bytes - before, dio ? mib : 0);

	/* A direct write cut short (here RLIMIT_FSIZE; a full disk alike)
	 * fails the put, and no temporary file is left. */
	uint8_t *big = aligned_alloc(4096, 4 * mib);
	assert_non_null(big);
	memset(big, 'y', 4 * mib);
	struct iovec bigv = { big, 4 * mib };
	assert_int_equal(put_limited(s, "e/big", &bigv, 1, mib + 4096), -EFBIG);
	char edir[128], names[256];
	snprintf(edir, sizeof(edir), "%s/e", f->dir);
	disk_joined(edir, names, sizeof(names));
	assert_string_equal(names, "");
	free(big);

	/* Small objects (manifests) are never direct. */
	before = s->direct_bytes;
	struct iovec small = { a, 8192 };
	assert_int_equal(s->ops->put(s, "d/small", &small, 1, NULL), 0);
	check_object(s, "d/small", a, 8192);
	assert_int_equal(s->direct_bytes - before, 0);
	free(a);
	free(b);
	free(c);
	free(whole);
}

static void count_report(void *ctx, const char *what)
{
	(void)what;
	(*(int *)ctx)++;
}

/* Recovery after a crash between the manifest and the journal's end: the
 * shard its manifest names stays; a shard of an earlier try, which the
 * manifest does not name, goes. */
static void test_journal_recovery_keeps_named_shard(void **state)
{
	struct store_fixture *f = *state;
	struct store *s = f->s;
	char dir[128], err[256], man[256], used[256], stale[256];
	snprintf(dir, sizeof(dir), "%s/state", f->dir);
	assert_int_equal(mkdir(dir, 0755), 0);
	struct journal *j = NULL;
	assert_int_equal(journal_open(dir, &j, err, sizeof(err)), 0);
	assert_int_equal(manifest_key_attempt(man, sizeof(man), "jr", 3, 0, 2, "a"), 0);
	assert_int_equal(manifest_shard_key(used, sizeof(used), "jr", 3, 0, 2, "a", 0x11, false), 0);
	assert_int_equal(manifest_shard_key(stale, sizeof(stale), "jr", 3, 0, 2, "a", 0x22, false), 0);
	char bytes[64] = "shard";
	struct iovec iov = { bytes, sizeof(bytes) };
	assert_int_equal(s->ops->put(s, used, &iov, 1, NULL), 0);
	assert_int_equal(s->ops->put(s, stale, &iov, 1, NULL), 0);
	struct tm_manifest x;
	tm_init(&x, "jr", 3, 0, 2, "a");
	snprintf(x.shard, sizeof(x.shard), "%s", strrchr(used, '/') + 1);
	size_t len;
	uint8_t *buf = tm_pack(&x.m, &len);
	struct iovec mi = { buf, len };
	assert_int_equal(s->ops->put(s, man, &mi, 1, NULL), 0);
	free(buf);
	assert_int_equal(journal_begin(j, 1, stale, man, "a"), 0);
	assert_int_equal(journal_begin(j, 2, used, man, "a"), 0);
	int reported = 0;
	assert_int_equal(journal_recover(j, s, count_report, &reported), 1);
	assert_int_equal(reported, 1);
	void *got = NULL;
	size_t n = 0;
	assert_int_equal(s->ops->get_all(s, used, 1024, &got, &n), 0);
	free(got);
	assert_int_equal(s->ops->get_all(s, stale, 1024, &got, &n), -ENOENT);
	journal_close(j);
}

/* A step removal cut short (its R record and no F): the step's manifests
 * went, a shard stayed, unlisted; the next start finishes it. The same
 * for a commit's write cut short (T): its temporary goes. Compaction keeps
 * what is unfinished, and drops what is finished. (tests/crash/run found
 * the shard and the temporary that stayed for ever, seed 1.) */
static void test_journal_finishes_cut_short_removal(void **state)
{
	struct store_fixture *f = *state;
	struct store *s = f->s;
	char dir[128], err[256], shard[256], path[512];
	snprintf(dir, sizeof(dir), "%s/state", f->dir);
	assert_int_equal(mkdir(dir, 0755), 0);
	struct journal *j = NULL;
	assert_int_equal(journal_open(dir, &j, err, sizeof(err)), 0);
	assert_int_equal(manifest_shard_key(shard, sizeof(shard), "rm", 9, 1, 2, "a", 0x33, false), 0);
	assert_int_equal(put_str(s, shard, "left behind"), 0);
	snprintf(path, sizeof(path), "touch -d '-10 seconds' '%s/%s'", f->dir, shard);
	assert_int_equal(system(path), 0);
	/* The removal wrote its marker, naming the manifest, after the save
	 * and before it took the manifest (removal.c): so the shard, young as
	 * it is, is the removal's, not a save's in flight. */
	assert_int_equal(put_str(s, "rm/step-000000000009/" KEPT_NAME, "rank-00001-of-00002.a.manifest\n"), 0);
	uint64_t done, cut, commit;
	/* A commit's write cut short: its temporary (this host's) stays. */
	char host[256] = "", tmp[1024];
	if (gethostname(host, sizeof(host) - 1) != 0 || !host[0])
		snprintf(host, sizeof(host), "localhost");
	for (char *c = host; *c; c++)
		if (*c == '/' || *c == '.')
			*c = '_';
	assert_int_equal(put_str(s, "rm/step-000000000010/x", "x"), 0);
	snprintf(tmp, sizeof(tmp), "%s/rm/step-000000000010/commit.tmp.%s.77.1", f->dir, host);
	FILE *fp = fopen(tmp, "w");
	assert_non_null(fp);
	fclose(fp);
	assert_int_equal(journal_temp_begin(j, "rm/step-000000000010/commit", &commit), 0);
	assert_int_equal(journal_remove_begin(j, "rm", 8, &done), 0);
	assert_int_equal(journal_remove_end(j, done), 0);
	assert_int_equal(journal_remove_begin(j, "rm", 9, &cut), 0);
	journal_compact(j);
	snprintf(path, sizeof(path), "grep -c '^[RT] ' '%s/journal' | grep -qx 2", dir);
	assert_int_equal(system(path), 0);
	journal_close(j);
	assert_int_equal(journal_open(dir, &j, err, sizeof(err)), 0); /* the next start */
	int reported = 0;
	assert_int_equal(journal_recover(j, s, count_report, &reported), 2);
	assert_int_equal(reported, 2);
	void *got = NULL;
	size_t n = 0;
	assert_int_equal(s->ops->get_all(s, shard, 1024, &got, &n), -ENOENT);
	assert_int_not_equal(access(tmp, F_OK), 0);
	snprintf(path, sizeof(path), "test ! -s '%s/journal'", dir);
	assert_int_equal(system(path), 0);
	journal_close(j);
}

/* A last journal line the crash cut short (no newline) is not a record:
 * "R <id> rt 1" torn from "... rt 12" must not remove step 1. */
static void test_journal_torn_last_line_ignored(void **state)
{
	struct store_fixture *f = *state;
	struct store *s = f->s;
	char dir[128], err[256], shard[256], path[512];
	snprintf(dir, sizeof(dir), "%s/state", f->dir);
	assert_int_equal(mkdir(dir, 0755), 0);
	assert_int_equal(manifest_shard_key(shard, sizeof(shard), "rt", 1, 0, 1, "a", 0x44, false), 0);
	assert_int_equal(put_str(s, shard, "step 1 stays"), 0);
	snprintf(path, sizeof(path), "%s/journal", dir);
	FILE *fp = fopen(path, "w");
	assert_non_null(fp);
	fputs("R 7 rt 1", fp); /* torn: no newline */
	fclose(fp);
	struct journal *j = NULL;
	assert_int_equal(journal_open(dir, &j, err, sizeof(err)), 0);
	int reported = 0;
	assert_int_equal(journal_recover(j, s, count_report, &reported), 0);
	void *got = NULL;
	size_t n = 0;
	assert_int_equal(s->ops->get_all(s, shard, 1024, &got, &n), 0);
	free(got);
	journal_close(j);
}

/* Temporary names carry the host (docs/tiers.md "A daemon that dies"): recovery
 * removes this host's leftovers of a key and leaves another node's on the
 * same shared directory alone. */
static void test_remove_temps_only_this_hosts(void **state)
{
	struct store_fixture *f = *state;
	struct store *s = f->s;
	char host[256] = "";
	if (gethostname(host, sizeof(host) - 1) != 0 || !host[0])
		snprintf(host, sizeof(host), "localhost");
	for (char *c = host; *c; c++)
		if (*c == '/' || *c == '.')
			*c = '_';
	assert_int_equal(put_str(s, "d/x", "x"), 0);
	char mine[1024], other[1024], otherkey[1024];
	snprintf(mine, sizeof(mine), "%s/d/x.tmp.%s.123.4", f->dir, host);
	snprintf(other, sizeof(other), "%s/d/x.tmp.%s-other.123.4", f->dir, host);
	snprintf(otherkey, sizeof(otherkey), "%s/d/y.tmp.%s.123.4", f->dir, host);
	const char *paths[3] = { mine, other, otherkey };
	for (int i = 0; i < 3; i++) {
		FILE *fp = fopen(paths[i], "w");
		assert_non_null(fp);
		fclose(fp);
	}
	assert_int_equal(s->ops->remove_temps(s, "d/x"), 1);
	assert_int_not_equal(access(mine, F_OK), 0);
	assert_int_equal(access(other, F_OK), 0);    /* another node's */
	assert_int_equal(access(otherkey, F_OK), 0); /* another key's */
}

/* Issue "Security": a FIFO or a device planted as an object neither blocks
 * a reader (this test would hang) nor reads as data; the error names it. */
static void test_planted_fifo_refused(void **state)
{
	struct store_fixture *f = *state;
	struct store *s = f->s;
	assert_int_equal(put_str(s, "j/step-000000000001/rank-00000-of-00001.manifest", "m"), 0);
	char fifo[256];
	snprintf(fifo, sizeof(fifo), "%s/j/step-000000000001/rank-00001-of-00002.manifest", f->dir);
	assert_int_equal(mkfifo(fifo, 0644), 0);
	void *got = NULL;
	size_t len = 0;
	char buf[4];
	store_clear_error();
	assert_int_equal(s->ops->get_all(s, "j/step-000000000001/rank-00001-of-00002.manifest", 1024, &got, &len),
			 -EINVAL);
	assert_non_null(strstr(store_error(-EINVAL), "rank-00001-of-00002.manifest is not a regular file"));
	assert_int_equal(s->ops->get_range(s, "j/step-000000000001/rank-00001-of-00002.manifest", 0, buf, 1), -EINVAL);
	assert_int_equal(s->ops->get_all(s, "j/step-000000000001/rank-00000-of-00001.manifest", 1024, &got, &len), 0);
	free(got);
	/* A directory where an object should be is refused the same way. */
	assert_int_equal(s->ops->get_all(s, "j/step-000000000001", 1024, &got, &len), -EINVAL);
}

/* Count the files in dir (not recursive). */
static int count_files(const char *dir)
{
	int n = 0;
	DIR *d = opendir(dir);
	assert_non_null(d);
	for (struct dirent *e; (e = readdir(d)) != NULL;)
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

/* Issue "Security": a step directory replaced by a symbolic link leads no
 * delete, write or read outside the store; a link as an object is removed
 * as a name (its target stays) and never read through. */
static void test_symlinks_never_followed(void **state)
{
	struct store_fixture *f = *state;
	struct store *s = f->s;
	char outside[128], step[256], path[300];
	snprintf(outside, sizeof(outside), "%s-outside", f->dir);
	assert_int_equal(mkdir(outside, 0700), 0);
	snprintf(path, sizeof(path), "%s/rank-00000-of-00001.manifest", outside);
	FILE *fp = fopen(path, "w");
	assert_non_null(fp);
	fputs("precious", fp);
	fclose(fp);
	assert_int_equal(put_str(s, "j/step-000000000002/rank-00000-of-00001.manifest", "m"), 0);
	snprintf(step, sizeof(step), "%s/j/step-000000000001", f->dir);
	assert_int_equal(symlink(outside, step), 0);

	store_clear_error();
	int r = catalog_delete_step(s, NULL, "j", 1, CATALOG_REMOVE, 0);
	assert_true(r == -ELOOP || r == -ENOTDIR);
	assert_non_null(strstr(store_error(r), "symbolic link"));
	assert_int_equal(count_files(outside), 1);
	assert_int_equal(put_str(s, "j/step-000000000001/rank-00000-of-00001.shard", "x"), r);
	assert_int_equal(count_files(outside), 1);
	void *got = NULL;
	size_t len = 0;
	assert_int_equal(s->ops->get_all(s, "j/step-000000000001/rank-00000-of-00001.manifest", 64, &got, &len), r);
	char **names = NULL;
	size_t n = 0;
	assert_int_equal(s->ops->list(s, "j/step-000000000001", &names, &n), r);
	assert_int_equal(s->ops->remove_temps(s, "j/step-000000000001/x"), r);

	/* A link as an object: not read through; removing it removes the link. */
	char link[300];
	snprintf(link, sizeof(link), "%s/j/step-000000000002/rank-00000-of-00002.manifest", f->dir);
	assert_int_equal(symlink(path, link), 0);
	assert_int_equal(s->ops->get_all(s, "j/step-000000000002/rank-00000-of-00002.manifest", 64, &got, &len),
			 -ELOOP);
	assert_int_equal(catalog_delete_step(s, NULL, "j", 2, CATALOG_REMOVE, 0), 0);
	assert_int_equal(access(link, F_OK), -1);
	assert_int_equal(count_files(outside), 1);
	assert_int_equal(unlink(path), 0);
	assert_int_equal(rmdir(outside), 0);
}

/* Issue "Security": checkpoint files are not readable by others whatever
 * the umask, and [storage] file_mode sets the mode exactly. */
static void test_file_mode(void **state)
{
	struct store_fixture *f = *state;
	struct store *s = f->s;
	mode_t old = umask(0);
	struct stat st;
	char path[256];
	assert_int_equal(s->file_mode, 0600);
	assert_int_equal(put_str(s, "a/step-000000000001/x", "x"), 0);
	snprintf(path, sizeof(path), "%s/a/step-000000000001/x", f->dir);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0600);
	snprintf(path, sizeof(path), "%s/a/step-000000000001", f->dir);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0700);
	s->file_mode = 0640;
	umask(077); /* stricter than the config: the config wins */
	assert_int_equal(put_str(s, "b/y", "y"), 0);
	snprintf(path, sizeof(path), "%s/b/y", f->dir);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0640);
	snprintf(path, sizeof(path), "%s/b", f->dir);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0750);
	umask(old);
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, sf_setup, sf_teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_put_get),
		T(test_put_direct_io),
		T(test_get_all_limits),
		T(test_list),
		T(test_put_leaves_no_temp_and_replaces),
		T(test_failed_put_cleans_up),
		T(test_bad_keys),
		T(test_open_urls),
		T(test_catalog_scan),
		T(test_catalog_steps_latest_jobs),
		T(test_catalog_v2_from_listing),
		T(test_catalog_v2_pin),
		T(test_catalog_latest_list_error),
		T(test_catalog_no_complete_step),
		T(test_journal_recovery_keeps_named_shard),
		T(test_journal_finishes_cut_short_removal),
		T(test_journal_torn_last_line_ignored),
		T(test_remove_temps_only_this_hosts),
		T(test_planted_fifo_refused),
		T(test_symlinks_never_followed),
		T(test_file_mode),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
