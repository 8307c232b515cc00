/* Sealed replicas (seal.h): OpenSSL's HMAC-SHA256 and AES-256-GCM. */
#include "seal.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

int seal_derive(const void *secret, size_t len, const char *job, uint8_t key[SEAL_KEY_BYTES])
{
	if (len == 0 || len > SEAL_SECRET_MAX)
		return -EINVAL;
	/* HMAC-SHA256 as the PRF of HKDF's expand step, one block: the
	 * secret keys it, the job's name is the info. */
	char info[160];
	int n = snprintf(info, sizeof(info), "ckptd replica key 1 %s", job);
	if (n < 0 || (size_t)n >= sizeof(info))
		return -EINVAL;
	unsigned int out = 0;
	if (HMAC(EVP_sha256(), secret, (int)len, (const unsigned char *)info, (size_t)n, key, &out) == NULL ||
	    out != SEAL_KEY_BYTES)
		return -EIO;
	return 0;
}

int seal_nonce(uint8_t nonce[SEAL_NONCE_BYTES])
{
	return RAND_bytes(nonce, SEAL_NONCE_BYTES) == 1 ? 0 : -EIO;
}

int seal_aad(char *out, size_t cap, const char *job, uint64_t step, uint32_t rank, uint32_t world_size,
	     const char *attempt, uint64_t shard_bytes)
{
	int n = snprintf(out, cap,
			 "ckptd sealed replica 1 job %s step %" PRIu64 " rank %u of %u attempt %s bytes %" PRIu64, job,
			 step, rank, world_size, attempt, shard_bytes);
	return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : n;
}

uint64_t seal_pieces(uint64_t n)
{
	return n / SEAL_CHUNK + (n % SEAL_CHUNK != 0);
}

uint64_t seal_wire_bytes(uint64_t n)
{
	return n + seal_pieces(n) * SEAL_TAG_BYTES;
}

int seal_piece(const uint8_t key[SEAL_KEY_BYTES], const uint8_t nonce[SEAL_NONCE_BYTES], uint32_t index,
	       const void *aad, size_t aadlen, const void *in, void *out, size_t n, uint8_t tag[SEAL_TAG_BYTES],
	       bool encrypt)
{
	if (n > INT_MAX || aadlen > INT_MAX)
		return -EINVAL;
	uint8_t iv[SEAL_NONCE_BYTES];
	memcpy(iv, nonce, sizeof(iv));
	for (int i = 0; i < 4; i++)
		iv[SEAL_NONCE_BYTES - 1 - i] ^= (uint8_t)(index >> (8 * i));
	EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
	if (c == NULL)
		return -EIO;
	int r = -EIO, len = 0;
	bool ok = encrypt ? EVP_EncryptInit_ex(c, EVP_aes_256_gcm(), NULL, key, iv) == 1
			  : EVP_DecryptInit_ex(c, EVP_aes_256_gcm(), NULL, key, iv) == 1;
	if (ok && aadlen)
		ok = encrypt ? EVP_EncryptUpdate(c, NULL, &len, aad, (int)aadlen) == 1
			     : EVP_DecryptUpdate(c, NULL, &len, aad, (int)aadlen) == 1;
	if (ok && n)
		ok = encrypt ? EVP_EncryptUpdate(c, out, &len, in, (int)n) == 1
			     : EVP_DecryptUpdate(c, out, &len, in, (int)n) == 1;
	if (ok && encrypt) {
		ok = EVP_EncryptFinal_ex(c, (uint8_t *)out + n, &len) == 1 &&
		     EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, SEAL_TAG_BYTES, tag) == 1;
		r = ok ? 0 : -EIO;
	} else if (ok) {
		ok = EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, SEAL_TAG_BYTES, tag) == 1;
		r = ok ? (EVP_DecryptFinal_ex(c, (uint8_t *)out + n, &len) == 1 ? 0 : -EBADMSG) : -EIO;
	}
	EVP_CIPHER_CTX_free(c);
	return r;
}
