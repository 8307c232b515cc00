#include "harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt.h"

static const char *env_or(const char *name, const char *def)
{
	const char *v = getenv(name);
	return v && *v ? v : def;
}

void h_init(struct dctx *d)
{
	memset(d, 0, sizeof(*d));
	snprintf(d->dir, sizeof(d->dir), "%s/ckpt-it-XXXXXX", env_or("TMPDIR", "/tmp"));
	assert_non_null(mkdtemp(d->dir));
	snprintf(d->sock, sizeof(d->sock), "%s/run/ckptd.sock", d->dir);
	snprintf(d->store, sizeof(d->store), "%s/store", d->dir);
	d->pid = -1;
	d->listen_fd = -1;
}

void h_start(struct dctx *d, const char *extra_conf)
{
	char conf[400], logp[400], url[400], state[400];
	snprintf(conf, sizeof(conf), "%s/ckptd.conf", d->dir);
	snprintf(logp, sizeof(logp), "%s/ckptd.log", d->dir);
	snprintf(url, sizeof(url), "file://%s", d->store);
	snprintf(state, sizeof(state), "%s/state", d->dir);
	FILE *f = fopen(conf, "w");
	assert_non_null(f);
	fprintf(f, "[pool]\nadmit_timeout_ms = 5000\n%s\n", extra_conf ? extra_conf : "");
	fclose(f);
	const char *bin = env_or("CKPTD_BIN", "ckptd");
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		int lfd = open(logp, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
		if (lfd >= 0) {
			dup2(lfd, 2);
			dup2(lfd, 1);
		}
		for (int i = 0; i < 8 && d->env[i]; i++) {
			char kv[512];
			snprintf(kv, sizeof(kv), "%s", d->env[i]);
			char *eq = strchr(kv, '=');
			if (eq && strcmp(eq + 1, "self") == 0)
				snprintf(eq + 1, sizeof(kv) - (size_t)(eq + 1 - kv), "%d", (int)getpid());
			putenv(strdup(kv));
		}
		if (d->listen_fd >= 0) {
			if (d->listen_fd != 3) {
				dup2(d->listen_fd, 3);
				close(d->listen_fd);
			}
			fcntl(3, F_SETFD, 0); /* keep it across exec */
			char pid[32];
			snprintf(pid, sizeof(pid), "%d", (int)getpid());
			setenv("LISTEN_FDS", "1", 1);
			setenv("LISTEN_PID", pid, 1);
		}
		const char *lvl = env_or("CKPTD_TEST_LOG", "info");
		const char *argv[32];
		int n = 0;
		if (d->store_tmpfs) {
			static char opt[64];
			snprintf(opt, sizeof(opt), "size=%s", d->store_tmpfs);
			mkdir(d->store, 0755);
			const char *pre[] = { "unshare",
					      "-rm",
					      "sh",
					      "-c",
					      "mount -t tmpfs -o \"$1\" ckpt-test \"$2\" && shift 2 && exec \"$@\"",
					      "sh",
					      opt,
					      d->store };
			for (size_t k = 0; k < sizeof(pre) / sizeof(pre[0]); k++)
				argv[n++] = pre[k];
		}
		const char *common[] = { bin,           "--socket", d->sock,    "--storage", url,
					 "--state-dir", state,      "--config", conf };
		for (size_t k = 0; k < sizeof(common) / sizeof(common[0]); k++)
			argv[n++] = common[k];
		if (!d->default_pool) {
			argv[n++] = "--staging-bytes";
			argv[n++] = "64M";
			argv[n++] = "--chunk-bytes";
			argv[n++] = "1M";
		}
		if (!d->no_log_flag) {
			argv[n++] = "--log-level";
			argv[n++] = lvl;
		}
		argv[n] = NULL;
		execvp(argv[0], (char *const *)argv);
		_exit(127);
	}
	d->pid = pid;
	for (int i = 0; i < 600; i++) {
		int fd = raw_connect(d->sock);
		if (fd >= 0) {
			close(fd);
			return;
		}
		int st;
		if (waitpid(pid, &st, WNOHANG) == pid) {
			d->pid = -1;
			fail_msg("ckptd exited at start (status %d); see %s", st, logp);
		}
		usleep(50 * 1000);
	}
	fail_msg("ckptd did not listen on %s within 30 s", d->sock);
}

int h_stop(struct dctx *d)
{
	if (d->pid <= 0)
		return -1;
	kill(d->pid, SIGTERM);
	int st = 0;
	pid_t r;
	while ((r = waitpid(d->pid, &st, 0)) < 0 && errno == EINTR)
		;
	d->pid = -1;
	if (r < 0 || !WIFEXITED(st))
		return -1;
	return WEXITSTATUS(st);
}

void h_assert_serves(struct dctx *d)
{
	assert_true(d->pid > 0);
	assert_int_equal(kill(d->pid, 0), 0);
	int st;
	assert_int_equal(waitpid(d->pid, &st, WNOHANG), 0);
	ckpt_client *c = NULL;
	int r = ckpt_connect(d->sock, NULL, &c);
	assert_int_equal(r, 0);
	ckpt_status_info info;
	assert_int_equal(ckpt_status(c, &info), 0);
	assert_true(info.pool_bytes > 0);
	ckpt_close(c);
}

void h_cleanup(struct dctx *d)
{
	if (d->pid > 0) {
		kill(d->pid, SIGKILL);
		waitpid(d->pid, NULL, 0);
		d->pid = -1;
	}
	if (getenv("CKPT_TEST_KEEP") == NULL && d->dir[0]) {
		char cmd[600];
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d->dir);
		if (system(cmd) != 0)
			fprintf(stderr, "# could not remove %s\n", d->dir);
	}
}

int listen_unix(const char *path)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	char dir[300];
	snprintf(dir, sizeof(dir), "%s", path);
	*strrchr(dir, '/') = '\0';
	mkdir(dir, 0755);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(fd, 16), 0);
	return fd;
}

int raw_connect(const char *path)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

int raw_send_bytes(int fd, const void *buf, size_t len)
{
	const char *p = buf;
	while (len > 0) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int raw_send(int fd, Ckpt__Frame *f, uint64_t req_id, const int *fds, int nfds)
{
	f->version = CKPT_PROTOCOL_VERSION;
	f->req_id = req_id;
	size_t len = ckpt__frame__get_packed_size(f);
	uint8_t *buf = malloc(len + 4);
	assert_non_null(buf);
	buf[0] = (uint8_t)(len >> 24);
	buf[1] = (uint8_t)(len >> 16);
	buf[2] = (uint8_t)(len >> 8);
	buf[3] = (uint8_t)len;
	ckpt__frame__pack(f, buf + 4);
	struct iovec iov = { .iov_base = buf, .iov_len = len + 4 };
	char cbuf[CMSG_SPACE(sizeof(int) * 16)];
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	if (nfds > 0) {
		assert_true(nfds <= 16);
		memset(cbuf, 0, sizeof(cbuf));
		mh.msg_control = cbuf;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
		struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
		memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
	}
	ssize_t n = sendmsg(fd, &mh, MSG_NOSIGNAL);
	int r = n < 0 ? -errno : 0;
	if (r == 0 && (size_t)n < len + 4)
		r = raw_send_bytes(fd, buf + n, len + 4 - (size_t)n);
	free(buf);
	return r;
}

static int read_full(int fd, void *buf, size_t len, int timeout_ms)
{
	char *p = buf;
	while (len > 0) {
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		int pr = poll(&pfd, 1, timeout_ms);
		if (pr <= 0)
			return -ETIMEDOUT;
		ssize_t n = recv(fd, p, len, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -ECONNRESET;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

Ckpt__Frame *raw_recv(int fd, int timeout_ms, bool *eof)
{
	uint8_t hdr[4];
	if (eof)
		*eof = false;
	int r = read_full(fd, hdr, 4, timeout_ms);
	if (r < 0) {
		if (eof && (r == -ECONNRESET))
			*eof = true;
		return NULL;
	}
	uint32_t len = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
	assert_true(len < (64u << 20));
	uint8_t *body = malloc(len ? len : 1);
	assert_non_null(body);
	r = read_full(fd, body, len, timeout_ms);
	assert_int_equal(r, 0);
	Ckpt__Frame *f = ckpt__frame__unpack(NULL, len, body);
	free(body);
	assert_non_null(f);
	return f;
}

Ckpt__Frame *raw_call(int fd, Ckpt__Frame *f, uint64_t req_id, int want_case)
{
	assert_int_equal(raw_send(fd, f, req_id, NULL, 0), 0);
	Ckpt__Frame *rep = raw_recv(fd, 10000, NULL);
	assert_non_null(rep);
	assert_int_equal(rep->body_case, want_case);
	assert_int_equal(rep->req_id, req_id);
	return rep;
}

void raw_hello(int fd, const char *job, uint32_t rank, uint32_t world)
{
	Ckpt__Hello h = CKPT__HELLO__INIT;
	h.protocol_version = CKPT_PROTOCOL_VERSION;
	h.job = (char *)job;
	h.rank = rank;
	h.world_size = world;
	h.attempt_id = "raw";
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_HELLO;
	f.hello = &h;
	ckpt__frame__free_unpacked(raw_call(fd, &f, 1, CKPT__FRAME__BODY_HELLO_REPLY), NULL);
}

bool raw_wait_eof(int fd, int timeout_ms)
{
	uint8_t buf[4096];
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		if (poll(&pfd, 1, timeout_ms) <= 0)
			return false;
		ssize_t n = recv(fd, buf, sizeof(buf), 0);
		if (n == 0 || (n < 0 && errno == ECONNRESET))
			return true;
		clock_gettime(CLOCK_MONOTONIC, &t1);
		if ((t1.tv_sec - t0.tv_sec) * 1000 > timeout_ms)
			return false;
	}
}

int make_memfd(size_t n, int v)
{
	int fd = memfd_create("ckpt-test", MFD_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)n), 0);
	void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(p != MAP_FAILED);
	memset(p, v, n);
	munmap(p, n);
	return fd;
}

void h_rank_object(const char *dir, uint32_t rank, uint32_t ws, const char *ext, char *out, size_t cap)
{
	char prefix[64], suffix[32];
	snprintf(prefix, sizeof(prefix), "rank-%05u-of-%05u.", rank, ws);
	snprintf(suffix, sizeof(suffix), ".%s", ext);
	DIR *d = opendir(dir);
	if (d == NULL)
		fail_msg("opendir %s: %s", dir, strerror(errno));
	int found = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		size_t l = strlen(e->d_name), k = strlen(suffix);
		if (strncmp(e->d_name, prefix, strlen(prefix)) != 0 || l < k || strcmp(e->d_name + l - k, suffix) != 0)
			continue;
		snprintf(out, cap, "%s/%s", dir, e->d_name);
		found++;
	}
	closedir(d);
	if (found != 1)
		fail_msg("%d objects %s*%s in %s, expected one", found, prefix, suffix, dir);
}

/* One series of the daemon's metrics (the last with that name, any
 * labels); fails the test when there is none. */
uint64_t h_metric(struct dctx *d, const char *name)
{
	ckpt_hello h = { 0 };
	ckpt_client *c = NULL;
	assert_int_equal(ckpt_connect(d->sock, &h, &c), 0);
	char *text = NULL;
	assert_int_equal(ckpt_metrics(c, &text), 0);
	ckpt_close(c);
	uint64_t v = 0;
	bool found = false;
	for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
		size_t n = strlen(name);
		if (strncmp(line, name, n) == 0 && (line[n] == ' ' || line[n] == '{')) {
			v = strtoull(strrchr(line, ' ') + 1, NULL, 10);
			found = true;
		}
	}
	free(text);
	if (!found)
		fail_msg("no metric %s", name);
	return v;
}

void raw_expect_reply(int fd, int status, const char *needle, int timeout_ms)
{
	Ckpt__Frame *f = raw_recv(fd, timeout_ms, NULL);
	assert_non_null(f);
	assert_int_equal(f->body_case, CKPT__FRAME__BODY_REPLY);
	if (f->reply->status != status || (needle && strstr(f->reply->message, needle) == NULL))
		fail_msg("reply %d '%s', want %d and '%s'", f->reply->status, f->reply->message, status,
			 needle ? needle : "");
	ckpt__frame__free_unpacked(f, NULL);
}

void raw_expect_alive(int fd)
{
	Ckpt__StatusRequest sr = CKPT__STATUS_REQUEST__INIT;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_STATUS;
	f.status = &sr;
	ckpt__frame__free_unpacked(raw_call(fd, &f, 4242, CKPT__FRAME__BODY_STATUS_REPLY), NULL);
}

int raw_register_status(int fd, uint64_t id, int memfd, uint64_t nbytes, const char *needle)
{
	Ckpt__RegisterBuffer rb = CKPT__REGISTER_BUFFER__INIT;
	rb.buffer_id = id;
	rb.kind = CKPT__BUFFER_KIND__HOST_FD;
	rb.nbytes = nbytes;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_REGISTER_BUFFER;
	f.register_buffer = &rb;
	assert_int_equal(raw_send(fd, &f, id, &memfd, 1), 0);
	Ckpt__Frame *rep = raw_recv(fd, 10000, NULL);
	assert_non_null(rep);
	assert_int_equal(rep->body_case, CKPT__FRAME__BODY_REPLY);
	int st = rep->reply->status;
	if (st && needle && strstr(rep->reply->message, needle) == NULL)
		fail_msg("reply '%s' does not mention '%s'", rep->reply->message, needle);
	ckpt__frame__free_unpacked(rep, NULL);
	return st;
}

void raw_register(int fd, uint64_t id, int memfd, uint64_t nbytes)
{
	assert_int_equal(raw_register_status(fd, id, memfd, nbytes, NULL), 0);
}

void h_fill(uint8_t *p, size_t n, uint64_t seed)
{
	for (size_t i = 0; i < n; i += 8) {
		uint64_t v = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed * 0xBF58476D1CE4E5B9ull;
		memcpy(p + i, &v, n - i < 8 ? n - i : 8);
	}
}

void h_rank_open(struct dctx *d, struct h_rank *rc, const char *job, uint32_t rank, uint32_t world, size_t n,
		 const char *attempt, const char *policy, bool boxed)
{
	memset(rc, 0, sizeof(*rc));
	ckpt_hello h = { .job = job, .rank = rank, .world_size = world, .attempt_id = attempt, .policy = policy };
	int r = ckpt_connect(d->sock, &h, &rc->c);
	if (r < 0)
		fail_msg("connect: %s (%s)", ckpt_strerror(r), ckpt_errmsg());
	assert_int_equal(ckpt_buffer_alloc(rc->c, n, &rc->b), 0);
	rc->n = n;
	rc->shape[0] = boxed ? n * world : n;
	snprintf(rc->name, sizeof(rc->name), boxed ? "blob" : "blob.%u", rank);
	rc->t = (ckpt_tensor){
		.name = rc->name, .dtype = CKPT_U8, .ndim = 1, .global_shape = rc->shape, .buffer = rc->b, .nbytes = n
	};
	if (boxed) {
		rc->off[0] = (uint64_t)n * rank;
		rc->len[0] = n;
		rc->t.box_offsets = rc->off;
		rc->t.box_lengths = rc->len;
	}
}

void h_rank_close(struct h_rank *rc)
{
	ckpt_buffer_free(rc->b);
	ckpt_close(rc->c);
}

void h_save_blob(struct dctx *d, const char *job, size_t n, uint64_t seed)
{
	struct h_rank r;
	h_rank_open(d, &r, job, 0, 1, n, "a", NULL, false);
	h_fill(ckpt_buffer_data(r.b), n, seed);
	ckpt_future *f = NULL;
	assert_int_equal(ckpt_save(r.c, 1, &r.t, 1, NULL, 0, &f), 0);
	int e = ckpt_future_wait(f, CKPT_DURABLE, 60000);
	if (e != 0)
		fail_msg("save: %s: %s", ckpt_strerror(e), ckpt_future_message(f));
	ckpt_future_free(f);
	h_rank_close(&r);
}

int h_sh(const char *fmt, ...)
{
	char cmd[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	return system(cmd);
}

int h_free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sa);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
	close(fd);
	return ntohs(sa.sin_port);
}

int h_peer_certs(char *dir)
{
	if (mkdtemp(dir) == NULL)
		return -1;
	const char *ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
	return h_sh("cd '%s' && "
		    "openssl req -x509 %s -keyout ca.key -out ca.crt -days 2 -subj /CN=ckpt-test-ca 2>/dev/null && "
		    "openssl req %s -keyout node.key -out node.csr -subj /CN=ckptd-peer 2>/dev/null && "
		    "openssl x509 -req -in node.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out node.crt -days 2 "
		    "2>/dev/null",
		    dir, ec, ec) == 0
		       ? 0
		       : -1;
}

int h_run(const char *cmd, char *out, size_t outlen)
{
	FILE *p = popen(cmd, "r");
	assert_non_null(p);
	size_t n = fread(out, 1, outlen - 1, p);
	out[n] = '\0';
	int st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int h_ctl(struct dctx *d, const char *args, bool with_stderr, char *out, size_t outlen)
{
	char cmd[1200];
	snprintf(cmd, sizeof(cmd), "timeout 30 '%s' --socket '%s' %s%s", getenv("CKPTCTL_BIN"), d->sock, args,
		 with_stderr ? " 2>&1" : "");
	return h_run(cmd, out, outlen);
}

Ckpt__Manifest *h_rank_manifest(const char *dir)
{
	char path[1024];
	h_rank_object(dir, 0, 1, "manifest", path, sizeof(path));
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	static uint8_t buf[1 << 20];
	size_t n = fread(buf, 1, sizeof(buf), f);
	fclose(f);
	Ckpt__Manifest *m = ckpt__manifest__unpack(NULL, n, buf);
	assert_non_null(m);
	return m;
}

uint64_t h_rank_shard_size(const char *dir)
{
	char path[1024];
	h_rank_object(dir, 0, 1, "shard", path, sizeof(path));
	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	return (uint64_t)st.st_size;
}
