#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include "workq.h"

/* Items record the order they ran in; the first one holds the only
 * worker until the others are queued. */
struct item {
	struct work_item it;
	char tag;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static bool gate_open, gate_entered;
static char order[16];
static size_t norder;
static int ndone;

static void run_gate(struct work_item *w)
{
	(void)w;
	pthread_mutex_lock(&mu);
	gate_entered = true;
	pthread_cond_broadcast(&cv);
	while (!gate_open)
		pthread_cond_wait(&cv, &mu);
	pthread_mutex_unlock(&mu);
}

static void run_record(struct work_item *w)
{
	struct item *i = (struct item *)w;
	pthread_mutex_lock(&mu);
	order[norder++] = i->tag;
	pthread_mutex_unlock(&mu);
}

static void on_done(struct work_item *w)
{
	(void)w;
	ndone++;
}

/* Background items run only when no foreground item waits, whatever the
 * order of submission; each class stays FIFO. */
static void test_background_runs_after_foreground(void **state)
{
	(void)state;
	uv_loop_t loop;
	assert_int_equal(uv_loop_init(&loop), 0);
	struct workq *q = NULL;
	assert_int_equal(workq_init(&q, &loop, 1), 0);
	struct item gate = { .it = { .run = run_gate, .done = on_done }, .tag = 'g' };
	struct item b1 = { .it = { .run = run_record, .done = on_done }, .tag = 'b' };
	struct item b2 = { .it = { .run = run_record, .done = on_done }, .tag = 'c' };
	struct item f1 = { .it = { .run = run_record, .done = on_done }, .tag = 'F' };
	struct item f2 = { .it = { .run = run_record, .done = on_done }, .tag = 'G' };
	workq_submit(q, &gate.it);
	pthread_mutex_lock(&mu);
	while (!gate_entered)
		pthread_cond_wait(&cv, &mu);
	pthread_mutex_unlock(&mu);
	workq_submit_background(q, &b1.it);
	workq_submit(q, &f1.it);
	workq_submit_background(q, &b2.it);
	workq_submit(q, &f2.it);
	pthread_mutex_lock(&mu);
	gate_open = true;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
	while (ndone < 5)
		uv_run(&loop, UV_RUN_ONCE);
	order[norder] = '\0';
	assert_string_equal(order, "FGbc");
	workq_fini(q);
	uv_run(&loop, UV_RUN_DEFAULT);
	assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_background_runs_after_foreground),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
