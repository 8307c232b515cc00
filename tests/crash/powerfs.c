/* powerfs: a FUSE file system that loses power on command, for crash tests
 * (tests/crash/README.md). It keeps the whole file system in memory and
 * writes to its backing directory only what POSIX makes durable:
 *
 *   - a file's data and size at its fsync or fdatasync;
 *   - a name (create, mkdir, rename, link, unlink, rmdir) at the fsync of
 *     the directory that holds it (a rename: of each of its two).
 *
 * The backing directory is the disk: `.ino/N` holds file N's durable bytes,
 * `.dir/N` directory N's durable entries ("name TAB ino TAB d|f TAB mode"),
 * the root being 1. A power cut (the control socket's "cut") writes nothing
 * more, or, torn, a seeded random part of what was pending: single 4 KiB
 * pages of files, sizes, and single directory entries, in any mix. Every
 * operation then fails with EIO until the file system is unmounted; the
 * next mount reads the backing directory as a disk after the cut (names
 * whose data never reached it are empty files, a name in two directories
 * after a half-made rename is a hard link, and what no name reaches is
 * removed, as fsck would).
 *
 *   powerfs BACKING MOUNTPOINT SOCKET [-d]   mount (foreground) and serve
 *   powerfs --ctl SOCKET COMMAND...          one command, its answer printed
 *
 * Commands (one line each; the answer is one line, "ok ..." or "err ..."):
 *   status                    ops N files F dirty D
 *   cut [SEED]                power off now; with SEED, torn by that seed
 *   arm N [SEED]              power off before the Nth mutating operation
 *                             from now (then that operation fails: EIO)
 *   fail OP N ERRNO           the Nth OP from now fails with ERRNO (EIO,
 *                             ENOSPC); OP: write fsync create mkdir rename
 *                             link unlink truncate. A failed fsync loses
 *                             the data it was to write, as Linux does: a
 *                             retry succeeds and writes nothing.
 *   space BYTES               writes past BYTES of file data: ENOSPC
 *   sync                      everything durable now (a clean sync)
 * Mutating operations (counted, and where "arm" cuts): write, truncate,
 * create, mkdir, unlink, rmdir, rename, link, fsync, fsyncdir. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define FUSE_USE_VERSION 31
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096u

struct ent {
	char *name;
	struct node *node;
};

/* What the disk holds for a directory's entry. */
struct dent {
	char *name;
	uint64_t ino;
	bool dir;
	mode_t mode;
};

struct node {
	uint64_t ino;
	bool dir;
	mode_t mode;
	struct timespec mtime;
	unsigned nlink, nopen;
	struct node *next, *prev; /* every node alive (named or open) */
	/* A file: its bytes now, and on the disk; pages written since. */
	uint8_t *data, *ddata;
	uint64_t size, dsize, cap, dcap;
	uint8_t *dirty; /* a byte per page */
	uint64_t ndirty;
	bool size_dirty;
	/* A directory: its entries now, and on the disk. */
	struct ent *ents;
	size_t nents;
	struct dent *dents;
	size_t ndents;
	bool dir_dirty;
};

enum op {
	OP_WRITE,
	OP_FSYNC,
	OP_CREATE,
	OP_MKDIR,
	OP_RENAME,
	OP_LINK,
	OP_UNLINK,
	OP_TRUNCATE,
	OP_N
};
static const char *const op_names[OP_N] = {
	"write", "fsync", "create", "mkdir", "rename", "link", "unlink", "truncate"
};

static struct {
	pthread_mutex_t mu;
	char backing[4096];
	struct node *root, *all;
	uint64_t next_ino, ops, bytes, space;
	bool dead;
	uint64_t arm_at; /* 0: not armed */
	bool arm_torn;
	uint64_t arm_seed;
	uint64_t fail_left[OP_N]; /* 0: none */
	int fail_errno[OP_N];
	int ctl_fd;
} fs = { .mu = PTHREAD_MUTEX_INITIALIZER };

/* ---- the disk (backing directory) ---- */

static void backing_path(char *out, size_t len, const char *kind, uint64_t ino)
{
	snprintf(out, len, "%s/%s/%llu", fs.backing, kind, (unsigned long long)ino);
}

/* Write n bytes as the whole of backing file kind/ino (atomically on the
 * backing file system: a powerfs that dies leaves the old or the new). */
static void put_file(const char *kind, uint64_t ino, const void *p, size_t n)
{
	char path[4200], tmp[4300];
	backing_path(path, sizeof(path), kind, ino);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	FILE *f = fopen(tmp, "wb");
	if (f == NULL || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0) {
		perror(tmp);
		abort();
	}
	if (rename(tmp, path) != 0)
		abort();
}

static uint8_t *get_file(const char *kind, uint64_t ino, uint64_t *n)
{
	char path[4200];
	backing_path(path, sizeof(path), kind, ino);
	*n = 0;
	FILE *f = fopen(path, "rb");
	if (f == NULL)
		return NULL;
	fseek(f, 0, SEEK_END);
	long len = ftell(f);
	fseek(f, 0, SEEK_SET);
	uint8_t *p = malloc(len > 0 ? (size_t)len : 1);
	if (p == NULL || (len > 0 && fread(p, 1, (size_t)len, f) != (size_t)len))
		abort();
	fclose(f);
	*n = (uint64_t)len;
	return p;
}

/* A file's time as the disk keeps it: with its name, at the directory's
 * fsync (a remount keeps it: ckptd's removals judge objects by it). */
static struct timespec mtime_of(uint64_t ino)
{
	for (struct node *n = fs.all; n; n = n->next)
		if (n->ino == ino)
			return n->mtime;
	struct timespec z = { 0, 0 };
	return z;
}

static void put_dir(struct node *d)
{
	size_t cap = 64, len = 0;
	char *buf = malloc(cap);
	for (size_t i = 0; i < d->ndents; i++) {
		const struct dent *e = &d->dents[i];
		size_t need = strlen(e->name) + 64;
		while (len + need > cap)
			buf = realloc(buf, cap *= 2);
		struct timespec t = mtime_of(e->ino);
		len += (size_t)sprintf(buf + len, "%s\t%llu\t%c\t%o\t%lld.%09ld\n", e->name, (unsigned long long)e->ino,
				       e->dir ? 'd' : 'f', (unsigned)e->mode, (long long)t.tv_sec, t.tv_nsec);
	}
	put_file(".dir", d->ino, buf, len);
	free(buf);
}

/* ---- nodes ---- */

static struct node *node_new(bool dir, mode_t mode, uint64_t ino)
{
	struct node *n = calloc(1, sizeof(*n));
	n->ino = ino ? ino : fs.next_ino++;
	if (n->ino >= fs.next_ino)
		fs.next_ino = n->ino + 1;
	n->dir = dir;
	n->mode = (dir ? S_IFDIR : S_IFREG) | (mode & 07777);
	clock_gettime(CLOCK_REALTIME, &n->mtime);
	n->next = fs.all;
	if (fs.all)
		fs.all->prev = n;
	fs.all = n;
	return n;
}

static void node_free(struct node *n)
{
	if (n->prev)
		n->prev->next = n->next;
	else
		fs.all = n->next;
	if (n->next)
		n->next->prev = n->prev;
	fs.bytes -= n->size;
	free(n->data);
	free(n->ddata);
	free(n->dirty);
	for (size_t i = 0; i < n->nents; i++)
		free(n->ents[i].name);
	free(n->ents);
	for (size_t i = 0; i < n->ndents; i++)
		free(n->dents[i].name);
	free(n->dents);
	free(n);
}

/* A node lost a name or a handle: gone when it has neither. */
static void node_put(struct node *n)
{
	if (n->nlink == 0 && n->nopen == 0)
		node_free(n);
}

static void grow(uint8_t **p, uint64_t *cap, uint64_t want)
{
	if (want <= *cap)
		return;
	uint64_t nc = *cap ? *cap : 4096;
	while (nc < want)
		nc *= 2;
	*p = realloc(*p, nc);
	memset(*p + *cap, 0, nc - *cap);
	*cap = nc;
}

static void mark(struct node *n, uint64_t off, uint64_t len)
{
	uint64_t pages = (n->size + PAGE - 1) / PAGE;
	if (pages > n->ndirty) {
		n->dirty = realloc(n->dirty, pages);
		memset(n->dirty + n->ndirty, 0, pages - n->ndirty);
		n->ndirty = pages;
	}
	for (uint64_t p = off / PAGE; len && p <= (off + len - 1) / PAGE && p < n->ndirty; p++)
		n->dirty[p] = 1;
}

static void set_size(struct node *n, uint64_t size)
{
	grow(&n->data, &n->cap, size);
	if (size < n->size)
		memset(n->data + size, 0, n->size - size);
	fs.bytes += size - n->size;
	n->size = size;
	n->size_dirty = true;
	mark(n, size, 0);
}

/* Page p of n (or its size) reaches the disk. */
static void flush_page(struct node *n, uint64_t p)
{
	uint64_t off = p * PAGE;
	if (off >= n->size)
		return;
	uint64_t len = n->size - off < PAGE ? n->size - off : PAGE;
	grow(&n->ddata, &n->dcap, off + len);
	memcpy(n->ddata + off, n->data + off, len);
	if (n->dsize < off + len)
		n->dsize = off + len;
}

static void flush_size(struct node *n)
{
	grow(&n->ddata, &n->dcap, n->size);
	if (n->size < n->dsize)
		memset(n->ddata + n->size, 0, n->dsize - n->size);
	n->dsize = n->size;
}

/* fsync of a file: every dirty page and its size (all = true), or, torn,
 * each by chance; written to the disk. */
static void file_sync(struct node *n, bool all, unsigned *rng)
{
	bool any = false;
	for (uint64_t p = 0; p < n->ndirty; p++)
		if (n->dirty[p] && (all || rand_r(rng) % 2)) {
			flush_page(n, p);
			n->dirty[p] = 0;
			any = true;
		}
	if (n->size_dirty && (all || rand_r(rng) % 2)) {
		flush_size(n);
		n->size_dirty = false;
		any = true;
	}
	if (any || all)
		put_file(".ino", n->ino, n->ddata, n->dsize);
}

static struct dent *dent_find(struct node *d, const char *name)
{
	for (size_t i = 0; i < d->ndents; i++)
		if (strcmp(d->dents[i].name, name) == 0)
			return &d->dents[i];
	return NULL;
}

static struct ent *ent_find(struct node *d, const char *name)
{
	for (size_t i = 0; i < d->nents; i++)
		if (strcmp(d->ents[i].name, name) == 0)
			return &d->ents[i];
	return NULL;
}

/* fsync of a directory: its entries as they are now (all), or, torn, each
 * difference by chance; written to the disk. A name that now stands for
 * another file (a rename over it) changes whole: it names the old file or
 * the new one, never none, as on a journaling file system. */
static void dir_sync(struct node *d, bool all, unsigned *rng)
{
	for (size_t i = 0; i < d->ndents;) {
		struct dent *e = &d->dents[i];
		struct ent *now = ent_find(d, e->name);
		bool take = all || rand_r(rng) % 2;
		if (now == NULL && take) { /* gone */
			free(e->name);
			d->dents[i] = d->dents[--d->ndents];
			continue;
		}
		if (now && now->node->ino != e->ino && take) /* replaced */
			*e = (struct dent){ e->name, now->node->ino, now->node->dir, now->node->mode & 07777 };
		i++;
	}
	for (size_t i = 0; i < d->nents; i++) { /* new */
		struct ent *e = &d->ents[i];
		if (dent_find(d, e->name) || !(all || rand_r(rng) % 2))
			continue;
		d->dents = realloc(d->dents, (d->ndents + 1) * sizeof(*d->dents));
		d->dents[d->ndents++] = (struct dent){ strdup(e->name), e->node->ino, e->node->dir,
						       e->node->mode & 07777 };
	}
	if (all)
		d->dir_dirty = false;
	put_dir(d);
}

static void sync_all(void)
{
	for (struct node *n = fs.all; n; n = n->next)
		if (n->dir)
			dir_sync(n, true, NULL);
		else if (n->nlink > 0)
			file_sync(n, true, NULL);
}

/* Power off: nothing more reaches the disk but, torn, a random part of
 * what was pending; every operation fails from now on. */
static void cut(bool torn, uint64_t seed)
{
	unsigned rng = (unsigned)(seed * 2654435761u + 1);
	for (struct node *n = fs.all; torn && n; n = n->next) {
		if (n->dir && n->dir_dirty)
			dir_sync(n, false, &rng);
		else if (!n->dir && (n->size_dirty || n->ndirty))
			file_sync(n, false, &rng);
	}
	fs.dead = true;
	fprintf(stderr, "powerfs: power cut after %llu operations%s\n", (unsigned long long)fs.ops,
		torn ? " (torn)" : "");
}

/* A mutating operation begins: 0 to go on, or the error it fails with
 * (the power is off, it is the armed one, or an injected failure). */
static int tick(enum op kind)
{
	if (fs.dead)
		return -EIO;
	fs.ops++;
	if (fs.arm_at && --fs.arm_at == 0) {
		cut(fs.arm_torn, fs.arm_seed);
		return -EIO;
	}
	if ((int)kind < OP_N && fs.fail_left[kind] && --fs.fail_left[kind] == 0)
		return -fs.fail_errno[kind];
	return 0;
}

/* ---- loading the disk at mount ---- */

static struct node **loaded;
static size_t nloaded;

static struct node *find_loaded(uint64_t ino)
{
	for (size_t i = 0; i < nloaded; i++)
		if (loaded[i]->ino == ino)
			return loaded[i];
	return NULL;
}

static void load_dir(struct node *d)
{
	loaded = realloc(loaded, (nloaded + 1) * sizeof(*loaded));
	loaded[nloaded++] = d;
	uint64_t len;
	char *text = (char *)get_file(".dir", d->ino, &len);
	if (text == NULL)
		return; /* made, never fsync'd: empty */
	text = realloc(text, len + 1);
	text[len] = '\0';
	char *save = NULL;
	for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char name[4096], type;
		unsigned long long ino;
		unsigned mode;
		long long sec = 0;
		long nsec = 0;
		int got = sscanf(line, "%4095[^\t]\t%llu\t%c\t%o\t%lld.%ld", name, &ino, &type, &mode, &sec, &nsec);
		if (got < 4)
			continue;
		struct node *c = find_loaded(ino);
		if (c && (c->dir || type == 'd'))
			continue; /* a directory reached twice (a torn rename): fsck keeps one */
		if (c == NULL) {
			c = node_new(type == 'd', mode, ino);
			if (got == 6)
				c->mtime = (struct timespec){ (time_t)sec, nsec };
			if (c->dir) {
				load_dir(c);
			} else {
				loaded = realloc(loaded, (nloaded + 1) * sizeof(*loaded));
				loaded[nloaded++] = c;
				c->ddata = get_file(".ino", ino, &c->dsize);
				c->dcap = c->dsize;
				c->size = c->dsize;
				c->cap = c->size;
				c->data = malloc(c->size ? c->size : 1);
				if (c->size)
					memcpy(c->data, c->ddata, c->size);
				fs.bytes += c->size;
			}
		}
		c->nlink++;
		d->ents = realloc(d->ents, (d->nents + 1) * sizeof(*d->ents));
		d->ents[d->nents++] = (struct ent){ strdup(name), c };
		d->dents = realloc(d->dents, (d->ndents + 1) * sizeof(*d->dents));
		d->dents[d->ndents++] = (struct dent){ strdup(name), ino, c->dir, mode };
	}
	free(text);
}

/* What no name reaches is removed from the disk (as fsck would). */
static void drop_unreached(const char *kind)
{
	char dir[4200];
	snprintf(dir, sizeof(dir), "%s/%s", fs.backing, kind);
	DIR *dp = opendir(dir);
	struct dirent *e;
	while (dp && (e = readdir(dp)) != NULL) {
		char *end;
		unsigned long long ino = strtoull(e->d_name, &end, 10);
		if (e->d_name[0] == '.')
			continue;
		if (*end != '\0' || find_loaded(ino) == NULL) {
			char path[8400];
			snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
			unlink(path);
		}
	}
	if (dp)
		closedir(dp);
}

static void load(void)
{
	char p[4200];
	snprintf(p, sizeof(p), "%s/.ino", fs.backing);
	mkdir(p, 0700);
	snprintf(p, sizeof(p), "%s/.dir", fs.backing);
	mkdir(p, 0700);
	fs.next_ino = 2;
	fs.root = node_new(true, 0755, 1);
	fs.root->nlink = 1;
	load_dir(fs.root);
	drop_unreached(".ino");
	drop_unreached(".dir");
	free(loaded);
	loaded = NULL;
	nloaded = 0;
}

/* ---- paths ---- */

static struct node *lookup(const char *path)
{
	struct node *n = fs.root;
	char buf[4096];
	snprintf(buf, sizeof(buf), "%s", path);
	char *save = NULL;
	for (char *c = strtok_r(buf, "/", &save); c && n; c = strtok_r(NULL, "/", &save)) {
		if (!n->dir)
			return NULL;
		struct ent *e = ent_find(n, c);
		n = e ? e->node : NULL;
	}
	return n;
}

/* The directory of path, and its last name in leaf. */
static struct node *parent(const char *path, char *leaf, size_t len)
{
	const char *slash = strrchr(path, '/');
	snprintf(leaf, len, "%s", slash ? slash + 1 : path);
	char dir[4096];
	snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash - path) : 0, path);
	struct node *d = lookup(dir[0] ? dir : "/");
	return d && d->dir ? d : NULL;
}

static void ent_add(struct node *d, const char *name, struct node *n)
{
	d->ents = realloc(d->ents, (d->nents + 1) * sizeof(*d->ents));
	d->ents[d->nents++] = (struct ent){ strdup(name), n };
	n->nlink++;
	d->dir_dirty = true;
}

/* Remove name from d; the node loses that name. */
static void ent_del(struct node *d, const char *name)
{
	for (size_t i = 0; i < d->nents; i++)
		if (strcmp(d->ents[i].name, name) == 0) {
			struct node *n = d->ents[i].node;
			free(d->ents[i].name);
			d->ents[i] = d->ents[--d->nents];
			d->dir_dirty = true;
			n->nlink--;
			node_put(n);
			return;
		}
}

/* ---- the operations ---- */

/* The body of an operation, under the lock; it sets r_ (0, a count, or
 * -errno) and may break out. */
#define LOCKED(...) \
	do { \
		pthread_mutex_lock(&fs.mu); \
		int r_ = 0; \
		do { \
			__VA_ARGS__ \
		} while (0); \
		pthread_mutex_unlock(&fs.mu); \
		return r_; \
	} while (0)

static struct node *of(const char *path, struct fuse_file_info *fi)
{
	return fi && fi->fh ? (struct node *)(uintptr_t)fi->fh : path ? lookup(path) : NULL;
}

static int fill_stat(struct node *n, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = n->ino;
	st->st_mode = n->mode;
	st->st_nlink = n->dir ? 2 : n->nlink;
	st->st_size = n->dir ? 4096 : (off_t)n->size;
	st->st_blocks = (blkcnt_t)((n->size + 511) / 512);
	st->st_blksize = PAGE;
	st->st_mtim = st->st_ctim = st->st_atim = n->mtime;
	st->st_uid = getuid();
	st->st_gid = getgid();
	return 0;
}

static int pf_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
	LOCKED({
		struct node *n = of(path, fi);
		r_ = fs.dead ? -EIO : n ? fill_stat(n, st) : -ENOENT;
	});
}

static int pf_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off, struct fuse_file_info *fi,
		      enum fuse_readdir_flags flags)
{
	(void)off;
	(void)flags;
	LOCKED({
		struct node *d = of(path, fi);
		if (fs.dead)
			r_ = -EIO;
		else if (d == NULL || !d->dir)
			r_ = -ENOTDIR;
		else {
			fill(buf, ".", NULL, 0, 0);
			fill(buf, "..", NULL, 0, 0);
			for (size_t i = 0; i < d->nents; i++) {
				struct stat st;
				fill_stat(d->ents[i].node, &st);
				fill(buf, d->ents[i].name, &st, 0, 0);
			}
		}
	});
}

static int make(const char *path, mode_t mode, bool dir, struct fuse_file_info *fi)
{
	LOCKED({
		char leaf[4096];
		struct node *d = parent(path, leaf, sizeof(leaf));
		if ((r_ = tick(dir ? OP_MKDIR : OP_CREATE)) < 0)
			break;
		if (d == NULL)
			r_ = -ENOENT;
		else if (ent_find(d, leaf))
			r_ = -EEXIST;
		else {
			struct node *n = node_new(dir, mode, 0);
			ent_add(d, leaf, n);
			if (fi) {
				n->nopen++;
				fi->fh = (uintptr_t)n;
				fi->direct_io = 1;
			}
		}
	});
}

static int pf_mkdir(const char *path, mode_t mode)
{
	return make(path, mode, true, NULL);
}

static int pf_create(const char *path, mode_t mode, struct fuse_file_info *fi)
{
	return make(path, mode, false, fi);
}

static int pf_open(const char *path, struct fuse_file_info *fi)
{
	LOCKED({
		struct node *n = lookup(path);
		if (fs.dead)
			r_ = -EIO;
		else if (n == NULL)
			r_ = -ENOENT;
		else {
			if (fi->flags & O_TRUNC) {
				if ((r_ = tick(OP_TRUNCATE)) < 0)
					break;
				set_size(n, 0);
			}
			n->nopen++;
			fi->fh = (uintptr_t)n;
			fi->direct_io = 1;
		}
	});
}

static int pf_opendir(const char *path, struct fuse_file_info *fi)
{
	LOCKED({
		struct node *n = lookup(path);
		if (fs.dead)
			r_ = -EIO;
		else if (n == NULL || !n->dir)
			r_ = -ENOTDIR;
		else {
			n->nopen++;
			fi->fh = (uintptr_t)n;
		}
	});
}

static int pf_release(const char *path, struct fuse_file_info *fi)
{
	(void)path;
	LOCKED({
		struct node *n = (struct node *)(uintptr_t)fi->fh;
		n->nopen--;
		node_put(n);
	});
}

static int pf_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
	LOCKED({
		struct node *n = of(path, fi);
		if (fs.dead)
			r_ = -EIO;
		else if (n == NULL)
			r_ = -ENOENT;
		else if ((uint64_t)off >= n->size)
			r_ = 0;
		else {
			size_t k = n->size - (uint64_t)off < size ? (size_t)(n->size - (uint64_t)off) : size;
			memcpy(buf, n->data + off, k);
			r_ = (int)k;
		}
	});
}

static int pf_write(const char *path, const char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
	LOCKED({
		struct node *n = of(path, fi);
		if ((r_ = tick(OP_WRITE)) < 0)
			break;
		if (n == NULL) {
			r_ = -ENOENT;
			break;
		}
		if (fi->flags & O_APPEND)
			off = (off_t)n->size;
		uint64_t end = (uint64_t)off + size;
		if (fs.space && end > n->size && fs.bytes + (end - n->size) > fs.space) {
			r_ = -ENOSPC;
			break;
		}
		if (end > n->size)
			set_size(n, end);
		memcpy(n->data + off, buf, size);
		mark(n, (uint64_t)off, size);
		clock_gettime(CLOCK_REALTIME, &n->mtime);
		r_ = (int)size;
	});
}

static int pf_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
	LOCKED({
		struct node *n = of(path, fi);
		if ((r_ = tick(OP_TRUNCATE)) < 0)
			break;
		if (n == NULL || n->dir)
			r_ = n ? -EISDIR : -ENOENT;
		else if (fs.space && (uint64_t)size > n->size && fs.bytes + ((uint64_t)size - n->size) > fs.space)
			r_ = -ENOSPC;
		else
			set_size(n, (uint64_t)size);
	});
}

static int pf_unlink(const char *path)
{
	LOCKED({
		char leaf[4096];
		struct node *d = parent(path, leaf, sizeof(leaf));
		if ((r_ = tick(OP_UNLINK)) < 0)
			break;
		struct ent *e = d ? ent_find(d, leaf) : NULL;
		if (e == NULL)
			r_ = -ENOENT;
		else if (e->node->dir)
			r_ = -EISDIR;
		else
			ent_del(d, leaf);
	});
}

static int pf_rmdir(const char *path)
{
	LOCKED({
		char leaf[4096];
		struct node *d = parent(path, leaf, sizeof(leaf));
		if ((r_ = tick(OP_UNLINK)) < 0)
			break;
		struct ent *e = d ? ent_find(d, leaf) : NULL;
		if (e == NULL)
			r_ = -ENOENT;
		else if (!e->node->dir)
			r_ = -ENOTDIR;
		else if (e->node->nents)
			r_ = -ENOTEMPTY;
		else
			ent_del(d, leaf);
	});
}

static int pf_rename(const char *from, const char *to, unsigned int flags)
{
	LOCKED({
		char fleaf[4096], tleaf[4096];
		struct node *fd = parent(from, fleaf, sizeof(fleaf)), *td = parent(to, tleaf, sizeof(tleaf));
		if ((r_ = tick(OP_RENAME)) < 0)
			break;
		struct ent *src = fd ? ent_find(fd, fleaf) : NULL, *dst = td ? ent_find(td, tleaf) : NULL;
		if (src == NULL || td == NULL) {
			r_ = -ENOENT;
			break;
		}
		if (flags & ~RENAME_NOREPLACE) {
			r_ = -EINVAL;
			break;
		}
		if (dst && (flags & RENAME_NOREPLACE)) {
			r_ = -EEXIST;
			break;
		}
		if (dst && dst->node == src->node)
			break;
		if (dst && dst->node->dir != src->node->dir) {
			r_ = dst->node->dir ? -EISDIR : -ENOTDIR;
			break;
		}
		if (dst && dst->node->dir && dst->node->nents) {
			r_ = -ENOTEMPTY;
			break;
		}
		struct node *n = src->node;
		n->nlink++; /* held across the move */
		ent_del(fd, fleaf);
		if (dst)
			ent_del(td, tleaf);
		ent_add(td, tleaf, n);
		n->nlink--;
	});
}

static int pf_link(const char *from, const char *to)
{
	LOCKED({
		char leaf[4096];
		struct node *n = lookup(from), *td = parent(to, leaf, sizeof(leaf));
		if ((r_ = tick(OP_LINK)) < 0)
			break;
		if (n == NULL || td == NULL)
			r_ = -ENOENT;
		else if (n->dir)
			r_ = -EPERM;
		else if (ent_find(td, leaf))
			r_ = -EEXIST;
		else
			ent_add(td, leaf, n);
	});
}

static int pf_fsync(const char *path, int datasync, struct fuse_file_info *fi)
{
	(void)datasync;
	LOCKED({
		struct node *n = of(path, fi);
		if ((r_ = tick(OP_FSYNC)) < 0) {
			if (r_ == -EIO && !fs.dead && n && !n->dir) {
				/* Lost, as the kernel drops pages that failed to
				 * write: a later fsync has nothing to write. */
				memset(n->dirty, 0, n->ndirty);
				n->size_dirty = false;
			}
			break;
		}
		if (n == NULL)
			r_ = -ENOENT;
		else if (n->dir)
			dir_sync(n, true, NULL);
		else
			file_sync(n, true, NULL);
	});
}

static int pf_fsyncdir(const char *path, int datasync, struct fuse_file_info *fi)
{
	return pf_fsync(path, datasync, fi);
}

static int pf_statfs(const char *path, struct statvfs *st)
{
	(void)path;
	LOCKED({
		memset(st, 0, sizeof(*st));
		st->f_bsize = st->f_frsize = PAGE;
		uint64_t total = fs.space ? fs.space : (64ull << 30);
		st->f_blocks = total / PAGE;
		st->f_bfree = st->f_bavail = fs.bytes < total ? (total - fs.bytes) / PAGE : 0;
		st->f_files = st->f_ffree = 1u << 20;
		st->f_namemax = 255;
	});
}

static int pf_chmod(const char *path, mode_t mode, struct fuse_file_info *fi)
{
	LOCKED({
		struct node *n = of(path, fi);
		if (n)
			n->mode = (n->mode & S_IFMT) | (mode & 07777);
		r_ = fs.dead ? -EIO : n ? 0 : -ENOENT;
	});
}

static int pf_chown(const char *path, uid_t uid, gid_t gid, struct fuse_file_info *fi)
{
	(void)uid;
	(void)gid;
	LOCKED({ r_ = fs.dead ? -EIO : of(path, fi) ? 0 : -ENOENT; });
}

static int pf_utimens(const char *path, const struct timespec tv[2], struct fuse_file_info *fi)
{
	LOCKED({
		struct node *n = of(path, fi);
		if (n && tv)
			n->mtime = tv[1];
		r_ = fs.dead ? -EIO : n ? 0 : -ENOENT;
	});
}

/* ---- control ---- */

static int errno_of(const char *s)
{
	return strcmp(s, "ENOSPC") == 0 ? ENOSPC : strcmp(s, "EIO") == 0 ? EIO : strcmp(s, "EDQUOT") == 0 ? EDQUOT : 0;
}

static void command(char *line, char *out, size_t len)
{
	char *argv[8] = { 0 };
	int argc = 0;
	char *save = NULL;
	for (char *t = strtok_r(line, " \t\r\n", &save); t && argc < 8; t = strtok_r(NULL, " \t\r\n", &save))
		argv[argc++] = t;
	pthread_mutex_lock(&fs.mu);
	if (argc >= 1 && strcmp(argv[0], "status") == 0) {
		uint64_t files = 0, dirty = 0;
		for (struct node *n = fs.all; n; n = n->next) {
			files += !n->dir;
			bool d = n->dir_dirty || n->size_dirty;
			for (uint64_t p = 0; !d && p < n->ndirty; p++)
				d = n->dirty[p];
			dirty += d;
		}
		snprintf(out, len, "ok ops %llu files %llu dirty %llu%s", (unsigned long long)fs.ops,
			 (unsigned long long)files, (unsigned long long)dirty, fs.dead ? " dead" : "");
	} else if (argc >= 1 && strcmp(argv[0], "cut") == 0) {
		if (!fs.dead)
			cut(argc > 1, argc > 1 ? strtoull(argv[1], NULL, 10) : 0);
		snprintf(out, len, "ok cut after %llu operations", (unsigned long long)fs.ops);
	} else if (argc >= 2 && strcmp(argv[0], "arm") == 0) {
		fs.arm_at = strtoull(argv[1], NULL, 10);
		fs.arm_torn = argc > 2;
		fs.arm_seed = argc > 2 ? strtoull(argv[2], NULL, 10) : 0;
		snprintf(out, len, "ok armed at %llu from operation %llu", (unsigned long long)fs.arm_at,
			 (unsigned long long)fs.ops);
	} else if (argc == 4 && strcmp(argv[0], "fail") == 0) {
		int k = -1;
		for (int i = 0; i < OP_N; i++)
			if (strcmp(argv[1], op_names[i]) == 0)
				k = i;
		int e = errno_of(argv[3]);
		if (k < 0 || e == 0) {
			snprintf(out, len, "err fail OP N ERRNO: unknown op or errno");
		} else {
			fs.fail_left[k] = strtoull(argv[2], NULL, 10);
			fs.fail_errno[k] = e;
			snprintf(out, len, "ok");
		}
	} else if (argc == 2 && strcmp(argv[0], "space") == 0) {
		fs.space = strtoull(argv[1], NULL, 10);
		snprintf(out, len, "ok");
	} else if (argc == 1 && strcmp(argv[0], "sync") == 0) {
		if (!fs.dead)
			sync_all();
		snprintf(out, len, fs.dead ? "err the power is off" : "ok");
	} else {
		snprintf(out, len, "err unknown command");
	}
	pthread_mutex_unlock(&fs.mu);
}

static void *ctl_main(void *arg)
{
	(void)arg;
	for (;;) {
		int c = accept(fs.ctl_fd, NULL, NULL);
		if (c < 0)
			continue;
		char line[512], out[512];
		ssize_t n = read(c, line, sizeof(line) - 1);
		if (n > 0) {
			line[n] = '\0';
			command(line, out, sizeof(out));
			size_t k = strlen(out);
			out[k++] = '\n';
			(void)!write(c, out, k);
		}
		close(c);
	}
	return NULL;
}

static int ctl_client(const char *sock, int argc, char **argv)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		perror(sock);
		return 1;
	}
	char line[512] = "";
	size_t n = 0;
	for (int i = 0; i < argc; i++)
		n += (size_t)snprintf(line + n, sizeof(line) - n, "%s%s", i ? " " : "", argv[i]);
	if (write(fd, line, strlen(line)) < 0)
		return 1;
	char out[512];
	ssize_t k = read(fd, out, sizeof(out) - 1);
	close(fd);
	if (k <= 0)
		return 1;
	out[k] = '\0';
	fputs(out, stdout);
	return strncmp(out, "ok", 2) == 0 ? 0 : 1;
}

static void *pf_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
	(void)conn;
	cfg->use_ino = 1;
	cfg->hard_remove = 1;
	cfg->nullpath_ok = 1;
	cfg->direct_io = 1;
	cfg->entry_timeout = cfg->attr_timeout = cfg->negative_timeout = 0;
	pthread_t t;
	pthread_create(&t, NULL, ctl_main, NULL);
	pthread_detach(t);
	return NULL;
}

static const struct fuse_operations ops = {
	.init = pf_init,
	.getattr = pf_getattr,
	.readdir = pf_readdir,
	.mkdir = pf_mkdir,
	.create = pf_create,
	.open = pf_open,
	.opendir = pf_opendir,
	.release = pf_release,
	.releasedir = pf_release,
	.read = pf_read,
	.write = pf_write,
	.truncate = pf_truncate,
	.unlink = pf_unlink,
	.rmdir = pf_rmdir,
	.rename = pf_rename,
	.link = pf_link,
	.fsync = pf_fsync,
	.fsyncdir = pf_fsyncdir,
	.statfs = pf_statfs,
	.chmod = pf_chmod,
	.chown = pf_chown,
	.utimens = pf_utimens,
};

int main(int argc, char **argv)
{
	if (argc >= 4 && strcmp(argv[1], "--ctl") == 0)
		return ctl_client(argv[2], argc - 3, argv + 3);
	if (argc < 4) {
		fprintf(stderr, "usage: powerfs BACKING MOUNTPOINT SOCKET [-d]\n"
				"       powerfs --ctl SOCKET COMMAND...\n");
		return 2;
	}
	if (realpath(argv[1], fs.backing) == NULL) {
		perror(argv[1]);
		return 1;
	}
	load();
	fs.ctl_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", argv[3]);
	unlink(argv[3]);
	if (bind(fs.ctl_fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fs.ctl_fd, 8) < 0) {
		perror(argv[3]);
		return 1;
	}
	char *fargv[8] = { argv[0], argv[2], "-f", "-s", "-o", "fsname=powerfs,default_permissions", NULL, NULL };
	int fargc = 6;
	if (argc > 4 && strcmp(argv[4], "-d") == 0)
		fargv[fargc++] = "-d";
	return fuse_main(fargc, fargv, &ops, NULL);
}
