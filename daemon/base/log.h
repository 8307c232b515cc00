/* Logging. To stderr with sd-daemon "<N>" priority prefixes, which
 * journald and most log shippers understand, or as one JSON object per
 * line ([log] format = json, for Kubernetes log pipelines); or, when
 * stderr is connected to the journal (JOURNAL_STREAM matches it), straight
 * to the journal with structured fields (CKPT_JOB, CKPT_RANK, CKPT_STEP,
 * CKPT_SAVE_ID). Repeated messages from one call site are rate-limited.
 * Thread-safe. */
#ifndef CKPTD_LOG_H
#define CKPTD_LOG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

enum log_level {
	LOG_LVL_ERR = 3,
	LOG_LVL_WARN = 4,
	LOG_LVL_INFO = 6,
	LOG_LVL_DEBUG = 7
};

enum log_format {
	LOG_FORMAT_TEXT,
	LOG_FORMAT_JSON
};

/* Structured context for a message; zero fields are left out. */
struct log_ctx {
	const char *job;
	int64_t rank;     /* -1: none */
	int64_t step;     /* -1: none */
	uint64_t save_id; /* 0: none */
};

#define LOG_RATE_BURST 20        /* messages per call site ... */
#define LOG_RATE_WINDOW_MS 10000 /* ... per window */

/* Decide between stderr and the journal; call once at start. */
void log_init(void);
void log_set_level(enum log_level lvl);
void log_set_format(enum log_format f);
/* One message as a JSON object and a newline, into out (len bytes):
 * {"time":"2026-11-24T10:00:00.123Z","level":"info","msg":"...","job":"...",
 * "rank":0,"step":7,"save_id":3}, the context's zero fields left out, the
 * strings escaped as JSON wants. Returns the length (truncated messages
 * stay valid JSON). */
size_t log_json_line(enum log_level lvl, const struct log_ctx *ctx, const char *msg, const struct timespec *now,
		     char *out, size_t len);
/* Tests: write lines here instead of stderr, and never to the journal. */
void log_set_output(FILE *f);
/* Tests: the rate limit's window instead of LOG_RATE_WINDOW_MS. */
void log_set_rate_window_ms(unsigned ms);
/* 0 on success, -EINVAL for an unknown name (error|warn|info|debug). */
int log_parse_level(const char *name, enum log_level *out);
/* Does JOURNAL_STREAM ("dev:ino") name the file open on fd? */
bool log_journal_stream_matches(const char *env, int fd);
/* The journal fields of a message, "KEY=value" each, into out[] (at most
 * max); returns how many. Buffers come from scratch. */
int log_journal_fields(enum log_level lvl, const struct log_ctx *ctx, const char *msg, char out[][1100], int max);

void log_ctx_msg(enum log_level lvl, const struct log_ctx *ctx, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
#define log_msg(lvl, ...) log_ctx_msg((lvl), NULL, __VA_ARGS__)

#define log_err(...) log_msg(LOG_LVL_ERR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_LVL_WARN, __VA_ARGS__)
#define log_info(...) log_msg(LOG_LVL_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_LVL_DEBUG, __VA_ARGS__)

#endif
