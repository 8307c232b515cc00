/* Ranges kept for the job's other nodes: see rangecache.h. */
#include "rangecache.h"
#include "clock.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <time.h>

enum rc_state {
	RC_READING,
	RC_READY,
	RC_FAILED, /* out of the list; freed by its last user */
};

struct rc_entry {
	TAILQ_ENTRY(rc_entry) link; /* rc->lru: least lately used first */
	const void *store;
	char *key;
	uint64_t off, len;
	uint8_t *bytes;
	enum rc_state state;
	unsigned users;   /* holds not released, and its reader until rangecache_end */
	uint64_t used_ns; /* made or last held */
};

TAILQ_HEAD(rc_list, rc_entry);

struct rangecache {
	pthread_mutex_t mu;
	pthread_cond_t cv; /* a read ended */
	struct rc_list lru;
	uint64_t max_bytes, ttl_ns;
	struct rangecache_stats st;
};

struct rangecache *rangecache_new(uint64_t max_bytes, uint64_t ttl_ns)
{
	struct rangecache *rc = calloc(1, sizeof(*rc));
	if (rc == NULL)
		return NULL;
	pthread_mutex_init(&rc->mu, NULL);
	pthread_cond_init(&rc->cv, NULL);
	TAILQ_INIT(&rc->lru);
	rc->max_bytes = max_bytes;
	rc->ttl_ns = ttl_ns;
	return rc;
}

static void entry_free(struct rc_entry *e)
{
	free(e->bytes);
	free(e->key);
	free(e);
}

void rangecache_free(struct rangecache *rc)
{
	if (rc == NULL)
		return;
	struct rc_entry *e;
	while ((e = TAILQ_FIRST(&rc->lru)) != NULL) {
		TAILQ_REMOVE(&rc->lru, e, link);
		entry_free(e);
	}
	pthread_cond_destroy(&rc->cv);
	pthread_mutex_destroy(&rc->mu);
	free(rc);
}

/* mu held: e out of the list and its bytes out of the count (freed now
 * when no one uses it, else by its last user). */
static void drop(struct rangecache *rc, struct rc_entry *e)
{
	TAILQ_REMOVE(&rc->lru, e, link);
	rc->st.bytes -= e->len;
	rc->st.entries--;
	e->state = RC_FAILED;
	if (e->users == 0)
		entry_free(e);
}

/* mu held: what expired goes; then, for want more bytes, the least lately
 * used that no one uses. Whether want bytes fit now. */
static bool make_room(struct rangecache *rc, uint64_t want, uint64_t now)
{
	struct rc_entry *e, *next;
	for (e = TAILQ_FIRST(&rc->lru); e; e = next) {
		next = TAILQ_NEXT(e, link);
		if (e->state == RC_READY && e->users == 0 && now - e->used_ns > rc->ttl_ns)
			drop(rc, e);
	}
	for (e = TAILQ_FIRST(&rc->lru); e && rc->st.bytes + want > rc->max_bytes; e = next) {
		next = TAILQ_NEXT(e, link);
		if (e->state == RC_READY && e->users == 0)
			drop(rc, e);
	}
	return want <= rc->max_bytes && rc->st.bytes + want <= rc->max_bytes;
}

/* mu held. An entry (reading or ready) that covers the range. */
static struct rc_entry *find(struct rangecache *rc, const void *store, const char *key, uint64_t off, uint64_t len)
{
	struct rc_entry *e;
	TAILQ_FOREACH (e, &rc->lru, link)
		if (e->store == store && e->off <= off && off - e->off <= e->len && len <= e->len - (off - e->off) &&
		    strcmp(e->key, key) == 0)
			return e;
	return NULL;
}

struct rc_entry *rangecache_begin(struct rangecache *rc, const void *store, const char *key, uint64_t off, uint64_t len)
{
	if (rc == NULL || len == 0)
		return NULL;
	pthread_mutex_lock(&rc->mu);
	struct rc_entry *e = NULL;
	bool there = find(rc, store, key, off, len) != NULL;
	if (!there && make_room(rc, len, clock_now_ns())) {
		e = calloc(1, sizeof(*e));
		if (e) {
			e->key = strdup(key);
			e->bytes = malloc((size_t)len);
		}
		if (e && (e->key == NULL || e->bytes == NULL)) {
			entry_free(e);
			e = NULL;
		}
		if (e) {
			e->store = store;
			e->off = off;
			e->len = len;
			e->state = RC_READING;
			e->users = 1;
			e->used_ns = clock_now_ns();
			TAILQ_INSERT_TAIL(&rc->lru, e, link);
			rc->st.bytes += len;
			rc->st.entries++;
		}
	} else if (!there) {
		rc->st.refused++;
	}
	pthread_mutex_unlock(&rc->mu);
	return e;
}

void rangecache_end(struct rangecache *rc, struct rc_entry *e, const uint8_t *src)
{
	if (src) /* ours alone while reading: no one reads bytes before RC_READY */
		memcpy(e->bytes, src, (size_t)e->len);
	pthread_mutex_lock(&rc->mu);
	if (src) {
		e->state = RC_READY;
		e->used_ns = clock_now_ns();
		e->users--;
	} else {
		e->users--;
		drop(rc, e);
	}
	pthread_cond_broadcast(&rc->cv);
	pthread_mutex_unlock(&rc->mu);
}

int rangecache_hold(struct rangecache *rc, const void *store, const char *key, uint64_t off, uint64_t len,
		    uint32_t wait_ms, const uint8_t **at, struct rc_entry **held)
{
	*at = NULL;
	*held = NULL;
	if (rc == NULL)
		return -ENOENT;
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += wait_ms / 1000;
	until.tv_nsec += (long)(wait_ms % 1000) * 1000000;
	if (until.tv_nsec >= 1000000000) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&rc->mu);
	int r = -ENOENT;
	struct rc_entry *e;
	for (;;) {
		e = find(rc, store, key, off, len);
		if (e == NULL || e->state == RC_READY)
			break;
		/* Being read: wait for its end (it is then ready, or gone). */
		e->users++;
		int w = pthread_cond_timedwait(&rc->cv, &rc->mu, &until);
		e->users--;
		enum rc_state now = e->state;
		if (now == RC_FAILED && e->users == 0)
			entry_free(e);
		if (now == RC_READING && w == ETIMEDOUT) {
			r = -ETIMEDOUT;
			e = NULL;
			break;
		}
		/* Ready (found again), or failed (then none, or another). */
	}
	if (e) {
		e->users++;
		e->used_ns = clock_now_ns();
		TAILQ_REMOVE(&rc->lru, e, link);
		TAILQ_INSERT_TAIL(&rc->lru, e, link);
		*at = e->bytes + (off - e->off);
		*held = e;
		rc->st.hits++;
		r = 0;
	} else {
		rc->st.misses++;
	}
	pthread_mutex_unlock(&rc->mu);
	return r;
}

void rangecache_release(struct rangecache *rc, struct rc_entry *e)
{
	pthread_mutex_lock(&rc->mu);
	e->users--;
	if (e->state == RC_FAILED && e->users == 0)
		entry_free(e);
	pthread_mutex_unlock(&rc->mu);
}

void rangecache_sweep(struct rangecache *rc)
{
	pthread_mutex_lock(&rc->mu);
	make_room(rc, 0, clock_now_ns());
	pthread_mutex_unlock(&rc->mu);
}

void rangecache_stats(struct rangecache *rc, struct rangecache_stats *out)
{
	pthread_mutex_lock(&rc->mu);
	*out = rc->st;
	pthread_mutex_unlock(&rc->mu);
}
