#include "save.h"
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

#define SHARD_ALIGN 64
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
	/* Device pieces first: queue every D2H copy of the chunk on this
	 * worker's stream (after the trainer's event) and wait once. */
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
			return;
		}
	}
	for (uint32_t k = 0; k < job->npieces; k++) {
		struct save_piece *p = &sv->pieces[job->first_piece + k];
		struct save_tensor *t = &sv->tensors[p->tensor];
		uint64_t at = t->shard_off + p->tensor_off - chunk_start;
		if (at > pos) /* alignment gap */
			memset(base + pos, 0, at - pos);
		pos = at + p->len;
		if (t->buf->cuda)
			continue;
		/* A run: the next pieces of the same buffer that lie as they
		 * will in the shard (ckpt.torch puts a plan's tensors in one
		 * file in the shard's order), copied as one stream, gaps and
		 * all; the shard's gaps are zeroed after. One copy, not one per
		 * tensor: 10,000 tensors of 53 KB cost the copy loop about as
		 * much as one of 512 MiB. */
		uint64_t from = t->buf_off + p->tensor_off, len = p->len;
		uint32_t last = k;
		while (last + 1 < job->npieces) {
			const struct save_piece *q = &sv->pieces[job->first_piece + last + 1];
			const struct save_tensor *u = &sv->tensors[q->tensor];
			uint64_t q_at = u->shard_off + q->tensor_off - chunk_start;
			uint64_t q_from = u->buf_off + q->tensor_off;
			if (u->buf != t->buf || q_from < from + len || q_at < at + len || q_from - from != q_at - at ||
			    q_at - (at + len) >= SHARD_ALIGN)
				break;
			len = q_at + q->len - at;
			last++;
		}
		for (uint64_t done = 0; done < len;) {
			size_t n = len - done < COPY_BLOCK ? (size_t)(len - done) : COPY_BLOCK;
			int r = hostbuf_copy_out(t->buf, from + done, base + at + done, n, NULL);
			if (r < 0) {
				job->err = r;
				job->first_piece += k; /* name the (first) tensor that failed */
				return;
			}
			done += n;
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
	while (d->nuploading < d->cfg.max_parallel_uploads && (sv = TAILQ_FIRST(&d->uploadq)) != NULL)
		save_set_state(sv, SAVE_UPLOADING);
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

static uint64_t job_inflight_bytes(struct daemon *d, const char *job)
{
	uint64_t n = 0;
	struct save *sv;
	TAILQ_FOREACH (sv, &d->saves, link)
		if (sv->have_chunks && !sv->persisting && strcmp(sv->job, job) == 0)
			n += sv->pool_bytes;
	return n;
}

/* Pool bytes held by the saves of tenant t's jobs, and how many are in
 * flight (docs/manual.md "Tenants": its quota and max_inflight_saves). */
static uint64_t tenant_inflight(struct daemon *d, const struct tenant_config *t, uint32_t *count)
{
	uint64_t n = 0;
	uint32_t k = 0;
	size_t tl = strlen(t->name);
	struct save *sv;
	TAILQ_FOREACH (sv, &d->saves, link)
		if (!sv->persisting && strncmp(sv->job, t->name, tl) == 0 && sv->job[tl] == '/') {
			k++;
			if (sv->have_chunks)
				n += sv->pool_bytes;
		}
	if (count)
		*count = k;
	return n;
}

/* Over the job's quota, or its tenant's: which, and what it holds. */
static const char *quota_hit(struct save *sv, uint64_t *held)
{
	struct daemon *d = sv->d;
	if (sv->quota_bytes < d->pool.bytes &&
	    (*held = job_inflight_bytes(d, sv->job)) + sv->pool_bytes > sv->quota_bytes)
		return "the job's quota";
	const struct tenant_config *t = config_tenant_of_job(&d->cfg, sv->job);
	if (t && t->quota_bytes && (*held = tenant_inflight(d, t, NULL)) + sv->pool_bytes > t->quota_bytes)
		return "the tenant's quota";
	*held = pool_used_bytes(&d->pool);
	return NULL;
}

/* Saves of one rank of job in flight (not yet durable or failed); a
 * persist's uploads are not the trainer's saves. */
static uint32_t rank_inflight_saves(struct daemon *d, const char *job, uint32_t rank)
{
	uint32_t n = 0;
	struct save *sv;
	TAILQ_FOREACH (sv, &d->saves, link)
		if (sv->rank == rank && !sv->persisting && strcmp(sv->job, job) == 0)
			n++;
	return n;
}

/* 0 and chunks reserved; -EDQUOT over the job's quota; -ENOSPC no room
 * even after reclaiming memory-tier copies. */
static int try_admit(struct save *sv)
{
	struct daemon *d = sv->d;
	uint64_t held;
	if (quota_hit(sv, &held))
		return -EDQUOT;
	int r = pool_reserve(&d->pool, sv->whole, sv->tail_slots, sv->chunks);
	if (r == -ENOSPC) {
		/* Drop memory-tier copies (only if that can make room), then again. */
		memtier_reclaim(d, sv->whole, sv->tail_slots);
		r = pool_reserve(&d->pool, sv->whole, sv->tail_slots, sv->chunks);
	}
	if (r < 0)
		return -ENOSPC;
	sv->have_chunks = true;
	return 0;
}

static bool job_waiting(struct daemon *d, const char *job)
{
	struct save *sv;
	TAILQ_FOREACH (sv, &d->waitq, wlink)
		if (strcmp(sv->job, job) == 0)
			return true;
	return false;
}

/* What of the pool is memory-only copies, which are never dropped for
 * space (memtier.c), in words for a refusal: "" when none. */
static void kept_hint(struct daemon *d, char *buf, size_t len)
{
	uint32_t n = 0;
	uint64_t b = memtier_kept_bytes(d, &n);
	if (n == 0)
		buf[0] = '\0';
	else
		snprintf(buf, len,
			 ", of which %" PRIu64 " MiB are %u memory-only copies (never dropped while the newest of "
			 "their rank: persist them or save them durable)",
			 b >> 20, n);
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
		uint64_t held;
		const char *quota = quota_hit(sv, &held);
		char kept[200];
		kept_hint(d, kept, sizeof(kept));
		save_fail(sv, -ETIMEDOUT,
			  "no staging space for %" PRIu64 " bytes within %u ms: %s holds %" PRIu64
			  " MiB not yet durable%s; raise staging_bytes or the quota, or save less often",
			  sv->shard_bytes, d->cfg.admit_timeout_ms, quota ? quota : "the pool", held >> 20, kept);
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
		if (try_admit(sv) == 0) {
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
	snprintf(sv_job, sizeof(sv_job), "%s", sv->job);
	memtier_settle(d, sv); /* sv may be freed */
	if (gc_here && d->on_durable)
		d->on_durable(d, sv_job);
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
	bool gc_here = sv->rank == 0;
	sv->durable = true;
	d->stats.bytes_durable += sv->shard_bytes;
	hist_observe(&d->stats.durable_hist, (double)(clock_now_ns() - sv->t_start) / 1e9);
	log_ctx_msg(LOG_LVL_INFO, &lctx,
		    "save %" PRIu64 ": %s step %" PRIu64 " rank %u/%u durable, %" PRIu64 " bytes in %.1f ms", sv->id,
		    sv->job, sv->step, sv->rank, sv->world_size, sv->shard_bytes,
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

/* ---- request validation and layout ---- */

/* The trainer's events, one per device its CUDA tensors live on: every
 * such device must have one, or the copy could read half-written data. */
static int open_events(struct save *sv, const Ckpt__Save *m, char *err, size_t errlen)
{
	struct cuda *cu = sv->d->cuda;
	if (m->n_cuda_events > 64) {
		snprintf(err, errlen, "%zu CUDA events, at most 64", m->n_cuda_events);
		return -E2BIG;
	}
	if (m->n_cuda_events > 0 && cu == NULL) {
		snprintf(err, errlen, "the save carries CUDA events but CUDA is off in ckptd");
		return -ENOTSUP;
	}
	if (m->n_cuda_events) {
		sv->events = calloc(m->n_cuda_events, sizeof(*sv->events));
		if (sv->events == NULL)
			return -ENOMEM;
	}
	for (size_t i = 0; i < m->n_cuda_events; i++) {
		const Ckpt__CudaEvent *e = m->cuda_events[i];
		if (e->device_uuid.len != CUDA_UUID_BYTES || e->ipc_handle.len != CUDA_IPC_BYTES) {
			snprintf(err, errlen, "CUDA event %zu: needs a 16-byte device UUID and a 64-byte handle", i);
			return -EINVAL;
		}
		int r = cuda_event_get(cu, e->device_uuid.data, e->ipc_handle.data, &sv->events[i], err, errlen);
		if (r < 0)
			return r;
		sv->nevents = i + 1;
	}
	for (size_t i = 0; i < sv->ntensors; i++) {
		const struct hostbuf *b = sv->tensors[i].buf;
		if (b->cuda == NULL)
			continue;
		size_t k = 0;
		while (k < sv->nevents &&
		       memcmp(cuda_event_uuid(sv->events[k]), cudabuf_uuid(b->cuda), CUDA_UUID_BYTES) != 0)
			k++;
		if (k == sv->nevents) {
			snprintf(err, errlen, "tensor '%s' is on a CUDA device the save has no event for",
				 sv->tensors[i].name);
			return -EINVAL;
		}
	}
	return 0;
}

/* The save's tensors from its TensorRefs, each checked (the session's
 * buffers, the caps), names unique. */
static int tensors_from_refs(struct save *sv, const Ckpt__Save *m, char *err, size_t errlen)
{
	struct session *s = sv->session;
	sv->tensors = calloc(m->n_tensors ? m->n_tensors : 1, sizeof(*sv->tensors));
	if (sv->tensors == NULL)
		return -ENOMEM;
	for (size_t i = 0; i < m->n_tensors; i++) {
		const Ckpt__TensorRef *tr = m->tensors[i];
		struct save_tensor *t = &sv->tensors[i];
		struct hostbuf *b = NULL;
		int r = sv->d->req_ops->tensor(s, tr, i, &t->box, &b, err, errlen);
		if (r < 0)
			return r;
		if ((t->name = strdup(tr->name)) == NULL)
			return -ENOMEM;
		sv->ntensors = i + 1;
		t->dtype = tr->dtype;
		t->nbytes = tr->nbytes;
		t->buf = hostbuf_ref(b);
		t->buf_off = tr->offset;
	}
	return save_tensors_unique(sv->tensors, sv->ntensors, err, errlen);
}

/* The save's tensors from a declared table (savetab.h): checked when it
 * was declared, so only copied, and the names shared. */
static int tensors_from_table(struct save *sv, const Ckpt__Save *m, char *err, size_t errlen)
{
	if (m->n_tensors) {
		snprintf(err, errlen, "a save names a table or carries tensors, not both");
		return -EINVAL;
	}
	const struct save_table *t = sv->d->req_ops->table(sv->session, m->table_id);
	if (t == NULL) {
		snprintf(err, errlen, "table %" PRIu64 " is not declared on this session", m->table_id);
		return -ENOENT;
	}
	sv->tensors = malloc((t->n ? t->n : 1) * sizeof(*sv->tensors));
	if (sv->tensors == NULL)
		return -ENOMEM;
	memcpy(sv->tensors, t->tensors, t->n * sizeof(*sv->tensors));
	for (size_t i = 0; i < t->n; i++)
		hostbuf_ref(sv->tensors[i].buf);
	sv->ntensors = t->n;
	sv->names = save_names_ref(t->names);
	return 0;
}

static int layout(struct save *sv, const Ckpt__Save *m, char *err, size_t errlen)
{
	const struct config *c = &sv->d->cfg;
	if (m->n_tensors > c->max_tensors) {
		snprintf(err, errlen, "%zu tensors, at most %u per save", m->n_tensors, c->max_tensors);
		return -E2BIG;
	}
	if (m->extra_state.len > c->max_extra_state) {
		snprintf(err, errlen, "extra state of %zu bytes, at most %u", m->extra_state.len, c->max_extra_state);
		return -E2BIG;
	}
	int r = m->table_id ? tensors_from_table(sv, m, err, errlen) : tensors_from_refs(sv, m, err, errlen);
	if (r < 0)
		return r;
	uint64_t off = 0;
	for (size_t i = 0; i < sv->ntensors; i++) {
		struct save_tensor *t = &sv->tensors[i];
		off = (off + SHARD_ALIGN - 1) & ~(uint64_t)(SHARD_ALIGN - 1);
		t->shard_off = off;
		/* off stays below the pool size, so neither line can wrap. */
		if (off > sv->d->pool.bytes || t->nbytes > sv->d->pool.bytes - off) {
			snprintf(err, errlen,
				 "save of more than %" PRIu64 " bytes can never fit the staging pool; "
				 "raise staging_bytes",
				 sv->d->pool.bytes);
			return -E2BIG;
		}
		off += t->nbytes;
	}
	r = open_events(sv, m, err, errlen);
	if (r < 0)
		return r;

	uint64_t cb = sv->d->pool.chunk_bytes;
	sv->shard_bytes = off;
	uint64_t nchunks = off / cb + (off % cb != 0);
	if (nchunks > sv->d->pool.nchunks) {
		snprintf(err, errlen,
			 "save of %" PRIu64 " bytes can never fit the staging pool of %" PRIu64
			 " bytes; raise staging_bytes",
			 off, sv->d->pool.bytes);
		return -E2BIG;
	}
	sv->nchunks = (uint32_t)nchunks;
	pool_shape(&sv->d->pool, off, &sv->whole, &sv->tail_slots);
	sv->pool_bytes = pool_shape_bytes(&sv->d->pool, sv->whole, sv->tail_slots);
	/* Pieces: each tensor split at chunk boundaries. */
	size_t np = 0;
	for (size_t i = 0; i < sv->ntensors; i++) {
		struct save_tensor *t = &sv->tensors[i];
		if (t->nbytes)
			np += (t->shard_off + t->nbytes - 1) / cb - t->shard_off / cb + 1;
	}
	sv->pieces = calloc(np ? np : 1, sizeof(*sv->pieces));
	sv->chunks = calloc(nchunks ? nchunks : 1, sizeof(*sv->chunks));
	sv->chunk_crc = calloc(nchunks ? nchunks : 1, sizeof(uint32_t));
	sv->jobs = calloc(nchunks ? nchunks : 1, sizeof(*sv->jobs));
	if (!sv->pieces || !sv->chunks || !sv->chunk_crc || !sv->jobs)
		return -ENOMEM;
	for (size_t i = 0; i < sv->ntensors; i++) {
		struct save_tensor *t = &sv->tensors[i];
		uint64_t done = 0;
		while (done < t->nbytes) {
			uint64_t at = t->shard_off + done;
			uint64_t room = cb - at % cb;
			uint64_t n = t->nbytes - done < room ? t->nbytes - done : room;
			sv->pieces[sv->npieces++] =
				(struct save_piece){ .tensor = (uint32_t)i, .tensor_off = done, .len = n };
			done += n;
		}
	}
	if (m->extra_state.len) {
		sv->extra = malloc(m->extra_state.len);
		if (sv->extra == NULL)
			return -ENOMEM;
		memcpy(sv->extra, m->extra_state.data, m->extra_state.len);
		sv->extra_len = m->extra_state.len;
	}
	return 0;
}

void save_start(struct daemon *d, const struct requester *rq, const Ckpt__Save *m)
{
	assert(d && d->req_ops && rq && rq->s && m);
	struct save *sv = calloc(1, sizeof(*sv));
	if (sv == NULL) {
		d->req_ops->reply(rq->s, rq->req_id, -ENOMEM, "out of memory");
		return;
	}
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

	if (rq->job[0] == '\0') {
		save_fail(sv, -EPERM, "this session said no job in Hello (a control session); it cannot save");
		return;
	}
	if (d->draining) {
		save_fail(sv, -ESHUTDOWN, "ckptd is shutting down and admits no new saves");
		return;
	}
	if (m->tier != CKPT__TIER__TIER_DURABLE && m->tier != CKPT__TIER__TIER_MEMORY &&
	    m->tier != CKPT__TIER__TIER_REPLICATED) {
		sv->tier = TIER_DURABLE;
		save_fail(sv, -EINVAL, "unknown tier %d", (int)m->tier);
		return;
	}
	if (sv->tier != TIER_DURABLE && !d->cfg.memory_tier) {
		save_fail(sv, -ENOTSUP,
			  "a %s save needs the memory tier, which is off in this ckptd ([pool] memory_tier)",
			  sv->tier == TIER_MEMORY ? "memory" : "replicated");
		return;
	}
	struct job_policy jp;
	config_job_policy(&d->cfg, sv->job, d->pool.bytes, &jp);
	sv->policy = rq->policy >= 0 ? (enum admit_policy)rq->policy : jp.policy;
	sv->quota_bytes = jp.quota_bytes;
	sv->spread = d->cfg.layout_spread;
	/* Per rank: a node holds as many ranks of a job as it has GPUs (or
	 * more), each with a save uploading and the next one staged. */
	if (rank_inflight_saves(d, sv->job, sv->rank) >= jp.max_inflight_saves) {
		save_fail(sv, -EBUSY, "%u saves of job '%s' rank %u are in flight (max_inflight_saves, per rank)",
			  jp.max_inflight_saves, sv->job, sv->rank);
		return;
	}
	const struct tenant_config *tc = config_tenant_of_job(&d->cfg, sv->job);
	uint32_t tn = 0;
	if (tc && tc->max_inflight_saves && (tenant_inflight(d, tc, &tn), tn >= tc->max_inflight_saves)) {
		save_fail(sv, -EBUSY, "tenant '%s' has %u saves in flight ([tenant.%s] max_inflight_saves)", tc->name,
			  tn, tc->name);
		return;
	}
	struct save *o;
	TAILQ_FOREACH (o, &d->saves, link) {
		if (o->step == sv->step && o->rank == sv->rank && strcmp(o->job, sv->job) == 0) {
			save_fail(sv, -EBUSY, "step %" PRIu64 " of job '%s' rank %u is already being saved", sv->step,
				  sv->job, sv->rank);
			return;
		}
	}
	char err[512];
	int r = layout(sv, m, err, sizeof(err));
	if (r < 0) {
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
	if (sv->shard_bytes > sv->quota_bytes) {
		save_fail(sv, -E2BIG,
			  "save of %" PRIu64 " bytes exceeds the quota of job '%s' (%" PRIu64
			  " bytes); raise its quota",
			  sv->shard_bytes, sv->job, sv->quota_bytes);
		return;
	}
	/* Only now, with layout() done, is shard_bytes the save's size. */
	if (tc && tc->quota_bytes && sv->shard_bytes > tc->quota_bytes) {
		save_fail(sv, -E2BIG, "save of %" PRIu64 " bytes exceeds tenant '%s''s quota of %" PRIu64 " bytes",
			  sv->shard_bytes, tc->name, tc->quota_bytes);
		return;
	}
	TAILQ_INSERT_TAIL(&d->saves, sv, link);
	sv->listed = true;
	d->nsaves++;
	/* FIFO within the job: nobody overtakes a save of its own job. */
	r = job_waiting(d, sv->job) ? -ENOSPC : try_admit(sv);
	if (r == 0) {
		save_set_state(sv, SAVE_STAGING);
		return;
	}
	const char *skip_quota;
	uint64_t skip_held;
	switch (sv->policy) {
	case POLICY_SKIP:
		d->stats.saves_skipped++;
		skip_quota = quota_hit(sv, &skip_held);
		char kept[200];
		kept_hint(d, kept, sizeof(kept));
		save_fail(sv, -EBUSY,
			  "no room for %" PRIu64 " bytes: %s holds %" PRIu64 " MiB not yet durable%s; "
			  "skipped (policy skip)",
			  sv->shard_bytes, skip_quota ? skip_quota : "the pool", skip_held >> 20, kept);
		return;
	case POLICY_COALESCE:
		if (supersede_older(sv) > 0 && !job_waiting(d, sv->job) && try_admit(sv) == 0) {
			save_set_state(sv, SAVE_STAGING);
			return;
		}
		save_set_state(sv, SAVE_ADMITTING);
		return;
	case POLICY_BLOCK: save_set_state(sv, SAVE_ADMITTING); return;
	}
}
