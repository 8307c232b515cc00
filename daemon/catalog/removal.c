/* Removing a step (catalog.h catalog_delete_step; docs/architecture.md
 * "References between steps", "Removal" and "What a removal leaves").
 *
 * A step may hold several attempts (a run restarted from an older step
 * saves it again under a new attempt id), and a save writes its refs and
 * shard before its manifest. So a removal decides per attempt, from
 * listings made before anything goes:
 *  - it takes an attempt a marker names (a removal took it before), a
 *    complete one (CATALOG_REMOVE only), and an incomplete one whose every
 *    object is older than the in-flight window (a save that died);
 *  - it leaves an incomplete attempt with a younger object: a save of this
 *    step may be writing it on another node.
 * Before the first object of an attempt goes, "kept.<attempt>" marks it
 * (create-only), naming its manifests whose shards are in spread
 * directories; so a removal cut short is finished as it was meant, and
 * never takes an attempt it did not decide on. Then go the taken
 * attempts' manifests, the commit and index, and, unless another step
 * refers to this one, their shards and refs, and their markers last.
 * What is left keeps "kept" (KEPT_NAME), so that retention finishes the
 * step later (gc.c finish_kept).
 *
 * Requests per removed step: a LIST of its directory, of its refs (and
 * one per step it refers to), of each spread directory its manifests
 * point to, a GET per marker there, a PUT and a DELETE per marker, and a
 * DELETE per object: flat in the world size but for the objects
 * themselves. */
#include "catalog.h"
#include "clock.h"
#include "log.h"
#include "macro.h"
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* "kept.<attempt>": an attempt a removal took. */
#define MARK_PREFIX KEPT_NAME "."

uint64_t catalog_in_flight_s(uint64_t incomplete_grace_s)
{
	return incomplete_grace_s ? incomplete_grace_s : CATALOG_SPARE_S;
}

/* What a removal knows of one attempt of the step. */
struct attempt {
	char id[ATTEMPT_BUF]; /* "" for format 1 names */
	int64_t newest_ns;    /* its newest object's time, as listed; 0: none known */
	size_t objects;       /* its manifests, shards and refs listed */
	bool marked;          /* a marker names it: a removal took it before */
	bool has_mark;        /* KEPT_NAME ".<id>" is there (listed, or written here) */
	bool has_dead;        /* DEAD_NAME ".<id>" is there (listed, or written here) */
	int64_t mark_ns;      /* the time of the marker that marked it (0: not known) */
	int64_t dead_ns;      /* when that was written (0: here, now) */
	bool complete;        /* a manifest for every rank of one world size */
	bool taken;
	bool by_age; /* taken as a dead save's: incomplete, every object older than the window */
	/* Its manifests listed, per world size (the first few). */
	uint32_t ws[4], nman[4];
	size_t nws;
};

/* One listed directory: its prefix and what was in it. */
struct listed {
	char dir[600];
	struct store_entry *v;
	size_t n;
};

struct removal {
	struct store *s;
	const char *job;
	uint64_t step;
	char dir[512];
	int64_t now_ns;
	enum catalog_removal_mode mode;
	int64_t in_flight_ns;
	struct attempt *a;
	size_t na;
	struct listed here, *spread, *refs; /* here: the step directory */
	size_t nspread, nrefs;
	char **marked_manifests; /* named by markers: their spread directories */
	size_t nmarked_manifests;
	bool legacy_kept;  /* KEPT_NAME listed (an older ckptd's marker) */
	int64_t legacy_ns; /* its time */
	bool left_mark;    /* LEFT_NAME listed */
	bool manifests;    /* a manifest listed */
	bool no_dir;       /* the step's directory was not there */
};

static void removal_free(struct removal *rm)
{
	free(rm->a);
	store_entries_free(rm->here.v, rm->here.n);
	for (size_t i = 0; i < rm->nspread; i++)
		store_entries_free(rm->spread[i].v, rm->spread[i].n);
	for (size_t i = 0; i < rm->nrefs; i++)
		store_entries_free(rm->refs[i].v, rm->refs[i].n);
	free(rm->spread);
	free(rm->refs);
	store_names_free(rm->marked_manifests, rm->nmarked_manifests);
}

static struct attempt *find(const struct removal *rm, const char *id)
{
	for (size_t i = 0; i < rm->na; i++)
		if (strcmp(rm->a[i].id, id) == 0)
			return &rm->a[i];
	return NULL;
}

/* The attempt id, added if new; NULL when out of memory or id is too long. */
static struct attempt *attempt_of(struct removal *rm, const char *id)
{
	struct attempt *a = find(rm, id);
	if (a != NULL || strlen(id) >= ATTEMPT_BUF)
		return a;
	struct attempt *v = realloc(rm->a, (rm->na + 1) * sizeof(*v));
	if (v == NULL)
		return NULL;
	rm->a = v;
	a = &v[rm->na++];
	memset(a, 0, sizeof(*a));
	snprintf(a->id, sizeof(a->id), "%s", id);
	return a;
}

/* An object of attempt id, last modified at mtime_ns. */
static int seen(struct removal *rm, const char *id, int64_t mtime_ns)
{
	struct attempt *a = attempt_of(rm, id);
	if (a == NULL)
		return -ENOMEM;
	if (mtime_ns > a->newest_ns)
		a->newest_ns = mtime_ns;
	a->objects++;
	return 0;
}

static bool takes(const struct removal *rm, const char *id)
{
	const struct attempt *a = find(rm, id);
	return a != NULL && a->taken;
}

/* The attempt of a ref's name, "rank-R-of-W.<attempt>" (manifest_ref_key);
 * NULL if it is not one. */
static const char *ref_attempt(const char *name)
{
	unsigned rank, ws;
	int at = 0;
	if (sscanf(name, "rank-%5u-of-%5u.%n", &rank, &ws, &at) != 2 || at == 0 ||
	    !manifest_name_valid(name + at, ATTEMPT_MAX_LEN))
		return NULL; /* a stray name: no attempt's */
	return name + at;
}

/* List dir into a new entry of *v. 0 (also when dir is not there: no
 * entry) or -errno. */
static int list_into(struct store *s, const char *dir, struct listed **v, size_t *n)
{
	struct store_entry *e = NULL;
	size_t ne = 0;
	int r = s->ops->list_entries(s, dir, &e, &ne);
	if (r == -ENOENT)
		return 0;
	if (r < 0)
		return r;
	struct listed *nv = realloc(*v, (*n + 1) * sizeof(*nv));
	if (nv == NULL) {
		store_entries_free(e, ne);
		return -ENOMEM;
	}
	*v = nv;
	snprintf(nv[*n].dir, sizeof(nv[*n].dir), "%s", dir);
	nv[*n].v = e;
	nv[*n].n = ne;
	(*n)++;
	return 0;
}

/* A marker's lines: manifest names (others are ignored), kept for the
 * spread directories; with attempt NULL (KEPT_NAME, written by an older
 * ckptd, naming every manifest it took) their attempts are marked. */
static int read_marker(struct removal *rm, const char *name, const char *attempt)
{
	char key[768];
	void *buf = NULL;
	size_t len = 0;
	snprintf(key, sizeof(key), "%s/%s", rm->dir, name);
	int r = rm->s->ops->get_all(rm->s, key, 16u << 20, &buf, &len);
	if (r < 0)
		return r == -ENOENT ? 0 : r;
	struct step_name sn;
	for (char *line = buf, *end = (char *)buf + len; line < end && r == 0;) {
		char *nl = memchr(line, '\n', (size_t)(end - line));
		size_t k = nl ? (size_t)(nl - line) : (size_t)(end - line);
		char one[600];
		if (k > 0 && k < sizeof(one)) {
			memcpy(one, line, k);
			one[k] = '\0';
			manifest_parse_object(one, &sn);
			if (sn.kind == OBJ_MANIFEST && (attempt == NULL || strcmp(sn.attempt, attempt) == 0)) {
				char **v = realloc(rm->marked_manifests, (rm->nmarked_manifests + 1) * sizeof(*v));
				if (v == NULL || (v[rm->nmarked_manifests] = strdup(one)) == NULL) {
					if (v)
						rm->marked_manifests = v;
					r = -ENOMEM;
					break;
				}
				rm->marked_manifests = v;
				rm->nmarked_manifests++;
				struct attempt *a = attempt == NULL ? attempt_of(rm, sn.attempt) : NULL;
				if (attempt == NULL && a == NULL)
					r = -ENOMEM;
				else if (a != NULL)
					a->marked = true;
			}
		}
		line = nl ? nl + 1 : end;
	}
	free(buf);
	return r;
}

/* The step directory's entries: every attempt's objects and markers. */
static int scan_step(struct removal *rm)
{
	struct step_name sn;
	int r = 0;
	for (size_t i = 0; i < rm->here.n && r == 0; i++) {
		const struct store_entry *e = &rm->here.v[i];
		const char *mark = manifest_kept_attempt(e->name), *dead = manifest_dead_attempt(e->name);
		manifest_parse_object(e->name, &sn);
		if (dead != NULL) {
			struct attempt *a = attempt_of(rm, dead);
			if (a == NULL)
				return -ENOMEM;
			a->has_dead = true;
			a->dead_ns = e->mtime_ns;
		} else if (mark != NULL) {
			struct attempt *a = attempt_of(rm, mark);
			if (a == NULL)
				return -ENOMEM;
			a->marked = a->has_mark = true;
			a->mark_ns = e->mtime_ns;
			r = read_marker(rm, e->name, mark);
		} else if (strcmp(e->name, KEPT_NAME) == 0) {
			rm->legacy_kept = true;
			rm->legacy_ns = e->mtime_ns;
			r = read_marker(rm, e->name, NULL);
		} else if (strcmp(e->name, LEFT_NAME) == 0) {
			rm->left_mark = true;
		} else if (sn.kind == OBJ_MANIFEST || sn.kind == OBJ_SHARD) {
			rm->manifests |= sn.kind == OBJ_MANIFEST;
			r = seen(rm, sn.attempt, e->mtime_ns);
			struct attempt *a = find(rm, sn.attempt);
			if (r == 0 && sn.kind == OBJ_MANIFEST && a != NULL) {
				size_t g = 0;
				while (g < a->nws && a->ws[g] != sn.world_size)
					g++;
				if (g == a->nws && g < ELEMENTSOF(a->ws))
					a->ws[a->nws++] = sn.world_size;
				if (g < a->nws)
					a->nman[g]++;
			}
		}
	}
	return r;
}

/* The step's refs: one listing of what it refers to, one per step there. */
static int scan_refs(struct removal *rm)
{
	char dir[512], sub[600];
	int r = manifest_refs_dir(dir, sizeof(dir), rm->job, rm->step);
	if (r < 0)
		return r;
	uint64_t *t = NULL;
	size_t nt = 0;
	if ((r = catalog_refs_of(rm->s, rm->job, rm->step, &t, &nt)) < 0)
		return r;
	for (size_t i = 0; i < nt && r == 0; i++) {
		snprintf(sub, sizeof(sub), "%s/step-%012" PRIu64, dir, t[i]);
		r = list_into(rm->s, sub, &rm->refs, &rm->nrefs);
	}
	free(t);
	for (size_t i = 0; i < rm->nrefs && r == 0; i++)
		for (size_t k = 0; k < rm->refs[i].n && r == 0; k++) {
			const char *id = ref_attempt(rm->refs[i].v[k].name);
			if (id != NULL)
				r = seen(rm, id, rm->refs[i].v[k].mtime_ns);
		}
	return r;
}

static int cmp_str_ptr(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Whether manifest name (a listed one) has no shard of its own (rank,
 * world size, attempt) beside it: its shard is in its spread directory.
 * local: the "rank-R-of-W.<attempt>" of every shard listed, sorted. */
static bool spread_of(const char *name, char **local, size_t nlocal)
{
	struct step_name sn;
	char id[256];
	manifest_parse_object(name, &sn);
	if (sn.kind != OBJ_MANIFEST || sn.attempt[0] == '\0')
		return false;
	snprintf(id, sizeof(id), "rank-%05u-of-%05u.%s", sn.rank, sn.world_size, sn.attempt);
	const char *key = id;
	return bsearch(&key, local, nlocal, sizeof(*local), cmp_str_ptr) == NULL;
}

/* The shards of every listed shard, as spread_of wants them; NULL when
 * out of memory. */
static char **local_shards(const struct removal *rm, size_t *n)
{
	char **local = calloc(rm->here.n ? rm->here.n : 1, sizeof(*local));
	*n = 0;
	if (local == NULL)
		return NULL;
	struct step_name sn;
	char id[256];
	for (size_t i = 0; i < rm->here.n; i++) {
		manifest_parse_object(rm->here.v[i].name, &sn);
		if (sn.kind != OBJ_SHARD || sn.attempt[0] == '\0')
			continue;
		snprintf(id, sizeof(id), "rank-%05u-of-%05u.%s", sn.rank, sn.world_size, sn.attempt);
		if ((local[*n] = strdup(id)) == NULL) {
			store_names_free(local, *n);
			return NULL;
		}
		(*n)++;
	}
	qsort(local, *n, sizeof(*local), cmp_str_ptr);
	return local;
}

/* Decide each attempt (the file's comment); how many are left. An
 * object whose time is not known counts as young. */
static size_t decide(struct removal *rm)
{
	size_t left = 0;
	for (size_t i = 0; i < rm->na; i++) {
		struct attempt *a = &rm->a[i];
		a->complete = false;
		for (size_t g = 0; g < a->nws; g++)
			a->complete |= a->nman[g] == a->ws[g];
		bool young = a->newest_ns <= 0 || rm->now_ns - a->newest_ns < rm->in_flight_ns;
		/* A marker is a removal's decision on what it listed then: an
		 * object written after it is a new save of the attempt (its
		 * step saved again), decided on as any other. */
		int64_t mark_ns = a->mark_ns ? a->mark_ns : rm->legacy_ns;
		bool marked = a->marked && !(mark_ns > 0 && a->newest_ns > mark_ns);
		a->by_age = false;
		if (rm->mode == CATALOG_FORCE || marked)
			a->taken = true;
		else if (a->objects == 0)
			a->taken = false; /* only markers of it */
		else if (a->complete)
			a->taken = rm->mode == CATALOG_REMOVE;
		else
			a->taken = a->by_age = !young;
		left += !a->taken && !a->complete && a->objects > 0;
	}
	return left;
}

/* Layout spread: a manifest listed with no shard beside it, or one a
 * marker names, keeps its shard in its rank's spread directory. One LIST
 * per such directory of an attempt to be taken (at most SPREAD_FANOUT,
 * W / 256 names each): no manifest is read. After scan_refs. */
static int scan_spread(struct removal *rm)
{
	bool want[SPREAD_FANOUT] = { false };
	size_t nlocal;
	char **local = local_shards(rm, &nlocal);
	if (local == NULL)
		return -ENOMEM;
	struct step_name sn;
	/* Only the directories of attempts it would take: what the step's
	 * directory and refs say (decide), which a young shard there may yet
	 * turn (the caller decides again). */
	(void)decide(rm);
	for (size_t i = 0; i < rm->here.n; i++)
		if (spread_of(rm->here.v[i].name, local, nlocal)) {
			manifest_parse_object(rm->here.v[i].name, &sn);
			want[sn.rank % SPREAD_FANOUT] |= takes(rm, sn.attempt);
		}
	for (size_t i = 0; i < rm->nmarked_manifests; i++) {
		manifest_parse_object(rm->marked_manifests[i], &sn);
		want[sn.rank % SPREAD_FANOUT] = true;
	}
	/* A rank with refs and no shard beside them may have one there and
	 * no manifest yet (or ever: its save died). A spread shard of
	 * neither is not found. */
	for (size_t i = 0; i < rm->nrefs; i++)
		for (size_t k = 0; k < rm->refs[i].n; k++) {
			const char *name = rm->refs[i].v[k].name, *id = ref_attempt(name);
			unsigned rank, ws;
			if (id != NULL && takes(rm, id) && sscanf(name, "rank-%5u-of-%5u.", &rank, &ws) == 2 &&
			    bsearch(&name, local, nlocal, sizeof(*local), cmp_str_ptr) == NULL)
				want[rank % SPREAD_FANOUT] = true;
		}
	store_names_free(local, nlocal);
	int r = 0;
	for (uint32_t h = 0; h < SPREAD_FANOUT && r == 0; h++) {
		char dir[600], sd[64];
		if (!want[h])
			continue;
		if (manifest_spread_dir(sd, sizeof(sd), h, rm->step) < 0 ||
		    snprintf(dir, sizeof(dir), "%s/%s", rm->job, sd) >= (int)sizeof(dir))
			return -ENAMETOOLONG;
		r = list_into(rm->s, dir, &rm->spread, &rm->nspread);
	}
	for (size_t i = 0; i < rm->nspread && r == 0; i++)
		for (size_t k = 0; k < rm->spread[i].n && r == 0; k++) {
			manifest_parse_object(rm->spread[i].v[k].name, &sn);
			if (sn.kind == OBJ_SHARD)
				r = seen(rm, sn.attempt, rm->spread[i].v[k].mtime_ns);
		}
	return r;
}

/* Mark each taken attempt before anything of it goes (create-only: one
 * there already was written by a removal before any of its objects went,
 * from a listing made before that):
 * - taken by age: DEAD_NAME ".<id>", the handshake with a slow save of it
 *   (look_again; upload.c check_not_taken);
 * - else KEPT_NAME ".<id>", naming its listed manifests whose shards are
 *   in spread directories. */
static int mark_taken(struct removal *rm)
{
	size_t nlocal;
	char **local = local_shards(rm, &nlocal);
	if (local == NULL)
		return -ENOMEM;
	int r = 0;
	for (size_t i = 0; i < rm->na && r == 0; i++) {
		struct attempt *a = &rm->a[i];
		if (!a->taken || a->id[0] == '\0')
			continue;
		if (a->by_age) {
			/* Written anew (its time and the one it holds are now), so
			 * that it lasts twice the window from this removal on. */
			char key[768], now[32];
			snprintf(key, sizeof(key), "%s/" DEAD_NAME ".%s", rm->dir, a->id);
			struct iovec iov = { now, (size_t)snprintf(now, sizeof(now), "%" PRId64, clock_wall_ns()) };
			r = store_put_announced(rm->s, key, &iov, 1);
			a->has_dead = r == 0;
			a->dead_ns = 0; /* now: drop_dead leaves it */
			continue;
		}
		if (a->has_mark)
			continue;
		size_t len = 0;
		struct step_name sn;
		for (size_t k = 0; k < rm->here.n; k++) {
			manifest_parse_object(rm->here.v[k].name, &sn);
			if (strcmp(sn.attempt, a->id) == 0 && spread_of(rm->here.v[k].name, local, nlocal))
				len += strlen(rm->here.v[k].name) + 1;
		}
		char *body = malloc(len + 1), key[768];
		if (body == NULL) {
			r = -ENOMEM;
			break;
		}
		size_t at = 0;
		for (size_t k = 0; k < rm->here.n; k++) {
			manifest_parse_object(rm->here.v[k].name, &sn);
			if (strcmp(sn.attempt, a->id) == 0 && spread_of(rm->here.v[k].name, local, nlocal))
				at += (size_t)sprintf(body + at, "%s\n", rm->here.v[k].name);
		}
		snprintf(key, sizeof(key), "%s/" MARK_PREFIX "%s", rm->dir, a->id);
		struct iovec iov = { body, at };
		r = store_create_announced(rm->s, key, &iov, 1);
		free(body);
		if (r == -EEXIST)
			r = 0;
		a->has_mark = r == 0;
	}
	store_names_free(local, nlocal);
	return r;
}

static int remove_key(struct removal *rm, const char *dir, const char *name, int err)
{
	char key[900];
	snprintf(key, sizeof(key), "%s/%s", dir, name);
	int r = rm->s->ops->remove(rm->s, key);
	return err == 0 && r < 0 && r != -ENOENT ? r : err;
}

/* The taken attempts' shards of l (a spread directory), then l if empty. */
static int remove_spread(struct removal *rm, const struct listed *l, int err)
{
	struct step_name sn;
	for (size_t i = 0; i < l->n; i++) {
		manifest_parse_object(l->v[i].name, &sn);
		if (sn.kind == OBJ_SHARD && takes(rm, sn.attempt))
			err = remove_key(rm, l->dir, l->v[i].name, err);
	}
	int r = rm->s->ops->remove_dir(rm->s, l->dir);
	return err == 0 && r < 0 && r != -ENOTEMPTY && r != -EEXIST && r != -ENOENT ? r : err;
}

/* The taken attempts' refs; they go after the shards: while the step's
 * manifests were there, they kept what it refers to. */
static int remove_refs(struct removal *rm, int err)
{
	for (size_t i = 0; i < rm->nrefs; i++) {
		const struct listed *l = &rm->refs[i];
		for (size_t k = 0; k < l->n; k++) {
			const char *id = ref_attempt(l->v[k].name);
			if (id != NULL && takes(rm, id))
				err = remove_key(rm, l->dir, l->v[k].name, err);
		}
		(void)rm->s->ops->remove_dir(rm->s, l->dir);
	}
	char dir[512];
	if (manifest_refs_dir(dir, sizeof(dir), rm->job, rm->step) == 0)
		(void)rm->s->ops->remove_dir(rm->s, dir);
	return err;
}

/* LEFT_NAME, unless listed: the step is to be finished later (gc.c
 * finish_kept, which looks for any marker). */
static int come_back(struct removal *rm)
{
	if (rm->left_mark)
		return 0;
	char key[768];
	snprintf(key, sizeof(key), "%s/" LEFT_NAME, rm->dir);
	int r = store_create_announced(rm->s, key, NULL, 0);
	rm->left_mark = r == 0 || r == -EEXIST;
	return r == -EEXIST ? 0 : r;
}

/* The markers that only said "come back" (LEFT_NAME, an older ckptd's
 * KEPT_NAME), once nothing is left. */
static int unmark_step(struct removal *rm, int err)
{
	if (rm->left_mark)
		err = remove_key(rm, rm->dir, LEFT_NAME, err);
	if (rm->legacy_kept)
		err = remove_key(rm, rm->dir, KEPT_NAME, err);
	return err;
}

/* What is left keeps a marker; -EBUSY naming it, else err. */
static int leave(struct removal *rm, size_t left, int err)
{
	if (err != 0 || left == 0)
		return err;
	int r = come_back(rm);
	if (r < 0)
		return r;
	for (size_t i = 0; i < rm->na; i++)
		if (!rm->a[i].taken && !rm->a[i].complete) {
			store_set_error("attempt '%s' of step %" PRIu64 " has objects younger than %" PRId64
					" s and no complete set of manifests: a save may be writing it, so it is left, "
					"for a removal after that",
					rm->a[i].id, rm->step, rm->in_flight_ns / 1000000000);
			break;
		}
	return -EBUSY;
}

/* Whether the commit object (and the index, which follows it) goes:
 * unless it names an attempt that stays. A GET, only when a complete
 * attempt stays. */
static bool commit_goes(struct removal *rm, bool whole_stays)
{
	if (!whole_stays)
		return true;
	char attempt[ATTEMPT_BUF];
	uint32_t ws = 0;
	int r = catalog_read_commit(rm->s, rm->job, rm->step, attempt, sizeof(attempt), &ws);
	if (r < 0)
		return r == -ENOENT || r == -EBADMSG;
	const struct attempt *a = find(rm, attempt);
	return a == NULL || a->taken;
}

/* Before the shards, what refers to this step is looked at again: a save
 * writes its refs and then looks for the manifest of the step it refers
 * to, so either it saw the manifests gone (and stores everything) or its
 * refs are seen here (and the shards stay, for it; the markers too, for
 * the removal that finishes this one). -EBUSY, -ENOENT (none) or an
 * error. */
static int referred(struct removal *rm)
{
	uint64_t by = 0;
	int r = catalog_referrer(rm->s, rm->job, rm->step, &by);
	if (r == 0 && (r = come_back(rm)) == 0) {
		store_set_error("step %" PRIu64 " refers to its shard, which is kept", by);
		return -EBUSY;
	}
	return r;
}

/* Markers DEAD_NAME ".<id>" older than twice the window, of attempts
 * with nothing else listed: no save of them is still running (a save
 * fails once it has taken that long: upload.c), and no other removal
 * relies on them (one that takes an attempt by age has its objects
 * listed, and writes the marker anew). All of them when forced. */
static int drop_dead(struct removal *rm, int err)
{
	for (size_t i = 0; i < rm->na; i++) {
		const struct attempt *a = &rm->a[i];
		if (!a->has_dead || a->dead_ns == 0 ||
		    (rm->mode != CATALOG_FORCE && (a->objects > 0 || rm->now_ns - a->dead_ns < 2 * rm->in_flight_ns)))
			continue;
		char name[ATTEMPT_BUF + 8];
		snprintf(name, sizeof(name), DEAD_NAME ".%s", a->id);
		err = remove_key(rm, rm->dir, name, err);
	}
	return err;
}

/* Remove the taken attempts' objects (listed by then), markers last. */
static int remove_taken(struct removal *rm, size_t left, bool looked)
{
	int err = 0;
	struct step_name sn;
	for (size_t i = 0; i < rm->here.n; i++) {
		manifest_parse_object(rm->here.v[i].name, &sn);
		if (sn.kind == OBJ_MANIFEST && takes(rm, sn.attempt))
			err = remove_key(rm, rm->dir, rm->here.v[i].name, err);
	}
	/* A manifest that could not be removed may be the one a save looks
	 * for (write_refs): then no shard goes. */
	if (err != 0)
		return err;
	bool whole_stays = false, all_go = left == 0;
	for (size_t i = 0; i < rm->na; i++) {
		whole_stays |= rm->a[i].complete && !rm->a[i].taken;
		all_go &= rm->a[i].taken;
	}
	if (commit_goes(rm, whole_stays))
		for (int kind = OBJ_COMMIT; kind <= OBJ_INDEX; kind++)
			for (size_t i = 0; i < rm->here.n; i++) {
				manifest_parse_object(rm->here.v[i].name, &sn);
				if ((int)sn.kind == kind)
					err = remove_key(rm, rm->dir, rm->here.v[i].name, err);
			}
	int r = looked ? -ENOENT : referred(rm);
	if (r != -ENOENT)
		return r;
	for (size_t i = 0; i < rm->here.n; i++) {
		const char *name = rm->here.v[i].name;
		manifest_parse_object(name, &sn);
		if (sn.kind == OBJ_SHARD ? takes(rm, sn.attempt)
					 : sn.kind == OBJ_OTHER && all_go && !manifest_is_marker(name))
			err = remove_key(rm, rm->dir, name, err);
	}
	for (size_t i = 0; i < rm->nspread; i++)
		err = remove_spread(rm, &rm->spread[i], err);
	err = remove_refs(rm, err);
	if (err != 0)
		return err; /* the markers stay: the next removal finishes */
	for (size_t i = 0; i < rm->na; i++)
		if (rm->a[i].taken && rm->a[i].has_mark) {
			char name[ATTEMPT_BUF + 8];
			snprintf(name, sizeof(name), KEPT_NAME ".%s", rm->a[i].id);
			err = remove_key(rm, rm->dir, name, err);
		}
	if (err == 0 && left == 0)
		err = unmark_step(rm, err);
	err = drop_dead(rm, err);
	/* Other nodes' temporaries may still sit there: then it stays. */
	r = rm->s->ops->remove_dir(rm->s, rm->dir);
	if (r < 0 && r != -ENOTEMPTY && r != -EEXIST && r != -ENOENT && err == 0)
		err = r;
	return leave(rm, left, err);
}

/* The handshake with a slow save (upload.c check_not_taken): an attempt
 * taken by age may be a save that took longer than the window and writes
 * its manifest now. Its DEAD_NAME marker is written, and stays; a save
 * whose manifest comes after it sees it and fails, and one whose manifest
 * came before is seen here, in a listing after the marker: that attempt
 * is left (its marker stays: a slow save of it that has not looked yet
 * fails, which is safe). Any number of removals may run at once: none
 * takes the marker away. 0 or an error (nothing removed yet). */
static int look_again(struct removal *rm, size_t *left)
{
	bool any = false;
	for (size_t i = 0; i < rm->na; i++)
		any |= rm->a[i].by_age && rm->a[i].taken;
	if (!any)
		return 0;
	char **first = calloc(rm->here.n ? rm->here.n : 1, sizeof(*first));
	if (first == NULL)
		return -ENOMEM;
	for (size_t k = 0; k < rm->here.n; k++)
		first[k] = rm->here.v[k].name;
	qsort(first, rm->here.n, sizeof(*first), cmp_str_ptr);
	struct store_entry *v = NULL;
	size_t n = 0;
	int r = rm->s->ops->list_entries(rm->s, rm->dir, &v, &n);
	if (r == -ENOENT)
		r = 0;
	struct step_name sn;
	for (size_t i = 0; i < n && r == 0; i++) {
		manifest_parse_object(v[i].name, &sn);
		struct attempt *a = sn.kind == OBJ_MANIFEST ? find(rm, sn.attempt) : NULL;
		const char *key = v[i].name;
		if (a == NULL || !a->by_age || !a->taken ||
		    bsearch(&key, first, rm->here.n, sizeof(*first), cmp_str_ptr) != NULL)
			continue;
		a->taken = a->by_age = false;
		(*left)++;
	}
	store_entries_free(v, n);
	free(first);
	return r;
}

int catalog_delete_step(struct store *s, struct mancache *cache, const char *job, uint64_t step,
			enum catalog_removal_mode mode, uint64_t in_flight_s)
{
	struct removal rm = { .s = s,
			      .job = job,
			      .step = step,
			      .now_ns = clock_wall_ns(),
			      .mode = mode,
			      .in_flight_ns = (int64_t)(in_flight_s ? in_flight_s : CATALOG_SPARE_S) * 1000000000 };
	int r = manifest_step_dir(rm.dir, sizeof(rm.dir), job, step);
	if (r < 0)
		return r;
	/* No directory: a removal cut short after it, or a save of the spread
	 * layout whose shards and refs are elsewhere. */
	r = s->ops->list_entries(s, rm.dir, &rm.here.v, &rm.here.n);
	if (r == -ENOENT) {
		rm.here.v = NULL;
		rm.here.n = 0;
		rm.no_dir = true;
		r = 0;
	}
	if (r < 0)
		return r;
	bool looked = false;
	/* Everything is listed, and each attempt decided, before anything
	 * goes: a listing that fails removes nothing. A step with no manifest
	 * left (a removal stopped, or finishing) asks first whether another
	 * step refers to it, so that a kept step costs no more each pass. */
	size_t with_objects = 0;
	if ((r = scan_step(&rm)) == 0 && (r = scan_refs(&rm)) == 0)
		for (size_t i = 0; i < rm.na; i++)
			with_objects += rm.a[i].objects > 0 || rm.a[i].marked; /* markers only: its markers go */
	if (r == 0 && !rm.manifests && with_objects > 0) {
		r = referred(&rm);
		looked = r == -ENOENT;
		r = looked ? 0 : r;
	}
	if (r == 0 && (r = scan_spread(&rm)) == 0) {
		size_t left = decide(&rm), taken = 0;
		for (size_t i = 0; i < rm.na; i++)
			taken += rm.a[i].taken;
		if (taken == 0 && left > 0) {
			r = leave(&rm, left, drop_dead(&rm, 0)); /* not even the commit */
		} else if (taken == 0) {
			r = unmark_step(&rm, drop_dead(&rm, 0));
			(void)s->ops->remove_dir(s, rm.dir); /* nothing left to finish */
		} else if ((r = mark_taken(&rm)) == 0 && (r = look_again(&rm, &left)) == 0) {
			r = remove_taken(&rm, left, looked);
		}
	}
	if (r == 0 && rm.no_dir && rm.na == 0)
		r = -ENOENT;
	removal_free(&rm);
	/* Also after a partial failure: some manifests may be gone. An entry a
	 * racing load puts back is never served: a step saved again under the
	 * same names lists other times or sizes (catalog_listed). */
	if (cache) {
		char key[600];
		snprintf(key, sizeof(key), "%s/", rm.dir);
		mancache_drop_prefix(cache, key);
	}
	return r;
}
