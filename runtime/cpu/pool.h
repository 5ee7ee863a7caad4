/*
 * pool.h - a minimal thread pool for data-parallel kernel launches: the
 * caller and n-1 workers take chunks of a range of workgroups from an
 * atomic counter until it is exhausted.
 */
#ifndef W16_POOL_H
#define W16_POOL_H

#include <stdint.h>

typedef struct w16_pool w16_pool_t;
typedef void (*w16_pool_fn)(void *user, int64_t begin, int64_t end);

/* threads <= 0: one per online core. NULL when out of resources. */
w16_pool_t *w16_pool_create(int threads);
void w16_pool_destroy(w16_pool_t *p);
int w16_pool_threads(const w16_pool_t *p);
/* Calls fn over [0, n) in chunks on every thread; returns when done. Not
 * reentrant: one run at a time per pool (runs are serialized). */
void w16_pool_run(w16_pool_t *p, int64_t n, w16_pool_fn fn, void *user);

#endif
