/* Who sees which job, and by which name (daemon/wire/tenancy.c): the naming
 * rules and the edges a string comparison gets wrong (a tenant whose name
 * is a prefix of another's, an empty job after the prefix, a kept name
 * that would not fit). tests/integration/test_tenants.c checks every
 * request path against it with real daemons. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "config.h"
#include "names.h"
#include "tenancy.h"

static struct config cfg;

static struct viewer as(int tenant, bool admin)
{
	return (struct viewer){ .cfg = &cfg, .tenant = tenant, .admin = admin };
}

static int setup(void **state)
{
	(void)state;
	config_defaults(&cfg);
	strcpy(cfg.tenants[0].name, "team");
	strcpy(cfg.tenants[1].name, "team-a");
	cfg.ntenants = 2;
	return 0;
}

static void test_a_tenant_sees_its_own_jobs_by_their_own_names(void **state)
{
	(void)state;
	struct viewer t = as(0, false), ta = as(1, false);
	assert_true(tenancy_sees(&t, "team/llama"));
	assert_string_equal(tenancy_shown(&t, "team/llama"), "llama");
	/* "team" is a prefix of "team-a": still not its job. */
	assert_false(tenancy_sees(&t, "team-a/llama"));
	assert_null(tenancy_shown(&t, "team-a/llama"));
	assert_false(tenancy_sees(&ta, "team/llama"));
	/* Not a job outside tenants, nor a bare prefix. */
	assert_false(tenancy_sees(&t, "llama"));
	assert_false(tenancy_sees(&t, "team"));
	assert_false(tenancy_sees(&t, "team/"));
}

static void test_an_admin_sees_every_job_by_its_kept_name(void **state)
{
	(void)state;
	struct viewer a = as(-1, true);
	assert_string_equal(tenancy_shown(&a, "team-a/llama"), "team-a/llama");
	assert_string_equal(tenancy_shown(&a, "llama"), "llama");
	/* No tenant and no admin where tenants exist: server.c lets no such
	 * session in, and it would see nothing. */
	struct viewer nobody = as(-1, false);
	assert_false(tenancy_sees(&nobody, "llama"));
	/* Without tenants every session sees every job. */
	size_t n = cfg.ntenants;
	cfg.ntenants = 0;
	assert_true(tenancy_sees(&nobody, "llama"));
	cfg.ntenants = n;
}

static void test_kept_names(void **state)
{
	(void)state;
	char out[JOB_BUF], err[512];
	struct viewer t = as(1, false), a = as(-1, true);
	assert_int_equal(tenancy_kept(&t, "llama", out, sizeof(out), err, sizeof(err)), 0);
	assert_string_equal(out, "team-a/llama");
	/* A tenant cannot name another's job, nor its own with the prefix. */
	assert_int_equal(tenancy_kept(&t, "team/llama", out, sizeof(out), err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "a tenant's session names its jobs without 'TENANT/'"));
	assert_int_equal(tenancy_kept(&t, "../llama", out, sizeof(out), err, sizeof(err)), -EINVAL);
	/* An admin names TENANT/NAME of a configured tenant, or NAME. */
	assert_int_equal(tenancy_kept(&a, "team/llama", out, sizeof(out), err, sizeof(err)), 0);
	assert_string_equal(out, "team/llama");
	assert_int_equal(tenancy_kept(&a, "llama", out, sizeof(out), err, sizeof(err)), 0);
	assert_string_equal(out, "llama");
	assert_int_equal(tenancy_kept(&a, "team-z/llama", out, sizeof(out), err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "'team-z' is none"));
	/* A name that fits alone but not with the prefix is refused, never cut. */
	char longname[JOB_MAX_LEN + 1];
	memset(longname, 'x', JOB_MAX_LEN - 3);
	longname[JOB_MAX_LEN - 3] = '\0';
	assert_int_equal(tenancy_kept(&t, longname, out, sizeof(out), err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "too long with the tenant's prefix 'team-a/'"));
}

static void test_unshown_is_the_inverse_and_never_cuts(void **state)
{
	(void)state;
	char out[JOB_BUF];
	struct viewer t = as(1, false), a = as(-1, true);
	assert_int_equal(tenancy_unshown(&t, "llama", out, sizeof(out)), 0);
	assert_string_equal(out, "team-a/llama");
	assert_string_equal(tenancy_shown(&t, out), "llama");
	assert_int_equal(tenancy_unshown(&a, "team/llama", out, sizeof(out)), 0);
	assert_string_equal(out, "team/llama");
	char small[10];
	assert_int_equal(tenancy_unshown(&t, "llama", small, sizeof(small)), -ENAMETOOLONG);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_a_tenant_sees_its_own_jobs_by_their_own_names, setup),
		cmocka_unit_test_setup(test_an_admin_sees_every_job_by_its_kept_name, setup),
		cmocka_unit_test_setup(test_kept_names, setup),
		cmocka_unit_test_setup(test_unshown_is_the_inverse_and_never_cuts, setup),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
