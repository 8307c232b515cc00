/* Persist requests: which held copies each waits for, and its answer.
 * Storage requests: those of the saves it uploads (upload.c: a commit
 * GET, the shard, the manifest create-only), per copy; a persist of a
 * step every rank of a 4096-rank job asks for costs each node the
 * uploads of its own ranks' copies, once (a copy already persisting or
 * durable is waited for or counted, not written again). */
#include "persist.h"
#include "daemon.h"
#include "log.h"
#include "requester.h"
#include "save.h"
#include "wire.h"

#include <errno.h>
#include <stdbool.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct persist {
	TAILQ_ENTRY(persist) link;
	struct session *session;
	uint64_t req_id;
	char job[JOB_BUF];
	uint64_t step;
	uint64_t *waiting; /* save ids still uploading */
	size_t nwaiting;
	uint64_t bytes;
	int status; /* the first failure, -errno */
	char msg[512];
	bool starting; /* persist_start is still at it: not answered yet */
};

static void answer(struct daemon *d, struct persist *p)
{
	const struct requester_ops *ops = d->req_ops;
	if (p->session == NULL)
		return;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	if (p->status == 0) {
		char where[1024];
		save_step_location(d, p->job, p->step, where, sizeof(where));
		Ckpt__SaveDurable dur = CKPT__SAVE_DURABLE__INIT;
		dur.bytes = p->bytes;
		dur.location = where;
		f.body_case = CKPT__FRAME__BODY_SAVE_DURABLE;
		f.save_durable = &dur;
		ops->send(p->session, p->req_id, &f);
	} else {
		Ckpt__SaveFailed bad = CKPT__SAVE_FAILED__INIT;
		bad.status = wire_status(p->status);
		bad.message = p->msg;
		f.body_case = CKPT__FRAME__BODY_SAVE_FAILED;
		f.save_failed = &bad;
		ops->send(p->session, p->req_id, &f);
	}
}

static void finish(struct daemon *d, struct persist *p)
{
	TAILQ_REMOVE(&d->persists, p, link);
	if (p->session && d->req_ops->release(p->session))
		answer(d, p);
	free(p->waiting);
	free(p);
}

/* sv's upload ended with status: strike it from p's list. */
static void tally(struct persist *p, const struct save *sv, int status, const char *why)
{
	for (size_t i = 0; i < p->nwaiting; i++) {
		if (p->waiting[i] != sv->id)
			continue;
		p->waiting[i] = p->waiting[--p->nwaiting];
		if (status == 0) {
			p->bytes += sv->shard_bytes;
		} else if (p->status == 0) {
			p->status = status;
			snprintf(p->msg, sizeof(p->msg), "persisting rank %u's copy of step %" PRIu64 ": %s", sv->rank,
				 sv->step, why);
		}
		return;
	}
}

static void on_persist_end(struct daemon *d, struct save *sv, int status, const char *why)
{
	/* A replica whose rank is in storage already (its origin, or another
	 * holder, persisted it: the manifest is create-only) is durable. */
	if (sv->replica && status == -EEXIST)
		status = 0;
	struct persist *p, *next;
	for (p = TAILQ_FIRST(&d->persists); p; p = next) {
		next = TAILQ_NEXT(p, link);
		tally(p, sv, status, why);
		if (p->nwaiting == 0 && !p->starting)
			finish(d, p);
	}
}

void persist_init(struct daemon *d)
{
	TAILQ_INIT(&d->persists);
	d->on_persist_end = on_persist_end;
}

void persist_start(struct daemon *d, const struct requester *rq, const char *job, uint64_t step, bool replicas)
{
	const struct requester_ops *ops = d->req_ops;
	size_t n = 0, sealed = 0;
	struct save *sv;
	/* This node's own copies; a replica held for a peer is its origin's
	 * to persist, unless asked (its origin is lost), and never a sealed
	 * one (its bytes are ciphertext to this node: seal.h). */
	TAILQ_FOREACH (sv, &d->held, hlink)
		if (sv->step == step && (replicas || !sv->replica) && strcmp(sv->job, job) == 0) {
			n += sv->seal == NULL;
			sealed += sv->seal != NULL;
		}
	if (n == 0 && sealed > 0) {
		ops->reply(rq->s, rq->req_id, -EACCES,
			   "the replicas of this step held here are sealed with their job's key (CKPT_JOB_KEY): "
			   "only a node whose trainer gives the key can restore them, and this one cannot persist "
			   "them");
		return;
	}
	if (n == 0) {
		ops->reply(rq->s, rq->req_id, -ENOENT,
			   replicas ? "no copy of this step is held in this ckptd's memory, its own or for a peer"
				    : "no copy of this step is held in this ckptd's memory (a persist runs on the "
				      "daemon that holds the copies: every node's ranks ask their own; a lost "
				      "node's replicas: persist --replicas on the node that holds them)");
		return;
	}
	struct persist *p = calloc(1, sizeof(*p));
	uint64_t *w = calloc(n, sizeof(*w));
	if (p == NULL || w == NULL) {
		free(p);
		free(w);
		ops->reply(rq->s, rq->req_id, -ENOMEM, "out of memory");
		return;
	}
	p->waiting = w;
	p->session = rq->s;
	p->req_id = rq->req_id;
	snprintf(p->job, sizeof(p->job), "%s", job);
	p->step = step;
	p->starting = true;
	/* Every copy first, then the uploads: one that ends at once (a queue
	 * that fails) must find its entry. */
	struct save **start = calloc(n, sizeof(*start));
	if (start == NULL) {
		free(w);
		free(p);
		ops->reply(rq->s, rq->req_id, -ENOMEM, "out of memory");
		return;
	}
	size_t nstart = 0;
	TAILQ_FOREACH (sv, &d->held, hlink) {
		if (sv->step != step || (sv->replica && !replicas) || sv->seal || strcmp(sv->job, job) != 0)
			continue;
		if (sv->durable) {
			p->bytes += sv->shard_bytes;
			continue;
		}
		p->waiting[p->nwaiting++] = sv->id;
		if (!sv->persisting)
			start[nstart++] = sv;
	}
	ops->hold(rq->s);
	TAILQ_INSERT_TAIL(&d->persists, p, link);
	log_info("persist: %s step %" PRIu64 ": %zu cop%s to upload, %zu more uploading", job, step, nstart,
		 nstart == 1 ? "y" : "ies", p->nwaiting - nstart);
	for (size_t i = 0; i < nstart; i++) {
		int r = save_persist(start[i]);
		if (r < 0)
			tally(p, start[i], r, "the step is being deleted (ckptctl rm or retention)");
	}
	free(start);
	p->starting = false;
	if (p->nwaiting == 0)
		finish(d, p);
}
