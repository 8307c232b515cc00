#include "catalog.h"
#include "log.h"
#include "manifest.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void catalog_step_free(struct catalog_step *cs)
{
	for (size_t g = 0; g < cs->ngroups; g++) {
		struct catalog_group *grp = &cs->groups[g];
		for (uint32_t r = 0; grp->by_rank && r < grp->world_size; r++)
			if (grp->by_rank[r])
				ckpt__manifest__free_unpacked(grp->by_rank[r], NULL);
		free(grp->by_rank);
	}
	cs->ngroups = 0;
	cs->best = -1;
}

bool catalog_step_complete(const struct catalog_step *cs)
{
	return cs->best >= 0 && cs->groups[cs->best].count == cs->groups[cs->best].world_size;
}

static struct catalog_group *group_for(struct catalog_step *cs, const char *attempt, uint32_t ws)
{
	for (size_t g = 0; g < cs->ngroups; g++)
		if (cs->groups[g].world_size == ws && strcmp(cs->groups[g].attempt, attempt) == 0)
			return &cs->groups[g];
	if (cs->ngroups == CATALOG_MAX_GROUPS)
		return NULL;
	struct catalog_group *grp = &cs->groups[cs->ngroups];
	memset(grp, 0, sizeof(*grp));
	grp->by_rank = calloc(ws, sizeof(*grp->by_rank));
	if (grp->by_rank == NULL)
		return NULL;
	snprintf(grp->attempt, sizeof(grp->attempt), "%s", attempt);
	grp->world_size = ws;
	cs->ngroups++;
	return grp;
}

int catalog_scan_step(struct store *s, const char *job, uint64_t step,
		      struct catalog_step *out)
{
	char dir[512], key[768];
	memset(out, 0, sizeof(*out));
	out->step = step;
	out->best = -1;
	int r = manifest_step_dir(dir, sizeof(dir), job, step);
	if (r < 0)
		return r;
	char **names = NULL;
	size_t n = 0;
	r = s->ops->list(s, dir, &names, &n);
	if (r < 0)
		return r;
	for (size_t i = 0; i < n; i++) {
		uint32_t rank, ws;
		if (manifest_parse_name(names[i], &rank, &ws) < 0)
			continue;
		snprintf(key, sizeof(key), "%s/%s", dir, names[i]);
		void *buf = NULL;
		size_t len = 0;
		r = s->ops->get_all(s, key, MANIFEST_MAX_BYTES, &buf, &len);
		if (r < 0) {
			log_warn("catalog: reading %s: %s", key, store_error(r));
			out->unreadable++;
			continue;
		}
		Ckpt__Manifest *m = NULL;
		char why[256];
		r = manifest_decode(buf, len, &m, why, sizeof(why));
		free(buf);
		if (r < 0) {
			log_warn("catalog: %s: %s; ignored", key, why);
			out->unreadable++;
			continue;
		}
		if (strcmp(m->job, job) != 0 || m->step != step || m->rank != rank ||
		    m->world_size != ws) {
			log_warn("catalog: %s: contents do not match its name; ignored", key);
			ckpt__manifest__free_unpacked(m, NULL);
			out->unreadable++;
			continue;
		}
		struct catalog_group *grp = group_for(out, m->attempt_id, ws);
		if (grp == NULL) {
			log_warn("catalog: %s: too many attempts in one step; ignored", key);
			ckpt__manifest__free_unpacked(m, NULL);
			continue;
		}
		grp->by_rank[rank] = m;
		grp->count++;
		grp->bytes += m->shard_bytes;
		if (m->created_unix_ns > grp->newest_ns)
			grp->newest_ns = m->created_unix_ns;
	}
	store_names_free(names, n);
	if (out->ngroups == 0)
		return out->unreadable ? -EIO : -ENOENT;
	for (size_t g = 0; g < out->ngroups; g++) {
		struct catalog_group *grp = &out->groups[g];
		bool complete = grp->count == grp->world_size;
		if (out->best < 0) {
			out->best = (int)g;
			continue;
		}
		struct catalog_group *b = &out->groups[out->best];
		bool bcomplete = b->count == b->world_size;
		if ((complete && !bcomplete) || (complete == bcomplete && grp->newest_ns > b->newest_ns))
			out->best = (int)g;
	}
	return 0;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

int catalog_steps(struct store *s, const char *job, uint64_t **steps, size_t *count)
{
	char **names = NULL;
	size_t n = 0;
	int r = s->ops->list(s, job, &names, &n);
	if (r < 0)
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

int catalog_latest(struct store *s, const char *job, struct catalog_step *out)
{
	uint64_t *steps = NULL;
	size_t n = 0;
	int r = catalog_steps(s, job, &steps, &n);
	if (r < 0)
		return r == -ENOENT ? -ENOENT : r;
	r = -ENOENT;
	for (size_t i = n; i-- > 0;) {
		if (catalog_scan_step(s, job, steps[i], out) < 0)
			continue;
		if (catalog_step_complete(out)) {
			r = 0;
			break;
		}
		catalog_step_free(out);
	}
	free(steps);
	return r;
}

int catalog_jobs(struct store *s, char ***jobs, size_t *n)
{
	char **names = NULL;
	size_t k = 0;
	int r = s->ops->list(s, "", &names, &k);
	if (r < 0)
		return r;
	size_t w = 0;
	for (size_t i = 0; i < k; i++) {
		if (manifest_name_valid(names[i], JOB_MAX_LEN))
			names[w++] = names[i];
		else
			free(names[i]);
	}
	*jobs = names;
	*n = w;
	return 0;
}

int catalog_delete_step(struct store *s, const char *job, uint64_t step)
{
	char dir[512], key[768];
	int r = manifest_step_dir(dir, sizeof(dir), job, step);
	if (r < 0)
		return r;
	char **names = NULL;
	size_t n = 0;
	r = s->ops->list(s, dir, &names, &n);
	if (r < 0)
		return r;
	int err = 0;
	for (int pass = 0; pass < 2; pass++) {
		for (size_t i = 0; i < n; i++) {
			bool man = strstr(names[i], ".manifest") != NULL;
			if (man != (pass == 0))
				continue;
			snprintf(key, sizeof(key), "%s/%s", dir, names[i]);
			r = s->ops->remove(s, key);
			if (r < 0 && r != -ENOENT && err == 0)
				err = r;
		}
	}
	store_names_free(names, n);
	/* Other nodes' temporaries may still sit there: then it stays. */
	r = s->ops->remove_dir(s, dir);
	if (r < 0 && r != -ENOTEMPTY && r != -EEXIST && r != -ENOENT && err == 0)
		err = r;
	return err;
}
