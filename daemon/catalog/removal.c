/* Removing a step (catalog.h catalog_delete_step): its manifests first,
 * then its commit and index, then, unless another step refers to it, its
 * shards (the spread layout's too) and last its refs
 * (docs/architecture.md "References between steps"). */
#include "catalog.h"
#include "log.h"
#include "macro.h"
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Remove step's references (its refs directory, two levels deep). */
static int delete_refs(struct store *s, const char *job, uint64_t step)
{
	char dir[512], sub[600], key[900];
	int r = manifest_refs_dir(dir, sizeof(dir), job, step);
	if (r < 0)
		return r;
	uint64_t *t = NULL;
	size_t nt = 0;
	if ((r = catalog_refs_of(s, job, step, &t, &nt)) < 0)
		return r;
	int err = 0;
	for (size_t i = 0; i < nt; i++) {
		snprintf(sub, sizeof(sub), "%s/step-%012" PRIu64, dir, t[i]);
		char **names = NULL;
		size_t n = 0;
		r = s->ops->list(s, sub, &names, &n);
		if (r < 0 && r != -ENOENT) {
			err = err ? err : r;
			continue;
		}
		for (size_t k = 0; k < n; k++) {
			snprintf(key, sizeof(key), "%s/%s", sub, names[k]);
			r = s->ops->remove(s, key);
			if (r < 0 && r != -ENOENT && err == 0)
				err = r;
		}
		store_names_free(names, n);
		(void)s->ops->remove_dir(s, sub);
	}
	free(t);
	(void)s->ops->remove_dir(s, dir);
	return err;
}

static int cmp_str_ptr(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Layout spread: a rank with a manifest in the step's listing but no
 * shard of its attempt there keeps its shards in its spread directory. One LIST per such
 * directory (at most SPREAD_FANOUT, W / 256 names each), then a DELETE per
 * shard: no manifest is read. Shards whose manifests were removed by an
 * earlier, interrupted delete are not found again here. */
static int delete_spread_shards(struct store *s, const char *job, uint64_t step, char **names, size_t n)
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
	int err = 0;
	for (uint32_t h = 0; h < SPREAD_FANOUT; h++) {
		if (!want[h])
			continue;
		char dir[600], sd[64], key[768];
		char **v = NULL;
		size_t nv = 0;
		if (manifest_spread_dir(sd, sizeof(sd), h, step) < 0 ||
		    snprintf(dir, sizeof(dir), "%s/%s", job, sd) >= (int)sizeof(dir))
			return -ENAMETOOLONG;
		int r = s->ops->list(s, dir, &v, &nv);
		if (r == -ENOENT)
			continue;
		if (r < 0) {
			err = err ? err : r;
			continue;
		}
		for (size_t i = 0; i < nv; i++) {
			manifest_parse_object(v[i], &sn);
			if (sn.kind != OBJ_SHARD)
				continue; /* another node's temporary */
			snprintf(key, sizeof(key), "%s/%s", dir, v[i]);
			r = s->ops->remove(s, key);
			if (r < 0 && r != -ENOENT && err == 0)
				err = r;
		}
		store_names_free(v, nv);
		r = s->ops->remove_dir(s, dir);
		if (r < 0 && r != -ENOTEMPTY && r != -EEXIST && r != -ENOENT && err == 0)
			err = r;
	}
	return err;
}

/* A removal stopped for step by (catalog_delete_step): KEPT_NAME, holding
 * the names of the manifests it took (one per line), so that retention
 * finishes it once nothing refers to it, spread shards included. -EBUSY,
 * or the error that kept the marker from being written (the removal is
 * then tried again). */
static int keep_for(struct store *s, const char *dir, char **names, size_t n, uint64_t by)
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
	if (r < 0 && r != -EEXIST)
		return r;
	store_set_error("step %" PRIu64 " refers to its shard, which is kept", by);
	return -EBUSY;
}

/* names (a step's listing): with KEPT_NAME among them and no manifest,
 * the manifest names the marker holds are added. 0 or -errno. */
static int kept_names(struct store *s, const char *dir, char ***names, size_t *n)
{
	bool kept = false;
	struct step_name sn;
	for (size_t i = 0; i < *n; i++) {
		manifest_parse_object((*names)[i], &sn);
		if (sn.kind == OBJ_MANIFEST)
			return 0;
		kept |= strcmp((*names)[i], KEPT_NAME) == 0;
	}
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

int catalog_delete_step(struct store *s, struct mancache *cache, const char *job, uint64_t step)
{
	char dir[512], key[768];
	int r = manifest_step_dir(dir, sizeof(dir), job, step);
	if (r < 0)
		return r;

	char **names = NULL;
	size_t n = 0;
	r = s->ops->list(s, dir, &names, &n);
	if (r == -ENOENT) {
		/* Gone already (a removal cut short after it): not its refs. */
		int e = delete_refs(s, job, step);
		return e < 0 ? e : -ENOENT;
	}
	if (r < 0)
		return r;
	int err = 0;
	/* Manifests, then the commit object, the index, then shards and the
	 * rest. Before the shards, what refers to this step is looked at
	 * again: a save writes its refs and then looks for the manifest of
	 * the step it refers to, so either it saw the manifests gone (and
	 * stores everything) or its refs are seen here (and the shards stay,
	 * for it). */
	uint64_t by = 0;
	/* A removal that stopped before (KEPT_NAME) names the manifests it
	 * took, for the spread directories their shards are in. */
	r = kept_names(s, dir, &names, &n);
	if (r < 0) {
		store_names_free(names, n);
		return r;
	}
	for (int pass = 0; pass < 4; pass++) {
		/* A manifest that could not be removed may be the one a save
		 * looks for (write_refs): then no shard goes. */
		if (pass == 1 && err != 0) {
			store_names_free(names, n);
			return err;
		}
		if (pass == 3 && (r = catalog_referrer(s, job, step, &by)) != -ENOENT) {
			if (r == 0)
				r = keep_for(s, dir, names, n, by);
			store_names_free(names, n);
			if (cache) {
				snprintf(key, sizeof(key), "%s/", dir);
				mancache_drop_prefix(cache, key);
			}
			return r;
		}
		for (size_t i = 0; i < n; i++) {
			struct step_name sn;
			manifest_parse_object(names[i], &sn);
			int want = sn.kind == OBJ_MANIFEST ? 0
				   : sn.kind == OBJ_COMMIT ? 1
				   : sn.kind == OBJ_INDEX  ? 2
							   : 3;
			if (want != pass)
				continue;
			snprintf(key, sizeof(key), "%s/%s", dir, names[i]);
			r = s->ops->remove(s, key);
			if (r < 0 && r != -ENOENT && err == 0)
				err = r;
		}
	}
	r = delete_spread_shards(s, job, step, names, n);
	if (r < 0 && err == 0)
		err = r;
	store_names_free(names, n);
	/* Other nodes' temporaries may still sit there: then it stays. */
	r = s->ops->remove_dir(s, dir);
	if (r < 0 && r != -ENOTEMPTY && r != -EEXIST && r != -ENOENT && err == 0)
		err = r;
	/* Last: while its manifests were there, these kept what it refers to. */
	r = delete_refs(s, job, step);
	if (r < 0 && err == 0)
		err = r;
	/* Also after a partial failure: some manifests may be gone. An entry a
	 * racing load puts back is never served: a step saved again under the
	 * same names lists other times or sizes (catalog_listed). */
	if (cache) {
		snprintf(key, sizeof(key), "%s/", dir);
		mancache_drop_prefix(cache, key);
	}
	return err;
}
