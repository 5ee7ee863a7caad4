/*
 * pool.c - see pool.h. The caller publishes a run and takes chunks of it
 * at once; a worker joins when it is awake and stops when the chunks are
 * gone. The caller waits only for chunks being computed, never for a
 * worker to wake up: a run whose chunks the caller took alone returns
 * without the workers.
 *
 *   run:    gen odd (being written) -> no worker inside (active == 0)
 *           -> fn, n, chunk, counters -> gen even -> wake sleepers
 *           -> drain -> wait until done == n (spin, then sleep)
 *   worker: wait for an even gen it has not run (spin SPIN_NS, then
 *           sleep) -> active++ -> gen still that value? drain : retry
 *           -> active--
 *
 * Why: a fused MoE call is a chain of launches (input, gemm1, gemm2,
 * combine) microseconds apart. The previous pool had every worker join
 * every run, and the caller sleep until the last one signalled: two
 * wake-ups through the kernel a run (tens of microseconds each on this
 * virtual machine, where an idle core halts), four a decode call of
 * 300-500 us. Now a worker that has just finished gemm1's chunks finds
 * gemm2 while it still spins, and only the first launch after an idle
 * period wakes it; the caller starts on the chunks meanwhile. The spin is
 * short: a longer one (200 us) measured slower on the loaded machine, as
 * busy-waiting threads lose their place to other processes.
 */
#define _GNU_SOURCE
#include "runtime/cpu/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* How long a worker watches for the next run before it sleeps, and how
 * long the caller watches for the last chunks before it sleeps. */
#define WORKER_SPIN_NS INT64_C(20000)
#define CALLER_SPIN_NS INT64_C(50000)

struct w16_pool {
    pthread_t *threads;
    int n_workers;
    pthread_mutex_t mu, run_mu;
    pthread_cond_t work, done_cv;
    atomic_uint_least64_t gen; /* even: a run published; odd: writing */
    atomic_int active;         /* workers inside a run */
    atomic_int sleepers;       /* workers waiting on `work` */
    atomic_bool waiting;       /* the caller waits on `done_cv` */
    atomic_bool stop;
    /* the current run */
    w16_pool_fn fn;
    void *user;
    int64_t n, chunk;
    atomic_llong next, done;
};

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static inline void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* A spin of about `ns`: each call pauses once and returns true until the
 * time is over, then false from then on. */
typedef struct spin {
    int64_t end;
    unsigned i;
    bool over;
} spin_t;

static bool spin_on(spin_t *s, int64_t ns)
{
    if (s->over)
        return false;
    relax();
    if ((++s->i & 63) == 0) {
        int64_t t = now_ns();
        if (!s->end)
            s->end = t + ns;
        else if (t > s->end)
            s->over = true;
    }
    return !s->over;
}

static bool runnable(w16_pool_t *p, uint64_t seen)
{
    uint64_t g = atomic_load(&p->gen);
    return atomic_load(&p->stop) || (!(g & 1) && g != seen);
}

/* Takes chunks until none is left; the thread that completes the run
 * wakes a sleeping caller. */
static void drain(w16_pool_t *p)
{
    for (;;) {
        int64_t b = atomic_fetch_add(&p->next, p->chunk);
        if (b >= p->n)
            return;
        int64_t e = b + p->chunk < p->n ? b + p->chunk : p->n;
        p->fn(p->user, b, e);
        if (atomic_fetch_add(&p->done, e - b) + (e - b) == p->n &&
            atomic_load(&p->waiting)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

static void *worker(void *arg)
{
    w16_pool_t *p = arg;
    uint64_t seen = 0;
    for (;;) {
        spin_t s = {0};
        while (!runnable(p, seen) && spin_on(&s, WORKER_SPIN_NS))
            ;
        if (!runnable(p, seen)) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (!runnable(p, seen))
                pthread_cond_wait(&p->work, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop))
            break;
        /* enter, then check that the run is still the one seen (the
         * caller rewrites a run only with no worker inside) */
        atomic_fetch_add(&p->active, 1);
        uint64_t g = atomic_load(&p->gen);
        if (!(g & 1) && g != seen) {
            drain(p);
            seen = g;
        }
        atomic_fetch_sub(&p->active, 1);
    }
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
    pthread_cond_init(&p->done_cv, NULL);
    atomic_init(&p->gen, 0);
    atomic_init(&p->active, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->waiting, false);
    atomic_init(&p->stop, false);
    atomic_init(&p->next, 0);
    atomic_init(&p->done, 0);
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
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_workers; i++)
        pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->done_cv);
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
    /* odd: a worker entering now backs off; wait out one leaving the
     * previous run (its chunks are done: it is on its way out) */
    atomic_fetch_add(&p->gen, 1);
    spin_t s = {0};
    while (atomic_load(&p->active) > 0)
        if (!spin_on(&s, CALLER_SPIN_NS))
            sched_yield(); /* a worker preempted on its way out */
    p->fn = fn;
    p->user = user;
    p->n = n;
    p->chunk = chunk;
    atomic_store(&p->next, 0);
    atomic_store(&p->done, 0);
    /* even: published (seq_cst: a worker that counted itself a sleeper
     * before this reads the new value, or is woken below) */
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->work);
        pthread_mutex_unlock(&p->mu);
    }
    drain(p);
    /* the chunks other threads are computing */
    s = (spin_t){0};
    while (atomic_load(&p->done) < n && spin_on(&s, CALLER_SPIN_NS))
        ;
    if (atomic_load(&p->done) < n) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->waiting, true);
        while (atomic_load(&p->done) < n)
            pthread_cond_wait(&p->done_cv, &p->mu);
        atomic_store(&p->waiting, false);
        pthread_mutex_unlock(&p->mu);
    }
    pthread_mutex_unlock(&p->run_mu);
}
