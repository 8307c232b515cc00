#include "memtier.h"
#include "save.h"
#include "admit.h"
#include "catalog.h"
#include "crc32c.h"
#include "cudadev.h"
#include "journal.h"
#include "daemon.h"
#include "hostbuf.h"
#include "log.h"
#include "manifest.h"
#include "requester.h"
#include "savetab.h"
#include "steplock.h"
#include "tensor.h"
#include "upload.h"
#include "wire.h"
#include "macro.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/random.h>

#define COPY_BLOCK (256u << 10) /* one guarded copy (hostbuf_copy_out) */

static const char *const state_name[] = {
	[SAVE_NEW] = "new",         [SAVE_ADMITTING] = "admitting", [SAVE_STAGING] = "staging",
	[SAVE_HASHING] = "hashing", [SAVE_QUEUED] = "queued",       [SAVE_UPLOADING] = "uploading",
	[SAVE_HELD] = "held",       [SAVE_KEPT] = "kept",           [SAVE_DONE] = "done",
	[SAVE_FAILED] = "failed",
};
_Static_assert(ELEMENTSOF(state_name) == SAVE_FAILED + 1, "a save state without a name");

static void save_set_state(struct save *sv, enum save_state st);

static void save_fail(struct save *sv, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void save_fail(struct save *sv, int status, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(sv->msg, sizeof(sv->msg), fmt, ap);
	va_end(ap);
	sv->status = status;
	save_set_state(sv, SAVE_FAILED);
}

void save_detach_session(struct save *sv)
{
	if (sv->session) {
		sv->d->req_ops->save_detach(sv->session, sv);
		sv->session = NULL;
		if (sv->state == SAVE_ADMITTING && sv->nevents > 0) {
			/* Its copies have not been queued: the trainer's event
			 * and (legacy IPC) its memory die with it. */
			save_fail(sv, -ECONNRESET, "the trainer went away before its CUDA tensors were staged");
			return;
		}
		if (sv->state < SAVE_UPLOADING)
			log_info("save %" PRIu64 " (%s step %" PRIu64
				 " rank %u): trainer went away; finishing it anyway",
				 sv->id, sv->job, sv->step, sv->rank);
	}
}

static void send_event(struct save *sv, Ckpt__Frame *f)
{
	if (sv->session)
		sv->d->req_ops->send(sv->session, sv->req_id, f);
}

/* ---- staging ---- */

/* Checksums of one staged chunk, from the pool: of every piece, and of
 * the whole chunk, gaps included. */
static void hash_chunk(struct copy_job *job)
{
	struct save *sv = job->sv;
	uint64_t cb = sv->d->pool.chunk_bytes;
	uint64_t chunk_start = (uint64_t)job->chunk * cb;
	const uint8_t *base = pool_span_ptr(&sv->d->pool, sv->chunks[job->chunk]);
	uint64_t chunk_len = sv->shard_bytes - chunk_start < cb ? sv->shard_bytes - chunk_start : cb;
	uint64_t pos = 0;
	uint32_t ccrc = 0;
	for (uint32_t k = 0; k < job->npieces; k++) {
		struct save_piece *p = &sv->pieces[job->first_piece + k];
		uint64_t at = sv->tensors[p->tensor].shard_off + p->tensor_off - chunk_start;
		if (at > pos)
			ccrc = crc32c_update(ccrc, base + pos, at - pos);
		p->crc = crc32c_update(0, base + at, p->len);
		ccrc = crc32c_combine(ccrc, p->crc, p->len);
		pos = at + p->len;
	}
	if (chunk_len > pos)
		ccrc = crc32c_update(ccrc, base + pos, chunk_len - pos);
	sv->chunk_crc[job->chunk] = ccrc;
}

/* The chunk's device pieces: every D2H copy queued on this worker's
 * stream (after the trainer's event), then one wait. On failure, job says
 * which piece and why. */
static inline int copy_device_pieces(struct copy_job *job, uint8_t *base, uint64_t chunk_start)
{
	struct save *sv = job->sv;
	struct cuda_batch bt;
	bool batched = false;
	uint32_t bad = UINT32_MAX;
	for (uint32_t k = 0; k < job->npieces && bad == UINT32_MAX; k++) {
		struct save_piece *p = &sv->pieces[job->first_piece + k];
		struct save_tensor *t = &sv->tensors[p->tensor];
		if (t->buf->cuda == NULL)
			continue;
		if (!batched)
			cuda_batch_begin(&bt, sv->d->cuda, workq_worker());
		batched = true;
		int r = cuda_batch_d2h(&bt, t->buf->cuda, sv->events, sv->nevents, t->buf_off + p->tensor_off,
				       base + t->shard_off + p->tensor_off - chunk_start, p->len);
		if (r < 0)
			bad = k;
	}
	if (batched) {
		/* Always wait: no copy may still write into a chunk that a
		 * failure is about to release. */
		int r = cuda_batch_finish(&bt);
		if (r < 0) {
			job->err = r;
			snprintf(job->why, sizeof(job->why), "%s", bt.msg);
			job->first_piece += bad == UINT32_MAX ? 0 : bad;
			return r;
		}
	}
	return 0;
}

/* A run: from piece k (of buffer t->buf, at `at` in the chunk and `from`
 * in the buffer), the next pieces of the same buffer that lie as they
 * will in the shard (ckpt.torch puts a plan's tensors in one file in the
 * shard's order), copied as one stream, gaps and all; the shard's gaps
 * are zeroed after. One copy, not one per tensor: 10,000 tensors of 53 KB
 * cost the copy loop about as much as one of 512 MiB. The run's last
 * piece; *len grows to the run's length. */
static inline uint32_t run_last(const struct copy_job *job, const struct save_tensor *t, uint32_t k,
				uint64_t chunk_start, uint64_t at, uint64_t from, uint64_t *len)
{
	const struct save *sv = job->sv;
	uint32_t last = k;
	while (last + 1 < job->npieces) {
		const struct save_piece *q = &sv->pieces[job->first_piece + last + 1];
		const struct save_tensor *u = &sv->tensors[q->tensor];
		uint64_t q_at = u->shard_off + q->tensor_off - chunk_start;
		uint64_t q_from = u->buf_off + q->tensor_off;
		if (u->buf != t->buf || q_from < from + *len || q_at < at + *len || q_from - from != q_at - at ||
		    q_at - (at + *len) >= SHARD_ALIGN)
			break;
		*len = q_at + q->len - at;
		last++;
	}
	return last;
}

/* len bytes at from in buf to dst, COPY_BLOCK at a time. */
static inline int copy_out_blocks(const struct hostbuf *buf, uint64_t from, uint8_t *dst, uint64_t len)
{
	for (uint64_t done = 0; done < len;) {
		size_t n = len - done < COPY_BLOCK ? (size_t)(len - done) : COPY_BLOCK;
		int r = hostbuf_copy_out(buf, from + done, dst + done, n, NULL);
		if (r < 0)
			return r;
		done += n;
	}
	return 0;
}

/* Stage one chunk: copy only. Checksums come after staged (hash_chunk),
 * so the trainer waits for the copy alone: for a GPU save the D2H copy,
 * and for host memory a streaming copy that a CRC pass in the same loop
 * made 1.11-1.26x slower (tests/bench/py_ab.py, 1 GiB, 2 threads). */
static void copy_run(struct work_item *it)
{
	struct copy_job *job = (struct copy_job *)it;
	if (job->hash) {
		hash_chunk(job);
		return;
	}
	struct save *sv = job->sv;
	uint64_t cb = sv->d->pool.chunk_bytes;
	uint64_t chunk_start = (uint64_t)job->chunk * cb;
	uint8_t *base = pool_span_ptr(&sv->d->pool, sv->chunks[job->chunk]);
	uint64_t chunk_len = sv->shard_bytes - chunk_start < cb ? sv->shard_bytes - chunk_start : cb;
	uint64_t pos = 0; /* within the chunk */
	/* Device pieces first. */
	if (copy_device_pieces(job, base, chunk_start) < 0)
		return;
	for (uint32_t k = 0; k < job->npieces; k++) {
		struct save_piece *p = &sv->pieces[job->first_piece + k];
		struct save_tensor *t = &sv->tensors[p->tensor];
		uint64_t at = t->shard_off + p->tensor_off - chunk_start;
		if (at > pos) /* alignment gap */
			memset(base + pos, 0, at - pos);
		pos = at + p->len;
		if (t->buf->cuda)
			continue;
		uint64_t from = t->buf_off + p->tensor_off, len = p->len;
		uint32_t last = run_last(job, t, k, chunk_start, at, from, &len);
		int r = copy_out_blocks(t->buf, from, base + at, len);
		if (r < 0) {
			job->err = r;
			job->first_piece += k; /* name the (first) tensor that failed */
			return;
		}
		for (; k < last; k++) { /* the gaps inside the run: zeroes, as between runs */
			const struct save_piece *q = &sv->pieces[job->first_piece + k + 1];
			uint64_t q_at = sv->tensors[q->tensor].shard_off + q->tensor_off - chunk_start;
			if (q_at > pos)
				memset(base + pos, 0, q_at - pos);
			pos = q_at + q->len;
		}
	}
	if (chunk_len > pos)
		memset(base + pos, 0, chunk_len - pos);
}

static void copy_done(struct work_item *it)
{
	struct copy_job *job = (struct copy_job *)it;
	struct save *sv = job->sv;
	if (job->err && sv->status == 0) {
		struct save_tensor *t = &sv->tensors[sv->pieces[job->first_piece].tensor];
		sv->status = job->err;
		snprintf(sv->msg, sizeof(sv->msg), "staging tensor '%s' from buffer %" PRIu64 " failed: %s", t->name,
			 t->buf->id,
			 job->why[0]           ? job->why
			 : job->err == -EFAULT ? "the client truncated its buffer file"
					       : strerror(-job->err));
	}
	if (--sv->jobs_left > 0)
		return;
	if (sv->status != 0) {
		save_set_state(sv, SAVE_FAILED);
		return;
	}
	if (!job->hash) {
		save_set_state(sv, SAVE_HASHING);
		return;
	}
	/* Tensor checksums from their pieces, in shard order. */
	for (size_t i = 0; i < sv->npieces; i++) {
		struct save_piece *p = &sv->pieces[i];
		struct save_tensor *t = &sv->tensors[p->tensor];
		t->crc = p->tensor_off == 0 ? p->crc : crc32c_combine(t->crc, p->crc, p->len);
	}
	save_set_state(sv, sv->tier == TIER_DURABLE ? SAVE_QUEUED : SAVE_KEPT);
}

/* ---- upload (libuv threadpool): upload.c ---- */

static void upload_run(uv_work_t *w)
{
	save_upload(w->data);
}

static void upload_done(uv_work_t *w, int status)
{
	struct save *sv = w->data;
	if (status < 0 && sv->status == 0) {
		sv->status = status;
		snprintf(sv->msg, sizeof(sv->msg), "upload cancelled");
	}
	if (sv->status && sv->status != -EEXIST)
		sv->d->stats.store_failures++;
	/* A persist that failed leaves the copy held as it was. */
	save_set_state(sv, sv->status ? (sv->persisting ? SAVE_KEPT : SAVE_FAILED) : SAVE_HELD);
}

static void pump_uploads(struct daemon *d)
{
	struct save *sv;
	while (d->nuploading < d->cfg.max_parallel_uploads && (sv = TAILQ_FIRST(&d->uploadq)) != NULL) {
		if (sv->in_flight_s == 0) { /* a copy held for a peer, persisted: its job's window */
			struct job_policy jp;
			config_job_policy(&d->cfg, sv->job, d->pool.bytes, &jp);
			sv->in_flight_s = catalog_in_flight_s(jp.retention.incomplete_grace_s);
		}
		save_set_state(sv, SAVE_UPLOADING);
	}
}

/* ---- admission ---- */

static void arm_admit_timer(struct daemon *d)
{
	struct save *head = TAILQ_FIRST(&d->waitq);
	if (head == NULL) {
		uv_timer_stop(&d->admit_timer);
		return;
	}
	uint64_t earliest = head->deadline_ns;
	struct save *sv;
	TAILQ_FOREACH (sv, &d->waitq, wlink)
		if (sv->deadline_ns < earliest)
			earliest = sv->deadline_ns;
	uint64_t now = clock_now_ns();
	uint64_t ms = earliest > now ? (earliest - now) / 1000000 + 1 : 0;
	uv_timer_start(&d->admit_timer, save_on_admit_timer, ms, 0);
}

void save_on_admit_timer(uv_timer_t *t)
{
	struct daemon *d = t->data;
	uint64_t now = clock_now_ns();
	struct save *sv, *next;
	for (sv = TAILQ_FIRST(&d->waitq); sv; sv = next) {
		next = TAILQ_NEXT(sv, wlink);
		if (sv->deadline_ns > now)
			continue;
		char why[400];
		admit_no_room(sv, why, sizeof(why));
		save_fail(sv, -ETIMEDOUT,
			  "no staging space for %" PRIu64
			  " bytes within %u ms: %s; raise staging_bytes or the quota, or save less often",
			  sv->shard_bytes, d->cfg.admit_timeout_ms, why);
		next = TAILQ_FIRST(&d->waitq); /* failing may have admitted others */
	}
	save_admit_waiting(d);
}

void save_admit_waiting(struct daemon *d)
{
	/* FIFO within a job; a job that waits on its quota does not hold
	 * back the others. */
	const char *blocked[64];
	size_t nblocked = 0;
	struct save *sv, *next;
	for (sv = TAILQ_FIRST(&d->waitq); sv; sv = next) {
		next = TAILQ_NEXT(sv, wlink);
		bool skip = false;
		for (size_t i = 0; i < nblocked; i++)
			if (strcmp(blocked[i], sv->job) == 0)
				skip = true;
		if (skip)
			continue;
		if (admit_try(sv) == 0) {
			save_set_state(sv, SAVE_STAGING);
		} else if (nblocked < 64) {
			blocked[nblocked++] = sv->job;
		} else {
			break;
		}
	}
	arm_admit_timer(d);
}

void save_cancel_waiting(struct daemon *d, int status, const char *why)
{
	struct save *sv;
	while ((sv = TAILQ_FIRST(&d->waitq)) != NULL)
		save_fail(sv, status, "%s", why);
	arm_admit_timer(d);
}

/* Policy coalesce: older saves of the same job and rank whose upload has
 * not started give way to sv. Returns how many were superseded. */
static unsigned supersede_older(struct save *sv)
{
	struct daemon *d = sv->d;
	unsigned n = 0;
	struct save *o, *next;
	for (o = TAILQ_FIRST(&d->saves); o; o = next) {
		next = TAILQ_NEXT(o, link);
		if (o == sv || o->rank != sv->rank || o->step >= sv->step || strcmp(o->job, sv->job) != 0)
			continue;
		if ((o->state != SAVE_ADMITTING && o->state != SAVE_QUEUED) || o->persisting)
			continue;
		d->stats.saves_superseded++;
		save_fail(o, -ECANCELED,
			  "superseded by step %" PRIu64 " (policy coalesce); step %" PRIu64 " was not written",
			  sv->step, o->step);
		n++;
		next = TAILQ_FIRST(&d->saves);
	}
	return n;
}

/* ---- the state machine ---- */

static void send_staged(struct save *sv)
{
	Ckpt__SaveStaged ev = CKPT__SAVE_STAGED__INIT;
	ev.bytes = sv->shard_bytes;
	ev.stall_ns = clock_now_ns() - sv->t_start;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_SAVE_STAGED;
	f.save_staged = &ev;
	send_event(sv, &f);
}

static void send_durable(struct save *sv)
{
	char where[1024];
	save_step_location(sv->d, sv->job, sv->step, where, sizeof(where));
	Ckpt__SaveDurable dur = CKPT__SAVE_DURABLE__INIT;
	dur.bytes = sv->shard_bytes;
	dur.stored_bytes = sv->stored_bytes;
	dur.location = where;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_SAVE_DURABLE;
	f.save_durable = &dur;
	send_event(sv, &f);
}

static void send_kept(struct save *sv)
{
	Ckpt__SaveKept ev = CKPT__SAVE_KEPT__INIT;
	ev.bytes = sv->shard_bytes;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_SAVE_KEPT;
	f.save_kept = &ev;
	send_event(sv, &f);
}

/* status 0: copies peers hold it; else -errno and why not. */
static void send_replicated(struct save *sv, uint32_t copies, int status, const char *why)
{
	Ckpt__SaveReplicated ev = CKPT__SAVE_REPLICATED__INIT;
	ev.copies = copies;
	ev.status = wire_status(status);
	ev.message = (char *)why;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_SAVE_REPLICATED;
	f.save_replicated = &ev;
	send_event(sv, &f);
}

static void send_failed(struct save *sv)
{
	Ckpt__SaveFailed fail = CKPT__SAVE_FAILED__INIT;
	fail.status = wire_status(sv->status ? sv->status : -EIO);
	fail.message = sv->msg;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_SAVE_FAILED;
	f.save_failed = &fail;
	send_event(sv, &f);
}

/* The on-enter step of each state (systemd's unit vtables, by state):
 * what entering it does. save_set_state leaves the old state's queue,
 * logs the move, then runs the row. */
static void leave_state(struct save *sv, enum save_state old)
{
	struct daemon *d = sv->d;
	if (old == SAVE_ADMITTING) {
		TAILQ_REMOVE(&d->waitq, sv, wlink);
		d->nwaiting--;
	} else if (old == SAVE_QUEUED) {
		TAILQ_REMOVE(&d->uploadq, sv, wlink);
	} else if (old == SAVE_UPLOADING) {
		/* No upload in flight: nothing in the journal is open. */
		if (--d->nuploading == 0)
			journal_compact(d->journal);
	}
}

static void enter_admitting(struct save *sv, enum save_state old)
{
	struct daemon *d = sv->d;
	(void)old;
	sv->deadline_ns = clock_now_ns() + (uint64_t)d->cfg.admit_timeout_ms * 1000000ull;
	TAILQ_INSERT_TAIL(&d->waitq, sv, wlink);
	d->nwaiting++;
	arm_admit_timer(d);
}

/* One copy job per chunk, each with the pieces that start in it. */
static void enter_staging(struct save *sv, enum save_state old)
{
	struct daemon *d = sv->d;
	(void)old;
	sv->jobs_left = sv->nchunks;
	if (sv->nchunks == 0) {
		save_set_state(sv, SAVE_HASHING);
		return;
	}
	uint32_t pi = 0;
	uint64_t cb = d->pool.chunk_bytes;
	for (uint32_t c = 0; c < sv->nchunks; c++) {
		struct copy_job *j = &sv->jobs[c];
		j->sv = sv;
		j->chunk = c;
		j->first_piece = pi;
		j->item.run = copy_run;
		j->item.done = copy_done;
		j->hash = false;
		uint64_t end = (uint64_t)(c + 1) * cb;
		while (pi < sv->npieces) {
			struct save_piece *p = &sv->pieces[pi];
			if (sv->tensors[p->tensor].shard_off + p->tensor_off >= end)
				break;
			pi++;
		}
		j->npieces = pi - j->first_piece;
	}
	for (uint32_t c = 0; c < sv->nchunks; c++)
		workq_submit(d->copyq, &sv->jobs[c].item);
}

/* Staged: the trainer goes on; the checksums run in the background. */
static void enter_hashing(struct save *sv, enum save_state old)
{
	struct daemon *d = sv->d;
	(void)old;
	d->stats.bytes_staged += sv->shard_bytes;
	hist_observe(&d->stats.stall_hist, (double)(clock_now_ns() - sv->t_start) / 1e9);
	/* The trainer may touch its buffers again: drop them. */
	save_drop_events(sv);
	for (size_t i = 0; i < sv->ntensors; i++) {
		hostbuf_unref(sv->tensors[i].buf);
		sv->tensors[i].buf = NULL;
	}
	send_staged(sv);
	if (sv->nchunks == 0) {
		save_set_state(sv, sv->tier == TIER_DURABLE ? SAVE_QUEUED : SAVE_KEPT);
		return;
	}
	sv->jobs_left = sv->nchunks;
	for (uint32_t c = 0; c < sv->nchunks; c++) {
		sv->jobs[c].hash = true;
		workq_submit_background(d->copyq, &sv->jobs[c].item);
	}
}

static void enter_queued(struct save *sv, enum save_state old)
{
	(void)old;
	TAILQ_INSERT_TAIL(&sv->d->uploadq, sv, wlink);
	pump_uploads(sv->d);
}

static void enter_uploading(struct save *sv, enum save_state old)
{
	struct daemon *d = sv->d;
	(void)old;
	d->nuploading++;
	sv->work.data = sv;
	int r = uv_queue_work(d->loop, &sv->work, upload_run, upload_done);
	if (r < 0 && sv->persisting) {
		sv->status = -EIO;
		snprintf(sv->msg, sizeof(sv->msg), "cannot queue the upload: %s", uv_strerror(r));
		save_set_state(sv, SAVE_KEPT); /* the copy stays held */
	} else if (r < 0) {
		save_fail(sv, -EIO, "cannot queue the upload: %s", uv_strerror(r));
	}
}

/* A save leaves the daemon's lists (held or done, or failed): its step
 * lock and session go, and what waited on it may go on. */
static void save_finish(struct save *sv)
{
	if (sv->steplocked) {
		steplock_save_end(sv->job, sv->step);
		sv->steplocked = false;
	}
	save_detach_session(sv);
}

/* sv leaves daemon.saves (its save or its persist ended). */
static void unlist(struct save *sv)
{
	TAILQ_REMOVE(&sv->d->saves, sv, link);
	sv->listed = false;
	sv->d->nsaves--;
}

/* What waited on a save that ended may go on. */
static void after_save_ended(struct daemon *d)
{
	pump_uploads(d);
	save_admit_waiting(d);
	daemon_work_ended(d);
}

/* A persist's upload ended (status 0: durable); the copy stays held. */
static void persist_ended(struct save *sv, int status)
{
	struct daemon *d = sv->d;
	struct log_ctx lctx = { .job = sv->job, .rank = sv->rank, .step = (int64_t)sv->step, .save_id = sv->id };
	if (status == 0) {
		d->stats.bytes_durable += sv->shard_bytes;
		d->stats.bytes_stored += sv->stored_bytes;
		sv->durable = true;
		log_ctx_msg(LOG_LVL_INFO, &lctx,
			    "save %" PRIu64 ": %s step %" PRIu64 " rank %u persisted, %" PRIu64 " bytes", sv->id,
			    sv->job, sv->step, sv->rank, sv->shard_bytes);
	} else {
		log_ctx_msg(LOG_LVL_WARN, &lctx,
			    "save %" PRIu64 ": persisting %s step %" PRIu64
			    " rank %u failed; it stays in memory only: %s",
			    sv->id, sv->job, sv->step, sv->rank, sv->msg);
	}
	save_finish(sv);
	unlist(sv);
	sv->persisting = false;
	if (d->on_persist_end)
		d->on_persist_end(d, sv, status, sv->msg);
	sv->status = 0;
	sv->msg[0] = '\0';
	bool gc_here = status == 0 && sv->rank == 0;
	char sv_job[JOB_BUF];
	uint64_t sv_step = sv->step;
	snprintf(sv_job, sizeof(sv_job), "%s", sv->job);
	memtier_settle(d, sv); /* sv may be freed */
	if (gc_here && d->on_durable)
		d->on_durable(d, sv_job);
	if (status == 0 && d->on_step_durable)
		d->on_step_durable(d, sv_job, sv_step);
	after_save_ended(d);
}

/* Durable (SAVE_HELD or SAVE_DONE): kept by the memory tier or released. */
static void enter_durable(struct save *sv, enum save_state old)
{
	struct daemon *d = sv->d;
	(void)old;
	if (sv->persisting) {
		persist_ended(sv, 0);
		return;
	}
	struct log_ctx lctx = { .job = sv->job, .rank = sv->rank, .step = (int64_t)sv->step, .save_id = sv->id };
	char sv_job[JOB_BUF];
	snprintf(sv_job, sizeof(sv_job), "%s", sv->job); /* sv may be freed below */
	uint64_t sv_step = sv->step;
	bool gc_here = sv->rank == 0;
	sv->durable = true;
	d->stats.bytes_durable += sv->shard_bytes;
	d->stats.bytes_stored += sv->stored_bytes;
	hist_observe(&d->stats.durable_hist, (double)(clock_now_ns() - sv->t_start) / 1e9);
	log_ctx_msg(LOG_LVL_INFO, &lctx,
		    "save %" PRIu64 ": %s step %" PRIu64 " rank %u/%u durable, %" PRIu64 " bytes (%" PRIu64
		    " stored) in %.1f ms",
		    sv->id, sv->job, sv->step, sv->rank, sv->world_size, sv->shard_bytes, sv->stored_bytes,
		    (double)(clock_now_ns() - sv->t_start) / 1e6);
	send_durable(sv);
	save_finish(sv);
	unlist(sv);
	if (sv->state == SAVE_HELD && d->cfg.memory_tier) {
		sv->held_since_ns = clock_now_ns();
		memtier_hold(d, sv);
	} else {
		sv->state = SAVE_DONE;
		save_release(sv);
	}
	/* Retention runs on one node per job, the one holding rank 0:
	 * every daemon of a 512-node job listing and deleting the same
	 * steps would multiply the requests by the node count. */
	if (gc_here && d->on_durable)
		d->on_durable(d, sv_job);
	if (d->on_step_durable)
		d->on_step_durable(d, sv_job, sv_step);
	after_save_ended(d);
}

/* A memory or replicated save is checksummed: held in the pool as its
 * rank's newest copy (memtier.c), not uploaded. Or a persist of it
 * failed (from SAVE_UPLOADING): it stays held as it was. */
static void enter_kept(struct save *sv, enum save_state old)
{
	struct daemon *d = sv->d;
	if (old == SAVE_UPLOADING) {
		persist_ended(sv, sv->status);
		return;
	}
	struct save *newer = memtier_newer(d, sv);
	if (newer) {
		save_fail(sv, -ECANCELED, "step %" PRIu64 " of rank %u is held already, newer than step %" PRIu64,
			  newer->step, sv->rank, sv->step);
		return;
	}
	struct log_ctx lctx = { .job = sv->job, .rank = sv->rank, .step = (int64_t)sv->step, .save_id = sv->id };
	log_ctx_msg(
		LOG_LVL_INFO, &lctx,
		"save %" PRIu64 ": %s step %" PRIu64 " rank %u/%u kept in memory (%s), %" PRIu64 " bytes in %.1f ms",
		sv->id, sv->job, sv->step, sv->rank, sv->world_size, sv->tier == TIER_MEMORY ? "memory" : "replicated",
		sv->shard_bytes, (double)(clock_now_ns() - sv->t_start) / 1e6);
	send_kept(sv);
	if (sv->tier == TIER_REPLICATED && d->on_replicate && !sv->has_key && config_sealed_only(&d->cfg, sv->job)) {
		send_replicated(
			sv, 0, -EACCES,
			"not replicated: a tenant's replicas are sealed with its job's key, and its trainers gave "
			"none (CKPT_JOB_KEY); the step is held in this daemon's memory only");
	} else if (sv->tier == TIER_REPLICATED && d->on_replicate) {
		d->on_replicate(d, sv); /* it sends SaveReplicated when its peers answered */
	} else if (sv->tier == TIER_REPLICATED) {
		char why[300];
		snprintf(why, sizeof(why), "not replicated: %s; the step is held in this daemon's memory only",
			 d->peer_why);
		send_replicated(sv, 0, -ENOTSUP, why);
	}
	save_finish(sv);
	unlist(sv);
	sv->held_since_ns = clock_now_ns();
	memtier_hold(d, sv);
	after_save_ended(d);
}

int save_persist(struct save *sv)
{
	struct daemon *d = sv->d;
	assert(sv->state == SAVE_KEPT && sv->in_held && !sv->listed);
	int r = steplock_save_begin(sv->job, sv->step);
	if (r < 0)
		return r;
	sv->steplocked = true;
	sv->persisting = true;
	sv->status = 0;
	sv->msg[0] = '\0';
	TAILQ_INSERT_TAIL(&d->saves, sv, link);
	sv->listed = true;
	d->nsaves++;
	save_set_state(sv, SAVE_QUEUED);
	return 0;
}

/* Kept for ckptctl status, whose count alone says nothing of why. A long
 * message is cut at a character's start (a tensor's name in it may be
 * UTF-8, and the reply's string must stay so) and ends in "...". */
static void record_failure(struct daemon *d, const struct save *sv)
{
	struct save_failure *f = &d->stats.failures[d->stats.nfailures++ % FAILURE_LIST];
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	snprintf(f->job, sizeof(f->job), "%s", sv->job);
	f->step = sv->step;
	f->rank = sv->rank;
	f->status = sv->status ? sv->status : -EIO; /* as send_failed tells it */
	f->unix_ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
	size_t n = strlen(sv->msg);
	if (n <= FAILURE_MSG_MAX) {
		memcpy(f->msg, sv->msg, n + 1);
		return;
	}
	n = FAILURE_MSG_MAX - 3;
	while (n > 0 && ((unsigned char)sv->msg[n] & 0xc0) == 0x80)
		n--;
	memcpy(f->msg, sv->msg, n);
	memcpy(f->msg + n, "...", 4);
}

static void enter_failed(struct save *sv, enum save_state old)
{
	struct daemon *d = sv->d;
	struct log_ctx lctx = { .job = sv->job, .rank = sv->rank, .step = (int64_t)sv->step, .save_id = sv->id };
	d->stats.saves_failed++;
	record_failure(d, sv);
	log_ctx_msg(LOG_LVL_WARN, &lctx, "save %" PRIu64 ": %s step %" PRIu64 " rank %u failed (was %s): %s", sv->id,
		    sv->job, sv->step, sv->rank, state_name[old], sv->msg);
	send_failed(sv);
	save_finish(sv);
	bool listed = sv->listed;
	if (listed)
		unlist(sv);
	save_release(sv);
	if (listed) {
		pump_uploads(d);
		save_admit_waiting(d);
	}
	daemon_work_ended(d);
}

static void (*const on_enter[])(struct save *sv, enum save_state old) = {
	[SAVE_NEW] = NULL,
	[SAVE_ADMITTING] = enter_admitting,
	[SAVE_STAGING] = enter_staging,
	[SAVE_HASHING] = enter_hashing,
	[SAVE_QUEUED] = enter_queued,
	[SAVE_UPLOADING] = enter_uploading,
	[SAVE_HELD] = enter_durable,
	[SAVE_KEPT] = enter_kept,
	[SAVE_DONE] = enter_durable,
	[SAVE_FAILED] = enter_failed,
};
_Static_assert(ELEMENTSOF(on_enter) == SAVE_FAILED + 1, "a save state without a row");

static void save_set_state(struct save *sv, enum save_state st)
{
	enum save_state old = sv->state;
	struct log_ctx lctx = { .job = sv->job, .rank = sv->rank, .step = (int64_t)sv->step, .save_id = sv->id };
	log_ctx_msg(LOG_LVL_DEBUG, &lctx, "save %" PRIu64 " (%s step %" PRIu64 " rank %u): %s -> %s", sv->id, sv->job,
		    sv->step, sv->rank, state_name[old], state_name[st]);
	leave_state(sv, old);
	sv->state = st;
	if (on_enter[st])
		on_enter[st](sv, old);
}

/* A new save of the request's session, not yet checked. */
static struct save *save_new(struct daemon *d, const struct requester *rq, const Ckpt__Save *m)
{
	struct save *sv = calloc(1, sizeof(*sv));
	if (sv == NULL)
		return NULL;
	sv->d = d;
	sv->req_id = rq->req_id;
	sv->id = ++d->next_save_id;
	sv->t_start = clock_now_ns();
	sv->state = SAVE_NEW;
	sv->session = rq->s;
	d->req_ops->save_attach(rq->s, sv);
	snprintf(sv->job, sizeof(sv->job), "%s", rq->job);
	snprintf(sv->attempt, sizeof(sv->attempt), "%s", rq->attempt);
	if (rq->job_key) { /* its replicas are sealed (daemon/peer/seal.h) */
		memcpy(sv->key, rq->job_key, sizeof(sv->key));
		sv->has_key = true;
	}
	sv->rank = rq->rank;
	sv->world_size = rq->world_size;
	sv->step = m->step;
	sv->tier = (enum save_tier)m->tier;
	d->stats.saves_total++;
	return sv;
}

/* What the request itself asks that this ckptd will not do: -errno with
 * err saying why, else 0. */
static int request_refused(struct save *sv, const Ckpt__Save *m, char *err, size_t errlen)
{
	struct daemon *d = sv->d;
	if (sv->job[0] == '\0') {
		snprintf(err, errlen, "this session said no job in Hello (a control session); it cannot save");
		return -EPERM;
	}
	if (d->draining) {
		snprintf(err, errlen, "ckptd is shutting down and admits no new saves");
		return -ESHUTDOWN;
	}
	if (m->tier != CKPT__TIER__TIER_DURABLE && m->tier != CKPT__TIER__TIER_MEMORY &&
	    m->tier != CKPT__TIER__TIER_REPLICATED) {
		sv->tier = TIER_DURABLE;
		snprintf(err, errlen, "unknown tier %d", (int)m->tier);
		return -EINVAL;
	}
	if (sv->tier != TIER_DURABLE && !d->cfg.memory_tier) {
		snprintf(err, errlen,
			 "a %s save needs the memory tier, which is off in this ckptd ([pool] memory_tier)",
			 sv->tier == TIER_MEMORY ? "memory" : "replicated");
		return -ENOTSUP;
	}
	return 0;
}

/* No room for sv now: its policy says whether it fails, makes room by
 * superseding its older saves, or waits. */
static void no_room(struct save *sv)
{
	struct daemon *d = sv->d;
	char why[400];
	switch (sv->policy) {
	case POLICY_SKIP:
		d->stats.saves_skipped++;
		admit_no_room(sv, why, sizeof(why));
		save_fail(sv, -EBUSY, "no room for %" PRIu64 " bytes: %s; skipped (policy skip)", sv->shard_bytes, why);
		return;
	case POLICY_COALESCE:
		if (supersede_older(sv) > 0 && !admit_job_waiting(d, sv->job) && admit_try(sv) == 0) {
			save_set_state(sv, SAVE_STAGING);
			return;
		}
		save_set_state(sv, SAVE_ADMITTING);
		return;
	case POLICY_BLOCK: save_set_state(sv, SAVE_ADMITTING); return;
	}
}

void save_start(struct daemon *d, const struct requester *rq, const Ckpt__Save *m)
{
	assert(d && d->req_ops && rq && rq->s && m);
	struct save *sv = save_new(d, rq, m);
	if (sv == NULL) {
		d->req_ops->reply(rq->s, rq->req_id, -ENOMEM, "out of memory");
		return;
	}
	char err[512];
	int r = request_refused(sv, m, err, sizeof(err));
	if (r < 0) {
		save_fail(sv, r, "%s", err);
		return;
	}
	struct job_policy jp;
	config_job_policy(&d->cfg, sv->job, d->pool.bytes, &jp);
	sv->policy = rq->policy >= 0 ? (enum admit_policy)rq->policy : jp.policy;
	sv->quota_bytes = jp.quota_bytes;
	sv->spread = d->cfg.layout_spread;
	sv->compress = m->compress == CKPT__SETTING__SETTING_ON ||
		       (m->compress == CKPT__SETTING__SETTING_JOB && jp.compress);
	sv->incremental = m->incremental == CKPT__SETTING__SETTING_ON ||
			  (m->incremental == CKPT__SETTING__SETTING_JOB && jp.incremental);
	sv->piece_bytes = jp.piece_bytes;
	sv->in_flight_s = catalog_in_flight_s(jp.retention.incomplete_grace_s);
	if ((r = admit_may_start(sv, &jp, err, sizeof(err))) < 0 || (r = save_layout(sv, m, err, sizeof(err))) < 0) {
		save_fail(sv, r, "%s", r == -ENOMEM ? "out of memory" : err);
		return;
	}
	r = steplock_save_begin(sv->job, sv->step);
	if (r < 0) {
		save_fail(sv, r, "step %" PRIu64 " of job '%s' is being deleted (ckptctl rm or retention)", sv->step,
			  sv->job);
		return;
	}
	sv->steplocked = true;
	/* Only now, with its layout, is shard_bytes the save's size. */
	if ((r = admit_may_fit(sv, err, sizeof(err))) < 0) {
		save_fail(sv, r, "%s", err);
		return;
	}
	TAILQ_INSERT_TAIL(&d->saves, sv, link);
	sv->listed = true;
	d->nsaves++;
	/* FIFO within the job: nobody overtakes a save of its own job. */
	r = admit_job_waiting(d, sv->job) ? -ENOSPC : admit_try(sv);
	if (r == 0)
		save_set_state(sv, SAVE_STAGING);
	else
		no_room(sv);
}
