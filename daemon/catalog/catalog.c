#include "catalog.h"
#include "log.h"
#include "macro.h"
#include "pieces.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static atomic_uint_fast64_t manifest_gets, index_gets, index_puts;

uint64_t catalog_manifest_gets(void)
{
	return atomic_load(&manifest_gets);
}

uint64_t catalog_index_gets(void)
{
	return atomic_load(&index_gets);
}

uint64_t catalog_index_puts(void)
{
	return atomic_load(&index_puts);
}

void catalog_step_free(struct catalog_step *cs)
{
	for (size_t g = 0; g < cs->ngroups; g++) {
		struct catalog_group *grp = &cs->groups[g];
		for (uint32_t r = 0; grp->by_rank && r < grp->world_size; r++) {
			if (grp->cached && grp->cached[r])
				mancache_release(cs->cache, grp->cached[r]);
			else if (grp->from_index)
				continue; /* the index's: released below */
			else if (grp->by_rank[r])
				ckpt__manifest__free_unpacked(grp->by_rank[r], NULL);
		}
		free(grp->cached);
		free(grp->by_rank);
		free(grp->listed);
		free(grp->present);
	}
	if (cs->index_ref)
		mancache_release(cs->cache, cs->index_ref);
	cs->index_ref = NULL;
	cs->ngroups = 0;
	cs->best = -1;
}

static bool group_complete(const struct catalog_group *g)
{
	return g->count == g->world_size;
}

bool catalog_step_complete(const struct catalog_step *cs)
{
	return cs->best >= 0 && !cs->stale_commit && group_complete(&cs->groups[cs->best]);
}

void catalog_step_summary(const struct catalog_step *cs, struct catalog_summary *out)
{
	const struct catalog_group *g = &cs->groups[cs->best];
	memset(out, 0, sizeof(*out));
	snprintf(out->attempt, sizeof(out->attempt), "%s", g->attempt);
	out->world_size = g->world_size;
	out->count = g->count;
	out->bytes = g->bytes;
	out->bytes_unlisted = !g->legacy && g->count > 0 && g->shards_listed == 0;
	out->complete = catalog_step_complete(cs);
	out->saved_ns = g->newest_ns;
}

/* A group is an attempt and world size in one naming format: format 1
 * and format 2 manifests of one attempt (saved across an upgrade) are
 * keyed and read differently, so they are two groups. */
static struct catalog_group *find_group(struct catalog_step *cs, const char *attempt, uint32_t ws, bool legacy)
{
	for (size_t g = 0; g < cs->ngroups; g++)
		if (cs->groups[g].world_size == ws && cs->groups[g].legacy == legacy &&
		    strcmp(cs->groups[g].attempt, attempt) == 0)
			return &cs->groups[g];
	return NULL;
}

static struct catalog_group *group_for(struct catalog_step *cs, const char *attempt, uint32_t ws, bool legacy)
{
	struct catalog_group *grp = find_group(cs, attempt, ws, legacy);
	if (grp)
		return grp;
	if (cs->ngroups == CATALOG_MAX_GROUPS)
		return NULL;
	grp = &cs->groups[cs->ngroups];
	memset(grp, 0, sizeof(*grp));
	grp->present = calloc(ws, sizeof(*grp->present));
	grp->listed = calloc(ws, sizeof(*grp->listed));
	grp->by_rank = calloc(ws, sizeof(*grp->by_rank));
	if (grp->present == NULL || grp->listed == NULL || grp->by_rank == NULL) {
		free(grp->present);
		free(grp->listed);
		free(grp->by_rank);
		return NULL;
	}
	snprintf(grp->attempt, sizeof(grp->attempt), "%s", attempt);
	grp->world_size = ws;
	grp->legacy = legacy;
	cs->ngroups++;
	return grp;
}

static int manifest_key_of(const char *job, uint64_t step, const struct catalog_group *g, uint32_t rank, char *key,
			   size_t cap)
{
	return g->legacy ? manifest_key(key, cap, job, step, rank, g->world_size, "manifest")
			 : manifest_key_attempt(key, cap, job, step, rank, g->world_size, g->attempt);
}

/* GET and check one manifest: its contents must match its name. */
static int read_manifest(struct store *s, const char *key, const char *job, uint64_t step, uint32_t rank, uint32_t ws,
			 const char *attempt, Ckpt__Manifest **out, char *err, size_t errlen)
{
	void *buf = NULL;
	size_t len = 0;
	atomic_fetch_add(&manifest_gets, 1);
	int r = s->ops->get_all(s, key, MANIFEST_MAX_BYTES, &buf, &len);
	if (r < 0) {
		snprintf(err, errlen, "reading %s: %s", key, store_error(r));
		return r;
	}
	Ckpt__Manifest *m = NULL;
	char why[256];
	r = manifest_decode(buf, len, &m, why, sizeof(why));
	free(buf);
	if (r < 0) {
		snprintf(err, errlen, "%s: %s", key, why);
		return -EBADMSG;
	}
	if (strcmp(m->job, job) != 0 || m->step != step || m->rank != rank || m->world_size != ws ||
	    (attempt && strcmp(m->attempt_id, attempt) != 0)) {
		snprintf(err, errlen,
			 "%s: its contents (job '%s' step %" PRIu64 " rank %u of %u attempt '%s') do not "
			 "match its name",
			 key, m->job, m->step, m->rank, m->world_size, m->attempt_id);
		ckpt__manifest__free_unpacked(m, NULL);
		return -EBADMSG;
	}
	*out = m;
	return 0;
}

int catalog_get_manifest(struct store *s, const char *job, uint64_t step, uint32_t rank, uint32_t ws,
			 const char *attempt, Ckpt__Manifest **out, char *err, size_t errlen)
{
	char key[768];
	int r = manifest_key_attempt(key, sizeof(key), job, step, rank, ws, attempt);
	if (r < 0) {
		snprintf(err, errlen, "job and attempt names make too long a key");
		return r;
	}
	return read_manifest(s, key, job, step, rank, ws, attempt, out, err, errlen);
}

/* A format 1 manifest: its attempt is known only from inside it. */
static int add_legacy(struct store *s, const char *job, uint64_t step, const char *dir, const struct step_name *sn,
		      const char *name, struct catalog_step *out)
{
	char key[1024], err[512];
	snprintf(key, sizeof(key), "%s/%s", dir, name);
	Ckpt__Manifest *m = NULL;
	int r = read_manifest(s, key, job, step, sn->rank, sn->world_size, NULL, &m, err, sizeof(err));
	if (r == -ENOENT)
		return 0; /* removed since the LIST */
	if (r == -EBADMSG) {
		log_warn("catalog: %s", err);
		out->unreadable++;
		return 0;
	}
	if (r < 0) {
		store_set_error("%s", err);
		return r;
	}
	struct catalog_group *grp = group_for(out, m->attempt_id, sn->world_size, true);
	if (grp == NULL) {
		log_warn("catalog: %s: too many attempts in one step; ignored", key);
		ckpt__manifest__free_unpacked(m, NULL);
		return 0;
	}
	if (grp->present[sn->rank]) {
		ckpt__manifest__free_unpacked(m, NULL);
		return 0;
	}
	grp->present[sn->rank] = true;
	grp->by_rank[sn->rank] = m;
	grp->count++;
	grp->bytes += m->shard_bytes;
	if ((int64_t)m->created_unix_ns > grp->newest_ns)
		grp->newest_ns = (int64_t)m->created_unix_ns;
	return 0;
}

/* Of several complete attempts, the one that completed first (its newest
 * manifest is the oldest); equal times: the smaller attempt id. */
static bool completed_before(const struct catalog_group *a, const struct catalog_group *b)
{
	if (a->newest_ns != b->newest_ns)
		return a->newest_ns < b->newest_ns;
	return strcmp(a->attempt, b->attempt) < 0;
}

static int pick_best(struct catalog_step *cs)
{
	int best = -1;
	for (size_t g = 0; g < cs->ngroups; g++) {
		const struct catalog_group *grp = &cs->groups[g];
		if (best < 0) {
			best = (int)g;
			continue;
		}
		const struct catalog_group *b = &cs->groups[best];
		bool c = group_complete(grp), bc = group_complete(b);
		if (c && !bc)
			best = (int)g;
		else if (c && bc && completed_before(grp, b))
			best = (int)g;
		else if (!c && !bc && grp->newest_ns > b->newest_ns)
			best = (int)g;
	}
	return best;
}

static int use_commit(struct store *s, const char *job, struct catalog_step *cs);

int catalog_list_step(struct store *s, const char *job, uint64_t step, struct catalog_step *out)
{
	char dir[512];
	memset(out, 0, sizeof(*out));
	out->step = step;
	out->best = -1;
	int r = manifest_step_dir(dir, sizeof(dir), job, step);
	if (r < 0)
		return r;
	struct store_entry *v = NULL;
	size_t n = 0;
	r = s->ops->list_entries(s, dir, &v, &n);
	if (r < 0)
		return r;
	struct step_name sn;
	for (size_t i = 0; i < n && r == 0; i++) {
		manifest_parse_object(v[i].name, &sn);
		if (sn.kind == OBJ_COMMIT) {
			out->has_commit = true;
		} else if (sn.kind == OBJ_OTHER) {
			out->marked |= manifest_is_marker(v[i].name);
		} else if (sn.kind == OBJ_INDEX) {
			out->has_index = true;
			out->index_listed = (struct catalog_listed){ v[i].mtime_ns, v[i].size };
		} else if (sn.kind == OBJ_MANIFEST && sn.attempt[0] == '\0') {
			r = add_legacy(s, job, step, dir, &sn, v[i].name, out);
		} else if (sn.kind == OBJ_MANIFEST) {
			struct catalog_group *grp = group_for(out, sn.attempt, sn.world_size, false);
			if (grp == NULL) {
				log_warn("catalog: %s/%s: too many attempts in one step; ignored", dir, v[i].name);
				continue;
			}
			if (grp->present[sn.rank])
				continue;
			grp->present[sn.rank] = true;
			grp->listed[sn.rank] = (struct catalog_listed){ v[i].mtime_ns, v[i].size };
			grp->count++;
			if (v[i].mtime_ns > grp->newest_ns)
				grp->newest_ns = v[i].mtime_ns;
		}
	}
	/* Shards count towards their attempt's bytes. */
	for (size_t i = 0; i < n && r == 0; i++) {
		manifest_parse_object(v[i].name, &sn);
		if (sn.kind != OBJ_SHARD || sn.attempt[0] == '\0')
			continue;
		struct catalog_group *grp = find_group(out, sn.attempt, sn.world_size, false);
		if (grp && !grp->legacy && grp->present[sn.rank]) {
			grp->bytes += v[i].size;
			grp->shards_listed++;
		}
	}
	store_entries_free(v, n);
	if (r < 0) {
		catalog_step_free(out);
		return r;
	}
	if (out->ngroups == 0)
		return out->unreadable ? -EBADMSG : -ENOENT;
	out->best = pick_best(out);
	size_t ncomplete = 0;
	for (size_t g = 0; g < out->ngroups; g++)
		ncomplete += group_complete(&out->groups[g]);
	if (ncomplete > 1 && out->has_commit) {
		r = use_commit(s, job, out);
		if (r < 0) {
			catalog_step_free(out);
			return r;
		}
	}
	return 0;
}

int catalog_read_commit(struct store *s, const char *job, uint64_t step, char *attempt, size_t cap, uint32_t *ws)
{
	char key[768];
	int r = manifest_commit_key(key, sizeof(key), job, step);
	if (r < 0)
		return r;
	void *buf = NULL;
	size_t len = 0;
	r = s->ops->get_all(s, key, 64u << 10, &buf, &len);
	if (r < 0)
		return r;
	Ckpt__StepCommit *c = ckpt__step_commit__unpack(NULL, len, buf);
	free(buf);
	if (c == NULL || c->format_version != 1 || strcmp(c->job, job) != 0 || c->step != step ||
	    !manifest_name_valid(c->attempt_id, ATTEMPT_MAX_LEN) || c->world_size == 0) {
		if (c)
			ckpt__step_commit__free_unpacked(c, NULL);
		store_set_error("%s: not a valid commit object for this step", key);
		return -EBADMSG;
	}
	snprintf(attempt, cap, "%s", c->attempt_id);
	*ws = c->world_size;
	ckpt__step_commit__free_unpacked(c, NULL);
	return 0;
}

/* The commit object decides: best becomes the group it names. A commit
 * naming an attempt that is not complete (any more) leaves the step not
 * complete: it is being removed, or was damaged. */
static int use_commit(struct store *s, const char *job, struct catalog_step *cs)
{
	char attempt[ATTEMPT_BUF];
	uint32_t ws;
	int r = catalog_read_commit(s, job, cs->step, attempt, sizeof(attempt), &ws);
	if (r == -ENOENT) { /* removed since the LIST */
		cs->has_commit = false;
		return 0;
	}
	if (r < 0)
		return r;
	struct catalog_group *g = find_group(cs, attempt, ws, false);
	if (g == NULL)
		g = find_group(cs, attempt, ws, true);
	if (g == NULL || !group_complete(g)) {
		log_warn("catalog: %s step %" PRIu64 ": its commit names attempt '%s' of %u ranks, which is not "
			 "complete; the step is taken as incomplete",
			 job, cs->step, attempt, ws);
		cs->stale_commit = true; /* no other attempt completes a pinned step */
		if (g)
			cs->best = (int)(g - cs->groups);
		return 0;
	}
	cs->best = (int)(g - cs->groups);
	cs->pinned = true;
	return 0;
}

static int write_commit(struct store *s, const char *job, const struct catalog_step *cs)
{
	const struct catalog_group *g = &cs->groups[cs->best];
	char key[768];
	int r = manifest_commit_key(key, sizeof(key), job, cs->step);
	if (r < 0)
		return r;
	Ckpt__StepCommit c = CKPT__STEP_COMMIT__INIT;
	c.format_version = 1;
	c.job = (char *)job;
	c.step = cs->step;
	c.attempt_id = (char *)g->attempt;
	c.world_size = g->world_size;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	c.created_unix_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	uint8_t buf[512];
	size_t len = ckpt__step_commit__get_packed_size(&c);
	if (len > sizeof(buf))
		return -ENAMETOOLONG;
	ckpt__step_commit__pack(&c, buf);
	struct iovec iov = { buf, len };
	return store_create_announced(s, key, &iov, 1);
}

int catalog_resolve_step(struct store *s, const char *job, uint64_t step, struct catalog_step *out)
{
	int r = catalog_list_step(s, job, step, out);
	if (r < 0 || !catalog_step_complete(out) || out->pinned)
		return r;
	if (!out->has_commit) {
		r = write_commit(s, job, out);
		if (r == 0) {
			out->pinned = out->has_commit = true;
			return 0;
		}
		if (r == -EACCES || r == -EPERM || r == -EROFS) {
			/* Read-only credentials: the listing's choice stands. */
			log_warn("catalog: cannot pin %s step %" PRIu64 " (%s); using attempt '%s' unpinned", job, step,
				 store_error(r), out->groups[out->best].attempt);
			return 0;
		}
		if (r != -EEXIST) {
			catalog_step_free(out);
			return r;
		}
		/* Another reader pinned it first: its choice holds. */
	}
	r = use_commit(s, job, out);
	if (r < 0)
		catalog_step_free(out);
	return r;
}

int catalog_confirm_pin(struct store *s, const char *job, struct catalog_step *cs)
{
	if (cs->pinned || !cs->has_commit || !catalog_step_complete(cs))
		return 0;
	return use_commit(s, job, cs);
}

struct fetch {
	struct store *s;
	const char *key, *job, *attempt;
	uint64_t step;
	uint32_t rank, ws;
};

static int fetch_manifest(void *ctx, Ckpt__Manifest **out, char *err, size_t errlen)
{
	struct fetch *f = ctx;
	return read_manifest(f->s, f->key, f->job, f->step, f->rank, f->ws, f->attempt, out, err, errlen);
}

/* Through the cache: once per daemon for every reader of the pinned
 * attempt, keyed by the object's name and listed time and size. */
static int read_cached(struct store *s, const char *job, struct catalog_step *cs, struct catalog_group *g,
		       uint32_t rank, const char *key, char *err, size_t errlen)
{
	if (g->cached == NULL && (g->cached = calloc(g->world_size, sizeof(*g->cached))) == NULL) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	struct fetch f = { s, key, job, g->attempt, cs->step, rank, g->world_size };
	const Ckpt__Manifest *m;
	int r = mancache_get(cs->cache, key, g->listed[rank].mtime_ns, g->listed[rank].size, fetch_manifest, &f, &m,
			     &g->cached[rank], err, errlen);
	if (r < 0) {
		if (r != -EBADMSG)
			store_set_error("%s", err); /* a waiter's thread has not seen the backend's words */
		return r;
	}
	g->by_rank[rank] = (Ckpt__Manifest *)m; /* read only: catalog.h */
	return 0;
}

int catalog_read_manifest(struct store *s, const char *job, struct catalog_step *cs, uint32_t rank,
			  const Ckpt__Manifest **out, char *err, size_t errlen)
{
	assert(s && job && cs && out);
	if (cs->best < 0) {
		snprintf(err, errlen, "step %" PRIu64 " of job '%s' has no manifest", cs->step, job);
		return -ENOENT;
	}
	struct catalog_group *g = &cs->groups[cs->best];
	if (rank >= g->world_size || !g->present[rank]) {
		snprintf(err, errlen, "step %" PRIu64 " of job '%s' has no manifest of rank %u in attempt '%s'",
			 cs->step, job, rank, g->attempt);
		return -ENOENT;
	}
	if (g->by_rank[rank] == NULL) {
		char key[1024];
		int r = manifest_key_of(job, cs->step, g, rank, key, sizeof(key));
		if (r == 0 && cs->cache && cs->pinned && !g->legacy)
			r = read_cached(s, job, cs, g, rank, key, err, errlen);
		else if (r == 0)
			r = read_manifest(s, key, job, cs->step, rank, g->world_size, g->attempt, &g->by_rank[rank],
					  err, errlen);
		if (r < 0)
			return r;
	}
	*out = g->by_rank[rank];
	return 0;
}

int catalog_read_all(struct store *s, const char *job, struct catalog_step *cs)
{
	if (cs->best < 0)
		return 0;
	struct catalog_group *g = &cs->groups[cs->best];
	int first = 0;
	for (uint32_t rank = 0; rank < g->world_size; rank++) {
		if (!g->present[rank] || g->by_rank[rank])
			continue;
		const Ckpt__Manifest *m;
		char err[512];
		int r = catalog_read_manifest(s, job, cs, rank, &m, err, sizeof(err));
		if (r < 0) {
			log_warn("catalog: %s", err);
			cs->unreadable++;
			if (r != -EBADMSG && first == 0) {
				store_set_error("%s", err);
				first = r;
			}
		}
	}
	return first;
}

/* ---- the step index ---- */

struct index_fetch {
	struct store *s;
	const char *key, *job, *attempt;
	uint64_t step;
	uint32_t ws;
	const struct catalog_listed *listed; /* the index as listed */
};

static void mark_bad_index(const char *key, const struct catalog_listed *l, const char *err);

/* GET and check a whole index: every manifest passes manifest_check, is
 * of this step and attempt, and ranks 0..ws-1 are there once each. */
static int fetch_index(void *ctx, Ckpt__StepIndex **out, char *err, size_t errlen)
{
	struct index_fetch *f = ctx;
	void *buf = NULL;
	size_t len = 0;
	atomic_fetch_add(&index_gets, 1);
	int r = f->s->ops->get_all(f->s, f->key, STEP_INDEX_MAX_BYTES, &buf, &len);
	if (r == -EFBIG) {
		snprintf(err, errlen, "%s: larger than %u bytes", f->key, STEP_INDEX_MAX_BYTES);
		mark_bad_index(f->key, f->listed, err);
		return -EBADMSG;
	}
	if (r < 0) {
		snprintf(err, errlen, "reading %s: %s", f->key, store_error(r));
		return r;
	}
	Ckpt__StepIndex *ix = ckpt__step_index__unpack(NULL, len, buf);
	free(buf);
	if (ix == NULL) {
		snprintf(err, errlen, "%s: does not parse", f->key);
		mark_bad_index(f->key, f->listed, err);
		return -EBADMSG;
	}
	_cleanup_free_ bool *seen = NULL;
	if (ix->format_version != STEP_INDEX_FORMAT_VERSION || strcmp(ix->job, f->job) != 0 || ix->step != f->step ||
	    strcmp(ix->attempt_id, f->attempt) != 0 || ix->world_size != f->ws || ix->n_manifests != f->ws) {
		snprintf(err, errlen,
			 "%s: format %u, job '%s' step %" PRIu64 " attempt '%s' with %zu of %u ranks; "
			 "not this step's pinned attempt '%s' of %u ranks",
			 f->key, ix->format_version, ix->job, ix->step, ix->attempt_id, ix->n_manifests, ix->world_size,
			 f->attempt, f->ws);
		goto bad;
	}
	seen = calloc(f->ws, sizeof(*seen));
	if (seen == NULL) {
		ckpt__step_index__free_unpacked(ix, NULL);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (size_t i = 0; i < ix->n_manifests; i++) {
		const Ckpt__Manifest *m = ix->manifests[i];
		char why[256];
		if (manifest_check(m, why, sizeof(why)) < 0) {
			snprintf(err, errlen, "%s: manifest %zu: %s", f->key, i, why);
			goto bad;
		}
		if (strcmp(m->job, f->job) != 0 || m->step != f->step || m->world_size != f->ws ||
		    strcmp(m->attempt_id, f->attempt) != 0 || m->rank >= f->ws || seen[m->rank]) {
			snprintf(err, errlen,
				 "%s: manifest %zu (job '%s' step %" PRIu64 " rank %u of %u attempt '%s') "
				 "is not one more rank of this step",
				 f->key, i, m->job, m->step, m->rank, m->world_size, m->attempt_id);
			goto bad;
		}
		seen[m->rank] = true;
	}
	*out = ix;
	return 0;
bad:
	ckpt__step_index__free_unpacked(ix, NULL);
	/* Known bad before the fetch ends: a rank that comes after this one
	 * (no longer sharing its GET) does not GET it again. */
	mark_bad_index(f->key, f->listed, err);
	return -EBADMSG;
}

/* Damaged indexes (by name, listed time and size) this process found:
 * warned about once, and not read again, not on every show that falls
 * back past them. */
static pthread_mutex_t bad_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
	char key[768];
	struct catalog_listed l;
} bad_index[16];
static unsigned bad_next;

static bool index_known_bad(const char *key, const struct catalog_listed *l)
{
	bool bad = false;
	pthread_mutex_lock(&bad_mu);
	for (unsigned i = 0; i < 16 && !bad; i++)
		bad = strcmp(bad_index[i].key, key) == 0 && bad_index[i].l.mtime_ns == l->mtime_ns &&
		      bad_index[i].l.size == l->size;
	pthread_mutex_unlock(&bad_mu);
	return bad;
}

static void mark_bad_index(const char *key, const struct catalog_listed *l, const char *err)
{
	if (index_known_bad(key, l))
		return;
	pthread_mutex_lock(&bad_mu);
	unsigned i = bad_next++ % 16;
	snprintf(bad_index[i].key, sizeof(bad_index[i].key), "%s", key);
	bad_index[i].l = *l;
	pthread_mutex_unlock(&bad_mu);
	log_warn("catalog: %s; ignored, the manifests are read instead", err);
}

/* by_rank of the best group from the index: 0, or why not (then nothing
 * changed but cs->index_ref, released). */
static int use_index(struct store *s, const char *job, struct catalog_step *cs, const char *key)
{
	struct catalog_group *g = &cs->groups[cs->best];
	char err[512];
	if (index_known_bad(key, &cs->index_listed))
		return -EBADMSG;
	if (cs->index_listed.size > STEP_INDEX_MAX_BYTES) {
		snprintf(err, sizeof(err), "%s: larger than %u bytes", key, STEP_INDEX_MAX_BYTES);
		mark_bad_index(key, &cs->index_listed, err);
		return -EBADMSG;
	}
	struct index_fetch f = { s, key, job, g->attempt, cs->step, g->world_size, &cs->index_listed };
	const Ckpt__StepIndex *ix;
	int r = mancache_get_index(cs->cache, key, cs->index_listed.mtime_ns, cs->index_listed.size, fetch_index, &f,
				   &ix, &cs->index_ref, err, sizeof(err));
	if (r < 0 && r != -ENOENT && r != -EBADMSG) /* a bad one was marked by fetch_index */
		log_warn("catalog: %s; the manifests are read instead", err);
	if (r < 0) {
		cs->index_ref = NULL;
		return r;
	}
	/* Kept entries were checked by fetch_index against the same names. */
	if (ix->world_size != g->world_size || ix->n_manifests != g->world_size ||
	    strcmp(ix->attempt_id, g->attempt) != 0) {
		mancache_release(cs->cache, cs->index_ref);
		cs->index_ref = NULL;
		return -EBADMSG;
	}
	/* Manifests this group read before take their leave: the index's
	 * stand in for them all. */
	for (uint32_t r = 0; r < g->world_size; r++) {
		if (g->cached && g->cached[r]) {
			mancache_release(cs->cache, g->cached[r]);
			g->cached[r] = NULL;
		} else if (g->by_rank[r]) {
			ckpt__manifest__free_unpacked(g->by_rank[r], NULL);
		}
		g->by_rank[r] = NULL;
	}
	for (size_t i = 0; i < ix->n_manifests; i++)
		g->by_rank[ix->manifests[i]->rank] = ix->manifests[i]; /* read only: catalog.h */
	g->from_index = true;
	return 0;
}

/* Whether this process already created (or tried to) the index of this
 * step as listed: the ranks of a node that show a step at once all find
 * it without an index, and one PUT between them is enough. A step saved
 * again lists another manifest time. */
static bool index_tried(const char *key, const struct catalog_group *g)
{
	static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	static struct {
		char key[768];
		char attempt[ATTEMPT_BUF];
		int64_t mtime_ns;
	} recent[16];
	static unsigned next;
	bool seen = false;
	pthread_mutex_lock(&mu);
	for (unsigned i = 0; i < 16 && !seen; i++)
		seen = strcmp(recent[i].key, key) == 0 && strcmp(recent[i].attempt, g->attempt) == 0 &&
		       recent[i].mtime_ns == g->listed[0].mtime_ns;
	if (!seen) {
		unsigned i = next++ % 16;
		snprintf(recent[i].key, sizeof(recent[i].key), "%s", key);
		snprintf(recent[i].attempt, sizeof(recent[i].attempt), "%s", g->attempt);
		recent[i].mtime_ns = g->listed[0].mtime_ns;
	}
	pthread_mutex_unlock(&mu);
	return seen;
}

/* Create the index of a step whose manifests are all in by_rank. Another
 * node's index (EEXIST) and read-only credentials are fine: it is a
 * cache. */
static void write_index(struct store *s, const char *job, const struct catalog_step *cs, const char *key)
{
	const struct catalog_group *g = &cs->groups[cs->best];
	_cleanup_free_ Ckpt__Manifest **ms = calloc(g->world_size, sizeof(*ms));
	/* by_rank may be the cache's: read only */
	_cleanup_free_ Ckpt__Manifest *copy = calloc(g->world_size, sizeof(*copy));
	if (ms == NULL || copy == NULL)
		return;
	for (uint32_t r = 0; r < g->world_size; r++) {
		if (g->by_rank[r] == NULL)
			return;
		copy[r] = *g->by_rank[r];
		copy[r].extra_state.len = 0; /* show never returns it */
		copy[r].extra_state.data = NULL;
		/* Nor does it read the shard: its pieces (about 100 bytes per
		 * 4 MiB with references) would make a large step's index pass
		 * STEP_INDEX_MAX_BYTES. Without them the copy is format 1. */
		copy[r].n_pieces = 0;
		copy[r].pieces = NULL;
		copy[r].n_refs = 0;
		copy[r].refs = NULL;
		copy[r].piece_bytes = 0;
		if (copy[r].format_version == MANIFEST_FORMAT_PIECES)
			copy[r].format_version = MANIFEST_FORMAT_VERSION;
		ms[r] = &copy[r];
	}
	Ckpt__StepIndex ix = CKPT__STEP_INDEX__INIT;
	ix.format_version = STEP_INDEX_FORMAT_VERSION;
	ix.job = (char *)job;
	ix.step = cs->step;
	ix.attempt_id = (char *)g->attempt;
	ix.world_size = g->world_size;
	ix.n_manifests = g->world_size;
	ix.manifests = ms;
	size_t len = ckpt__step_index__get_packed_size(&ix);
	if (len > STEP_INDEX_MAX_BYTES) {
		log_info("catalog: %s step %" PRIu64 ": its index would be %zu bytes, over %u: not written", job,
			 cs->step, len, STEP_INDEX_MAX_BYTES);
		return;
	}
	_cleanup_free_ uint8_t *buf = malloc(len ? len : 1);
	if (buf == NULL)
		return;
	ckpt__step_index__pack(&ix, buf);
	struct iovec iov = { buf, len };
	atomic_fetch_add(&index_puts, 1);
	int r = store_create_announced(s, key, &iov, 1);
	if (r == 0)
		log_info("catalog: %s step %" PRIu64 ": index written (%u manifests, %zu bytes)", job, cs->step,
			 g->world_size, len);
	else if (r != -EEXIST && r != -EACCES && r != -EPERM && r != -EROFS)
		log_warn("catalog: writing %s: %s", key, store_error(r));
}

int catalog_read_all_indexed(struct store *s, const char *job, struct catalog_step *cs)
{
	if (cs->best < 0 || cs->cache == NULL || !cs->pinned || !catalog_step_complete(cs) ||
	    cs->groups[cs->best].legacy)
		return catalog_read_all(s, job, cs);
	char key[768];
	if (manifest_index_key(key, sizeof(key), job, cs->step) < 0)
		return catalog_read_all(s, job, cs);
	if (cs->has_index && use_index(s, job, cs, key) == 0)
		return 0;
	int r = catalog_read_all(s, job, cs);
	if (r == 0 && !cs->has_index && cs->unreadable == 0 && !index_tried(key, &cs->groups[cs->best]))
		write_index(s, job, cs, key);
	return r;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* The step directories' numbers under dir, ascending; a dir that is not
 * there has none where missing_ok, else is -ENOENT. */
static int steps_under(struct store *s, const char *dir, bool missing_ok, uint64_t **steps, size_t *count)
{
	char **names = NULL;
	size_t n = 0;
	*steps = NULL;
	*count = 0;
	int r = s->ops->list(s, dir, &names, &n);
	if (r == -ENOENT && missing_ok)
		n = 0;
	else if (r < 0)
		return r;
	uint64_t *v = malloc((n ? n : 1) * sizeof(*v));
	if (v == NULL) {
		store_names_free(names, n);
		return -ENOMEM;
	}
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		if (manifest_parse_step_dir(names[i], &v[k]) == 0)
			k++;
	store_names_free(names, n);
	qsort(v, k, sizeof(*v), cmp_u64);
	*steps = v;
	*count = k;
	return 0;
}

int catalog_ref_steps(struct store *s, const char *job, uint64_t **steps, size_t *n)
{
	char dir[512];
	int r = snprintf(dir, sizeof(dir), "%s/" REFS_DIR, job);
	if (r < 0 || (size_t)r >= sizeof(dir))
		return -ENAMETOOLONG;
	return steps_under(s, dir, true, steps, n);
}

int catalog_refs_of(struct store *s, const char *job, uint64_t step, uint64_t **targets, size_t *n)
{
	char dir[512];
	int r = manifest_refs_dir(dir, sizeof(dir), job, step);
	return r < 0 ? r : steps_under(s, dir, true, targets, n);
}

static bool has_step(const uint64_t *v, size_t n, uint64_t step)
{
	return bsearch(&step, v, n, sizeof(*v), cmp_u64) != NULL;
}

bool catalog_step_kept(struct store *s, const char *job, uint64_t step)
{
	char dir[600];
	char **names = NULL;
	size_t n = 0;
	if (manifest_step_dir(dir, sizeof(dir), job, step) < 0 || s->ops->list(s, dir, &names, &n) < 0)
		return false;
	bool kept = false;
	for (size_t i = 0; i < n && !kept; i++)
		kept = manifest_is_marker(names[i]);
	store_names_free(names, n);
	return kept;
}

int catalog_referrer(struct store *s, const char *job, uint64_t target, uint64_t *by)
{
	uint64_t *refs = NULL;
	size_t nrefs = 0;
	int r = catalog_ref_steps(s, job, &refs, &nrefs);
	int found = -ENOENT;
	/* Refs count whether or not their step's manifests are there yet: a
	 * save writes them first. */
	for (size_t i = nrefs; i-- > 0 && r == 0 && found == -ENOENT;) {
		if (refs[i] <= target)
			break; /* a step refers only to older ones */
		uint64_t *t = NULL;
		size_t nt = 0;
		r = catalog_refs_of(s, job, refs[i], &t, &nt);
		if (r == 0 && has_step(t, nt, target)) {
			*by = refs[i];
			found = 0;
		}
		free(t);
	}
	free(refs);
	return r < 0 ? r : found;
}

int catalog_steps(struct store *s, const char *job, uint64_t **steps, size_t *count)
{
	return steps_under(s, job, false, steps, count);
}

int catalog_latest(struct store *s, const char *job, struct catalog_step *out)
{
	uint64_t *steps = NULL;
	size_t n = 0;
	int r = catalog_steps(s, job, &steps, &n);
	if (r < 0)
		return r;
	r = -ENOENT;
	for (size_t i = n; i-- > 0;) {
		int e = catalog_resolve_step(s, job, steps[i], out);
		if (e == -ENOENT)
			continue; /* a directory with no manifest (yet) */
		if (e < 0) {
			r = e;
			break;
		}
		if (out->unreadable) {
			/* A manifest that exists and cannot be read might make
			 * this step complete: never guess past it. */
			store_set_error("step %" PRIu64
					" of job '%s' has %u unreadable manifest(s); not deciding which "
					"step is latest past it",
					steps[i], job, out->unreadable);
			catalog_step_free(out);
			r = -EBADMSG;
			break;
		}
		if (catalog_step_complete(out)) {
			r = 0;
			break;
		}
		catalog_step_free(out);
	}
	free(steps);
	return r;
}

const char *catalog_no_fallback_hint(int r)
{
	return r == -EBADMSG ? "not retryable: that object is damaged; no older step is taken instead; to restore "
			       "an older one, remove its step with ckptctl rm"
			     : "retry; no older step is taken instead";
}

int catalog_jobs(struct store *s, const char *tenant, char ***jobs, size_t *n)
{
	char **names = NULL;
	size_t k = 0;
	int r = s->ops->list(s, tenant ? tenant : "", &names, &k);
	if (r < 0)
		return r;
	size_t w = 0;
	for (size_t i = 0; i < k; i++) {
		char *q = NULL;
		if (manifest_name_valid(names[i], JOB_MAX_LEN) && tenant && tenant[0]) {
			size_t len = strlen(tenant) + strlen(names[i]) + 2;
			if ((q = malloc(len)) == NULL) {
				/* Not a job left out of the listing: an error. */
				for (size_t j = 0; j < w; j++)
					free(names[j]);
				for (size_t j = i; j < k; j++)
					free(names[j]);
				free(names);
				return -ENOMEM;
			}
			snprintf(q, len, "%s/%s", tenant, names[i]);
		}
		if (q && manifest_job_valid(q)) {
			free(names[i]);
			names[w++] = q;
			continue;
		}
		free(q);
		if (manifest_name_valid(names[i], JOB_MAX_LEN) && !(tenant && tenant[0]))
			names[w++] = names[i];
		else
			free(names[i]);
	}
	*jobs = names;
	*n = w;
	return 0;
}
