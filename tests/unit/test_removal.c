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
#include "storefix.h"
#include "ckpt.pb-c.h"

static void put(struct store_fixture *f, const char *key, const char *text)
{
	struct iovec iov = { .iov_base = (void *)text, .iov_len = strlen(text) };
	assert_int_equal(f->s->ops->put(f->s, key, &iov, 1, NULL), 0);
}

/* Make key's object two hours old, past CATALOG_SPARE_S. */
static void age(struct store_fixture *f, const char *key)
{
	char path[600];
	snprintf(path, sizeof(path), "%s/%s", f->dir, key);
	struct timespec t[2];
	clock_gettime(CLOCK_REALTIME, &t[0]);
	t[0].tv_sec -= 2 * (time_t)CATALOG_SPARE_S;
	t[1] = t[0];
	assert_int_equal(utimensat(AT_FDCWD, path, t, AT_SYMLINK_NOFOLLOW), 0);
}

/* Make key's object seconds old: older than a marker written now (a
 * marker's decision covers what is more than a second older). */
static void back(struct store_fixture *f, const char *key, int seconds)
{
	char path[600];
	snprintf(path, sizeof(path), "%s/%s", f->dir, key);
	struct timespec t[2];
	clock_gettime(CLOCK_REALTIME, &t[0]);
	t[0].tv_sec -= seconds;
	t[1] = t[0];
	assert_int_equal(utimensat(AT_FDCWD, path, t, AT_SYMLINK_NOFOLLOW), 0);
}

static bool there(struct store_fixture *f, const char *key)
{
	char path[600];
	snprintf(path, sizeof(path), "%s/%s", f->dir, key);
	return access(path, F_OK) == 0;
}

/* Only DEAD_NAME markers (b's among them) are left of step 5: its save
 * was judged dead. Once they are older than twice the window, the next
 * removal takes them and the directory. */
static void only_dead_b_then_gone(struct store_fixture *f)
{
	char cmd[800];
	snprintf(cmd, sizeof(cmd), "cd '%s/j/step-000000000005' && test -z \"$(ls -A | grep -v '^" DEAD_NAME "\\.')\"",
		 f->dir);
	assert_int_equal(system(cmd), 0);
	assert_int_equal(catalog_delete_step(f->s, NULL, "j", 5, CATALOG_FINISH, 0), 0);
	assert_true(there(f, "j/step-000000000005/" DEAD_NAME ".b")); /* young: it stays */
	snprintf(cmd, sizeof(cmd), "touch -d '-3 hours' '%s/j/step-000000000005/'" DEAD_NAME ".*", f->dir);
	assert_int_equal(system(cmd), 0);
	assert_int_equal(catalog_delete_step(f->s, NULL, "j", 5, CATALOG_FINISH, 0), 0);
	assert_false(there(f, "j/step-000000000005"));
}

/* Names of one step's objects: attempt a (world size 1) and attempt b
 * (world size 2), each with a manifest, a shard and a ref per rank. */
struct step_keys {
	char man_a[300], shard_a[300], ref_a[300];
	char man_b[2][300], shard_b[2][300], ref_b[2][300];
};

static void keys(struct step_keys *k, uint64_t step, bool spread)
{
	assert_int_equal(manifest_key(k->man_a, sizeof(k->man_a), "j", step, 0, 1, "a.manifest"), 0);
	assert_int_equal(manifest_shard_key(k->shard_a, sizeof(k->shard_a), "j", step, 0, 1, "a", 0x11, spread), 0);
	assert_int_equal(manifest_ref_key(k->ref_a, sizeof(k->ref_a), "j", step, step - 1, 0, 1, "a"), 0);
	for (uint32_t r = 0; r < 2; r++) {
		assert_int_equal(manifest_key(k->man_b[r], sizeof(k->man_b[r]), "j", step, r, 2, "b.manifest"), 0);
		assert_int_equal(manifest_shard_key(k->shard_b[r], sizeof(k->shard_b[r]), "j", step, r, 2, "b",
						    0x22 + r, spread),
				 0);
		assert_int_equal(manifest_ref_key(k->ref_b[r], sizeof(k->ref_b[r]), "j", step, step - 1, r, 2, "b"), 0);
	}
}

/* Attempt a complete and two hours old; attempt b in flight: rank 0's
 * ref, shard and (with b_manifest) manifest, rank 1's ref and shard, no
 * manifest of rank 1 yet. */
static void a_done_b_in_flight(struct store_fixture *f, const struct step_keys *k, bool b_manifest)
{
	put(f, k->man_a, "m");
	put(f, k->shard_a, "a");
	put(f, k->ref_a, "");
	age(f, k->man_a);
	age(f, k->shard_a);
	age(f, k->ref_a);
	for (uint32_t r = 0; r < 2; r++) {
		put(f, k->ref_b[r], "");
		put(f, k->shard_b[r], "b");
	}
	if (b_manifest)
		put(f, k->man_b[0], "m");
}

static void age_b(struct store_fixture *f, const struct step_keys *k)
{
	for (uint32_t r = 0; r < 2; r++) {
		age(f, k->ref_b[r]);
		age(f, k->shard_b[r]);
		if (there(f, k->man_b[r]))
			age(f, k->man_b[r]);
	}
}

static int del(struct store_fixture *f, enum catalog_removal_mode mode)
{
	store_clear_error();
	return catalog_delete_step(f->s, NULL, "j", 5, mode, 0);
}

/* Attempt a goes; b, incomplete with objects younger than the window,
 * stays (shards, refs, and the manifest rank 0 wrote already), named by
 * the error, and the step is marked; once b is old (its save died), the
 * removal that finishes the step takes it. */
static void test_leaves_a_save_in_flight(void **state)
{
	struct store_fixture *f = *state;
	struct step_keys k;
	keys(&k, 5, false);
	a_done_b_in_flight(f, &k, true);
	int r = del(f, CATALOG_REMOVE);
	assert_int_equal(r, -EBUSY);
	assert_non_null(strstr(store_error(r), "attempt 'b' of step 5"));
	assert_false(there(f, k.man_a));
	assert_false(there(f, k.shard_a));
	assert_false(there(f, k.ref_a));
	assert_false(there(f, "j/step-000000000005/" KEPT_NAME ".a")); /* done with a */
	for (uint32_t i = 0; i < 2; i++) {
		assert_true(there(f, k.shard_b[i]));
		assert_true(there(f, k.ref_b[i]));
	}
	assert_true(there(f, k.man_b[0]));
	assert_true(catalog_step_kept(f->s, "j", 5));

	/* Still young: nothing more goes. */
	assert_int_equal(del(f, CATALOG_FINISH), -EBUSY);
	assert_true(there(f, k.shard_b[1]));

	age_b(f, &k);
	assert_int_equal(del(f, CATALOG_FINISH), 0);
	assert_false(there(f, k.man_b[0]));
	assert_false(there(f, k.shard_b[1]));
	assert_false(there(f, k.ref_b[1]));
	assert_false(there(f, "j/refs/step-000000000005"));
	only_dead_b_then_gone(f);
}

/* A removal finishing an earlier one takes what the marker names and
 * never a complete attempt no removal decided on (b completed after the
 * first removal left it); a new removal (retention, rm) does take it. */
static void test_finish_never_takes_a_complete_attempt(void **state)
{
	struct store_fixture *f = *state;
	struct step_keys k;
	keys(&k, 5, false);
	a_done_b_in_flight(f, &k, true);
	assert_int_equal(del(f, CATALOG_REMOVE), -EBUSY);
	put(f, k.man_b[1], "m"); /* b completes */
	assert_int_equal(del(f, CATALOG_FINISH), 0);
	for (uint32_t i = 0; i < 2; i++) {
		assert_true(there(f, k.man_b[i]));
		assert_true(there(f, k.shard_b[i]));
		assert_true(there(f, k.ref_b[i]));
	}
	assert_int_equal(del(f, CATALOG_REMOVE), 0);
	assert_false(there(f, "j/step-000000000005"));
	assert_false(there(f, "j/refs/step-000000000005"));
}

/* A young object of b anywhere (its refs only, here) keeps all of b. */
static void test_young_refs_keep_an_old_shard(void **state)
{
	struct store_fixture *f = *state;
	struct step_keys k;
	keys(&k, 5, false);
	a_done_b_in_flight(f, &k, false);
	for (uint32_t r = 0; r < 2; r++)
		age(f, k.shard_b[r]);
	assert_int_equal(del(f, CATALOG_REMOVE), -EBUSY);
	assert_true(there(f, k.shard_b[0]));
	assert_true(there(f, k.ref_b[0]));
}

/* The in-flight window is the job's (incomplete_grace), when given. */
static void test_window_is_the_callers(void **state)
{
	struct store_fixture *f = *state;
	struct step_keys k;
	keys(&k, 5, false);
	a_done_b_in_flight(f, &k, false);
	sleep(2);
	assert_int_equal(catalog_delete_step(f->s, NULL, "j", 5, CATALOG_REMOVE, 1), 0);
	for (uint32_t i = 0; i < 2; i++)
		assert_false(there(f, k.shard_b[i]));
	assert_true(there(f, "j/step-000000000005/" DEAD_NAME ".b"));
	sleep(2); /* twice the window */
	assert_int_equal(catalog_delete_step(f->s, NULL, "j", 5, CATALOG_REMOVE, 1), 0);
	assert_false(there(f, "j/step-000000000005"));
}

/* CATALOG_FORCE (ckptctl rm --force) takes every attempt at once. */
static void test_force_takes_everything(void **state)
{
	struct store_fixture *f = *state;
	struct step_keys k;
	keys(&k, 5, false);
	a_done_b_in_flight(f, &k, true);
	assert_int_equal(del(f, CATALOG_FORCE), 0);
	assert_false(there(f, "j/step-000000000005"));
	assert_false(there(f, "j/refs/step-000000000005"));
}

/* Every object of an incomplete attempt old (a save that died): it goes,
 * and nothing is left marked. */
static void test_old_leftovers_go(void **state)
{
	struct store_fixture *f = *state;
	struct step_keys k;
	keys(&k, 5, false);
	a_done_b_in_flight(f, &k, true);
	age_b(f, &k);
	assert_int_equal(del(f, CATALOG_REMOVE), 0);
	assert_false(there(f, "j/refs/step-000000000005"));
	only_dead_b_then_gone(f);
}

/* A removal cut short after it marked attempt a and took a's manifest:
 * the marker says a is the removal's, so a's young shard goes too, while
 * b's stays. An older ckptd's marker (KEPT_NAME naming a's manifest)
 * does the same; a line of it that is no manifest's name is ignored. */
static void test_marker_names_what_a_cut_short_removal_takes(void **state)
{
	struct store_fixture *f = *state;
	for (int legacy = 0; legacy < 2; legacy++) {
		struct step_keys k;
		keys(&k, 5, false);
		put(f, k.shard_a, "a");
		back(f, k.shard_a, 10);
		put(f, k.shard_b[0], "b");
		put(f, "j/step-000000000005/x", "not a marker's to name");
		char body[400];
		snprintf(body, sizeof(body), "%s\nx\n../../x\n", strrchr(k.man_a, '/') + 1);
		put(f, legacy ? "j/step-000000000005/" KEPT_NAME : "j/step-000000000005/" KEPT_NAME ".a",
		    legacy ? body : "");
		assert_int_equal(del(f, CATALOG_FINISH), -EBUSY);
		assert_false(there(f, k.shard_a));
		assert_true(there(f, k.shard_b[0]));
		assert_true(there(f, "j/step-000000000005/x"));
		assert_false(there(f, "j/step-000000000005/" KEPT_NAME ".a"));
		assert_true(there(f, "j/step-000000000005/" LEFT_NAME));
		assert_int_equal(del(f, CATALOG_FORCE), 0);
		assert_false(there(f, "j/step-000000000005"));
	}
}

/* A step saved again under the same attempt after a removal of it was cut
 * short: the marker's decision covers what was there then, not the new
 * save's objects (written after it), which are decided on as any other. */
static void test_marker_covers_only_what_came_before(void **state)
{
	struct store_fixture *f = *state;
	struct step_keys k;
	keys(&k, 5, false);
	put(f, "j/step-000000000005/" KEPT_NAME ".b", "");
	age(f, "j/step-000000000005/" KEPT_NAME ".b");
	put(f, k.shard_b[0], "b"); /* the new save's, young */
	put(f, k.ref_b[0], "");
	assert_int_equal(del(f, CATALOG_FINISH), -EBUSY);
	assert_true(there(f, k.shard_b[0]));
	assert_true(there(f, k.ref_b[0]));
	/* Objects older than the marker are the removal's: taken, with no
	 * marker of a dead save. */
	char cmd[900];
	snprintf(cmd, sizeof(cmd), "touch -d '-3 hours' '%s/%s' '%s/%s'", f->dir, k.shard_b[0], f->dir, k.ref_b[0]);
	assert_int_equal(system(cmd), 0);
	assert_int_equal(del(f, CATALOG_FINISH), 0);
	assert_false(there(f, k.shard_b[0]));
	assert_false(there(f, "j/step-000000000005/" DEAD_NAME ".b"));
	assert_false(there(f, "j/step-000000000005"));
}

/* An old DEAD_NAME marker of an attempt with objects listed stays: a
 * removal running beside this one may have just written it anew and rely
 * on it (drop_dead takes only markers of attempts with nothing else). */
static void test_dead_marker_of_a_live_attempt_stays(void **state)
{
	struct store_fixture *f = *state;
	struct step_keys k;
	keys(&k, 5, false);
	a_done_b_in_flight(f, &k, false);
	put(f, "j/step-000000000005/" DEAD_NAME ".b", "1");
	back(f, "j/step-000000000005/" DEAD_NAME ".b", 3 * (int)CATALOG_SPARE_S);
	assert_int_equal(del(f, CATALOG_REMOVE), -EBUSY); /* b is young: left */
	assert_true(there(f, "j/step-000000000005/" DEAD_NAME ".b"));
	assert_true(there(f, k.shard_b[0]));
}

/* The order of a removal's writes, from a store that logs them. */
static const struct store_ops *real_ops;
static char oplog[64][320];
static size_t nops;

/* A list names its whole prefix, a write its object's name. */
static void log_op(const char *op, const char *key)
{
	const char *name = strcmp(op, "list") == 0 ? NULL : strrchr(key, '/');
	if (nops < 64)
		snprintf(oplog[nops++], sizeof(oplog[0]), "%s %s", op, name ? name + 1 : key);
}

/* Run once when the removal creates a key ending so (a save's write
 * landing between the removal's listings). */
static const char *inject_on;
static void (*inject)(struct store *s);

static int w_create(struct store *s, const char *key, const struct iovec *iov, size_t n, const uint32_t *crcs)
{
	log_op("create", key);
	int r = real_ops->create(s, key, iov, n, crcs);
	size_t kl = strlen(key), il = inject_on ? strlen(inject_on) : 0;
	if (inject_on && kl >= il && strcmp(key + kl - il, inject_on) == 0) {
		inject_on = NULL;
		inject(s);
	}
	return r;
}

static int w_put(struct store *s, const char *key, const struct iovec *iov, size_t n, const uint32_t *crcs)
{
	log_op("put", key);
	int r = real_ops->put(s, key, iov, n, crcs);
	size_t kl = strlen(key), il = inject_on ? strlen(inject_on) : 0;
	if (inject_on && kl >= il && strcmp(key + kl - il, inject_on) == 0) {
		inject_on = NULL;
		inject(s);
	}
	return r;
}

static int w_list_entries(struct store *s, const char *prefix, struct store_entry **out, size_t *n)
{
	log_op("list", prefix);
	return real_ops->list_entries(s, prefix, out, n);
}

static int w_remove(struct store *s, const char *key)
{
	log_op("remove", key);
	return real_ops->remove(s, key);
}

static size_t op_at(const char *what)
{
	for (size_t i = 0; i < nops; i++)
		if (strcmp(oplog[i], what) == 0)
			return i;
	fail_msg("no '%s' in the removal's writes", what);
	return 0;
}

static void logging(struct store_fixture *f, bool on)
{
	static struct store_ops logged;
	if (on) {
		real_ops = f->s->ops;
		logged = *real_ops;
		logged.create = w_create;
		logged.put = w_put;
		logged.remove = w_remove;
		logged.list_entries = w_list_entries;
		f->s->ops = &logged;
		nops = 0;
	} else {
		f->s->ops = real_ops;
	}
}

static size_t op_at_first(const char *prefix)
{
	for (size_t i = 0; i < nops; i++)
		if (strncmp(oplog[i], prefix, strlen(prefix)) == 0)
			return i;
	fail_msg("no '%s' in the removal's writes", prefix);
	return 0;
}

static size_t ops_like(const char *prefix)
{
	size_t k = 0;
	for (size_t i = 0; i < nops; i++)
		k += strncmp(oplog[i], prefix, strlen(prefix)) == 0;
	return k;
}

/* The marker is written before the first object goes and removed after
 * the last; a removal stopped by a manifest that cannot go leaves it,
 * naming the spread shard. */
static void test_marker_written_first_and_removed_last(void **state)
{
	struct store_fixture *f = *state;
	struct step_keys k;
	keys(&k, 5, false);
	put(f, k.man_a, "m");
	put(f, k.shard_a, "a");
	put(f, k.ref_a, "");
	logging(f, true);
	int r = del(f, CATALOG_REMOVE);
	logging(f, false);
	assert_int_equal(r, 0);
	size_t mark = op_at("create " KEPT_NAME ".a"), unmark = op_at("remove " KEPT_NAME ".a");
	assert_int_equal(ops_like("list j/shards"), 0); /* no spread directory: none of its manifests is there */
	assert_true(mark < op_at("remove rank-00000-of-00001.a.manifest"));
	assert_true(unmark > op_at("remove rank-00000-of-00001.a.0000000000000011.shard"));
	assert_true(unmark > op_at("remove rank-00000-of-00001.a"));
	assert_true(mark < op_at_first("remove"));
	assert_int_equal(unmark, nops - 1);

	/* Spread: a manifest that cannot go (a directory in its place fails
	 * the DELETE on file://) stops the removal after its marker, which
	 * names the manifest whose shard is in a spread directory. */
	keys(&k, 6, true);
	char man[300], path[600], sub[700];
	assert_int_equal(manifest_key(man, sizeof(man), "j", 6, 0, 1, "a.manifest"), 0);
	assert_int_equal(manifest_shard_key(k.shard_a, sizeof(k.shard_a), "j", 6, 0, 1, "a", 0x11, true), 0);
	put(f, k.shard_a, "a");
	back(f, k.shard_a, 10);
	snprintf(path, sizeof(path), "%s/j/step-000000000006", f->dir);
	assert_int_equal(mkdir(path, 0755), 0);
	snprintf(path, sizeof(path), "%s/%s", f->dir, man);
	assert_int_equal(mkdir(path, 0755), 0);
	snprintf(sub, sizeof(sub), "%s/x", path);
	assert_int_equal(close(open(sub, O_CREAT | O_WRONLY, 0600)), 0);
	assert_true(catalog_delete_step(f->s, NULL, "j", 6, CATALOG_REMOVE, 0) < 0);
	void *got = NULL;
	size_t len = 0;
	assert_int_equal(f->s->ops->get_all(f->s, "j/step-000000000006/" KEPT_NAME ".a", 4096, &got, &len), 0);
	assert_int_equal(len, 31);
	assert_memory_equal(got, "rank-00000-of-00001.a.manifest\n", 31);
	free(got);
	assert_true(there(f, k.shard_a)); /* no shard goes while a manifest stays */
	assert_int_equal(unlink(sub), 0);
	assert_int_equal(rmdir(path), 0);
	/* Finished as it was meant: the marker takes a's spread shard. */
	assert_int_equal(catalog_delete_step(f->s, NULL, "j", 6, CATALOG_FINISH, 0), 0);
	assert_false(there(f, k.shard_a));
	assert_false(there(f, "j/step-000000000006"));
}

/* Layout spread: a's shard lives in a spread directory beside b's young
 * one; the removal finds a's through its manifest and leaves b's. */
static void test_spread_shard_in_flight_stays(void **state)
{
	struct store_fixture *f = *state;
	struct step_keys k;
	keys(&k, 5, true);
	a_done_b_in_flight(f, &k, false);
	assert_int_equal(del(f, CATALOG_REMOVE), -EBUSY);
	assert_false(there(f, k.shard_a));
	assert_true(there(f, k.shard_b[0]));
	age_b(f, &k);
	assert_int_equal(del(f, CATALOG_FINISH), 0);
	assert_false(there(f, k.shard_b[0]));
}

/* No step directory (a spread save's shards are elsewhere): its young
 * refs stay, and the step is marked for a later removal; old ones go. */
static void test_refs_without_a_directory(void **state)
{
	struct store_fixture *f = *state;
	struct step_keys k;
	keys(&k, 5, false);
	put(f, k.ref_a, "");
	put(f, k.ref_b[0], "");
	age(f, k.ref_a);
	assert_int_equal(del(f, CATALOG_REMOVE), -EBUSY);
	assert_false(there(f, k.ref_a));
	assert_true(there(f, k.ref_b[0]));
	assert_true(catalog_step_kept(f->s, "j", 5));
	age(f, k.ref_b[0]);
	assert_int_equal(del(f, CATALOG_FINISH), 0);
	assert_false(there(f, "j/refs/step-000000000005"));
	only_dead_b_then_gone(f);
}

/* The handshake with a slow save: attempt b, judged dead for its age
 * (its shard is old, its refs too), writes its manifest between the
 * removal's listing and its marker. The listing after the marker sees it:
 * b is left whole, its marker removed. */
static char b_manifest[300];
static void b_writes_its_manifest(struct store *s)
{
	struct iovec iov = { .iov_base = "m", .iov_len = 1 };
	assert_int_equal(real_ops->create(s, b_manifest, &iov, 1, NULL), 0);
}

static void test_slow_save_seen_after_the_marker(void **state)
{
	struct store_fixture *f = *state;
	struct step_keys k;
	keys(&k, 5, false);
	a_done_b_in_flight(f, &k, false);
	age_b(f, &k);
	snprintf(b_manifest, sizeof(b_manifest), "%s", k.man_b[0]);
	inject_on = "/" DEAD_NAME ".b";
	inject = b_writes_its_manifest;
	logging(f, true);
	int r = del(f, CATALOG_REMOVE);
	logging(f, false);
	assert_int_equal(r, -EBUSY);
	assert_true(there(f, k.man_b[0]));
	for (uint32_t i = 0; i < 2; i++) {
		assert_true(there(f, k.shard_b[i]));
		assert_true(there(f, k.ref_b[i]));
	}
	/* The marker stays: a slow save of b that has not looked yet fails. */
	assert_true(there(f, "j/step-000000000005/" DEAD_NAME ".b"));
	assert_false(there(f, k.man_a));
	/* The second listing of the step came after the marker. */
	size_t mark = op_at("put " DEAD_NAME ".b"), lists = 0;
	for (size_t i = mark; i < nops; i++)
		lists += strcmp(oplog[i], "list j/step-000000000005") == 0;
	assert_int_equal(lists, 1);
}

/* Finishing with a complete attempt b that stays: the commit goes only if
 * it names the attempt taken. */
static void test_commit_follows_the_attempt_it_names(void **state)
{
	struct store_fixture *f = *state;
	for (int names_b = 0; names_b < 2; names_b++) {
		struct step_keys k;
		keys(&k, 5, false);
		put(f, k.shard_a, "a");
		back(f, k.shard_a, 10);
		put(f, "j/step-000000000005/" KEPT_NAME ".a", "");
		for (uint32_t i = 0; i < 2; i++) {
			put(f, k.man_b[i], "m");
			put(f, k.shard_b[i], "b");
		}
		Ckpt__StepCommit c = CKPT__STEP_COMMIT__INIT;
		c.attempt_id = names_b ? "b" : "a";
		c.world_size = names_b ? 2 : 1;
		c.step = 5;
		c.job = "j";
		c.format_version = 1;
		uint8_t buf[256];
		size_t len = ckpt__step_commit__pack(&c, buf);
		struct iovec iov = { buf, len };
		char key[300];
		assert_int_equal(manifest_commit_key(key, sizeof(key), "j", 5), 0);
		assert_int_equal(f->s->ops->put(f->s, key, &iov, 1, NULL), 0);
		assert_int_equal(del(f, CATALOG_FINISH), 0);
		assert_false(there(f, k.shard_a));
		assert_true(there(f, k.man_b[1]));
		assert_int_equal(there(f, key), names_b);
		assert_int_equal(del(f, CATALOG_FORCE), 0);
	}
}

/* A step kept for a step that refers to it costs a finishing pass its
 * listings and the referrer's, no spread directory's; a whole step that
 * is referred to is not marked by a finish that takes nothing. */
static void test_a_kept_step_costs_little(void **state)
{
	struct store_fixture *f = *state;
	struct step_keys k;
	keys(&k, 5, true);
	put(f, k.shard_a, "a");
	put(f, "j/step-000000000005/" KEPT_NAME ".a", "rank-00000-of-00001.a.manifest\n");
	char ref[300];
	assert_int_equal(manifest_ref_key(ref, sizeof(ref), "j", 9, 5, 0, 1, "z"), 0);
	put(f, ref, "");
	logging(f, true);
	int r = del(f, CATALOG_FINISH);
	logging(f, false);
	assert_int_equal(r, -EBUSY);
	assert_non_null(strstr(store_error(r), "step 9 refers to its shard"));
	assert_true(there(f, k.shard_a));
	assert_int_equal(ops_like("list j/shards"), 0);
	assert_int_equal(ops_like("remove"), 0);
	/* A whole step (b complete), referred to, finished: nothing to do,
	 * and the marker that only said "come back" goes. */
	assert_true(there(f, "j/step-000000000005/" LEFT_NAME));
	char path[600];
	snprintf(path, sizeof(path), "%s/j/step-000000000005/" KEPT_NAME ".a", f->dir);
	assert_int_equal(unlink(path), 0);
	for (uint32_t i = 0; i < 2; i++) {
		put(f, k.man_b[i], "m");
		put(f, k.shard_b[i], "b");
	}
	assert_int_equal(del(f, CATALOG_FINISH), 0);
	assert_false(there(f, "j/step-000000000005/" LEFT_NAME));
	assert_true(there(f, k.man_b[0]));
}

/* A file named like a marker of no valid attempt is no marker: it does
 * not stop the removal. */
static void test_a_bad_marker_name_is_ignored(void **state)
{
	struct store_fixture *f = *state;
	struct step_keys k;
	keys(&k, 5, false);
	put(f, k.man_a, "m");
	put(f, k.shard_a, "a");
	char bad[300];
	snprintf(bad, sizeof(bad), "j/step-000000000005/" KEPT_NAME ".%0200d", 7);
	put(f, bad, "x");
	assert_int_equal(del(f, CATALOG_REMOVE), 0);
	assert_false(there(f, k.man_a));
	assert_false(there(f, k.shard_a));
}

/* No step directory, a spread save that died: its old refs name the ranks
 * whose spread directories hold its shards; both go. */
static void test_dead_spread_save_without_a_directory(void **state)
{
	struct store_fixture *f = *state;
	struct step_keys k;
	keys(&k, 5, true);
	for (uint32_t i = 0; i < 2; i++) {
		put(f, k.ref_b[i], "");
		put(f, k.shard_b[i], "b");
	}
	age_b(f, &k);
	assert_int_equal(del(f, CATALOG_REMOVE), 0);
	for (uint32_t i = 0; i < 2; i++) {
		assert_false(there(f, k.shard_b[i]));
		assert_false(there(f, k.ref_b[i]));
	}
	only_dead_b_then_gone(f);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, sf_setup, sf_teardown)
	const struct CMUnitTest tests[] = {
		T(test_leaves_a_save_in_flight),
		T(test_finish_never_takes_a_complete_attempt),
		T(test_young_refs_keep_an_old_shard),
		T(test_window_is_the_callers),
		T(test_force_takes_everything),
		T(test_old_leftovers_go),
		T(test_marker_names_what_a_cut_short_removal_takes),
		T(test_marker_written_first_and_removed_last),
		T(test_spread_shard_in_flight_stays),
		T(test_refs_without_a_directory),
		T(test_slow_save_seen_after_the_marker),
		T(test_commit_follows_the_attempt_it_names),
		T(test_a_kept_step_costs_little),
		T(test_a_bad_marker_name_is_ignored),
		T(test_dead_spread_save_without_a_directory),
		T(test_marker_covers_only_what_came_before),
		T(test_dead_marker_of_a_live_attempt_stays),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
