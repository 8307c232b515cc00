/* Tensor tables (ckpt.h: ckpt_table_create): a save's tensors declared
 * once in one compact DeclareTable, then named by each save. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"

/* DeclareTable's arrays, one entry per tensor (dims: 3 * ndim each). */
struct table_msg {
	char *names;
	size_t names_len;
	Ckpt__DType *dtype;
	uint32_t *ndim;
	uint64_t *dims, *buffer_id, *offset, *nbytes;
	size_t ndims;
};

static void table_msg_free(struct table_msg *m)
{
	free(m->names);
	free(m->dtype);
	free(m->ndim);
	free(m->dims);
	free(m->buffer_id);
	free(m->offset);
	free(m->nbytes);
}

static int table_msg_build(ckpt_client *c, const ckpt_tensor *t, size_t n, struct table_msg *m)
{
	size_t len = 0;
	for (size_t i = 0; i < n; i++)
		len += strlen(t[i].name ? t[i].name : "") + 1;
	size_t k = n ? n : 1;
	m->names = malloc(len ? len : 1);
	m->dtype = calloc(k, sizeof(*m->dtype));
	m->ndim = calloc(k, sizeof(*m->ndim));
	m->dims = calloc(k * 3 * CKPT_MAX_DIMS, sizeof(*m->dims));
	m->buffer_id = calloc(k, sizeof(*m->buffer_id));
	m->offset = calloc(k, sizeof(*m->offset));
	m->nbytes = calloc(k, sizeof(*m->nbytes));
	if (!m->names || !m->dtype || !m->ndim || !m->dims || !m->buffer_id || !m->offset || !m->nbytes) {
		client_set_errmsg("");
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		uint64_t gs[CKPT_MAX_DIMS], bo[CKPT_MAX_DIMS], bl[CKPT_MAX_DIMS];
		int r = client_tensor_check(c, i, &t[i], gs, bo, bl);
		if (r < 0)
			return r;
		if (t[i].buffer->cuda) {
			client_set_errmsgf("tensor %zu (%s): a CUDA buffer; a table holds host buffers only "
					   "(save CUDA tensors with ckpt_save_ex)",
					   i, t[i].name);
			return -ENOTSUP;
		}
		size_t nl = strlen(t[i].name) + 1;
		memcpy(m->names + m->names_len, t[i].name, nl);
		m->names_len += nl;
		uint32_t nd = t[i].ndim;
		m->dtype[i] = (Ckpt__DType)t[i].dtype;
		m->ndim[i] = nd;
		memcpy(m->dims + m->ndims, gs, nd * sizeof(*gs));
		memcpy(m->dims + m->ndims + nd, bo, nd * sizeof(*bo));
		memcpy(m->dims + m->ndims + 2 * nd, bl, nd * sizeof(*bl));
		m->ndims += 3 * (size_t)nd;
		m->buffer_id[i] = t[i].buffer->id;
		m->offset[i] = t[i].offset;
		m->nbytes[i] = t[i].nbytes;
	}
	return 0;
}

int ckpt_table_create(ckpt_client *c, const ckpt_tensor *tensors, size_t ntensors, ckpt_table **out)
{
	if (out)
		*out = NULL;
	if (!c || !out || (ntensors && !tensors)) {
		client_set_errmsg("");
		return -EINVAL;
	}
	if (c->control) {
		client_set_errmsg("a control session (no job) cannot save");
		return -EINVAL;
	}
	if (!(c->capabilities & CKPT_CAP_TABLES)) {
		client_set_errmsg("this ckptd has no tensor tables (an older version); save without one");
		return -ENOTSUP;
	}
	ckpt_table *t = calloc(1, sizeof(*t));
	if (!t) {
		client_set_errmsg("");
		return -ENOMEM;
	}
	struct table_msg m = { 0 };
	int r = table_msg_build(c, tensors, ntensors, &m);
	if (r < 0) {
		table_msg_free(&m);
		free(t);
		return r;
	}
	pthread_mutex_lock(&c->mu);
	t->id = c->next_table_id++;
	pthread_mutex_unlock(&c->mu);
	t->n = ntensors;
	Ckpt__DeclareTable d = CKPT__DECLARE_TABLE__INIT;
	d.table_id = t->id;
	d.names.data = (uint8_t *)m.names;
	d.names.len = m.names_len;
	d.n_dtype = ntensors;
	d.dtype = m.dtype;
	d.n_ndim = ntensors;
	d.ndim = m.ndim;
	d.n_dims = m.ndims;
	d.dims = m.dims;
	d.n_buffer_id = ntensors;
	d.buffer_id = m.buffer_id;
	d.n_offset = ntensors;
	d.offset = m.offset;
	d.n_nbytes = ntensors;
	d.nbytes = m.nbytes;
	Ckpt__Frame req = CKPT__FRAME__INIT, *rep = NULL;
	req.body_case = CKPT__FRAME__BODY_DECLARE_TABLE;
	req.declare_table = &d;
	r = client_call(c, &req, -1, &rep);
	table_msg_free(&m);
	if (r < 0) {
		free(t);
		return r;
	}
	ckpt__frame__free_unpacked(rep, NULL);
	client_ref(c);
	t->client = c;
	*out = t;
	return 0;
}

size_t ckpt_table_size(const ckpt_table *t)
{
	return t ? t->n : 0;
}

int ckpt_save_table(ckpt_client *c, uint64_t step, const ckpt_table *t, const void *extra, size_t extra_len,
		    ckpt_future **out)
{
	return ckpt_save_table_ex(c, step, t, extra, extra_len, NULL, out);
}

int ckpt_save_table_ex(ckpt_client *c, uint64_t step, const ckpt_table *t, const void *extra, size_t extra_len,
		       const ckpt_save_opts *opts, ckpt_future **out)
{
	int tier = opts ? opts->tier : CKPT_TIER_DURABLE;
	if (out)
		*out = NULL;
	if (!c || !t || !out || (extra_len && !extra)) {
		client_set_errmsg("");
		return -EINVAL;
	}
	if (tier < CKPT_TIER_DURABLE || tier > CKPT_TIER_REPLICATED) {
		client_set_errmsgf("unknown tier %d", tier);
		return -EINVAL;
	}
	if (opts && (opts->compress < CKPT_BY_JOB || opts->compress > CKPT_OFF || opts->incremental < CKPT_BY_JOB ||
		     opts->incremental > CKPT_OFF)) {
		client_set_errmsgf("unknown compress %d or incremental %d", opts->compress, opts->incremental);
		return -EINVAL;
	}
	if (tier != CKPT_TIER_DURABLE && !(c->capabilities & CKPT_CAP_TIERS)) {
		client_set_errmsg("this ckptd has no tiers (an older version): only durable saves");
		return -ENOTSUP;
	}
	if (t->client != c) {
		client_set_errmsg("the table belongs to another client");
		return -EINVAL;
	}
	ckpt_future *f = future_new(PENDING_SAVE, step);
	if (!f) {
		client_set_errmsg("");
		return -ENOMEM;
	}
	f->tier = tier;
	Ckpt__Save s = CKPT__SAVE__INIT;
	s.step = step;
	s.tier = (Ckpt__Tier)tier;
	s.compress = (Ckpt__Setting)(opts ? opts->compress : CKPT_BY_JOB);
	s.incremental = (Ckpt__Setting)(opts ? opts->incremental : CKPT_BY_JOB);
	s.table_id = t->id;
	s.extra_state.data = (uint8_t *)extra;
	s.extra_state.len = extra_len;
	Ckpt__Frame req = CKPT__FRAME__INIT;
	req.body_case = CKPT__FRAME__BODY_SAVE;
	req.save = &s;
	int r = client_send_future(c, &req, f);
	if (r < 0) {
		future_unref(f);
		return r;
	}
	*out = f;
	return 0;
}

void ckpt_table_free(ckpt_table *t)
{
	if (!t)
		return;
	ckpt_client *c = t->client;
	char saved[CLIENT_ERRMSG_LEN];
	/* a void cleanup call must not clobber the caller's ckpt_errmsg() */
	snprintf(saved, sizeof(saved), "%s", ckpt_errmsg());
	Ckpt__DropTable d = CKPT__DROP_TABLE__INIT;
	d.table_id = t->id;
	Ckpt__Frame req = CKPT__FRAME__INIT, *rep = NULL;
	req.body_case = CKPT__FRAME__BODY_DROP_TABLE;
	req.drop_table = &d;
	/* Best effort: on a closed session the daemon dropped it already. */
	if (client_call(c, &req, -1, &rep) == 0)
		ckpt__frame__free_unpacked(rep, NULL);
	client_set_errmsg(saved);
	free(t);
	client_unref(c);
}
