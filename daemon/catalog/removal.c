/* Removing a step (catalog.h catalog_delete_step; docs/architecture.md
 * "References between steps"). Everything is listed first; then the
 * marker (KEPT_NAME) names the manifests the removal takes; then go its
 * manifests, its commit and index, and, unless another step refers to it,
 * its shards (the spread layout's too), its refs, and the marker last.
 * An attempt with no manifest and a young object is left (struct removal).
 * Requests per removed step: a LIST of its directory, of its refs (and
 * one per step it refers to), of each spread directory its manifests
 * point to, a GET of a marker already there, the marker's PUT and DELETE,
 * and a DELETE per object: flat in the world size but for the objects
 * themselves. */
#include "catalog.h"
#include "log.h"
#include "macro.h"
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A removal stopped (catalog_delete_step): KEPT_NAME, holding the names of
 * the manifests it took (one per line), so that retention finishes it once
 * nothing refers to it and nothing of it is left in flight, spread shards
 * included. Create-only: a marker already there stays. 0 or -errno. */
static int write_kept(struct store *s, const char *dir, char **names, size_t n)
{
	size_t len = 0;
	struct step_name sn;
	for (size_t i = 0; i < n; i++) {
		manifest_parse_object(names[i], &sn);
		if (sn.kind == OBJ_MANIFEST)
			len += strlen(names[i]) + 1;
	}
	char *body = malloc(len + 1), key[768]; /* and sprintf's NUL */
	if (body == NULL)
		return -ENOMEM;
	size_t at = 0;
	for (size_t i = 0; i < n; i++) {
		manifest_parse_object(names[i], &sn);
		if (sn.kind == OBJ_MANIFEST)
			at += (size_t)sprintf(body + at, "%s\n", names[i]);
	}
	snprintf(key, sizeof(key), "%s/" KEPT_NAME, dir);
	struct iovec iov = { body, at };
	int r = store_create_announced(s, key, &iov, 1);
	free(body);
	return r == -EEXIST ? 0 : r;
}

/* Stopped for step by, which refers to this one: -EBUSY, or the error that
 * kept the marker from being written (the removal is then tried again). */
static int keep_for(struct store *s, const char *dir, char **names, size_t n, uint64_t by)
{
	int r = write_kept(s, dir, names, n);
	if (r < 0)
		return r;
	store_set_error("step %" PRIu64 " refers to its shard, which is kept", by);
	return -EBUSY;
}

/* names (a step's listing): with KEPT_NAME among them, the manifest names
 * the marker holds are added (their attempts are the removal's too). 0 or
 * -errno. */
static int kept_names(struct store *s, const char *dir, char ***names, size_t *n)
{
	bool kept = false;
	for (size_t i = 0; i < *n; i++)
		kept |= strcmp((*names)[i], KEPT_NAME) == 0;
	if (!kept)
		return 0;
	char key[768];
	void *buf = NULL;
	size_t len = 0;
	snprintf(key, sizeof(key), "%s/" KEPT_NAME, dir);
	int r = s->ops->get_all(s, key, 16u << 20, &buf, &len);
	if (r < 0)
		return r == -ENOENT ? 0 : r;
	int err = 0;
	for (char *line = buf, *end = (char *)buf + len; line < end && err == 0;) {
		char *nl = memchr(line, '\n', (size_t)(end - line));
		size_t k = nl ? (size_t)(nl - line) : (size_t)(end - line);
		char **v = realloc(*names, (*n + 1) * sizeof(**names));
		if (v == NULL || (v[*n] = strndup(line, k)) == NULL) {
			if (v)
				*names = v;
			err = -ENOMEM;
			break;
		}
		*names = v;
		(*n)++;
		line += k + 1;
	}
	free(buf);
	return err;
}

/* ---- what a removal takes and what it leaves ---- */

/* A set of attempt names (a few per step). */
struct attempts {
	char **v;
	size_t n;
};

static bool attempts_has(const struct attempts *a, const char *name)
{
	for (size_t i = 0; i < a->n; i++)
		if (strcmp(a->v[i], name) == 0)
			return true;
	return false;
}

static int attempts_add(struct attempts *a, const char *name)
{
	if (attempts_has(a, name))
		return 0;
	char **v = realloc(a->v, (a->n + 1) * sizeof(*v));
	if (v == NULL)
		return -ENOMEM;
	a->v = v;
	if ((v[a->n] = strdup(name)) == NULL)
		return -ENOMEM;
	a->n++;
	return 0;
}

/* One listed directory: its prefix and what was in it. */
struct listed {
	char dir[600];
	struct store_entry *v;
	size_t n;
};

/* A removal of one step. taken: the attempts whose manifests it takes
 * (listed, or named by a stopped removal's marker). left: other attempts
 * with an object younger than CATALOG_SPARE_S: a save writes its shard
 * and refs before its manifest, so such an attempt may be a save of this
 * step in flight on another node, and none of its objects goes. The rest
 * (no manifest, every object older) is what a save that died left, and
 * goes. spread and refs: the spread directories and refs directories
 * listed, whose entries are removed once the manifests are gone. */
struct removal {
	struct store *s;
	const char *job;
	uint64_t step;
	int64_t now_ns;
	bool force; /* nothing is left */
	struct attempts taken, left;
	struct listed *spread, *refs;
	size_t nspread, nrefs;
};

static void removal_free(struct removal *rm)
{
	for (size_t i = 0; i < rm->taken.n; i++)
		free(rm->taken.v[i]);
	for (size_t i = 0; i < rm->left.n; i++)
		free(rm->left.v[i]);
	free(rm->taken.v);
	free(rm->left.v);
	for (size_t i = 0; i < rm->nspread; i++)
		store_entries_free(rm->spread[i].v, rm->spread[i].n);
	for (size_t i = 0; i < rm->nrefs; i++)
		store_entries_free(rm->refs[i].v, rm->refs[i].n);
	free(rm->spread);
	free(rm->refs);
}

/* An object of attempt, last modified at mtime_ns (0: not known, taken
 * as old): an attempt not taken with a young object is left. */
static int note(struct removal *rm, const char *attempt, int64_t mtime_ns)
{
	if (rm->force || attempt[0] == '\0' || attempts_has(&rm->taken, attempt))
		return 0;
	if (mtime_ns > 0 && rm->now_ns - mtime_ns < (int64_t)CATALOG_SPARE_S * 1000000000)
		return attempts_add(&rm->left, attempt);
	return 0;
}

static bool leaves(const struct removal *rm, const char *attempt)
{
	return attempt[0] != '\0' && attempts_has(&rm->left, attempt);
}

/* The attempt of a ref's name, "rank-R-of-W.<attempt>" (manifest_ref_key);
 * "" if it is not one. */
static const char *ref_attempt(const char *name)
{
	unsigned rank, ws;
	int at = 0;
	if (sscanf(name, "rank-%5u-of-%5u.%n", &rank, &ws, &at) != 2 || at == 0)
		return "";
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

/* The step's refs: one listing of what it refers to, one per step there. */
static int list_refs(struct removal *rm)
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
		for (size_t k = 0; k < rm->refs[i].n && r == 0; k++)
			r = note(rm, ref_attempt(rm->refs[i].v[k].name), rm->refs[i].v[k].mtime_ns);
	return r;
}

static int cmp_str_ptr(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Layout spread: a rank with a manifest in the step's listing but no
 * shard of its attempt there keeps its shards in its spread directory. One
 * LIST per such directory (at most SPREAD_FANOUT, W / 256 names each): no
 * manifest is read. Shards whose manifests were removed by an earlier,
 * interrupted delete are not found again here. */
static int list_spread(struct removal *rm, char **names, size_t n)
{
	bool want[SPREAD_FANOUT] = { false };
	/* "rank-R-of-W.<attempt>" of every shard beside the manifests, sorted:
	 * a manifest whose own (rank, world size, attempt) has none there
	 * keeps its shard in the spread directory. */
	char **local = calloc(n ? n : 1, sizeof(*local));
	size_t nlocal = 0;
	if (local == NULL)
		return -ENOMEM;
	struct step_name sn;
	char id[256];
	for (size_t i = 0; i < n; i++) {
		manifest_parse_object(names[i], &sn);
		if (sn.kind != OBJ_SHARD || sn.attempt[0] == '\0')
			continue;
		snprintf(id, sizeof(id), "rank-%05u-of-%05u.%s", sn.rank, sn.world_size, sn.attempt);
		if ((local[nlocal] = strdup(id)) == NULL)
			break;
		nlocal++;
	}
	qsort(local, nlocal, sizeof(*local), cmp_str_ptr);
	for (size_t i = 0; i < n; i++) {
		manifest_parse_object(names[i], &sn);
		if (sn.kind != OBJ_MANIFEST || sn.attempt[0] == '\0')
			continue;
		snprintf(id, sizeof(id), "rank-%05u-of-%05u.%s", sn.rank, sn.world_size, sn.attempt);
		const char *key = id;
		if (bsearch(&key, local, nlocal, sizeof(*local), cmp_str_ptr) == NULL)
			want[sn.rank % SPREAD_FANOUT] = true;
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
				r = note(rm, sn.attempt, rm->spread[i].v[k].mtime_ns);
		}
	return r;
}

/* Remove what was listed in l but what the removal leaves (and, with
 * shards_only, what is not a shard: another node's temporary), then the
 * directory if it is empty. 0 or the first error. */
static int remove_listed(struct removal *rm, const struct listed *l, bool shards_only)
{
	char key[900];
	int err = 0;
	struct step_name sn;
	for (size_t i = 0; i < l->n; i++) {
		const char *attempt;
		if (shards_only) {
			manifest_parse_object(l->v[i].name, &sn);
			if (sn.kind != OBJ_SHARD)
				continue;
			attempt = sn.attempt;
		} else {
			attempt = ref_attempt(l->v[i].name);
		}
		if (leaves(rm, attempt))
			continue;
		snprintf(key, sizeof(key), "%s/%s", l->dir, l->v[i].name);
		int r = rm->s->ops->remove(rm->s, key);
		if (r < 0 && r != -ENOENT && err == 0)
			err = r;
	}
	int r = rm->s->ops->remove_dir(rm->s, l->dir);
	if (r < 0 && r != -ENOTEMPTY && r != -EEXIST && r != -ENOENT && err == 0)
		err = r;
	return err;
}

/* The refs go last: while the step's manifests were there, they kept
 * what it refers to. */
static int remove_refs(struct removal *rm)
{
	int err = 0;
	for (size_t i = 0; i < rm->nrefs; i++) {
		int r = remove_listed(rm, &rm->refs[i], false);
		err = err ? err : r;
	}
	char dir[512];
	if (manifest_refs_dir(dir, sizeof(dir), rm->job, rm->step) == 0)
		(void)rm->s->ops->remove_dir(rm->s, dir);
	return err;
}

/* What the removal left: -EBUSY naming it, else err. */
static int left_error(const struct removal *rm, int err)
{
	if (err != 0 || rm->left.n == 0)
		return err;
	store_set_error("attempt '%s' of step %" PRIu64 " has objects younger than %u s and no manifest: a save may "
			"be writing it, so it is left, for a removal after that",
			rm->left.v[0], rm->step, (unsigned)CATALOG_SPARE_S);
	return -EBUSY;
}

static int64_t wall_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* No directory: a removal cut short after it, or a save of the spread
 * layout whose shards are elsewhere. Its refs, but those of a save that
 * may be in flight. -ENOENT, -EBUSY or an error. */
static int remove_refs_only(struct removal *rm)
{
	int r = list_refs(rm);
	if (r == 0)
		r = remove_refs(rm);
	r = left_error(rm, r);
	return r < 0 ? r : -ENOENT;
}

/* Before the first manifest goes, the marker names every manifest the
 * removal takes (names[0, nlisted) listed, the rest from a marker already
 * there): a removal cut short (a crash, a failed DELETE) is finished later
 * as this one was meant, and never takes an attempt it did not see. A
 * marker that names them all already stays. 0, 1 (written) or -errno. */
static int mark_removal(struct store *s, const char *dir, char **names, size_t nlisted, size_t n, bool had_kept)
{
	char **kept = names + nlisted;
	size_t nkept = n - nlisted, nnew = 0;
	struct step_name sn;
	qsort(kept, nkept, sizeof(*kept), cmp_str_ptr);
	for (size_t i = 0; i < nlisted; i++) {
		manifest_parse_object(names[i], &sn);
		const char *key = names[i];
		if (sn.kind == OBJ_MANIFEST && bsearch(&key, kept, nkept, sizeof(*kept), cmp_str_ptr) == NULL)
			nnew++;
	}
	if (nnew == 0)
		return 0;
	char key[768];
	if (had_kept) {
		/* A crash before the new one is written loses only what the
		 * old one named: those manifests are gone, and their shards in
		 * this directory go once they are old (note). */
		snprintf(key, sizeof(key), "%s/" KEPT_NAME, dir);
		int r = s->ops->remove(s, key);
		if (r < 0 && r != -ENOENT)
			return r;
	}
	int r = write_kept(s, dir, names, n);
	return r < 0 ? r : 1;
}

int catalog_delete_step(struct store *s, struct mancache *cache, const char *job, uint64_t step, bool force)
{
	char dir[512], key[768];
	int r = manifest_step_dir(dir, sizeof(dir), job, step);
	if (r < 0)
		return r;
	struct removal rm = { .s = s, .job = job, .step = step, .now_ns = wall_ns(), .force = force };
	struct store_entry *ents = NULL;
	size_t nents = 0;
	r = s->ops->list_entries(s, dir, &ents, &nents);
	if (r == -ENOENT) {
		r = remove_refs_only(&rm);
		removal_free(&rm);
		return r;
	}
	if (r < 0)
		return r;
	char **names = calloc(nents ? nents : 1, sizeof(*names));
	size_t n = 0;
	if (names == NULL) {
		store_entries_free(ents, nents);
		return -ENOMEM;
	}
	while (n < nents && (names[n] = strdup(ents[n].name)) != NULL)
		n++;
	int err = n < nents ? -ENOMEM : 0;
	size_t nlisted = n;
	bool had_kept = false;
	for (size_t i = 0; i < nlisted; i++)
		had_kept |= strcmp(names[i], KEPT_NAME) == 0;
	/* A removal that stopped before (KEPT_NAME) names the manifests it
	 * took: their attempts, and the spread directories their shards are
	 * in. */
	if (err == 0)
		err = kept_names(s, dir, &names, &n);
	struct step_name sn;
	for (size_t i = 0; i < n && err == 0; i++) {
		manifest_parse_object(names[i], &sn);
		if (sn.kind == OBJ_MANIFEST && sn.attempt[0])
			err = attempts_add(&rm.taken, sn.attempt);
	}
	for (size_t i = 0; i < nents && err == 0; i++) {
		manifest_parse_object(ents[i].name, &sn);
		if (sn.kind != OBJ_MANIFEST)
			err = note(&rm, sn.attempt, ents[i].mtime_ns);
	}
	store_entries_free(ents, nents);
	/* Everything is listed before anything goes: a listing that fails
	 * removes nothing. */
	if (err == 0)
		err = list_refs(&rm);
	if (err == 0)
		err = list_spread(&rm, names, n);
	bool marked = had_kept;
	if (err == 0 && (r = mark_removal(s, dir, names, nlisted, n, had_kept)) != 0) {
		err = r < 0 ? r : 0;
		marked = r > 0 || had_kept;
	}
	if (err != 0)
		goto out;
	/* Manifests, then the commit object, the index, then shards and the
	 * rest. Before the shards, what refers to this step is looked at
	 * again: a save writes its refs and then looks for the manifest of
	 * the step it refers to, so either it saw the manifests gone (and
	 * stores everything) or its refs are seen here (and the shards stay,
	 * for it). */
	uint64_t by = 0;
	for (int pass = 0; pass < 4; pass++) {
		/* A manifest that could not be removed may be the one a save
		 * looks for (write_refs): then no shard goes. */
		if (pass == 1 && err != 0)
			goto out;
		if (pass == 3 && (r = catalog_referrer(s, job, step, &by)) != -ENOENT) {
			err = r == 0 ? keep_for(s, dir, names, n, by) : r;
			goto out;
		}
		for (size_t i = 0; i < n; i++) {
			manifest_parse_object(names[i], &sn);
			int want = sn.kind == OBJ_MANIFEST ? 0
				   : sn.kind == OBJ_COMMIT ? 1
				   : sn.kind == OBJ_INDEX  ? 2
							   : 3;
			/* The marker goes last, once the rest is gone. */
			if (want != pass || leaves(&rm, sn.attempt) || strcmp(names[i], KEPT_NAME) == 0)
				continue;
			snprintf(key, sizeof(key), "%s/%s", dir, names[i]);
			r = s->ops->remove(s, key);
			if (r < 0 && r != -ENOENT && err == 0)
				err = r;
		}
	}
	for (size_t i = 0; i < rm.nspread; i++) {
		r = remove_listed(&rm, &rm.spread[i], true);
		err = err ? err : r;
	}
	r = remove_refs(&rm);
	err = err ? err : r;
	snprintf(key, sizeof(key), "%s/" KEPT_NAME, dir);
	if (err == 0 && rm.left.n == 0 && marked) {
		r = s->ops->remove(s, key);
		err = r < 0 && r != -ENOENT ? r : 0;
	} else if (err == 0 && rm.left.n && !marked) {
		/* What is left: a later removal finishes it (gc.c finish_kept). */
		err = write_kept(s, dir, names, n);
	}
	/* Other nodes' temporaries may still sit there: then it stays. */
	r = s->ops->remove_dir(s, dir);
	if (r < 0 && r != -ENOTEMPTY && r != -EEXIST && r != -ENOENT && err == 0)
		err = r;
	err = left_error(&rm, err);
out:
	store_names_free(names, n);
	removal_free(&rm);
	/* Also after a partial failure: some manifests may be gone. An entry a
	 * racing load puts back is never served: a step saved again under the
	 * same names lists other times or sizes (catalog_listed). */
	if (cache) {
		snprintf(key, sizeof(key), "%s/", dir);
		mancache_drop_prefix(cache, key);
	}
	return err;
}
