/* What a save writes to storage, on the libuv threadpool: the shard under
 * a fresh name, then its manifest, create-only, with the journal around
 * both (upload.h). */
#include "upload.h"
#include "catalog.h"
#include "compress.h"
#include "incbase.h"
#include "daemon.h"
#include "clock.h"
#include "journal.h"
#include "log.h"
#include "manifest.h"
#include "pieces.h"
#include "saveobj.h"
#include "store.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static int build_manifest(struct save *sv, uint8_t **out, size_t *outlen, const char *shard_name,
			  const struct stored_shard *ss)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	Ckpt__Manifest m;
	int r = save_manifest_view(sv, &m, shard_name, (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec);
	if (r < 0)
		return r;
	if (ss && ss->npieces) {
		m.format_version = MANIFEST_FORMAT_PIECES;
		m.n_pieces = ss->npieces;
		m.pieces = ss->ptrs;
		m.n_refs = ss->nrefs;
		m.refs = (char **)ss->refs;
		m.piece_bytes = ss->piece_bytes;
	}
	size_t len = ckpt__manifest__get_packed_size(&m);
	uint8_t *buf = malloc(len ? len : 1);
	if (buf)
		ckpt__manifest__pack(&m, buf);
	save_manifest_view_free(&m);
	if (buf == NULL)
		return -ENOMEM;
	*out = buf;
	*outlen = len;
	return 0;
}

static void upload_fail(struct save *sv, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void upload_fail(struct save *sv, int err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(sv->msg, sizeof(sv->msg), fmt, ap);
	va_end(ap);
	sv->status = err;
}

/* Writers never overwrite a complete step, nor their own manifest, on any
 * node, and without reading other ranks' manifests:
 * - a step whose commit object exists (some reader found it complete and
 *   pinned it) is refused here: one GET;
 * - the shard goes under a name no other save uses (a random nonce), so
 *   it can replace nothing;
 * - the manifest is created create-only (link / If-None-Match: * /
 *   x-goog-if-generation-match: 0): a second save of this rank in this
 *   attempt gets EEXIST, whichever node it runs on, and its shard is
 *   removed again.
 * So a save costs 2 requests besides the shard's own: flat in the world
 * size. A complete step that no reader has pinned yet can still gain a
 * second complete attempt; readers then take the one that completed
 * first and pin it (catalog.h), so what a reader once loaded never
 * changes. */
static int check_not_pinned(struct save *sv)
{
	char attempt[ATTEMPT_BUF];
	uint32_t ws;
	store_clear_error();
	int r = catalog_read_commit(daemon_store_of(sv->d, sv->job), sv->job, sv->step, attempt, sizeof(attempt), &ws);
	if (r == -ENOENT)
		return 0;
	if (r == 0) {
		upload_fail(sv, -EEXIST,
			    "step %" PRIu64 " of job '%s' is already complete (attempt '%s', %u ranks); "
			    "checkpoints are never overwritten",
			    sv->step, sv->job, attempt, ws);
		return -EEXIST;
	}
	upload_fail(sv, r, "reading the commit of step %" PRIu64 " of job '%s': %s", sv->step, sv->job, store_error(r));
	return r;
}

static uint64_t shard_nonce(void)
{
	uint64_t x = 0;
	if (getrandom(&x, sizeof(x), 0) != sizeof(x)) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		x = ((uint64_t)ts.tv_sec << 30) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 48);
	}
	return x;
}

/* The shard as it is in the pool: one piece per chunk, with its CRC. */
static int put_raw(struct save *sv, struct store *st, const char *key)
{
	struct iovec *iov = calloc(sv->nchunks ? sv->nchunks : 1, sizeof(*iov));
	if (iov == NULL)
		return -ENOMEM;
	uint64_t cb = sv->d->pool.chunk_bytes;
	for (uint32_t i = 0; i < sv->nchunks; i++) {
		iov[i].iov_base = pool_span_ptr(&sv->d->pool, sv->chunks[i]);
		uint64_t left = sv->shard_bytes - (uint64_t)i * cb;
		iov[i].iov_len = left < cb ? left : cb;
	}
	store_clear_error();
	int r = st->ops->put(st, key, iov, sv->nchunks, sv->chunk_crc);
	free(iov);
	return r;
}

/* The shard compressed: object stores take each part's CRC from its
 * bytes. */
static int put_stored(struct store *st, const char *key, const struct stored_shard *ss)
{
	store_clear_error();
	return st->ops->put(st, key, ss->iov, ss->niov, NULL);
}

/* Before the manifest (docs/architecture.md "References between steps"):
 * a name per older step ss refers to, so retention keeps those; then that
 * each such step still has this rank's manifest (one byte of it read), so
 * a step being removed is not referred to. 0; -ENOENT when one is gone
 * (the save stores every piece again); else the save's failure. */
static int write_refs(struct save *sv, struct store *st, const struct stored_shard *ss, bool first, const char *then)
{
	const Ckpt__Manifest who = { .rank = sv->rank, .world_size = sv->world_size, .step = sv->step };
	char key[1024];
	for (size_t k = 0; k < ss->nrefs; k++) {
		uint64_t t;
		if (manifest_ref_check(&who, ss->refs[k], &t) < 0 ||
		    manifest_ref_key(key, sizeof(key), sv->job, sv->step, t, sv->rank, sv->world_size, sv->attempt) < 0)
			return -ENOENT; /* not a shard a save refers to: store everything */
		store_clear_error();
		/* Created; where an earlier save of this rank and attempt left
		 * one, written anew, so that its time is now (removal.c judges
		 * an attempt's age by its newest object), and the save is a
		 * reuse of names a removal may have listed before (reused).
		 * The body is this save's own (its id and the node's time): an
		 * object store's create that meets an earlier save's ref then
		 * reads other bytes there, and says EEXIST. */
		char body[48];
		struct iovec iov = { body, (size_t)snprintf(body, sizeof(body), "%" PRIu64 " %" PRIu64, sv->id,
							    clock_now_ns()) };
		int r = first ? store_create_announced(st, key, &iov, 1) : -EEXIST;
		if (r == -EEXIST) {
			sv->refs_reused |= first;
			r = store_put_announced(st, key, &iov, 1);
		}
		if (r < 0) {
			upload_fail(sv, r, "writing %s to %s: %s", key, st->url, store_error(r));
			return r;
		}
	}
	/* Each step referred to must still have this rank's manifest: a
	 * removal takes the manifests first, then looks for refs like ours
	 * (catalog_delete_step), so one of us sees the other. */
	for (size_t k = 0; k < ss->nrefs; k++) {
		uint64_t t;
		struct step_name sn;
		manifest_parse_object(strrchr(ss->refs[k], '/') + 1, &sn);
		if (manifest_ref_check(&who, ss->refs[k], &t) < 0 ||
		    manifest_key_attempt(key, sizeof(key), sv->job, t, sv->rank, sv->world_size, sn.attempt) < 0)
			return -ENOENT;
		uint8_t one;
		store_clear_error();
		int r = st->ops->get_range(st, key, 0, &one, 1);
		if (r == -ENOENT || r == -ENODATA) {
			log_warn("save %" PRIu64 ": %s step %" PRIu64 " rank %u: step %" PRIu64 ", which the previous "
				 "step's pieces are in, is being removed; %s",
				 sv->id, sv->job, sv->step, sv->rank, t, then);
			return -ENOENT;
		}
		if (r < 0) {
			upload_fail(sv, r, "reading %s at %s: %s", key, st->url, store_error(r));
			return r;
		}
	}
	return 0;
}

/* The job's in-flight window (save.c sets it; a copy persisted from a
 * peer's memory may come without). */
static uint64_t window_s(const struct save *sv)
{
	return sv->in_flight_s ? sv->in_flight_s : CATALOG_SPARE_S;
}

/* The refs come before the shard, and while the shard is written they
 * are all there is of this save: a removal of this step takes them as a
 * dead save's once they are older than the job's in-flight window
 * (catalog_in_flight_s, removal.c). A shard that took over half of it
 * writes them anew (their time is now) and looks at the steps they name
 * again (nrefs more writes and reads; none for a quicker one). A step
 * gone meanwhile may have taken pieces this shard refers to: the save
 * fails, and the next one stores every piece. */
static int recheck_refs(struct save *sv, struct store *st, const struct stored_shard *ss, uint64_t refs_at)
{
	uint64_t took = clock_now_ns() - refs_at;
	if (took <= window_s(sv) * 500000000ull && !sv->refs_reused)
		return 0;
	int r = write_refs(sv, st, ss, false, "failing this save");
	if (r == -ENOENT)
		upload_fail(sv, -ESTALE,
			    "step %" PRIu64 " of job '%s', rank %u: a step whose pieces this one refers to was removed "
			    "while its shard was written (%.0f s); the next save stores every piece",
			    sv->step, sv->job, sv->rank, (double)took / 1e9);
	return r;
}

/* A save that took over half the job's in-flight window may have been
 * judged dead by a removal of this step (removal.c), which then marks
 * its attempt (DEAD_NAME, left for twice the window) before taking any
 * of it and lists the step again after: its manifest, created before, is
 * seen there (the attempt is left), or the marker is seen here (the save
 * fails: what it wrote may be going, and it takes back its own). One GET,
 * for such a save only. A save that took over twice the window is past
 * that marker's life: it fails before its manifest (too_slow). 0 or the
 * save's failure. */
static int check_not_taken(struct save *sv, struct store *st, uint64_t t0, int64_t t0_wall)
{
	uint64_t took = clock_now_ns() - t0;
	if (took <= window_s(sv) * 500000000ull && !sv->refs_reused)
		return 0;
	char key[768];
	char *buf = NULL;
	size_t len = 0;
	if (manifest_step_dir(key, sizeof(key) - ATTEMPT_BUF - 8, sv->job, sv->step) < 0)
		return 0;
	snprintf(key + strlen(key), ATTEMPT_BUF + 8, "/" DEAD_NAME ".%s", sv->attempt);
	store_clear_error();
	int r = st->ops->get_all(st, key, 64, (void **)&buf, &len);
	if (r == 0 && !sv->refs_reused) {
		/* Written before this save began (its wall time in the body):
		 * about an earlier save of the attempt, not this one. A save
		 * whose refs' names were there before it cannot tell. */
		char num[32] = "";
		memcpy(num, buf, len < sizeof(num) - 1 ? len : sizeof(num) - 1);
		char *end = NULL;
		long long at = strtoll(num, &end, 10);
		if (end != num && at > 0 && at < t0_wall)
			r = -ENOENT;
	}
	free(buf);
	if (r == -ENOENT && sv->refs_reused) {
		/* A removal of the step under way (it marks before it takes
		 * any of it) may delete by the names it listed: ours. */
		snprintf(strrchr(key, '/'), ATTEMPT_BUF + 8, "/" KEPT_NAME ".%s", sv->attempt);
		buf = NULL;
		r = st->ops->get_all(st, key, 1, (void **)&buf, &len);
		free(buf);
	}
	if (r == -EFBIG)
		r = 0;
	if (r == -ENOENT)
		return 0;
	if (r == 0)
		upload_fail(sv, -ESTALE,
			    "step %" PRIu64 " of job '%s', rank %u: a removal of this step took attempt '%s' as a dead "
			    "save's (%s): not durable; save again under another step or attempt",
			    sv->step, sv->job, sv->rank, sv->attempt,
			    sv->refs_reused ? "an earlier save of this rank and attempt left its refs"
					    : "this one took over half the job's in-flight window");
	else
		upload_fail(sv, r, "reading %s at %s: %s", key, st->url, store_error(r));
	return r == 0 ? -ESTALE : r;
}

/* A save that took longer than twice the job's in-flight window: a
 * removal's DEAD_NAME marker for it may be gone again (check_not_taken),
 * so it fails before its manifest. */
static int too_slow(struct save *sv, uint64_t t0)
{
	uint64_t took = clock_now_ns() - t0;
	if (took <= window_s(sv) * 2000000000ull)
		return 0;
	upload_fail(sv, -ESTALE,
		    "step %" PRIu64
		    " of job '%s', rank %u: this save took %.0f s, over twice the job's in-flight window "
		    "([retention] incomplete_grace, else an hour): a removal may have taken it as a dead save's; not "
		    "durable; save again, or raise incomplete_grace",
		    sv->step, sv->job, sv->rank, (double)took / 1e9);
	return -ESTALE;
}

static size_t ref_targets(const struct save *sv, const struct stored_shard *ss, uint64_t *t);
static void unwrite_refs(struct save *sv, struct store *st, const uint64_t *t, size_t n);

/* No base in memory for sv's rank (the first save since this daemon
 * started, or the rank moved here): the newest older step of this rank in
 * storage becomes it, so a restart does not store a frozen base again.
 * Flat in the world size: 1 LIST of the job's steps, then for the newest
 * step before sv's, 1 GET of its commit object (the attempt every reader
 * loads; else sv's own attempt) and 1 GET of this rank's manifest. Any
 * failure only means no base: the save then stores every piece. */
static struct incbase *base_from_storage(struct save *sv, struct store *st)
{
	uint64_t *steps = NULL;
	size_t n = 0;
	if (catalog_steps(st, sv->job, &steps, &n) < 0)
		return NULL;
	uint64_t prev = 0;
	bool found = false;
	for (size_t i = n; i-- > 0 && !found;)
		if (steps[i] < sv->step) {
			prev = steps[i];
			found = true;
		}
	free(steps);
	if (!found)
		return NULL;
	char attempt[ATTEMPT_BUF], err[512];
	uint32_t ws = 0;
	if (catalog_read_commit(st, sv->job, prev, attempt, sizeof(attempt), &ws) < 0 || ws != sv->world_size)
		snprintf(attempt, sizeof(attempt), "%s", sv->attempt);
	Ckpt__Manifest *m = NULL;
	char ref[768];
	int r = catalog_get_manifest(st, sv->job, prev, sv->rank, sv->world_size, attempt, &m, err, sizeof(err));
	if (r == 0 && manifest_shard_ref(m, ref, sizeof(ref)) == 0 && m->n_pieces > 0 && incbase_record(m, ref) == 0)
		log_info("save %" PRIu64 ": %s rank %u: step %" PRIu64 " in storage is the base of incremental saves",
			 sv->id, sv->job, sv->rank, prev);
	else if (r < 0 && r != -ENOENT)
		log_warn("save %" PRIu64 ": %s rank %u: no base from step %" PRIu64 " (%s); storing every piece",
			 sv->id, sv->job, sv->rank, prev, err);
	if (m)
		ckpt__manifest__free_unpacked(m, NULL);
	return incbase_get(sv->job, sv->rank, sv->world_size);
}

/* The stored form of sv's shard (compress.h): compressed, and with
 * incremental the pieces this rank's previous step holds the same bytes
 * of as references to them, written down (write_refs) before anything
 * refers to them. 0; 1 when there is no memory for it (the shard is then
 * stored as it is); or the save's failure. */
static int make_stored(struct save *sv, struct store *st, struct stored_shard *ss)
{
	struct shard_opts o = { .compress = sv->compress,
				.incremental = sv->incremental,
				.piece_bytes = sv->piece_bytes };
	if (sv->incremental) {
		o.base = incbase_get(sv->job, sv->rank, sv->world_size);
		if (o.base == NULL)
			o.base = base_from_storage(sv, st);
	}
	if (o.base && o.base->step >= sv->step) { /* a step saved again, or out of order: nothing older */
		incbase_unref(o.base);
		o.base = NULL;
	}
	char why[300];
	for (;;) {
		uint64_t t0 = clock_now_ns();
		int r = compress_shard(sv, sv->d->cfg.copy_threads, &o, ss, why, sizeof(why));
		if (r == -ENOMEM) {
			/* Its coded pieces live outside the pool until written:
			 * without that memory, the shard goes as it is. */
			log_warn("save %" PRIu64 ": %s step %" PRIu64 " rank %u: %s; storing the shard as it is",
				 sv->id, sv->job, sv->step, sv->rank, why);
			incbase_unref(o.base);
			return 1;
		}
		if (r < 0) {
			upload_fail(sv, r, "%s", why);
			break;
		}
		if (ss->over_budget)
			log_warn("save %" PRIu64 ": %s step %" PRIu64 " rank %u: %zu pieces stored uncompressed: the "
				 "memory for coded pieces (half the pool, daemon-wide) was in use",
				 sv->id, sv->job, sv->step, sv->rank, ss->over_budget);
		log_debug("save %" PRIu64 ": %s step %" PRIu64 " rank %u: %" PRIu64 " bytes stored in %" PRIu64
			  " (%zu pieces, %" PRIu64 " bytes of them coded, %" PRIu64 " in older steps) in %.1f ms",
			  sv->id, sv->job, sv->step, sv->rank, sv->shard_bytes, ss->bytes, ss->npieces, ss->coded_bytes,
			  ss->ref_bytes, (double)(clock_now_ns() - t0) / 1e6);
		r = ss->ref_bytes ? write_refs(sv, st, ss, true, "storing every piece again") : 0;
		if (r == -ENOENT && o.base) {
			uint64_t t[INCBASE_MAX_REFS];
			unwrite_refs(sv, st, t, ref_targets(sv, ss, t)); /* this pass's: it stores everything */
			stored_shard_free(ss);
			incbase_unref(o.base);
			o.base = NULL;
			continue;
		}
		if (r < 0)
			stored_shard_free(ss);
		incbase_unref(o.base);
		return r;
	}
	incbase_unref(o.base);
	return sv->status;
}

/* The older steps ss refers to, into t (at most INCBASE_MAX_REFS). */
static size_t ref_targets(const struct save *sv, const struct stored_shard *ss, uint64_t *t)
{
	const Ckpt__Manifest who = { .rank = sv->rank, .world_size = sv->world_size, .step = sv->step };
	size_t n = 0;
	for (size_t k = 0; k < ss->nrefs && n < INCBASE_MAX_REFS; k++)
		if (manifest_ref_check(&who, ss->refs[k], &t[n]) == 0)
			n++;
	return n;
}

/* A save that will never have a manifest takes back the refs it wrote,
 * so they keep nothing for it (best effort: one left keeps its step's
 * shard until ckptctl rm of this step). */
static void unwrite_refs(struct save *sv, struct store *st, const uint64_t *t, size_t n)
{
	char key[1024];
	/* Names an earlier save of this rank and attempt wrote first may be
	 * what its manifest relies on: they stay (they only keep their steps
	 * longer). */
	if (sv->refs_reused)
		return;
	for (size_t i = 0; i < n; i++)
		if (manifest_ref_key(key, sizeof(key), sv->job, sv->step, t[i], sv->rank, sv->world_size,
				     sv->attempt) == 0)
			(void)st->ops->remove(st, key);
}

/* The manifest sv just wrote becomes its rank's base (incbase.h). */
static void remember_base(struct save *sv, const uint8_t *buf, size_t len)
{
	Ckpt__Manifest *m = ckpt__manifest__unpack(NULL, len, buf);
	char ref[768];
	if (m == NULL || manifest_shard_ref(m, ref, sizeof(ref)) < 0 || incbase_record(m, ref) < 0)
		log_warn("save %" PRIu64 ": %s rank %u: out of memory; the next save stores every piece", sv->id,
			 sv->job, sv->rank);
	if (m)
		ckpt__manifest__free_unpacked(m, NULL);
}

/* One upload's object names, its start, and the steps its refs name. */
struct shard_upload {
	struct save *sv;
	struct store *st;
	char shard_key[768], man_key[768];
	uint64_t t0;
	int64_t t0_wall;
	uint64_t refd[INCBASE_MAX_REFS];
	size_t nrefd;
};

/* After a removal took the step (check_not_taken): the manifest goes
 * first, so the rank stops being saved; if the manifest stays, so does
 * what it names. */
static void take_back(struct shard_upload *u)
{
	struct save *sv = u->sv;
	struct store *st = u->st;
	int back = st->ops->remove(st, u->man_key);
	if (back == 0 || back == -ENOENT) {
		(void)st->ops->remove(st, u->shard_key);
		unwrite_refs(sv, st, u->refd, u->nrefd);
		return;
	}
	log_err("save %" PRIu64 ": %s step %" PRIu64 " rank %u: %s could not be taken back (%s): its "
		"refs may be gone; remove the step (ckptctl rm --force)",
		sv->id, sv->job, sv->step, sv->rank, u->man_key, store_error(back));
}

/* The manifest, once the shard (and its refs) are written: created, never
 * overwritten. A failed one leaves no shard behind unless the manifest
 * made it after all (an answer lost on the way). Frees ss (stored: what
 * make_stored made of the shard) once the manifest holds what it says. */
static void put_manifest(struct shard_upload *u, struct stored_shard *ss, bool stored)
{
	struct save *sv = u->sv;
	struct store *st = u->st;
	uint8_t *mbuf = NULL;
	size_t mlen = 0;
	const char *shard_name = strrchr(u->shard_key, '/') + 1;
	snprintf(sv->shard_name, sizeof(sv->shard_name), "%s", shard_name);
	int r = build_manifest(sv, &mbuf, &mlen, shard_name, stored ? ss : NULL);
	stored_shard_free(ss);
	if (r == 0) {
		struct iovec one = { .iov_base = mbuf, .iov_len = mlen };
		store_clear_error();
		r = st->ops->create(st, u->man_key, &one, 1, NULL);
	}
	if (r == 0 && check_not_taken(sv, st, u->t0, u->t0_wall) < 0) {
		take_back(u);
	} else if (r == 0) {
		if (sv->incremental) /* the next save's base */
			remember_base(sv, mbuf, mlen);
	} else if (r == -EEXIST) {
		upload_fail(sv, -EEXIST,
			    "step %" PRIu64 " of job '%s' is already saved by rank %u in attempt '%s'; "
			    "checkpoints are never overwritten",
			    sv->step, sv->job, sv->rank, sv->attempt);
		(void)st->ops->remove(st, u->shard_key); /* ours alone: its name is new */
	} else if (r < 0) {
		upload_fail(sv, r, "writing %s to %s: %s", u->man_key, st->url, store_error(r));
		void *mb = NULL;
		size_t ml = 0;
		if (st->ops->get_all(st, u->man_key, MANIFEST_MAX_BYTES, &mb, &ml) == -ENOENT) {
			(void)st->ops->remove(st, u->shard_key);
			unwrite_refs(sv, st, u->refd, u->nrefd);
		}
		free(mb);
	}
	free(mbuf);
}

void save_upload(struct save *sv)
{
	assert(sv->state == SAVE_UPLOADING && sv->status == 0);
	struct shard_upload u = {
		.sv = sv, .st = daemon_store_of(sv->d, sv->job), .t0 = clock_now_ns(), .t0_wall = clock_wall_ns()
	};
	struct store *st = u.st;
	if (manifest_shard_key(u.shard_key, sizeof(u.shard_key), sv->job, sv->step, sv->rank, sv->world_size,
			       sv->attempt, shard_nonce(), sv->spread) < 0 ||
	    manifest_key_attempt(u.man_key, sizeof(u.man_key), sv->job, sv->step, sv->rank, sv->world_size,
				 sv->attempt) < 0) {
		upload_fail(sv, -ENAMETOOLONG, "job and attempt names make too long a key");
		return;
	}
	if (check_not_pinned(sv) < 0)
		return;
	/* After a crash the journal says which shard may be half there. */
	int r = journal_begin(sv->d->journal, sv->id, u.shard_key, u.man_key, sv->attempt);
	if (r < 0) {
		upload_fail(sv, r, "writing the journal in %s: %s", sv->d->cfg.state_dir, strerror(-r));
		return;
	}
	struct stored_shard ss = { 0 };
	r = sv->compress || sv->incremental ? make_stored(sv, st, &ss) : 1;
	if (r < 0) {
		if (sv->status == 0)
			upload_fail(sv, r, "storing %s: %s", u.shard_key, strerror(-r));
		goto out;
	}
	bool stored = r == 0;
	uint64_t refs_at = clock_now_ns(); /* make_stored wrote them last */
	u.nrefd = stored ? ref_targets(sv, &ss, u.refd) : 0;
	r = stored ? put_stored(st, u.shard_key, &ss) : put_raw(sv, st, u.shard_key);
	sv->stored_bytes = stored ? ss.bytes : sv->shard_bytes;
	sv->coded_bytes = stored ? ss.coded_bytes : 0;
	if (r < 0) {
		stored_shard_free(&ss);
		upload_fail(sv, r, "writing %s to %s: %s", u.shard_key, st->url, store_error(r));
		unwrite_refs(sv, st, u.refd, u.nrefd);
	} else if ((stored && ss.ref_bytes && recheck_refs(sv, st, &ss, refs_at) < 0) || too_slow(sv, u.t0) < 0) {
		stored_shard_free(&ss);
		(void)st->ops->remove(st, u.shard_key); /* ours alone: its name is new */
		unwrite_refs(sv, st, u.refd, u.nrefd);
	} else {
		put_manifest(&u, &ss, stored);
	}
out:
	(void)journal_end(sv->d->journal, sv->id);
}
