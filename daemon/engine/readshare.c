/* Restores' storage reads shared within the node: see readshare.h. */
#include "readshare.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum rs_state {
	RS_READING,
	RS_READY,
	RS_FAILED,
};

/* A read in flight: on its leader's stack, from its start until its last
 * joiner released it. */
struct rs_read {
	struct rs_read *next; /* rs->head, while others may join */
	const void *store;
	const char *key;
	uint64_t off, len;
	const uint8_t *buf; /* the leader's */
	enum rs_state state;
	int how;         /* the leader's fetch's answer, when RS_READY */
	unsigned joined; /* joiners that have not released it */
	bool linked;
};

struct readshare {
	pthread_mutex_t mu;
	pthread_cond_t cv; /* a read is done, or released by a joiner */
	struct rs_read *head;
	struct readshare_stats st;
	unsigned delay_ms;
};

struct readshare *readshare_new(void)
{
	struct readshare *rs = calloc(1, sizeof(*rs));
	if (rs == NULL)
		return NULL;
	pthread_mutex_init(&rs->mu, NULL);
	pthread_cond_init(&rs->cv, NULL);
	return rs;
}

void readshare_free(struct readshare *rs)
{
	if (rs == NULL)
		return;
	pthread_cond_destroy(&rs->cv);
	pthread_mutex_destroy(&rs->mu);
	free(rs);
}

/* mu held. A read that others may still join and that covers the range. */
static struct rs_read *find(struct readshare *rs, const void *store, const char *key, uint64_t off, uint64_t len)
{
	for (struct rs_read *e = rs->head; e; e = e->next)
		if (e->store == store && e->off <= off && off - e->off <= e->len && len <= e->len - (off - e->off) &&
		    strcmp(e->key, key) == 0)
			return e;
	return NULL;
}

/* mu held. No one joins e from now on. */
static void unlink_read(struct readshare *rs, struct rs_read *e)
{
	if (!e->linked)
		return;
	struct rs_read **p = &rs->head;
	while (*p != e)
		p = &(*p)->next;
	*p = e->next;
	e->linked = false;
}

/* Read alone: no table, no one waits for us. */
static int read_alone(struct readshare *rs, uint64_t len, uint8_t *buf, readshare_fetch_fn fetch,
		      readshare_apply_fn apply, void *ctx)
{
	int how = fetch(ctx, buf);
	if (how < 0)
		return how;
	if (rs) {
		pthread_mutex_lock(&rs->mu);
		if (how == READSHARE_STORAGE)
			rs->st.read_bytes += len;
		rs->st.reads++;
		pthread_mutex_unlock(&rs->mu);
	}
	apply(ctx, buf, how);
	return 0;
}

/* mu held, e joined. Wait for its read; apply from its buffer if it
 * succeeded. 1: applied; 0: it failed (read alone). mu held again on
 * return, e released. */
static int join_read(struct readshare *rs, struct rs_read *e, uint64_t off, uint64_t len, readshare_apply_fn apply,
		     void *ctx)
{
	while (e->state == RS_READING)
		pthread_cond_wait(&rs->cv, &rs->mu);
	bool ok = e->state == RS_READY;
	if (ok) {
		pthread_mutex_unlock(&rs->mu);
		apply(ctx, e->buf + (off - e->off), e->how);
		pthread_mutex_lock(&rs->mu);
		rs->st.shared++;
		rs->st.shared_bytes += len;
	}
	rs->st.joined--;
	if (--e->joined == 0)
		pthread_cond_broadcast(&rs->cv);
	return ok;
}

/* Lead e (linked, mu not held): fetch, hand the result to the joiners,
 * apply our own, and wait until every joiner released the buffer. */
static int lead_read(struct readshare *rs, struct rs_read *e, unsigned delay_ms, uint8_t *buf, readshare_fetch_fn fetch,
		     readshare_apply_fn apply, void *ctx)
{
	if (delay_ms) {
		struct timespec ts = { delay_ms / 1000, (long)(delay_ms % 1000) * 1000000 };
		nanosleep(&ts, NULL);
	}
	int how = fetch(ctx, buf);
	int r = how < 0 ? how : 0;
	pthread_mutex_lock(&rs->mu);
	if (r < 0) {
		e->state = RS_FAILED;
		unlink_read(rs, e); /* never kept: the next one reads again */
	} else {
		e->state = RS_READY;
		e->how = how;
		if (how == READSHARE_STORAGE)
			rs->st.read_bytes += e->len;
		rs->st.reads++;
	}
	pthread_cond_broadcast(&rs->cv);
	if (r == 0) {
		pthread_mutex_unlock(&rs->mu);
		apply(ctx, buf, how);
		pthread_mutex_lock(&rs->mu);
		unlink_read(rs, e);
	}
	while (e->joined > 0)
		pthread_cond_wait(&rs->cv, &rs->mu);
	pthread_mutex_unlock(&rs->mu);
	return r;
}

int readshare_read(struct readshare *rs, const void *store, const char *key, uint64_t off, uint64_t len, uint8_t *buf,
		   readshare_fetch_fn fetch, readshare_apply_fn apply, void *ctx)
{
	if (rs == NULL)
		return read_alone(rs, len, buf, fetch, apply, ctx);
	pthread_mutex_lock(&rs->mu);
	struct rs_read *e = find(rs, store, key, off, len);
	if (e) {
		e->joined++;
		rs->st.joined++;
		int ok = join_read(rs, e, off, len, apply, ctx);
		pthread_mutex_unlock(&rs->mu);
		return ok ? 0 : read_alone(rs, len, buf, fetch, apply, ctx);
	}
	struct rs_read me = {
		.next = rs->head, .store = store, .key = key, .off = off, .len = len, .buf = buf, .linked = true
	};
	rs->head = &me;
	unsigned delay_ms = rs->delay_ms;
	pthread_mutex_unlock(&rs->mu);
	return lead_read(rs, &me, delay_ms, buf, fetch, apply, ctx);
}

void readshare_stats(struct readshare *rs, struct readshare_stats *out)
{
	pthread_mutex_lock(&rs->mu);
	*out = rs->st;
	pthread_mutex_unlock(&rs->mu);
}

void readshare_set_fetch_delay_ms(struct readshare *rs, unsigned ms)
{
	pthread_mutex_lock(&rs->mu);
	rs->delay_ms = ms;
	pthread_mutex_unlock(&rs->mu);
}
