/* The fake driver's test-only entry points (tests/fakecuda/fakecuda.c). */
#ifndef CKPT_FAKECUDA_H
#define CKPT_FAKECUDA_H

#include <cuda.h>
#include <stddef.h>

/* A "kernel": after delay_us, write fakecuda_pattern(seed, i) to byte i
 * of [p, p+n), in order on stream s. */
CUresult fakecuda_fill_async(CUdeviceptr p, size_t n, unsigned char seed, unsigned delay_us, CUstream s);
unsigned char fakecuda_pattern(unsigned char seed, size_t i);

#endif
