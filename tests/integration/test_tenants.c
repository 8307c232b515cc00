/* Issue "Security": tenants. Two tenants by uid on the main socket (team-a
 * is uid 2001, team-b uid 2002) and two by socket, as on Kubernetes where
 * pods share uid 0 (team-c and team-d each have a socket of their own).
 * Every tenant saves a job named "llama"; each sees, loads, verifies and
 * removes only its own, gets "not found" for the others', cannot name them,
 * and gc touches only its own. The admin (root on the main socket) sees
 * all four, named TENANT/llama; a uid that is no tenant is refused.
 *
 * Each path is checked against decoys that a path skipping the one place
 * that decides visibility (daemon/wire/tenancy.c) would find: the admin's
 * own job "llama" outside every tenant, with durable steps 1, 3, 4 and 7
 * (every other tenant's step number) and a memory-only step 77, and an
 * admin job "old" with an incomplete step that retention would remove
 * (its grace is over, and a complete step follows it).
 * Every tenant's ls, load, show, verify, resolve, wait, rm, held,
 * persist, status, metrics and gc must miss them all. Needs
 * root to become the two uids; without it the test says so and exits 77
 * (skipped), never passed. Clients run in forked children; each check that
 * fails prints what it saw. */
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "harness.h"

static struct dctx D;
static char sock_c[400], sock_d[400], sock_e[400], sock_f[400], sock_g[400], fstore[400];
static int failures;

#define CHECK(cond, ...) \
	do { \
		if (!(cond)) { \
			fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
			fprintf(stderr, __VA_ARGS__); \
			fprintf(stderr, "\n"); \
			failures++; \
		} \
	} while (0)

/* Save step of job as rank of world ranks, tier tier (CKPT_TIER_*), with
 * every byte = v; 0 or the error. */
static int save_as(const char *sock, const char *job, uint64_t step, int v, uint32_t rank, uint32_t world, int tier)
{
	ckpt_hello h = { .job = job, .rank = rank, .world_size = world, .attempt_id = "t" };
	ckpt_client *c = NULL;
	int r = ckpt_connect(sock, &h, &c);
	if (r < 0)
		return r;
	ckpt_buffer *b = NULL;
	if ((r = ckpt_buffer_alloc(c, 4096, &b)) == 0) {
		memset(ckpt_buffer_data(b), v, 4096);
		uint64_t shape[1] = { 4096 };
		ckpt_tensor t = {
			.name = "w", .dtype = CKPT_U8, .ndim = 1, .global_shape = shape, .buffer = b, .nbytes = 4096
		};
		ckpt_future *f = NULL;
		ckpt_save_opts o = { .tier = tier };
		if ((r = ckpt_save_ex(c, step, &t, 1, NULL, 0, &o, &f)) == 0) {
			r = ckpt_future_wait(f, tier == CKPT_TIER_DURABLE ? CKPT_DURABLE : CKPT_STAGED, 60000);
			ckpt_future_free(f);
		}
		ckpt_buffer_free(b);
	}
	ckpt_close(c);
	return r;
}

static int save(const char *sock, const char *job, uint64_t step, int v)
{
	return save_as(sock, job, step, v, 0, 1, CKPT_TIER_DURABLE);
}

/* Load step (CKPT_LATEST: the latest) of job: its step number and first
 * byte. */
static int load_step(const char *sock, const char *job, int64_t want, uint64_t *step, int *v)
{
	ckpt_hello h = { .job = job, .rank = 0, .world_size = 1, .attempt_id = "t" };
	ckpt_client *c = NULL;
	int r = ckpt_connect(sock, &h, &c);
	if (r < 0)
		return r;
	ckpt_buffer *b = NULL;
	if ((r = ckpt_buffer_alloc(c, 4096, &b)) == 0) {
		uint64_t shape[1] = { 4096 };
		ckpt_tensor t = {
			.name = "w", .dtype = CKPT_U8, .ndim = 1, .global_shape = shape, .buffer = b, .nbytes = 4096
		};
		ckpt_future *f = NULL;
		if ((r = ckpt_load(c, want, &t, 1, &f)) == 0) {
			r = ckpt_future_wait(f, CKPT_LOADED, 60000);
			*step = ckpt_future_step(f);
			*v = ((unsigned char *)ckpt_buffer_data(b))[0];
			ckpt_future_free(f);
		}
		ckpt_buffer_free(b);
	}
	ckpt_close(c);
	return r;
}

static int load_latest(const char *sock, const char *job, uint64_t *step, int *v)
{
	return load_step(sock, job, CKPT_LATEST, step, v);
}

static int cmp_info(const void *a, const void *b)
{
	const ckpt_step_info *x = a, *y = b;
	int c = strcmp(x->job, y->job);
	return c ? c : (x->step > y->step) - (x->step < y->step);
}

/* "job:step,job:step" of what a control session on sock lists, sorted. */
static int list(const char *sock, const char *job, char *out, size_t cap)
{
	ckpt_client *c = NULL;
	int r = ckpt_connect(sock, NULL, &c);
	if (r < 0)
		return r;
	ckpt_step_info *v = NULL;
	size_t n = 0;
	out[0] = '\0';
	if ((r = ckpt_list(c, job, &v, &n)) == 0) {
		if (n)
			qsort(v, n, sizeof(*v), cmp_info); /* by job, then step */
		for (size_t i = 0; i < n; i++)
			snprintf(out + strlen(out), cap - strlen(out), "%s%s:%" PRIu64, i ? "," : "", v[i].job,
				 v[i].step);
	}
	free(v);
	ckpt_close(c);
	return r;
}

/* One tenant's view: it sees its own llama (steps mine), loads it, and
 * every operation on the others' steps (theirs) fails as "not found". */
static void tenant_checks(const char *who, const char *sock, const char *mine, uint64_t latest, int v, uint64_t theirs)
{
	char got[1024];
	CHECK(list(sock, NULL, got, sizeof(got)) == 0 && strcmp(got, mine) == 0, "%s: ls of every job: '%s', want '%s'",
	      who, got, mine);
	CHECK(list(sock, "llama", got, sizeof(got)) == 0 && strcmp(got, mine) == 0, "%s: ls llama: '%s', want '%s'",
	      who, got, mine);
	uint64_t step = 0;
	int b = -1;
	int r = load_latest(sock, "llama", &step, &b);
	CHECK(r == 0 && step == latest && b == v,
	      "%s: load latest: %d, step %" PRIu64 " byte %d; want step %" PRIu64 " byte %d", who, r, step, b, latest,
	      v);
	ckpt_client *c = NULL;
	CHECK(ckpt_connect(sock, NULL, &c) == 0, "%s: control session: %s", who, ckpt_errmsg());
	if (c == NULL)
		return;
	ckpt_step_detail *det = NULL;
	r = ckpt_show(c, "llama", theirs, &det);
	CHECK(r == -ENOENT, "%s: show of another tenant's step %" PRIu64 ": %d (%s), want ENOENT", who, theirs, r,
	      ckpt_errmsg());
	if (det)
		ckpt_step_detail_free(det);
	ckpt_verify_result *vr = NULL;
	r = ckpt_verify(c, "llama", theirs, &vr);
	CHECK(r == -ENOENT, "%s: verify of another tenant's step: %d (%s), want ENOENT", who, r, ckpt_errmsg());
	if (vr)
		ckpt_verify_result_free(vr);
	r = ckpt_delete(c, "llama", theirs);
	CHECK(r == -ENOENT, "%s: rm of another tenant's step: %d (%s), want ENOENT", who, r, ckpt_errmsg());
	ckpt_step_info si;
	r = ckpt_resolve(c, "llama", (int64_t)theirs, &si);
	CHECK(r == -ENOENT, "%s: resolve of another tenant's step: %d, want ENOENT", who, r);
	/* Waiting for another tenant's (or the admin's) complete step: it
	 * is not this tenant's, so it never completes. */
	r = ckpt_wait_complete(c, "llama", theirs, 0, &si);
	CHECK(r == -ETIMEDOUT && strstr(ckpt_errmsg(), "no manifest in storage yet"),
	      "%s: wait for another tenant's step %" PRIu64 ": %d (%s), want ETIMEDOUT", who, theirs, r, ckpt_errmsg());
	/* Naming another tenant's job outright is not a name at all; the
	 * refusal says how a tenant names its jobs. */
	r = ckpt_list(c, "team-a/llama", &(ckpt_step_info *){ NULL }, &(size_t){ 0 });
	CHECK(r == -EINVAL && strstr(ckpt_errmsg(), "job name 'team-a/llama' must be 1-128 characters of") &&
		      strstr(ckpt_errmsg(), "a tenant's session names its jobs without 'TENANT/'"),
	      "%s: ls team-a/llama: %d (%s), want EINVAL naming the rule", who, r, ckpt_errmsg());
	/* Load of another's step, from storage or from memory. */
	r = load_step(sock, "llama", (int64_t)theirs, &step, &b);
	CHECK(r == -ENOENT, "%s: load of another tenant's step %" PRIu64 ": %d, byte %d, want ENOENT", who, theirs, r,
	      b);
	r = load_step(sock, "llama", 77, &step, &b);
	CHECK(r == -ENOENT, "%s: load of the admin's memory-only step 77: %d, byte %d, want ENOENT", who, r, b);
	/* The memory tier: held, show, persist of a memory-only step. */
	ckpt_held_info *hv = NULL;
	size_t hn = 0;
	r = ckpt_held(c, "llama", 1, &hv, &hn);
	CHECK(r == 0, "%s: held: %d (%s)", who, r, ckpt_errmsg());
	for (size_t i = 0; r == 0 && i < hn; i++)
		CHECK(strcmp(hv[i].job, "llama") == 0 && hv[i].step != 77 && hv[i].step != theirs,
		      "%s: held lists %s step %" PRIu64 ", not its own", who, hv[i].job, hv[i].step);
	free(hv);
	det = NULL;
	r = ckpt_show(c, "llama", 77, &det);
	CHECK(r == -ENOENT, "%s: show of the admin's memory-only step 77: %d (%s), want ENOENT", who, r, ckpt_errmsg());
	if (det)
		ckpt_step_detail_free(det);
	ckpt_future *pf = NULL;
	r = ckpt_persist(c, "llama", 77, &pf);
	if (r == 0) {
		r = ckpt_future_wait(pf, CKPT_DURABLE, 60000);
		ckpt_future_free(pf);
	}
	CHECK(r == -ENOENT, "%s: persist of the admin's memory-only step 77: %d (%s), want ENOENT", who, r,
	      ckpt_errmsg());
	/* Status and metrics: its own row and copies only. */
	static ckpt_status_info st;
	r = ckpt_status(c, &st);
	CHECK(r == 0 && st.ntenants == 1, "%s: status: %d, %u tenant rows", who, r, st.ntenants);
	for (uint32_t i = 0; r == 0 && i < st.nheld; i++)
		CHECK(strcmp(st.held[i].job, "llama") == 0 && st.held[i].step != 77 && st.held[i].step != theirs,
		      "%s: status shows the held copy %s step %" PRIu64, who, st.held[i].job, st.held[i].step);
	char *text = NULL;
	r = ckpt_metrics(c, &text);
	CHECK(r == 0 && text, "%s: metrics: %d (%s)", who, r, ckpt_errmsg());
	for (const char *at = text; at && (at = strstr(at, "{tenant=\"")) != NULL; at++)
		CHECK(strncmp(at + 9, who, 6) == 0 && at[15] == '"', "%s: metrics show %.24s", who, at);
	free(text);
	/* gc of every job it sees, for real: the admin's incomplete step of
	 * "old", due for removal, is not among them. */
	ckpt_gc_entry *gv = NULL;
	size_t gn = 0;
	r = ckpt_gc(c, NULL, 0, &gv, &gn);
	CHECK(r == 0, "%s: gc: %d (%s)", who, r, ckpt_errmsg());
	for (size_t i = 0; r == 0 && i < gn; i++)
		CHECK(0, "%s: gc removed %s step %" PRIu64, who, gv[i].info.job, gv[i].info.step);
	free(gv);
	ckpt_close(c);
	ckpt_hello h = { .job = "team-a/llama", .rank = 0, .world_size = 1 };
	CHECK(ckpt_connect(sock, &h, &c) == -EINVAL, "%s: Hello as team-a/llama was not refused", who);
}

/* Run fn as uid in a child; its failures count here. */
static void as_uid(uid_t uid, void (*fn)(void))
{
	fflush(stderr);
	pid_t pid = fork();
	if (pid == 0) {
		if (setgroups(0, NULL) != 0 || setgid(uid) != 0 || setuid(uid) != 0)
			_exit(100);
		failures = 0;
		fn();
		_exit(failures ? 1 : 0);
	}
	int st = 0;
	if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) == 100) {
		fprintf(stderr, "FAIL: could not run a client as uid %u\n", (unsigned)uid);
		failures++;
		return;
	}
	failures += WEXITSTATUS(st) != 0;
}

static void a_saves(void)
{
	CHECK(save(D.sock, "llama", 1, 0xa1) == 0, "team-a: save 1: %s", ckpt_errmsg());
	CHECK(save(D.sock, "llama", 2, 0xa2) == 0, "team-a: save 2: %s", ckpt_errmsg());
}

static void b_saves(void)
{
	CHECK(save(D.sock, "llama", 7, 0xb7) == 0, "team-b: save 7: %s", ckpt_errmsg());
}

static void a_checks(void)
{
	tenant_checks("team-a", D.sock, "llama:1,llama:2", 2, 0xa2, 7);
}

static void b_checks(void)
{
	tenant_checks("team-b", D.sock, "llama:7", 7, 0xb7, 1);
}

static void nobody(void)
{
	ckpt_client *c = NULL;
	int r = ckpt_connect(D.sock, NULL, &c);
	CHECK(r == -EACCES && strstr(ckpt_errmsg(), "no tenant's"), "uid 2003: %d (%s), want EACCES", r, ckpt_errmsg());
}

static void exists(const char *rel, bool want)
{
	char p[700];
	snprintf(p, sizeof(p), "%s/%s", D.store, rel);
	struct stat st;
	CHECK((stat(p, &st) == 0) == want, "%s %s", p, want ? "is missing" : "exists");
}

int main(void)
{
	if (geteuid() != 0) {
		printf("skipped: needs root, to become the tenants' uids (running as uid %u)\n", (unsigned)geteuid());
		return 77;
	}
	h_init(&D);
	snprintf(sock_c, sizeof(sock_c), "%s/tc/ckptd.sock", D.dir);
	snprintf(sock_d, sizeof(sock_d), "%s/td/ckptd.sock", D.dir);
	snprintf(sock_e, sizeof(sock_e), "%s/te/ckptd.sock", D.dir);
	snprintf(sock_f, sizeof(sock_f), "%s/tf/ckptd.sock", D.dir);
	snprintf(sock_g, sizeof(sock_g), "%s/tg/ckptd.sock", D.dir);
	snprintf(fstore, sizeof(fstore), "%s/fstore", D.dir);
	char conf[2048];
	/* admit_timeout_ms continues the harness's [pool]: long, so that a
	 * save refused at once is told from one that waited for room. */
	snprintf(conf, sizeof(conf),
		 "admit_timeout_ms = 20000\n"
		 "[tenant.team-a]\nuids = 2001\n[tenant.team-b]\nuids = 2002\n"
		 "[tenant.team-c]\nsocket = %s\n[tenant.team-d]\nsocket = %s\nmax_registered_bytes = 8K\n"
		 "[tenant.team-e]\nsocket = %s\n[job.team-e/llama]\nquota = 1K\n[tenant.team-f]\nsocket = %s\nstorage "
		 "= file://%s\n[tenant.team-g]\nsocket = %s\nquota = 1K\n[job.old]\nincomplete_grace = 1s\n",
		 sock_c, sock_d, sock_e, sock_f, fstore, sock_g);
	h_start(&D, conf);
	chmod(D.dir, 0755);
	char rundir[400];
	snprintf(rundir, sizeof(rundir), "%s/run", D.dir);
	chmod(rundir, 0755);
	chmod(D.sock, 0666); /* the socket's mode is not what tells tenants apart */

	/* Everyone saves a job called llama. */
	as_uid(2001, a_saves);
	as_uid(2002, b_saves);
	CHECK(save(sock_c, "llama", 3, 0xc3) == 0, "team-c: save 3: %s", ckpt_errmsg());
	CHECK(save(sock_d, "llama", 4, 0xd4) == 0, "team-d: save 4: %s", ckpt_errmsg());
	/* ... each under its own prefix. */
	exists("team-a/llama/step-000000000002", true);
	exists("team-b/llama/step-000000000007", true);
	exists("team-c/llama/step-000000000003", true);
	exists("team-d/llama/step-000000000004", true);
	exists("llama", false);
	/* The decoys (top of the file), the admin's. */
	for (int i = 0; i < 4; i++) {
		uint64_t st = (uint64_t[]){ 1, 3, 4, 7 }[i];
		CHECK(save(D.sock, "llama", st, 0x50 + (int)st) == 0, "admin: save llama %" PRIu64 ": %s", st,
		      ckpt_errmsg());
	}
	CHECK(save_as(D.sock, "llama", 77, 0x77, 0, 1, CKPT_TIER_MEMORY) == 0, "admin: memory save 77: %s",
	      ckpt_errmsg());
	CHECK(save_as(D.sock, "old", 5, 0x05, 0, 2, CKPT_TIER_DURABLE) == 0, "admin: rank 0 of 2 of old 5: %s",
	      ckpt_errmsg());
	CHECK(save(D.sock, "old", 6, 0x06) == 0, "admin: old 6: %s", ckpt_errmsg());
	exists("llama/step-000000000007", true);
	exists("old/step-000000000005", true);
	sleep(3); /* old's step 5 is past its incomplete_grace, with a complete step after it: gc would remove it */

	/* Each sees only its own; the others' are missing to it. */
	as_uid(2001, a_checks);
	as_uid(2002, b_checks);
	tenant_checks("team-c (root on its socket)", sock_c, "llama:3", 3, 0xc3, 4);
	tenant_checks("team-d (root on its socket)", sock_d, "llama:4", 4, 0xd4, 3);
	as_uid(2003, nobody);
	/* No tenant's gc removed the admin's step that is due; the admin's
	 * does (so the tenants' could have). */
	exists("old/step-000000000005", true);
	ckpt_client *ac = NULL;
	ckpt_gc_entry *agv = NULL;
	size_t agn = 0;
	CHECK(ckpt_connect(D.sock, NULL, &ac) == 0 && ckpt_gc(ac, "old", 0, &agv, &agn) == 0 && agn == 1,
	      "admin: gc old: %zu removed (%s)", agn, ckpt_errmsg());
	free(agv);
	if (ac)
		ckpt_close(ac);
	/* Gone but for a removal's marker (dead.<attempt>, kept twice the
	 * window: removal.c). */
	CHECK(h_sh("ls -A '%s/old/step-000000000005' 2>/dev/null | grep -v '^dead\\.' | grep -q .", D.store) == 256,
	      "old/step-000000000005 still holds more than a removal's marker");
	/* A tenant with storage of its own: its jobs go there, and only there. */
	CHECK(save(sock_f, "llama", 5, 0xf5) == 0, "team-f: save 5: %s", ckpt_errmsg());
	char fpath[600];
	snprintf(fpath, sizeof(fpath), "%s/team-f/llama/step-000000000005", fstore);
	struct stat fst;
	CHECK(stat(fpath, &fst) == 0, "team-f: %s is missing", fpath);
	exists("team-f", false);
	tenant_checks("team-f (its own storage)", sock_f, "llama:5", 5, 0xf5, 3);
	/* A tenant that saved nothing yet lists nothing, without an error. */
	char none[64] = "x";
	CHECK(list(sock_e, NULL, none, sizeof(none)) == 0 && none[0] == '\0', "team-e: ls: '%s' (%s)", none,
	      ckpt_errmsg());
	/* A save over its job's quota fails: status shows it to team-e by
	 * its own name, to the admin by the kept one, to no other tenant. */
	CHECK(save(sock_e, "llama", 9, 0xe9) == -E2BIG, "team-e: save 9 over the quota: %s", ckpt_errmsg());
	/* The refused removals removed nothing. */
	exists("team-a/llama/step-000000000001", true);
	exists("team-b/llama/step-000000000007", true);
	exists("team-c/llama/step-000000000003", true);
	exists("team-d/llama/step-000000000004", true);

	/* A tenant's cap on registered bytes counts all its sessions. */
	ckpt_hello hd = { .job = "llama", .rank = 0, .world_size = 1 };
	ckpt_client *c1 = NULL, *c2 = NULL;
	ckpt_buffer *b1 = NULL, *b2 = NULL, *b3 = NULL;
	CHECK(ckpt_connect(sock_d, &hd, &c1) == 0 && ckpt_connect(sock_d, &hd, &c2) == 0, "team-d: connect");
	CHECK(c1 && ckpt_buffer_alloc(c1, 4096, &b1) == 0, "team-d: first 4K: %s", ckpt_errmsg());
	CHECK(c2 && ckpt_buffer_alloc(c2, 4096, &b2) == 0, "team-d: second 4K: %s", ckpt_errmsg());
	int rr = c2 ? ckpt_buffer_alloc(c2, 4096, &b3) : -1;
	CHECK(rr == -ENOBUFS && strstr(ckpt_errmsg(), "max_registered_bytes"), "team-d: third 4K: %d (%s)", rr,
	      ckpt_errmsg());
	if (c1) {
		ckpt_buffer_free(b1);
		ckpt_close(c1);
	}
	for (int i = 0; i < 100 && c2 && (rr = ckpt_buffer_alloc(c2, 4096, &b3)) != 0; i++)
		usleep(20 * 1000); /* the first session's close reaches the daemon */
	CHECK(rr == 0, "team-d: 4K after a session closed: %d (%s)", rr, ckpt_errmsg());
	if (c2) {
		ckpt_buffer_free(b3);
		ckpt_buffer_free(b2);
		ckpt_close(c2);
	}

	/* Status: a tenant sees its own row and held copies, by its own names. */
	ckpt_client *sc = NULL;
	static ckpt_status_info si;
	CHECK(ckpt_connect(sock_c, NULL, &sc) == 0 && ckpt_status(sc, &si) == 0, "team-c: status: %s", ckpt_errmsg());
	CHECK(si.ntenants == 1 && strcmp(si.tenants[0].name, "team-c") == 0, "team-c: status shows %u tenants",
	      si.ntenants);
	CHECK(si.nheld >= 1, "team-c: status shows no held copy of its own");
	for (uint32_t i = 0; i < si.nheld; i++)
		CHECK(strcmp(si.held[i].job, "llama") == 0 && si.held[i].step == 3,
		      "team-c: status shows the held copy %s step %" PRIu64, si.held[i].job, si.held[i].step);
	CHECK(si.nfailures == 0, "team-c: status shows %u failed saves, another tenant's", si.nfailures);
	if (sc)
		ckpt_close(sc);
	sc = NULL;
	CHECK(ckpt_connect(sock_e, NULL, &sc) == 0 && ckpt_status(sc, &si) == 0, "team-e: status: %s", ckpt_errmsg());
	CHECK(si.nfailures == 1 && strcmp(si.failures[0].job, "llama") == 0 && si.failures[0].step == 9 &&
		      si.failures[0].status == -E2BIG && strstr(si.failures[0].message, "quota"),
	      "team-e: status shows %u failed saves, the first '%s' step %" PRIu64 " (%s)", si.nfailures,
	      si.failures[0].job, si.failures[0].step, si.failures[0].message);
	if (sc)
		ckpt_close(sc);
	CHECK(ckpt_connect(D.sock, NULL, &sc) == 0 && ckpt_status(sc, &si) == 0, "admin: status: %s", ckpt_errmsg());
	CHECK(si.ntenants == 7, "admin: status shows %u tenants, want 7", si.ntenants);
	CHECK(si.nfailures == 1 && strcmp(si.failures[0].job, "team-e/llama") == 0,
	      "admin: status shows %u failed saves, the first '%s'", si.nfailures, si.failures[0].job);
	bool other = false;
	for (uint32_t i = 0; i < si.nheld; i++)
		other |= strncmp(si.held[i].job, "team-b/", 7) == 0;
	CHECK(other, "admin: status shows no held copy of team-b's");
	if (sc)
		ckpt_close(sc);
	CHECK(h_metric(&D, "ckptd_tenant_sessions{tenant=\"team-d\"}") == 0, "metrics: team-d's sessions");

	/* The admin sees every tenant. */
	char got[1024];
	const char *all = "llama:1,llama:3,llama:4,llama:7,llama:77,old:6,team-a/llama:1,team-a/llama:2,team-b/"
			  "llama:7,team-c/llama:3,team-d/llama:4,team-f/llama:5";
	CHECK(list(D.sock, NULL, got, sizeof(got)) == 0 && strcmp(got, all) == 0, "admin: ls: '%s', want '%s'", got,
	      all);
	CHECK(list(D.sock, "team-b/llama", got, sizeof(got)) == 0 && strcmp(got, "team-b/llama:7") == 0,
	      "admin: ls team-b/llama: '%s'", got);
	uint64_t step = 0;
	int b = -1;
	CHECK(load_latest(D.sock, "team-c/llama", &step, &b) == 0 && step == 3 && b == 0xc3,
	      "admin: load team-c/llama: step %" PRIu64 " byte %d", step, b);
	ckpt_client *c = NULL;
	CHECK(ckpt_connect(D.sock, NULL, &c) == 0, "admin: connect");
	CHECK(c && ckpt_delete(c, "team-b/llama", 7) == 0, "admin: rm team-b/llama 7: %s", ckpt_errmsg());
	/* An admin's TENANT/NAME that is not one: the refusal names the rule
	 * and, when it is the tenant, that it is not configured. */
	int r = c ? ckpt_list(c, "team-z/llama", &(ckpt_step_info *){ NULL }, &(size_t){ 0 }) : 0;
	CHECK(r == -EINVAL && strstr(ckpt_errmsg(), "job name 'team-z/llama' must be NAME, 1-128 characters of") &&
		      strstr(ckpt_errmsg(), "or TENANT/NAME of a configured tenant ('team-z' is none)"),
	      "admin: ls team-z/llama: %d (%s), want EINVAL naming the tenant", r, ckpt_errmsg());
	r = c ? ckpt_list(c, "team-a/.llama", &(ckpt_step_info *){ NULL }, &(size_t){ 0 }) : 0;
	CHECK(r == -EINVAL && strstr(ckpt_errmsg(), "job name 'team-a/.llama' must be TENANT/NAME") &&
		      strstr(ckpt_errmsg(), "not starting with '.'"),
	      "admin: ls team-a/.llama: %d (%s), want EINVAL naming the rule", r, ckpt_errmsg());
	if (c)
		ckpt_close(c);
	exists("team-b/llama/step-000000000007", false);

	/* A save bigger than its tenant's whole quota can never be admitted:
	 * it fails at once with E2BIG naming that quota, not after waiting
	 * admit_timeout_ms (20 s) for room that will never come. */
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	r = save(sock_g, "llama", 11, 0x9b);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	CHECK(r == -E2BIG && strstr(ckpt_errmsg(), "exceeds tenant 'team-g''s quota of 1024 bytes"),
	      "team-g: save of 4K over its tenant's 1K quota: %d (%s), want E2BIG naming the tenant's quota", r,
	      ckpt_errmsg());
	CHECK(secs < 5.0, "team-g: the save over its tenant's quota took %.1f s to fail (admit_timeout_ms is 20 s)",
	      secs);
	CHECK(list(sock_g, NULL, got, sizeof(got)) == 0 && got[0] == '\0', "team-g: ls after the refused save: '%s'",
	      got);
	exists("team-g", false);

	h_assert_serves(&D);
	h_cleanup(&D);
	if (failures) {
		printf("%d check(s) failed\n", failures);
		return 1;
	}
	printf("four tenants (two by uid, two by socket) each saw and touched only their own jobs; the admin saw "
	       "all\n");
	return 0;
}
