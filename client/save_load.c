/* Save, load, status and list: turning API calls into requests. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"

/* The wire form of a tensor table. dims holds 3 * CKPT_MAX_DIMS values per
 * tensor: global shape, box offsets, box lengths. */
struct tensor_set {
	Ckpt__TensorRef *refs;
	Ckpt__TensorRef **ptrs;
	uint64_t *dims;
	size_t n;
};

static void tensors_free(struct tensor_set *ts)
{
	free(ts->refs);
	free(ts->ptrs);
	free(ts->dims);
	memset(ts, 0, sizeof(*ts));
}

/* Cheap local checks, so that obvious mistakes fail here with a precise
 * message; the daemon checks everything again. */
int client_tensor_check(ckpt_client *c, size_t i, const ckpt_tensor *t, uint64_t *gs, uint64_t *bo, uint64_t *bl)
{
	const char *name = t->name ? t->name : "";
	size_t esize = ckpt_dtype_size(t->dtype);
	uint64_t elems = 1, bytes, end;

	if (!*name) {
		client_set_errmsgf("tensor %zu: empty name", i);
		return -EINVAL;
	}
	if (!esize) {
		client_set_errmsgf("tensor %zu (%s): unknown dtype %d", i, name, t->dtype);
		return -EINVAL;
	}
	if (t->ndim > CKPT_MAX_DIMS) {
		client_set_errmsgf("tensor %zu (%s): %u dims, at most %d", i, name, t->ndim, CKPT_MAX_DIMS);
		return -EINVAL;
	}
	if (t->ndim && !t->global_shape) {
		client_set_errmsgf("tensor %zu (%s): no global shape", i, name);
		return -EINVAL;
	}
	for (uint32_t d = 0; d < t->ndim; d++) {
		gs[d] = t->global_shape[d];
		bo[d] = t->box_offsets ? t->box_offsets[d] : 0;
		bl[d] = t->box_lengths ? t->box_lengths[d] : gs[d];
		if (bo[d] > gs[d] || bl[d] > gs[d] - bo[d]) {
			client_set_errmsgf("tensor %zu (%s): box exceeds the "
					   "global shape in dim %u",
					   i, name, d);
			return -EINVAL;
		}
		if (__builtin_mul_overflow(elems, bl[d], &elems)) {
			client_set_errmsgf("tensor %zu (%s): too many elements", i, name);
			return -EINVAL;
		}
	}
	if (__builtin_mul_overflow(elems, (uint64_t)esize, &bytes) || bytes != t->nbytes) {
		client_set_errmsgf("tensor %zu (%s): nbytes %llu does not match "
				   "the box (%llu elements of %zu bytes)",
				   i, name, (unsigned long long)t->nbytes, (unsigned long long)elems, esize);
		return -EINVAL;
	}
	if (!t->buffer || t->buffer->client != c) {
		client_set_errmsgf("tensor %zu (%s): buffer not registered "
				   "with this client",
				   i, name);
		return -EINVAL;
	}
	if (__builtin_add_overflow(t->offset, t->nbytes, &end) || end > t->buffer->size) {
		client_set_errmsgf("tensor %zu (%s): offset %llu + %llu bytes "
				   "exceeds the buffer (%zu bytes)",
				   i, name, (unsigned long long)t->offset, (unsigned long long)t->nbytes,
				   t->buffer->size);
		return -EINVAL;
	}
	return 0;
}

static int tensors_build(ckpt_client *c, const ckpt_tensor *t, size_t n, struct tensor_set *ts)
{
	int r;

	memset(ts, 0, sizeof(*ts));
	if (n && !t) {
		client_set_errmsg("tensors is NULL");
		return -EINVAL;
	}
	if (!n)
		return 0;
	ts->refs = calloc(n, sizeof(*ts->refs));
	ts->ptrs = calloc(n, sizeof(*ts->ptrs));
	ts->dims = calloc(n, 3 * CKPT_MAX_DIMS * sizeof(*ts->dims));
	if (!ts->refs || !ts->ptrs || !ts->dims) {
		tensors_free(ts);
		client_set_errmsg("");
		return -ENOMEM;
	}
	ts->n = n;
	for (size_t i = 0; i < n; i++) {
		Ckpt__TensorRef *ref = &ts->refs[i];
		uint64_t *gs = ts->dims + i * 3 * CKPT_MAX_DIMS;
		uint64_t *bo = gs + CKPT_MAX_DIMS, *bl = bo + CKPT_MAX_DIMS;

		r = client_tensor_check(c, i, &t[i], gs, bo, bl);
		if (r < 0) {
			tensors_free(ts);
			return r;
		}
		ckpt__tensor_ref__init(ref);
		ref->name = (char *)t[i].name;
		ref->dtype = (Ckpt__DType)t[i].dtype;
		ref->n_global_shape = t[i].ndim;
		ref->global_shape = gs;
		ref->n_box_offsets = t[i].ndim;
		ref->box_offsets = bo;
		ref->n_box_lengths = t[i].ndim;
		ref->box_lengths = bl;
		ref->buffer_id = t[i].buffer->id;
		ref->offset = t[i].offset;
		ref->nbytes = t[i].nbytes;
		ts->ptrs[i] = ref;
	}
	return 0;
}

int ckpt_save(ckpt_client *c, uint64_t step, const ckpt_tensor *tensors, size_t ntensors, const void *extra,
	      size_t extra_len, ckpt_future **out)
{
	return ckpt_save_ex(c, step, tensors, ntensors, extra, extra_len, NULL, out);
}

int ckpt_save_ex(ckpt_client *c, uint64_t step, const ckpt_tensor *tensors, size_t ntensors, const void *extra,
		 size_t extra_len, const ckpt_save_opts *opts, ckpt_future **out)
{
	Ckpt__Frame req = CKPT__FRAME__INIT;
	void *evstore = NULL;
	Ckpt__Save s = CKPT__SAVE__INIT;
	struct tensor_set ts;
	ckpt_future *f;
	int r;

	if (out)
		*out = NULL;
	if (!c || !out || (extra_len && !extra)) {
		client_set_errmsg("");
		return -EINVAL;
	}
	if (c->control) {
		client_set_errmsg("a control session (no job) cannot save");
		return -EINVAL;
	}
	if (opts && (opts->tier < CKPT_TIER_DURABLE || opts->tier > CKPT_TIER_REPLICATED)) {
		client_set_errmsgf("unknown tier %d", opts->tier);
		return -EINVAL;
	}
	if (opts && (opts->compress < CKPT_BY_JOB || opts->compress > CKPT_OFF || opts->incremental < CKPT_BY_JOB ||
		     opts->incremental > CKPT_OFF)) {
		client_set_errmsgf("unknown compress %d or incremental %d", opts->compress, opts->incremental);
		return -EINVAL;
	}
	if (opts && opts->tier != CKPT_TIER_DURABLE && !(c->capabilities & CKPT_CAP_TIERS)) {
		client_set_errmsg("this ckptd has no tiers (an older version): only durable saves");
		return -ENOTSUP;
	}
	r = tensors_build(c, tensors, ntensors, &ts);
	if (r < 0)
		return r;
	/* After the last write the caller queued: the daemon waits on it. */
	r = client_cuda_events(c, tensors, ntensors, opts ? opts->cuda_stream : NULL, &s, &evstore);
	if (r < 0) {
		tensors_free(&ts);
		return r;
	}
	f = future_new(PENDING_SAVE, step);
	if (f)
		f->tier = opts ? opts->tier : CKPT_TIER_DURABLE;
	if (!f) {
		free(evstore);
		tensors_free(&ts);
		client_set_errmsg("");
		return -ENOMEM;
	}
	s.step = step;
	s.tier = (Ckpt__Tier)(opts ? opts->tier : CKPT_TIER_DURABLE);
	s.compress = (Ckpt__Setting)(opts ? opts->compress : CKPT_BY_JOB);
	s.incremental = (Ckpt__Setting)(opts ? opts->incremental : CKPT_BY_JOB);
	s.n_tensors = ts.n;
	s.tensors = ts.ptrs;
	s.extra_state.data = (uint8_t *)extra;
	s.extra_state.len = extra_len;
	req.body_case = CKPT__FRAME__BODY_SAVE;
	req.save = &s;
	r = client_send_future(c, &req, f);
	tensors_free(&ts);
	free(evstore);
	if (r < 0) {
		future_unref(f);
		return r;
	}
	*out = f;
	return 0;
}

int ckpt_persist(ckpt_client *c, const char *job, uint64_t step, ckpt_future **out)
{
	return ckpt_persist_ex(c, job, step, 0, out);
}

int ckpt_persist_ex(ckpt_client *c, const char *job, uint64_t step, unsigned flags, ckpt_future **out)
{
	if (out)
		*out = NULL;
	if (!c || !out) {
		client_set_errmsg("");
		return -EINVAL;
	}
	ckpt_future *f = future_new(PENDING_SAVE, step);
	if (!f) {
		client_set_errmsg("");
		return -ENOMEM;
	}
	Ckpt__PersistRequest m = CKPT__PERSIST_REQUEST__INIT;
	m.job = (char *)(job ? job : "");
	m.step = step;
	m.replicas = (flags & CKPT_PERSIST_REPLICAS) != 0;
	Ckpt__Frame req = CKPT__FRAME__INIT;
	req.body_case = CKPT__FRAME__BODY_PERSIST;
	req.persist = &m;
	int r = client_send_future(c, &req, f);
	if (r < 0) {
		future_unref(f);
		return r;
	}
	*out = f;
	return 0;
}

int ckpt_load(ckpt_client *c, int64_t step, const ckpt_tensor *tensors, size_t ntensors, ckpt_future **out)
{
	return ckpt_load_ex(c, step, tensors, ntensors, 0, out);
}

int ckpt_load_ex(ckpt_client *c, int64_t step, const ckpt_tensor *tensors, size_t ntensors, unsigned flags,
		 ckpt_future **out)
{
	Ckpt__Frame req = CKPT__FRAME__INIT;
	Ckpt__Load l = CKPT__LOAD__INIT;
	struct tensor_set ts;
	ckpt_future *f;
	int r;

	if (out)
		*out = NULL;
	if (!c || !out || (step < 0 && step != CKPT_LATEST)) {
		client_set_errmsg("");
		return -EINVAL;
	}
	if (c->control) {
		client_set_errmsg("a control session (no job) cannot load");
		return -EINVAL;
	}
	r = tensors_build(c, tensors, ntensors, &ts);
	if (r < 0)
		return r;
	r = client_cuda_sync(tensors, ntensors);
	if (r < 0) {
		tensors_free(&ts);
		return r;
	}
	f = future_new(PENDING_LOAD, step < 0 ? 0 : (uint64_t)step);
	if (!f) {
		tensors_free(&ts);
		client_set_errmsg("");
		return -ENOMEM;
	}
	l.latest = step == CKPT_LATEST;
	l.storage_only = (flags & CKPT_LOAD_STORAGE_ONLY) != 0;
	l.step = step < 0 ? 0 : (uint64_t)step;
	l.n_tensors = ts.n;
	l.tensors = ts.ptrs;
	req.body_case = CKPT__FRAME__BODY_LOAD;
	req.load = &l;
	r = client_send_future(c, &req, f);
	tensors_free(&ts);
	if (r < 0) {
		future_unref(f);
		return r;
	}
	*out = f;
	return 0;
}

int ckpt_status(ckpt_client *c, ckpt_status_info *out)
{
	Ckpt__Frame req = CKPT__FRAME__INIT, *rep = NULL;
	Ckpt__StatusRequest sr = CKPT__STATUS_REQUEST__INIT;
	const Ckpt__StatusReply *s;
	int r;

	if (!c || !out) {
		client_set_errmsg("");
		return -EINVAL;
	}
	req.body_case = CKPT__FRAME__BODY_STATUS;
	req.status = &sr;
	r = client_call(c, &req, -1, &rep);
	if (r < 0)
		return r;
	if (rep->body_case != CKPT__FRAME__BODY_STATUS_REPLY) {
		ckpt__frame__free_unpacked(rep, NULL);
		client_set_errmsg("ckptd answered status with something else");
		return -EPROTO;
	}
	s = rep->status_reply;
	memset(out, 0, sizeof(*out));
	out->sessions = s->sessions;
	out->pool_bytes = s->pool_bytes;
	out->pool_used_bytes = s->pool_used_bytes;
	out->chunk_bytes = s->chunk_bytes;
	out->inflight_saves = s->inflight_saves;
	out->waiting_saves = s->waiting_saves;
	out->saves_total = s->saves_total;
	out->saves_failed = s->saves_failed;
	out->bytes_staged = s->bytes_staged;
	out->bytes_durable = s->bytes_durable;
	out->bytes_restored = s->bytes_restored;
	out->pool_held_bytes = s->pool_held_bytes;
	out->saves_superseded = s->saves_superseded;
	out->saves_skipped = s->saves_skipped;
	out->bytes_restored_memory = s->bytes_restored_memory;
	out->restores_from_memory = s->restores_from_memory;
	out->restores_from_storage = s->restores_from_storage;
	out->reclaimed_bytes = s->reclaimed_bytes;
	out->uptime_ns = s->uptime_ns;
	out->cpu_ns = s->cpu_ns;
	out->peak_rss_bytes = s->peak_rss_bytes;
	out->nheld = (uint32_t)s->n_held;
	for (size_t i = 0; i < s->n_held && i < CKPT_STATUS_MAX_HELD; i++) {
		client_copy_held(&out->held[i], s->held[i]);
	}
	out->ntenants = 0;
	for (size_t i = 0; i < s->n_tenants && i < CKPT_STATUS_MAX_TENANTS; i++) {
		const Ckpt__TenantStatus *t = s->tenants[i];
		ckpt_tenant_info *o = &out->tenants[out->ntenants++];
		snprintf(o->name, sizeof(o->name), "%s", t->name ? t->name : "");
		o->sessions = t->sessions;
		o->inflight_saves = t->inflight_saves;
		o->pool_bytes = t->pool_bytes;
	}
	out->recovered_files = s->recovered_files;
	for (size_t i = 0; i < s->n_recovered && i < CKPT_STATUS_MAX_RECOVERED; i++)
		snprintf(out->recovered[out->nrecovered++], sizeof(out->recovered[0]), "%s",
			 s->recovered[i] ? s->recovered[i] : "");
	for (size_t i = 0; i < s->n_failures && i < CKPT_STATUS_MAX_FAILURES; i++) {
		const Ckpt__SaveFailure *f = s->failures[i];
		ckpt_failure_info *o = &out->failures[out->nfailures++];
		snprintf(o->job, sizeof(o->job), "%s", f->job ? f->job : "");
		o->step = f->step;
		o->rank = f->rank;
		o->status = wire_errno(f->status);
		snprintf(o->message, sizeof(o->message), "%s", f->message ? f->message : "");
		o->unix_ns = f->unix_ns;
	}
	snprintf(out->storage, sizeof(out->storage), "%s", s->storage ? s->storage : "");
	snprintf(out->cuda, sizeof(out->cuda), "%s", s->cuda ? s->cuda : "");
	ckpt__frame__free_unpacked(rep, NULL);
	return 0;
}
