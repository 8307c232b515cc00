/* file:// backend: local disk, NFS, GCSFuse. Atomicity comes from writing a
 * temporary name, fsync, rename, fsync of the directory.
 *
 * What is under the root is not trusted (a tenant, or anyone else who can
 * write to the share, may plant anything there): a key is resolved one
 * component at a time, each directory opened relative to the one before
 * with O_NOFOLLOW, and every read, write and delete is an *at() call on a
 * name in the directory so opened. A symbolic link anywhere below the root
 * is refused (never followed), so no planted link leads a read, a write or
 * a delete outside the store; objects are opened O_NONBLOCK and must be
 * regular files, so a FIFO or a device can neither block a worker nor be
 * read as data. The root itself comes from the config and may be a link.
 * New files get the store's file_mode (0600 unless [storage] file_mode
 * says otherwise), directories the same with x where r, whatever the
 * process umask. */
#include "store.h"
#include "log.h"
#include "fsutil.h"
#include "grow.h"
#include "macro.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct store_fs {
	struct store base;
	char root[PATH_MAX];
	char host[65]; /* in temporary names, so recovery leaves other nodes' alone */
};

static atomic_uint_fast64_t tmp_counter;

static mode_t dir_mode(const struct store *s)
{
	mode_t m = (mode_t)s->file_mode & 0777;
	return m | ((m & 0444) >> 2); /* x where r */
}

/* mkdir -p of the root (trusted: the config's path), fsync'ing the parent
 * of every directory it creates. */
static int mkdir_p(char *path, mode_t mode)
{
	char *p = path + 1;
	for (;;) {
		while (*p && *p != '/')
			p++;
		char saved = *p;
		*p = '\0';
		if (mkdir(path, mode) == 0) {
			char *slash = strrchr(path, '/');
			int r;
			if (slash == path) {
				r = fsync_dir("/");
			} else {
				*slash = '\0';
				r = fsync_dir(path);
				*slash = '/';
			}
			if (r < 0) {
				*p = saved;
				return r;
			}
		} else if (errno != EEXIST) {
			int r = -errno;
			*p = saved;
			return r;
		}
		*p = saved;
		if (saved == '\0')
			return 0;
		p++;
	}
}

/* Why a key could not be resolved, said once for store_error. */
static int refuse(const char *key, int e)
{
	if (e == ELOOP || e == ENOTDIR)
		store_set_error("%s: a symbolic link or a file where a directory should be, under the store root "
				"(refused, not followed)",
				key);
	return -e;
}

/* key's parent directory, opened (the caller closes it), with *leaf at
 * key's last component: the resolution the header comment describes. With
 * create, missing directories are made and their parents fsync'd. The fd,
 * or -errno. */
static int open_parent(struct store_fs *s, const char *key, bool create, const char **leaf)
{
	if (key[0] == '/' || strstr(key, "..") != NULL)
		return -EINVAL;
	_cleanup_close_ int fd = open(s->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	const char *p = key;
	for (const char *slash; (slash = strchr(p, '/')) != NULL; p = slash + 1) {
		size_t n = (size_t)(slash - p);
		char comp[NAME_MAX + 1];
		if (n == 0)
			continue;
		if (n > NAME_MAX)
			return -ENAMETOOLONG;
		memcpy(comp, p, n);
		comp[n] = '\0';
		int nfd = openat(fd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		bool made = false;
		if (nfd < 0 && errno == ENOENT && create) {
			if ((made = mkdirat(fd, comp, dir_mode(&s->base)) == 0)) {
				if (fsync(fd) != 0)
					return -errno;
			} else if (errno != EEXIST) {
				return -errno;
			}
			nfd = openat(fd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		}
		if (nfd < 0)
			return refuse(key, errno);
		close(fd);
		fd = nfd;
		if (made && fchmod(fd, dir_mode(&s->base)) != 0) /* whatever the umask */
			return -errno;
	}
	*leaf = p;
	return TAKE_FD(fd);
}

/* The directory prefix ("" the root) itself, opened as open_parent does. */
static int open_dir(struct store_fs *s, const char *prefix)
{
	if (prefix[0] == '\0') {
		int fd = open(s->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		return fd < 0 ? -errno : fd;
	}
	const char *leaf;
	int dfd = open_parent(s, prefix, false, &leaf);
	if (dfd < 0)
		return dfd;
	int fd = openat(dfd, leaf[0] ? leaf : ".", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	int e = errno;
	close(dfd);
	return fd < 0 ? refuse(prefix, e) : fd;
}

/* key's object opened for reading: a regular file, or an error naming it
 * (a FIFO or a device is opened without blocking, then refused). */
static int open_object(struct store_fs *s, const char *key, struct stat *st)
{
	const char *leaf;
	_cleanup_close_ int dfd = open_parent(s, key, false, &leaf);
	if (dfd < 0)
		return dfd;
	/* Not even opened unless it is a regular file (opening a device can
	 * do something); the fstat after the open closes the race. */
	_cleanup_close_ int fd = -1;
	int e = 0;
	if (fstatat(dfd, leaf, st, AT_SYMLINK_NOFOLLOW) != 0)
		e = errno;
	else if (S_ISLNK(st->st_mode))
		e = ELOOP;
	else if (S_ISREG(st->st_mode) && (fd = openat(dfd, leaf, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC)) < 0)
		e = errno;
	if (e)
		return refuse(key, e);
	if (fd >= 0 && fstat(fd, st) != 0)
		return -errno;
	if (fd < 0 || !S_ISREG(st->st_mode)) {
		store_set_error("%s is not a regular file (refused)", key);
		return -EINVAL;
	}
	return TAKE_FD(fd);
}

static int write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;
	while (len > 0) {
		size_t n = len > (1u << 30) ? (1u << 30) : len;
		ssize_t w = write(fd, p, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += w;
		len -= (size_t)w;
	}
	return 0;
}

/* Direct I/O for shards: the pool's chunks are page-aligned, so their
 * bytes go from the pool to the disk with no copy into the page cache.
 * That copy, the page cache's allocation and its reclaim cost the daemon
 * about 0.3 s of CPU per GiB on this project's VM, CPU a trainer on the
 * same cores loses (and a checkpoint would push its working set out of
 * the page cache). Buffered writes remain for what is not aligned (the
 * last chunk's tail, manifests) and for filesystems without O_DIRECT. */
#define DIRECT_MIN (1u << 20)

struct dio {
	bool on;
	uint32_t mem_align, off_align;
	uint64_t off;    /* file offset so far */
	uint64_t direct; /* bytes written directly */
};

static void dio_start(struct dio *d, int fd, uint64_t total)
{
	memset(d, 0, sizeof(*d));
#ifdef STATX_DIOALIGN /* Linux 6.1 UAPI headers; without them, buffered */
	if (total < DIRECT_MIN)
		return;
	struct statx stx;
	if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) != 0 || !(stx.stx_mask & STATX_DIOALIGN) ||
	    stx.stx_dio_mem_align == 0 || stx.stx_dio_offset_align == 0)
		return;
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_DIRECT) != 0)
		return;
	d->on = true;
	d->mem_align = stx.stx_dio_mem_align;
	d->off_align = stx.stx_dio_offset_align;
#else
	(void)fd;
	(void)total;
#endif
}

/* Back to buffered writes for the rest of the file. */
static int dio_stop(struct dio *d, int fd)
{
	if (!d->on)
		return 0;
	d->on = false;
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_DIRECT) != 0)
		return -errno;
	return 0;
}

/* Write buf: its aligned part directly while alignment holds, the rest
 * (and everything after) buffered. */
static int dio_write(struct dio *d, int fd, const char *p, size_t len)
{
	int r;
	while (d->on && len >= d->off_align) {
		if ((uintptr_t)p % d->mem_align || d->off % d->off_align) {
			if ((r = dio_stop(d, fd)) < 0)
				return r;
			break;
		}
		size_t n = len - len % d->off_align;
		if (n > (1u << 30))
			n = 1u << 30;
		ssize_t w = write(fd, p, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EINVAL) { /* this file or device refuses it after all */
				if ((r = dio_stop(d, fd)) < 0)
					return r;
				break;
			}
			return -errno;
		}
		if (w == 0)
			return -EIO;
		p += w;
		len -= (size_t)w;
		d->off += (uint64_t)w;
		d->direct += (uint64_t)w;
	}
	if (len == 0)
		return 0;
	if ((r = dio_stop(d, fd)) < 0)
		return r;
	d->off += len;
	return write_all(fd, p, len);
}

/* Give tmp its final name in dfd without replacing anything there:
 * linkat() (the name appears atomically, or EEXIST), else
 * renameat2(RENAME_NOREPLACE) on filesystems without hard links. One with
 * neither (some FUSE mounts) gets a check and a rename: not atomic between
 * nodes, and said so once. */
static int publish_new(int dfd, const char *tmp, const char *name)
{
	if (linkat(dfd, tmp, dfd, name, 0) == 0) {
		unlinkat(dfd, tmp, 0);
		return 0;
	}
	if (errno == EEXIST)
		return -EEXIST;
	if (errno != EPERM && errno != EOPNOTSUPP && errno != ENOSYS && errno != EMLINK && errno != EXDEV)
		return -errno;
	if (renameat2(dfd, tmp, dfd, name, RENAME_NOREPLACE) == 0)
		return 0;
	if (errno == EEXIST)
		return -EEXIST;
	if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP)
		return -errno;
	static atomic_int warned;
	if (atomic_exchange(&warned, 1) == 0)
		log_warn("storage: this filesystem has neither hard links nor RENAME_NOREPLACE; create-only "
			 "writes (manifests, commit markers) are checked but not atomic between nodes");
	if (faccessat(dfd, name, F_OK, AT_SYMLINK_NOFOLLOW) == 0)
		return -EEXIST;
	return renameat(dfd, tmp, dfd, name) == 0 ? 0 : -errno;
}

static int fs_write(struct store *base, const char *key, const struct iovec *iov, size_t n, bool excl)
{
	struct store_fs *s = (struct store_fs *)base;
	const char *leaf;
	_cleanup_close_ int dfd = open_parent(s, key, true, &leaf);
	if (dfd < 0)
		return dfd;
	char tmp[NAME_MAX + 1];
	int r = snprintf(tmp, sizeof(tmp), "%s.tmp.%s.%d.%llu", leaf, s->host, (int)getpid(),
			 (unsigned long long)atomic_fetch_add(&tmp_counter, 1));
	if (leaf[0] == '\0' || r < 0 || (size_t)r >= sizeof(tmp))
		return leaf[0] ? -ENAMETOOLONG : -EINVAL;
	r = 0;
	int fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, base->file_mode & 0777);
	if (fd < 0)
		return -errno;
	if (fchmod(fd, base->file_mode & 0777) != 0) /* the configured mode, whatever the umask */
		r = -errno;
	uint64_t total = 0;
	for (size_t i = 0; i < n; i++)
		total += iov[i].iov_len;
	struct dio d;
	dio_start(&d, fd, total);
	for (size_t i = 0; i < n && r == 0; i++) {
		r = dio_write(&d, fd, iov[i].iov_base, iov[i].iov_len);
		if (s->base.debug_delay_ms && n > 1 && i == n / 2)
			usleep(s->base.debug_delay_ms * 1000u); /* tests: a window to crash in */
	}
	if (r == 0 && fsync(fd) != 0)
		r = -errno;
	/* Durable now: drop it from the page cache rather than push the
	 * trainers' working set out with checkpoint bytes. */
	if (r == 0)
		(void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	if (close(fd) != 0 && r == 0)
		r = -errno;
	if (r == 0 && excl)
		r = publish_new(dfd, tmp, leaf);
	else if (r == 0 && renameat(dfd, tmp, dfd, leaf) != 0)
		r = -errno;
	if (r < 0) {
		unlinkat(dfd, tmp, 0);
		return r;
	}
	s->base.direct_bytes += d.direct;
	return fsync(dfd) == 0 ? 0 : -errno;
}

static int fs_put(struct store *base, const char *key, const struct iovec *iov, size_t n, const uint32_t *crcs)
{
	(void)crcs; /* files need no per-part checksum */
	return fs_write(base, key, iov, n, false);
}

static int fs_create(struct store *base, const char *key, const struct iovec *iov, size_t n, const uint32_t *crcs)
{
	(void)crcs;
	return fs_write(base, key, iov, n, true);
}

static int fs_get_range(struct store *base, const char *key, uint64_t off, void *buf, size_t len)
{
	struct stat st;
	int fd = open_object((struct store_fs *)base, key, &st);
	if (fd < 0)
		return fd;
	int r = 0;
	char *p = buf;
	while (len > 0) {
		ssize_t g = pread(fd, p, len, (off_t)off);
		if (g < 0) {
			if (errno == EINTR)
				continue;
			r = -errno;
			break;
		}
		if (g == 0) {
			r = -ENODATA;
			break;
		}
		p += g;
		off += (uint64_t)g;
		len -= (size_t)g;
	}
	close(fd);
	return r;
}

static int fs_get_all(struct store *base, const char *key, size_t max, void **out, size_t *outlen)
{
	struct stat st;
	_cleanup_close_ int fd = open_object((struct store_fs *)base, key, &st);
	if (fd < 0)
		return fd;
	if ((uint64_t)st.st_size > max)
		return -EFBIG;
	size_t len = (size_t)st.st_size;
	_cleanup_free_ char *buf = malloc(len ? len : 1);
	if (buf == NULL)
		return -ENOMEM;
	for (size_t got = 0; got < len;) {
		ssize_t g = read(fd, buf + got, len - got);
		if (g < 0 && errno == EINTR)
			continue;
		if (g <= 0)
			return g < 0 ? -errno : -ENODATA;
		got += (size_t)g;
	}
	*out = TAKE_PTR(buf);
	*outlen = len;
	return 0;
}

/* The names under prefix, and with want_stat their sizes and times (a
 * stat per name: list_entries only, so list stays one readdir on NFS). */
static int read_dir(struct store_fs *s, const char *prefix, bool want_stat, struct store_entry **out, size_t *count)
{
	int fd = open_dir(s, prefix);
	if (fd < 0)
		return fd;
	DIR *d = fdopendir(fd);
	if (d == NULL) {
		int e = errno;
		close(fd);
		return -e;
	}
	size_t n = 0, cap = 16;
	struct store_entry *v = malloc(cap * sizeof(*v));
	struct dirent *e;
	while (v && (e = readdir(d)) != NULL) {
		if (e->d_name[0] == '.' || strstr(e->d_name, ".tmp.") != NULL)
			continue;
		struct stat st = { 0 };
		if (want_stat && fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
			continue; /* removed meanwhile */
		if (GROW(v, cap, n + 1, 16) < 0)
			break;
		v[n] = (struct store_entry){ .size = S_ISDIR(st.st_mode) ? 0 : (uint64_t)st.st_size,
					     .mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec,
					     .dir = want_stat ? S_ISDIR(st.st_mode) : e->d_type == DT_DIR };
		if ((v[n].name = strdup(e->d_name)) == NULL)
			break;
		n++;
	}
	int failed = v == NULL || e != NULL;
	closedir(d);
	if (failed) {
		store_entries_free(v, n);
		return -ENOMEM;
	}
	*out = v;
	*count = n;
	return 0;
}

static int fs_list(struct store *base, const char *prefix, char ***names, size_t *count)
{
	struct store_entry *v = NULL;
	size_t n = 0;
	int r = read_dir((struct store_fs *)base, prefix, false, &v, &n);
	return r < 0 ? r : store_entries_to_names(v, n, names, count);
}

static int fs_list_entries(struct store *base, const char *prefix, struct store_entry **out, size_t *count)
{
	return read_dir((struct store_fs *)base, prefix, true, out, count);
}

/* Remove the name key (a file, or with AT_REMOVEDIR an empty directory)
 * from its directory, never following a link, then make it stick: fsync
 * the directory that held it. */
static int remove_synced(struct store *base, const char *key, int flags)
{
	const char *leaf;
	int dfd = open_parent((struct store_fs *)base, key, false, &leaf);
	if (dfd < 0)
		return dfd;
	int r = leaf[0] == '\0' ? -EINVAL : 0;
	if (r == 0 && unlinkat(dfd, leaf, flags) != 0)
		r = -errno;
	if (r == 0 && fsync(dfd) != 0)
		r = -errno;
	close(dfd);
	return r;
}

static int fs_remove(struct store *base, const char *key)
{
	return remove_synced(base, key, 0);
}

static int fs_remove_dir(struct store *base, const char *prefix)
{
	return remove_synced(base, prefix, AT_REMOVEDIR);
}

static int fs_remove_temps(struct store *base, const char *key)
{
	struct store_fs *s = (struct store_fs *)base;
	const char *leaf;
	int dfd = open_parent(s, key, false, &leaf);
	if (dfd < 0)
		return dfd == -ENOENT ? 0 : dfd;
	char prefix[NAME_MAX + 80];
	snprintf(prefix, sizeof(prefix), "%s.tmp.%s.", leaf, s->host);
	int lfd = dup(dfd);
	DIR *d = lfd < 0 ? NULL : fdopendir(lfd);
	if (d == NULL) {
		int e = errno;
		if (lfd >= 0)
			close(lfd);
		close(dfd);
		return -e;
	}
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (strncmp(e->d_name, prefix, strlen(prefix)) != 0)
			continue;
		if (unlinkat(dfd, e->d_name, 0) == 0)
			n++;
	}
	closedir(d);
	if (n)
		(void)fsync(dfd);
	close(dfd);
	return n;
}

static void fs_free(struct store *base)
{
	free(base);
}

static const struct store_ops fs_ops = {
	.put = fs_put,
	.create = fs_create,
	.get_range = fs_get_range,
	.get_all = fs_get_all,
	.list = fs_list,
	.list_entries = fs_list_entries,
	.remove = fs_remove,
	.remove_dir = fs_remove_dir,
	.remove_temps = fs_remove_temps,
	.free = fs_free,
};

int store_fs_check(const struct store_scheme *row, const char *url, char *err, size_t errlen)
{
	(void)row;
	const char *p = url + strlen("file://");
	if (p[0] != '/') {
		snprintf(err, errlen, "storage URL '%s': want file:///absolute/path", url);
		return -EINVAL;
	}
	size_t len = strlen(p);
	while (len > 1 && p[len - 1] == '/')
		len--;
	if (len >= sizeof(((struct store_fs *)0)->root)) {
		snprintf(err, errlen, "storage URL '%s': the path is too long", url);
		return -ENAMETOOLONG;
	}
	return 0;
}

int store_fs_open(const struct store_scheme *row, const char *url, struct store **out, char *err, size_t errlen)
{
	int bad = store_fs_check(row, url, err, errlen);
	if (bad < 0)
		return bad;
	const char *p = url + strlen("file://");
	struct store_fs *s = calloc(1, sizeof(*s));
	if (s == NULL)
		return -ENOMEM;
	s->base.ops = &fs_ops;
	snprintf(s->base.url, sizeof(s->base.url), "%s", url);
	size_t len = strlen(p);
	while (len > 1 && p[len - 1] == '/')
		len--;
	memcpy(s->root, p, len);
	s->root[len] = '\0';
	if (gethostname(s->host, sizeof(s->host) - 1) != 0 || s->host[0] == '\0')
		snprintf(s->host, sizeof(s->host), "localhost");
	for (char *c = s->host; *c; c++)
		if (*c == '/' || *c == '.')
			*c = '_';
	s->base.file_mode = 0600;
	int r = mkdir_p(s->root, dir_mode(&s->base));
	if (r < 0) {
		snprintf(err, errlen, "storage root %s: %s", s->root, strerror(-r));
		free(s);
		return r;
	}
	if (access(s->root, W_OK) != 0) {
		r = -errno;
		snprintf(err, errlen, "storage root %s is not writable: %s", s->root, strerror(-r));
		free(s);
		return r;
	}
	*out = &s->base;
	return 0;
}
