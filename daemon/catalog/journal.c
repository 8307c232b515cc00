#include "journal.h"
#include "catalog.h"
#include "log.h"
#include "manifest.h"
#include "store.h"
#include "fsutil.h"
#include "grow.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define JOURNAL_MAX_BYTES (64u << 20)

struct journal {
	pthread_mutex_t mu;
	int fd;
	char path[1100], dir[1024];
	uint64_t next_removal;
	uint64_t in_flight_s; /* recovery's removals (journal_set_in_flight); 0: CATALOG_SPARE_S */
};

int journal_open(const char *state_dir, struct journal **out, char *err, size_t errlen)
{
	struct journal *j = calloc(1, sizeof(*j));
	if (j == NULL)
		return -ENOMEM;
	snprintf(j->path, sizeof(j->path), "%s/journal", state_dir);
	snprintf(j->dir, sizeof(j->dir), "%s", state_dir);
	j->fd = open(j->path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	/* Its name durable before any record counts on it. */
	int e = j->fd < 0 ? errno : -fsync_dir(state_dir);
	if (e != 0) {
		snprintf(err, errlen, "journal %s: %s", j->path, strerror(e));
		if (j->fd >= 0)
			close(j->fd);
		free(j);
		return -e;
	}
	/* Unique across restarts: a removal kept from an earlier run (its
	 * storage unreachable) is never closed by a new one's F. */
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	j->next_removal = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
	pthread_mutex_init(&j->mu, NULL);
	*out = j;
	return 0;
}

void journal_close(struct journal *j)
{
	if (j == NULL)
		return;
	close(j->fd);
	pthread_mutex_destroy(&j->mu);
	free(j);
}

static int append(struct journal *j, const char *line)
{
	size_t len = strlen(line);
	pthread_mutex_lock(&j->mu);
	ssize_t n = write(j->fd, line, len);
	int r = n == (ssize_t)len ? 0 : n < 0 ? -errno : -EIO;
	if (r == 0 && fdatasync(j->fd) != 0)
		r = -errno;
	pthread_mutex_unlock(&j->mu);
	return r;
}

int journal_begin(struct journal *j, uint64_t id, const char *shard_key, const char *man_key, const char *attempt)
{
	assert(j && shard_key && man_key && attempt);
	char line[2048];
	snprintf(line, sizeof(line), "B %" PRIu64 " %s %s %s\n", id, attempt, shard_key, man_key);
	return append(j, line);
}

int journal_end(struct journal *j, uint64_t id)
{
	char line[64];
	snprintf(line, sizeof(line), "E %" PRIu64 "\n", id);
	return append(j, line);
}

static bool has_space(const char *s);

int journal_remove_begin(struct journal *j, const char *job, uint64_t step, uint64_t *id)
{
	char line[256];
	if (has_space(job) || strlen(job) > 128)
		return -EINVAL;
	pthread_mutex_lock(&j->mu);
	*id = j->next_removal++;
	pthread_mutex_unlock(&j->mu);
	snprintf(line, sizeof(line), "R %" PRIu64 " %s %" PRIu64 "\n", *id, job, step);
	return append(j, line);
}

int journal_temp_begin(struct journal *j, const char *key, uint64_t *id)
{
	char line[1024];
	if (has_space(key) || strlen(key) > 767)
		return -EINVAL;
	pthread_mutex_lock(&j->mu);
	*id = j->next_removal++;
	pthread_mutex_unlock(&j->mu);
	snprintf(line, sizeof(line), "T %" PRIu64 " %s\n", *id, key);
	return append(j, line);
}

void journal_temp_end(struct journal *j, uint64_t id)
{
	(void)journal_remove_end(j, id);
}

int journal_remove_end(struct journal *j, uint64_t id)
{
	char line[64];
	snprintf(line, sizeof(line), "F %" PRIu64 "\n", id);
	return append(j, line);
}

static bool has_space(const char *s)
{
	for (; *s; s++)
		if (isspace((unsigned char)*s))
			return true;
	return false;
}

int journal_upload(struct journal *j, const char *key, const char *upload_id, bool open)
{
	char line[2048];
	if (has_space(key) || has_space(upload_id) || strlen(key) > 767 || strlen(upload_id) > 1023)
		return -EINVAL;
	snprintf(line, sizeof(line), "%c %s %s\n", open ? 'U' : 'X', upload_id, key);
	return append(j, line);
}

struct upload {
	char id[1024], key[768];
	bool ended;
};

/* An upload's shard and manifest (B, closed by E). */
struct entry {
	uint64_t id;
	char attempt[ATTEMPT_BUF], shard[768], man[768];
	bool ended;
};

/* A step's removal (R, closed by F), or a write outside an upload (T,
 * closed by F: key set, job empty). */
struct removal {
	uint64_t id, step;
	char job[JOB_BUF], key[768];
	bool ended;
};

/* The journal's records, as one parse of its text reads them. */
struct records {
	struct entry *v;
	size_t n, cap;
	struct upload *up;
	size_t nup, upcap;
	struct removal *rm;
	size_t nrm, rmcap;
};

static void records_free(struct records *r)
{
	free(r->v);
	free(r->up);
	free(r->rm);
}

/* The one reader of the journal's lines (B, E, U, X, N, R, F: journal.h):
 * B/E pairs into r->v (unless open_only: compaction needs only what may
 * stay open, U/X and R/F), U/X pairs into r->up, R/F into r->rm, each N
 * line to report (if any). Anything else is a
 * torn last line from the crash, and is ignored. 0, or -ENOMEM (then r
 * holds part of the journal: the caller must not act on it as a whole). */
static int parse(char *text, struct records *r, bool open_only, journal_recover_fn report, void *ctx)
{
	/* A last line without its newline is a record the crash cut short: it
	 * was never fsync'd, so nothing it announced was done; and read as a
	 * whole one it could name another step ("R 7 job 1" of "... 12"). */
	char *end = strrchr(text, '\n');
	if (end)
		end[1] = '\0';
	else
		text[0] = '\0';
	for (char *save = NULL, *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		if (open_only && !strchr("UXRFT", line[0]))
			continue;
		if (line[0] == 'R' || line[0] == 'T') {
			struct removal m = { 0 };
			if (line[0] == 'R' && sscanf(line, "R %" SCNu64 " %128s %" SCNu64, &m.id, m.job, &m.step) != 3)
				continue;
			if (line[0] == 'T' && sscanf(line, "T %" SCNu64 " %767s", &m.id, m.key) != 2)
				continue;
			if (GROW(r->rm, r->rmcap, r->nrm + 1, 8) < 0)
				return -ENOMEM;
			r->rm[r->nrm++] = m;
			continue;
		}
		if (line[0] == 'F') {
			uint64_t id;
			if (sscanf(line, "F %" SCNu64, &id) == 1)
				for (size_t i = 0; i < r->nrm; i++)
					if (r->rm[i].id == id)
						r->rm[i].ended = true;
			continue;
		}
		if (line[0] == 'B') {
			struct entry e = { 0 };
			if (sscanf(line, "B %" SCNu64 " %128s %767s %767s", &e.id, e.attempt, e.shard, e.man) != 4)
				continue;
			if (GROW(r->v, r->cap, r->n + 1, 16) < 0)
				return -ENOMEM;
			r->v[r->n++] = e;
		} else if (line[0] == 'E') {
			uint64_t id;
			if (sscanf(line, "E %" SCNu64, &id) == 1)
				for (size_t i = 0; i < r->n; i++)
					if (r->v[i].id == id)
						r->v[i].ended = true;
		} else if (line[0] == 'U') {
			struct upload u = { 0 };
			if (sscanf(line, "U %1023s %767s", u.id, u.key) != 2)
				continue;
			if (GROW(r->up, r->upcap, r->nup + 1, 8) < 0)
				return -ENOMEM;
			r->up[r->nup++] = u;
		} else if (line[0] == 'X') {
			char id[1024];
			if (sscanf(line, "X %1023s", id) == 1)
				for (size_t i = 0; i < r->nup; i++)
					if (strcmp(r->up[i].id, id) == 0)
						r->up[i].ended = true;
		} else if (line[0] == 'N' && line[1] == ' ' && report) {
			char what[1100];
			snprintf(what, sizeof(what), "note from the last run: %s", line + 2);
			report(ctx, what);
		}
	}
	return 0;
}

/* Empty the journal but for what is still open: multipart uploads whose
 * abort failed, and removals not finished; they must not be forgotten.
 * With nothing to keep, a truncate (nothing is lost whenever it lands);
 * else the kept lines go to a new file that replaces the journal by a
 * rename (fsync'd, then its directory), so that a crash leaves the old
 * journal or the new one, never an empty one. j->mu held. */
static void rewrite_keeping(struct journal *j, const struct records *r)
{
	size_t cap = 0, len = 0;
	char *text = NULL;
	for (size_t i = 0; i < r->nup + r->nrm; i++) {
		char line[2048];
		if (i < r->nup && r->up[i].ended)
			continue;
		if (i >= r->nup && r->rm[i - r->nup].ended)
			continue;
		const struct removal *m = i >= r->nup ? &r->rm[i - r->nup] : NULL;
		int n = m == NULL   ? snprintf(line, sizeof(line), "U %s %s\n", r->up[i].id, r->up[i].key)
			: m->key[0] ? snprintf(line, sizeof(line), "T %" PRIu64 " %s\n", m->id, m->key)
				    : snprintf(line, sizeof(line), "R %" PRIu64 " %s %" PRIu64 "\n", m->id, m->job,
					       m->step);
		if (GROW(text, cap, len + (size_t)n + 1, 256) < 0) {
			free(text);
			return; /* kept whole */
		}
		memcpy(text + len, line, (size_t)n);
		len += (size_t)n;
	}
	if (len == 0) {
		if (ftruncate(j->fd, 0) == 0)
			(void)fdatasync(j->fd);
		free(text);
		return;
	}
	/* Opened for the appends that follow too: once renamed, it is the
	 * journal, with no open that could fail after the rename. */
	char tmp[1200];
	snprintf(tmp, sizeof(tmp), "%s.new", j->path);
	int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
	if (fd >= 0 && write(fd, text, len) == (ssize_t)len && fsync(fd) == 0 && rename(tmp, j->path) == 0) {
		(void)fsync_dir(j->dir);
		close(j->fd);
		j->fd = fd;
	} else {
		log_warn("journal %s: compacting it: %s; kept whole", j->path, strerror(errno));
		if (fd >= 0)
			close(fd);
		unlink(tmp);
	}
	free(text);
}

/* The whole journal, NUL-terminated, in *out (malloc'd): 0 or -errno. One
 * over JOURNAL_MAX_BYTES is read as empty, with a warning. */
static int read_all(struct journal *j, char **out)
{
	*out = NULL;
	off_t size = lseek(j->fd, 0, SEEK_END);
	if (size < 0)
		return -errno;
	if (size > JOURNAL_MAX_BYTES) {
		log_warn("journal %s is %lld bytes; ignoring it", j->path, (long long)size);
		size = 0;
	}
	char *text = malloc((size_t)size + 1);
	if (text == NULL)
		return -ENOMEM;
	ssize_t got = pread(j->fd, text, (size_t)size, 0);
	if (got < 0) {
		int e = errno;
		free(text);
		return -e;
	}
	text[got] = '\0';
	*out = text;
	return 0;
}

void journal_compact(struct journal *j)
{
	pthread_mutex_lock(&j->mu);
	char *text;
	if (read_all(j, &text) == 0) {
		struct records r = { 0 };
		if (parse(text, &r, true, NULL, NULL) == 0) /* else keep it all: nothing open is forgotten */
			rewrite_keeping(j, &r);
		records_free(&r);
		free(text);
	}
	pthread_mutex_unlock(&j->mu);
}

int journal_note(struct journal *j, const char *what)
{
	char line[1100];
	snprintf(line, sizeof(line), "N %s\n", what);
	for (char *c = line + 2; *c && c[1]; c++)
		if (*c == '\n')
			*c = ' ';
	return append(j, line);
}

/* Is this shard nobody's? Its manifest's name carries the attempt, and
 * shard names are fresh per save (format 2), so the shard is in use only
 * if that manifest exists and names it. Format 1 journals (shard names
 * without an attempt) keep the shard whenever a manifest exists. Only
 * when storage answers is the shard ours to remove; a read error keeps
 * it. */
static bool shard_orphaned(struct store *s, const struct entry *e)
{
	void *buf = NULL;
	size_t len = 0;
	int r = s->ops->get_all(s, e->man, MANIFEST_MAX_BYTES, &buf, &len);
	if (r == -ENOENT)
		return true;
	if (r < 0)
		return false;
	const char *base = strrchr(e->shard, '/');
	base = base ? base + 1 : e->shard;
	struct step_name sn;
	manifest_parse_object(base, &sn);
	bool orphan = false;
	Ckpt__Manifest *m = NULL;
	char why[256];
	if (sn.kind == OBJ_SHARD && sn.attempt[0] && manifest_decode(buf, len, &m, why, sizeof(why)) == 0) {
		char named[768]; /* the manifest's shard, in the step's or the spread directory */
		orphan = manifest_shard_of(m, named, sizeof(named)) == 0 && strcmp(named, e->shard) != 0;
		ckpt__manifest__free_unpacked(m, NULL);
	}
	free(buf);
	return orphan;
}

/* Abort the multipart uploads a crash left open; 0 or the count. One
 * whose store has no multipart uploads is done with. */
static int abort_open_uploads(journal_store_fn store_of, void *sctx, struct records *r, journal_recover_fn report,
			      void *ctx)
{
	int removed = 0;
	for (size_t i = 0; i < r->nup; i++) {
		struct upload *u = &r->up[i];
		struct store *s = store_of(sctx, u->key);
		if (!u->ended && s->ops->abort_upload == NULL)
			u->ended = true;
		if (u->ended)
			continue;
		int e = s->ops->abort_upload(s, u->key, u->id);
		if (e != 0) {
			log_warn("recovery: aborting multipart upload %s of %s: %s", u->id, u->key, store_error(e));
			continue;
		}
		u->ended = true;
		removed++;
		char what[2048];
		snprintf(what, sizeof(what), "multipart upload %s of %s (aborted)", u->id, u->key);
		report(ctx, what);
	}
	return removed;
}

/* Remove the temporary files, and the shards without a manifest, of the
 * uploads that never ended; the count. */
static int remove_unfinished(journal_store_fn store_of, void *sctx, const struct records *r, journal_recover_fn report,
			     void *ctx)
{
	int removed = 0;
	for (size_t i = 0; i < r->n; i++) {
		const struct entry *e = &r->v[i];
		if (e->ended)
			continue;
		struct store *s = store_of(sctx, e->shard);
		char what[1024];
		const char *keys[2] = { e->shard, e->man };
		for (int k = 0; k < 2; k++) {
			int c = s->ops->remove_temps(s, keys[k]);
			if (c > 0) {
				removed += c;
				snprintf(what, sizeof(what), "%d temporary file(s) of %s", c, keys[k]);
				report(ctx, what);
			}
		}
		if (shard_orphaned(s, e) && s->ops->remove(s, e->shard) == 0) {
			removed++;
			snprintf(what, sizeof(what), "shard %s (its manifest was never written)", e->shard);
			report(ctx, what);
		}
	}
	return removed;
}

/* Finish the step removals a crash cut short (the step is not listed any
 * more once its manifests went: its other objects would stay for ever);
 * the count of steps finished. */
static int finish_removals(journal_store_fn store_of, void *sctx, struct records *r, uint64_t in_flight_s,
			   journal_recover_fn report, void *ctx)
{
	int done = 0;
	for (size_t i = 0; i < r->nrm; i++) {
		struct removal *m = &r->rm[i];
		char dir[512];
		if (!m->ended && m->key[0]) { /* a write outside an upload: its temporaries */
			struct store *s = store_of(sctx, m->key);
			int c = s->ops->remove_temps(s, m->key);
			if (c >= 0)
				m->ended = true;
			if (c > 0) {
				done += c;
				char what[1024];
				snprintf(what, sizeof(what), "%d temporary file(s) of %s", c, m->key);
				report(ctx, what);
			}
			continue;
		}
		if (m->ended || !manifest_job_valid(m->job) || manifest_step_dir(dir, sizeof(dir), m->job, m->step) < 0)
			continue;
		int e = catalog_delete_step(store_of(sctx, dir), NULL, m->job, m->step, CATALOG_FINISH, in_flight_s);
		/* EBUSY: its shard is referred to, or a save may be writing an
		 * attempt of it; that stays, marked for retention to finish. */
		if (e < 0 && e != -ENOENT && e != -EBUSY) {
			log_warn("recovery: finishing the removal of %s step %" PRIu64 ": %s", m->job, m->step,
				 store_error(e));
			continue;
		}
		m->ended = true;
		done++;
		char what[600];
		snprintf(what, sizeof(what), "the rest of %s step %" PRIu64 " (its removal was cut short)%s", m->job,
			 m->step,
			 e == -EBUSY ? "; some is kept: a step refers to it, or a save may be writing it" : "");
		report(ctx, what);
	}
	return done;
}

static struct store *one_store(void *sctx, const char *key)
{
	(void)key;
	return sctx;
}

void journal_set_in_flight(struct journal *j, uint64_t in_flight_s)
{
	j->in_flight_s = in_flight_s;
}

int journal_recover(struct journal *j, struct store *s, journal_recover_fn report, void *ctx)
{
	return journal_recover_by(j, one_store, s, report, ctx);
}

int journal_recover_by(struct journal *j, journal_store_fn store_of, void *sctx, journal_recover_fn report, void *ctx)
{
	char *text;
	int e = read_all(j, &text);
	if (e < 0)
		return e;
	struct records r = { 0 };
	e = parse(text, &r, false, report, ctx);
	free(text);
	if (e < 0) {
		records_free(&r);
		return e;
	}
	int removed = abort_open_uploads(store_of, sctx, &r, report, ctx);
	removed += remove_unfinished(store_of, sctx, &r, report, ctx);
	removed += finish_removals(store_of, sctx, &r, j->in_flight_s, report, ctx);
	/* Uploads whose abort failed, and removals that failed again
	 * (storage unreachable), stay for the next start; the rest of the
	 * journal is done with. */
	pthread_mutex_lock(&j->mu);
	rewrite_keeping(j, &r);
	pthread_mutex_unlock(&j->mu);
	records_free(&r);
	return removed;
}
