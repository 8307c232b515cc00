/* Futures: one per save or load. Refcounted: the user holds one reference
 * until ckpt_future_free(), the client's request table one while the request
 * is outstanding, and whoever runs callbacks one for the duration. */
#include <errno.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "client_internal.h"
#include "wire.h"

#define FAIL_BIT 1u

ckpt_future *future_new(enum pending_kind kind, uint64_t step)
{
	ckpt_future *f = calloc(1, sizeof(*f));
	pthread_condattr_t ca;

	if (!f)
		return NULL;
	if (pthread_condattr_init(&ca)) {
		free(f);
		return NULL;
	}
	/* Timeouts must not jump with the wall clock. */
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	if (pthread_cond_init(&f->cv, &ca)) {
		pthread_condattr_destroy(&ca);
		free(f);
		return NULL;
	}
	pthread_condattr_destroy(&ca);
	pthread_mutex_init(&f->mu, NULL);
	atomic_init(&f->refs, 1);
	f->kind = kind;
	f->step = step;
	f->node.kind = kind;
	f->node.future = f;
	return f;
}

void future_ref(ckpt_future *f)
{
	atomic_fetch_add_explicit(&f->refs, 1, memory_order_relaxed);
}

void future_unref(ckpt_future *f)
{
	if (!f)
		return;
	if (atomic_fetch_sub_explicit(&f->refs, 1, memory_order_acq_rel) != 1)
		return;
	pthread_cond_destroy(&f->cv);
	pthread_mutex_destroy(&f->mu);
	free(f->message);
	free(f->repl_message);
	free(f->extra);
	for (size_t i = 0; i < f->ntensors; i++) {
		free(f->tensor_names[i]);
		free(f->tensor_sources[i]);
	}
	free(f->tensor_names);
	free(f->tensor_sources);
	free(f);
}

/* A save ends at its tier's last phase: durable; kept (memory); kept and
 * replicated (replicated). */
static bool finished_locked(const ckpt_future *f)
{
	if (f->status != 0 || f->durable || f->loaded)
		return true;
	return f->tier != CKPT_TIER_DURABLE && f->kept && (f->tier != CKPT_TIER_REPLICATED || f->replicated);
}

static void fail_locked(ckpt_future *f, int status, const char *msg)
{
	if (finished_locked(f))
		return;
	f->status = status < 0 ? status : -EIO;
	free(f->message);
	f->message = strdup(msg ? msg : "");
	pthread_cond_broadcast(&f->cv);
}

void future_fail(ckpt_future *f, int status, const char *msg)
{
	pthread_mutex_lock(&f->mu);
	fail_locked(f, status, msg);
	pthread_mutex_unlock(&f->mu);
}

/* A save's event (staged, durable, kept, replicated or failed) into a
 * save's future. */
static void apply_save_locked(ckpt_future *f, const Ckpt__Frame *fr)
{
	switch (fr->body_case) {
	case CKPT__FRAME__BODY_SAVE_STAGED:
		f->staged = true;
		f->bytes = fr->save_staged->bytes;
		f->stall_ns = fr->save_staged->stall_ns;
		break;
	case CKPT__FRAME__BODY_SAVE_DURABLE:
		/* durable implies staged, even if that event was lost */
		f->staged = true;
		f->durable = true;
		f->bytes = fr->save_durable->bytes;
		break;
	case CKPT__FRAME__BODY_SAVE_KEPT:
		f->staged = true;
		f->kept = true;
		f->bytes = fr->save_kept->bytes;
		break;
	case CKPT__FRAME__BODY_SAVE_REPLICATED:
		if (f->replicated)
			break;
		f->replicated = true;
		f->replicas = fr->save_replicated->copies;
		f->repl_status = wire_errno(fr->save_replicated->status);
		if (f->repl_status)
			f->repl_message = strdup(fr->save_replicated->message ? fr->save_replicated->message : "");
		break;
	case CKPT__FRAME__BODY_SAVE_FAILED:
		fail_locked(f, wire_errno(fr->save_failed->status), fr->save_failed->message);
		break;
	default:
		/* future_apply passes only a save's events */
		break;
	}
}

/* A load's result into a load's future: the extra state and the tensors'
 * names and sources copied. */
static void apply_loaded_locked(ckpt_future *f, const Ckpt__Loaded *l)
{
	if (l->extra_state.len) {
		f->extra = malloc(l->extra_state.len);
		if (!f->extra) {
			fail_locked(f, -ENOMEM, "out of memory for extra state");
			return;
		}
		memcpy(f->extra, l->extra_state.data, l->extra_state.len);
		f->extra_len = l->extra_state.len;
	}
	if (l->n_tensors) {
		f->tensor_names = calloc(l->n_tensors, sizeof(char *));
		f->tensor_sources = calloc(l->n_tensors, sizeof(char *));
		if (!f->tensor_names || !f->tensor_sources) {
			fail_locked(f, -ENOMEM, "out of memory");
			return;
		}
		f->ntensors = l->n_tensors;
		for (size_t i = 0; i < l->n_tensors; i++) {
			f->tensor_names[i] = strdup(l->tensors[i]->name);
			f->tensor_sources[i] = strdup(l->tensors[i]->source);
		}
	}
	snprintf(f->source, sizeof(f->source), "%s", l->source ? l->source : "");
	snprintf(f->peer, sizeof(f->peer), "%s", l->peer ? l->peer : "");
	f->step = l->step;
	f->bytes = l->bytes;
	f->loaded = true;
}

bool future_apply(ckpt_future *f, const Ckpt__Frame *fr)
{
	bool done;

	pthread_mutex_lock(&f->mu);
	if (finished_locked(f)) {
		pthread_mutex_unlock(&f->mu);
		return true;
	}
	switch (fr->body_case) {
	case CKPT__FRAME__BODY_SAVE_STAGED:
	case CKPT__FRAME__BODY_SAVE_DURABLE:
	case CKPT__FRAME__BODY_SAVE_KEPT:
	case CKPT__FRAME__BODY_SAVE_REPLICATED:
	case CKPT__FRAME__BODY_SAVE_FAILED:
		if (f->kind == PENDING_SAVE)
			apply_save_locked(f, fr);
		break;
	case CKPT__FRAME__BODY_LOADED:
		if (f->kind == PENDING_LOAD)
			apply_loaded_locked(f, fr->loaded);
		break;
	case CKPT__FRAME__BODY_LOAD_FAILED:
		if (f->kind != PENDING_LOAD)
			break;
		fail_locked(f, wire_errno(fr->load_failed->status), fr->load_failed->message);
		break;
	case CKPT__FRAME__BODY_REPLY:
		/* A plain reply with status 0 carries nothing for a future. */
		if (fr->reply->status != 0)
			fail_locked(f, wire_errno(fr->reply->status), fr->reply->message);
		break;
	default:
		/* Not addressed to a future: ignore rather than guess. */
		break;
	}
	pthread_cond_broadcast(&f->cv);
	done = finished_locked(f);
	pthread_mutex_unlock(&f->mu);
	return done;
}

/* The next callback owed, or 0. Marks it delivered. */
static unsigned next_event_locked(ckpt_future *f, ckpt_phase *phase, int *status)
{
	static const ckpt_phase order[] = { CKPT_STAGED, CKPT_KEPT, CKPT_REPLICATED, CKPT_DURABLE, CKPT_LOADED };

	for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
		ckpt_phase p = order[i];
		bool reached = (p == CKPT_STAGED && f->staged) || (p == CKPT_KEPT && f->kept) ||
			       (p == CKPT_REPLICATED && f->replicated) || (p == CKPT_DURABLE && f->durable) ||
			       (p == CKPT_LOADED && f->loaded);

		if (reached && !(f->delivered & (1u << p))) {
			f->delivered |= 1u << p;
			*phase = p;
			*status = p == CKPT_REPLICATED ? f->repl_status : 0;
			return 1;
		}
	}
	if (f->status && !(f->delivered & FAIL_BIT)) {
		f->delivered |= FAIL_BIT;
		if (f->kind == PENDING_LOAD)
			*phase = CKPT_LOADED;
		else if (!f->staged)
			*phase = CKPT_STAGED;
		else
			*phase = f->tier == CKPT_TIER_DURABLE ? CKPT_DURABLE : CKPT_KEPT;
		*status = f->status;
		return 1;
	}
	return 0;
}

void future_dispatch(ckpt_future *f)
{
	ckpt_phase phase;
	int status;

	pthread_mutex_lock(&f->mu);
	/* One dispatcher at a time keeps callbacks in phase order; a
	 * concurrent one leaves its events to the running one. */
	if (f->dispatching) {
		pthread_mutex_unlock(&f->mu);
		return;
	}
	f->dispatching = true;
	f->dispatcher = pthread_self();
	while (f->cb && next_event_locked(f, &phase, &status)) {
		ckpt_future_cb cb = f->cb;
		void *user = f->cb_user;

		pthread_mutex_unlock(&f->mu);
		cb(f, phase, status, user);
		pthread_mutex_lock(&f->mu);
	}
	f->dispatching = false;
	pthread_cond_broadcast(&f->cv); /* ckpt_future_free may wait for this */
	pthread_mutex_unlock(&f->mu);
}

/* The phases a future can reach: a memory save never becomes durable
 * (ckpt_persist's future does), only a replicated one is replicated. */
static int phase_valid(const ckpt_future *f, int phase)
{
	if (f->kind != PENDING_SAVE)
		return phase == CKPT_LOADED;
	switch (phase) {
	case CKPT_STAGED: return 1;
	case CKPT_DURABLE: return f->tier == CKPT_TIER_DURABLE;
	case CKPT_KEPT: return f->tier != CKPT_TIER_DURABLE;
	case CKPT_REPLICATED: return f->tier == CKPT_TIER_REPLICATED;
	default: return 0;
	}
}

static bool reached_locked(const ckpt_future *f, int phase)
{
	switch (phase) {
	case CKPT_STAGED: return f->staged;
	case CKPT_KEPT: return f->kept;
	case CKPT_REPLICATED: return f->replicated;
	case CKPT_DURABLE: return f->durable;
	case CKPT_LOADED: return f->loaded;
	default: return false;
	}
}

int ckpt_future_wait(ckpt_future *f, ckpt_phase phase, int timeout_ms)
{
	struct timespec deadline;
	int r;

	if (!f || !phase_valid(f, phase)) {
		client_set_errmsg(
			f && f->kind == PENDING_SAVE &&
					(phase == CKPT_DURABLE || phase == CKPT_KEPT || phase == CKPT_REPLICATED)
				? "this save's tier never reaches that phase (a memory save becomes "
				  "durable through ckpt_persist)"
				: "");
		return -EINVAL;
	}
	if (timeout_ms > 0) {
		clock_gettime(CLOCK_MONOTONIC, &deadline);
		deadline.tv_sec += timeout_ms / 1000;
		deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
		if (deadline.tv_nsec >= 1000000000L) {
			deadline.tv_sec++;
			deadline.tv_nsec -= 1000000000L;
		}
	}
	pthread_mutex_lock(&f->mu);
	for (;;) {
		if (reached_locked(f, phase)) {
			r = phase == CKPT_REPLICATED ? f->repl_status : 0;
			if (r)
				client_set_errmsg(f->repl_message ? f->repl_message : "");
			break;
		}
		if (f->status) {
			r = f->status;
			client_set_errmsg(f->message);
			break;
		}
		if (timeout_ms == 0) {
			r = -ETIMEDOUT;
			break;
		}
		if (timeout_ms < 0) {
			pthread_cond_wait(&f->cv, &f->mu);
		} else if (pthread_cond_timedwait(&f->cv, &f->mu, &deadline) == ETIMEDOUT) {
			/* one last look before giving up */
			timeout_ms = 0;
		}
	}
	pthread_mutex_unlock(&f->mu);
	return r;
}

int ckpt_future_poll(ckpt_future *f, ckpt_phase phase)
{
	int r;

	if (!f || !phase_valid(f, phase))
		return -EINVAL;
	pthread_mutex_lock(&f->mu);
	if (reached_locked(f, phase))
		r = phase == CKPT_REPLICATED && f->repl_status ? f->repl_status : 1;
	else
		r = f->status;
	pthread_mutex_unlock(&f->mu);
	return r;
}

const char *ckpt_future_message(ckpt_future *f)
{
	const char *m;

	if (!f)
		return "";
	/* set once, before status becomes visible, and never changed */
	pthread_mutex_lock(&f->mu);
	m = f->status && f->message ? f->message : f->repl_message ? f->repl_message : "";
	pthread_mutex_unlock(&f->mu);
	return m;
}

uint32_t ckpt_future_replicas(ckpt_future *f)
{
	uint32_t v;

	if (!f)
		return 0;
	pthread_mutex_lock(&f->mu);
	v = f->replicas;
	pthread_mutex_unlock(&f->mu);
	return v;
}

uint64_t ckpt_future_stall_ns(ckpt_future *f)
{
	uint64_t v;

	if (!f)
		return 0;
	pthread_mutex_lock(&f->mu);
	v = f->stall_ns;
	pthread_mutex_unlock(&f->mu);
	return v;
}

uint64_t ckpt_future_bytes(ckpt_future *f)
{
	uint64_t v;

	if (!f)
		return 0;
	pthread_mutex_lock(&f->mu);
	v = f->bytes;
	pthread_mutex_unlock(&f->mu);
	return v;
}

uint64_t ckpt_future_step(ckpt_future *f)
{
	uint64_t v;

	if (!f)
		return 0;
	pthread_mutex_lock(&f->mu);
	v = f->step;
	pthread_mutex_unlock(&f->mu);
	return v;
}

const char *ckpt_future_source(ckpt_future *f)
{
	const char *p = "";

	if (f) {
		pthread_mutex_lock(&f->mu);
		if (f->loaded)
			p = f->source;
		pthread_mutex_unlock(&f->mu);
	}
	return p;
}

const char *ckpt_future_peer(ckpt_future *f)
{
	const char *p = "";

	if (f) {
		pthread_mutex_lock(&f->mu);
		if (f->loaded)
			p = f->peer;
		pthread_mutex_unlock(&f->mu);
	}
	return p;
}

const char *ckpt_future_tensor_source(ckpt_future *f, size_t i, const char **name)
{
	const char *src = NULL;

	if (name)
		*name = NULL;
	if (f) {
		pthread_mutex_lock(&f->mu);
		if (f->loaded && i < f->ntensors) {
			src = f->tensor_sources[i];
			if (name)
				*name = f->tensor_names[i];
		}
		pthread_mutex_unlock(&f->mu);
	}
	return src;
}

const void *ckpt_future_extra(ckpt_future *f, size_t *len)
{
	const void *p = NULL;
	size_t n = 0;

	if (f) {
		pthread_mutex_lock(&f->mu);
		if (f->loaded) {
			p = f->extra;
			n = f->extra_len;
		}
		pthread_mutex_unlock(&f->mu);
	}
	if (len)
		*len = n;
	return p;
}

int ckpt_future_set_callback(ckpt_future *f, ckpt_future_cb cb, void *user)
{
	if (!f)
		return -EINVAL;
	pthread_mutex_lock(&f->mu);
	f->cb = cb;
	f->cb_user = user;
	/* a new callback hears about every phase, old ones included */
	f->delivered = 0;
	pthread_mutex_unlock(&f->mu);
	/* Phases already reached are reported now, on this thread. */
	future_ref(f);
	future_dispatch(f);
	future_unref(f);
	return 0;
}

void ckpt_future_free(ckpt_future *f)
{
	if (!f)
		return;
	/* No callback runs once this returns: one running on another thread
	 * finishes first, so that the caller may free what its user pointer
	 * points to (a callback may free its own future: it does not wait
	 * for itself). */
	pthread_mutex_lock(&f->mu);
	f->cb = NULL;
	f->cb_user = NULL;
	while (f->dispatching && !pthread_equal(f->dispatcher, pthread_self()))
		pthread_cond_wait(&f->cv, &f->mu);
	pthread_mutex_unlock(&f->mu);
	future_unref(f);
}
