/* Who sees which job, and by which name (docs/security.md "Tenants"): the
 * one place ckptd decides it; every request path asks here.
 *
 * A job is kept as TENANT/NAME when it is a tenant's, NAME otherwise. A
 * tenant's session names its jobs NAME, is shown them as NAME, and sees
 * no other job: another tenant's cannot even be named, so every request
 * about one fails as for a job that does not exist. An admin (root or an
 * admin gid on the main socket), and every session of a ckptd without
 * tenants, names and sees every job by its kept name. */
#ifndef CKPTD_TENANCY_H
#define CKPTD_TENANCY_H

#include <stdbool.h>
#include <stddef.h>

struct config;
struct daemon;

/* A session's view, fixed at its Hello (server.c classifies it). */
struct viewer {
	const struct config *cfg;
	int tenant; /* -1: none */
	bool admin;
};

/* The kept name of the job a request names, into out: "TENANT/NAME" under
 * a tenant; an admin's "TENANT/NAME" of a configured tenant, or NAME. 0,
 * or -EINVAL with err saying which rule the name breaks (never cut). */
int tenancy_kept(const struct viewer *v, const char *name, char *out, size_t outlen, char *err, size_t errlen);
/* Whether v sees the kept job. */
bool tenancy_sees(const struct viewer *v, const char *kept);
/* The name v knows the kept job by (a suffix of kept), or NULL when v
 * does not see it. */
const char *tenancy_shown(const struct viewer *v, const char *kept);
/* The kept name of a job v was shown by ckptd (no check of the naming
 * rule: ckptd made it), into out; -ENAMETOOLONG rather than a cut name,
 * which could be another job's. */
int tenancy_unshown(const struct viewer *v, const char *shown, char *out, size_t outlen);
/* The kept names of the jobs in storage that v sees: its tenant's (one
 * LIST, in the tenant's own storage if it has one); an admin's, every
 * job outside tenants and every tenant's (one LIST per tenant). Run in
 * the threadpool. Free with store_names_free. */
int tenancy_jobs(struct daemon *d, const struct viewer *v, char ***out, size_t *nout);

#endif
