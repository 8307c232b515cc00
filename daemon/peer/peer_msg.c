/* What a peer's messages must be (peer_msg.h). */
#include "peer_msg.h"
#include "manifest.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sealing_aad(struct sealing *z, const char *job, uint64_t step, uint32_t rank, uint32_t world, const char *attempt,
		uint64_t shard_bytes)
{
	int n = seal_aad(z->aad, sizeof(z->aad), job, step, rank, world, attempt, shard_bytes);
	if (n < 0)
		return n;
	z->aadlen = (size_t)n;
	return 0;
}

/* The whole manifest of a sealed copy whose public manifest is pub,
 * opened with key: the same job, step, rank, world size, attempt and
 * size as pub says, and checked as any. 0 and *out; -EBADMSG and why
 * (malformed, another key, or altered). */
static int open_manifest(const Ckpt__Manifest *pub, const ProtobufCBinaryData *nonce, const ProtobufCBinaryData *sm,
			 const uint8_t *key, struct sealing *z, Ckpt__Manifest **out, char *why, size_t whylen)
{
	*out = NULL;
	if (nonce->len != SEAL_NONCE_BYTES || sm->len < SEAL_TAG_BYTES || sm->len > MANIFEST_MAX_BYTES) {
		snprintf(why, whylen, "a sealed copy with a malformed seal");
		return -EBADMSG;
	}
	memcpy(z->nonce, nonce->data, SEAL_NONCE_BYTES);
	if (sealing_aad(z, pub->job, pub->step, pub->rank, pub->world_size, pub->attempt_id, pub->shard_bytes) < 0) {
		snprintf(why, whylen, "names too long");
		return -EBADMSG;
	}
	z->on = true;
	size_t n = sm->len - SEAL_TAG_BYTES;
	uint8_t *buf = malloc(n ? n : 1);
	if (buf == NULL) {
		snprintf(why, whylen, "out of memory");
		return -ENOMEM;
	}
	uint8_t tag[SEAL_TAG_BYTES];
	memcpy(tag, sm->data + n, SEAL_TAG_BYTES);
	int r = seal_piece(key, z->nonce, SEAL_MANIFEST_INDEX, z->aad, z->aadlen, sm->data, buf, n, tag, false);
	if (r < 0) {
		free(buf);
		snprintf(why, whylen,
			 "its sealed manifest does not open with this job's key (CKPT_JOB_KEY): sealed with another "
			 "key, or altered");
		return -EBADMSG;
	}
	r = manifest_decode(buf, n, out, why, whylen);
	explicit_bzero(buf, n);
	free(buf);
	if (r == 0 && (strcmp((*out)->job, pub->job) != 0 || (*out)->step != pub->step || (*out)->rank != pub->rank ||
		       (*out)->world_size != pub->world_size || strcmp((*out)->attempt_id, pub->attempt_id) != 0 ||
		       (*out)->shard_bytes != pub->shard_bytes)) {
		ckpt__manifest__free_unpacked(*out, NULL);
		*out = NULL;
		snprintf(why, whylen, "its sealed manifest is another copy's");
		r = -EBADMSG;
	}
	return r;
}

int peer_msg_put(const Ckpt__ReplicaPut *put, const struct put_limits *lim, Ckpt__Manifest **m, bool *sealed, char *why,
		 size_t whylen)
{
	*m = NULL;
	*sealed = put->seal_nonce.len > 0;
	int r = manifest_decode(put->manifest.data, put->manifest.len, m, why, whylen);
	if (r < 0)
		return r;
	if ((*m)->n_tensors > lim->max_tensors || (*m)->extra_state.len > lim->max_extra_state) {
		snprintf(why, whylen, "%zu tensors or %zu bytes of extra state: over this node's limits",
			 (*m)->n_tensors, (*m)->extra_state.len);
		r = -E2BIG;
	} else if (*sealed && (put->seal_nonce.len != SEAL_NONCE_BYTES || put->sealed_manifest.len < SEAL_TAG_BYTES ||
			       (*m)->n_tensors || (*m)->extra_state.len || (*m)->shard_bytes > lim->pool_bytes)) {
		/* Sealed (seal.h): a public manifest, the rest sealed. */
		snprintf(why, whylen, "a sealed replica whose seal or public manifest is malformed");
		r = -EBADMSG;
	}
	if (r < 0) {
		ckpt__manifest__free_unpacked(*m, NULL);
		*m = NULL;
	}
	return r;
}

int peer_msg_data(const Ckpt__ReplicaData *data, const Ckpt__ReplicaGet *g, const uint8_t *key, struct sealing *z,
		  Ckpt__Manifest **m, char *why, size_t whylen)
{
	*m = NULL;
	z->on = false;
	int r = manifest_decode(data->manifest.data, data->manifest.len, m, why, whylen);
	if (r < 0)
		return r;
	if (strcmp((*m)->job, g->job) != 0 || (*m)->step != g->step || (*m)->rank != g->rank ||
	    (*m)->world_size != g->world_size) {
		r = -EBADMSG;
		snprintf(why, whylen, "it answered with another copy");
	}
	/* A job with a key takes sealed copies only, opened with it: one
	 * that is not sealed, or does not open, is not its own. */
	bool sealed = data->seal_nonce.len > 0;
	if (r == 0 && sealed && key == NULL) {
		r = -EACCES;
		snprintf(why, whylen,
			 "its copy is sealed with its job's key, which this rank did not give (CKPT_JOB_KEY)");
	} else if (r == 0 && !sealed && key) {
		r = -EACCES;
		snprintf(why, whylen,
			 "its copy is not sealed, and this job's ranks give a key (CKPT_JOB_KEY): not taken");
	} else if (r == 0 && sealed) {
		Ckpt__Manifest *whole = NULL;
		r = open_manifest(*m, &data->seal_nonce, &data->sealed_manifest, key, z, &whole, why, whylen);
		ckpt__manifest__free_unpacked(*m, NULL);
		*m = whole;
	}
	if (r < 0 && *m) {
		ckpt__manifest__free_unpacked(*m, NULL);
		*m = NULL;
	}
	return r;
}

int peer_msg_list(const Ckpt__ReplicaListReply *rep, const Ckpt__ReplicaList *q, uint32_t max, char *why, size_t whylen)
{
	if (rep->n_held > max) {
		snprintf(why, whylen, "%zu copies, over [peers] max_list (%u)", rep->n_held, max);
		return -E2BIG;
	}
	for (size_t i = 0; i < rep->n_held; i++) {
		const Ckpt__HeldCopy *h = rep->held[i];
		if (strcmp(h->job, q->job) != 0 || (!q->all_ranks && h->rank != q->rank)) {
			snprintf(why, whylen, "copy %zu is of another job or rank than asked", i);
			return -EBADMSG;
		}
		if (h->world_size == 0 || h->world_size > MANIFEST_WORLD_MAX || h->rank >= h->world_size ||
		    !manifest_name_valid(h->attempt_id, ATTEMPT_MAX_LEN)) {
			snprintf(why, whylen, "copy %zu: rank %u of world size %u, or a malformed attempt id", i,
				 h->rank, h->world_size);
			return -EBADMSG;
		}
	}
	return 0;
}
