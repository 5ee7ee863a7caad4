/*
 * pool.c - see pool.h. Workers sleep on a condition variable between runs;
 * a run bumps a generation number, and the last thread to finish its
 * chunks signals the caller.
 */
#define _GNU_SOURCE
#include "runtime/cpu/pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

struct w16_pool {
    pthread_t *threads;
    int n_workers;
    pthread_mutex_t mu, run_mu;
    pthread_cond_t work, done;
    uint64_t generation;
    int busy; /* workers still in the current run */
    bool stop;
    /* the current run */
    w16_pool_fn fn;
    void *user;
    int64_t n, chunk;
    atomic_llong next;
};

static void drain(w16_pool_t *p)
{
    for (;;) {
        int64_t b = atomic_fetch_add(&p->next, p->chunk);
        if (b >= p->n)
            return;
        int64_t e = b + p->chunk < p->n ? b + p->chunk : p->n;
        p->fn(p->user, b, e);
    }
}

static void *worker(void *arg)
{
    w16_pool_t *p = arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen)
            pthread_cond_wait(&p->work, &p->mu);
        if (p->stop)
            break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        drain(p);
        pthread_mutex_lock(&p->mu);
        if (--p->busy == 0)
            pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

w16_pool_t *w16_pool_create(int threads)
{
    if (threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 1;
    }
    w16_pool_t *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->n_workers = threads - 1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->run_mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->done, NULL);
    p->threads = calloc((size_t)(p->n_workers > 0 ? p->n_workers : 1),
                        sizeof *p->threads);
    if (!p->threads) {
        free(p);
        return NULL;
    }
    for (int i = 0; i < p->n_workers; i++)
        if (pthread_create(&p->threads[i], NULL, worker, p) != 0) {
            p->n_workers = i; /* run with the threads we got */
            break;
        }
    return p;
}

void w16_pool_destroy(w16_pool_t *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_workers; i++)
        pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->run_mu);
    free(p->threads);
    free(p);
}

int w16_pool_threads(const w16_pool_t *p) { return p->n_workers + 1; }

void w16_pool_run(w16_pool_t *p, int64_t n, w16_pool_fn fn, void *user)
{
    if (n <= 0)
        return;
    pthread_mutex_lock(&p->run_mu);
    int threads = p->n_workers + 1;
    /* ~8 chunks per thread balances load without much counter traffic */
    int64_t chunk = n / (threads * 8);
    if (chunk < 1)
        chunk = 1;
    if (p->n_workers == 0 || n == 1) {
        fn(user, 0, n);
        pthread_mutex_unlock(&p->run_mu);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->user = user;
    p->n = n;
    p->chunk = chunk;
    atomic_store(&p->next, 0);
    p->busy = p->n_workers;
    p->generation++;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    drain(p);
    pthread_mutex_lock(&p->mu);
    while (p->busy > 0)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->run_mu);
}
