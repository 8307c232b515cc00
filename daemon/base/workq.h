/* A small pool of copy threads. run() executes on a worker, done() back on
 * the loop thread (through one uv_async_t). Items are intrusive, so the
 * queue needs no allocation; its length is bounded by the pool's chunks,
 * since every item stages one chunk. */
#ifndef CKPTD_WORKQ_H
#define CKPTD_WORKQ_H

#include <uv.h>

struct work_item {
	struct work_item *next;
	void (*run)(struct work_item *it);
	void (*done)(struct work_item *it);
};

struct workq;

int workq_init(struct workq **out, uv_loop_t *loop, unsigned nthreads);
void workq_submit(struct workq *q, struct work_item *it);
/* Runs only when no workq_submit() item waits: work after staged (hashing)
 * never delays another save's staging copies. */
void workq_submit_background(struct workq *q, struct work_item *it);
/* On a worker: its index, 0..nthreads-1 (each uses its own CUDA stream). */
unsigned workq_worker(void);
/* Joins the threads (after the queue is empty) and closes the async handle;
 * done() of finished items still runs if the loop runs again. */
void workq_fini(struct workq *q);

#endif
