/* Error words, the per-thread daemon message, and dtype sizes. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "client_internal.h"

/* The message of the last failed call on this thread. A fixed buffer, so
 * that reading it never allocates and a thread exiting leaks nothing. */
static _Thread_local char tls_errmsg[CLIENT_ERRMSG_LEN];

void client_set_errmsg(const char *msg)
{
	if (!msg)
		msg = "";
	snprintf(tls_errmsg, sizeof(tls_errmsg), "%s", msg);
}

void client_set_errmsgf(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(tls_errmsg, sizeof(tls_errmsg), fmt, ap);
	va_end(ap);
}

const char *ckpt_errmsg(void)
{
	return tls_errmsg;
}

const char *ckpt_strerror(int err)
{
	const char *s;

	if (err == 0)
		return "Success";
	if (err == INT32_MIN)
		return "Unknown error";
	if (err < 0)
		err = -err;
	/* strerrordesc_np returns static, untranslated text: thread-safe,
	 * unlike strerror(). */
	s = strerrordesc_np(err);
	return s ? s : "Unknown error";
}

size_t ckpt_dtype_size(int dtype)
{
	switch (dtype) {
	case CKPT_F64:
	case CKPT_I64: return 8;
	case CKPT_F32:
	case CKPT_I32: return 4;
	case CKPT_F16:
	case CKPT_BF16:
	case CKPT_I16: return 2;
	case CKPT_I8:
	case CKPT_U8:
	case CKPT_BOOL:
	case CKPT_F8E4M3:
	case CKPT_F8E5M2: return 1;
	default: return 0;
	}
}
