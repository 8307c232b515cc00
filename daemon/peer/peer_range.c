/* Restores' storage reads shared across nodes (peer_int.h;
 * docs/architecture.md "Reads shared across nodes").
 *
 * Every range a restore reads from the main store has a directory: the
 * node of the ring (this one included) whose name scores highest for it
 * (rendezvous hashing of the name with the range's key, offset and length,
 * so every node picks the same one from the same ring, and a node that
 * leaves moves only its own ranges). Before reading a range from storage,
 * a node asks its directory (RangeClaim): the first to ask becomes its
 * holder and reads it (keeping it in the daemon's range cache,
 * rangecache.h); those that ask while the claim lasts are sent to the
 * holder (RangeGet), which answers from the cache, waiting for its read
 * when it is still in flight. So a range that R nodes restore is read from
 * storage once and crosses the network R - 1 times, and a range only one
 * node restores costs that node one small request to its directory.
 *
 * Nothing here is a point of failure: a directory or holder that does not
 * answer, answers with an error, or no longer has the bytes, sends the
 * asker to storage (a holder that failed it is named in its next claims,
 * and the directory gives the range to the next asker); the bytes a holder
 * sends are checked against the manifest's CRC32C with the rest of the
 * restore, and a restore whose check fails with them is read again from
 * storage alone (load.c).
 *
 * Per range a node restores: one claim, to one peer; and, when another
 * node holds it, one get of its bytes. A directory holds CLAIMS claims,
 * each range in its hash's slot; a node holds the ranges it claimed within [peers]
 * read_cache bytes, each read_cache_s after its last use. */
#include "peer_int.h"
#include "clock.h"
#include "hash.h"
#include "log.h"
#include "rangecache.h"
#include "wire.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The range's own hash: what its directory is picked by and files its
 * claim under. */
static uint64_t range_hash(const char *key, uint64_t off, uint64_t len)
{
	uint64_t h = hash_fnv(HASH_FNV_SEED, key, strlen(key) + 1);
	h = hash_fnv(h, &off, sizeof(off));
	return hash_mix(hash_fnv(h, &len, sizeof(len)));
}

/* The directory's answer to asker for range (h, off, len): the holder to
 * get it from, or "" (asker holds it now). failed: a holder that did not
 * give it to asker lately (not named again). */
static void directory_claim(struct peer *p, uint64_t h, uint64_t off, uint64_t len, const char *asker,
			    const char *failed, char *holder)
{
	holder[0] = '\0';
	/* Only a node of the ring is named to others (a peer's hello may
	 * name any HOST:PORT when names are not checked). */
	if (!peer_ring_has(p, asker))
		return;
	uint64_t now = clock_now_ns();
	uint64_t ttl = (uint64_t)p->d->cfg.peer_read_cache_s * 1000000000ull;
	pthread_mutex_lock(&p->mu);
	struct claim *c = &p->claims[h % CLAIMS];
	bool live = c->h == h && c->off == off && c->len == len && c->until_ns > now;
	if (live && strcmp(c->holder, asker) != 0 && strcmp(c->holder, failed) != 0 &&
	    !peer_down_locked(p, c->holder, now)) {
		snprintf(holder, RING_NAME_MAX, "%s", c->holder);
		c->until_ns = now + ttl; /* its holder keeps it as long after this use */
	} else {                         /* the asker reads it: a new range, or one whose holder failed */
		c->h = h;
		c->off = off;
		c->len = len;
		c->until_ns = now + ttl;
		snprintf(c->holder, sizeof(c->holder), "%s", asker);
	}
	pthread_mutex_unlock(&p->mu);
}

/* One request on a new link to name, its answer in *in. */
static int ask(struct peer *p, const char *name, const Ckpt__PeerFrame *f, struct link *l, Ckpt__PeerFrame **in,
	       char *why, size_t whylen)
{
	return peer_request(p, name, false, f, 64u << 10, l, in, why, whylen);
}

/* Who holds the range, as its directory dir says: into holder ("": this
 * node). 0 or -errno and why. */
static int claim(struct peer *p, const char *dir, uint64_t h, const char *key, uint64_t off, uint64_t len,
		 const char *failed, char *holder, char *why, size_t whylen)
{
	if (strcmp(dir, p->self) == 0) {
		directory_claim(p, h, off, len, p->self, failed, holder);
		return 0;
	}
	Ckpt__RangeClaim q = CKPT__RANGE_CLAIM__INIT;
	q.key = (char *)key;
	q.off = off;
	q.len = len;
	q.failed_holder = (char *)failed;
	Ckpt__PeerFrame f = CKPT__PEER_FRAME__INIT;
	f.body_case = CKPT__PEER_FRAME__BODY_RANGE_CLAIM;
	f.range_claim = &q;
	struct link l;
	Ckpt__PeerFrame *in = NULL;
	int r = ask(p, dir, &f, &l, &in, why, whylen);
	if (r < 0)
		return r;
	if (in->body_case != CKPT__PEER_FRAME__BODY_RANGE_HOLDER) {
		r = -EPROTO;
		snprintf(why, whylen, "directory %s: not an answer to a claim", dir);
	} else if (in->range_holder->status != 0) {
		r = wire_errno(in->range_holder->status);
		snprintf(why, whylen, "directory %s: %s", dir, in->range_holder->message);
	} else if (strlen(in->range_holder->holder) >= RING_NAME_MAX) {
		r = -EBADMSG;
		snprintf(why, whylen, "directory %s: a holder's name too long", dir);
	} else if (in->range_holder->holder[0] && !peer_ring_has(p, in->range_holder->holder)) {
		r = -EBADMSG;
		snprintf(why, whylen, "directory %s: a holder not in the ring", dir);
	} else {
		snprintf(holder, RING_NAME_MAX, "%s", in->range_holder->holder);
		if (strcmp(holder, p->self) == 0)
			holder[0] = '\0';
	}
	ckpt__peer_frame__free_unpacked(in, NULL);
	link_close(&l);
	return r;
}

/* The range's bytes from holder into buf. 0 or -errno and why. */
static int get_from(struct peer *p, const char *holder, const char *job, const char *key, uint64_t off, uint64_t len,
		    uint8_t *buf, char *why, size_t whylen)
{
	Ckpt__RangeGet g = CKPT__RANGE_GET__INIT;
	g.job = (char *)job;
	g.key = (char *)key;
	g.off = off;
	g.len = len;
	Ckpt__PeerFrame f = CKPT__PEER_FRAME__INIT;
	f.body_case = CKPT__PEER_FRAME__BODY_RANGE_GET;
	f.range_get = &g;
	struct link l;
	Ckpt__PeerFrame *in = NULL;
	int r = ask(p, holder, &f, &l, &in, why, whylen);
	if (r < 0)
		return r;
	if (in->body_case != CKPT__PEER_FRAME__BODY_RANGE_DATA) {
		r = -EPROTO;
		snprintf(why, whylen, "holder %s: not an answer to a get", holder);
	} else if (in->range_data->status != 0) {
		r = wire_errno(in->range_data->status);
		snprintf(why, whylen, "holder %s: %s", holder, in->range_data->message);
	} else {
		r = link_read(&l, buf, (size_t)len);
		if (r < 0)
			snprintf(why, whylen, "holder %s: %s", holder, strerror(-r));
	}
	ckpt__peer_frame__free_unpacked(in, NULL);
	link_close(&l);
	return r;
}

int peer_range(struct daemon *d, const char *job, const char *key, uint64_t off, uint64_t len, uint8_t *buf, char *why,
	       size_t whylen)
{
	struct peer *p = d->peer;
	if (len > RANGE_MAX) {
		snprintf(why, whylen, "larger than %u bytes", RANGE_MAX);
		return -E2BIG;
	}
	uint64_t h = range_hash(key, off, len);
	char dir[RING_NAME_MAX], holder[RING_NAME_MAX];
	peer_ring_pick(p, h, dir);
	int r = claim(p, dir, h, key, off, len, "", holder, why, whylen);
	if (r < 0)
		return r;
	if (holder[0] == '\0')
		return PEER_RANGE_MINE;
	r = get_from(p, holder, job, key, off, len, buf, why, whylen);
	if (r == 0) {
		count(&d->stats.range_bytes_in, len);
		return 0;
	}
	/* The holder did not give it (gone, slow, its cache let it go, or
	 * its read failed): claimed again, naming it, so the directory gives
	 * the range to this node rather than sending the next one there. */
	char failed[RING_NAME_MAX], why2[200];
	snprintf(failed, sizeof(failed), "%s", holder);
	if (claim(p, dir, h, key, off, len, failed, holder, why2, sizeof(why2)) == 0 && holder[0] == '\0') {
		count(&d->stats.range_fallbacks, 1);
		return PEER_RANGE_MINE;
	}
	return r;
}

bool peer_serve_range_claim(struct peer *p, struct link *l, const Ckpt__RangeClaim *q, const char *from)
{
	Ckpt__RangeHolder a = CKPT__RANGE_HOLDER__INIT;
	char holder[RING_NAME_MAX] = "";
	if (q->key[0] == '\0' || strlen(q->key) > RANGE_KEY_MAX || q->len == 0 || q->len > RANGE_MAX) {
		a.status = wire_status(-EINVAL);
		a.message = (char *)"not a range a restore reads";
	} else {
		directory_claim(p, range_hash(q->key, q->off, q->len), q->off, q->len, from, q->failed_holder, holder);
	}
	a.holder = holder;
	Ckpt__PeerFrame f = CKPT__PEER_FRAME__INIT;
	f.body_case = CKPT__PEER_FRAME__BODY_RANGE_HOLDER;
	f.range_holder = &a;
	return link_send(l, &f) == 0;
}

bool peer_serve_range_get(struct peer *p, struct link *l, const Ckpt__RangeGet *g)
{
	struct daemon *d = p->d;
	Ckpt__RangeData a = CKPT__RANGE_DATA__INIT;
	const uint8_t *at = NULL;
	struct rc_entry *e = NULL;
	size_t jl = strlen(g->job), kl = strlen(g->key);
	int r = 0;
	/* Only what this node keeps for its peers: ranges of shards of jobs
	 * of the main store without a secret (loadexec.c), which any node
	 * with the bucket's credentials may read, and never a tenant's. */
	if (g->len == 0 || g->len > RANGE_MAX || kl > RANGE_KEY_MAX || jl == 0 || kl <= jl + 6 ||
	    strncmp(g->key, g->job, jl) != 0 || g->key[jl] != '/' || strcmp(g->key + kl - 6, ".shard") != 0 ||
	    config_tenant_of_job(&d->cfg, g->key) != NULL) /* the key's first part: TENANT/ */
		r = -EINVAL;
	else
		r = rangecache_hold(d->rangecache, d->store, g->key, g->off, g->len, p->timeout_ms / 2, &at, &e);
	if (r < 0) {
		a.status = wire_status(r == -ETIMEDOUT ? -ENOENT : r);
		a.message = r == -EINVAL ? (char *)"not a range of a shard this node keeps for its peers"
					 : (char *)"not kept here";
	}
	Ckpt__PeerFrame f = CKPT__PEER_FRAME__INIT;
	f.body_case = CKPT__PEER_FRAME__BODY_RANGE_DATA;
	f.range_data = &a;
	int w = link_send(l, &f);
	if (w == 0 && e) {
		if (d->cfg.debug_corrupt_range) { /* the asker's CRC check must catch it */
			uint8_t first = at[0] ^ 0x5a;
			w = link_write(l, &first, 1);
			if (w == 0 && g->len > 1)
				w = link_write(l, at + 1, (size_t)g->len - 1);
		} else {
			w = link_write(l, at, (size_t)g->len);
		}
		if (w == 0)
			count(&d->stats.range_bytes_out, g->len);
	}
	if (e)
		rangecache_release(d->rangecache, e);
	return w == 0;
}
