#include "server.h"
#include "wire.h"
#include "log.h"
#include "session.h"
#include "clock.h"
#include "macro.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

static bool ids_have(const unsigned *ids, size_t n, unsigned id)
{
	for (size_t i = 0; i < n; i++)
		if (ids[i] == id)
			return true;
	return false;
}

/* Who a connection on l is (docs/security.md "Tenants"): its tenant (-1: none) and
 * whether it is an admin; or -EACCES with msg saying why it is refused.
 *  - A tenant's own socket: that tenant, whoever connects (on Kubernetes
 *    the socket's directory is mounted into its pods only); if the tenant
 *    lists uids or gids, the credentials must be among them too.
 *  - The main socket without tenants: allowed_uids/allowed_gids, as ever.
 *  - The main socket with tenants: root and admin_gids are admins, who see
 *    every tenant; other credentials are the tenant that lists them. */
static int classify(const struct daemon *d, const struct listener *l, const struct ucred *cr, int *tenant, bool *admin,
		    char *msg, size_t len)
{
	const struct config *c = &d->cfg;
	*tenant = -1;
	*admin = false;
	if (l->tenant >= 0) {
		const struct tenant_config *t = &c->tenants[l->tenant];
		if ((t->nuids || t->ngids) && !ids_have(t->uids, t->nuids, cr->uid) &&
		    !ids_have(t->gids, t->ngids, cr->gid)) {
			snprintf(msg, len, "uid %u gid %u is not tenant '%s' (its uids/gids)", (unsigned)cr->uid,
				 (unsigned)cr->gid, t->name);
			return -EACCES;
		}
		*tenant = l->tenant;
		return 0;
	}
	if (c->ntenants == 0) {
		if (ids_have(c->allowed_uids, c->n_allowed_uids, cr->uid) ||
		    ids_have(c->allowed_gids, c->n_allowed_gids, cr->gid))
			return 0;
		snprintf(msg, len, "uid %u gid %u is not allowed to use ckptd (allowed_uids/allowed_gids)",
			 (unsigned)cr->uid, (unsigned)cr->gid);
		return -EACCES;
	}
	if (cr->uid == 0 || ids_have(c->admin_gids, c->n_admin_gids, cr->gid)) {
		*admin = true;
		return 0;
	}
	for (size_t i = 0; i < c->ntenants; i++) {
		const struct tenant_config *t = &c->tenants[i];
		if (ids_have(t->uids, t->nuids, cr->uid) || ids_have(t->gids, t->ngids, cr->gid)) {
			*tenant = (int)i;
			return 0;
		}
	}
	snprintf(msg, len, "uid %u gid %u is no tenant's ([tenant.*] uids/gids) and not an admin (root, admin_gids)",
		 (unsigned)cr->uid, (unsigned)cr->gid);
	return -EACCES;
}

/* Refuse with a frame the client can read, then close. */
static void refuse(int fd, int status, const char *msg)
{
	Ckpt__Reply rep = CKPT__REPLY__INIT;
	rep.status = wire_status(status);
	rep.message = (char *)msg;
	Ckpt__Frame f = CKPT__FRAME__INIT;
	f.body_case = CKPT__FRAME__BODY_REPLY;
	f.reply = &rep;
	uint8_t buf[1024];
	size_t len = frame_prepare(&f, 0);
	if (len <= sizeof(buf)) {
		frame_write(&f, len, buf);
		(void)!send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
	}
	close(fd);
}

/* Sessions of one credential now: a uid, within a tenant (on Kubernetes
 * every tenant's pods are uid 0, and one tenant must not use up the
 * others' share). */
static uint32_t sessions_of(const struct daemon *d, uid_t uid, int tenant)
{
	uint32_t n = 0;
	const struct session *s;
	TAILQ_FOREACH (s, &d->sessions, link)
		n += s->uid == uid && s->tenant == tenant;
	return n;
}

static void on_accept(uv_poll_t *h, int status, int events);
static void server_stop_listeners(struct daemon *d);

static void resume_accept(uv_timer_t *t)
{
	struct daemon *d = t->data;
	for (uint32_t i = 0; d->listening && i < d->nlisteners; i++)
		uv_poll_start(&d->listeners[i].poll, UV_READABLE, on_accept);
}

/* Out of file descriptors (EMFILE, ENFILE): the pending connection would
 * make the listening socket readable forever, and the loop would spin on
 * it. Use the spare fd to take it and tell the client why, then stop
 * accepting for a while (the backoff doubles up to a second while it
 * lasts, and starts again at 50 ms once an accept works). */
static void fd_exhausted(struct listener *l, int err)
{
	struct daemon *d = l->d;
	d->stats.refused[LIMIT_FD_EXHAUSTED]++;
	if (d->spare_fd >= 0) {
		close(d->spare_fd);
		d->spare_fd = -1;
		int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd >= 0)
			refuse(fd, -EMFILE, "ckptd is out of file descriptors (its RLIMIT_NOFILE); try again later");
		d->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	}
	d->accept_backoff_ms = d->accept_backoff_ms ? d->accept_backoff_ms * 2 : 50;
	if (d->accept_backoff_ms > 1000)
		d->accept_backoff_ms = 1000;
	log_err("server: accept: %s; %u sessions; not accepting for %u ms", strerror(err), d->nsessions,
		d->accept_backoff_ms);
	for (uint32_t i = 0; i < d->nlisteners; i++)
		uv_poll_stop(&d->listeners[i].poll);
	uv_timer_start(&d->accept_timer, resume_accept, d->accept_backoff_ms, 0);
}

static void on_accept(uv_poll_t *h, int status, int events)
{
	struct listener *l = h->data;
	struct daemon *d = l->d;
	(void)events;
	if (status < 0) {
		log_err("server: poll on listening socket: %s", uv_strerror(status));
		return;
	}
	for (int i = 0; i < 64; i++) {
		int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EMFILE || errno == ENFILE)
				fd_exhausted(l, errno);
			else if (errno != EAGAIN && errno != EWOULDBLOCK)
				log_warn("server: accept: %s", strerror(errno));
			return;
		}
		d->accept_backoff_ms = 0;
		struct ucred cr;
		socklen_t crlen = sizeof(cr);
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &crlen) != 0) {
			log_warn("server: SO_PEERCRED: %s", strerror(errno));
			close(fd);
			continue;
		}
		char msg[256];
		int tenant;
		bool admin;
		if (classify(d, l, &cr, &tenant, &admin, msg, sizeof(msg)) < 0) {
			log_warn("server: refused pid %d on %s: %s", (int)cr.pid, l->path, msg);
			refuse(fd, -EACCES, msg);
			continue;
		}
		if (d->draining) {
			refuse(fd, -ESHUTDOWN, "ckptd is shutting down");
			continue;
		}
		if (d->nsessions >= d->cfg.max_sessions) {
			d->stats.refused[LIMIT_SESSIONS]++;
			snprintf(msg, sizeof(msg), "ckptd already serves %u sessions (max_sessions)", d->nsessions);
			log_warn("server: refused pid %d: %s", (int)cr.pid, msg);
			refuse(fd, -EMFILE, msg);
			continue;
		}
		if (sessions_of(d, cr.uid, tenant) >= d->cfg.max_sessions_per_uid) {
			d->stats.refused[LIMIT_SESSIONS_PER_UID]++;
			snprintf(msg, sizeof(msg), "uid %u already has %u sessions (max_sessions_per_uid)",
				 (unsigned)cr.uid, d->cfg.max_sessions_per_uid);
			log_warn("server: refused pid %d: %s", (int)cr.pid, msg);
			refuse(fd, -EMFILE, msg);
			continue;
		}
		int r = session_start(d, fd, cr.pid, cr.uid, cr.gid, tenant, admin);
		if (r < 0)
			log_err("server: cannot start a session: %s", strerror(-r));
	}
}

static int mkdir_parent(const char *path)
{
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
	snprintf(dir, sizeof(dir), "%s", path);
	char *slash = strrchr(dir, '/');
	if (slash == NULL || slash == dir)
		return 0;
	*slash = '\0';
	for (char *p = dir + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(dir, 0755) != 0 && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	if (mkdir(dir, 0755) != 0 && errno != EEXIST)
		return -errno;
	return 0;
}

/* Bind path (mode: 0660 the main socket; 0666 a tenant's, whose
 * directory decides who reaches it) into l. */
static int bind_socket(struct listener *l, const char *path, mode_t mode, char *err, size_t errlen)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof(sa.sun_path)) {
		snprintf(err, errlen, "socket path %s is too long", path);
		return -ENAMETOOLONG;
	}
	memcpy(sa.sun_path, path, strlen(path) + 1);
	int r = mkdir_parent(path);
	if (r < 0) {
		snprintf(err, errlen, "creating the directory of %s: %s", path, strerror(-r));
		return r;
	}
	_cleanup_close_ int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		r = -errno;
		snprintf(err, errlen, "socket: %s", strerror(errno));
		return r;
	}
	/* A stale socket from a killed daemon: remove it only if nobody
	 * answers on it. */
	struct stat st;
	if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode)) {
		_cleanup_close_ int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
			snprintf(err, errlen, "another ckptd is listening on %s", path);
			return -EADDRINUSE;
		}
		unlink(path);
	}
	mode_t old = umask(0177);
	r = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
	umask(old);
	if (r != 0 || chmod(path, mode) != 0 || listen(fd, 128) != 0) {
		r = -errno;
		snprintf(err, errlen, "binding %s: %s", path, strerror(errno));
		return r;
	}
	l->fd = TAKE_FD(fd);
	l->owned = true;
	snprintf(l->path, sizeof(l->path), "%s", path);
	return 0;
}

static int listen_on(struct daemon *d, struct listener *l, char *err, size_t errlen)
{
	l->d = d;
	int r = uv_poll_init(d->loop, &l->poll, l->fd);
	if (r == 0) {
		l->poll.data = l;
		r = uv_poll_start(&l->poll, UV_READABLE, on_accept);
	}
	if (r < 0) {
		snprintf(err, errlen, "polling %s: %s", l->path, uv_strerror(r));
		return r;
	}
	d->nlisteners++;
	return 0;
}

/* Once a second: close connections that sent no Hello in time, and
 * control sessions (no job) silent for idle_timeout_ms with nothing in
 * flight. Trainer sessions are never closed for being idle: a trainer may
 * save once an hour. */
static void sweep(uv_timer_t *t)
{
	struct daemon *d = t->data;
	uint64_t now = clock_now_ns(), hello = (uint64_t)d->cfg.hello_timeout_ms * 1000000ull,
		 idle = (uint64_t)d->cfg.idle_timeout_ms * 1000000ull;
	struct session *s, *next;
	for (s = TAILQ_FIRST(&d->sessions); s; s = next) {
		next = TAILQ_NEXT(s, link);
		if (!s->hello_done && now - s->started_ns > hello) {
			d->stats.refused[LIMIT_HELLO_TIMEOUT]++;
			session_close(s, -ETIMEDOUT, "no Hello within %u ms (hello_timeout_ms)",
				      d->cfg.hello_timeout_ms);
		} else if (s->hello_done && idle && s->job[0] == '\0' && s->refs == 0 && now - s->last_rx_ns > idle) {
			d->stats.refused[LIMIT_IDLE_TIMEOUT]++;
			session_close(s, -ETIMEDOUT, "idle for %u ms (idle_timeout_ms)", d->cfg.idle_timeout_ms);
		}
	}
}

int server_start(struct daemon *d, char *err, size_t errlen)
{
	struct listener *l = &d->listeners[0];
	*l = (struct listener){ .d = d, .fd = -1, .tenant = -1 };
	snprintf(l->path, sizeof(l->path), "%s", d->cfg.socket_path);
	int n = sd_listen_fds(1);
	if (n > 0) {
		l->fd = SD_LISTEN_FDS_START;
		int fl = fcntl(l->fd, F_GETFL);
		if (fl < 0 || fcntl(l->fd, F_SETFL, fl | O_NONBLOCK) != 0) {
			snprintf(err, errlen, "socket from systemd: %s", strerror(errno));
			return -errno;
		}
		log_info("server: using the socket passed by systemd");
	} else {
		int r = bind_socket(l, d->cfg.socket_path, 0660, err, errlen);
		if (r < 0)
			return r;
	}
	int r = listen_on(d, l, err, errlen);
	/* Each tenant with a socket of its own (docs/security.md "Tenants"). */
	for (size_t i = 0; r == 0 && i < d->cfg.ntenants; i++) {
		const struct tenant_config *t = &d->cfg.tenants[i];
		if (t->socket[0] == '\0')
			continue;
		l = &d->listeners[d->nlisteners];
		*l = (struct listener){ .d = d, .fd = -1, .tenant = (int)i };
		r = bind_socket(l, t->socket, 0666, err, errlen);
		if (r == 0)
			r = listen_on(d, l, err, errlen);
		else
			l->fd = -1;
		if (r == 0)
			log_info("server: tenant '%s' on %s", t->name, t->socket);
	}
	if (r < 0) {
		server_stop_listeners(d);
		return r;
	}
	d->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	uv_timer_init(d->loop, &d->accept_timer);
	d->accept_timer.data = d;
	uv_timer_init(d->loop, &d->sweep_timer);
	d->sweep_timer.data = d;
	uv_timer_start(&d->sweep_timer, sweep, 1000, 1000);
	uv_unref((uv_handle_t *)&d->sweep_timer);
	uv_unref((uv_handle_t *)&d->accept_timer);
	d->listening = true;
	return 0;
}

static void on_listen_closed(uv_handle_t *h)
{
	struct listener *l = h->data;
	close(l->fd);
	l->fd = -1;
}

/* Close every listener started, and unlink the sockets we bound. */
static void server_stop_listeners(struct daemon *d)
{
	for (uint32_t i = 0; i < d->nlisteners; i++) {
		struct listener *l = &d->listeners[i];
		uv_poll_stop(&l->poll);
		uv_close((uv_handle_t *)&l->poll, on_listen_closed);
		if (l->owned)
			unlink(l->path);
	}
	d->nlisteners = 0;
}

void server_stop(struct daemon *d)
{
	if (!d->listening)
		return;
	d->listening = false;
	server_stop_listeners(d);
	uv_close((uv_handle_t *)&d->accept_timer, NULL);
	uv_close((uv_handle_t *)&d->sweep_timer, NULL);
	if (d->spare_fd >= 0)
		close(d->spare_fd);
	d->spare_fd = -1;
}
