/* The storage probe (probe.h): what the store does, asked of it through
 * the same store operations a save and a restore use, under a prefix of
 * its own. Requests on S3: 4 create-only PUTs (the refused one read back
 * once, as a lost answer would be), 1 ranged GET, the listing of 3 names
 * a page at a time (3 LISTs), 3 removals (HEAD + DELETE): 15 per start of
 * a daemon, none per save; at 512 nodes, 512 disjoint prefixes. */
#include "probe.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/uio.h>
#include <unistd.h>

#define NAMES 3
static const char *const names[NAMES] = { "a", "b", "c" };

struct run {
	struct store *s;
	unsigned failed;  /* PROBE_* */
	bool made[NAMES]; /* names[k] written: removed at the end (and only those: */
	char dir[256];    /* a store that cannot be asked is not asked again) */
	char *report;
	size_t len, used;
};

static void say(struct run *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(struct run *p, const char *fmt, ...)
{
	if (p->used + 1 >= p->len)
		return;
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(p->report + p->used, p->len - p->used, fmt, ap);
	va_end(ap);
	if (n > 0)
		p->used += (size_t)n < p->len - p->used ? (size_t)n : p->len - p->used - 1;
}

static void key_of(const struct run *p, const char *name, char *out, size_t len)
{
	snprintf(out, len, "%s/%s", p->dir, name);
}

static int create(struct run *p, size_t k, const char *body)
{
	char key[320];
	key_of(p, names[k], key, sizeof(key));
	struct iovec iov = { (void *)body, strlen(body) };
	int r = p->s->ops->create(p->s, key, &iov, 1, NULL);
	p->made[k] |= r == 0;
	return r;
}

/* A storage error, said once. */
static int unreachable(struct run *p, const char *what, int r)
{
	say(p, "%s: %s", what, store_error(r));
	return r == -EPROTO ? -EIO : r;
}

static int check_create_only(struct run *p, const char *first)
{
	int r = create(p, 0, "ckptd storage probe: the second body");
	if (r == -EEXIST) {
		say(p, "create-only PUT of an existing object refused; ");
		return 0;
	}
	if (r < 0)
		return unreachable(p, "a create-only PUT of an existing object", r);
	/* Accepted: did it replace the object, or only say so? */
	char got[64] = "";
	char key[320];
	key_of(p, "a", key, sizeof(key));
	size_t n = strlen(first);
	int g = p->s->ops->get_range(p->s, key, 0, got, n);
	say(p,
	    "FAILED: the store accepted a create-only write (If-None-Match: *, or x-goog-if-generation-match: 0) of "
	    "an object that exists, and %s. ckptd's guarantees need it refused: without it a complete step can be "
	    "overwritten by a later save of the same step, and two writers of a step's commit can both win, so "
	    "ranks may restore different steps. Use a store that honours conditional writes, or start with "
	    "[storage] allow_unconditional = true to accept that loss; ",
	    g == 0 && memcmp(got, first, n) == 0 ? "left the old bytes (it only said it wrote)" : "replaced it");
	p->failed |= PROBE_CREATE_ONLY;
	return -EPROTO;
}

/* Object name holds body (created once: not "a", which the create-only
 * check may have replaced). */
static int check_range(struct run *p, const char *name, const char *body)
{
	char key[320], got[16];
	key_of(p, name, key, sizeof(key));
	int r = p->s->ops->get_range(p->s, key, 7, got, 8);
	if (r < 0 && strstr(store_error(r), "instead of 206")) {
		say(p, "FAILED: %s: the store ignored a byte range; restores read the ranges of shards they need; ",
		    store_error(r));
		p->failed |= PROBE_RANGE;
		return -EPROTO;
	}
	if (r < 0)
		return unreachable(p, "a ranged GET", r);
	if (memcmp(got, body + 7, 8) != 0) {
		say(p, "FAILED: a ranged GET of bytes 7-14 gave other bytes; restores read the ranges of shards they "
		       "need; ");
		p->failed |= PROBE_RANGE;
		return -EPROTO;
	}
	say(p, "ranged GET gave its bytes; ");
	return 0;
}

static int check_listing(struct run *p)
{
	struct store_entry *v = NULL;
	size_t n = 0;
	unsigned saved = p->s->list_page;
	p->s->list_page = 1;
	int r = p->s->ops->list_entries(p->s, p->dir, &v, &n);
	p->s->list_page = saved;
	if (r < 0)
		return unreachable(p, "a listing, one name a page", r);
	bool seen[NAMES] = { false };
	for (size_t i = 0; i < n; i++)
		for (size_t k = 0; k < NAMES; k++)
			seen[k] |= strcmp(v[i].name, names[k]) == 0;
	store_entries_free(v, n);
	for (size_t k = 0; k < NAMES; k++)
		if (!seen[k]) {
			say(p,
			    "FAILED: a listing of %d names a page at a time gave %zu names, without '%s': the store "
			    "does "
			    "not page its listings; latest, retention and gc would miss steps past the first page",
			    NAMES, n, names[k]);
			p->failed |= PROBE_LISTING;
			return -EPROTO;
		}
	say(p, "a listing one name a page gave all %d names", NAMES);
	return 0;
}

int store_probe(struct store *s, unsigned *failed, char *report, size_t len)
{
	struct run p = { .s = s, .report = report, .len = len };
	report[0] = '\0';
	uint64_t rnd = 0;
	if (getrandom(&rnd, sizeof(rnd), 0) != sizeof(rnd))
		rnd ^= (uint64_t)getpid() << 32;
	char host[64] = "host";
	(void)gethostname(host, sizeof(host) - 1);
	host[strcspn(host, "/")] = '\0';
	snprintf(p.dir, sizeof(p.dir), ".ckptd-probe/%.60s-%ld-%016" PRIx64, host, (long)getpid(), rnd);
	const char *first = "ckptd storage probe: the first body", *other = "ckptd storage probe: another one";
	/* Each check runs, whatever the one before found (a store that
	 * fails several is told so once), but for a store it cannot ask. */
	int r = create(&p, 0, first);
	if (r < 0)
		r = unreachable(&p, "a create-only PUT", r);
	if (r == 0)
		r = check_create_only(&p, first);
	for (size_t k = 1; k < NAMES && (r == 0 || r == -EPROTO); k++) {
		int c = create(&p, k, other);
		if (c < 0)
			r = unreachable(&p, "a create-only PUT", c);
	}
	if (r == 0 || r == -EPROTO) {
		int c = check_range(&p, "b", other);
		r = c == 0 ? r : c;
	}
	if (r == 0 || r == -EPROTO) {
		int c = check_listing(&p);
		r = c == 0 ? r : c;
	}
	*failed = p.failed;
	/* What it wrote goes, whatever happened. */
	bool any = false;
	for (size_t k = 0; k < NAMES; k++) {
		char key[320];
		key_of(&p, names[k], key, sizeof(key));
		if (p.made[k])
			(void)s->ops->remove(s, key);
		any |= p.made[k];
	}
	if (any) {
		(void)s->ops->remove_dir(s, p.dir);
		(void)s->ops->remove_dir(s, ".ckptd-probe");
	}
	return r;
}
