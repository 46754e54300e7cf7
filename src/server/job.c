/*
 * job.c - the job object of `dsv4 serve`: one generation request, shared by the connection
 * thread that submitted it and the inference worker that feeds it (struct srv_job in
 * server.h says which lock guards each field), plus the server's small shared helpers
 * (srv_log, srv_now).
 *
 * The worker pushes one event per generated token into the job's ring and marks it
 * finished; the consumer takes events with a bounded wait, so neither side ever blocks on
 * the other for long. A full ring is the worker's signal that the consumer is too slow
 * (worker.c then cancels the job). Kept apart from worker.c so that code without an engine
 * (the HTTP fuzz harness's stub worker, tests/fuzz/stub_worker.c) links the same jobs.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/server.h"

/* ------------------------------------------------------------------ jobs */

struct srv_job *srv_job_new(const int32_t *prompt, int n_prompt, int max_tokens, int ring_cap)
{
    struct srv_job *j = calloc(1, sizeof(*j));
    if (!j) return NULL;
    int cap     = max_tokens < ring_cap ? max_tokens : ring_cap;
    j->ring_cap = cap < 1 ? 1 : cap;
    j->prompt   = malloc(sizeof(int32_t) * (size_t)(n_prompt > 0 ? n_prompt : 1));
    j->ring     = malloc(sizeof(*j->ring) * (size_t)j->ring_cap);
    if (!j->prompt || !j->ring) {
        free(j->prompt);
        free(j->ring);
        free(j);
        return NULL;
    }
    if (n_prompt > 0) memcpy(j->prompt, prompt, sizeof(int32_t) * (size_t)n_prompt);
    j->n_prompt   = n_prompt;
    j->max_tokens = max_tokens;
    dsv4_sampler_params_default(&j->sp);
    atomic_init(&j->cancel, false);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, &ca);
    pthread_condattr_destroy(&ca);
    j->refs = 1;
    return j;
}

void srv_job_ref(struct srv_job *j)
{
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
}

void srv_job_unref(struct srv_job *j)
{
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left) return;
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j->prompt);
    free(j->ring);
    dsv4_constraint_free(j->constraint);
    free(j);
}

bool srv_job_push(struct srv_job *j, const struct srv_token *t)
{
    pthread_mutex_lock(&j->mu);
    bool ok = j->ring_len < j->ring_cap;
    if (ok) {
        j->ring[(j->ring_head + j->ring_len) % j->ring_cap] = *t;
        j->ring_len++;
        j->n_generated++;
        pthread_cond_broadcast(&j->cv);
    }
    pthread_mutex_unlock(&j->mu);
    return ok;
}

void srv_job_finish(struct srv_job *j, enum srv_finish f, const char *msg)
{
    pthread_mutex_lock(&j->mu);
    if (j->finish == SRV_FINISH_NONE) {
        j->finish = f;
        size_t n = msg ? strnlen(msg, sizeof(j->msg) - 1) : 0;
        memcpy(j->msg, msg ? msg : "", n);
        j->msg[n] = '\0';
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static struct timespec deadline_in(double s)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double whole = floor(s);
    ts.tv_sec += (time_t)whole;
    ts.tv_nsec += (long)((s - whole) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

int srv_job_take(struct srv_job *j, struct srv_token *out, int cap, double timeout_s, enum srv_finish *finish,
                 int *n_cached)
{
    pthread_mutex_lock(&j->mu);
    if (j->ring_len == 0 && j->finish == SRV_FINISH_NONE && timeout_s > 0) {
        struct timespec dl = deadline_in(timeout_s);
        while (j->ring_len == 0 && j->finish == SRV_FINISH_NONE)
            if (pthread_cond_timedwait(&j->cv, &j->mu, &dl) == ETIMEDOUT) break;
    }
    int n = j->ring_len < cap ? j->ring_len : cap;
    for (int i = 0; i < n; i++) out[i] = j->ring[(j->ring_head + i) % j->ring_cap];
    j->ring_head = (j->ring_head + n) % j->ring_cap;
    j->ring_len -= n;
    if (finish) *finish = j->ring_len ? SRV_FINISH_NONE : j->finish;
    if (n_cached) *n_cached = j->n_cached;
    pthread_mutex_unlock(&j->mu);
    return n;
}

/* ------------------------------------------------------------------ shared helpers */

void srv_log(dsv4_log_fn fn, void *ud, enum dsv4_log_level level, const char *fmt, ...)
{
    if (!fn) return;
    char    msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fn(ud, level, msg);
}

double srv_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int srv_worker_params_check(const struct srv_worker_params *p, struct dsv4_err *err)
{
    if (p->max_seqs < 1 || p->ctx < 2 || p->max_queue < 1 || p->tier_tokens[0] < 1 ||
        p->tier_tokens[1] < p->tier_tokens[0])
        return srv_err(err, DSV4_EINVAL,
                       "max_seqs and max_queue must be positive, ctx at least 2, tier bounds ascending");
    return DSV4_OK;
}
