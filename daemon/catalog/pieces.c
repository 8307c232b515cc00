/* A shard's pieces: see pieces.h. */
#include "pieces.h"
#include "planecodec.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int pieces_index(struct pieces *x, const Ckpt__Manifest *m)
{
	memset(x, 0, sizeof(*x));
	if (m->n_pieces == 0)
		return 0;
	size_t n = m->n_pieces;
	x->raw = malloc(3 * (n + 1) * sizeof(uint64_t));
	x->ref = calloc(n, sizeof(*x->ref));
	if (x->raw == NULL || x->ref == NULL) {
		free(x->raw);
		free(x->ref);
		x->raw = NULL;
		x->ref = NULL;
		return -ENOMEM;
	}
	x->at = x->raw + n + 1;
	x->cum = x->at + n + 1;
	x->raw[0] = x->cum[0] = 0;
	uint64_t own = 0; /* the manifest's own shard: its pieces back to back */
	for (size_t i = 0; i < n; i++) {
		const Ckpt__ManifestPiece *p = m->pieces[i];
		x->raw[i + 1] = x->raw[i] + p->raw_bytes;
		x->cum[i + 1] = x->cum[i] + p->stored_bytes;
		if (p->ref) {
			x->ref[i] = m->refs[p->ref - 1];
			x->at[i] = p->ref_offset;
		} else {
			x->at[i] = own;
			own += p->stored_bytes;
		}
	}
	x->at[n] = own;
	x->n = n;
	x->job = m->job;
	x->piece_bytes = m->piece_bytes ? m->piece_bytes : PIECE_BYTES;
	x->p = (const Ckpt__ManifestPiece *const *)m->pieces;
	return 0;
}

void pieces_free(struct pieces *x)
{
	free(x->raw);
	free(x->ref);
	memset(x, 0, sizeof(*x));
}

/* The piece that holds raw byte off (< the shard's length). */
static size_t piece_at(const struct pieces *x, uint64_t off)
{
	size_t lo = 0, hi = x->n; /* raw[lo] <= off < raw[hi] */
	while (hi - lo > 1) {
		size_t mid = lo + (hi - lo) / 2;
		if (x->raw[mid] <= off)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

void pieces_span(const struct pieces *x, uint64_t off, uint64_t len, size_t *p0, size_t *p1)
{
	*p0 = piece_at(x, off);
	*p1 = piece_at(x, off + len - 1) + 1;
}

int pieces_key(const struct pieces *x, size_t i, const char *own, char *out, size_t cap)
{
	int n = x->ref[i] ? snprintf(out, cap, "%s/%s", x->job, x->ref[i]) : snprintf(out, cap, "%s", own);
	return (n < 0 || (size_t)n >= cap) ? -ENAMETOOLONG : 0;
}

static bool same_object(const char *a, const char *b)
{
	return a == b || (a && b && strcmp(a, b) == 0);
}

bool pieces_same_object(const struct pieces *x, size_t i, size_t j)
{
	return same_object(x->ref[i], x->ref[j]);
}

size_t pieces_segment(const struct pieces *x, size_t a, size_t p1)
{
	size_t b = a + 1;
	while (b < p1 && same_object(x->ref[b], x->ref[a]) && x->at[a] <= UINT64_MAX - (x->cum[b] - x->cum[a]) &&
	       x->at[b] == x->at[a] + (x->cum[b] - x->cum[a]))
		b++;
	return b;
}

int pieces_decode(const struct pieces *x, struct planecodec *c, size_t p0, size_t p1, const uint8_t *stored,
		  uint8_t *raw, char *why, size_t whylen)
{
	for (size_t i = p0; i < p1; i++) {
		const Ckpt__ManifestPiece *p = x->p[i];
		const uint8_t *s = stored + (x->cum[i] - x->cum[p0]);
		uint8_t *d = raw + (x->raw[i] - x->raw[p0]);
		if (p->codec == CKPT__CODEC__CODEC_NONE) {
			memcpy(d, s, (size_t)p->raw_bytes);
			continue;
		}
		int r = planecodec_decode(c, s, (size_t)p->stored_bytes, d, (size_t)p->raw_bytes);
		if (r < 0) {
			snprintf(why, whylen,
				 "piece %zu (shard bytes %" PRIu64 "+%" PRIu64 ", object bytes %" PRIu64 "+%" PRIu64
				 "%s%s) %s",
				 i, x->raw[i], p->raw_bytes, x->at[i], p->stored_bytes, x->ref[i] ? " of " : "",
				 x->ref[i] ? x->ref[i] : "",
				 r == -EBADMSG ? "does not decode: the object is damaged" : strerror(-r));
			return r;
		}
	}
	return 0;
}
