/* Storage backends behind one synchronous interface. Calls block and run on
 * worker threads, never on the loop. Keys are '/'-separated paths relative to
 * the storage root. Every function returns 0 or -errno. */
#ifndef CKPTD_STORE_H
#define CKPTD_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

struct store;

/* One name under a listed prefix. */
struct store_entry {
	char *name;
	uint64_t size;    /* bytes; 0 for a "directory" */
	int64_t mtime_ns; /* last modified (S3/GCS: LastModified); 0 if unknown */
	bool dir;         /* a common prefix (object stores) or a directory */
};

struct store_ops {
	/* Write key from n pieces; the key becomes visible only complete and
	 * durable (or not at all). crcs: the CRC32C of each piece, or NULL
	 * (object stores send per-part checksums). */
	int (*put)(struct store *s, const char *key, const struct iovec *iov, size_t n, const uint32_t *crcs);
	/* put, but create-only: -EEXIST, and nothing written, when key exists.
	 * Atomic against every other writer of key, on every node: file://
	 * links the temporary to its name (or renameat2 RENAME_NOREPLACE), S3
	 * sends If-None-Match: *, GCS x-goog-if-generation-match: 0. */
	int (*create)(struct store *s, const char *key, const struct iovec *iov, size_t n, const uint32_t *crcs);
	/* Read exactly len bytes at off; -ENODATA if the object is shorter. */
	int (*get_range)(struct store *s, const char *key, uint64_t off, void *buf, size_t len);
	/* Read a whole (small) object; -EFBIG if it is larger than max. */
	int (*get_all)(struct store *s, const char *key, size_t max, void **buf, size_t *len);
	/* Names directly under prefix (a "directory"), malloc'd; -ENOENT if none. */
	int (*list)(struct store *s, const char *prefix, char ***names, size_t *n);
	/* The same with sizes and times: one paginated LIST on object stores
	 * (1 request per 1000 names), a readdir and a stat per name on files. */
	int (*list_entries)(struct store *s, const char *prefix, struct store_entry **out, size_t *n);
	/* Remove key; -ENOENT if it was not there. */
	int (*remove)(struct store *s, const char *key);
	/* Remove an empty "directory" prefix (a no-op where there are none). */
	int (*remove_dir)(struct store *s, const char *prefix);
	/* Remove this node's temporary files of key (left by a crash);
	 * returns how many. */
	int (*remove_temps)(struct store *s, const char *key);
	/* Object stores (else NULL): abort multipart upload upload_id of key;
	 * 0 also when it is gone already. */
	int (*abort_upload)(struct store *s, const char *key, const char *upload_id);
	void (*free)(struct store *s);
};

struct store {
	const struct store_ops *ops;
	const char *backend; /* the scheme row's label: "file", "s3", "gcs" */
	char url[1024];
	unsigned debug_delay_ms; /* tests only: pause in the middle of a put */
	unsigned file_mode;      /* file://: mode of new files (directories: x where r); 0600 */
	char cred_source[160];   /* where credentials came from, for status; "" */
	/* Told when a multipart upload of key opens (open 1) and when it is
	 * completed or aborted (0), so the journal can abort it after a crash.
	 * Called on the uploading thread; may be NULL. */
	void (*on_upload)(void *ctx, const char *key, const char *upload_id, int open);
	void *on_upload_ctx;
	/* Told before a write outside an upload (a step's commit or index:
	 * store_create_announced) that key's temporary may be left by a crash
	 * (begin: 0 and *id, or -errno: then the write is not made), and after
	 * (end), so that the next start removes such leftovers (the journal).
	 * May be NULL. */
	int (*on_temp_begin)(void *ctx, const char *key, uint64_t *id);
	void (*on_temp_end)(void *ctx, uint64_t id);
	void *on_temp_ctx;
	unsigned list_page;                      /* names a listing page asks for; 0: the backend's (probe.c) */
	_Atomic unsigned long retries;           /* requests retried (object stores) */
	_Atomic unsigned long long direct_bytes; /* written with O_DIRECT (file://) */
};

/* One row of the scheme table (backends.c): a URL scheme and the backend
 * that serves it. A new backend is a new row (and its open function, or a
 * new objstore dialect). */
struct store_scheme {
	const char *scheme;  /* before "://" */
	const char *label;   /* for metrics and status: "file", "s3", "gcs" */
	const char *example; /* after "://", for the unknown-scheme error */
	bool options;        /* takes the config's [storage] options */
	int (*open)(const struct store_scheme *row, const char *url, struct store **out, char *err, size_t errlen);
	const void *dialect; /* the open function's own data (objstore.h), or NULL */
	/* What open would refuse in url (path, bucket, every option), with no
	 * I/O: for --check-config. 0, or -errno with err naming the part. */
	int (*check)(const struct store_scheme *row, const char *url, char *err, size_t errlen);
};

/* The rest: store_util.c, which every backend may call. */
/* "2009-10-12T17:50:30.000Z" (ISO 8601, UTC) -> ns since the epoch; 0 if it
 * does not parse. */
int64_t store_parse_time(const char *t);
void store_free(struct store *s);
/* ops->create of key, announced to on_temp_begin/on_temp_end when set. */
int store_create_announced(struct store *s, const char *key, const struct iovec *iov, int iovcnt);
/* The same with ops->put: key written anew (its time too) if it exists. */
int store_put_announced(struct store *s, const char *key, const struct iovec *iov, int iovcnt);
void store_names_free(char **names, size_t n);
void store_entries_free(struct store_entry *v, size_t n);
/* Keep the names of v (which it frees): for list() built on a listing. */
int store_entries_to_names(struct store_entry *v, size_t n, char ***names, size_t *count);

/* file:///abs/path (store_fs.c). */
int store_fs_open(const struct store_scheme *row, const char *url, struct store **out, char *err, size_t errlen);
int store_fs_check(const struct store_scheme *row, const char *url, char *err, size_t errlen);

/* A backend's words for its last failure on this thread (the server's
 * error code and message), else strerror(-r). */
const char *store_error(int r);
void store_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void store_clear_error(void);
bool store_has_error(void);

#endif
