/* The values of ckptd.conf (config_value.c): a key's row, the value
 * types of config.c's key tables (each parses a key's text into its field,
 * prints it back, and compares two configs' fields for SIGHUP), and the
 * parsers of sizes and durations. config.h includes it. */
#ifndef CKPTD_CONFIG_VALUE_H
#define CKPTD_CONFIG_VALUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* One config key: a row of config_keys[] or config_job_keys[] (config.c),
 * which drive parsing (file and --set), printing (--check-config), the
 * defaults and SIGHUP. */
struct config_key;

/* How a type of value is read from ini text, written back ("name =
 * value\n") and compared. base is the struct config (struct job_config in
 * job rows) holding the key's field at k->off; parse returns 0 or -errno. */
struct config_type {
	int (*parse)(const struct config_key *k, void *base, const char *name, const char *value);
	void (*print)(const struct config_key *k, const void *base, FILE *f);
	bool (*same)(const struct config_key *k, const void *a, const void *b);
};

enum config_key_flags {
	CFG_RESTART = 1 << 0, /* read at start only: SIGHUP warns if it changed and keeps the running value */
	CFG_DEBUG = 1 << 1,   /* tests only: printed last, and only when one is set */
};

struct config_key {
	const char *section; /* NULL in config_job_keys[]: any [job.NAME] */
	const char *name;    /* "*": every other key of the section */
	const struct config_type *type;
	size_t off, size;         /* the field */
	size_t off2, size2;       /* a second field: an id list's count, a quota's percentage; size2 0: none */
	unsigned flags;           /* enum config_key_flags */
	uint64_t def;             /* the default of a number, bool or enum */
	const char *def_str;      /* the default of a string */
	const char *const *names; /* an enum's names, indexed by value (designated initialisers) */
	size_t nnames;
	const char *flag;     /* the command-line flag (--flag VALUE) that sets it, if any */
	const char *flag_arg; /* its VALUE in --help */
	const char *help;     /* one line */
};

/* "64M", "1G", "4096": bytes. 0 or -EINVAL / -ERANGE. */
int config_parse_size(const char *s, uint64_t *out);
/* "90", "30s", "15m", "2h", "7d": seconds. 0 or -EINVAL / -ERANGE. */
int config_parse_duration(const char *s, uint64_t *out);

/* The field at off in base (a struct config, or a struct job_config in
 * job rows). */
#define FLD(base, off) ((void *)((char *)(base) + (off)))
#define CFLD(base, off) ((const void *)((const char *)(base) + (off)))

/* An unsigned field of 1, 4 or 8 bytes: k's, and any. */
uint64_t cfg_key_uint(const struct config_key *k, const void *base);
void cfg_set_uint(void *p, size_t size, uint64_t v);

extern const struct config_type cfg_str, cfg_u32, cfg_size, cfg_duration, cfg_bool, cfg_mode, cfg_enum, cfg_quota,
	cfg_ids, cfg_opts;

#endif
