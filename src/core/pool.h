/*
 * pool.h - the engine's persistent thread pool: a row-range parallel-for.
 *
 * dsv4_pool_for(pool, n, fn, ctx) splits [0, n) into one contiguous range per thread
 * (the calling thread takes the first) and returns when all are done. Small jobs run inline
 * (min_per_thread), and a call made from inside a pool job runs serially, so ops can nest
 * without deadlock. Workers spin briefly between jobs (decode issues thousands of small
 * jobs per token) and then sleep on a condition variable.
 */
#ifndef DSV4_POOL_H
#define DSV4_POOL_H

#include <stdint.h>

#include "core/core.h"

struct dsv4_pool;

/* fn(ctx, i0, i1, tid): work on [i0, i1); tid in [0, n_threads) identifies per-thread scratch. */
typedef void (*dsv4_pool_fn)(void *ctx, int64_t i0, int64_t i1, int tid);

/* n_threads <= 0: all online CPUs. */
int  dsv4_pool_create(struct dsv4_pool **out, int n_threads, struct dsv4_err *err);
void dsv4_pool_free(struct dsv4_pool *p);
int  dsv4_pool_threads(const struct dsv4_pool *p);
/* Ranges are multiples of `align` (except the last); at least min_per_thread items a thread. */
void dsv4_pool_for(struct dsv4_pool *p, int64_t n, int64_t align, int64_t min_per_thread, dsv4_pool_fn fn,
                   void *ctx);

#endif
