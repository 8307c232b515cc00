/* Replicating (peer_int.h): the sender thread puts each replicated save
 * on the next [peers] replicas nodes of the ring and hands the result
 * back to the loop. */
#include "peer_int.h"
#include "log.h"
#include "requester.h"
#include "save.h"
#include "wire.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Put sv on the peer named name. 0, or -errno and why. */
static int put_one(struct peer *p, const struct save *sv, const uint8_t *mb, size_t ml, const struct sealing *z,
		   const char *name, char *why, size_t whylen)
{
	struct link l;
	char err[300] = "";
	int r = peer_open_link(p, name, z->on ? PEER_PROTOCOL_SEALED : PEER_PROTOCOL_VERSION, false, &l, err,
			       sizeof(err));
	if (r < 0) {
		snprintf(why, whylen, "%s", err);
		return r;
	}
	pthread_mutex_lock(&p->mu);
	p->sender_fd = l.fd;
	pthread_mutex_unlock(&p->mu);
	Ckpt__ReplicaPut put = CKPT__REPLICA_PUT__INIT;
	put.manifest.data = (uint8_t *)mb;
	put.manifest.len = ml;
	put.tier = (Ckpt__Tier)sv->tier;
	if (z->on) {
		put.seal_nonce.data = (uint8_t *)z->nonce;
		put.seal_nonce.len = SEAL_NONCE_BYTES;
		put.sealed_manifest.data = z->sm;
		put.sealed_manifest.len = z->smlen;
	}
	Ckpt__PeerFrame f = CKPT__PEER_FRAME__INIT;
	f.body_case = CKPT__PEER_FRAME__BODY_PUT;
	f.put = &put;
	Ckpt__PeerFrame *in = NULL;
	r = link_send(&l, &f);
	if (r == 0)
		r = link_recv(&l, 64 << 10, &in);
	if (r == 0 && in->body_case != CKPT__PEER_FRAME__BODY_READY)
		r = -EPROTO;
	if (r == 0 && in->ready->status != 0) {
		r = wire_errno(in->ready->status);
		snprintf(why, whylen, "%s", in->ready->message);
	}
	if (in)
		ckpt__peer_frame__free_unpacked(in, NULL);
	in = NULL;
	if (r == 0)
		r = z->on ? peer_send_sealed(&l, sv, z) : peer_send_shard(&l, sv, p->d->cfg.debug_corrupt_replica);
	if (r == 0)
		r = link_recv(&l, 64 << 10, &in);
	if (r == 0 && in->body_case != CKPT__PEER_FRAME__BODY_ACK)
		r = -EPROTO;
	if (r == 0 && in->ack->status != 0) {
		r = wire_errno(in->ack->status);
		snprintf(why, whylen, "%s", in->ack->message);
	}
	if (in)
		ckpt__peer_frame__free_unpacked(in, NULL);
	if (r < 0 && why[0] == '\0')
		snprintf(why, whylen, "%s", r == -ETIMEDOUT ? "timed out ([peers] timeout_ms)" : strerror(-r));
	pthread_mutex_lock(&p->mu);
	p->sender_fd = -1;
	pthread_mutex_unlock(&p->mu);
	link_close(&l);
	if (r < 0 && r != -ENOSPC && r != -ESTALE)
		count(&p->d->stats.peer_link_errors, 1);
	return r;
}

static void replicate(struct peer *p, struct job *j)
{
	struct save *sv = j->sv;
	char(*targets)[RING_NAME_MAX] = NULL;
	char why[300] = "";
	size_t n = peer_ring_now(p, p->d->cfg.peer_replicas, &targets, why, sizeof(why));
	j->want = p->d->cfg.peer_replicas;
	uint8_t *mb = NULL;
	size_t ml = 0;
	struct sealing z = { 0 };
	int pr = n > 0 ? peer_pack_manifest(sv, false, &mb, &ml) : 0;
	if (n > 0 && pr == 0 && sv->has_key) {
		/* Sealed with its job's key (seal.h): the holders see the
		 * public manifest only. */
		pr = peer_seal_manifest(sv, mb, ml, &z);
		free(mb);
		mb = NULL;
		if (pr == 0)
			pr = peer_pack_manifest(sv, true, &mb, &ml);
	}
	if (pr < 0) {
		n = 0;
		snprintf(why, sizeof(why), "%s", pr == -ENOMEM ? "out of memory" : "cannot seal it");
	}
	size_t used = 0, wused = 0;
	for (size_t i = 0; i < n; i++) {
		char one[300] = "";
		int r = put_one(p, sv, mb, ml, &z, targets[i], one, sizeof(one));
		if (r == 0) {
			j->copies++;
			used += (size_t)snprintf(j->peers + used, used < sizeof(j->peers) ? sizeof(j->peers) - used : 0,
						 "%s%s", used ? "," : "", targets[i]);
			count(&p->d->stats.peer_bytes_sent, sv->shard_bytes);
		} else {
			if (j->status == 0)
				j->status = r;
			wused += (size_t)snprintf(why + wused, wused < sizeof(why) ? sizeof(why) - wused : 0,
						  "%s%s: %s", wused ? "; " : "", targets[i], one);
		}
	}
	free(mb);
	free(z.sm);
	free(targets);
	if (j->copies < j->want) {
		if (j->status == 0)
			j->status = -EHOSTUNREACH;
		snprintf(j->msg, sizeof(j->msg), "replicated to %u of %u peers: %s", j->copies, j->want, why);
		log_warn("peers: %s step %" PRIu64 " rank %u: %s", sv->job, sv->step, sv->rank, j->msg);
	} else {
		j->status = 0;
	}
}

void *peer_sender_main(void *arg)
{
	struct peer *p = arg;
	pthread_mutex_lock(&p->mu);
	for (;;) {
		while (p->queue == NULL && !p->stopping)
			pthread_cond_wait(&p->cv, &p->mu);
		if (p->stopping)
			break;
		struct job *j = p->queue;
		p->queue = j->next;
		if (p->queue == NULL)
			p->queue_tail = &p->queue;
		pthread_mutex_unlock(&p->mu);
		replicate(p, j);
		pthread_mutex_lock(&p->mu);
		j->next = p->done;
		p->done = j;
		pthread_mutex_unlock(&p->mu);
		uv_async_send(&p->async);
		pthread_mutex_lock(&p->mu);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

/* daemon.on_replicate (loop): pin sv and queue it for the sender, which
 * answers SaveReplicated through the loop when done. */
void peer_on_replicate(struct daemon *d, struct save *sv)
{
	struct peer *p = d->peer;
	struct job *j = calloc(1, sizeof(*j));
	if (j == NULL) {
		log_warn("peers: out of memory: %s step %" PRIu64 " rank %u not replicated", sv->job, sv->step,
			 sv->rank);
		return;
	}
	j->sv = sv;
	sv->readers++;
	j->session = sv->session;
	j->req_id = sv->req_id;
	if (j->session)
		d->req_ops->hold(j->session);
	pthread_mutex_lock(&p->mu);
	*p->queue_tail = j;
	p->queue_tail = &j->next;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
}
