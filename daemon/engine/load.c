#include "load.h"
#include "catalog.h"
#include "crc32c.h"
#include "daemon.h"
#include "hostbuf.h"
#include "log.h"
#include "manifest.h"
#include "memtier.h"
#include "save.h"
#include "requester.h"
#include "tensor.h"
#include "wire.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define READ_BLOCK (16u << 20)

struct load_req {
	char *name;
	int dtype;
	struct box box;
	struct hostbuf *buf;
	uint64_t buf_off, nbytes;
	uint64_t covered;    /* elements written */
	struct box *applied; /* cuts already written, disjoint */
	size_t napplied;
	unsigned sources; /* SRC_MEMORY | SRC_STORAGE */
};

#define SRC_MEMORY 1u
#define SRC_STORAGE 2u
#define SRC_PEER 4u /* a copy brought back from a peer for this load */

#define PIN_DURABLE 1u /* the copy was in storage when pinned (held_copy) */
#define PIN_FETCHED 2u /* brought from a peer by this load (fetch_copy) */

struct load {
	TAILQ_ENTRY(load) link; /* daemon.loads */
	struct daemon *d;
	struct session *session;
	uint64_t req_id;
	char job[JOB_BUF];
	uint32_t rank, world_size;
	bool latest;
	uint64_t step;
	struct load_req *reqs;
	size_t nreqs;
	struct load_req **by_name;
	struct save **pinned; /* memory-tier copies of the job, pinned */
	size_t npinned;
	uint8_t *pin_flags; /* PIN_*, of pinned[i] */
	bool memory_only;   /* the step is held here in memory only: no storage (load_copies) */
	bool ask_peers;     /* a named step: copies may come from the peers (fetch_copy) */
	bool storage_only;  /* Load.storage_only: neither memory nor peers */
	bool no_copies;     /* a copy failed its crc: planned again from storage alone (load_run) */
	char peer[128];     /* the peers copies came from, for Loaded.peer */
	bool has_key;       /* the session's job key (requester.h): copies from peers are sealed with it */
	uint8_t key[32];
	char peer_why[200]; /* why the peers gave none */
	uv_work_t work;
	/* results */
	const struct save *bad_held; /* a held copy whose crc did not match */
	int status;                  /* 0 or -errno */
	char msg[512];
	uint64_t loaded_step, bytes, bytes_memory;
	uint8_t *extra;
	size_t extra_len;
};

static void load_free(struct load *ld)
{
	for (size_t i = 0; i < ld->nreqs; i++) {
		free(ld->reqs[i].name);
		free(ld->reqs[i].applied);
		hostbuf_unref(ld->reqs[i].buf);
	}
	free(ld->reqs);
	free(ld->by_name);
	free(ld->extra);
	free(ld->pin_flags);
	explicit_bzero(ld->key, sizeof(ld->key));
	free(ld);
}

static int fail(struct load *ld, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(struct load *ld, int status, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(ld->msg, sizeof(ld->msg), fmt, ap);
	va_end(ap);
	ld->status = status;
	return status;
}

static int cmp_req(const void *a, const void *b)
{
	const struct load_req *x = *(struct load_req *const *)a, *y = *(struct load_req *const *)b;
	return strcmp(x->name, y->name);
}

/* First index in by_name whose name is name, or nreqs. */
static size_t find_first(struct load *ld, const char *name)
{
	size_t lo = 0, hi = ld->nreqs;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (strcmp(ld->by_name[mid]->name, name) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* The load runs in two phases. Plan (one thread): walk the manifests, the
 * one likeliest to hold this rank's share first (load_run), intersect every saved tensor with the requests, decide
 * replicas and coverage, and cut each saved tensor into slabs of whole rows
 * along dim 0 (contiguous in the shard, at most about READ_BLOCK each).
 * Execute (copy_threads threads): read each slab from the memory tier or
 * storage, crc it, and scatter its part of every cut into the client's
 * buffers. Cuts are disjoint, so slabs never write
 * the same bytes, and any order is correct. */

struct tplan {
	const Ckpt__ManifestTensor *t;
	const struct save *held; /* memory-tier copy, or NULL: storage */
	bool verify;             /* crc the held copy too ([pool] verify_held) */
	const char *key;         /* the shard in storage */
	struct box saved;
	size_t es;
	uint64_t nrows, row_bytes, rows_per, nslabs;
	struct load_req **hits;
	struct box *cuts;
	size_t nhits;
	uint32_t *slab_crc;
};

struct ltask {
	size_t plan;
	uint64_t slab;
	uint64_t off, len; /* in the shard */
};

/* One read: tasks [first, first + n) of one shard in storage, in offset
 * order, fetched by one ranged GET of [off, off + len) when they lie close
 * together (READ_GAP), up to READ_BLOCK; a held copy's task is its own. A
 * rank's many small tensors then cost a GET per 16 MiB, not one each. */
struct lread {
	size_t first, n;
	uint64_t off, len;
};
#define READ_GAP (256u << 10) /* bytes of a gap worth reading rather than a request */

struct exec {
	struct load *ld;
	struct tplan *plans;
	size_t nplans, cap;
	struct ltask *tasks;
	size_t ntasks;
	struct lread *reads;
	size_t nreads;
	uint64_t max_read;
	atomic_size_t next;
	atomic_int failed;
	pthread_mutex_t mu;
};

static void exec_fail(struct exec *ex, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void exec_fail(struct exec *ex, int status, const char *fmt, ...)
{
	pthread_mutex_lock(&ex->mu);
	if (ex->ld->status == 0) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(ex->ld->msg, sizeof(ex->ld->msg), fmt, ap);
		va_end(ap);
		ex->ld->status = status;
	}
	atomic_store(&ex->failed, 1);
	pthread_mutex_unlock(&ex->mu);
}

struct scatter {
	const uint8_t *src;
	const struct load_req *req;
};

static int scatter_run(void *ctx, uint64_t dst_off, uint64_t src_off, uint64_t n)
{
	struct scatter *sc = ctx;
	return hostbuf_write(sc->req->buf, sc->req->buf_off + dst_off, sc->src + src_off, n);
}

/* Task tk's slab is at src (from storage when the plan has no held copy):
 * take its crc share and scatter it into every cut it meets. */
static void apply_task(struct exec *ex, const struct ltask *tk, const uint8_t *src)
{
	struct tplan *p = &ex->plans[tk->plan];
	const Ckpt__ManifestTensor *t = p->t;
	uint64_t r0 = tk->slab * p->rows_per;
	uint64_t k = p->nrows - r0 < p->rows_per ? p->nrows - r0 : p->rows_per;
	if (!p->held || p->verify)
		p->slab_crc[tk->slab] = crc32c_update(0, src, tk->len);
	struct box slab = p->saved;
	if (slab.ndim > 0) {
		slab.off[0] = p->saved.off[0] + r0;
		slab.len[0] = k;
	}
	for (size_t i = 0; i < p->nhits; i++) {
		struct box part;
		if (!box_intersect(&slab, &p->cuts[i], &part))
			continue;
		struct scatter sc = { .src = src, .req = p->hits[i] };
		int r = box_copy_runs(&part, &slab, &p->hits[i]->box, p->es, scatter_run, &sc);
		if (r < 0) {
			exec_fail(ex, r, "writing tensor '%s' into buffer %" PRIu64 ": %s", t->name,
				  p->hits[i]->buf->id,
				  r == -EFAULT ? "the client truncated its buffer file" : strerror(-r));
			return;
		}
	}
}

static void run_read(struct exec *ex, const struct lread *rd, uint8_t *tmp)
{
	const struct ltask *first = &ex->tasks[rd->first];
	struct tplan *p = &ex->plans[first->plan];
	if (p->held) {
		/* Our own pool: crc'd all the same, so a bug that wrote into
		 * a held copy (or a bad DIMM) fails the load, not the model. */
		apply_task(ex, first, save_shard_bytes(p->held, first->off, first->len, tmp));
		return;
	}
	struct store *st = daemon_store_of(ex->ld->d, ex->ld->job);
	int r = st->ops->get_range(st, p->key, rd->off, tmp, (size_t)rd->len);
	if (r < 0) {
		char more[64] = "";
		if (rd->n > 1)
			snprintf(more, sizeof(more), " (one read with %zu more)", rd->n - 1);
		exec_fail(ex, r, "reading tensor '%s' from %s%s: %s", p->t->name, p->key, more,
			  r == -ENODATA ? "the shard is shorter than its manifest says" : store_error(r));
		return;
	}
	for (size_t i = 0; i < rd->n && !atomic_load(&ex->failed); i++) {
		const struct ltask *tk = &ex->tasks[rd->first + i];
		apply_task(ex, tk, tmp + (tk->off - rd->off));
	}
}

static void *exec_worker(void *arg)
{
	struct exec *ex = arg;
	uint8_t *tmp = malloc(ex->max_read ? (size_t)ex->max_read : 1);
	if (tmp == NULL) {
		exec_fail(ex, -ENOMEM, "out of memory for a read buffer of %" PRIu64 " bytes", ex->max_read);
		return NULL;
	}
	for (;;) {
		size_t i = atomic_fetch_add(&ex->next, 1);
		if (i >= ex->nreads || atomic_load(&ex->failed))
			break;
		run_read(ex, &ex->reads[i], tmp);
	}
	free(tmp);
	return NULL;
}

/* 1 if cut was already written (a replica), 0 if it is new, -1 if it
 * overlaps something written only in part. */
static int cut_seen(const struct load_req *q, const struct box *cut)
{
	for (size_t i = 0; i < q->napplied; i++) {
		struct box x;
		if (box_contains(&q->applied[i], cut))
			return 1;
		if (box_intersect(&q->applied[i], cut, &x))
			return -1;
	}
	return 0;
}

/* The pinned memory-tier copy that is exactly this manifest's shard (a
 * durable one: a copy persisting now names its shard on another thread). */
static const struct save *held_copy(const struct load *ld, const Ckpt__Manifest *m)
{
	for (size_t i = 0; i < ld->npinned; i++) {
		const struct save *sv = ld->pinned[i];
		if (!(ld->pin_flags[i] & PIN_DURABLE))
			continue;
		/* The shard's name is fresh per save: a step deleted and saved
		 * again (on any node) names another shard than the copy held. */
		if (sv->step == m->step && sv->rank == m->rank && sv->world_size == m->world_size &&
		    sv->shard_bytes == m->shard_bytes && strcmp(sv->attempt, m->attempt_id) == 0 &&
		    strcmp(sv->shard_name, m->shard_name) == 0)
			return sv;
	}
	return NULL;
}

/* Add the plan for saved tensor t meeting hits/cuts; account coverage. */
static int plan_tensor(struct exec *ex, const char *key, const struct save *held, unsigned src,
		       const Ckpt__ManifestTensor *t, const struct box *saved, struct load_req **hits,
		       const struct box *cuts, size_t nh)
{
	struct load *ld = ex->ld;
	if (ex->nplans == ex->cap) {
		size_t nc = ex->cap ? 2 * ex->cap : 64;
		struct tplan *np = realloc(ex->plans, nc * sizeof(*np));
		if (np == NULL)
			return fail(ld, -ENOMEM, "out of memory");
		ex->plans = np;
		ex->cap = nc;
	}
	struct tplan *p = &ex->plans[ex->nplans];
	memset(p, 0, sizeof(*p));
	p->t = t;
	p->held = held;
	/* Bytes that came from a peer, a replica put here by one included,
	 * are checked whatever [pool] verify_held says: for a step in
	 * storage, against the stored manifest's CRC32C. */
	p->verify = ld->d->cfg.verify_held || src == SRC_PEER || (held && held->replica);
	p->key = key;
	p->saved = *saved;
	p->es = tensor_dtype_size(t->dtype);
	p->nrows = saved->ndim > 0 ? saved->len[0] : 1;
	p->row_bytes = p->nrows ? t->nbytes / p->nrows : 0;
	p->rows_per = p->row_bytes == 0 || p->row_bytes >= READ_BLOCK ? 1 : READ_BLOCK / p->row_bytes;
	p->nslabs = p->nrows == 0 ? 0 : (p->nrows + p->rows_per - 1) / p->rows_per;
	if (p->rows_per * p->row_bytes > SIZE_MAX / 2)
		return fail(ld, -ENOMEM, "tensor '%s': one row of %" PRIu64 " bytes is too large", t->name,
			    p->row_bytes);
	p->hits = malloc(nh * sizeof(*p->hits));
	p->cuts = malloc(nh * sizeof(*p->cuts));
	p->slab_crc = calloc(p->nslabs ? p->nslabs : 1, sizeof(uint32_t));
	if (!p->hits || !p->cuts || !p->slab_crc) {
		free(p->hits);
		free(p->cuts);
		free(p->slab_crc);
		return fail(ld, -ENOMEM, "out of memory");
	}
	memcpy(p->hits, hits, nh * sizeof(*hits));
	memcpy(p->cuts, cuts, nh * sizeof(*cuts));
	p->nhits = nh;
	ex->nplans++;
	if (p->rows_per * p->row_bytes > ex->max_read)
		ex->max_read = p->rows_per * p->row_bytes;
	for (size_t i = 0; i < nh; i++) {
		struct load_req *q = hits[i];
		struct box *na = realloc(q->applied, (q->napplied + 1) * sizeof(*na));
		if (na == NULL)
			return fail(ld, -ENOMEM, "out of memory");
		q->applied = na;
		q->applied[q->napplied++] = cuts[i];
		q->covered += box_volume(&cuts[i]);
		q->sources |= src;
		ld->bytes += box_volume(&cuts[i]) * p->es;
		if (held)
			ld->bytes_memory += box_volume(&cuts[i]) * p->es;
	}
	return 0;
}

/* Plan from manifest m, whose shard is key in storage or the held copy. */
static int plan_manifest(struct exec *ex, const Ckpt__Manifest *m, const char *key, const struct save *held)
{
	struct load *ld = ex->ld;
	unsigned src = held ? SRC_MEMORY : SRC_STORAGE;
	for (size_t i = 0; i < ld->npinned && held; i++)
		if (ld->pinned[i] == held && (ld->pin_flags[i] & PIN_FETCHED))
			src = SRC_PEER;
	struct load_req **hits = calloc(ld->nreqs ? ld->nreqs : 1, sizeof(*hits));
	struct box *cuts = calloc(ld->nreqs ? ld->nreqs : 1, sizeof(*cuts));
	int r = 0;
	if (hits == NULL || cuts == NULL) {
		r = fail(ld, -ENOMEM, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < m->n_tensors && r == 0; i++) {
		const Ckpt__ManifestTensor *t = m->tensors[i];
		struct box saved;
		uint64_t nelem;
		char why[128];
		box_from_fields(&saved, t->n_global_shape, t->global_shape, t->n_box_offsets, t->box_offsets,
				t->n_box_lengths, t->box_lengths, &nelem, why, sizeof(why));
		size_t nh = 0;
		for (size_t k = find_first(ld, t->name); k < ld->nreqs && strcmp(ld->by_name[k]->name, t->name) == 0;
		     k++) {
			struct load_req *q = ld->by_name[k];
			if (q->dtype != (int)t->dtype || !box_same_shape(&q->box, &saved)) {
				char want[96], have[96];
				box_shape_str(&q->box, want, sizeof(want));
				box_shape_str(&saved, have, sizeof(have));
				r = fail(ld, -EINVAL,
					 "rank %u: tensor '%s': requested dtype %s shape %s, but it was "
					 "saved as dtype %s shape %s",
					 ld->rank, t->name, tensor_dtype_name(q->dtype), want,
					 tensor_dtype_name((int)t->dtype), have);
				break;
			}
			if (!box_intersect(&saved, &q->box, &cuts[nh]))
				continue;
			/* Replicated tensors: what one rank's manifest already
			 * gave (the first one read) is not read again. */
			int seen = cut_seen(q, &cuts[nh]);
			if (seen < 0) {
				r = fail(ld, -EINVAL,
					 "rank %u: tensor '%s': saved boxes of different ranks overlap in "
					 "part; cannot tell which copy to load",
					 ld->rank, t->name);
				break;
			}
			if (seen == 0)
				hits[nh++] = q;
		}
		if (r == 0 && nh > 0)
			r = plan_tensor(ex, key, held, src, t, &saved, hits, cuts, nh);
	}
out:
	free(hits);
	free(cuts);
	return r;
}

static int cmp_task(const void *a, const void *b, void *arg)
{
	const struct exec *ex = arg;
	const struct ltask *x = a, *y = b;
	const struct tplan *px = &ex->plans[x->plan], *py = &ex->plans[y->plan];
	/* Held copies first, each on its own; then by shard and offset. */
	if ((px->held != NULL) != (py->held != NULL))
		return px->held ? -1 : 1;
	int c = px->held ? 0 : strcmp(px->key, py->key);
	if (c)
		return c;
	return x->off < y->off ? -1 : x->off > y->off;
}

/* Sort the tasks and cut them into reads (struct lread). */
static int group_reads(struct exec *ex)
{
	qsort_r(ex->tasks, ex->ntasks, sizeof(*ex->tasks), cmp_task, ex);
	ex->reads = calloc(ex->ntasks ? ex->ntasks : 1, sizeof(*ex->reads));
	if (ex->reads == NULL)
		return -ENOMEM;
	for (size_t i = 0; i < ex->ntasks; i++) {
		const struct ltask *tk = &ex->tasks[i];
		const struct tplan *p = &ex->plans[tk->plan];
		struct lread *rd = ex->nreads ? &ex->reads[ex->nreads - 1] : NULL;
		if (rd && !p->held) {
			const struct ltask *prev = &ex->tasks[rd->first + rd->n - 1];
			const struct tplan *pp = &ex->plans[prev->plan];
			uint64_t end = rd->off + rd->len;
			if (!pp->held && strcmp(pp->key, p->key) == 0 && tk->off >= end && tk->off - end <= READ_GAP &&
			    tk->off + tk->len - rd->off <= READ_BLOCK) {
				rd->n++;
				rd->len = tk->off + tk->len - rd->off;
				continue;
			}
		}
		ex->reads[ex->nreads++] = (struct lread){ .first = i, .n = 1, .off = tk->off, .len = tk->len };
	}
	for (size_t i = 0; i < ex->nreads; i++)
		if (ex->reads[i].len > ex->max_read)
			ex->max_read = ex->reads[i].len;
	return 0;
}

/* Run every read on up to copy_threads threads, this one included. */
static void execute(struct exec *ex, unsigned nthreads)
{
	size_t n = 0;
	for (size_t i = 0; i < ex->nplans; i++)
		n += ex->plans[i].nslabs;
	ex->tasks = calloc(n ? n : 1, sizeof(*ex->tasks));
	if (ex->tasks == NULL) {
		exec_fail(ex, -ENOMEM, "out of memory");
		return;
	}
	for (size_t i = 0; i < ex->nplans; i++) {
		struct tplan *p = &ex->plans[i];
		for (uint64_t sl = 0; sl < p->nslabs; sl++) {
			uint64_t r0 = sl * p->rows_per;
			uint64_t k = p->nrows - r0 < p->rows_per ? p->nrows - r0 : p->rows_per;
			ex->tasks[ex->ntasks++] = (struct ltask){ .plan = i,
								  .slab = sl,
								  .off = p->t->shard_offset + r0 * p->row_bytes,
								  .len = k * p->row_bytes };
		}
	}
	if (group_reads(ex) < 0) {
		exec_fail(ex, -ENOMEM, "out of memory");
		return;
	}
	if (nthreads > ex->nreads)
		nthreads = ex->nreads ? (unsigned)ex->nreads : 1;
	pthread_t th[64];
	unsigned started = 0;
	for (unsigned i = 1; i < nthreads && i < 64; i++)
		if (pthread_create(&th[started], NULL, exec_worker, ex) == 0)
			started++;
	exec_worker(ex);
	for (unsigned i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	if (atomic_load(&ex->failed))
		return;
	/* Every tensor's slabs, from storage or memory: their crcs, combined
	 * in order, must match the manifest's. */
	for (size_t i = 0; i < ex->nplans; i++) {
		struct tplan *p = &ex->plans[i];
		if (p->held && !p->verify)
			continue; /* [pool] verify_held = false */
		uint32_t crc = 0;
		for (uint64_t sl = 0; sl < p->nslabs; sl++) {
			uint64_t r0 = sl * p->rows_per;
			uint64_t k = p->nrows - r0 < p->rows_per ? p->nrows - r0 : p->rows_per;
			crc = sl == 0 ? p->slab_crc[0] : crc32c_combine(crc, p->slab_crc[sl], k * p->row_bytes);
		}
		if (crc != p->t->crc32c) {
			if (p->held)
				ex->ld->bad_held = p->held; /* load_done drops it */
			exec_fail(ex, -EIO,
				  "checksum mismatch in tensor '%s' of %s%s: manifest says crc32c %08x, "
				  "data has %08x",
				  p->t->name, p->held ? "the memory tier's copy of " : "", p->key, p->t->crc32c, crc);
			return;
		}
	}
}

static void exec_free(struct exec *ex)
{
	for (size_t i = 0; i < ex->nplans; i++) {
		free(ex->plans[i].hits);
		free(ex->plans[i].cuts);
		free(ex->plans[i].slab_crc);
	}
	free(ex->plans);
	free(ex->tasks);
	free(ex->reads);
	pthread_mutex_destroy(&ex->mu);
}

static bool all_covered(const struct load *ld)
{
	for (size_t i = 0; i < ld->nreqs; i++)
		if (ld->reqs[i].covered != box_volume(&ld->reqs[i].box))
			return false;
	return true;
}

/* The copy of manifest m's shard that a peer holds (a lost node's rank
 * whose step was replicated, then persisted), when this daemon holds none:
 * a load reads local memory, then peer memory, then storage, per shard.
 * Only the peers likeliest to hold it are asked (the one that last said
 * so, then this node's successors: 1 + K requests, no sweep of the ring),
 * and only that save's copy (attempt, size, every tensor's CRC32C:
 * peer_fetch.c checks before it reads the shard) is taken; NULL: storage. */
static struct save *fetch_one(struct load *ld, const struct peer_want *w);
static const struct save *peer_copy(struct load *ld, const Ckpt__Manifest *m)
{
	struct peer_want w = { .job = ld->job,
			       .step = m->step,
			       .rank = m->rank,
			       .world_size = m->world_size,
			       .expect = m,
			       .no_sweep = true,
			       .key = ld->has_key ? ld->key : NULL };
	return fetch_one(ld, &w);
}

/* Plan from rank's manifest (read once, kept in cs). */
static int plan_rank(struct exec *ex, struct catalog_step *cs, uint32_t rank, char (*key)[768])
{
	struct load *ld = ex->ld;
	const Ckpt__Manifest *m;
	char err[512];
	int r = catalog_read_manifest(daemon_store_of(ld->d, ld->job), ld->job, cs, rank, &m, err, sizeof(err));
	if (r < 0)
		return fail(ld, r, "step %" PRIu64 " of job '%s': %s", cs->step, ld->job,
			    r == -EBADMSG ? err : store_error(r));
	if (manifest_shard_of(m, *key, sizeof(*key)) < 0)
		return fail(ld, -EBADMSG, "rank %u's manifest names no shard of its own", rank);
	if (ld->no_copies)
		return plan_manifest(ex, m, *key, NULL);
	const struct save *held = held_copy(ld, m);
	return plan_manifest(ex, m, *key, held ? held : peer_copy(ld, m));
}

/* The requests not covered, as a failure. */
static void check_covered(struct load *ld, uint64_t step)
{
	for (size_t i = 0; i < ld->nreqs && ld->status == 0; i++) {
		struct load_req *q = &ld->reqs[i];
		if (q->covered != box_volume(&q->box))
			fail(ld, -ENOENT, "rank %u: tensor '%s': step %" PRIu64 " %s", ld->rank, q->name, step,
			     q->covered ? "covers only part of the requested box" : "has no such tensor");
	}
}

/* Room in pinned[] for one more copy. */
static int pin_room(struct load *ld)
{
	struct save **np = realloc(ld->pinned, (ld->npinned + 1) * sizeof(*np));
	if (np)
		ld->pinned = np;
	uint8_t *nf = np ? realloc(ld->pin_flags, ld->npinned + 1) : NULL;
	if (nf)
		ld->pin_flags = nf;
	return np && nf ? 0 : fail(ld, -ENOMEM, "out of memory");
}

/* The copy w names, brought back from the peers that hold it (peer.h)
 * into the pool and pinned for this load; NULL when it cannot come
 * (ld->peer_why says why). */
static struct save *fetch_one(struct load *ld, const struct peer_want *w)
{
	struct daemon *d = ld->d;
	if (d->peer_fetch == NULL || !ld->ask_peers || ld->storage_only || pin_room(ld) < 0)
		return NULL;
	struct save *sv = NULL;
	char why[400];
	if (d->peer_fetch(d, w, &sv, why, sizeof(why)) < 0) {
		snprintf(ld->peer_why, sizeof(ld->peer_why), "rank %u: %s", w->rank, why);
		return NULL;
	}
	ld->pinned[ld->npinned] = sv;
	ld->pin_flags[ld->npinned] = PIN_FETCHED;
	ld->npinned++;
	/* Loaded.peer: the peers the copies came from. */
	if (strstr(ld->peer, sv->peer) == NULL) {
		size_t n = strlen(ld->peer);
		snprintf(ld->peer + n, sizeof(ld->peer) - n, "%s%s", n ? "," : "", sv->peer);
	}
	return sv;
}

/* Saved rank r's copy (of world ws) of a step not in storage, from the
 * peers. */
static struct save *fetch_copy(struct load *ld, uint32_t r, uint32_t ws)
{
	return fetch_one(ld, &(struct peer_want){ .job = ld->job,
						  .step = ld->step,
						  .rank = r,
						  .world_size = ws,
						  .key = ld->has_key ? ld->key : NULL });
}

/* Saved rank r's copy of the step (world ws): held here, else from the
 * peers; NULL if neither. */
static struct save *copy_of(struct load *ld, uint32_t r, uint32_t ws)
{
	for (size_t i = 0; i < ld->npinned; i++) {
		struct save *sv = ld->pinned[i];
		if (sv->step == ld->step && sv->rank == r && sv->world_size == ws)
			return sv;
	}
	return fetch_copy(ld, r, ws);
}

/* The world size the step was saved at, as the peers know it: in the
 * common case (a replacement node, the same world size) this rank's copy
 * comes back at once; resharding, their lists of this rank's copies, or
 * of rank 0's (a world that grew), say it. 0: the peers have no copy of
 * the step. */
static uint32_t peer_world(struct load *ld)
{
	struct daemon *d = ld->d;
	if (d->peer_fetch == NULL || !ld->ask_peers || ld->storage_only)
		return 0;
	if (fetch_copy(ld, ld->rank, ld->world_size))
		return ld->world_size;
	uint32_t ws = 0;
	for (int k = 0; k < 2 && ws == 0 && d->peer_list && ld->status == 0; k++) {
		struct peer_copy *v = NULL;
		size_t n = 0;
		if (d->peer_list(d, ld->job, k == 0 ? ld->rank : 0, &v, &n) == 0)
			for (size_t i = 0; i < n; i++)
				/* A peer's word: only a world a save could have had. */
				if (v[i].step == ld->step && v[i].world_size > 0 &&
				    v[i].world_size <= MANIFEST_WORLD_MAX)
					ws = v[i].world_size;
		free(v);
	}
	return ws;
}

/* A step not in storage, restored from copies in memory (docs/manual.md "Tiers"):
 * those held here, and those the peers hold (a replacement node's ranks,
 * or saved ranks of other nodes when resharding), brought back as
 * needed. Planned from the copies' own manifests, in the order load_run
 * reads manifests: the saved rank at this rank's place first, then the
 * next ones until the request is covered; read from the pool. No storage
 * request; peer requests per copy: each_holder (peer_fetch.c). The extra state
 * is own's (this rank's, or rank 0's for a rank the save did not have),
 * as from storage; from a peer's manifest alone when own's shard is not
 * needed. */
static void load_copies(struct load *ld, uint32_t ws)
{
	Ckpt__Manifest *views = calloc(ws, sizeof(*views));
	char(*keys)[200] = calloc(ws, sizeof(*keys));
	struct exec ex = { .ld = ld };
	pthread_mutex_init(&ex.mu, NULL);
	size_t nviews = 0;
	const struct save *own_copy = NULL, *first_copy = NULL;
	if (ws == 0 || views == NULL || keys == NULL) {
		fail(ld, ws ? -ENOMEM : -ENOENT, ws ? "out of memory" : "no copy of the step is held");
		goto out;
	}
	ld->loaded_step = ld->step;
	uint32_t own = ld->rank < ws ? ld->rank : 0;
	uint32_t first = ws != ld->world_size && ld->rank < ld->world_size
				 ? (uint32_t)((uint64_t)ld->rank * ws / ld->world_size)
				 : own;
	char missing[160] = "";
	size_t nmissing = 0;
	unsigned misses = 0;
	for (uint32_t i = 0; i < ws && ld->status == 0 && (i == 0 || !all_covered(ld)); i++) {
		uint32_t r = (first + i) % ws;
		struct save *sv = copy_of(ld, r, ws);
		if (sv == NULL) {
			nmissing += (size_t)snprintf(missing + nmissing,
						     nmissing < sizeof(missing) ? sizeof(missing) - nmissing : 0,
						     "%s%u", nmissing ? "," : "", r);
			/* A world size a peer claimed (peer_world) is not asked
			 * for rank after rank: a rank needs N/M + 1 copies. */
			if (++misses == ld->d->cfg.peer_max_missing_ranks) {
				atomic_fetch_add_explicit(&ld->d->stats.peer_refused[PEER_LIMIT_MISSING], 1,
							  memory_order_relaxed);
				nmissing += (size_t)snprintf(
					missing + nmissing, nmissing < sizeof(missing) ? sizeof(missing) - nmissing : 0,
					" (no more asked: [peers] max_missing_ranks)");
				break;
			}
			continue;
		}
		if (save_manifest_view(sv, &views[nviews], "", 0) < 0) {
			fail(ld, -ENOMEM, "out of memory");
			break;
		}
		nviews++;
		if (first_copy == NULL)
			first_copy = sv;
		if (r == own)
			own_copy = sv;
		snprintf(keys[i], sizeof(keys[i]), "%s step %" PRIu64 " rank %u (memory only)", ld->job, ld->step, r);
		plan_manifest(&ex, &views[nviews - 1], keys[i], sv);
	}
	if (ld->status == 0 && !all_covered(ld)) {
		check_covered(ld, ld->step);
		char why[sizeof(ld->msg)];
		snprintf(why, sizeof(why),
			 "%s; step %" PRIu64 " is in memory only, and neither this ckptd nor %s holds "
			 "saved rank(s) %s of it%s%s%s",
			 ld->msg, ld->step, ld->ask_peers && ld->d->peer_fetch ? "its peers" : "(no peers asked)",
			 missing, ld->peer_why[0] ? " (" : "", ld->peer_why, ld->peer_why[0] ? ")" : "");
		snprintf(ld->msg, sizeof(ld->msg), "%s", why);
	}
	if (ld->status == 0)
		execute(&ex, ld->d->cfg.copy_threads);
	if (ld->status == 0 && own_copy == NULL) {
		for (size_t i = 0; i < ld->npinned && own_copy == NULL; i++)
			if (ld->pinned[i]->step == ld->step && ld->pinned[i]->rank == own &&
			    ld->pinned[i]->world_size == ws)
				own_copy = ld->pinned[i];
	}
	/* Without peers to ask, own's or else the first copy's (as before). */
	if (own_copy == NULL && (ld->d->peer_extra == NULL || !ld->ask_peers))
		own_copy = first_copy;
	if (ld->status == 0 && own_copy && own_copy->extra_len) {
		ld->extra = malloc(own_copy->extra_len);
		if (ld->extra == NULL)
			fail(ld, -ENOMEM, "out of memory");
		else
			memcpy(ld->extra, own_copy->extra, own_copy->extra_len);
		ld->extra_len = ld->extra ? own_copy->extra_len : 0;
	} else if (ld->status == 0 && own_copy == NULL) {
		char why[300];
		struct peer_want w = { .job = ld->job,
				       .step = ld->step,
				       .rank = own,
				       .world_size = ws,
				       .key = ld->has_key ? ld->key : NULL };
		int r = ld->d->peer_extra(ld->d, &w, &ld->extra, &ld->extra_len, why, sizeof(why));
		if (r < 0)
			fail(ld, r, "step %" PRIu64 " of job '%s': the extra state of rank %u: %s", ld->step, ld->job,
			     own, why);
	}
out:
	exec_free(&ex);
	for (size_t i = 0; i < nviews; i++)
		save_manifest_view_free(&views[i]);
	free(views);
	free(keys);
}

/* Plan the pinned step cs from its manifests and execute the plan. The
 * manifest likeliest to hold what this rank asks for first, and
 * replicated tensors then need one read only: at the same world size its
 * own; resharding N -> M, the saved rank at the same place in the order
 * (rank * N / M), which holds this rank's share when the layout follows
 * the rank order (rows, flat FSDP shards, blocks along one dimension), so
 * a rank reads about N/M + 1 manifests, not every one before its share.
 * The others follow in order until all is covered. */
static void plan_stored(struct load *ld, struct catalog_step *cs)
{
	struct catalog_group *g = &cs->groups[cs->best];
	char(*keys)[768] = calloc(g->world_size, sizeof(*keys));
	struct exec ex = { .ld = ld };
	pthread_mutex_init(&ex.mu, NULL);
	if (keys == NULL)
		fail(ld, -ENOMEM, "out of memory");
	uint32_t own = ld->rank < g->world_size ? ld->rank : 0;
	uint32_t first = own;
	if (ld->world_size != g->world_size && ld->rank < ld->world_size)
		first = (uint32_t)((uint64_t)ld->rank * g->world_size / ld->world_size);
	if (ld->status == 0)
		plan_rank(&ex, cs, first, &keys[0]);
	for (uint32_t i = 1; i < g->world_size && ld->status == 0 && !all_covered(ld); i++)
		plan_rank(&ex, cs, (first + i) % g->world_size, &keys[i]);
	check_covered(ld, cs->step);
	if (ld->status == 0)
		execute(&ex, ld->d->cfg.copy_threads);
	exec_free(&ex);
	free(keys);
}

/* Which step: "latest" is decided from listings and pinned (catalog.h);
 * a storage error fails the load, it never falls back to an older step.
 * Then this rank's own manifest, and its shard. Other ranks' manifests
 * are read only when the request is not covered by its own (resharding,
 * or tensors only some ranks saved): a restore at the same world size
 * costs this rank ceil(2W/1000) LIST pages (with "latest", per step
 * looked at), one commit GET or create, one manifest GET, and the
 * shard's ranged GETs. Manifests come through the daemon's cache
 * (mancache.h): a manifest several ranks of this node need is read once. */
static void load_run(uv_work_t *w)
{
	struct load *ld = w->data;
	if (ld->memory_only) {
		uint32_t ws = 0;
		for (size_t i = 0; i < ld->npinned && ws == 0; i++)
			if (ld->pinned[i]->step == ld->step && !(ld->pin_flags[i] & PIN_DURABLE) &&
			    !ld->pinned[i]->replica)
				ws = ld->pinned[i]->world_size;
		load_copies(ld, ws);
		return;
	}
	struct store *st = daemon_store_of(ld->d, ld->job);
	struct catalog_step cs;
	int r;
	store_clear_error();
	if (ld->latest) {
		r = catalog_latest(st, ld->job, &cs);
		if (r == -ENOENT) {
			fail(ld, -ENOENT, "job '%s' has no complete step in %s", ld->job, st->url);
			return;
		}
		if (r < 0) {
			fail(ld, r, "deciding the latest step of job '%s' in %s: %s (%s)", ld->job, st->url,
			     store_error(r), catalog_no_fallback_hint(r));
			return;
		}
	} else {
		r = catalog_resolve_step(st, ld->job, ld->step, &cs);
		uint32_t ws = r == -ENOENT || (r == 0 && !catalog_step_complete(&cs)) ? peer_world(ld) : 0;
		if (ws > 0) {
			if (r == 0)
				catalog_step_free(&cs);
			load_copies(ld, ws);
			return;
		}
		if (r < 0) {
			fail(ld, r, "step %" PRIu64 " of job '%s': %s%s%.200s%s", ld->step, ld->job,
			     r == -ENOENT ? "not found" : store_error(r),
			     ld->peer_why[0] ? "; nor from the peers (" : "", ld->peer_why, ld->peer_why[0] ? ")" : "");
			return;
		}
		if (!catalog_step_complete(&cs)) {
			struct catalog_group *g = &cs.groups[cs.best];
			fail(ld, -ENOENT, "step %" PRIu64 " of job '%s' is not complete: %u of %u ranks (attempt '%s')",
			     ld->step, ld->job, g->count, g->world_size, g->attempt);
			catalog_step_free(&cs);
			return;
		}
	}
	/* Pinned now: other ranks' manifests come through the daemon's cache,
	 * so the ranks of this node read each one once between them. */
	cs.cache = ld->d->mancache;
	struct catalog_group *g = &cs.groups[cs.best];
	ld->loaded_step = cs.step;
	plan_stored(ld, &cs);
	/* A copy in memory (held here, or a peer's) that failed its check
	 * against the stored manifest: dropped (load_done), and the step read
	 * from storage alone at once, never from that copy or peer again. */
	if (ld->status == -EIO && ld->bad_held) {
		const struct save *bad = ld->bad_held;
		log_warn("load: %s step %" PRIu64 " rank %u: %s (%s%s); reading the step from storage instead", ld->job,
			 cs.step, ld->rank, ld->msg, bad->from_peer ? "a copy from peer " : "a copy held here",
			 bad->from_peer ? bad->peer : "");
		atomic_fetch_add_explicit(&ld->d->stats.held_copies_failed, 1, memory_order_relaxed);
		for (size_t i = 0; i < ld->nreqs; i++) {
			ld->reqs[i].covered = 0;
			ld->reqs[i].napplied = 0;
			ld->reqs[i].sources = 0;
		}
		ld->bytes = ld->bytes_memory = 0;
		ld->peer[0] = '\0';
		ld->status = 0;
		ld->msg[0] = '\0';
		ld->no_copies = true;
		plan_stored(ld, &cs);
	}
	uint32_t own = ld->rank < g->world_size ? ld->rank : 0;
	/* The extra state is own's (rank 0's for ranks the save did not
	 * have), read here if the plan did not need it. */
	const Ckpt__Manifest *m = NULL;
	char err[512];
	r = ld->status == 0 ? catalog_read_manifest(st, ld->job, &cs, own, &m, err, sizeof(err)) : 0;
	if (r < 0)
		fail(ld, r, "step %" PRIu64 " of job '%s': %s", cs.step, ld->job, r == -EBADMSG ? err : store_error(r));
	else if (ld->status == 0 && m->extra_state.len) {
		ld->extra = malloc(m->extra_state.len);
		if (ld->extra == NULL) {
			fail(ld, -ENOMEM, "out of memory");
		} else {
			memcpy(ld->extra, m->extra_state.data, m->extra_state.len);
			ld->extra_len = m->extra_state.len;
		}
	}
	catalog_step_free(&cs);
}

static const char *source_name(unsigned src)
{
	return src == SRC_MEMORY ? "memory" : src == SRC_STORAGE ? "storage" : src == SRC_PEER ? "peer" : "mixed";
}

static void send_loaded(struct load *ld)
{
	unsigned all = 0;
	Ckpt__LoadedTensor *lt = calloc(ld->nreqs ? ld->nreqs : 1, sizeof(*lt));
	Ckpt__LoadedTensor **ltp = calloc(ld->nreqs ? ld->nreqs : 1, sizeof(*ltp));
	if (lt == NULL || ltp == NULL) {
		free(lt);
		free(ltp);
		ld->d->req_ops->close(ld->session, -ENOMEM, "out of memory");
		return;
	}
	for (size_t i = 0; i < ld->nreqs; i++) {
		ckpt__loaded_tensor__init(&lt[i]);
		lt[i].name = ld->reqs[i].name;
		lt[i].source = (char *)source_name(ld->reqs[i].sources);
		ltp[i] = &lt[i];
		all |= ld->reqs[i].sources;
	}
	Ckpt__Loaded ok = CKPT__LOADED__INIT;
	ok.step = ld->loaded_step;
	ok.bytes = ld->bytes;
	ok.bytes_from_memory = ld->bytes_memory;
	ok.extra_state.data = ld->extra;
	ok.extra_state.len = ld->extra_len;
	ok.source = (char *)source_name(all ? all : SRC_STORAGE);
	if (all & SRC_PEER)
		ok.peer = ld->peer;
	ok.n_tensors = ld->nreqs;
	ok.tensors = ltp;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_LOADED;
	f.loaded = &ok;
	log_info("load: %s step %" PRIu64 " rank %u: %" PRIu64 " bytes from %s", ld->job, ld->loaded_step, ld->rank,
		 ld->bytes, ok.source);
	ld->d->req_ops->send(ld->session, ld->req_id, &f);
	free(lt);
	free(ltp);
}

static void load_done(uv_work_t *w, int status)
{
	struct load *ld = w->data;
	struct daemon *d = ld->d;
	d->nloads--;
	TAILQ_REMOVE(&d->loads, ld, link);
	if (ld->bad_held) /* still pinned: freed by the unpin below */
		memtier_drop_corrupt(d, (struct save *)ld->bad_held);
	memtier_unpin(ld->pinned, ld->npinned);
	if (ld->npinned)
		save_admit_waiting(d); /* copies dropped while pinned are free now */
	ld->pinned = NULL;
	ld->npinned = 0;
	if (status < 0 && ld->status == 0)
		fail(ld, -ECANCELED, "load cancelled");
	if (ld->status == 0) {
		d->stats.bytes_restored += ld->bytes;
		d->stats.bytes_restored_memory += ld->bytes_memory;
		if (ld->bytes_memory == ld->bytes && ld->bytes > 0)
			d->stats.restores_from_memory++;
		else
			d->stats.restores_from_storage++;
	}
	if (d->req_ops->release(ld->session)) {
		if (ld->status == 0) {
			send_loaded(ld);
		} else {
			Ckpt__LoadFailed bad = CKPT__LOAD_FAILED__INIT;
			bad.status = wire_status(ld->status);
			bad.message = ld->msg;
			Ckpt__Frame f = CKPT__FRAME__INIT;
			f.body_case = CKPT__FRAME__BODY_LOAD_FAILED;
			f.load_failed = &bad;
			log_warn("load: %s rank %u failed: %s", ld->job, ld->rank, ld->msg);
			d->req_ops->send(ld->session, ld->req_id, &f);
		}
	}
	load_free(ld);
	daemon_work_ended(d);
}

static int plan(struct load *ld, struct session *s, const Ckpt__Load *m, char *err, size_t errlen)
{
	const struct config *c = &ld->d->cfg;
	if (m->n_tensors > c->max_tensors) {
		snprintf(err, errlen, "%zu tensors, at most %u per load", m->n_tensors, c->max_tensors);
		return -E2BIG;
	}
	ld->reqs = calloc(m->n_tensors ? m->n_tensors : 1, sizeof(*ld->reqs));
	ld->by_name = calloc(m->n_tensors ? m->n_tensors : 1, sizeof(*ld->by_name));
	if (ld->reqs == NULL || ld->by_name == NULL)
		return -ENOMEM;
	for (size_t i = 0; i < m->n_tensors; i++) {
		const Ckpt__TensorRef *tr = m->tensors[i];
		struct load_req *q = &ld->reqs[i];
		struct hostbuf *b = NULL;
		int r = ld->d->req_ops->tensor(s, tr, i, &q->box, &b, err, errlen);
		if (r < 0)
			return r;
		if ((q->name = strdup(tr->name)) == NULL)
			return -ENOMEM;
		ld->nreqs = i + 1;
		ld->by_name[i] = q;
		q->dtype = tr->dtype;
		q->buf = hostbuf_ref(b);
		q->buf_off = tr->offset;
		q->nbytes = tr->nbytes;
	}
	qsort(ld->by_name, ld->nreqs, sizeof(*ld->by_name), cmp_req);
	return 0;
}

void load_start(struct daemon *d, const struct requester *rq, const Ckpt__Load *m)
{
	assert(d && d->req_ops && rq && rq->s && m);
	const struct requester_ops *ops = d->req_ops;
	/* Draining and the session's cap were checked by its message row
	 * (msgtab.c). */
	if (rq->job[0] == '\0') {
		ops->load_refused(rq->s, rq->req_id, -EPERM,
				  "this session said no job in Hello (a control session); it cannot load");
		return;
	}
	struct load *ld = calloc(1, sizeof(*ld));
	if (ld == NULL) {
		ops->load_refused(rq->s, rq->req_id, -ENOMEM, "out of memory");
		return;
	}
	ld->d = d;
	ld->req_id = rq->req_id;
	snprintf(ld->job, sizeof(ld->job), "%s", rq->job);
	ld->rank = rq->rank;
	ld->world_size = rq->world_size;
	ld->latest = m->latest;
	ld->step = m->step;
	ld->storage_only = m->storage_only;
	if (rq->job_key) {
		memcpy(ld->key, rq->job_key, sizeof(ld->key));
		ld->has_key = true;
	}
	char err[512];
	int r = plan(ld, rq->s, m, err, sizeof(err));
	if (r < 0) {
		ops->load_refused(rq->s, rq->req_id, r, r == -ENOMEM ? "out of memory" : err);
		load_free(ld);
		return;
	}
	ld->session = rq->s;
	ops->hold(rq->s);
	ld->work.data = ld;
	d->nloads++;
	if (!m->storage_only)
		ld->npinned = memtier_pin(d, ld->job, &ld->pinned);
	/* Copies not held here may come from the peers (fetch_one). */
	ld->ask_peers = d->peer_fetch != NULL;
	ld->pin_flags = calloc(ld->npinned + 1, sizeof(*ld->pin_flags));
	if (ld->pin_flags == NULL) {
		memtier_unpin(ld->pinned, ld->npinned);
		ld->pinned = NULL;
		ld->npinned = 0;
	}
	for (size_t i = 0; i < ld->npinned; i++) {
		ld->pin_flags[i] = ld->pinned[i]->durable ? PIN_DURABLE : 0;
		/* A named step held here in memory only, by a copy of this
		 * node's own: restored from there (a replica held for a peer
		 * never decides it: memtier.h). */
		ld->memory_only |= !m->latest && !ld->pinned[i]->durable && !ld->pinned[i]->replica &&
				   ld->pinned[i]->step == m->step;
	}
	r = uv_queue_work(d->loop, &ld->work, load_run, load_done);
	if (r == 0)
		TAILQ_INSERT_TAIL(&d->loads, ld, link);
	if (r < 0) {
		d->nloads--;
		memtier_unpin(ld->pinned, ld->npinned);
		if (ld->npinned)
			save_admit_waiting(d);
		ld->pinned = NULL;
		ld->npinned = 0;
		ops->release(rq->s);
		ops->load_refused(rq->s, rq->req_id, -EIO, "cannot queue the load");
		load_free(ld);
	}
}

size_t load_busy_jobs(struct daemon *d, char (*out)[JOB_BUF], size_t max)
{
	size_t n = 0;
	struct load *ld;
	TAILQ_FOREACH (ld, &d->loads, link)
		if (n < max)
			snprintf(out[n++], sizeof(out[0]), "%s", ld->job);
	return n;
}
