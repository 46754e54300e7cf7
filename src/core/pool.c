/*
 * pool.c - persistent worker threads for dsv4_pool_for (see pool.h).
 *
 * One job at a time (a mutex serialises callers from different threads). A job is published
 * by bumping `gen`; workers spin on it for a while (_mm_pause), then block on `wake`. The
 * caller runs range 0 itself and spins until `pending` reaches zero. Fields written by the
 * caller before the release store of `gen` are read by workers after their acquire load.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/pool.h"

enum { SPIN_ITERS = 4000 }; /* ~0.2 ms of pause before a worker sleeps */

struct worker_arg {
    struct dsv4_pool *pool;
    int               tid;
};

struct dsv4_pool {
    int             n_threads;
    pthread_t      *threads;      /* [n_threads - 1] */
    struct worker_arg *args;      /* [n_threads - 1] */
    pthread_mutex_t submit;       /* serialises jobs from different caller threads */
    pthread_mutex_t lock;         /* protects sleeping, guards the condition variable */
    pthread_cond_t  wake;
    int             sleeping;     /* workers blocked on wake (lock) */
    _Atomic uint64_t gen;         /* job generation; bumped to publish */
    _Atomic int      pending;     /* worker ranges not finished */
    _Atomic int      quit;
    /* the current job (written before gen is bumped) */
    dsv4_pool_fn fn;
    void        *ctx;
    int64_t      n, per;
};

static _Thread_local int in_job;

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void run_range(struct dsv4_pool *p, int tid)
{
    int64_t i0 = (int64_t)tid * p->per, i1 = i0 + p->per;
    if (i1 > p->n) i1 = p->n;
    if (i0 < i1) p->fn(p->ctx, i0, i1, tid);
}

static void *worker(void *arg)
{
    struct worker_arg *wa   = arg;
    struct dsv4_pool  *p    = wa->pool;
    int                tid  = wa->tid;
    uint64_t           seen = 0;
    in_job                  = 1; /* nested pool_for from a worker runs serially */
    for (;;) {
        uint64_t g;
        int      spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
            if (atomic_load(&p->quit)) return NULL;
            if (++spins < SPIN_ITERS) {
                cpu_relax();
                if (spins % 256 == 0) sched_yield();
                continue;
            }
            pthread_mutex_lock(&p->lock);
            p->sleeping++;
            while (atomic_load_explicit(&p->gen, memory_order_acquire) == seen && !atomic_load(&p->quit))
                pthread_cond_wait(&p->wake, &p->lock);
            p->sleeping--;
            pthread_mutex_unlock(&p->lock);
            spins = 0;
        }
        seen = g;
        run_range(p, tid);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
    }
}

int dsv4_pool_create(struct dsv4_pool **out, int n_threads, struct dsv4_err *err)
{
    *out = NULL;
    if (n_threads <= 0) {
        long n    = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    if (n_threads > 256) n_threads = 256;
    struct dsv4_pool *p = calloc(1, sizeof(*p));
    if (!p) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    p->n_threads = n_threads;
    p->threads   = calloc((size_t)n_threads, sizeof(pthread_t));
    p->args      = calloc((size_t)n_threads, sizeof(*p->args));
    if (!p->threads || !p->args) {
        free(p->threads);
        free(p->args);
        free(p);
        return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    }
    pthread_mutex_init(&p->submit, NULL);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    for (int i = 0; i < n_threads - 1; i++) {
        p->args[i] = (struct worker_arg){ p, i + 1 };
        if (pthread_create(&p->threads[i], NULL, worker, &p->args[i]) != 0) {
            p->n_threads = i + 1; /* run with the threads we got */
            break;
        }
    }
    *out = p;
    return DSV4_OK;
}

void dsv4_pool_free(struct dsv4_pool *p)
{
    if (!p) return;
    atomic_store(&p->quit, 1);
    pthread_mutex_lock(&p->lock);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->n_threads - 1; i++) pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->lock);
    pthread_mutex_destroy(&p->submit);
    free(p->threads);
    free(p->args);
    free(p);
}

int dsv4_pool_threads(const struct dsv4_pool *p)
{
    return p ? p->n_threads : 1;
}

void dsv4_pool_for(struct dsv4_pool *p, int64_t n, int64_t align, int64_t min_per_thread, dsv4_pool_fn fn,
                   void *ctx)
{
    if (n <= 0) return;
    if (align < 1) align = 1;
    int nt = p ? p->n_threads : 1;
    if (min_per_thread > 0 && n / min_per_thread < nt) nt = (int)(n / min_per_thread);
    if (nt <= 1 || in_job) {
        fn(ctx, 0, n, 0);
        return;
    }
    pthread_mutex_lock(&p->submit);
    int64_t per = (n + nt - 1) / nt;
    per         = (per + align - 1) / align * align;
    p->fn       = fn;
    p->ctx      = ctx;
    p->n        = n;
    p->per      = per;
    atomic_store_explicit(&p->pending, p->n_threads - 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_mutex_lock(&p->lock);
    if (p->sleeping) pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    in_job = 1;
    run_range(p, 0);
    in_job = 0;
    /* spin a little, then yield: when the machine is oversubscribed the worker we wait for
     * may need this very core */
    for (int spins = 0; atomic_load_explicit(&p->pending, memory_order_acquire) > 0; spins++) {
        if (spins < 2000) cpu_relax();
        else sched_yield();
    }
    pthread_mutex_unlock(&p->submit);
}
