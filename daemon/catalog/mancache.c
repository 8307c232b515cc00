#include "mancache.h"
#include "hash.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <time.h>

struct mancache_entry {
	struct mancache_entry *next;     /* hash chain, while linked */
	TAILQ_ENTRY(mancache_entry) lru; /* while in_lru: linked, ready and kept */
	char *key;
	uint64_t hash;
	int64_t mtime_ns; /* the object as listed */
	uint64_t size;
	ProtobufCMessage *msg; /* a Manifest or a StepIndex; NULL while loading, or after a failure */
	uint64_t bytes;        /* estimated, counted in c->bytes while in_lru */
	unsigned refs;         /* holders and waiters */
	bool loading, linked, in_lru;
	int status; /* a failed fetch, for its waiters */
	char *err;
};

TAILQ_HEAD(mc_lru, mancache_entry);

struct mancache {
	pthread_mutex_t mu;
	pthread_cond_t done; /* some fetch finished */
	struct mancache_entry **buckets;
	size_t nbuckets, n; /* n: linked entries */
	struct mc_lru lru;  /* ready entries, least recently used first */
	uint64_t max_bytes, bytes;
	uint64_t hits, misses;
	unsigned delay_ms;
};

#define OVERHEAD 16 /* per allocation, roughly what malloc adds */

static uint64_t str_bytes(const char *s)
{
	return s ? strlen(s) + 1 + OVERHEAD : 0;
}

/* What protobuf-c allocated to decode m: the structs, strings and arrays. */
static uint64_t decoded_bytes(const Ckpt__Manifest *m)
{
	uint64_t b = sizeof(*m) + OVERHEAD + str_bytes(m->job) + str_bytes(m->attempt_id) + str_bytes(m->shard_name) +
		     m->extra_state.len + OVERHEAD + m->n_chunk_crc32c * sizeof(uint32_t) + OVERHEAD +
		     m->n_tensors * sizeof(void *) + OVERHEAD;
	for (size_t i = 0; i < m->n_tensors; i++) {
		const Ckpt__ManifestTensor *t = m->tensors[i];
		b += sizeof(*t) + OVERHEAD + str_bytes(t->name) +
		     (t->n_global_shape + t->n_box_offsets + t->n_box_lengths) * sizeof(uint64_t) + 3 * OVERHEAD;
	}
	/* A compressed or incremental shard's pieces: up to one per 4 KiB. */
	b += m->n_pieces * (sizeof(void *) + sizeof(Ckpt__ManifestPiece) + OVERHEAD) + OVERHEAD;
	for (size_t i = 0; i < m->n_pieces; i++)
		b += m->pieces[i]->hash.len ? m->pieces[i]->hash.len + OVERHEAD : 0;
	for (size_t i = 0; i < m->n_refs; i++)
		b += sizeof(void *) + str_bytes(m->refs[i]);
	return b;
}

static uint64_t decoded_msg_bytes(const ProtobufCMessage *msg)
{
	if (msg->descriptor == &ckpt__step_index__descriptor) {
		const Ckpt__StepIndex *ix = (const Ckpt__StepIndex *)msg;
		uint64_t b = sizeof(*ix) + OVERHEAD + str_bytes(ix->job) + str_bytes(ix->attempt_id) +
			     ix->n_manifests * sizeof(void *) + OVERHEAD;
		for (size_t i = 0; i < ix->n_manifests; i++)
			b += decoded_bytes(ix->manifests[i]);
		return b;
	}
	return decoded_bytes((const Ckpt__Manifest *)msg);
}

struct mancache *mancache_new(uint64_t max_bytes)
{
	struct mancache *c = calloc(1, sizeof(*c));
	if (c == NULL)
		return NULL;
	c->nbuckets = 256;
	c->buckets = calloc(c->nbuckets, sizeof(*c->buckets));
	if (c->buckets == NULL) {
		free(c);
		return NULL;
	}
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->done, NULL);
	TAILQ_INIT(&c->lru);
	c->max_bytes = max_bytes;
	return c;
}

static void entry_free(struct mancache_entry *e)
{
	if (e->msg)
		protobuf_c_message_free_unpacked(e->msg, NULL);
	free(e->key);
	free(e->err);
	free(e);
}

/* mu held. Take e out of the table (and the LRU and the byte count); it is
 * freed now if nobody holds it, else by its last release. */
static void unlink_entry(struct mancache *c, struct mancache_entry *e)
{
	if (!e->linked)
		return;
	struct mancache_entry **p = &c->buckets[e->hash & (c->nbuckets - 1)];
	while (*p != e)
		p = &(*p)->next;
	*p = e->next;
	e->next = NULL;
	e->linked = false;
	c->n--;
	if (e->in_lru) {
		TAILQ_REMOVE(&c->lru, e, lru);
		e->in_lru = false;
		c->bytes -= e->bytes;
	}
	if (e->refs == 0)
		entry_free(e);
}

void mancache_free(struct mancache *c)
{
	if (c == NULL)
		return;
	for (size_t i = 0; i < c->nbuckets; i++)
		while (c->buckets[i])
			unlink_entry(c, c->buckets[i]);
	free(c->buckets);
	pthread_cond_destroy(&c->done);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

/* mu held: twice the buckets when the chains grow long (best effort). */
static void maybe_grow(struct mancache *c)
{
	if (c->n < c->nbuckets)
		return;
	size_t nb = c->nbuckets * 2;
	struct mancache_entry **v = calloc(nb, sizeof(*v));
	if (v == NULL)
		return;
	for (size_t i = 0; i < c->nbuckets; i++)
		for (struct mancache_entry *e = c->buckets[i], *nx; e; e = nx) {
			nx = e->next;
			e->next = v[e->hash & (nb - 1)];
			v[e->hash & (nb - 1)] = e;
		}
	free(c->buckets);
	c->buckets = v;
	c->nbuckets = nb;
}

static struct mancache_entry *find(struct mancache *c, const char *key, uint64_t h)
{
	for (struct mancache_entry *e = c->buckets[h & (c->nbuckets - 1)]; e; e = e->next)
		if (e->hash == h && strcmp(e->key, key) == 0)
			return e;
	return NULL;
}

/* mu held: e's fetch finished with r (and m on success). */
static void finish(struct mancache *c, struct mancache_entry *e, int r, ProtobufCMessage *m, const char *err)
{
	e->loading = false;
	if (r < 0) {
		e->status = r;
		e->err = strdup(err);
		unlink_entry(c, e); /* never kept; its waiters still hold it */
	} else {
		e->msg = m;
		e->bytes = decoded_msg_bytes(m) + sizeof(*e) + str_bytes(e->key);
		if (e->linked && e->bytes > c->max_bytes) {
			unlink_entry(c, e); /* larger than the whole cache: shared in flight only */
		} else if (e->linked) {
			TAILQ_INSERT_TAIL(&c->lru, e, lru);
			e->in_lru = true;
			c->bytes += e->bytes;
			while (c->bytes > c->max_bytes)
				unlink_entry(c, TAILQ_FIRST(&c->lru));
		}
	}
	pthread_cond_broadcast(&c->done);
}

/* A fetch of either kind of message. */
struct any_fetch {
	mancache_fetch_fn manifest;
	mancache_fetch_index_fn index;
	void *ctx;
};

static int fetch_any(const struct any_fetch *f, ProtobufCMessage **out, char *err, size_t errlen)
{
	if (f->manifest) {
		Ckpt__Manifest *m = NULL;
		int r = f->manifest(f->ctx, &m, err, errlen);
		*out = (ProtobufCMessage *)m;
		return r;
	}
	Ckpt__StepIndex *ix = NULL;
	int r = f->index(f->ctx, &ix, err, errlen);
	*out = (ProtobufCMessage *)ix;
	return r;
}

static int get_msg(struct mancache *c, const char *key, int64_t mtime_ns, uint64_t size, const struct any_fetch *fetch,
		   const ProtobufCMessage **out, struct mancache_entry **ref, char *err, size_t errlen)
{
	uint64_t h = hash_str(key);
	pthread_mutex_lock(&c->mu);
	struct mancache_entry *e = find(c, key, h);
	if (e && (e->mtime_ns != mtime_ns || e->size != size)) {
		unlink_entry(c, e); /* another object under the same name */
		e = NULL;
	}
	if (e) {
		c->hits += fetch->manifest != NULL;
		e->refs++;
		while (e->loading)
			pthread_cond_wait(&c->done, &c->mu);
		if (e->msg == NULL) {
			int r = e->status;
			snprintf(err, errlen, "%s", e->err ? e->err : "out of memory");
			if (--e->refs == 0 && !e->linked)
				entry_free(e);
			pthread_mutex_unlock(&c->mu);
			return r;
		}
		if (e->in_lru) {
			TAILQ_REMOVE(&c->lru, e, lru);
			TAILQ_INSERT_TAIL(&c->lru, e, lru);
		}
		pthread_mutex_unlock(&c->mu);
		*out = e->msg;
		*ref = e;
		return 0;
	}
	e = calloc(1, sizeof(*e));
	if (e == NULL || (e->key = strdup(key)) == NULL) {
		free(e);
		pthread_mutex_unlock(&c->mu);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	e->hash = h;
	e->mtime_ns = mtime_ns;
	e->size = size;
	e->loading = e->linked = true;
	e->refs = 1;
	maybe_grow(c);
	e->next = c->buckets[h & (c->nbuckets - 1)];
	c->buckets[h & (c->nbuckets - 1)] = e;
	c->n++;
	c->misses += fetch->manifest != NULL;
	unsigned delay = c->delay_ms;
	pthread_mutex_unlock(&c->mu);

	if (delay) {
		struct timespec ts = { delay / 1000, (long)(delay % 1000) * 1000000 };
		nanosleep(&ts, NULL);
	}
	ProtobufCMessage *m = NULL;
	int r = fetch_any(fetch, &m, err, errlen);

	pthread_mutex_lock(&c->mu);
	finish(c, e, r, m, err);
	if (r < 0) {
		if (--e->refs == 0 && !e->linked)
			entry_free(e);
		pthread_mutex_unlock(&c->mu);
		return r;
	}
	pthread_mutex_unlock(&c->mu);
	*out = m;
	*ref = e;
	return 0;
}

int mancache_get(struct mancache *c, const char *key, int64_t mtime_ns, uint64_t size, mancache_fetch_fn fetch,
		 void *ctx, const Ckpt__Manifest **out, struct mancache_entry **ref, char *err, size_t errlen)
{
	struct any_fetch f = { .manifest = fetch, .ctx = ctx };
	const ProtobufCMessage *m;
	int r = get_msg(c, key, mtime_ns, size, &f, &m, ref, err, errlen);
	if (r == 0)
		*out = (const Ckpt__Manifest *)m;
	return r;
}

int mancache_get_index(struct mancache *c, const char *key, int64_t mtime_ns, uint64_t size,
		       mancache_fetch_index_fn fetch, void *ctx, const Ckpt__StepIndex **out,
		       struct mancache_entry **ref, char *err, size_t errlen)
{
	struct any_fetch f = { .index = fetch, .ctx = ctx };
	const ProtobufCMessage *m;
	int r = get_msg(c, key, mtime_ns, size, &f, &m, ref, err, errlen);
	if (r == 0)
		*out = (const Ckpt__StepIndex *)m;
	return r;
}

void mancache_release(struct mancache *c, struct mancache_entry *e)
{
	pthread_mutex_lock(&c->mu);
	if (--e->refs == 0 && !e->linked)
		entry_free(e);
	pthread_mutex_unlock(&c->mu);
}

void mancache_drop_prefix(struct mancache *c, const char *prefix)
{
	size_t n = strlen(prefix);
	pthread_mutex_lock(&c->mu);
	for (size_t i = 0; i < c->nbuckets; i++)
		for (struct mancache_entry *e = c->buckets[i], *nx; e; e = nx) {
			nx = e->next;
			if (strncmp(e->key, prefix, n) == 0)
				unlink_entry(c, e);
		}
	pthread_mutex_unlock(&c->mu);
}

void mancache_stats(struct mancache *c, struct mancache_stats *out)
{
	pthread_mutex_lock(&c->mu);
	*out = (struct mancache_stats){ .hits = c->hits, .misses = c->misses, .bytes = c->bytes, .entries = c->n };
	pthread_mutex_unlock(&c->mu);
}

void mancache_set_fetch_delay_ms(struct mancache *c, unsigned ms)
{
	pthread_mutex_lock(&c->mu);
	c->delay_ms = ms;
	pthread_mutex_unlock(&c->mu);
}
