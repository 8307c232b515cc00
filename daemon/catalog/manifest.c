#include "manifest.h"
#include "pieces.h"
#include "planecodec.h"
#include "tensor.h"

#include <errno.h>
#include <stdbool.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int manifest_step_dir(char *out, size_t cap, const char *job, uint64_t step)
{
	int n = snprintf(out, cap, "%s/step-%012" PRIu64, job, step);
	return (n < 0 || (size_t)n >= cap) ? -ENAMETOOLONG : 0;
}

int manifest_refs_dir(char *out, size_t cap, const char *job, uint64_t step)
{
	int n = snprintf(out, cap, "%s/" REFS_DIR "/step-%012" PRIu64, job, step);
	return (n < 0 || (size_t)n >= cap) ? -ENAMETOOLONG : 0;
}

int manifest_ref_key(char *out, size_t cap, const char *job, uint64_t step, uint64_t target, uint32_t rank,
		     uint32_t world_size, const char *attempt)
{
	int n = snprintf(out, cap,
			 "%s/" REFS_DIR "/step-%012" PRIu64 "/step-%012" PRIu64 "/rank-%05" PRIu32 "-of-%05" PRIu32
			 ".%s",
			 job, step, target, rank, world_size, attempt);
	return (n < 0 || (size_t)n >= cap) ? -ENAMETOOLONG : 0;
}

int manifest_key(char *out, size_t cap, const char *job, uint64_t step, uint32_t rank, uint32_t world_size,
		 const char *ext)
{
	int n = snprintf(out, cap, "%s/step-%012" PRIu64 "/rank-%05" PRIu32 "-of-%05" PRIu32 ".%s", job, step, rank,
			 world_size, ext);
	return (n < 0 || (size_t)n >= cap) ? -ENAMETOOLONG : 0;
}

int manifest_key_attempt(char *out, size_t cap, const char *job, uint64_t step, uint32_t rank, uint32_t world_size,
			 const char *attempt)
{
	int n = snprintf(out, cap, "%s/step-%012" PRIu64 "/rank-%05" PRIu32 "-of-%05" PRIu32 ".%s.manifest", job, step,
			 rank, world_size, attempt);
	return (n < 0 || (size_t)n >= cap) ? -ENAMETOOLONG : 0;
}

int manifest_spread_dir(char *out, size_t cap, uint32_t rank, uint64_t step)
{
	int n = snprintf(out, cap, "shards/%02x/step-%012" PRIu64, rank % SPREAD_FANOUT, step);
	return (n < 0 || (size_t)n >= cap) ? -ENAMETOOLONG : 0;
}

int manifest_shard_key(char *out, size_t cap, const char *job, uint64_t step, uint32_t rank, uint32_t world_size,
		       const char *attempt, uint64_t nonce, bool spread)
{
	char dir[64];
	int n = spread ? manifest_spread_dir(dir, sizeof(dir), rank, step)
		       : snprintf(dir, sizeof(dir), "step-%012" PRIu64, step);
	if (n < 0)
		return -ENAMETOOLONG;
	n = snprintf(out, cap, "%s/%s/rank-%05" PRIu32 "-of-%05" PRIu32 ".%s.%016" PRIx64 ".shard", job, dir, rank,
		     world_size, attempt, nonce);
	return (n < 0 || (size_t)n >= cap) ? -ENAMETOOLONG : 0;
}

int manifest_commit_key(char *out, size_t cap, const char *job, uint64_t step)
{
	int n = snprintf(out, cap, "%s/step-%012" PRIu64 "/" COMMIT_NAME, job, step);
	return (n < 0 || (size_t)n >= cap) ? -ENAMETOOLONG : 0;
}

int manifest_index_key(char *out, size_t cap, const char *job, uint64_t step)
{
	int n = snprintf(out, cap, "%s/step-%012" PRIu64 "/" INDEX_NAME, job, step);
	return (n < 0 || (size_t)n >= cap) ? -ENAMETOOLONG : 0;
}

static int parse_digits(const char *s, size_t n, uint64_t *out)
{
	uint64_t v = 0;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -EINVAL;
		if (v > (UINT64_MAX - 9) / 10)
			return -ERANGE;
		v = v * 10 + (uint64_t)(s[i] - '0');
	}
	*out = v;
	return 0;
}

int manifest_parse_step_dir(const char *name, uint64_t *step)
{
	if (strncmp(name, "step-", 5) != 0)
		return -EINVAL;
	size_t n = strlen(name + 5);
	if (n < 12 || n > 20)
		return -EINVAL;
	return parse_digits(name + 5, n, step);
}

static bool ends_with(const char *s, size_t len, const char *suffix)
{
	size_t k = strlen(suffix);
	return len >= k && memcmp(s + len - k, suffix, k) == 0;
}

static bool is_hex(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
	return true;
}

void manifest_parse_object(const char *name, struct step_name *out)
{
	memset(out, 0, sizeof(*out));
	size_t len = strlen(name);
	if (strcmp(name, COMMIT_NAME) == 0) {
		out->kind = OBJ_COMMIT;
		return;
	}
	if (strcmp(name, INDEX_NAME) == 0) {
		out->kind = OBJ_INDEX;
		return;
	}
	/* rank-RRRRR-of-WWWWW then '.' */
	uint64_t r, w;
	if (len < 20 || strncmp(name, "rank-", 5) != 0 || strncmp(name + 10, "-of-", 4) != 0 || name[19] != '.' ||
	    parse_digits(name + 5, 5, &r) < 0 || parse_digits(name + 14, 5, &w) < 0 || w == 0 || r >= w)
		return;
	const char *rest = name + 20;
	size_t rl = len - 20;
	enum step_obj kind;
	if (ends_with(rest, rl, "manifest")) {
		kind = OBJ_MANIFEST;
		rl -= strlen("manifest");
	} else if (ends_with(rest, rl, "shard")) {
		kind = OBJ_SHARD;
		rl -= strlen("shard");
	} else {
		return;
	}
	/* rest[0, rl) is "" (format 1) or "<attempt>." / "<attempt>.<nonce>." */
	if (rl > 0) {
		if (rest[rl - 1] != '.')
			return;
		rl--;
		if (kind == OBJ_SHARD) {
			if (rl < MANIFEST_NONCE_HEX + 2 || rest[rl - MANIFEST_NONCE_HEX - 1] != '.' ||
			    !is_hex(rest + rl - MANIFEST_NONCE_HEX, MANIFEST_NONCE_HEX))
				return;
			rl -= MANIFEST_NONCE_HEX + 1;
		}
		if (rl == 0 || rl > ATTEMPT_MAX_LEN)
			return;
		memcpy(out->attempt, rest, rl);
		out->attempt[rl] = '\0';
		if (!manifest_name_valid(out->attempt, ATTEMPT_MAX_LEN)) {
			out->attempt[0] = '\0';
			return;
		}
	}
	out->kind = kind;
	out->rank = (uint32_t)r;
	out->world_size = (uint32_t)w;
}

int manifest_shard_of(const Ckpt__Manifest *m, char *out, size_t cap)
{
	struct step_name sn;
	manifest_parse_object(m->shard_name, &sn);
	if (sn.kind != OBJ_SHARD || sn.rank != m->rank || sn.world_size != m->world_size ||
	    (sn.attempt[0] && strcmp(sn.attempt, m->attempt_id) != 0))
		return -EBADMSG;
	if (m->shard_dir[0] == '\0') {
		int n = snprintf(out, cap, "%s/step-%012" PRIu64 "/%s", m->job, m->step, m->shard_name);
		return (n < 0 || (size_t)n >= cap) ? -ENAMETOOLONG : 0;
	}
	char dir[64];
	if (sn.attempt[0] == '\0' || manifest_spread_dir(dir, sizeof(dir), m->rank, m->step) < 0 ||
	    strcmp(dir, m->shard_dir) != 0)
		return -EBADMSG;
	int n = snprintf(out, cap, "%s/%s/%s", m->job, dir, m->shard_name);
	return (n < 0 || (size_t)n >= cap) ? -ENAMETOOLONG : 0;
}

int manifest_shard_ref(const Ckpt__Manifest *m, char *out, size_t cap)
{
	int n = m->shard_dir[0] ? snprintf(out, cap, "%s/%s", m->shard_dir, m->shard_name)
				: snprintf(out, cap, "step-%012" PRIu64 "/%s", m->step, m->shard_name);
	return (n < 0 || (size_t)n >= cap) ? -ENAMETOOLONG : 0;
}

int manifest_ref_check(const Ckpt__Manifest *m, const char *ref, uint64_t *step)
{
	const char *name = strrchr(ref, '/');
	if (name == NULL)
		return -EBADMSG;
	name++;
	struct step_name sn;
	manifest_parse_object(name, &sn);
	if (sn.kind != OBJ_SHARD || sn.attempt[0] == '\0' || sn.rank != m->rank || sn.world_size != m->world_size)
		return -EBADMSG;
	/* The directory: "step-<12>" or "shards/<hh>/step-<12>". */
	size_t dlen = (size_t)(name - 1 - ref);
	char dir[64];
	if (dlen >= sizeof(dir))
		return -EBADMSG;
	memcpy(dir, ref, dlen);
	dir[dlen] = '\0';
	const char *sd = strncmp(dir, "shards/", 7) == 0 ? strrchr(dir, '/') + 1 : dir;
	uint64_t t;
	if (manifest_parse_step_dir(sd, &t) < 0 || t >= m->step)
		return -EBADMSG;
	char want[64];
	if (sd != dir && (manifest_spread_dir(want, sizeof(want), m->rank, t) < 0 || strcmp(want, dir) != 0))
		return -EBADMSG;
	if (sd == dir) {
		snprintf(want, sizeof(want), "step-%012" PRIu64, t);
		if (strcmp(want, dir) != 0)
			return -EBADMSG;
	}
	*step = t;
	return 0;
}

int manifest_name_valid(const char *s, size_t max)
{
	size_t n = strlen(s);
	/* ".." anywhere: storage keys refuse it (store_fs), so a name with it
	 * would be staged and then fail at upload. */
	if (n == 0 || n > max || s[0] == '.' || strstr(s, "..") != NULL)
		return 0;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
		      c == '_' || c == '-'))
			return 0;
	}
	return 1;
}

static const char *marker_attempt(const char *name, const char *base)
{
	size_t n = strlen(base);
	if (strncmp(name, base, n) != 0 || name[n] != '.' || !manifest_name_valid(name + n + 1, ATTEMPT_MAX_LEN))
		return NULL;
	return name + n + 1;
}

const char *manifest_kept_attempt(const char *name)
{
	return marker_attempt(name, KEPT_NAME);
}

const char *manifest_dead_attempt(const char *name)
{
	return marker_attempt(name, DEAD_NAME);
}

bool manifest_is_marker(const char *name)
{
	return strcmp(name, KEPT_NAME) == 0 || strcmp(name, LEFT_NAME) == 0 || manifest_kept_attempt(name) != NULL ||
	       manifest_dead_attempt(name) != NULL;
}

int manifest_job_valid(const char *job)
{
	const char *slash = strchr(job, '/');
	if (slash == NULL)
		return manifest_name_valid(job, JOB_MAX_LEN);
	size_t t = (size_t)(slash - job);
	if (t == 0 || strlen(job) > JOB_MAX_LEN ||
	    strspn(job, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != t)
		return 0;
	return manifest_name_valid(slash + 1, JOB_MAX_LEN);
}

static int cmp_str_ptr(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int cmp_tensor_offset(const void *a, const void *b)
{
	const Ckpt__ManifestTensor *x = *(Ckpt__ManifestTensor *const *)a, *y = *(Ckpt__ManifestTensor *const *)b;
	return x->shard_offset < y->shard_offset ? -1 : x->shard_offset > y->shard_offset;
}

/* Tensors must not share shard bytes (verify walks them in order). */
static int check_disjoint(const Ckpt__Manifest *m, char *err, size_t errlen)
{
	if (m->n_tensors < 2)
		return 0;
	Ckpt__ManifestTensor **t = malloc(m->n_tensors * sizeof(*t));
	if (t == NULL) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	memcpy(t, m->tensors, m->n_tensors * sizeof(*t));
	qsort(t, m->n_tensors, sizeof(*t), cmp_tensor_offset);
	int r = 0;
	for (size_t i = 1; i < m->n_tensors && r == 0; i++)
		if (t[i]->shard_offset < t[i - 1]->shard_offset + t[i - 1]->nbytes) {
			snprintf(err, errlen, "manifest tensors '%s' and '%s' overlap in the shard", t[i - 1]->name,
				 t[i]->name);
			r = -EBADMSG;
		}
	free(t);
	return r;
}

/* A tensor name twice in one manifest would be loaded twice. */
static int check_unique_names(const Ckpt__Manifest *m, char *err, size_t errlen)
{
	if (m->n_tensors < 2)
		return 0;
	char **names = malloc(m->n_tensors * sizeof(*names));
	if (names == NULL) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (size_t i = 0; i < m->n_tensors; i++)
		names[i] = m->tensors[i]->name;
	qsort(names, m->n_tensors, sizeof(*names), cmp_str_ptr);
	int r = 0;
	for (size_t i = 1; i < m->n_tensors && r == 0; i++)
		if (strcmp(names[i - 1], names[i]) == 0) {
			snprintf(err, errlen, "manifest names tensor '%s' twice", names[i]);
			r = -EBADMSG;
		}
	free(names);
	return r;
}

/* The pieces' part of manifest_check (manifest.h). */
int pieces_check(const Ckpt__Manifest *m, char *err, size_t errlen)
{
	if ((m->n_pieces > 0) != (m->format_version == MANIFEST_FORMAT_PIECES)) {
		snprintf(err, errlen, "manifest format version %u with %zu pieces", m->format_version, m->n_pieces);
		return -EBADMSG;
	}
	if (m->piece_bytes != 0 && (m->piece_bytes < PIECE_MIN_BYTES || m->piece_bytes > PIECE_MAX_BYTES ||
				    m->piece_bytes % PIECE_MIN_BYTES != 0)) {
		snprintf(err, errlen, "manifest piece_bytes %" PRIu64 " is not a multiple of %u up to %u",
			 m->piece_bytes, PIECE_MIN_BYTES, PIECE_MAX_BYTES);
		return -EBADMSG;
	}
	if (m->n_refs > PIECES_MAX_REFS || (m->n_refs > 0 && m->n_pieces == 0)) {
		snprintf(err, errlen, "manifest refers to %zu older shards", m->n_refs);
		return -EBADMSG;
	}
	for (size_t k = 0; k < m->n_refs; k++) {
		uint64_t t;
		if (manifest_ref_check(m, m->refs[k], &t) < 0) {
			snprintf(err, errlen,
				 "manifest reference %zu, '%.200s', is not a shard of an older step of rank %u of %u",
				 k + 1, m->refs[k], m->rank, m->world_size);
			return -EBADMSG;
		}
	}
	uint64_t raw = 0;
	for (size_t i = 0; i < m->n_pieces; i++) {
		const Ckpt__ManifestPiece *p = m->pieces[i];
		bool ok = p->raw_bytes > 0 && p->raw_bytes <= PIECE_MAX_BYTES && p->raw_bytes <= m->shard_bytes - raw;
		if (ok && p->codec == CKPT__CODEC__CODEC_NONE)
			ok = p->stored_bytes == p->raw_bytes;
		else if (ok && p->codec == CKPT__CODEC__CODEC_PLANES_ZSTD)
			ok = (p->elem == 1 || p->elem == 2 || p->elem == 4 || p->elem == 8) &&
			     p->stored_bytes >= PLANECODEC_HDR(p->elem) &&
			     p->stored_bytes <= planecodec_bound((size_t)p->raw_bytes);
		else
			ok = false;
		if (ok && p->hash.len != 0 && p->hash.len != 16)
			ok = false;
		if (ok && p->ref != 0)
			ok = p->ref <= m->n_refs && p->ref_offset <= UINT64_MAX - p->stored_bytes;
		else if (ok)
			ok = p->ref_offset == 0;
		if (!ok) {
			snprintf(err, errlen,
				 "manifest piece %zu: %" PRIu64 " raw bytes stored in %" PRIu64
				 " by codec %d elem %u (hash of %zu bytes, in shard %u of %zu at %" PRIu64
				 ") cannot be",
				 i, p->raw_bytes, p->stored_bytes, (int)p->codec, p->elem, p->hash.len, p->ref,
				 m->n_refs, p->ref_offset);
			return -EBADMSG;
		}
		raw += p->raw_bytes;
	}
	if (m->n_pieces > 0 && raw != m->shard_bytes) {
		snprintf(err, errlen, "manifest pieces hold %" PRIu64 " of the shard's %" PRIu64 " bytes", raw,
			 m->shard_bytes);
		return -EBADMSG;
	}
	return 0;
}

int manifest_check(const Ckpt__Manifest *m, char *err, size_t errlen)
{
	if (m->format_version != MANIFEST_FORMAT_VERSION && m->format_version != MANIFEST_FORMAT_PIECES) {
		snprintf(err, errlen, "manifest format version %u, this ckptd reads %d and %d", m->format_version,
			 MANIFEST_FORMAT_VERSION, MANIFEST_FORMAT_PIECES);
		return -EBADMSG;
	}
	if (!manifest_job_valid(m->job) || !manifest_name_valid(m->attempt_id, ATTEMPT_MAX_LEN)) {
		snprintf(err, errlen, "manifest has an invalid job or attempt id");
		return -EBADMSG;
	}
	if (m->world_size == 0 || m->rank >= m->world_size) {
		snprintf(err, errlen, "manifest rank %u of world size %u", m->rank, m->world_size);
		return -EBADMSG;
	}
	if (m->chunk_bytes == 0) {
		snprintf(err, errlen, "manifest chunk_bytes is 0");
		return -EBADMSG;
	}
	uint64_t nchunks = m->shard_bytes / m->chunk_bytes + (m->shard_bytes % m->chunk_bytes != 0);
	if (m->n_chunk_crc32c != nchunks) {
		snprintf(err, errlen, "manifest lists %zu chunk checksums for %" PRIu64 " chunks", m->n_chunk_crc32c,
			 nchunks);
		return -EBADMSG;
	}
	for (size_t i = 0; i < m->n_tensors; i++) {
		const Ckpt__ManifestTensor *t = m->tensors[i];
		struct box b;
		uint64_t nelem;
		char why[160];
		size_t es = tensor_dtype_size(t->dtype);
		if (t->name[0] == '\0' || es == 0) {
			snprintf(err, errlen, "manifest tensor %zu has no name or an unknown dtype", i);
			return -EBADMSG;
		}
		if (box_from_fields(&b, t->n_global_shape, t->global_shape, t->n_box_offsets, t->box_offsets,
				    t->n_box_lengths, t->box_lengths, &nelem, why, sizeof(why)) < 0) {
			snprintf(err, errlen, "manifest tensor '%s': %s", t->name, why);
			return -EBADMSG;
		}
		if (nelem > UINT64_MAX / es || nelem * es != t->nbytes || t->shard_offset > m->shard_bytes ||
		    t->nbytes > m->shard_bytes - t->shard_offset) {
			snprintf(err, errlen, "manifest tensor '%s': byte range does not fit its box or the shard",
				 t->name);
			return -EBADMSG;
		}
	}
	if (pieces_check(m, err, errlen) < 0)
		return -EBADMSG;
	char key[1024];
	if (manifest_shard_of(m, key, sizeof(key)) < 0) {
		snprintf(err, errlen, "manifest shard '%.100s%s%.200s' is not a shard of rank %u of %u", m->shard_dir,
			 m->shard_dir[0] ? "/" : "", m->shard_name, m->rank, m->world_size);
		return -EBADMSG;
	}
	int r = check_unique_names(m, err, errlen);
	return r < 0 ? r : check_disjoint(m, err, errlen);
}

int manifest_decode(const void *buf, size_t len, Ckpt__Manifest **out, char *err, size_t errlen)
{
	Ckpt__Manifest *m = ckpt__manifest__unpack(NULL, len, buf);
	if (m == NULL) {
		snprintf(err, errlen, "manifest does not parse");
		return -EBADMSG;
	}
	int r = manifest_check(m, err, errlen);
	if (r < 0) {
		ckpt__manifest__free_unpacked(m, NULL);
		return r;
	}
	*out = m;
	return 0;
}
