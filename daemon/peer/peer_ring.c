/* Whom to ask (peer_int.h): the ring now, the peers that last held each
 * rank's copies, and links to peers, a peer that timed out skipped for a
 * while. */
#include "peer_int.h"
#include "hash.h"
#include "clock.h"
#include "grow.h"

#include <netdb.h>
#include <sys/socket.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The other nodes of the ring of [peers] peers and what dns resolves
 * to, in ring order after this one, at most max. Returns how many, in
 * *out (malloc'd); 0 with why when none. */
static size_t ring_build_now(struct peer *p, size_t max, char (**out)[RING_NAME_MAX], char *why, size_t whylen)
{
	const struct config *c = &p->d->cfg;
	char *extra[256] = { NULL };
	size_t nextra = 0;
	char host[256], port[16];
	*out = NULL;
	if (c->peer_dns[0] && link_split(c->peer_dns, host, sizeof(host), port, sizeof(port)) == 0) {
		struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res = NULL;
		if (getaddrinfo(host, port, &hints, &res) == 0) {
			for (struct addrinfo *ai = res; ai && nextra < 256; ai = ai->ai_next) {
				char ip[64];
				if (getnameinfo(ai->ai_addr, ai->ai_addrlen, ip, sizeof(ip), NULL, 0, NI_NUMERICHOST) !=
				    0)
					continue;
				char *name = malloc(RING_NAME_MAX);
				if (name == NULL)
					break;
				snprintf(name, RING_NAME_MAX, strchr(ip, ':') ? "[%s]:%s" : "%s:%s", ip, port);
				extra[nextra++] = name;
			}
			freeaddrinfo(res);
		} else {
			snprintf(why, whylen, "resolving %s found no peer", c->peer_dns);
		}
	}
	struct ring r;
	size_t n = 0;
	if (ring_build(&r, p->self, c->peer_list, (const char *const *)extra, nextra) == 0) {
		const char **names = calloc(r.n ? r.n : 1, sizeof(*names));
		*out = calloc(r.n ? r.n : 1, sizeof(**out));
		if (names && *out) {
			n = ring_successors(&r, p->self, max > UINT32_MAX ? UINT32_MAX : (uint32_t)max, names, r.n);
			for (size_t i = 0; i < n; i++)
				snprintf((*out)[i], RING_NAME_MAX, "%s", names[i]);
		}
		free(names);
		ring_free(&r);
	} else {
		snprintf(why, whylen, "the [peers] list is not valid");
	}
	for (size_t i = 0; i < nextra; i++)
		free(extra[i]);
	if (n == 0 && why[0] == '\0')
		snprintf(why, whylen, "no peer besides this node in the ring");
	if (n == 0) {
		free(*out);
		*out = NULL;
	}
	return n;
}

/* ring_build_now's answer, at most RING_TTL_NS old: a load asks its
 * copies' holders per shard, and the ring (a DNS lookup of every peer,
 * sorted) does not change that fast. This node's replicas go to the
 * first [peers] replicas of them. */
/* mu held (dropped while the ring is built): p->ring at most RING_TTL_NS old. */
static void ring_fresh(struct peer *p)
{
	uint64_t now = clock_now_ns();
	if (p->ring_at != 0 && now - p->ring_at <= RING_TTL_NS)
		return;
	pthread_mutex_unlock(&p->mu);
	char(*fresh)[RING_NAME_MAX] = NULL;
	char fwhy[200] = "";
	size_t n = ring_build_now(p, RING_MAX, &fresh, fwhy, sizeof(fwhy));
	pthread_mutex_lock(&p->mu);
	free(p->ring);
	p->ring = fresh;
	p->nring = n;
	snprintf(p->ring_why, sizeof(p->ring_why), "%s", fwhy);
	p->ring_at = now;
}

size_t peer_ring_now(struct peer *p, size_t max, char (**out)[RING_NAME_MAX], char *why, size_t whylen)
{
	pthread_mutex_lock(&p->mu);
	ring_fresh(p);
	size_t n = p->nring < max ? p->nring : max;
	*out = n ? malloc(n * sizeof(**out)) : NULL;
	if (*out)
		memcpy(*out, p->ring, n * sizeof(**out));
	else
		n = 0;
	if (n == 0)
		snprintf(why, whylen, "%s", p->ring_why[0] ? p->ring_why : "out of memory");
	pthread_mutex_unlock(&p->mu);
	return n;
}

void peer_ring_pick(struct peer *p, uint64_t h, char *out)
{
	pthread_mutex_lock(&p->mu);
	ring_fresh(p);
	const char *best = p->self;
	uint64_t top = hash_mix(hash_fnv(h, p->self, strlen(p->self)));
	for (size_t i = 0; i < p->nring; i++) {
		uint64_t sc = hash_mix(hash_fnv(h, p->ring[i], strlen(p->ring[i])));
		if (sc > top || (sc == top && strcmp(p->ring[i], best) > 0)) {
			top = sc;
			best = p->ring[i];
		}
	}
	snprintf(out, RING_NAME_MAX, "%s", best);
	pthread_mutex_unlock(&p->mu);
}

bool peer_ring_has(struct peer *p, const char *name)
{
	pthread_mutex_lock(&p->mu);
	ring_fresh(p);
	bool in = strcmp(name, p->self) == 0;
	for (size_t i = 0; i < p->nring && !in; i++)
		in = strcmp(p->ring[i], name) == 0;
	pthread_mutex_unlock(&p->mu);
	return in;
}

/* The remembered holders of job (under mu), made if make (another job's
 * place taken, the oldest not being swept); NULL if none. */
static struct holders *holders_of(struct peer *p, const char *job, bool make)
{
	for (size_t i = 0; i < JOBS; i++)
		if (p->jobs[i].job[0] && strcmp(p->jobs[i].job, job) == 0)
			return &p->jobs[i];
	if (!make)
		return NULL;
	for (size_t k = 0; k < JOBS; k++) {
		struct holders *h = &p->jobs[p->next_job++ % JOBS];
		if (h->swept == 1)
			continue;
		free(h->at);
		memset(h, 0, sizeof(*h));
		snprintf(h->job, sizeof(h->job), "%s", job);
		return h;
	}
	return NULL;
}

struct holders *peer_sweep_begin(struct peer *p, const char *job)
{
	pthread_mutex_lock(&p->mu);
	struct holders *h = holders_of(p, job, true);
	if (h == NULL || h->swept != 0 || h->again_ns > clock_now_ns()) {
		while (h && h->swept == 1 && strcmp(h->job, job) == 0 && !p->stopping)
			pthread_cond_wait(&p->cv, &p->mu);
		pthread_mutex_unlock(&p->mu);
		return NULL;
	}
	h->swept = 1; /* not taken by another job until swept */
	pthread_mutex_unlock(&p->mu);
	return h;
}

void peer_sweep_end(struct peer *p, struct holders *h, bool whole)
{
	pthread_mutex_lock(&p->mu);
	h->swept = whole ? 2 : 0;
	h->again_ns = whole ? 0 : clock_now_ns() + DOWN_NS;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
}

/* The peer that last said it holds copies of (job, rank) (peer_list,
 * sweep), or "" : a node that came back under another name, or a load
 * that reshards (it needs other ranks' copies, held by other nodes'
 * successors), finds the copies by asking around once, then goes
 * straight there. */
void peer_holder_get(struct peer *p, const char *job, uint32_t rank, char *out, size_t len)
{
	out[0] = '\0';
	pthread_mutex_lock(&p->mu);
	struct holders *h = holders_of(p, job, false);
	if (h && rank < h->n && h->at[rank])
		snprintf(out, len, "%s", p->names[h->at[rank] - 1]);
	pthread_mutex_unlock(&p->mu);
}

/* 1 + the index of name in p->names, added if new; 0 when full. */
static uint32_t name_index(struct peer *p, const char *name)
{
	for (uint32_t i = 0; i < p->nnames; i++)
		if (strcmp(p->names[i], name) == 0)
			return i + 1;
	if (p->nnames == NAMES || GROW(p->names, p->names_cap, p->nnames + 1, 16) < 0)
		return 0;
	snprintf(p->names[p->nnames], sizeof(p->names[0]), "%s", name);
	return ++p->nnames;
}

void peer_holder_set(struct peer *p, const char *job, uint32_t rank, const char *peer)
{
	if (rank >= HOLDER_RANKS)
		return;
	pthread_mutex_lock(&p->mu);
	struct holders *h = holders_of(p, job, true);
	uint32_t idx = name_index(p, peer);
	if (h && idx && rank >= h->n) {
		uint32_t was = h->n;
		if (GROW(h->at, h->n, (size_t)rank + 1, 64) == 0)
			memset(h->at + was, 0, (h->n - was) * sizeof(*h->at));
	}
	if (h && idx && rank < h->n)
		h->at[rank] = idx;
	pthread_mutex_unlock(&p->mu);
}

static int say_hello(struct peer *p, struct link *l, uint32_t version)
{
	Ckpt__PeerHello h = CKPT__PEER_HELLO__INIT;
	h.protocol_version = version;
	h.node = p->self;
	Ckpt__PeerFrame f = CKPT__PEER_FRAME__INIT;
	f.body_case = CKPT__PEER_FRAME__BODY_HELLO;
	f.hello = &h;
	return link_send(l, &f);
}

/* Peer name did not answer lately (peer_open_link skips it). */
bool peer_down_locked(struct peer *p, const char *name, uint64_t now)
{
	for (size_t i = 0; i < DOWN; i++)
		if (p->down[i].until_ns > now && strcmp(p->down[i].name, name) == 0)
			return true;
	return false;
}

bool peer_is_down(struct peer *p, const char *name)
{
	pthread_mutex_lock(&p->mu);
	bool down = peer_down_locked(p, name, clock_now_ns());
	pthread_mutex_unlock(&p->mu);
	return down;
}

/* Connect to peer name and say hello, as version (PEER_PROTOCOL_SEALED
 * only to put a sealed replica, so that older peers still take the
 * rest). */
int peer_open_link(struct peer *p, const char *name, uint32_t version, bool even_down, struct link *l, char *why,
		   size_t whylen)
{
	char err[300] = "";
	uint64_t now = clock_now_ns();
	pthread_mutex_lock(&p->mu);
	for (size_t i = 0; i < DOWN && !even_down; i++)
		if (p->down[i].until_ns > now && strcmp(p->down[i].name, name) == 0) {
			snprintf(why, whylen, "not asked again for %" PRIu64 " s: %s",
				 (p->down[i].until_ns - now) / 1000000000 + 1, p->down[i].why);
			pthread_mutex_unlock(&p->mu);
			l->fd = -1;
			l->ssl = NULL;
			return -EHOSTDOWN;
		}
	pthread_mutex_unlock(&p->mu);
	int r = link_connect(&p->tls, name, p->timeout_ms, p->d->cfg.peer_min_rate, l, err, sizeof(err));
	if (r == 0)
		r = say_hello(p, l, version);
	if (r < 0) {
		snprintf(why, whylen, "%s", err);
		link_close(l);
		count(&p->d->stats.peer_link_errors, 1);
	}
	if (r == 0 && even_down) { /* it answers again: asked from now on */
		pthread_mutex_lock(&p->mu);
		for (size_t i = 0; i < DOWN; i++)
			if (strcmp(p->down[i].name, name) == 0)
				p->down[i].until_ns = 0;
		pthread_mutex_unlock(&p->mu);
	}
	if (r == -ETIMEDOUT || r == -EHOSTUNREACH || r == -ENETUNREACH) {
		pthread_mutex_lock(&p->mu);
		size_t at = p->next_down++ % DOWN;
		for (size_t i = 0; i < DOWN; i++)
			if (strcmp(p->down[i].name, name) == 0)
				at = i;
		snprintf(p->down[at].name, sizeof(p->down[at].name), "%s", name);
		snprintf(p->down[at].why, sizeof(p->down[at].why), "%s", err);
		p->down[at].until_ns = clock_now_ns() + DOWN_NS;
		pthread_mutex_unlock(&p->mu);
	}
	return r;
}

int peer_request(struct peer *p, const char *name, bool even_down, const Ckpt__PeerFrame *f, size_t max, struct link *l,
		 Ckpt__PeerFrame **in, char *why, size_t whylen)
{
	*in = NULL;
	int r = peer_open_link(p, name, PEER_PROTOCOL_VERSION, even_down, l, why, whylen);
	if (r < 0)
		return r;
	r = link_send(l, f);
	if (r == 0)
		r = link_recv(l, max, in);
	if (r == -EMSGSIZE)
		snprintf(why, whylen, "%s: an answer larger than %zu bytes", name, max);
	else if (r < 0)
		snprintf(why, whylen, "%s: %s", name, strerror(-r));
	if (r < 0)
		link_close(l);
	return r;
}
