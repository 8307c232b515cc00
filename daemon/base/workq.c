#include "workq.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

struct workq {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct work_item *head, *tail;   /* waiting to run */
	struct work_item *bhead, *btail; /* waiting, background: after head's */
	struct work_item *done_head;     /* finished, for the loop */
	bool stop;
	unsigned nthreads;
	pthread_t *threads;
	uv_async_t async;
};

static __thread unsigned worker_index;

struct worker_arg {
	struct workq *q;
	unsigned index;
};

unsigned workq_worker(void)
{
	return worker_index;
}

static void *worker_main(void *arg)
{
	struct worker_arg *wa = arg;
	struct workq *q = wa->q;
	worker_index = wa->index;
	free(wa);
	pthread_mutex_lock(&q->mu);
	for (;;) {
		while (q->head == NULL && q->bhead == NULL && !q->stop)
			pthread_cond_wait(&q->cv, &q->mu);
		struct work_item *it;
		if (q->head != NULL) {
			it = q->head;
			q->head = it->next;
			if (q->head == NULL)
				q->tail = NULL;
		} else if (q->bhead != NULL) {
			it = q->bhead;
			q->bhead = it->next;
			if (q->bhead == NULL)
				q->btail = NULL;
		} else {
			break;
		}
		pthread_mutex_unlock(&q->mu);
		it->run(it);
		pthread_mutex_lock(&q->mu);
		it->next = q->done_head;
		q->done_head = it;
		uv_async_send(&q->async);
	}
	pthread_mutex_unlock(&q->mu);
	return NULL;
}

static void on_async(uv_async_t *a)
{
	struct workq *q = a->data;
	pthread_mutex_lock(&q->mu);
	struct work_item *list = q->done_head;
	q->done_head = NULL;
	pthread_mutex_unlock(&q->mu);
	/* Reverse to completion order. */
	struct work_item *rev = NULL;
	while (list) {
		struct work_item *n = list->next;
		list->next = rev;
		rev = list;
		list = n;
	}
	while (rev) {
		struct work_item *n = rev->next;
		rev->done(rev);
		rev = n;
	}
}

int workq_init(struct workq **out, uv_loop_t *loop, unsigned nthreads)
{
	struct workq *q = calloc(1, sizeof(*q));
	if (q == NULL)
		return -ENOMEM;
	q->threads = calloc(nthreads, sizeof(pthread_t));
	if (q->threads == NULL) {
		free(q);
		return -ENOMEM;
	}
	pthread_mutex_init(&q->mu, NULL);
	pthread_cond_init(&q->cv, NULL);
	int r = uv_async_init(loop, &q->async, on_async);
	if (r < 0) {
		free(q->threads);
		free(q);
		return r;
	}
	q->async.data = q;
	for (unsigned i = 0; i < nthreads; i++) {
		struct worker_arg *wa = malloc(sizeof(*wa));
		int e = wa ? 0 : ENOMEM;
		if (wa) {
			*wa = (struct worker_arg){ q, i };
			e = pthread_create(&q->threads[i], NULL, worker_main, wa);
			if (e != 0)
				free(wa);
		}
		if (e != 0) {
			q->nthreads = i;
			workq_fini(q);
			return -e;
		}
		q->nthreads = i + 1;
	}
	*out = q;
	return 0;
}

static void enqueue(struct workq *q, struct work_item **head, struct work_item **tail, struct work_item *it)
{
	it->next = NULL;
	pthread_mutex_lock(&q->mu);
	if (*tail)
		(*tail)->next = it;
	else
		*head = it;
	*tail = it;
	pthread_cond_signal(&q->cv);
	pthread_mutex_unlock(&q->mu);
}

void workq_submit(struct workq *q, struct work_item *it)
{
	assert(q && it && it->run && it->done);
	enqueue(q, &q->head, &q->tail, it);
}

void workq_submit_background(struct workq *q, struct work_item *it)
{
	assert(q && it && it->run && it->done);
	enqueue(q, &q->bhead, &q->btail, it);
}

static void on_async_closed(uv_handle_t *h)
{
	struct workq *q = h->data;
	pthread_mutex_destroy(&q->mu);
	pthread_cond_destroy(&q->cv);
	free(q->threads);
	free(q);
}

void workq_fini(struct workq *q)
{
	if (q == NULL)
		return;
	pthread_mutex_lock(&q->mu);
	q->stop = true;
	pthread_cond_broadcast(&q->cv);
	pthread_mutex_unlock(&q->mu);
	for (unsigned i = 0; i < q->nthreads; i++)
		pthread_join(q->threads[i], NULL);
	uv_close((uv_handle_t *)&q->async, on_async_closed);
}
