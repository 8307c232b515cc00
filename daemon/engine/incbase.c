/* Bases of incremental steps: see incbase.h. */
#include "incbase.h"
#include "manifest.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct incbase *bases[INCBASE_MAX];
static size_t nbases;

static void base_free(struct incbase *b)
{
	for (size_t i = 0; i < b->nobj; i++)
		free(b->obj[i]);
	free(b->obj);
	free(b->obj_step);
	free(b->p);
	free(b);
}

void incbase_unref(struct incbase *b)
{
	if (b && atomic_fetch_sub(&b->refs, 1) == 1)
		base_free(b);
}

static bool same_rank(const struct incbase *b, const char *job, uint32_t rank, uint32_t ws)
{
	return b->rank == rank && b->world_size == ws && strcmp(b->job, job) == 0;
}

struct incbase *incbase_get(const char *job, uint32_t rank, uint32_t world_size)
{
	struct incbase *b = NULL;
	pthread_mutex_lock(&mu);
	for (size_t i = 0; i < nbases && b == NULL; i++)
		if (same_rank(bases[i], job, rank, world_size)) {
			b = bases[i];
			atomic_fetch_add(&b->refs, 1);
		}
	pthread_mutex_unlock(&mu);
	return b;
}

/* The index of ref in b->obj, added if new; -1 on ENOMEM. */
static long obj_index(struct incbase *b, const char *ref, uint64_t step)
{
	for (size_t i = 0; i < b->nobj; i++)
		if (strcmp(b->obj[i], ref) == 0)
			return (long)i;
	char **o = realloc(b->obj, (b->nobj + 1) * sizeof(*o));
	if (o == NULL)
		return -1;
	b->obj = o;
	uint64_t *s = realloc(b->obj_step, (b->nobj + 1) * sizeof(*s));
	if (s == NULL)
		return -1;
	b->obj_step = s;
	if ((b->obj[b->nobj] = strdup(ref)) == NULL)
		return -1;
	b->obj_step[b->nobj] = step;
	return (long)b->nobj++;
}

int incbase_record(const Ckpt__Manifest *m, const char *own_ref)
{
	struct incbase *b = calloc(1, sizeof(*b));
	if (b == NULL)
		return -ENOMEM;
	atomic_init(&b->refs, 1);
	snprintf(b->job, sizeof(b->job), "%s", m->job);
	b->rank = m->rank;
	b->world_size = m->world_size;
	b->step = m->step;
	snprintf(b->attempt, sizeof(b->attempt), "%s", m->attempt_id);
	b->p = calloc(m->n_pieces ? m->n_pieces : 1, sizeof(*b->p));
	if (b->p == NULL)
		goto nomem;
	uint64_t raw = 0, own = 0;
	for (size_t i = 0; i < m->n_pieces; i++) {
		const Ckpt__ManifestPiece *p = m->pieces[i];
		struct base_piece *q = &b->p[b->n];
		uint64_t step = m->step;
		const char *ref = p->ref ? m->refs[p->ref - 1] : own_ref;
		if (p->ref && manifest_ref_check(m, ref, &step) < 0)
			ref = NULL;
		long o = ref ? obj_index(b, ref, step) : 0;
		if (o < 0)
			goto nomem;
		if (ref && p->hash.len == 16) { /* a piece without a hash is never matched */
			*q = (struct base_piece){ .raw_off = raw,
						  .raw_len = p->raw_bytes,
						  .at = p->ref ? p->ref_offset : own,
						  .stored = p->stored_bytes,
						  .obj = (uint32_t)o,
						  .elem = p->elem,
						  .codec = (int)p->codec };
			memcpy(q->hash, p->hash.data, 16);
			b->n++;
		}
		raw += p->raw_bytes;
		if (p->ref == 0)
			own += p->stored_bytes;
	}
	pthread_mutex_lock(&mu);
	size_t i = 0;
	while (i < nbases && !same_rank(bases[i], b->job, b->rank, b->world_size))
		i++;
	if (i < nbases && bases[i]->step > b->step && strcmp(bases[i]->attempt, b->attempt) == 0) {
		/* a newer one of this attempt got here first */
		pthread_mutex_unlock(&mu);
		incbase_unref(b);
		return 0;
	}
	struct incbase *old = i < nbases ? bases[i] : NULL;
	if (old == NULL && nbases == INCBASE_MAX) {
		old = bases[0]; /* the oldest set */
		memmove(bases, bases + 1, (nbases - 1) * sizeof(*bases));
		i = --nbases;
	}
	if (i == nbases)
		nbases++;
	bases[i] = b;
	pthread_mutex_unlock(&mu);
	incbase_unref(old);
	return 0;
nomem:
	base_free(b);
	return -ENOMEM;
}

const struct base_piece *incbase_find(const struct incbase *b, uint64_t raw_off, uint64_t raw_len,
				      const uint8_t hash[16])
{
	size_t lo = 0, hi = b->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (b->p[mid].raw_off < raw_off)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == b->n || b->p[lo].raw_off != raw_off || b->p[lo].raw_len != raw_len ||
	    memcmp(b->p[lo].hash, hash, 16) != 0)
		return NULL;
	return &b->p[lo];
}

void incbase_clear(void)
{
	pthread_mutex_lock(&mu);
	size_t n = nbases;
	struct incbase *v[INCBASE_MAX];
	memcpy(v, bases, n * sizeof(*v));
	nbases = 0;
	pthread_mutex_unlock(&mu);
	for (size_t i = 0; i < n; i++)
		incbase_unref(v[i]);
}
