#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static enum log_level cur_level = LOG_LVL_INFO;

void log_set_level(enum log_level lvl)
{
	cur_level = lvl;
}

int log_parse_level(const char *name, enum log_level *out)
{
	static const struct { const char *n; enum log_level l; } t[] = {
		{ "error", LOG_LVL_ERR }, { "warn", LOG_LVL_WARN },
		{ "info", LOG_LVL_INFO }, { "debug", LOG_LVL_DEBUG },
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		if (strcmp(name, t[i].n) == 0) {
			*out = t[i].l;
			return 0;
		}
	}
	return -EINVAL;
}

void log_msg(enum log_level lvl, const char *fmt, ...)
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
	/* One write per line so lines from threads never interleave. */
	fprintf(stderr, "<%d>%s\n", (int)lvl, line);
}
