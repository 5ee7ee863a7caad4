/*
 * run_par.c - a parallel loop for the parts of `wna16 run` that are many
 * independent items of scalar work: encoding the default layer's experts
 * and decoding a checkpoint's routed experts through the reference, and
 * the reference MoE's tokens. Threads take the next item from a shared
 * counter, so uneven items balance; the first failure is kept and stops
 * further items.
 */
#define _GNU_SOURCE
#include "run.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { RUN_MAX_THREADS = 64 };

int run_threads(void)
{
    cpu_set_t set;
    int n = 0;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        n = CPU_COUNT(&set);
    if (n <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n = c > 0 ? (int)c : 1;
    }
    return n < RUN_MAX_THREADS ? n : RUN_MAX_THREADS;
}

typedef struct par {
    size_t n;
    run_item_fn fn;
    void *user;
    atomic_size_t next;
    atomic_bool failed;
    pthread_mutex_t mu; /* guards the first error */
    wna16_status_t st;
    wna16_error_t err;
} par_t;

static void *worker(void *arg)
{
    par_t *p = arg;
    wna16_error_t err;
    for (;;) {
        if (atomic_load(&p->failed))
            break;
        size_t i = atomic_fetch_add(&p->next, 1);
        if (i >= p->n)
            break;
        wna16_error_clear(&err);
        wna16_status_t st = p->fn(p->user, i, &err);
        if (st != WNA16_OK) {
            pthread_mutex_lock(&p->mu);
            if (p->st == WNA16_OK) {
                p->st = st;
                p->err = err;
            }
            pthread_mutex_unlock(&p->mu);
            atomic_store(&p->failed, true);
        }
    }
    return NULL;
}

wna16_status_t run_parallel(size_t n, run_item_fn fn, void *user,
                            wna16_error_t *err)
{
    par_t p = {.n = n, .fn = fn, .user = user, .st = WNA16_OK};
    atomic_init(&p.next, 0);
    atomic_init(&p.failed, false);
    pthread_mutex_init(&p.mu, NULL);
    size_t nt = (size_t)run_threads();
    if (nt > n)
        nt = n;
    pthread_t tid[RUN_MAX_THREADS];
    size_t started = 0;
    /* the calling thread is worker 0 */
    for (size_t t = 1; t < nt; t++, started++)
        if (pthread_create(&tid[started], NULL, worker, &p) != 0)
            break; /* fewer threads: the others take the items */
    worker(&p);
    for (size_t t = 0; t < started; t++)
        pthread_join(tid[t], NULL);
    pthread_mutex_destroy(&p.mu);
    if (p.st != WNA16_OK && err)
        *err = p.err;
    return p.st;
}
