/* Removing a step (removal.c catalog_delete_step) on file://, where a
 * file's mtime is its object's LastModified: what a removal takes, and what
 * it leaves because a save of the same step may be writing it on another
 * node (docs/architecture.md "References between steps", the bullet "What a
 * removal leaves"). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include "backends.h"
#include "catalog.h"
#include "manifest.h"
#include "store.h"

struct fixture {
	char dir[64];
	struct store *s;
};

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path);
}

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	if (f == NULL)
		return -1;
	snprintf(f->dir, sizeof(f->dir), "/tmp/ckptd-removal-XXXXXX");
	if (mkdtemp(f->dir) == NULL)
		return -1;
	char url[128], err[256];
	snprintf(url, sizeof(url), "file://%s", f->dir);
	if (store_open(url, &f->s, err, sizeof(err)) != 0)
		return -1;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	store_free(f->s);
	nftw(f->dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	free(f);
	return 0;
}

static void put(struct fixture *f, const char *key, const char *text)
{
	struct iovec iov = { .iov_base = (void *)text, .iov_len = strlen(text) };
	assert_int_equal(f->s->ops->put(f->s, key, &iov, 1, NULL), 0);
}

/* Make key's object two hours old, past CATALOG_SPARE_S. */
static void age(struct fixture *f, const char *key)
{
	char path[600];
	snprintf(path, sizeof(path), "%s/%s", f->dir, key);
	struct timespec t[2];
	clock_gettime(CLOCK_REALTIME, &t[0]);
	t[0].tv_sec -= 2 * (time_t)CATALOG_SPARE_S;
	t[1] = t[0];
	assert_int_equal(utimensat(AT_FDCWD, path, t, AT_SYMLINK_NOFOLLOW), 0);
}

static bool there(struct fixture *f, const char *key)
{
	char path[600];
	snprintf(path, sizeof(path), "%s/%s", f->dir, key);
	return access(path, F_OK) == 0;
}

/* Names of one step's objects, for attempt a (done long ago) and attempt
 * b (a save of the same step in flight elsewhere: shard and refs, no
 * manifest yet). */
struct step_keys {
	char man_a[300], shard_a[300], ref_a[300], shard_b[300], ref_b[300];
};

static void keys(struct step_keys *k, uint64_t step, bool spread)
{
	assert_int_equal(manifest_key(k->man_a, sizeof(k->man_a), "j", step, 0, 1, "a.manifest"), 0);
	assert_int_equal(manifest_shard_key(k->shard_a, sizeof(k->shard_a), "j", step, 0, 1, "a", 0x11, spread), 0);
	assert_int_equal(manifest_shard_key(k->shard_b, sizeof(k->shard_b), "j", step, 0, 1, "b", 0x22, spread), 0);
	assert_int_equal(manifest_ref_key(k->ref_a, sizeof(k->ref_a), "j", step, step - 1, 0, 1, "a"), 0);
	assert_int_equal(manifest_ref_key(k->ref_b, sizeof(k->ref_b), "j", step, step - 1, 0, 1, "b"), 0);
}

static void old_a_and_young_b(struct fixture *f, const struct step_keys *k)
{
	put(f, k->man_a, "m");
	put(f, k->shard_a, "a");
	put(f, k->ref_a, "");
	put(f, k->shard_b, "b");
	put(f, k->ref_b, "");
	age(f, k->man_a);
	age(f, k->shard_a);
	age(f, k->ref_a);
}

/* Attempt a goes; b, younger than CATALOG_SPARE_S with no manifest, stays
 * (shard and refs), named by the error, and the step is marked for a
 * later removal, which takes b once it is old. */
static void test_leaves_a_save_in_flight(void **state)
{
	struct fixture *f = *state;
	struct step_keys k;
	keys(&k, 5, false);
	old_a_and_young_b(f, &k);
	store_clear_error();
	int r = catalog_delete_step(f->s, NULL, "j", 5, false);
	assert_int_equal(r, -EBUSY);
	assert_non_null(strstr(store_error(r), "attempt 'b' of step 5"));
	assert_false(there(f, k.man_a));
	assert_false(there(f, k.shard_a));
	assert_false(there(f, k.ref_a));
	assert_true(there(f, k.shard_b));
	assert_true(there(f, k.ref_b));
	assert_true(catalog_step_kept(f->s, "j", 5));

	/* Still young: nothing more goes. */
	assert_int_equal(catalog_delete_step(f->s, NULL, "j", 5, false), -EBUSY);
	assert_true(there(f, k.shard_b));

	/* The save died: once its objects are old, the next removal takes
	 * them, its marker and the directories. */
	age(f, k.shard_b);
	age(f, k.ref_b);
	assert_int_equal(catalog_delete_step(f->s, NULL, "j", 5, false), 0);
	assert_false(there(f, k.shard_b));
	assert_false(there(f, k.ref_b));
	assert_false(there(f, "j/step-000000000005"));
	assert_false(there(f, "j/refs/step-000000000005"));
}

/* A young object of b anywhere (its refs only, here) keeps all of b. */
static void test_young_refs_keep_an_old_shard(void **state)
{
	struct fixture *f = *state;
	struct step_keys k;
	keys(&k, 5, false);
	old_a_and_young_b(f, &k);
	age(f, k.shard_b);
	assert_int_equal(catalog_delete_step(f->s, NULL, "j", 5, false), -EBUSY);
	assert_true(there(f, k.shard_b));
	assert_true(there(f, k.ref_b));
}

/* force (ckptctl rm --force) takes every attempt at once. */
static void test_force_takes_everything(void **state)
{
	struct fixture *f = *state;
	struct step_keys k;
	keys(&k, 5, false);
	old_a_and_young_b(f, &k);
	assert_int_equal(catalog_delete_step(f->s, NULL, "j", 5, true), 0);
	assert_false(there(f, k.shard_b));
	assert_false(there(f, k.ref_b));
	assert_false(there(f, "j/step-000000000005"));
}

/* Every object old, no manifest (a save that died): all of it goes, and
 * nothing is left marked. */
static void test_old_leftovers_go(void **state)
{
	struct fixture *f = *state;
	struct step_keys k;
	keys(&k, 5, false);
	old_a_and_young_b(f, &k);
	age(f, k.shard_b);
	age(f, k.ref_b);
	assert_int_equal(catalog_delete_step(f->s, NULL, "j", 5, false), 0);
	assert_false(there(f, "j/step-000000000005"));
	assert_false(there(f, "j/refs/step-000000000005"));
}

/* A removal cut short after its marker and its manifests: the marker
 * names attempt a, so a's young shard goes too (it is the removal's),
 * while b's stays. */
static void test_marker_names_what_a_cut_short_removal_takes(void **state)
{
	struct fixture *f = *state;
	struct step_keys k;
	keys(&k, 5, false);
	put(f, k.shard_a, "a");
	put(f, k.shard_b, "b");
	char kept[300], body[400];
	snprintf(kept, sizeof(kept), "j/step-000000000005/" KEPT_NAME);
	snprintf(body, sizeof(body), "%s\n", strrchr(k.man_a, '/') + 1);
	put(f, kept, body);
	assert_int_equal(catalog_delete_step(f->s, NULL, "j", 5, false), -EBUSY);
	assert_false(there(f, k.shard_a));
	assert_true(there(f, k.shard_b));
	assert_true(there(f, kept));
}

/* The removal writes its marker before the first manifest goes, naming
 * them all, and takes it away last once nothing is left. */
static void test_marker_written_first_and_removed_last(void **state)
{
	struct fixture *f = *state;
	struct step_keys k;
	keys(&k, 5, false);
	put(f, k.man_a, "m");
	put(f, k.shard_a, "a");
	/* The manifest cannot be removed (a directory in its place on
	 * file:// fails the DELETE): the removal stops after its marker. */
	char man_c[300], path[600];
	assert_int_equal(manifest_key(man_c, sizeof(man_c), "j", 5, 0, 1, "c.manifest"), 0);
	snprintf(path, sizeof(path), "%s/%s", f->dir, man_c);
	assert_int_equal(mkdir(path, 0755), 0);
	char sub[700];
	snprintf(sub, sizeof(sub), "%s/x", path);
	assert_int_equal(close(open(sub, O_CREAT | O_WRONLY, 0600)), 0);
	assert_true(catalog_delete_step(f->s, NULL, "j", 5, false) < 0);
	void *got = NULL;
	size_t len = 0;
	assert_int_equal(f->s->ops->get_all(f->s, "j/step-000000000005/" KEPT_NAME, 4096, &got, &len), 0);
	assert_non_null(memmem(got, len, "rank-00000-of-00001.a.manifest\n", 31));
	assert_non_null(memmem(got, len, "rank-00000-of-00001.c.manifest\n", 31));
	free(got);
	assert_true(there(f, k.shard_a)); /* no shard goes while a manifest stays */
	/* Once it can go: everything does, the marker last. */
	assert_int_equal(unlink(sub), 0);
	assert_int_equal(rmdir(path), 0);
	assert_int_equal(catalog_delete_step(f->s, NULL, "j", 5, false), 0);
	assert_false(there(f, "j/step-000000000005"));
}

/* Layout spread: a's shard lives in a spread directory beside b's young
 * one; the removal finds a's through its manifest and leaves b's. */
static void test_spread_shard_in_flight_stays(void **state)
{
	struct fixture *f = *state;
	struct step_keys k;
	keys(&k, 5, true);
	old_a_and_young_b(f, &k);
	assert_int_equal(catalog_delete_step(f->s, NULL, "j", 5, false), -EBUSY);
	assert_false(there(f, k.shard_a));
	assert_true(there(f, k.shard_b));
	age(f, k.shard_b);
	age(f, k.ref_b);
	assert_int_equal(catalog_delete_step(f->s, NULL, "j", 5, false), 0);
	assert_false(there(f, k.shard_b));
}

/* No step directory (a spread save's shards are elsewhere): its young
 * refs stay, old ones go. */
static void test_refs_without_a_directory(void **state)
{
	struct fixture *f = *state;
	struct step_keys k;
	keys(&k, 5, false);
	put(f, k.ref_a, "");
	put(f, k.ref_b, "");
	age(f, k.ref_a);
	assert_int_equal(catalog_delete_step(f->s, NULL, "j", 5, false), -EBUSY);
	assert_false(there(f, k.ref_a));
	assert_true(there(f, k.ref_b));
	age(f, k.ref_b);
	assert_int_equal(catalog_delete_step(f->s, NULL, "j", 5, false), -ENOENT);
	assert_false(there(f, "j/refs/step-000000000005"));
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
	const struct CMUnitTest tests[] = {
		T(test_leaves_a_save_in_flight),
		T(test_young_refs_keep_an_old_shard),
		T(test_force_takes_everything),
		T(test_old_leftovers_go),
		T(test_marker_names_what_a_cut_short_removal_takes),
		T(test_marker_written_first_and_removed_last),
		T(test_spread_shard_in_flight_stays),
		T(test_refs_without_a_directory),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
