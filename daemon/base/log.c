#include "log.h"
#include "macro.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <systemd/sd-journal.h>
#include <time.h>
#include <unistd.h>

static enum log_level cur_level = LOG_LVL_INFO;
static enum log_format cur_format = LOG_FORMAT_TEXT;
static unsigned rate_window_ms = LOG_RATE_WINDOW_MS;
static bool to_journal;
static FILE *out_file;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

void log_set_level(enum log_level lvl)
{
	cur_level = lvl;
}

void log_set_rate_window_ms(unsigned ms)
{
	rate_window_ms = ms;
}

void log_set_format(enum log_format f)
{
	cur_format = f;
}

/* s as a JSON string's contents: '"', '\\' and control characters escaped;
 * stops short of a partial escape at the end of out. */
static size_t json_str(char *out, size_t len, size_t at, const char *s)
{
	for (; *s && at + 7 < len; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\') {
			out[at++] = '\\';
			out[at++] = (char)c;
		} else if (c == '\n') {
			out[at++] = '\\';
			out[at++] = 'n';
		} else if (c < 0x20) {
			at += (size_t)snprintf(out + at, len - at, "\\u%04x", c);
		} else {
			out[at++] = (char)c;
		}
	}
	return at;
}

size_t log_json_line(enum log_level lvl, const struct log_ctx *ctx, const char *msg, const struct timespec *now,
		     char *out, size_t len)
{
	static const char *const names[] = {
		[LOG_LVL_ERR] = "error", [LOG_LVL_WARN] = "warn", [LOG_LVL_INFO] = "info", [LOG_LVL_DEBUG] = "debug"
	};
	struct tm tm;
	gmtime_r(&now->tv_sec, &tm);
	/* Room kept for the context and the closing brace. */
	size_t tail = 200, at = 0;
	if (len < tail + 64)
		return 0;
	at += strftime(out, len, "{\"time\":\"%Y-%m-%dT%H:%M:%S", &tm);
	at += (size_t)snprintf(out + at, len - at, ".%03ldZ\",\"level\":\"%s\",\"msg\":\"", now->tv_nsec / 1000000,
			       (unsigned)lvl < ELEMENTSOF(names) && names[lvl] ? names[lvl] : "info");
	at = json_str(out, len - tail, at, msg);
	at += (size_t)snprintf(out + at, len - at, "\"");
	if (ctx && ctx->job && ctx->job[0]) {
		at += (size_t)snprintf(out + at, len - at, ",\"job\":\"");
		at = json_str(out, len - 40, at, ctx->job);
		at += (size_t)snprintf(out + at, len - at, "\"");
	}
	if (ctx && ctx->rank >= 0)
		at += (size_t)snprintf(out + at, len - at, ",\"rank\":%" PRId64, ctx->rank);
	if (ctx && ctx->step >= 0)
		at += (size_t)snprintf(out + at, len - at, ",\"step\":%" PRId64, ctx->step);
	if (ctx && ctx->save_id)
		at += (size_t)snprintf(out + at, len - at, ",\"save_id\":%" PRIu64, ctx->save_id);
	at += (size_t)snprintf(out + at, len - at, "}\n");
	return at < len ? at : len - 1;
}

void log_set_output(FILE *f)
{
	out_file = f;
	to_journal = false;
}

int log_parse_level(const char *name, enum log_level *out)
{
	static const struct {
		const char *n;
		enum log_level l;
	} t[] = {
		{ "error", LOG_LVL_ERR },
		{ "warn", LOG_LVL_WARN },
		{ "info", LOG_LVL_INFO },
		{ "debug", LOG_LVL_DEBUG },
	};
	for (size_t i = 0; i < ELEMENTSOF(t); i++) {
		if (strcmp(name, t[i].n) == 0) {
			*out = t[i].l;
			return 0;
		}
	}
	return -EINVAL;
}

bool log_journal_stream_matches(const char *env, int fd)
{
	unsigned long long dev, ino;
	if (env == NULL || sscanf(env, "%llu:%llu", &dev, &ino) != 2)
		return false;
	struct stat st;
	if (fstat(fd, &st) != 0)
		return false;
	return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

void log_init(void)
{
	/* systemd sets JOURNAL_STREAM when stderr is a journal stream; if
	 * stderr was redirected since, it no longer matches. */
	to_journal = out_file == NULL && log_journal_stream_matches(getenv("JOURNAL_STREAM"), STDERR_FILENO);
}

int log_journal_fields(enum log_level lvl, const struct log_ctx *ctx, const char *msg, char out[][1100], int max)
{
	int n = 0;
	if (n < max)
		snprintf(out[n++], 1100, "MESSAGE=%s", msg);
	if (n < max)
		snprintf(out[n++], 1100, "PRIORITY=%d", (int)lvl);
	if (n < max)
		snprintf(out[n++], 1100, "SYSLOG_IDENTIFIER=ckptd");
	if (ctx && ctx->job && ctx->job[0] && n < max)
		snprintf(out[n++], 1100, "CKPT_JOB=%s", ctx->job);
	if (ctx && ctx->rank >= 0 && n < max)
		snprintf(out[n++], 1100, "CKPT_RANK=%" PRId64, ctx->rank);
	if (ctx && ctx->step >= 0 && n < max)
		snprintf(out[n++], 1100, "CKPT_STEP=%" PRId64, ctx->step);
	if (ctx && ctx->save_id && n < max)
		snprintf(out[n++], 1100, "CKPT_SAVE_ID=%" PRIu64, ctx->save_id);
	return n;
}

/* Rate limiting per call site (the format string's address). */
struct rate {
	const char *site;
	uint64_t window_start_ms;
	unsigned count, suppressed;
};
static struct rate rates[128];

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* mu held. 1: log it; 0: suppress. *was gets the count suppressed in the
 * window that just ended. */
static int rate_ok(const char *site, unsigned *was)
{
	*was = 0;
	size_t h = ((uintptr_t)site >> 4) % ELEMENTSOF(rates);
	struct rate *r = &rates[h];
	uint64_t now = now_ms();
	if (r->site != site || now - r->window_start_ms >= rate_window_ms) {
		if (r->site == site)
			*was = r->suppressed;
		r->site = site;
		r->window_start_ms = now;
		r->count = 0;
		r->suppressed = 0;
	}
	if (++r->count > LOG_RATE_BURST) {
		r->suppressed++;
		return 0;
	}
	return 1;
}

static void emit(enum log_level lvl, const struct log_ctx *ctx, const char *msg)
{
	if (to_journal) {
		char f[8][1100];
		struct iovec iov[8];
		int n = log_journal_fields(lvl, ctx, msg, f, 8);
		for (int i = 0; i < n; i++)
			iov[i] = (struct iovec){ .iov_base = f[i], .iov_len = strlen(f[i]) };
		if (sd_journal_sendv(iov, n) == 0)
			return;
	}
	FILE *o = out_file ? out_file : stderr;
	/* One write per line so lines from threads never interleave. */
	if (cur_format == LOG_FORMAT_JSON) {
		char line[4096];
		struct timespec now;
		clock_gettime(CLOCK_REALTIME, &now);
		size_t n = log_json_line(lvl, ctx, msg, &now, line, sizeof(line));
		fwrite(line, 1, n, o);
	} else {
		fprintf(o, "<%d>%s\n", (int)lvl, msg);
	}
	fflush(o);
}

void log_ctx_msg(enum log_level lvl, const struct log_ctx *ctx, const char *fmt, ...)
{
	if (lvl > cur_level)
		return;
	char line[2048];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	pthread_mutex_lock(&mu);
	unsigned was = 0;
	int ok = lvl <= LOG_LVL_WARN ? rate_ok(fmt, &was) : 1; /* repeated errors only */
	if (was) {
		char note[128];
		snprintf(note, sizeof(note), "(%u similar messages suppressed)", was);
		emit(lvl, ctx, note);
	}
	if (ok)
		emit(lvl, ctx, line);
	pthread_mutex_unlock(&mu);
}
