#include "config.h"

#include <errno.h>
#include <ini.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void config_defaults(struct config *c)
{
	memset(c, 0, sizeof(*c));
	snprintf(c->socket_path, sizeof(c->socket_path), "%s", DEFAULT_SOCKET_PATH);
	snprintf(c->state_dir, sizeof(c->state_dir), "%s", DEFAULT_STATE_DIR);
	c->staging_bytes = DEFAULT_STAGING_BYTES;
	c->chunk_bytes = DEFAULT_CHUNK_BYTES;
	c->copy_threads = DEFAULT_COPY_THREADS;
	c->admit_timeout_ms = DEFAULT_ADMIT_TIMEOUT_MS;
	c->drain_timeout_ms = DEFAULT_DRAIN_TIMEOUT_MS;
	c->allowed_uids[c->n_allowed_uids++] = getuid();
	if (getuid() != 0)
		c->allowed_uids[c->n_allowed_uids++] = 0;
	c->max_frame_bytes = DEFAULT_MAX_FRAME_BYTES;
	c->max_fds_per_frame = DEFAULT_MAX_FDS_PER_FRAME;
	c->max_sessions = DEFAULT_MAX_SESSIONS;
	c->max_buffers = DEFAULT_MAX_BUFFERS;
	c->max_tensors = DEFAULT_MAX_TENSORS;
	c->max_name_len = DEFAULT_MAX_NAME_LEN;
	c->max_inflight_saves = DEFAULT_MAX_INFLIGHT_SAVES;
	c->max_inflight_loads = DEFAULT_MAX_INFLIGHT_LOADS;
	c->max_write_queue = DEFAULT_MAX_WRITE_QUEUE;
	c->max_extra_state = DEFAULT_MAX_EXTRA_STATE;
	c->manifest_cache_bytes = DEFAULT_MANIFEST_CACHE_BYTES;
	c->log_level = 6;
	c->policy = POLICY_BLOCK;
	c->max_parallel_uploads = DEFAULT_MAX_PARALLEL_UPLOADS;
	c->memory_tier = true;
}

int config_parse_duration(const char *s, uint64_t *out)
{
	char *end = NULL;
	if (s == NULL || *s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno == ERANGE)
		return -ERANGE;
	uint64_t mul = 1;
	switch (*end) {
	case '\0': break;
	case 's': mul = 1; end++; break;
	case 'm': mul = 60; end++; break;
	case 'h': mul = 3600; end++; break;
	case 'd': mul = 86400; end++; break;
	default: return -EINVAL;
	}
	if (*end != '\0')
		return -EINVAL;
	if (v > UINT64_MAX / mul)
		return -ERANGE;
	*out = v * mul;
	return 0;
}

bool retention_active(const struct retention *r)
{
	return r->keep_last || r->keep_every || r->max_age_s || r->incomplete_grace_s;
}

static int parse_u32(const char *s, uint32_t *out);

/* Retention keys, shared by [retention] and [job.NAME]; -ENOENT if name
 * is not one. bit says which field was set. */
static int parse_retention(struct retention *rt, const char *name, const char *value, uint8_t *bit)
{
	if (strcmp(name, "keep_last") == 0) {
		*bit = 1;
		return parse_u32(value, &rt->keep_last);
	}
	if (strcmp(name, "keep_every") == 0) {
		*bit = 2;
		return parse_u32(value, &rt->keep_every);
	}
	if (strcmp(name, "max_age") == 0) {
		*bit = 4;
		return config_parse_duration(value, &rt->max_age_s);
	}
	if (strcmp(name, "incomplete_grace") == 0) {
		*bit = 8;
		return config_parse_duration(value, &rt->incomplete_grace_s);
	}
	return -ENOENT;
}

int config_parse_policy(const char *s, enum admit_policy *out)
{
	static const char *names[] = { "block", "skip", "coalesce" };
	for (int i = 0; i < 3; i++)
		if (strcmp(s, names[i]) == 0) {
			*out = (enum admit_policy)i;
			return 0;
		}
	return -EINVAL;
}

const char *config_policy_name(enum admit_policy p)
{
	return p == POLICY_SKIP ? "skip" : p == POLICY_COALESCE ? "coalesce" : "block";
}

/* "50%" or a size: exactly one of *pct, *bytes is set. */
static int parse_quota(const char *s, uint64_t *bytes, uint32_t *pct)
{
	size_t n = strlen(s);
	if (n > 1 && s[n - 1] == '%') {
		char buf[32];
		if (n >= sizeof(buf))
			return -EINVAL;
		memcpy(buf, s, n - 1);
		buf[n - 1] = '\0';
		uint64_t v;
		int r = config_parse_size(buf, &v);
		if (r < 0 || v == 0 || v > 100)
			return -EINVAL;
		*pct = (uint32_t)v;
		*bytes = 0;
		return 0;
	}
	int r = config_parse_size(s, bytes);
	if (r < 0)
		return r;
	if (*bytes == 0)
		return -EINVAL;
	*pct = 0;
	return 0;
}

static struct job_config *job_section(struct config *c, const char *name)
{
	for (size_t i = 0; i < c->njobs; i++)
		if (strcmp(c->jobs[i].name, name) == 0)
			return &c->jobs[i];
	if (c->njobs == CONFIG_MAX_JOBS || strlen(name) >= sizeof(c->jobs[0].name) || name[0] == '\0')
		return NULL;
	struct job_config *j = &c->jobs[c->njobs++];
	memset(j, 0, sizeof(*j));
	snprintf(j->name, sizeof(j->name), "%s", name);
	j->policy = -1;
	return j;
}

void config_job_policy(const struct config *c, const char *job, uint64_t pool_bytes,
		       struct job_policy *out)
{
	out->policy = c->policy;
	uint64_t qb = c->quota_bytes;
	uint32_t qp = c->quota_pct;
	out->max_inflight_saves = c->max_inflight_saves;
	out->retention = c->retention;
	for (size_t i = 0; i < c->njobs; i++) {
		const struct job_config *j = &c->jobs[i];
		if (strcmp(j->name, job) != 0)
			continue;
		if (j->policy >= 0)
			out->policy = (enum admit_policy)j->policy;
		if (j->quota_bytes || j->quota_pct) {
			qb = j->quota_bytes;
			qp = j->quota_pct;
		}
		if (j->max_inflight_saves)
			out->max_inflight_saves = j->max_inflight_saves;
		if (j->retention_set & 1)
			out->retention.keep_last = j->retention.keep_last;
		if (j->retention_set & 2)
			out->retention.keep_every = j->retention.keep_every;
		if (j->retention_set & 4)
			out->retention.max_age_s = j->retention.max_age_s;
		if (j->retention_set & 8)
			out->retention.incomplete_grace_s = j->retention.incomplete_grace_s;
	}
	if (qp)
		qb = pool_bytes / 100 * qp + pool_bytes % 100 * qp / 100;
	out->quota_bytes = qb && qb < pool_bytes ? qb : pool_bytes;
}

int config_parse_size(const char *s, uint64_t *out)
{
	char *end = NULL;
	/* strtoull would skip leading blanks and accept a sign (" -1" is
	 * ULLONG_MAX), so insist on a digit first. */
	if (s == NULL || *s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno == ERANGE)
		return -ERANGE;
	if (errno != 0 || end == s)
		return -EINVAL;
	unsigned shift = 0;
	switch (*end) {
	case '\0': break;
	case 'k': case 'K': shift = 10; end++; break;
	case 'm': case 'M': shift = 20; end++; break;
	case 'g': case 'G': shift = 30; end++; break;
	case 't': case 'T': shift = 40; end++; break;
	default: return -EINVAL;
	}
	if (*end == 'i' || *end == 'I')
		end++;
	if (*end == 'b' || *end == 'B')
		end++;
	if (*end != '\0')
		return -EINVAL;
	if (shift && v > (UINT64_MAX >> shift))
		return -ERANGE;
	*out = (uint64_t)v << shift;
	return 0;
}

static int parse_u32(const char *s, uint32_t *out)
{
	uint64_t v;
	int r = config_parse_size(s, &v);
	if (r < 0)
		return r;
	if (v > UINT32_MAX)
		return -ERANGE;
	*out = (uint32_t)v;
	return 0;
}

/* "1000, 0 42": a list of numeric ids; an empty value clears the list. */
static int parse_ids(const char *s, unsigned *ids, size_t *n)
{
	size_t k = 0;
	const char *p = s;
	while (*p) {
		while (*p == ' ' || *p == ',' || *p == '\t')
			p++;
		if (*p == '\0')
			break;
		if (*p < '0' || *p > '9') /* strtoul takes "-0" and wraps signs */
			return -EINVAL;
		char *end;
		errno = 0;
		unsigned long v = strtoul(p, &end, 10);
		if (errno || end == p || v > UINT32_MAX - 1)
			return -EINVAL;
		if (k == CONFIG_MAX_IDS)
			return -E2BIG;
		ids[k++] = (unsigned)v;
		p = end;
		if (*p && *p != ' ' && *p != ',' && *p != '\t')
			return -EINVAL;
	}
	*n = k;
	return 0;
}

static int copy_str(char *dst, size_t cap, const char *v)
{
	if (strlen(v) >= cap)
		return -ENAMETOOLONG;
	memcpy(dst, v, strlen(v) + 1);
	return 0;
}

struct ini_ctx {
	struct config *c;
	int err;
	char *msg;
	size_t msglen;
};

static int on_ini(void *user, const char *section, const char *name,
		  const char *value)
{
	struct ini_ctx *x = user;
	struct config *c = x->c;
	int r = -ENOENT;

#define KEY(s, k) (strcmp(section, s) == 0 && strcmp(name, k) == 0)
	if (strncmp(section, "job.", 4) == 0) {
		struct job_config *j = job_section(c, section + 4);
		enum admit_policy pol;
		if (j == NULL)
			r = -E2BIG;
		else if (strcmp(name, "policy") == 0) {
			r = config_parse_policy(value, &pol);
			if (r == 0)
				j->policy = (int)pol;
		}
		else if (strcmp(name, "quota") == 0)
			r = parse_quota(value, &j->quota_bytes, &j->quota_pct);
		else if (strcmp(name, "max_inflight_saves") == 0)
			r = parse_u32(value, &j->max_inflight_saves);
		else {
			uint8_t bit = 0;
			r = parse_retention(&j->retention, name, value, &bit);
			if (r == 0)
				j->retention_set |= bit;
		}
	} else if (strcmp(section, "retention") == 0) {
		uint8_t bit;
		r = parse_retention(&c->retention, name, value, &bit);
	} else if (KEY("pool", "policy")) {
		r = config_parse_policy(value, &c->policy);
	} else if (KEY("pool", "quota")) {
		r = parse_quota(value, &c->quota_bytes, &c->quota_pct);
	} else if (KEY("pool", "max_parallel_uploads")) {
		r = parse_u32(value, &c->max_parallel_uploads);
	} else if (KEY("pool", "memory_tier")) {
		r = strcmp(value, "true") == 0 || strcmp(value, "yes") == 0 || strcmp(value, "1") == 0 ? 0 :
		    strcmp(value, "false") == 0 || strcmp(value, "no") == 0 || strcmp(value, "0") == 0 ? 1 : -EINVAL;
		if (r >= 0) {
			c->memory_tier = r == 0;
			r = 0;
		}
	} else if (KEY("debug", "store_delay_ms")) {
		r = parse_u32(value, &c->debug_store_delay_ms);
	} else if (KEY("debug", "manifest_delay_ms")) {
		r = parse_u32(value, &c->debug_manifest_delay_ms);
	} else if (KEY("server", "socket"))
		r = copy_str(c->socket_path, sizeof(c->socket_path), value);
	else if (KEY("server", "state_dir"))
		r = copy_str(c->state_dir, sizeof(c->state_dir), value);
	else if (KEY("server", "allowed_uids"))
		r = parse_ids(value, c->allowed_uids, &c->n_allowed_uids);
	else if (KEY("server", "allowed_gids"))
		r = parse_ids(value, c->allowed_gids, &c->n_allowed_gids);
	else if (KEY("server", "drain_timeout_ms"))
		r = parse_u32(value, &c->drain_timeout_ms);
	else if (KEY("storage", "url"))
		r = copy_str(c->storage_url, sizeof(c->storage_url), value);
	else if (KEY("storage", "layout")) {
		r = strcmp(value, "spread") == 0 || strcmp(value, "step") == 0 ? 0 : -EINVAL;
		c->layout_spread = strcmp(value, "spread") == 0;
	}
	else if (strcmp(section, "storage") == 0) {
		/* Object-store options (endpoint, region, part_size ...):
		 * checked by the backend when it opens. */
		size_t l = strlen(c->storage_opts);
		int n = snprintf(c->storage_opts + l, sizeof(c->storage_opts) - l, "%s%s=%s", l ? "&" : "", name,
				 value);
		r = (n < 0 || (size_t)n >= sizeof(c->storage_opts) - l || strpbrk(value, "&?")) ? -EINVAL : 0;
	}
	else if (KEY("pool", "staging_bytes"))
		r = config_parse_size(value, &c->staging_bytes);
	else if (KEY("pool", "chunk_bytes"))
		r = config_parse_size(value, &c->chunk_bytes);
	else if (KEY("pool", "copy_threads"))
		r = parse_u32(value, &c->copy_threads);
	else if (KEY("pool", "admit_timeout_ms"))
		r = parse_u32(value, &c->admit_timeout_ms);
	else if (KEY("limits", "max_frame_bytes"))
		r = parse_u32(value, &c->max_frame_bytes);
	else if (KEY("limits", "max_fds_per_frame"))
		r = parse_u32(value, &c->max_fds_per_frame);
	else if (KEY("limits", "max_sessions"))
		r = parse_u32(value, &c->max_sessions);
	else if (KEY("limits", "max_buffers"))
		r = parse_u32(value, &c->max_buffers);
	else if (KEY("limits", "max_tensors"))
		r = parse_u32(value, &c->max_tensors);
	else if (KEY("limits", "max_name_len"))
		r = parse_u32(value, &c->max_name_len);
	else if (KEY("limits", "max_inflight_saves"))
		r = parse_u32(value, &c->max_inflight_saves);
	else if (KEY("limits", "max_inflight_loads"))
		r = parse_u32(value, &c->max_inflight_loads);
	else if (KEY("limits", "max_write_queue"))
		r = parse_u32(value, &c->max_write_queue);
	else if (KEY("limits", "max_extra_state"))
		r = parse_u32(value, &c->max_extra_state);
	else if (KEY("limits", "manifest_cache_bytes"))
		r = config_parse_size(value, &c->manifest_cache_bytes);
	else if (KEY("metrics", "listen"))
		r = copy_str(c->metrics_listen, sizeof(c->metrics_listen), value);
	else if (KEY("log", "level")) {
		static const char *names[] = { "error", "warn", "info", "debug" };
		static const int lv[] = { 3, 4, 6, 7 };
		for (int i = 0; i < 4; i++)
			if (strcmp(value, names[i]) == 0) {
				c->log_level = lv[i];
				r = 0;
			}
		if (r)
			r = -EINVAL;
	}
#undef KEY
	if (r < 0 && x->err == 0) {
		x->err = r;
		snprintf(x->msg, x->msglen, "[%s] %s = %s: %s", section, name,
			 value, r == -ENOENT ? "unknown key" : strerror(-r));
	}
	return r == 0;
}

int config_load(struct config *c, const char *path, char *err, size_t errlen)
{
	FILE *f = fopen(path, "re");
	if (f == NULL) {
		int e = errno;
		snprintf(err, errlen, "%s: %s", path, strerror(e));
		return -e;
	}
	char msg[512] = "";
	struct ini_ctx x = { .c = c, .msg = msg, .msglen = sizeof(msg) };
	int line = ini_parse_file(f, on_ini, &x);
	fclose(f);
	if (line != 0 || x.err) {
		snprintf(err, errlen, "%s:%d: %s", path, line > 0 ? line : 0,
			 msg[0] ? msg : "syntax error");
		return x.err ? x.err : -EINVAL;
	}
	return 0;
}

int config_set(struct config *c, const char *section_key, const char *value, char *err, size_t errlen)
{
	char sec[160];
	const char *dot = strrchr(section_key, '.');
	if (dot == NULL || dot == section_key || (size_t)(dot - section_key) >= sizeof(sec) || dot[1] == '\0') {
		snprintf(err, errlen, "--set %s: want SECTION.KEY=VALUE", section_key);
		return -EINVAL;
	}
	memcpy(sec, section_key, (size_t)(dot - section_key));
	sec[dot - section_key] = '\0';
	char msg[512] = "";
	struct ini_ctx x = { .c = c, .msg = msg, .msglen = sizeof(msg) };
	on_ini(&x, sec, dot + 1, value);
	if (x.err) {
		snprintf(err, errlen, "--set %s=%s: %s", section_key, value, msg);
		return x.err;
	}
	return 0;
}

static const char *level_name(int l)
{
	return l <= 3 ? "error" : l == 4 ? "warn" : l <= 6 ? "info" : "debug";
}

static void print_ids(FILE *f, const char *key, const unsigned *ids, size_t n)
{
	fprintf(f, "%s =", key);
	for (size_t i = 0; i < n; i++)
		fprintf(f, "%s %u", i ? "," : "", ids[i]);
	fprintf(f, "\n");
}

static void print_retention(FILE *f, const struct retention *r, uint8_t set)
{
	if (set & 1)
		fprintf(f, "keep_last = %u\n", r->keep_last);
	if (set & 2)
		fprintf(f, "keep_every = %u\n", r->keep_every);
	if (set & 4)
		fprintf(f, "max_age = %" PRIu64 "s\n", r->max_age_s);
	if (set & 8)
		fprintf(f, "incomplete_grace = %" PRIu64 "s\n", r->incomplete_grace_s);
}

void config_print(const struct config *c, FILE *f)
{
	fprintf(f, "[server]\nsocket = %s\nstate_dir = %s\n", c->socket_path, c->state_dir);
	print_ids(f, "allowed_uids", c->allowed_uids, c->n_allowed_uids);
	print_ids(f, "allowed_gids", c->allowed_gids, c->n_allowed_gids);
	fprintf(f, "drain_timeout_ms = %u\n\n", c->drain_timeout_ms);
	fprintf(f, "[storage]\nurl = %s\nlayout = %s\n", c->storage_url, c->layout_spread ? "spread" : "step");
	if (c->storage_opts[0]) {
		char o[sizeof(c->storage_opts)];
		snprintf(o, sizeof(o), "%s", c->storage_opts);
		for (char *t = strtok(o, "&"); t; t = strtok(NULL, "&")) {
			char *eq = strchr(t, '=');
			if (eq) {
				*eq = 0;
				fprintf(f, "%s = %s\n", t, eq + 1);
			}
		}
	}
	fprintf(f, "\n");
	fprintf(f, "[pool]\nstaging_bytes = %" PRIu64 "\nchunk_bytes = %" PRIu64 "\ncopy_threads = %u\n"
		   "admit_timeout_ms = %u\npolicy = %s\n",
		c->staging_bytes, c->chunk_bytes, c->copy_threads, c->admit_timeout_ms, config_policy_name(c->policy));
	if (c->quota_pct)
		fprintf(f, "quota = %u%%\n", c->quota_pct);
	else if (c->quota_bytes)
		fprintf(f, "quota = %" PRIu64 "\n", c->quota_bytes);
	fprintf(f, "max_parallel_uploads = %u\nmemory_tier = %s\n\n", c->max_parallel_uploads,
		c->memory_tier ? "true" : "false");
	fprintf(f, "[retention]\n");
	print_retention(f, &c->retention, 15);
	fprintf(f, "\n[limits]\nmax_frame_bytes = %u\nmax_fds_per_frame = %u\nmax_sessions = %u\n"
		   "max_buffers = %u\nmax_tensors = %u\nmax_name_len = %u\nmax_inflight_saves = %u\n"
		   "max_inflight_loads = %u\nmax_write_queue = %u\nmax_extra_state = %u\n"
		   "manifest_cache_bytes = %" PRIu64 "\n\n",
		c->max_frame_bytes, c->max_fds_per_frame, c->max_sessions, c->max_buffers, c->max_tensors,
		c->max_name_len, c->max_inflight_saves, c->max_inflight_loads, c->max_write_queue,
		c->max_extra_state, c->manifest_cache_bytes);
	fprintf(f, "[metrics]\nlisten = %s\n\n[log]\nlevel = %s\n", c->metrics_listen,
		level_name(c->log_level));
	for (size_t i = 0; i < c->njobs; i++) {
		const struct job_config *j = &c->jobs[i];
		fprintf(f, "\n[job.%s]\n", j->name);
		if (j->policy >= 0)
			fprintf(f, "policy = %s\n", config_policy_name((enum admit_policy)j->policy));
		if (j->quota_pct)
			fprintf(f, "quota = %u%%\n", j->quota_pct);
		else if (j->quota_bytes)
			fprintf(f, "quota = %" PRIu64 "\n", j->quota_bytes);
		if (j->max_inflight_saves)
			fprintf(f, "max_inflight_saves = %u\n", j->max_inflight_saves);
		print_retention(f, &j->retention, j->retention_set);
	}
	if (c->debug_store_delay_ms || c->debug_manifest_delay_ms)
		fprintf(f, "\n[debug]\nstore_delay_ms = %u\nmanifest_delay_ms = %u\n", c->debug_store_delay_ms,
			c->debug_manifest_delay_ms);
}

int config_validate(const struct config *c, char *err, size_t errlen)
{
	if (c->chunk_bytes < 4096 || (c->chunk_bytes & 4095)) {
		snprintf(err, errlen, "chunk_bytes %" PRIu64 " must be a multiple of 4096", c->chunk_bytes);
		return -EINVAL;
	}
	if (c->staging_bytes < c->chunk_bytes) {
		snprintf(err, errlen, "staging_bytes %" PRIu64 " is smaller than one chunk (%" PRIu64 ")",
			 c->staging_bytes, c->chunk_bytes);
		return -EINVAL;
	}
	if (c->copy_threads < 1 || c->copy_threads > 64) {
		snprintf(err, errlen, "copy_threads must be 1..64");
		return -EINVAL;
	}
	if (c->max_parallel_uploads < 1 || c->max_parallel_uploads > 64) {
		snprintf(err, errlen, "max_parallel_uploads must be 1..64");
		return -EINVAL;
	}
	if (c->max_frame_bytes < 1024 || c->max_fds_per_frame < 1 ||
	    c->max_sessions < 1 || c->max_buffers < 1 || c->max_tensors < 1 ||
	    c->max_name_len < 1 || c->max_inflight_saves < 1 || c->max_inflight_loads < 1) {
		snprintf(err, errlen, "a limit is too small");
		return -EINVAL;
	}
	if (c->max_fds_per_frame > 253) {
		snprintf(err, errlen, "max_fds_per_frame must be 1..253 (the kernel's SCM_MAX_FD)");
		return -EINVAL;
	}
	if (c->storage_url[0] == '\0') {
		snprintf(err, errlen, "no storage URL (--storage or [storage] url)");
		return -EINVAL;
	}
	return 0;
}
