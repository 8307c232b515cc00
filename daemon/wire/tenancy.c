/* docs/security.md "Tenants": see tenancy.h. */
#include "tenancy.h"
#include "catalog.h"
#include "config.h"
#include "daemon.h"
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

int tenancy_jobs(struct daemon *d, const struct viewer *who, char ***out, size_t *nout)
{
	struct store *st = d->store;
	const struct config *c = who->cfg;
	if (who->tenant >= 0) {
		struct store *ts = d->tenant_store[who->tenant] ? d->tenant_store[who->tenant] : st;
		int e = catalog_jobs(ts, c->tenants[who->tenant].name, out, nout);
		if (e == -ENOENT) { /* a tenant that saved nothing yet */
			*out = NULL;
			*nout = 0;
			return 0;
		}
		return e;
	}
	char **top = NULL;
	size_t n = 0;
	int r = catalog_jobs(st, NULL, &top, &n);
	if (r == -ENOENT) /* nothing saved yet (an object store's empty prefix) */
		r = 0, top = NULL, n = 0;
	if (r < 0 || c->ntenants == 0) {
		*out = top;
		*nout = n;
		return r;
	}
	if (!who->admin) { /* no tenant, no admin: server.c lets no such session in */
		store_names_free(top, n);
		*out = NULL;
		*nout = 0;
		return 0;
	}
	char **v = NULL;
	size_t k = 0, cap = 0;
	for (size_t i = 0; i < n && r == 0; i++) {
		bool is_tenant = false;
		for (size_t t = 0; t < c->ntenants; t++)
			is_tenant |= strcmp(top[i], c->tenants[t].name) == 0 && d->tenant_store[t] == NULL;
		char **sub = NULL, *one[1] = { top[i] };
		size_t ns = 1;
		if (is_tenant) {
			r = catalog_jobs(st, top[i], &sub, &ns);
			if (r == -ENOENT || r == -ENOTDIR)
				r = 0, ns = 0;
			if (r < 0)
				break;
		}
		if (k + ns > cap) {
			size_t nc = (k + ns) * 2 + 8;
			char **nv = realloc(v, nc * sizeof(*v));
			if (nv == NULL) {
				r = -ENOMEM;
				store_names_free(sub, is_tenant ? ns : 0);
				break;
			}
			v = nv;
			cap = nc;
		}
		for (size_t j = 0; j < ns; j++)
			v[k++] = is_tenant ? sub[j] : one[j];
		if (is_tenant) {
			free(sub);
			free(top[i]);
		}
		top[i] = NULL;
	}
	store_names_free(top, n); /* what was not moved */
	/* Tenants with storage of their own: one LIST each, there. */
	for (size_t t = 0; r == 0 && t < c->ntenants; t++) {
		struct store *ts = d->tenant_store[t];
		char **sub = NULL;
		size_t ns = 0;
		if (ts == NULL)
			continue;
		r = catalog_jobs(ts, c->tenants[t].name, &sub, &ns);
		if (r == -ENOENT || r == -ENOTDIR) {
			r = 0;
			continue;
		}
		char **nv = r == 0 ? realloc(v, (k + ns + 1) * sizeof(*v)) : NULL;
		if (r == 0 && nv == NULL)
			r = -ENOMEM;
		if (r < 0) {
			store_names_free(sub, ns);
			break;
		}
		v = nv;
		for (size_t j = 0; j < ns; j++)
			v[k++] = sub[j];
		free(sub);
	}
	if (r < 0) {
		store_names_free(v, k);
		return r;
	}
	*out = v;
	*nout = k;
	return 0;
}
