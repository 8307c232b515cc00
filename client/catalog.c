/* The catalogue's calls: list, wait, show, verify, resolve, held, delete,
 * gc, metrics. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"

void client_copy_step(ckpt_step_info *o, const Ckpt__StepInfo *s)
{
	memset(o, 0, sizeof(*o));
	if (s == NULL)
		return;
	snprintf(o->job, sizeof(o->job), "%s", s->job ? s->job : "");
	o->step = s->step;
	o->complete = s->complete ? 1 : 0;
	o->bytes = s->bytes;
	o->ranks_present = s->ranks_present;
	o->world_size = s->world_size;
	snprintf(o->attempt_id, sizeof(o->attempt_id), "%s", s->attempt_id ? s->attempt_id : "");
	o->bytes_unlisted = s->bytes_unlisted ? 1 : 0;
	o->saved_unix_ns = s->saved_unix_ns;
	snprintf(o->tier, sizeof(o->tier), "%s", s->tier ? s->tier : "");
	snprintf(o->where, sizeof(o->where), "%s", s->where ? s->where : "");
}

void client_copy_held(ckpt_held_info *o, const Ckpt__HeldCopy *h)
{
	memset(o, 0, sizeof(*o));
	snprintf(o->job, sizeof(o->job), "%s", h->job ? h->job : "");
	snprintf(o->attempt_id, sizeof(o->attempt_id), "%s", h->attempt_id ? h->attempt_id : "");
	o->rank = h->rank;
	o->world_size = h->world_size;
	o->step = h->step;
	o->bytes = h->bytes;
	o->tier = (int)h->tier;
	o->durable = h->durable ? 1 : 0;
	snprintf(o->peer, sizeof(o->peer), "%s", h->peer ? h->peer : "");
}

/* A request frame with msg as its body: FRAME(DELETE, delete_, &m) is
 * body case CKPT__FRAME__BODY_DELETE in field delete_. */
#define FRAME(body, field, msg) \
	(Ckpt__Frame) \
	{ \
		.base = PROTOBUF_C_MESSAGE_INIT(&ckpt__frame__descriptor), .body_case = CKPT__FRAME__BODY_##body, \
		.field = (msg) \
	}

/* Send req and wait for the reply, which must be of body case want; the
 * caller hands it to answered(). 0 or -errno (ckpt_errmsg() says why). */
static int ask(ckpt_client *c, Ckpt__Frame req, int want, Ckpt__Frame **rep)
{
	int r = client_call(c, &req, -1, rep);
	if (r < 0)
		return r;
	if ((int)(*rep)->body_case != want) {
		ckpt__frame__free_unpacked(*rep, NULL);
		*rep = NULL;
		client_set_errmsg("ckptd answered with an unexpected message");
		return -EPROTO;
	}
	return 0;
}

/* The end of a call: rep freed, r returned (-ENOMEM: out of memory
 * copying the reply, ckpt_errmsg() empty). */
static int answered(Ckpt__Frame *rep, int r)
{
	ckpt__frame__free_unpacked(rep, NULL);
	if (r == -ENOMEM)
		client_set_errmsg("");
	return r;
}

static int bad_args(void)
{
	client_set_errmsg("");
	return -EINVAL;
}

/* One allocation: the struct, the tensor array, then the names. */
static ckpt_step_detail *step_detail(const Ckpt__ShowReply *s)
{
	size_t n = 0, names = 0;
	for (size_t i = 0; i < s->n_manifests; i++)
		for (size_t k = 0; k < s->manifests[i]->n_tensors; k++) {
			n++;
			names += strlen(s->manifests[i]->tensors[k]->name) + 1;
		}
	ckpt_step_detail *d = calloc(1, sizeof(ckpt_step_detail) + n * sizeof(ckpt_tensor_info) + names);
	if (d == NULL)
		return NULL;
	client_copy_step(&d->info, s->info);
	d->tensors = (ckpt_tensor_info *)(d + 1);
	char *np = (char *)(d->tensors + n);
	for (size_t i = 0; i < s->n_manifests; i++) {
		const Ckpt__Manifest *m = s->manifests[i];
		for (size_t k = 0; k < m->n_tensors; k++) {
			const Ckpt__ManifestTensor *t = m->tensors[k];
			ckpt_tensor_info *o = &d->tensors[d->ntensors++];
			o->rank = m->rank;
			o->name = np;
			size_t l = strlen(t->name) + 1;
			memcpy(np, t->name, l);
			np += l;
			o->dtype = (int)t->dtype;
			o->ndim = (uint32_t)(t->n_global_shape < CKPT_MAX_DIMS ? t->n_global_shape : CKPT_MAX_DIMS);
			for (uint32_t j = 0; j < o->ndim; j++) {
				o->global_shape[j] = t->global_shape[j];
				o->box_offsets[j] = j < t->n_box_offsets ? t->box_offsets[j] : 0;
				o->box_lengths[j] = j < t->n_box_lengths ? t->box_lengths[j] : t->global_shape[j];
			}
			o->shard_offset = t->shard_offset;
			o->nbytes = t->nbytes;
			o->crc32c = t->crc32c;
		}
	}
	return d;
}

static int show(ckpt_client *c, const char *job, uint64_t step, int64_t rank, ckpt_step_detail **out)
{
	if (!c || !job || !out)
		return bad_args();
	*out = NULL;
	Ckpt__ShowRequest m = CKPT__SHOW_REQUEST__INIT;
	m.job = (char *)job;
	m.step = step;
	m.one_rank = rank >= 0;
	m.rank = rank >= 0 ? (uint32_t)rank : 0;
	Ckpt__Frame *rep;
	int r = ask(c, FRAME(SHOW, show, &m), CKPT__FRAME__BODY_SHOW_REPLY, &rep);
	if (r < 0)
		return r;
	*out = step_detail(rep->show_reply);
	return answered(rep, *out ? 0 : -ENOMEM);
}

int ckpt_show(ckpt_client *c, const char *job, uint64_t step, ckpt_step_detail **out)
{
	return show(c, job, step, -1, out);
}

int ckpt_show_rank(ckpt_client *c, const char *job, uint64_t step, uint32_t rank, ckpt_step_detail **out)
{
	return show(c, job, step, rank, out);
}

void ckpt_step_detail_free(ckpt_step_detail *d)
{
	free(d);
}

static int verify(ckpt_client *c, Ckpt__VerifyRequest *m, ckpt_verify_result **out);

int ckpt_verify(ckpt_client *c, const char *job, uint64_t step, ckpt_verify_result **out)
{
	if (!c || !job || !out)
		return bad_args();
	*out = NULL;
	Ckpt__VerifyRequest m = CKPT__VERIFY_REQUEST__INIT;
	m.job = (char *)job;
	m.step = step;
	return verify(c, &m, out);
}

int ckpt_verify_rank(ckpt_client *c, const char *job, uint64_t step, uint32_t rank, uint32_t world_size,
		     const char *attempt_id, ckpt_verify_result **out)
{
	if (!c || !job || !attempt_id || !out || rank >= world_size)
		return bad_args();
	*out = NULL;
	Ckpt__VerifyRequest m = CKPT__VERIFY_REQUEST__INIT;
	m.job = (char *)job;
	m.step = step;
	m.one_rank = true;
	m.rank = rank;
	m.world_size = world_size;
	m.attempt_id = (char *)attempt_id;
	return verify(c, &m, out);
}

static ckpt_verify_result *verify_result(const Ckpt__VerifyReply *v)
{
	ckpt_verify_result *o = calloc(1, sizeof(*o));
	char **p = calloc(v->n_problems ? v->n_problems : 1, sizeof(char *));
	if (o == NULL || p == NULL) {
		free(o);
		free(p);
		return NULL;
	}
	client_copy_step(&o->info, v->info);
	o->ok = v->ok ? 1 : 0;
	o->bytes_checked = v->bytes_checked;
	o->problems = p;
	for (size_t i = 0; i < v->n_problems; i++)
		if ((p[o->nproblems] = strdup(v->problems[i])) != NULL)
			o->nproblems++;
	return o;
}

static int verify(ckpt_client *c, Ckpt__VerifyRequest *m, ckpt_verify_result **out)
{
	Ckpt__Frame *rep;
	int r = ask(c, FRAME(VERIFY, verify, m), CKPT__FRAME__BODY_VERIFY_REPLY, &rep);
	if (r < 0)
		return r;
	*out = verify_result(rep->verify_reply);
	return answered(rep, *out ? 0 : -ENOMEM);
}

void ckpt_verify_result_free(ckpt_verify_result *v)
{
	if (v == NULL)
		return;
	for (size_t i = 0; i < v->nproblems; i++)
		free(v->problems[i]);
	free(v->problems);
	free(v);
}

int ckpt_resolve(ckpt_client *c, const char *job, int64_t step, ckpt_step_info *out)
{
	if (!c || !out || (step < 0 && step != CKPT_LATEST))
		return bad_args();
	Ckpt__ResolveRequest m = CKPT__RESOLVE_REQUEST__INIT;
	m.job = (char *)(job ? job : "");
	m.latest = step == CKPT_LATEST;
	m.step = step == CKPT_LATEST ? 0 : (uint64_t)step;
	Ckpt__Frame *rep;
	int r = ask(c, FRAME(RESOLVE, resolve, &m), CKPT__FRAME__BODY_RESOLVE_REPLY, &rep);
	if (r < 0)
		return r;
	if (rep->resolve_reply->info == NULL) {
		client_set_errmsg("ckptd answered resolve without a step");
		return answered(rep, -EPROTO);
	}
	client_copy_step(out, rep->resolve_reply->info);
	return answered(rep, 0);
}

int ckpt_wait_complete(ckpt_client *c, const char *job, uint64_t step, int64_t timeout_ms, ckpt_step_info *out)
{
	if (!c)
		return bad_args();
	Ckpt__WaitRequest m = CKPT__WAIT_REQUEST__INIT;
	m.job = (char *)(job ? job : "");
	m.step = step;
	/* UINT32_MAX is the daemon's "no limit"; a limit is at most 49 days. */
	m.timeout_ms = timeout_ms < 0 ? UINT32_MAX : timeout_ms >= UINT32_MAX ? UINT32_MAX - 1 : (uint32_t)timeout_ms;
	Ckpt__Frame *rep;
	int r = ask(c, FRAME(WAIT, wait, &m), CKPT__FRAME__BODY_RESOLVE_REPLY, &rep);
	if (r < 0)
		return r;
	if (rep->resolve_reply->info == NULL) {
		client_set_errmsg("ckptd answered wait without a step");
		return answered(rep, -EPROTO);
	}
	if (out)
		client_copy_step(out, rep->resolve_reply->info);
	return answered(rep, 0);
}

int ckpt_list(ckpt_client *c, const char *job, ckpt_step_info **out, size_t *count)
{
	if (out)
		*out = NULL;
	if (count)
		*count = 0;
	if (!c || !out || !count)
		return bad_args();
	Ckpt__ListRequest m = CKPT__LIST_REQUEST__INIT;
	m.job = (char *)(job ? job : "");
	Ckpt__Frame *rep;
	int r = ask(c, FRAME(LIST, list, &m), CKPT__FRAME__BODY_LIST_REPLY, &rep);
	if (r < 0)
		return r;
	const Ckpt__ListReply *l = rep->list_reply;
	ckpt_step_info *v = NULL; /* none: *out stays NULL */
	if (l->n_steps && (v = calloc(l->n_steps, sizeof(*v))) == NULL)
		return answered(rep, -ENOMEM);
	for (size_t i = 0; i < l->n_steps; i++)
		client_copy_step(&v[i], l->steps[i]);
	*out = v;
	*count = l->n_steps;
	return answered(rep, 0);
}

int ckpt_held(ckpt_client *c, const char *job, int all_ranks, ckpt_held_info **out, size_t *count)
{
	if (!c || !out || !count)
		return bad_args();
	*out = NULL;
	*count = 0;
	Ckpt__HeldRequest m = CKPT__HELD_REQUEST__INIT;
	m.job = (char *)(job ? job : "");
	m.all_ranks = all_ranks != 0;
	Ckpt__Frame *rep;
	int r = ask(c, FRAME(HELD, held, &m), CKPT__FRAME__BODY_HELD_REPLY, &rep);
	if (r < 0)
		return r;
	const Ckpt__HeldReply *h = rep->held_reply;
	ckpt_held_info *v = calloc(h->n_held ? h->n_held : 1, sizeof(*v));
	if (v == NULL)
		return answered(rep, -ENOMEM);
	for (size_t i = 0; i < h->n_held; i++)
		client_copy_held(&v[i], h->held[i]);
	*count = h->n_held;
	*out = v;
	return answered(rep, 0);
}

int ckpt_delete(ckpt_client *c, const char *job, uint64_t step)
{
	return ckpt_delete_flags(c, job, step, 0);
}

int ckpt_delete_flags(ckpt_client *c, const char *job, uint64_t step, unsigned flags)
{
	if (!c || !job || (flags & ~CKPT_DELETE_FORCE))
		return bad_args();
	Ckpt__DeleteRequest m = CKPT__DELETE_REQUEST__INIT;
	m.job = (char *)job;
	m.step = step;
	m.force = (flags & CKPT_DELETE_FORCE) != 0;
	Ckpt__Frame *rep;
	int r = ask(c, FRAME(DELETE, delete_, &m), CKPT__FRAME__BODY_REPLY, &rep);
	return r < 0 ? r : answered(rep, 0);
}

int ckpt_gc(ckpt_client *c, const char *job, int dry_run, ckpt_gc_entry **out, size_t *count)
{
	if (!c || !out || !count)
		return bad_args();
	*out = NULL;
	*count = 0;
	Ckpt__GcRequest m = CKPT__GC_REQUEST__INIT;
	m.job = (char *)(job ? job : "");
	m.dry_run = dry_run != 0;
	Ckpt__Frame *rep;
	int r = ask(c, FRAME(GC, gc, &m), CKPT__FRAME__BODY_GC_REPLY, &rep);
	if (r < 0)
		return r;
	const Ckpt__GcReply *g = rep->gc_reply;
	ckpt_gc_entry *v = calloc(g->n_removed ? g->n_removed : 1, sizeof(*v));
	if (v == NULL)
		return answered(rep, -ENOMEM);
	for (size_t i = 0; i < g->n_removed; i++) {
		client_copy_step(&v[i].info, g->removed[i]);
		snprintf(v[i].reason, sizeof(v[i].reason), "%s",
			 i < g->n_reasons && g->reasons[i] ? g->reasons[i] : "");
	}
	*count = g->n_removed;
	*out = v;
	return answered(rep, 0);
}

int ckpt_metrics(ckpt_client *c, char **text)
{
	if (!c || !text)
		return bad_args();
	Ckpt__MetricsRequest m = CKPT__METRICS_REQUEST__INIT;
	Ckpt__Frame *rep;
	*text = NULL;
	int r = ask(c, FRAME(METRICS, metrics, &m), CKPT__FRAME__BODY_METRICS_REPLY, &rep);
	if (r < 0)
		return r;
	*text = strdup(rep->metrics_reply->text ? rep->metrics_reply->text : "");
	return answered(rep, *text ? 0 : -ENOMEM);
}
