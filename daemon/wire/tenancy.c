/* docs/security.md "Tenants": see tenancy.h. */
#include "tenancy.h"
#include "catalog.h"
#include "config.h"
#include "daemon.h"
#include "grow.h"
#include "manifest.h"
#include "names.h"
#include "store.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What a job name may be, for every refusal of one: a client that only
 * hears "invalid" cannot tell which character, or the name, is at fault. */
#define JOB_RULE "1-%d characters of [A-Za-z0-9._-], not starting with '.' and without '..'"

int tenancy_kept(const struct viewer *v, const char *name, char *out, size_t outlen, char *err, size_t errlen)
{
	const struct config *c = v->cfg;
	const char *tenant = v->tenant >= 0 ? c->tenants[v->tenant].name : NULL;
	const char *slash = strchr(name, '/');
	if (slash == NULL || tenant) {
		if (!manifest_name_valid(name, JOB_MAX_LEN)) {
			snprintf(err, errlen, "job name '%.64s' must be " JOB_RULE "%s", name, JOB_MAX_LEN,
				 tenant && slash ? " (a tenant's session names its jobs without 'TENANT/')" : "");
			return -EINVAL;
		}
		int n = tenant ? snprintf(out, outlen, "%s/%s", tenant, name) : snprintf(out, outlen, "%s", name);
		if (n < 0 || (size_t)n >= outlen || (size_t)n > JOB_MAX_LEN) {
			snprintf(err, errlen, "job name '%.64s' is too long with the tenant's prefix '%s/' (%d in all)",
				 name, tenant ? tenant : "", JOB_MAX_LEN);
			return -EINVAL;
		}
		return 0;
	}
	/* TENANT/NAME: an admin's (or, without tenants, nobody's). */
	bool known = false;
	for (size_t i = 0; i < c->ntenants; i++)
		known |= strlen(c->tenants[i].name) == (size_t)(slash - name) &&
			 strncmp(c->tenants[i].name, name, (size_t)(slash - name)) == 0;
	if (c->ntenants == 0) {
		snprintf(err, errlen,
			 "job name '%.64s' must be " JOB_RULE
			 " (TENANT/NAME only for an admin, of a configured tenant; this ckptd has no tenants)",
			 name, JOB_MAX_LEN);
		return -EINVAL;
	}
	if (!known) {
		snprintf(err, errlen,
			 "job name '%.64s' must be NAME, " JOB_RULE
			 ", or TENANT/NAME of a configured tenant ('%.*s' is none)",
			 name, JOB_MAX_LEN, (int)(slash - name < 33 ? slash - name : 33), name);
		return -EINVAL;
	}
	if (!manifest_job_valid(name) || strlen(name) >= outlen) {
		snprintf(err, errlen,
			 "job name '%.64s' must be TENANT/NAME, at most %d characters in all, with NAME " JOB_RULE,
			 name, JOB_MAX_LEN, JOB_MAX_LEN);
		return -EINVAL;
	}
	snprintf(out, outlen, "%s", name);
	return 0;
}

/* The length of v's prefix ("TENANT/"), 0 for a view without one. */
static size_t prefix_len(const struct viewer *v)
{
	return v->tenant >= 0 ? strlen(v->cfg->tenants[v->tenant].name) + 1 : 0;
}

bool tenancy_sees(const struct viewer *v, const char *kept)
{
	if (v->tenant < 0) /* an admin, or no tenants at all (server.c lets no one else in) */
		return v->admin || v->cfg->ntenants == 0;
	size_t p = prefix_len(v);
	return strncmp(kept, v->cfg->tenants[v->tenant].name, p - 1) == 0 && kept[p - 1] == '/' && kept[p] != '\0';
}

const char *tenancy_shown(const struct viewer *v, const char *kept)
{
	return tenancy_sees(v, kept) ? kept + prefix_len(v) : NULL;
}

int tenancy_unshown(const struct viewer *v, const char *shown, char *out, size_t outlen)
{
	int n = v->tenant >= 0 ? snprintf(out, outlen, "%s/%s", v->cfg->tenants[v->tenant].name, shown)
			       : snprintf(out, outlen, "%s", shown);
	return n < 0 || (size_t)n >= outlen ? -ENAMETOOLONG : 0;
}

/* A growing list of names (malloc'd, owned). */
struct names {
	char **v;
	size_t n, cap;
};

/* Move the ns names of sub (a store_names list, freed) to the end of l. */
static int names_take(struct names *l, char **sub, size_t ns)
{
	if (GROW(l->v, l->cap, l->n + ns, 16) < 0) {
		store_names_free(sub, ns);
		return -ENOMEM;
	}
	if (ns)
		memcpy(l->v + l->n, sub, ns * sizeof(*sub));
	l->n += ns;
	free(sub);
	return 0;
}

/* The kept names of tenant t's jobs in st (none when it saved nothing),
 * moved to l: one LIST. */
static int take_tenant_jobs(struct store *st, const char *tenant, struct names *l)
{
	char **sub = NULL;
	size_t ns = 0;
	int r = catalog_jobs(st, tenant, &sub, &ns);
	if (r == -ENOENT || r == -ENOTDIR)
		return 0;
	return r < 0 ? r : names_take(l, sub, ns);
}

/* The tenant whose jobs live under top-level name in the main store, or -1. */
static int tenant_dir(const struct daemon *d, const char *name)
{
	for (size_t t = 0; t < d->cfg.ntenants; t++)
		if (strcmp(name, d->cfg.tenants[t].name) == 0 && d->tenant_store[t] == NULL)
			return (int)t;
	return -1;
}

/* An admin's view: the top level of the main store (top, n: consumed) with
 * each tenant's name replaced by its jobs, then the jobs of the tenants
 * with storage of their own. One LIST per tenant. */
static int admin_jobs(struct daemon *d, char **top, size_t n, struct names *l)
{
	int r = 0;
	for (size_t i = 0; i < n && r == 0; i++) {
		int t = tenant_dir(d, top[i]);
		if (t >= 0) {
			r = take_tenant_jobs(d->store, top[i], l);
		} else {
			char **one = malloc(sizeof(*one));
			if (one == NULL) {
				r = -ENOMEM;
				break;
			}
			one[0] = top[i];
			top[i] = NULL;
			r = names_take(l, one, 1);
		}
	}
	store_names_free(top, n); /* what was not moved */
	for (size_t t = 0; r == 0 && t < d->cfg.ntenants; t++)
		if (d->tenant_store[t])
			r = take_tenant_jobs(d->tenant_store[t], d->cfg.tenants[t].name, l);
	return r;
}

int tenancy_jobs(struct daemon *d, const struct viewer *who, char ***out, size_t *nout)
{
	struct names l = { 0 };
	*out = NULL;
	*nout = 0;
	int r;
	if (who->tenant >= 0) {
		struct store *ts = d->tenant_store[who->tenant] ? d->tenant_store[who->tenant] : d->store;
		r = take_tenant_jobs(ts, who->cfg->tenants[who->tenant].name, &l);
	} else {
		char **top = NULL;
		size_t n = 0;
		r = catalog_jobs(d->store, NULL, &top, &n);
		if (r == -ENOENT) /* nothing saved yet (an object store's empty prefix) */
			r = 0, top = NULL, n = 0;
		if (r < 0)
			return r;
		if (who->cfg->ntenants == 0)
			r = names_take(&l, top, n);
		else if (who->admin)
			r = admin_jobs(d, top, n, &l);
		else /* no tenant, no admin: server.c lets no such session in */
			store_names_free(top, n);
	}
	if (r < 0) {
		store_names_free(l.v, l.n);
		return r;
	}
	*out = l.v;
	*nout = l.n;
	return 0;
}
