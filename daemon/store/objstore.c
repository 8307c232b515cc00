/* The object-store engine (objstore.h): what S3, GCS and any other object
 * store do alike. docs/architecture.md §5. The dialects (store_s3.c, store_gcs.c) say
 * how they differ.
 *
 * - Small objects go as one PUT; larger ones as a multipart upload whose
 *   parts (part_size, default 64 MiB, at least 5 MiB) are sent in
 *   parallel straight from the caller's pieces (the pool chunks), each with
 *   its CRC32C (the dialect's crc_header). The chunk CRCs the copy pass
 *   computed are combined, not recomputed. Any failure aborts the upload.
 * - Every request is retried on 408, 429, 500, 502, 503, 504, SlowDown,
 *   RequestTimeout, resets and timeouts, with exponential backoff and full
 *   jitter (retry_max_attempts, retry_base_ms, retry_cap_ms); any other
 *   4xx fails at once with the server's code and message (store_error).
 * - Open upload ids go to the journal (store.on_upload); after a crash the
 *   journal aborts them by id (abort_upload). A crash between
 *   CreateMultipartUpload and that record leaves an upload only a bucket
 *   lifecycle rule (AbortIncompleteMultipartUpload) removes.
 *
 * Options: see objstore_open in objstore.h. */
#include "objstore.h"
#include "objstore_int.h"
#include "config.h"
#include "crc32c.h"
#include "creds.h"
#include "grow.h"
#include "http.h"
#include "log.h"
#include "sigv4.h"
#include "xmlmini.h"
#include "macro.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#define MAX_PARTS 10000
#define LIST_MAX_BYTES (16u << 20)
#define MAX_HEADERS OBJSTORE_MAX_HEADERS

static void call_clear(struct objstore_call *c)
{
	for (int i = 0; i < MAX_HEADERS; i++) {
		free(c->h.hdr[i]);
		c->h.hdr[i] = NULL;
	}
	c->h.n = 0;
}

void objstore_call_free(struct objstore_call *c)
{
	call_clear(c);
	http_req_reset(&c->req);
}

static void hex(const unsigned char *in, size_t n, char *out)
{
	static const char d[] = "0123456789abcdef";
	for (size_t i = 0; i < n; i++) {
		out[2 * i] = d[in[i] >> 4];
		out[2 * i + 1] = d[in[i] & 15];
	}
	out[2 * n] = 0;
}

void objstore_crc_b64(uint32_t crc, char out[16])
{
	unsigned char be[4] = { (unsigned char)(crc >> 24), (unsigned char)(crc >> 16), (unsigned char)(crc >> 8),
				(unsigned char)crc };
	EVP_EncodeBlock((unsigned char *)out, be, 4);
}

static int payload_hash(bool sign_payload, const struct iovec *body, size_t n, char out[65])
{
	if (!sign_payload && n > 0) {
		strcpy(out, "UNSIGNED-PAYLOAD");
		return 0;
	}
	unsigned char md[32];
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	if (ctx == NULL)
		return -ENOMEM;
	int ok = EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
	for (size_t i = 0; ok && i < n; i++)
		ok = EVP_DigestUpdate(ctx, body[i].iov_base, body[i].iov_len);
	unsigned int len = 0;
	ok = ok && EVP_DigestFinal_ex(ctx, md, &len);
	EVP_MD_CTX_free(ctx);
	if (!ok)
		return -EIO;
	hex(md, 32, out);
	return 0;
}

int objstore_add_header(struct objstore_hdrs *h, const char *name, const char *value)
{
	if (h->n >= MAX_HEADERS)
		return -E2BIG;
	if (asprintf(&h->hdr[h->n], "%s: %s", name, value) < 0) {
		h->hdr[h->n] = NULL;
		return -ENOMEM;
	}
	h->hdrp[h->n] = h->hdr[h->n];
	h->n++;
	return 0;
}

/* An OAuth token (GCS): no SigV4, and no x-amz-* at all. */
int objstore_sign_bearer(const struct objstore_sign *q)
{
	char bearer[4200];
	snprintf(bearer, sizeof(bearer), "Bearer %s", q->cr->token);
	int r = objstore_add_header(q->out, "host", q->host);
	for (size_t i = 0; i < q->nextra && r == 0; i++)
		r = objstore_add_header(q->out, q->extra[i].name, q->extra[i].value);
	if (r == 0)
		r = objstore_add_header(q->out, "authorization", bearer);
	OPENSSL_cleanse(bearer, sizeof(bearer));
	return r;
}

int objstore_sign_sigv4(const struct objstore_sign *q)
{
	const struct creds *cr = q->cr;
	char ph[65], date[32];
	int r;
	if ((r = payload_hash(q->sign_payload, q->body, q->nbody, ph)) < 0)
		return r;
	time_t now = time(NULL);
	struct tm tm;
	gmtime_r(&now, &tm);
	strftime(date, sizeof(date), "%Y%m%dT%H%M%SZ", &tm);
	struct sigv4_header sh[4 + 3];
	size_t nsh = 0;
	if (q->nextra > 3)
		return -E2BIG;
	sh[nsh++] = (struct sigv4_header){ "host", q->host };
	sh[nsh++] = (struct sigv4_header){ "x-amz-content-sha256", ph };
	sh[nsh++] = (struct sigv4_header){ "x-amz-date", date };
	if (cr->token[0])
		sh[nsh++] = (struct sigv4_header){ "x-amz-security-token", cr->token };
	for (size_t i = 0; i < q->nextra; i++)
		sh[nsh++] = q->extra[i];
	struct sigv4_request sr = { .method = q->method,
				    .path = q->path,
				    .query = q->query,
				    .nquery = q->nquery,
				    .headers = sh,
				    .nheaders = nsh,
				    .payload_sha256 = ph,
				    .amz_date = date,
				    .region = q->region,
				    .service = "s3" };
	char auth[1024];
	if ((r = sigv4_authorization(&sr, cr->access_key, cr->secret_key, auth, sizeof(auth))) < 0)
		return r;
	for (size_t i = 0; i < nsh && r == 0; i++)
		r = objstore_add_header(q->out, sh[i].name, sh[i].value);
	if (r == 0)
		r = objstore_add_header(q->out, "authorization", auth);
	return r;
}

/* Build the URL and the signed headers of one attempt. */
static int sign_call(struct objstore *s, const struct creds *cr, struct objstore_call *c)
{
	call_clear(c);
	char path[2048], enc[6144];
	int r;
	if (c->key)
		r = snprintf(path, sizeof(path), s->path_style ? "/%s/%s" : "/%.0s%s", s->bucket, c->key);
	else
		r = snprintf(path, sizeof(path), s->path_style ? "/%s" : "/%.0s", s->bucket);
	if (r < 0 || (size_t)r >= sizeof(path))
		return -ENAMETOOLONG;
	if (sigv4_uri_encode(path, 1, enc, sizeof(enc)) < 0)
		return -ENAMETOOLONG;
	char host[600];
	if (s->path_style)
		snprintf(host, sizeof(host), "%s", s->host);
	else
		snprintf(host, sizeof(host), "%s.%s", s->bucket, s->host);
	size_t ul = (size_t)snprintf(c->url, sizeof(c->url), "%s://%s%s", s->scheme, host, enc);
	for (size_t i = 0; i < c->nquery; i++) {
		char qn[512], qv[2048];
		if (sigv4_uri_encode(c->query[i].name, 0, qn, sizeof(qn)) < 0 ||
		    sigv4_uri_encode(c->query[i].value ? c->query[i].value : "", 0, qv, sizeof(qv)) < 0)
			return -ENAMETOOLONG;
		ul += (size_t)snprintf(c->url + ul, ul < sizeof(c->url) ? sizeof(c->url) - ul : 0, "%c%s%s%s",
				       i ? '&' : '?', qn, c->query[i].value ? "=" : "", qv);
	}
	if (ul >= sizeof(c->url))
		return -ENAMETOOLONG;
	struct objstore_sign sg = { .cr = cr,
				    .method = c->method,
				    .host = host,
				    .path = path,
				    .query = c->query,
				    .nquery = c->nquery,
				    .extra = c->extra,
				    .nextra = c->nextra,
				    .body = c->body,
				    .nbody = c->nbody,
				    .region = s->region,
				    .sign_payload = s->sign_payload,
				    .out = &c->h };
	if ((r = s->d->sign(&sg)) < 0)
		return r;
	c->h.hdrp[c->h.n] = NULL;
	struct http_req *q = &c->req;
	q->method = c->method;
	q->url = c->url;
	q->headers = c->h.hdrp;
	q->body = c->body;
	q->nbody = c->nbody;
	q->dst = c->dst;
	q->dst_len = c->dst_len;
	q->resp_max = c->resp_max ? c->resp_max : (1u << 20);
	return 0;
}

static bool retryable_status(long st)
{
	return st == 408 || st == 429 || st == 500 || st == 502 || st == 503 || st == 504;
}

/* Judge one finished attempt: 0, 1 (retry) or -errno (with store_set_error). */
static int judge(struct objstore *s, struct objstore_call *c)
{
	struct http_req *q = &c->req;
	char what[1200];
	if (c->label)
		snprintf(what, sizeof(what), "%s", c->label);
	else
		snprintf(what, sizeof(what), "%s %s", c->method, c->key ? c->key : s->bucket);
	if (q->curl_code != 0) {
		if (q->overflow) {
			store_set_error("%s: the response is larger than expected", what);
			return -EFBIG;
		}
		store_set_error("%s: %s", what, q->curl_err);
		return http_curl_retryable(q->curl_code) ? 1 : -EIO;
	}
	if (q->status >= 200 && q->status < 300) {
		/* CompleteMultipartUpload may answer 200 with an error body. */
		if (c->error_in_200 && q->resp && strstr(q->resp, "<Error>")) {
			struct xml_doc d;
			if (xml_parse(q->resp, q->resp_len, &d) == 0) {
				const char *code = xml_first(&d, "Error/Code");
				if (code) {
					const char *msg = xml_first(&d, "Error/Message");
					store_set_error("%s: %s: %s", what, code, msg ? msg : "");
					bool again = !strcmp(code, "SlowDown") || !strcmp(code, "InternalError") ||
						     !strcmp(code, "RequestTimeout");
					xml_free(&d);
					return again ? 1 : -EIO;
				}
				xml_free(&d);
			}
		}
		if (c->dst && q->got != c->dst_len) {
			store_set_error("%s: %zu bytes, expected %zu", what, q->got, c->dst_len);
			return -ENODATA;
		}
		return 0;
	}
	if (q->status == 404 && c->ok_404)
		return 0;
	char code[128] = "", msg[512] = "";
	if (q->resp_len) {
		struct xml_doc d;
		if (xml_parse(q->resp, q->resp_len, &d) == 0) {
			const char *cd = xml_first(&d, "Error/Code"), *m = xml_first(&d, "Error/Message");
			snprintf(code, sizeof(code), "%s", cd ? cd : "");
			snprintf(msg, sizeof(msg), "%s", m ? m : "");
			xml_free(&d);
		}
	}
	store_set_error("%s: HTTP %ld%s%s%s%s", what, q->status, code[0] ? " " : "", code, msg[0] ? ": " : "", msg);
	/* Also: a request signed long before it was sent, or credentials that
	 * expired on the way; the next attempt is signed anew. And S3's 409
	 * ConditionalRequestConflict: a conditional PUT raced another write
	 * of the key; S3 says to retry, and the retry of a create-only PUT
	 * meets 412 if the other one won (then the bytes decide, below). */
	if (retryable_status(q->status) || q->status == 401 || !strcmp(code, "SlowDown") ||
	    !strcmp(code, "RequestTimeout") || !strcmp(code, "RequestTimeTooSkewed") || !strcmp(code, "ExpiredToken") ||
	    !strcmp(code, "ConditionalRequestConflict"))
		return 1;
	switch (q->status) {
	case 403: return -EACCES;
	case 404: return -ENOENT;
	case 412: return -EEXIST; /* a create-only PUT met an existing object */
	case 416: return -ENODATA;
	case 400: return -EINVAL;
	default: return -EIO;
	}
}

static void backoff(const struct objstore *s, unsigned attempt)
{
	uint64_t cap = (uint64_t)s->base_ms << (attempt < 20 ? attempt : 20);
	if (cap > s->cap_ms)
		cap = s->cap_ms;
	uint32_t rnd = 0;
	if (RAND_bytes((unsigned char *)&rnd, sizeof(rnd)) != 1)
		rnd = (uint32_t)rand();
	uint64_t ms = cap ? rnd % (cap + 1) : 0; /* full jitter */
	struct timespec ts = { (time_t)(ms / 1000), (long)(ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

int objstore_run(struct objstore *s, struct objstore_call *calls, size_t n)
{
	struct http_req **reqs = calloc(n ? n : 1, sizeof(*reqs));
	struct objstore_call **pend = calloc(n ? n : 1, sizeof(*pend));
	if (reqs == NULL || pend == NULL) {
		free(reqs);
		free(pend);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++)
		calls[i].result = 1;
	int ret = 0;
	struct creds cr;
	memset(&cr, 0, sizeof(cr));
	for (unsigned attempt = 0; attempt < s->max_attempts; attempt++) {
		size_t np = 0;
		for (size_t i = 0; i < n; i++)
			if (calls[i].result == 1)
				pend[np++] = &calls[i];
		if (np == 0)
			break;
		if (attempt > 0) {
			s->base.retries += np;
			log_debug("%s: retrying %zu request(s), attempt %u: %s", s->base.url, np, attempt + 1,
				  store_error(-EIO));
			backoff(s, attempt);
		}
		char cerr[512];
		int cr_r = creds_get(&s->cp, &cr, cerr, sizeof(cerr));
		if (cr_r < 0) {
			store_set_error("credentials: %s", cerr);
			ret = cr_r;
			goto out;
		}
		for (size_t i = 0; i < np; i++) {
			int r = sign_call(s, &cr, pend[i]);
			if (r < 0) {
				store_set_error("signing %s %s: %s", pend[i]->method, pend[i]->key ? pend[i]->key : "",
						strerror(-r));
				ret = r;
				goto out;
			}
			reqs[i] = &pend[i]->req;
		}
		int r = http_run(s->http, reqs, np);
		if (r < 0) {
			ret = r;
			goto out;
		}
		for (size_t i = 0; i < np; i++) {
			pend[i]->result = judge(s, pend[i]);
			if (pend[i]->result < 0 && ret == 0)
				ret = pend[i]->result;
		}
		if (ret < 0)
			goto out;
	}
	for (size_t i = 0; i < n; i++)
		if (calls[i].result == 1) {
			/* store_error already holds the last attempt's answer. */
			ret = -EIO;
			break;
		}
out:
	creds_clear(&cr);
	free(reqs);
	free(pend);
	return ret;
}

static int full_key(const struct objstore *s, const char *key, char *out, size_t len)
{
	int r = snprintf(out, len, "%s%s%s", s->prefix, s->prefix[0] ? "/" : "", key);
	return r < 0 || (size_t)r >= len ? -ENAMETOOLONG : 0;
}

static void checksum_header(const struct objstore *s, struct objstore_call *c, uint32_t crc, char *buf, size_t len)
{
	if (s->d->crc_header == NULL)
		return;
	char b64[16];
	objstore_crc_b64(crc, b64);
	snprintf(buf, len, "%s%s", s->d->crc_prefix, b64);
	c->extra[c->nextra++] = (struct sigv4_header){ s->d->crc_header, buf };
}

/* Cut the pieces into parts of part_size; a part's CRC combines the
 * pieces' CRCs where it covers whole pieces. */
static int make_parts(const struct objstore *s, const struct iovec *iov, size_t n, const uint32_t *crcs, uint64_t total,
		      struct objstore_part **out, size_t *nout)
{
	size_t np = (size_t)((total + s->part_size - 1) / s->part_size);
	if (np > MAX_PARTS) {
		store_set_error("%" PRIu64 " bytes need %zu parts of %" PRIu64 " bytes, more than %d; raise part_size",
				total, np, s->part_size, MAX_PARTS);
		return -E2BIG;
	}
	struct objstore_part *p = calloc(np, sizeof(*p));
	if (p == NULL)
		return -ENOMEM;
	size_t vi = 0;
	uint64_t voff = 0;
	for (size_t k = 0; k < np; k++) {
		uint64_t want = total - (uint64_t)k * s->part_size < s->part_size ? total - (uint64_t)k * s->part_size
										  : s->part_size;
		/* Slices: at most the pieces it spans. */
		size_t cap = 1;
		for (uint64_t acc = iov[vi].iov_len - voff; acc < want && vi + cap < n; cap++)
			acc += iov[vi + cap].iov_len;
		p[k].iov = calloc(cap, sizeof(struct iovec));
		if (p[k].iov == NULL)
			goto nomem;
		uint32_t crc = 0;
		while (p[k].len < want) {
			uint64_t take = iov[vi].iov_len - voff;
			if (take > want - p[k].len)
				take = want - p[k].len;
			const uint8_t *base = (const uint8_t *)iov[vi].iov_base + voff;
			p[k].iov[p[k].niov++] = (struct iovec){ (void *)base, (size_t)take };
			uint32_t c = (crcs && voff == 0 && take == iov[vi].iov_len)
					     ? crcs[vi]
					     : crc32c_update(0, base, (size_t)take);
			crc = p[k].len ? crc32c_combine(crc, c, take) : c;
			p[k].len += take;
			voff += take;
			if (voff == iov[vi].iov_len) {
				vi++;
				voff = 0;
			}
		}
		p[k].crc = crc;
		snprintf(p[k].num, sizeof(p[k].num), "%zu", k + 1);
	}
	*out = p;
	*nout = np;
	return 0;
nomem:
	for (size_t k = 0; k < np; k++)
		free(p[k].iov);
	free(p);
	return -ENOMEM;
}

static void parts_free(struct objstore_part *p, size_t n)
{
	for (size_t k = 0; p && k < n; k++)
		free(p[k].iov);
	free(p);
}

const struct objstore_dialect *objstore_dialect_of(const struct objstore *s)
{
	return s->d;
}

/* ---- uploads ---- */

static int abort_upload(struct objstore *s, const char *key, const char *upload_id)
{
	/* The failure that led here stays the error to report. */
	char saved[1024] = "";
	bool had = store_has_error();
	if (had)
		snprintf(saved, sizeof(saved), "%s", store_error(-EIO));
	int r = s->d->multipart->abort(s, key, upload_id);
	if (r < 0)
		log_warn("%s: aborting the multipart upload of %s failed: %s", s->base.url, key, store_error(r));
	if (had)
		store_set_error("%s", saved);
	return r;
}

static void tell_upload(struct objstore *s, const char *rel, const char *id, int open)
{
	if (s->base.on_upload)
		s->base.on_upload(s->base.on_upload_ctx, rel, id, open);
}

/* NoSuchUpload on a retried Complete: the attempt whose answer was lost
 * may have completed it. Then the object is there, whole. */
static bool completed_anyway(struct objstore *s, const char *key, uint64_t total)
{
	struct objstore_call h = { .method = "HEAD", .key = key, .ok_404 = true };
	bool there = objstore_run(s, &h, 1) == 0 && h.req.status == 200 && h.req.content_length == (int64_t)total;
	objstore_call_free(&h);
	if (there)
		log_warn("%s: CompleteMultipartUpload of %s answered NoSuchUpload, but the object is there with all "
			 "%" PRIu64 " bytes: an earlier attempt completed it",
			 s->base.url, key, total);
	return there;
}

static int put_multipart(struct objstore *s, const char *rel, const char *key, const struct iovec *iov, size_t n,
			 const uint32_t *crcs, uint64_t total)
{
	const struct objstore_multipart *mp = s->d->multipart;
	struct objstore_part *parts = NULL;
	size_t np = 0;
	int r = make_parts(s, iov, n, crcs, total, &parts, &np);
	if (r < 0)
		return r;
	char upload_id[1024] = "";
	r = mp->begin(s, key, upload_id, sizeof(upload_id));
	if (r < 0) {
		parts_free(parts, np);
		return r;
	}
	/* Journaled before any part: a crash from here on is undone by id. */
	tell_upload(s, rel, upload_id, 1);
	struct objstore_call *pc = calloc(np, sizeof(*pc));
	if (pc == NULL) {
		r = -ENOMEM;
		goto abort;
	}
	for (size_t k = 0; k < np; k++) {
		struct objstore_call *x = &pc[k];
		x->key = key;
		mp->part(x, &parts[k], upload_id);
		checksum_header(s, x, parts[k].crc, parts[k].crchdr, sizeof(parts[k].crchdr));
		x->body = parts[k].iov;
		x->nbody = parts[k].niov;
	}
	/* In windows, each signed just before it goes: a signature (and a
	 * token) must not age while thousands of parts wait their turn. */
	size_t win = (size_t)s->concurrency * 2;
	for (size_t k = 0; k < np && r == 0; k += win)
		r = objstore_run(s, pc + k, np - k < win ? np - k : win);
	if (r < 0)
		goto abort;
	if (s->base.debug_delay_ms)
		usleep(s->base.debug_delay_ms * 1000u); /* tests: a window to crash in with the upload open */
	r = mp->complete(s, key, upload_id, parts, pc, np);
	if (r == -ENOENT && completed_anyway(s, key, total)) {
		store_clear_error();
		r = 0;
	}
	if (r < 0)
		goto abort;
	for (size_t k = 0; k < np; k++)
		objstore_call_free(&pc[k]);
	free(pc);
	parts_free(parts, np);
	tell_upload(s, rel, upload_id, 0);
	return 0;
abort:
	if (pc)
		for (size_t k = 0; k < np; k++)
			objstore_call_free(&pc[k]);
	free(pc);
	parts_free(parts, np);
	if (abort_upload(s, key, upload_id) == 0)
		tell_upload(s, rel, upload_id, 0);
	return r;
}

/* A create-only PUT answered 412: if the object there holds exactly the
 * bytes sent, an earlier attempt of this very PUT made it (its answer was
 * lost and the retry met it), and the create succeeded. */
static bool created_by_us(struct objstore *s, const char *key, const struct iovec *iov, size_t n, uint64_t total)
{
	struct objstore_call c = { .method = "GET", .key = key, .resp_max = total ? (size_t)total : 1 };
	char saved[1024];
	snprintf(saved, sizeof(saved), "%s", store_error(-EEXIST));
	bool same = objstore_run(s, &c, 1) == 0 && c.req.resp_len == total;
	for (size_t i = 0, off = 0; same && i < n; off += iov[i].iov_len, i++)
		same = memcmp(c.req.resp + off, iov[i].iov_base, iov[i].iov_len) == 0;
	objstore_call_free(&c);
	store_set_error("%s", saved);
	if (same)
		log_info("%s: create-only PUT of %s met its own earlier attempt", s->base.url, key);
	return same;
}

/* One PUT: for a create, conditional (the dialect's create_only header: S3
 * If-None-Match: *; GCS, whose XML multipart uploads take no
 * preconditions, x-goog-if-generation-match: 0). */
static int put_single(struct objstore *s, const char *fk, const struct iovec *iov, size_t n, const uint32_t *crcs,
		      uint64_t total, bool excl)
{
	uint32_t crc = 0;
	for (size_t i = 0; i < n; i++) {
		uint32_t c = crcs ? crcs[i] : crc32c_update(0, iov[i].iov_base, iov[i].iov_len);
		crc = i ? crc32c_combine(crc, c, iov[i].iov_len) : c;
	}
	char ch[48];
	struct objstore_call c = { .method = "PUT", .key = fk, .body = iov, .nbody = n };
	checksum_header(s, &c, crc, ch, sizeof(ch));
	if (excl)
		c.extra[c.nextra++] = s->d->create_only;
	int r = objstore_run(s, &c, 1);
	objstore_call_free(&c);
	if (r == -EEXIST && created_by_us(s, fk, iov, n, total)) {
		store_clear_error();
		r = 0;
	}
	return r;
}

static int obj_write(struct store *base, const char *key, const struct iovec *iov, size_t n, const uint32_t *crcs,
		     bool excl)
{
	store_clear_error();
	struct objstore *s = (struct objstore *)base;
	char fk[1024];
	int r = full_key(s, key, fk, sizeof(fk));
	if (r < 0)
		return r;
	uint64_t total = 0;
	for (size_t i = 0; i < n; i++)
		total += iov[i].iov_len;
	if (excl && total > (5ull << 30)) {
		store_set_error("PUT %s: a create-only object of %" PRIu64 " bytes is over one PUT's 5 GiB", fk, total);
		return -EFBIG;
	}
	if (!excl && total > s->part_size)
		return put_multipart(s, key, fk, iov, n, crcs, total);
	return put_single(s, fk, iov, n, crcs, total, excl);
}

static int obj_put(struct store *base, const char *key, const struct iovec *iov, size_t n, const uint32_t *crcs)
{
	return obj_write(base, key, iov, n, crcs, false);
}

static int obj_create(struct store *base, const char *key, const struct iovec *iov, size_t n, const uint32_t *crcs)
{
	return obj_write(base, key, iov, n, crcs, true);
}

static int obj_get_range(struct store *base, const char *key, uint64_t off, void *buf, size_t len)
{
	store_clear_error();
	struct objstore *s = (struct objstore *)base;
	char fk[1024], range[64];
	int r = full_key(s, key, fk, sizeof(fk));
	if (r < 0)
		return r;
	if (len == 0)
		return 0;
	snprintf(range, sizeof(range), "bytes=%" PRIu64 "-%" PRIu64, off, off + len - 1);
	struct objstore_call c = { .method = "GET", .key = fk, .dst = buf, .dst_len = len };
	c.extra[c.nextra++] = (struct sigv4_header){ "range", range };
	r = objstore_run(s, &c, 1);
	if (r == 0 && c.req.status != 206 && off != 0) {
		/* A server that ignored Range sent the object's start. */
		store_set_error("GET %s bytes %s: HTTP %ld instead of 206", fk, range + 6, c.req.status);
		r = -EIO;
	}
	objstore_call_free(&c);
	return r == -EFBIG ? -EIO : r;
}

static int obj_get_all(struct store *base, const char *key, size_t max, void **buf, size_t *len)
{
	store_clear_error();
	struct objstore *s = (struct objstore *)base;
	char fk[1024];
	int r = full_key(s, key, fk, sizeof(fk));
	if (r < 0)
		return r;
	struct objstore_call c = { .method = "GET", .key = fk, .resp_max = max ? max : 1 };
	r = objstore_run(s, &c, 1);
	if (r == 0) {
		*buf = c.req.resp ? c.req.resp : calloc(1, 1);
		*len = c.req.resp_len;
		c.req.resp = NULL;
		if (*buf == NULL)
			r = -ENOMEM;
	}
	objstore_call_free(&c);
	return r;
}

static int push_entry(struct store_entry **v, size_t *n, size_t *cap, const char *name, size_t len, bool dir)
{
	if (GROW(*v, *cap, *n + 1, 64) < 0)
		return -ENOMEM;
	struct store_entry *e = &(*v)[*n];
	*e = (struct store_entry){ .dir = dir };
	if ((e->name = strndup(name, len)) == NULL)
		return -ENOMEM;
	(*n)++;
	return 0;
}

static int cmp_entry(const void *a, const void *b)
{
	return strcmp(((const struct store_entry *)a)->name, ((const struct store_entry *)b)->name);
}

/* One page of a listing (objstore.h). */
int objstore_list_page(const struct objstore_listing *ls, const char *fp, const char *resp, size_t len,
		       const char *label, struct store_entry **v, size_t *n, size_t *cap, char *token, size_t toklen,
		       bool *truncated)
{
	struct xml_doc d = { 0 };
	if (xml_parse(resp ? resp : "", resp ? len : 0, &d) < 0) {
		store_set_error("%s: malformed XML", label);
		return -EPROTO;
	}
	size_t fpl = strlen(fp);
	int r = 0;
	*truncated = false;
	token[0] = 0;
	struct store_entry *cur = NULL; /* the Contents element being read */
	for (size_t i = 0; i < d.n && r == 0; i++) {
		const char *p = d.items[i].path, *t = d.items[i].text;
		bool key = !strcmp(p, ls->key);
		if (key || !strcmp(p, ls->common_prefix)) {
			cur = NULL;
			if (strncmp(t, fp, fpl) != 0)
				continue;
			size_t l = strlen(t + fpl);
			if (l && t[fpl + l - 1] == '/')
				l--;
			if (l == 0 || memchr(t + fpl, '/', l) != NULL)
				continue;
			r = push_entry(v, n, cap, t + fpl, l, !key);
			if (r == 0 && key)
				cur = &(*v)[*n - 1];
		} else if (cur && !strcmp(p, ls->size)) {
			char *end = NULL;
			errno = 0;
			cur->size = strtoull(t, &end, 10);
			if (end == t || *end || errno || t[0] == '-') {
				store_set_error("%s: %s has the size '%.40s'", label, cur->name, t);
				r = -EPROTO;
			}
		} else if (cur && !strcmp(p, ls->mtime)) {
			cur->mtime_ns = ls->parse_time ? ls->parse_time(t) : store_parse_time(t);
		} else if (ls->truncated && !strcmp(p, ls->truncated)) {
			*truncated = !strcmp(t, "true");
		} else if (!strcmp(p, ls->next_token)) {
			snprintf(token, toklen, "%s", t);
		}
	}
	xml_free(&d);
	if (ls->truncated == NULL)
		*truncated = token[0] != 0;
	return r;
}

/* The dialect's listing (ListObjectsV2) with delimiter '/', every page:
 * one request per 1000 names (list_page for tests). A key and a common
 * prefix of one name (an object "a" beside "a/...") are one entry, the
 * object's. */
static int obj_list_entries(struct store *base, const char *prefix, struct store_entry **out, size_t *n)
{
	store_clear_error();
	struct objstore *s = (struct objstore *)base;
	char fp[1024];
	int r;
	if (prefix[0])
		r = snprintf(fp, sizeof(fp), "%s%s%s/", s->prefix, s->prefix[0] ? "/" : "", prefix);
	else
		r = snprintf(fp, sizeof(fp), "%s%s", s->prefix, s->prefix[0] ? "/" : "");
	if (r < 0 || (size_t)r >= sizeof(fp))
		return -ENAMETOOLONG;
	size_t cap = 0;
	struct store_entry *v = NULL;
	*n = 0;
	char token[2048] = "", label[1100];
	const struct objstore_listing *ls = s->d->listing;
	snprintf(label, sizeof(label), "%s %s", ls->label, fp);
	for (;;) {
		struct objstore_call c = { .method = "GET", .key = NULL, .resp_max = LIST_MAX_BYTES, .label = label };
		for (size_t i = 0; i < 2 && ls->fixed[i].name; i++)
			c.query[c.nquery++] = ls->fixed[i];
		c.query[c.nquery++] = (struct sigv4_header){ ls->prefix_param, fp };
		c.query[c.nquery++] = (struct sigv4_header){ ls->delimiter_param, "/" };
		if (token[0])
			c.query[c.nquery++] = (struct sigv4_header){ ls->token_param, token };
		char page[16];
		snprintf(page, sizeof(page), "%u", base->list_page ? base->list_page : s->list_page);
		if (s->list_page || base->list_page)
			c.query[c.nquery++] = (struct sigv4_header){ ls->page_param, page };
		r = objstore_run(s, &c, 1);
		bool truncated = false;
		if (r == 0)
			r = objstore_list_page(ls, fp, c.req.resp, c.req.resp_len, label, &v, n, &cap, token,
					       sizeof(token), &truncated);
		objstore_call_free(&c);
		if (r < 0)
			goto fail;
		if (!truncated || !token[0])
			break;
	}
	if (*n == 0) {
		free(v);
		return -ENOENT;
	}
	/* Times decide retention and which attempt completed first: an object
	 * listed without one is an error, never the epoch. */
	for (size_t i = 0; i < *n; i++)
		if (!v[i].dir && v[i].mtime_ns <= 0) {
			store_set_error("%s: %s is listed without a time that parses", label, v[i].name);
			r = -EPROTO;
			goto fail;
		}
	qsort(v, *n, sizeof(*v), cmp_entry);
	size_t w = 0;
	for (size_t i = 0; i < *n; i++) {
		if (w > 0 && strcmp(v[w - 1].name, v[i].name) == 0) {
			if (v[w - 1].dir && !v[i].dir) {
				free(v[w - 1].name);
				v[w - 1] = v[i];
			} else {
				free(v[i].name);
			}
			continue;
		}
		v[w++] = v[i];
	}
	*n = w;
	*out = v;
	return 0;
fail:
	store_entries_free(v, *n);
	*n = 0;
	return r;
}

static int obj_list(struct store *base, const char *prefix, char ***names, size_t *n)
{
	struct store_entry *v = NULL;
	size_t k = 0;
	int r = obj_list_entries(base, prefix, &v, &k);
	return r < 0 ? r : store_entries_to_names(v, k, names, n);
}

static int obj_remove(struct store *base, const char *key)
{
	store_clear_error();
	struct objstore *s = (struct objstore *)base;
	char fk[1024];
	int r = full_key(s, key, fk, sizeof(fk));
	if (r < 0)
		return r;
	/* DELETE answers 204 for a missing key too; the contract wants ENOENT. */
	struct objstore_call h = { .method = "HEAD", .key = fk, .ok_404 = true };
	r = objstore_run(s, &h, 1);
	long st = h.req.status;
	objstore_call_free(&h);
	if (r < 0)
		return r;
	if (st == 404)
		return -ENOENT;
	struct objstore_call c = { .method = "DELETE", .key = fk, .ok_404 = true };
	r = objstore_run(s, &c, 1);
	objstore_call_free(&c);
	return r;
}

static int obj_remove_dir(struct store *base, const char *prefix)
{
	(void)base;
	(void)prefix;
	return 0; /* no directories in an object store */
}

static int obj_remove_temps(struct store *base, const char *key)
{
	/* No temporary objects: an upload is invisible until completed. Open
	 * uploads are aborted by id from the journal (abort_upload), never by
	 * listing the key, which could abort another node's upload of the
	 * same key. */
	(void)base;
	(void)key;
	return 0;
}

static int obj_abort_upload(struct store *base, const char *key, const char *upload_id)
{
	struct objstore *s = (struct objstore *)base;
	char fk[1024];
	store_clear_error();
	int r = full_key(s, key, fk, sizeof(fk));
	return r < 0 ? r : abort_upload(s, fk, upload_id);
}

static void obj_free(struct store *base)
{
	struct objstore *s = (struct objstore *)base;
	http_free(s->http);
	if (s->have_cp)
		creds_fini(&s->cp);
	free(s);
}

static const struct store_ops obj_ops = {
	.put = obj_put,
	.create = obj_create,
	.get_range = obj_get_range,
	.get_all = obj_get_all,
	.list = obj_list,
	.list_entries = obj_list_entries,
	.remove = obj_remove,
	.remove_dir = obj_remove_dir,
	.remove_temps = obj_remove_temps,
	.abort_upload = obj_abort_upload,
	.free = obj_free,
};

int objstore_check(const struct store_scheme *row, const char *url, char *err, size_t errlen)
{
	struct objstore *s = calloc(1, sizeof(*s));
	if (s == NULL)
		return -ENOMEM;
	struct http_opts ho;
	char ca[1024] = "";
	int r = objstore_parse_url(s, row, url, &ho, ca, sizeof(ca), err, errlen);
	free(s);
	return r;
}

int objstore_open(const struct store_scheme *row, const char *url, struct store **out, char *err, size_t errlen)
{
	struct objstore *s = calloc(1, sizeof(*s));
	if (s == NULL)
		return -ENOMEM;
	struct http_opts ho;
	char ca[1024] = "";
	int r = objstore_parse_url(s, row, url, &ho, ca, sizeof(ca), err, errlen);
	if (r < 0)
		goto fail;
	s->base.ops = &obj_ops;
	ho.ca_bundle = ca[0] ? ca : NULL;
	r = http_init(&s->http, &ho, err, errlen);
	if (r < 0)
		goto fail;
	r = s->d->creds_init(&s->cp, s->http, err, errlen);
	if (r < 0)
		goto fail;
	s->have_cp = true;
	snprintf(s->base.cred_source, sizeof(s->base.cred_source), "%s", s->cp.cur.source);
	/* The URL shown in status and logs: no query, nothing secret. */
	snprintf(s->base.url, sizeof(s->base.url), "%s://%s%s%s", row->scheme, s->bucket, s->prefix[0] ? "/" : "",
		 s->prefix);
	log_info("storage %s: endpoint %s://%s%s, region %s, part size %" PRIu64 " MiB, %u connections, "
		 "credentials from %s",
		 s->base.url, s->scheme, s->host, s->path_style ? " (path style)" : "", s->region, s->part_size >> 20,
		 s->concurrency, s->cp.cur.source);
	*out = &s->base;
	return 0;
fail:
	http_free(s->http);
	free(s);
	return r;
}
