/* Operations: --check-config, sd_notify (READY, STATUS, WATCHDOG,
 * STOPPING) on a NOTIFY_SOCKET the test owns, socket activation through
 * LISTEN_FDS, metrics over HTTP and ckptctl, SIGTERM drain, the drain
 * deadline, and SIGHUP reload. */
#include "ckpt_version.h"
#ifdef CKPT_HAVE_CUDA
#define CUDA_EXPECTED "\",cuda=\"yes\""
#else
#define CUDA_EXPECTED "\",cuda=\"no\""
#endif
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "harness.h"

#include <json-c/json.h>

static void test_check_config(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	char conf[400], cmd[1200], out[8192];
	snprintf(conf, sizeof(conf), "%s/good.conf", d.dir);
	FILE *f = fopen(conf, "w");
	assert_non_null(f);
	fprintf(f, "[storage]\nurl = file:///tmp/x\n[pool]\nstaging_bytes = 128M\n[job.big]\nquota = 25%%\n");
	fclose(f);
	snprintf(cmd, sizeof(cmd), "'%s' --check-config --config '%s' --set pool.policy=skip --log-level debug",
		 getenv("CKPTD_BIN"), conf);
	assert_int_equal(h_run(cmd, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "staging_bytes = 134217728"));
	assert_non_null(strstr(out, "policy = skip"));
	assert_non_null(strstr(out, "[job.big]"));
	assert_non_null(strstr(out, "quota = 25%"));
	assert_non_null(strstr(out, "level = debug"));
	/* An unknown key: exit 2, the message names file, line and key. */
	snprintf(conf, sizeof(conf), "%s/bad.conf", d.dir);
	f = fopen(conf, "w");
	fprintf(f, "[storage]\nurl = file:///tmp/x\n\n[pool]\nstagin_bytes = 1G\n");
	fclose(f);
	snprintf(cmd, sizeof(cmd), "'%s' --check-config --config '%s' 2>&1", getenv("CKPTD_BIN"), conf);
	assert_int_equal(h_run(cmd, out, sizeof(out)), 2);
	assert_non_null(strstr(out, "bad.conf:5"));
	assert_non_null(strstr(out, "stagin_bytes"));
	/* A bad value, and a bad --set. */
	f = fopen(conf, "w");
	fprintf(f, "[storage]\nurl = file:///tmp/x\n[pool]\npolicy = maybe\n");
	fclose(f);
	assert_int_equal(h_run(cmd, out, sizeof(out)), 2);
	assert_non_null(strstr(out, "bad.conf:4"));
	snprintf(cmd, sizeof(cmd), "'%s' --check-config --storage file:///x --set pool.copy_threads=lots 2>&1",
		 getenv("CKPTD_BIN"));
	assert_int_equal(h_run(cmd, out, sizeof(out)), 2);
	assert_non_null(strstr(out, "copy_threads"));
	/* The storage URL as a start would take it: scheme, bucket, every
	 * option of the URL and of [storage], without a connection. */
	static const struct {
		const char *storage, *says;
	} bad[] = {
		{ "ftp://x", "unsupported scheme" },
		{ "s3://Bad_Bucket/p", "bad bucket name" },
		{ "s3://bucket/p?endpiont=http://127.0.0.1:1", "endpiont: unknown option" },
		{ "gs://bucket/p?part_size=1k", "part_size must be 5M..5G" },
		{ "file://relative", "want file:///absolute/path" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		snprintf(cmd, sizeof(cmd), "'%s' --check-config --config /dev/null --storage '%s' 2>&1",
			 getenv("CKPTD_BIN"), bad[i].storage);
		assert_int_equal(h_run(cmd, out, sizeof(out)), 2);
		if (strstr(out, bad[i].says) == NULL)
			fail_msg("--storage %s: %s", bad[i].storage, out);
	}
	f = fopen(conf, "w");
	fprintf(f, "[storage]\nurl = s3://bucket/p\nendpiont = http://127.0.0.1:1\n");
	fclose(f);
	snprintf(cmd, sizeof(cmd), "'%s' --check-config --config '%s' 2>&1", getenv("CKPTD_BIN"), conf);
	assert_int_equal(h_run(cmd, out, sizeof(out)), 2);
	assert_non_null(strstr(out, "endpiont"));
	/* A good object-store URL passes without reaching any endpoint. */
	snprintf(cmd, sizeof(cmd),
		 "'%s' --check-config --config /dev/null --storage "
		 "'s3://bucket/p?endpoint=http://127.0.0.1:1&region=us-east-1' 2>&1",
		 getenv("CKPTD_BIN"));
	assert_int_equal(h_run(cmd, out, sizeof(out)), 0);
	h_cleanup(&d);
}

/* A datagram socket playing systemd's notify socket. */
static int notify_socket(const char *path)
{
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	return fd;
}

/* Collect notify messages for up to ms until one contains want. */
static bool await_notify(int fd, const char *want, int ms, char *all, size_t alllen)
{
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		clock_gettime(CLOCK_MONOTONIC, &t1);
		int left = ms - (int)((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000);
		if (left <= 0)
			return false;
		struct pollfd p = { .fd = fd, .events = POLLIN };
		if (poll(&p, 1, left) <= 0)
			return false;
		char buf[4096];
		ssize_t n = recv(fd, buf, sizeof(buf) - 1, 0);
		if (n <= 0)
			continue;
		buf[n] = '\0';
		size_t l = strlen(all);
		snprintf(all + l, alllen - l, "%s\n", buf);
		if (strstr(buf, want))
			return true;
	}
}

static void test_sd_notify_and_watchdog(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	char path[400], env_notify[450];
	snprintf(path, sizeof(path), "%s/notify.sock", d.dir);
	int nfd = notify_socket(path);
	snprintf(env_notify, sizeof(env_notify), "NOTIFY_SOCKET=%s", path);
	d.env[0] = env_notify;
	d.env[1] = "WATCHDOG_USEC=400000";
	d.env[2] = "WATCHDOG_PID=self";
	h_start(&d, NULL);
	static char all[1 << 16];
	all[0] = '\0';
	assert_true(await_notify(nfd, "READY=1", 10000, all, sizeof(all)));
	assert_non_null(strstr(all, "STATUS="));
	assert_non_null(strstr(all, "sessions"));
	/* WatchdogSec 400 ms: a ping every 200 ms. */
	int pings = 0;
	for (int i = 0; i < 3; i++)
		if (await_notify(nfd, "WATCHDOG=1", 2000, all, sizeof(all)))
			pings++;
	assert_int_equal(pings, 3);
	kill(d.pid, SIGTERM);
	assert_true(await_notify(nfd, "STOPPING=1", 10000, all, sizeof(all)));
	int st;
	assert_int_equal(waitpid(d.pid, &st, 0), d.pid);
	d.pid = -1;
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	close(nfd);
	h_cleanup(&d);
}

static void test_socket_activation(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	d.listen_fd = listen_unix(d.sock);
	h_start(&d, NULL);
	close(d.listen_fd);
	h_assert_serves(&d);
	/* The daemon did not bind it, so it leaves the socket file in
	 * place on exit (systemd owns it). */
	assert_int_equal(h_stop(&d), 0);
	struct stat st;
	assert_int_equal(stat(d.sock, &st), 0);
	assert_true(S_ISSOCK(st.st_mode));
	h_cleanup(&d);
}

static int metrics_port(struct dctx *d)
{
	char path[400], line[512];
	snprintf(path, sizeof(path), "%s/ckptd.log", d->dir);
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	int port = -1;
	while (fgets(line, sizeof(line), f)) {
		char *p = strstr(line, "metrics on http://127.0.0.1:");
		if (p)
			port = atoi(p + strlen("metrics on http://127.0.0.1:"));
	}
	fclose(f);
	return port;
}

static void http_get(int port, const char *path, char *out, size_t outlen)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	char req[256];
	int n = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: localhost\r\n\r\n", path);
	assert_int_equal(raw_send_bytes(fd, req, (size_t)n), 0);
	size_t got = 0;
	for (;;) {
		ssize_t k = recv(fd, out + got, outlen - 1 - got, 0);
		if (k <= 0)
			break;
		got += (size_t)k;
	}
	out[got] = '\0';
	close(fd);
}

/* Value of the first sample line that starts with name (labels included). */
static double sample(const char *text, const char *name)
{
	for (const char *p = text; (p = strstr(p, name)) != NULL; p++) {
		if (p != text && p[-1] != '\n')
			continue;
		const char *sp = strchr(p, ' ');
		if (sp && (size_t)(sp - p) == strlen(name))
			return strtod(sp + 1, NULL);
	}
	return -1;
}

static void test_metrics(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	h_start(&d, "[metrics]\nlisten = 127.0.0.1:0\n");
	int port = metrics_port(&d);
	assert_true(port > 0);
	/* One save of 1 MiB and one restore. */
	ckpt_hello h = { .job = "m", .rank = 0, .world_size = 1 };
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(d.sock, &h, &c), 0);
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_buffer_alloc(c, 1 << 20, &b), 0);
	uint64_t shape[1] = { 1 << 20 };
	ckpt_tensor t = {
		.name = "w", .dtype = CKPT_U8, .ndim = 1, .global_shape = shape, .buffer = b, .nbytes = 1 << 20
	};
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_save(c, 1, &t, 1, NULL, 0, &f), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 30000), 0);
	ckpt_future_free(f);
	assert_int_equal(ckpt_load(c, 1, &t, 1, &f), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_LOADED, 30000), 0);
	ckpt_future_free(f);
	static char out[1 << 16];
	http_get(port, "/metrics", out, sizeof(out));
	assert_non_null(strstr(out, "HTTP/1.0 200 OK"));
	assert_non_null(strstr(out, "text/plain; version=0.0.4"));
	char *body = strstr(out, "\r\n\r\n");
	assert_non_null(body);
	/* Every sample line is "name{labels} value" with a HELP and TYPE. */
	int samples = 0;
	for (char *line = strtok(body + 4, "\n"); line; line = strtok(NULL, "\n")) {
		if (line[0] == '#') {
			assert_true(strncmp(line, "# HELP ckptd_", 13) == 0 || strncmp(line, "# TYPE ckptd_", 13) == 0);
			continue;
		}
		assert_true(strncmp(line, "ckptd_", 6) == 0);
		char *sp = strrchr(line, ' ');
		assert_non_null(sp);
		char *end;
		strtod(sp + 1, &end);
		assert_true(*end == '\0');
		samples++;
		line[strlen(line)] = '\n'; /* keep the text whole for sample() */
	}
	assert_true(samples > 30);
	http_get(port, "/metrics", out, sizeof(out));
	body = strstr(out, "\r\n\r\n") + 4;
	assert_true(sample(body, "ckptd_bytes_staged_total") == (double)(1 << 20));
	assert_true(sample(body, "ckptd_bytes_uploaded_total{backend=\"file\"}") == (double)(1 << 20));
	assert_true(sample(body, "ckptd_restores_total{source=\"memory\"}") == 1);
	assert_true(sample(body, "ckptd_save_stall_seconds_count") == 1);
	/* Requests by message (msgtab.c): this session's, and none refused. */
	assert_true(sample(body, "ckptd_requests_total{msg=\"hello\"}") == 1);
	assert_true(sample(body, "ckptd_requests_total{msg=\"register_buffer\"}") == 1);
	assert_true(sample(body, "ckptd_requests_total{msg=\"save\"}") == 1);
	assert_true(sample(body, "ckptd_requests_total{msg=\"load\"}") == 1);
	assert_true(sample(body, "ckptd_requests_total{msg=\"resolve\"}") == 0);
	assert_true(sample(body, "ckptd_save_durable_seconds_bucket{le=\"+Inf\"}") == 1);
	assert_true(sample(body, "ckptd_pool_held_bytes") == (double)(1 << 20));
	/* What runs: version, commit, and CUDA compiled in as the build says. */
	char info[256];
	snprintf(info, sizeof(info), "ckptd_build_info{version=\"%s\",commit=\"", CKPT_VERSION);
	const char *bi = strstr(body, info);
	assert_non_null(bi);
	assert_non_null(strstr(bi, CUDA_EXPECTED "} 1\n"));
	/* Histogram buckets never decrease. */
	double prev = -1;
	for (const char *p = body; (p = strstr(p, "ckptd_save_stall_seconds_bucket{")) != NULL; p++) {
		double v = strtod(strchr(p, ' ') + 1, NULL);
		assert_true(v >= prev);
		prev = v;
	}
	/* Anything but /metrics, /healthz and /readyz is a 404. */
	http_get(port, "/", out, sizeof(out));
	assert_non_null(strstr(out, "404"));
	/* Alive, and ready: the pool is mapped and storage answers. */
	http_get(port, "/healthz", out, sizeof(out));
	assert_non_null(strstr(out, "HTTP/1.0 200 OK"));
	assert_non_null(strstr(out, "\r\n\r\nok\n"));
	http_get(port, "/readyz", out, sizeof(out));
	assert_non_null(strstr(out, "HTTP/1.0 200 OK"));
	assert_non_null(strstr(out, "\r\n\r\nready\n"));
	/* Storage that cannot answer (its root is now a file): not ready, with
	 * the reason, once the last probe's result is older than 2 s; alive
	 * still. Ready again when storage is back. */
	char moved[400];
	snprintf(moved, sizeof(moved), "%s.moved", d.store);
	assert_int_equal(rename(d.store, moved), 0);
	FILE *blocker = fopen(d.store, "w");
	assert_non_null(blocker);
	fclose(blocker);
	/* The first ask after 2 s starts a probe and gets the last result at
	 * once; the probe's own result follows. */
	bool down = false;
	for (int i = 0; i < 100 && !down; i++) {
		usleep(100 * 1000);
		http_get(port, "/readyz", out, sizeof(out));
		down = strstr(out, "HTTP/1.0 503 Service Unavailable") != NULL;
	}
	assert_true(down);
	assert_non_null(strstr(out, "not ready: storage"));
	http_get(port, "/healthz", out, sizeof(out));
	assert_non_null(strstr(out, "HTTP/1.0 200 OK"));
	assert_int_equal(unlink(d.store), 0);
	assert_int_equal(rename(moved, d.store), 0);
	bool up = false;
	for (int i = 0; i < 100 && !up; i++) {
		usleep(100 * 1000);
		http_get(port, "/readyz", out, sizeof(out));
		up = strstr(out, "HTTP/1.0 200 OK") != NULL;
	}
	assert_true(up);
	/* ckptctl metrics prints the same exposition. */
	char text[1 << 14];
	char *m = NULL;
	assert_int_equal(ckpt_metrics(c, &m), 0);
	snprintf(text, sizeof(text), "%s", m);
	free(m);
	assert_true(sample(text, "ckptd_bytes_staged_total") == (double)(1 << 20));
	ckpt_buffer_free(b);
	ckpt_close(c);
	h_cleanup(&d);
}

static void test_sigterm_drains(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	h_start(&d, "[debug]\nstore_delay_ms = 3000\n");
	ckpt_hello h = { .job = "dr", .rank = 0, .world_size = 1 };
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(d.sock, &h, &c), 0);
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_buffer_alloc(c, 8 << 20, &b), 0);
	uint64_t shape[1] = { 8 << 20 };
	ckpt_tensor t = {
		.name = "w", .dtype = CKPT_U8, .ndim = 1, .global_shape = shape, .buffer = b, .nbytes = 8 << 20
	};
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_save(c, 1, &t, 1, NULL, 0, &f), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_STAGED, 30000), 0);
	kill(d.pid, SIGTERM);
	/* New connections are refused while draining ... */
	usleep(100 * 1000);
	ckpt_client *c2 = NULL;
	assert_true(ckpt_connect(d.sock, NULL, &c2) < 0);
	/* ... and so are new saves, loads and catalogue requests of a session
	 * already open, each in the form its client waits for. */
	ckpt_step_info *steps = NULL;
	size_t nsteps = 0;
	assert_int_equal(ckpt_list(c, NULL, &steps, &nsteps), -ESHUTDOWN);
	assert_non_null(strstr(ckpt_errmsg(), "ckptd is shutting down"));
	ckpt_future *lf = NULL;
	assert_int_equal(ckpt_load(c, 1, &t, 1, &lf), 0);
	assert_int_equal(ckpt_future_wait(lf, CKPT_LOADED, 30000), -ESHUTDOWN);
	assert_non_null(strstr(ckpt_future_message(lf), "ckptd is shutting down"));
	ckpt_future_free(lf);
	ckpt_future *sf = NULL;
	assert_int_equal(ckpt_save(c, 2, &t, 1, NULL, 0, &sf), 0);
	assert_int_equal(ckpt_future_wait(sf, CKPT_STAGED, 30000), -ESHUTDOWN);
	assert_non_null(strstr(ckpt_future_message(sf), "admits no new saves"));
	ckpt_future_free(sf);
	/* Status still answers. */
	ckpt_status_info si;
	assert_int_equal(ckpt_status(c, &si), 0);
	assert_true(si.inflight_saves >= 1);
	/* ... but the staged save still becomes durable, then ckptd exits 0. */
	assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 30000), 0);
	int st;
	assert_int_equal(waitpid(d.pid, &st, 0), d.pid);
	d.pid = -1;
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	ckpt_future_free(f);
	ckpt_buffer_free(b);
	ckpt_close(c);
	h_cleanup(&d);
}

/* [server] idle_exit_ms: a daemon started on demand exits 0 once nothing
 * is connected and nothing in flight, not while a session is open, and
 * not while a save whose trainer went away is still uploading: that save
 * becomes durable first. */
static void test_idle_exit(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	h_start(&d, "[debug]\nstore_delay_ms = 1500\n[server]\nidle_exit_ms = 300\n");
	ckpt_hello h = { .job = "idle", .rank = 0, .world_size = 1 };
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(d.sock, &h, &c), 0);
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_buffer_alloc(c, 8 << 20, &b), 0);
	uint64_t shape[1] = { 8 << 20 };
	ckpt_tensor t = {
		.name = "w", .dtype = CKPT_U8, .ndim = 1, .global_shape = shape, .buffer = b, .nbytes = 8 << 20
	};
	h_fill(ckpt_buffer_data(b), 8 << 20, 7);
	/* A session open and silent: no exit. */
	usleep(800 * 1000);
	int st;
	assert_int_equal(waitpid(d.pid, &st, WNOHANG), 0);
	/* The trainer saves and goes at once: the upload (1.5 s) keeps the
	 * daemon, and the step becomes durable before it exits. */
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_save(c, 1, &t, 1, NULL, 0, &f), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_STAGED, 30000), 0);
	ckpt_future_free(f);
	ckpt_buffer_free(b);
	ckpt_close(c);
	usleep(700 * 1000);
	assert_int_equal(waitpid(d.pid, &st, WNOHANG), 0);
	assert_int_equal(waitpid(d.pid, &st, 0), d.pid);
	d.pid = -1;
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	char dir[600], path[700];
	snprintf(dir, sizeof(dir), "%s/idle/step-000000000001", d.store);
	h_rank_object(dir, 0, 1, "manifest", path, sizeof(path)); /* fails unless exactly one */
	h_cleanup(&d);
}

static void test_drain_deadline(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	h_start(&d, "[debug]\nstore_delay_ms = 5000\n[server]\ndrain_timeout_ms = 300\n");
	ckpt_hello h = { .job = "dl", .rank = 0, .world_size = 1 };
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(d.sock, &h, &c), 0);
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_buffer_alloc(c, 8 << 20, &b), 0);
	uint64_t shape[1] = { 8 << 20 };
	ckpt_tensor t = {
		.name = "w", .dtype = CKPT_U8, .ndim = 1, .global_shape = shape, .buffer = b, .nbytes = 8 << 20
	};
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_save(c, 1, &t, 1, NULL, 0, &f), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_STAGED, 30000), 0);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	kill(d.pid, SIGTERM);
	int st;
	assert_int_equal(waitpid(d.pid, &st, 0), d.pid);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	d.pid = -1;
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	assert_true(t1.tv_sec - t0.tv_sec < 4); /* did not wait for the 5 s upload */
	/* Never claimed durable. */
	assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 30000), -ECONNRESET);
	ckpt_future_free(f);
	ckpt_buffer_free(b);
	ckpt_close(c);
	/* The next start cleans up and says what was lost. */
	h_start(&d, NULL);
	ckpt_client *cc = NULL;
	assert_int_equal(ckpt_connect(d.sock, NULL, &cc), 0);
	ckpt_status_info s;
	assert_int_equal(ckpt_status(cc, &s), 0);
	bool lost = false, cleaned = false;
	for (uint32_t i = 0; i < s.nrecovered; i++) {
		if (strstr(s.recovered[i], "dl step 1 rank 0 was not durable at shutdown"))
			lost = true;
		if (strstr(s.recovered[i], "temporary file"))
			cleaned = true;
	}
	assert_true(lost);
	assert_true(cleaned);
	ckpt_close(cc);
	h_cleanup(&d);
}

/* [log] format = json: every line ckptd writes is one JSON object with
 * time, level and msg; a save's lines carry its job, rank and step. */
static void test_json_logs(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	d.no_log_flag = true;
	h_start(&d, "[log]\nformat = json\nlevel = debug\n");
	ckpt_hello h = { .job = "jsonlog", .rank = 0, .world_size = 1 };
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(d.sock, &h, &c), 0);
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_buffer_alloc(c, 1 << 20, &b), 0);
	uint64_t shape[1] = { 1 << 20 };
	ckpt_tensor t = {
		.name = "w", .dtype = CKPT_U8, .ndim = 1, .global_shape = shape, .buffer = b, .nbytes = 1 << 20
	};
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_save(c, 5, &t, 1, NULL, 0, &f), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 30000), 0);
	ckpt_future_free(f);
	ckpt_buffer_free(b);
	ckpt_close(c);
	assert_int_equal(h_stop(&d), 0);
	char logp[400];
	snprintf(logp, sizeof(logp), "%s/ckptd.log", d.dir);
	FILE *lf = fopen(logp, "r");
	assert_non_null(lf);
	static char line[8192];
	int lines = 0, with_step = 0;
	while (fgets(line, sizeof(line), lf)) {
		struct json_object *o = json_tokener_parse(line);
		if (o == NULL)
			fail_msg("not a JSON line: %s", line);
		struct json_object *v;
		assert_true(json_object_object_get_ex(o, "time", &v));
		assert_true(json_object_object_get_ex(o, "level", &v));
		assert_true(json_object_object_get_ex(o, "msg", &v));
		if (json_object_object_get_ex(o, "step", &v) && json_object_get_int64(v) == 5) {
			assert_true(json_object_object_get_ex(o, "job", &v));
			assert_string_equal(json_object_get_string(v), "jsonlog");
			with_step++;
		}
		json_object_put(o);
		lines++;
	}
	fclose(lf);
	assert_true(lines > 3);
	assert_true(with_step > 0);
	h_cleanup(&d);
}

/* docs/operations.md "Exit status": a socket another ckptd listens on, or
 * a state dir another ckptd uses, is a runtime error, exit 1, naming it;
 * the first daemon goes on serving. */
static void test_socket_in_use_exits_1(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	h_start(&d, NULL);
	char cmd[2048], out[4096];
	snprintf(cmd, sizeof(cmd),
		 "'%s' --config /dev/null --socket '%s' --storage 'file://%s' --state-dir '%s/state2' "
		 "--staging-bytes 16M --chunk-bytes 4M 2>&1",
		 getenv("CKPTD_BIN"), d.sock, d.store, d.dir);
	assert_int_equal(h_run(cmd, out, sizeof(out)), 1);
	if (strstr(out, d.sock) == NULL || strstr(out, "another ckptd is listening on") == NULL)
		fail_msg("second ckptd on %s said: %s", d.sock, out);
	/* Nor may one share its state dir: its journal recovery would abort
	 * the first's uploads. */
	snprintf(cmd, sizeof(cmd),
		 "timeout 30 '%s' --config /dev/null --socket '%s/other.sock' --state-dir '%s/state' "
		 "--storage 'file://%s/other' --staging-bytes 16M --chunk-bytes 1M 2>&1",
		 getenv("CKPTD_BIN"), d.dir, d.dir, d.dir);
	assert_int_equal(h_run(cmd, out, sizeof(out)), 1);
	assert_non_null(strstr(out, "another ckptd is using it"));
	h_assert_serves(&d);
	h_cleanup(&d);
}

/* [limits] max_inflight_loads: a session's load beyond it is refused with
 * EBUSY (LoadFailed, naming the key) while the first is still in flight
 * (its manifest fetch takes 1.5 s), and the first completes. */
static void test_inflight_loads_cap(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	h_start(&d, "[limits]\nmax_inflight_loads = 1\n[debug]\nmanifest_delay_ms = 1500\n");
	ckpt_hello h = { .job = "lcap", .rank = 0, .world_size = 1 };
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(d.sock, &h, &c), 0);
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_buffer_alloc(c, 1 << 20, &b), 0);
	uint64_t shape[1] = { 1 << 20 };
	ckpt_tensor t = {
		.name = "w", .dtype = CKPT_U8, .ndim = 1, .global_shape = shape, .buffer = b, .nbytes = 1 << 20
	};
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_save(c, 1, &t, 1, NULL, 0, &f), 0);
	assert_int_equal(ckpt_future_wait(f, CKPT_DURABLE, 30000), 0);
	ckpt_future_free(f);
	ckpt_future *f1 = NULL, *f2 = NULL;
	assert_int_equal(ckpt_load(c, 1, &t, 1, &f1), 0);
	assert_int_equal(ckpt_load(c, 1, &t, 1, &f2), 0);
	assert_int_equal(ckpt_future_wait(f2, CKPT_LOADED, 30000), -EBUSY);
	assert_non_null(strstr(ckpt_future_message(f2), "max_inflight_loads"));
	assert_int_equal(ckpt_future_wait(f1, CKPT_LOADED, 30000), 0);
	ckpt_future_free(f1);
	ckpt_future_free(f2);
	/* The slot is free again. */
	assert_int_equal(ckpt_load(c, 1, &t, 1, &f1), 0);
	assert_int_equal(ckpt_future_wait(f1, CKPT_LOADED, 30000), 0);
	ckpt_future_free(f1);
	ckpt_buffer_free(b);
	ckpt_close(c);
	h_cleanup(&d);
}

/* docs/operations.md "Lifecycle": a save still waiting for pool space when SIGTERM
 * comes fails with ESHUTDOWN (it was never admitted), and a second signal
 * exits 1 at once, without waiting for the upload still running. */
static void test_drain_fails_waiting_saves_second_signal_exits_1(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	/* The harness's pool is 64 MiB: one 40 MiB save fills it, so a second
	 * one waits (block policy) while the first uploads (10 s). */
	h_start(&d, "[debug]\nstore_delay_ms = 10000\n[pool]\npolicy = block\nadmit_timeout_ms = 60000\n");
	ckpt_hello h = { .job = "drw", .rank = 0, .world_size = 1 };
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(d.sock, &h, &c), 0);
	ckpt_buffer *b = NULL;
	size_t n = 40u << 20;
	assert_int_equal(ckpt_buffer_alloc(c, n, &b), 0);
	uint64_t shape[1] = { n };
	ckpt_tensor t = { .name = "w", .dtype = CKPT_U8, .ndim = 1, .global_shape = shape, .buffer = b, .nbytes = n };
	ckpt_future *f1 = NULL, *f2 = NULL;
	assert_int_equal(ckpt_save(c, 1, &t, 1, NULL, 0, &f1), 0);
	assert_int_equal(ckpt_future_wait(f1, CKPT_STAGED, 30000), 0);
	assert_int_equal(ckpt_save(c, 2, &t, 1, NULL, 0, &f2), 0);
	ckpt_status_info si;
	bool waiting = false;
	for (int i = 0; i < 100 && !waiting; i++) {
		assert_int_equal(ckpt_status(c, &si), 0);
		waiting = si.waiting_saves >= 1;
		if (!waiting)
			usleep(20 * 1000);
	}
	assert_true(waiting);
	kill(d.pid, SIGTERM);
	assert_int_equal(ckpt_future_wait(f2, CKPT_STAGED, 30000), -ESHUTDOWN);
	assert_non_null(strstr(ckpt_future_message(f2), "not admitted"));
	kill(d.pid, SIGTERM); /* the second: at once, the upload still running */
	int st = 0;
	assert_int_equal(waitpid(d.pid, &st, 0), d.pid);
	d.pid = -1;
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 1);
	ckpt_future_free(f1);
	ckpt_future_free(f2);
	ckpt_buffer_free(b);
	ckpt_close(c);
	h_cleanup(&d);
}

static void test_sighup_reload(void **state)
{
	(void)state;
	struct dctx d;
	h_init(&d);
	d.no_log_flag = true;
	h_start(&d, NULL);
	/* h_start wrote ckptd.conf: add retention and debug logging. */
	char conf[400], logp[400];
	snprintf(conf, sizeof(conf), "%s/ckptd.conf", d.dir);
	snprintf(logp, sizeof(logp), "%s/ckptd.log", d.dir);
	FILE *f = fopen(conf, "a");
	assert_non_null(f);
	fprintf(f, "[job.hup]\nkeep_last = 1\n[log]\nlevel = debug\n");
	fclose(f);
	kill(d.pid, SIGHUP);
	char out[1 << 15];
	bool reloaded = false;
	for (int i = 0; i < 100 && !reloaded; i++) {
		usleep(50 * 1000);
		FILE *lf = fopen(logp, "r");
		size_t n = fread(out, 1, sizeof(out) - 1, lf);
		out[n] = '\0';
		fclose(lf);
		reloaded = strstr(out, "SIGHUP: configuration reloaded") != NULL;
	}
	assert_true(reloaded);
	/* Debug logging is on now, and retention for job "hup" is keep_last 1. */
	ckpt_hello h = { .job = "hup", .rank = 0, .world_size = 1 };
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(d.sock, &h, &c), 0);
	ckpt_buffer *b = NULL;
	assert_int_equal(ckpt_buffer_alloc(c, 4096, &b), 0);
	uint64_t shape[1] = { 4096 };
	ckpt_tensor t = { .name = "w", .dtype = CKPT_U8, .ndim = 1, .global_shape = shape, .buffer = b, .nbytes = 4096 };
	for (uint64_t s = 1; s <= 3; s++) {
		ckpt_future *fu = NULL;
		assert_int_equal(ckpt_save(c, s, &t, 1, NULL, 0, &fu), 0);
		assert_int_equal(ckpt_future_wait(fu, CKPT_DURABLE, 30000), 0);
		ckpt_future_free(fu);
	}
	size_t n = 0;
	for (int i = 0; i < 100; i++) {
		ckpt_step_info *v = NULL;
		assert_int_equal(ckpt_list(c, "hup", &v, &n), 0);
		free(v);
		if (n == 1)
			break;
		usleep(50 * 1000);
	}
	assert_int_equal(n, 1);
	{
		FILE *lf = fopen(logp, "r");
		size_t k = fread(out, 1, sizeof(out) - 1, lf);
		out[k] = '\0';
		fclose(lf);
		assert_non_null(strstr(out, "(hup step 3 rank 0): new -> staging"));
	}
	/* A broken file is refused and the old settings stay. */
	f = fopen(conf, "a");
	fprintf(f, "[pool]\nnonsense = 1\n");
	fclose(f);
	kill(d.pid, SIGHUP);
	bool refused = false;
	for (int i = 0; i < 100 && !refused; i++) {
		usleep(50 * 1000);
		FILE *lf = fopen(logp, "r");
		size_t k = fread(out, 1, sizeof(out) - 1, lf);
		out[k] = '\0';
		fclose(lf);
		refused = strstr(out, "SIGHUP: config not reloaded") != NULL;
	}
	assert_true(refused);
	h_assert_serves(&d);
	ckpt_buffer_free(b);
	ckpt_close(c);
	h_cleanup(&d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_check_config),
		cmocka_unit_test(test_sd_notify_and_watchdog),
		cmocka_unit_test(test_socket_activation),
		cmocka_unit_test(test_metrics),
		cmocka_unit_test(test_sigterm_drains),
		cmocka_unit_test(test_drain_deadline),
		cmocka_unit_test(test_idle_exit),
		cmocka_unit_test(test_sighup_reload),
		cmocka_unit_test(test_json_logs),
		cmocka_unit_test(test_socket_in_use_exits_1),
		cmocka_unit_test(test_inflight_loads_cap),
		cmocka_unit_test(test_drain_fails_waiting_saves_second_signal_exits_1),
	};
	return cmocka_run_group_tests_name("ops", tests, NULL, NULL);
}
