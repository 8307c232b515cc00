#include "steplock.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "names.h"
#include "grow.h"

struct entry {
	char job[JOB_BUF];
	uint64_t step;
	unsigned saving;
	bool deleting;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct entry *tab;
static size_t n, cap;

/* mu held. create: add an empty entry if missing. */
static struct entry *find(const char *job, uint64_t step, bool create)
{
	for (size_t i = 0; i < n; i++)
		if (tab[i].step == step && strcmp(tab[i].job, job) == 0)
			return &tab[i];
	if (!create)
		return NULL;
	if (GROW(tab, cap, n + 1, 16) < 0)
		return NULL;
	struct entry *e = &tab[n++];
	memset(e, 0, sizeof(*e));
	strncpy(e->job, job, sizeof(e->job) - 1);
	e->step = step;
	return e;
}

/* mu held: drop e once nobody holds it. */
static void tidy(struct entry *e)
{
	if (e->saving == 0 && !e->deleting)
		*e = tab[--n];
}

int steplock_save_begin(const char *job, uint64_t step)
{
	assert(job);
	pthread_mutex_lock(&mu);
	struct entry *e = find(job, step, true);
	int r = e == NULL ? -ENOMEM : e->deleting ? -EBUSY : 0;
	if (r == 0)
		e->saving++;
	pthread_mutex_unlock(&mu);
	return r;
}

void steplock_save_end(const char *job, uint64_t step)
{
	pthread_mutex_lock(&mu);
	struct entry *e = find(job, step, false);
	if (e && e->saving) {
		e->saving--;
		tidy(e);
	}
	pthread_mutex_unlock(&mu);
}

int steplock_delete_begin(const char *job, uint64_t step)
{
	pthread_mutex_lock(&mu);
	struct entry *e = find(job, step, true);
	int r = e == NULL ? -ENOMEM : (e->saving || e->deleting) ? -EBUSY : 0;
	if (r == 0)
		e->deleting = true;
	else if (e)
		tidy(e);
	pthread_mutex_unlock(&mu);
	return r;
}

void steplock_delete_end(const char *job, uint64_t step)
{
	pthread_mutex_lock(&mu);
	struct entry *e = find(job, step, false);
	if (e) {
		e->deleting = false;
		tidy(e);
	}
	pthread_mutex_unlock(&mu);
}
