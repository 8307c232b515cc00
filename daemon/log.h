/* Logging to stderr with sd-daemon "<N>" priority prefixes, which journald
 * and most log shippers understand. */
#ifndef CKPTD_LOG_H
#define CKPTD_LOG_H

enum log_level { LOG_LVL_ERR = 3, LOG_LVL_WARN = 4, LOG_LVL_INFO = 6, LOG_LVL_DEBUG = 7 };

void log_set_level(enum log_level lvl);
/* 0 on success, -EINVAL for an unknown name (error|warn|info|debug). */
int log_parse_level(const char *name, enum log_level *out);
void log_msg(enum log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_err(...) log_msg(LOG_LVL_ERR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_LVL_WARN, __VA_ARGS__)
#define log_info(...) log_msg(LOG_LVL_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_LVL_DEBUG, __VA_ARGS__)

#endif
