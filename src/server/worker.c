/*
 * worker.c - the inference worker of `dsv4 serve`: one thread that owns the engine and the
 * scheduler (src/sched/: continuous batching over the paged KV pool, prefix cache, length
 * tiers, bounded queue, preemption), and so all model state. The job object it shares with
 * the connection threads is in job.c.
 *
 * Flow: a connection thread submits a job (dsv4_sched_submit is thread-safe); the worker
 * thread steps the scheduler while anything is pending, and the scheduler calls back on
 * that thread with one event per generated token and one at the end. The callback only
 * copies the token (and its log-probabilities, computed from the logits the event lends)
 * into the job's ring and wakes the consumer: the worker never blocks on a connection. A
 * job whose consumer falls ring_cap events behind (a stalled client) is cancelled and ends
 * SRV_FINISH_SLOW, so it never holds a sequence for nothing.
 *
 * Locks: w->mu guards the published state and the registry of live jobs (fields marked
 * below); each job's mu guards its ring and results. Order: w->mu before job->mu, never
 * the reverse. The scheduler has its own lock for submit, cancel and metrics.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "server/server.h"

/* ------------------------------------------------------------------ the worker */

struct srv_worker {
    struct srv_worker_params p;
    pthread_t                th;
    bool                     started;

    pthread_mutex_t mu;
    /* Protected by mu. */
    enum srv_state  state;
    struct dsv4_err load_err;
    bool            stop;
    struct srv_job *live;                 /* jobs submitted and not yet done (list) */
    int             live_by_tier[SRV_N_TIERS];

    /* Written by the worker thread before state becomes READY; immutable afterwards. */
    dsv4_engine           *e;
    dsv4_tokenizer        *tok;
    dsv4_sched            *sched;
    struct dsv4_model_info info;
    struct dsv4_engine_settings settings; /* the engine's options in effect */
    struct dsv4_sched_plan plan;
    int32_t                eos;
    int                    ctx;           /* the scheduler's max_ctx */
    bool                   warm_done;     /* the standby's warm-up request ended (worker thread only) */
};

/* One startup line with every engine option in effect (the test of the serve options
 * reads it, and /metrics has the same as dsv4_engine_info). */
static void log_settings(const struct srv_worker *w)
{
    const struct dsv4_engine_settings *es = &w->settings;
    srv_log(w->p.log, w->p.log_ud, DSV4_LOG_INFO,
            "engine: backend %s, level %s, %d threads, gemm-min %d,%d,%d, tiles %s, revision %s, profile %s, "
            "expert ranks %d, dispatch %s",
            es->backend, es->level, es->n_threads, es->gemm_min[0], es->gemm_min[1], es->gemm_min[2],
            es->tiles ? "on" : "off", es->revision == DSV4_REVISION_INITIAL ? "initial" : "current",
            es->profiling ? "on" : "off", es->ep_ranks, es->ep_dispatch == DSV4_EP_TOKENS ? "tokens" : "rows");
}

static int load(struct srv_worker *w, struct dsv4_err *err)
{
    struct dsv4_engine_params ep = w->p.engine;
    if (!ep.log) {
        ep.log    = w->p.log;
        ep.log_ud = w->p.log_ud;
    }
    int rc = dsv4_engine_open(&w->e, w->p.model_dir, &ep, err);
    if (rc) return rc;
    dsv4_engine_info(w->e, &w->info);
    dsv4_engine_settings(w->e, &w->settings);
    log_settings(w);
    char path[4096];
    snprintf(path, sizeof(path), "%s/tokenizer.json", w->p.model_dir);
    if (access(path, R_OK) == 0) {
        if ((rc = dsv4_tokenizer_load(&w->tok, path, err))) return rc;
        if (dsv4_tokenizer_n_vocab(w->tok) > w->info.vocab_size)
            srv_log(w->p.log, w->p.log_ud, DSV4_LOG_WARN,
                    "tokenizer.json has %d ids, the model %d: ids past the model's vocabulary are never generated",
                    (int)dsv4_tokenizer_n_vocab(w->tok), w->info.vocab_size);
        w->eos = dsv4_tokenizer_eos(w->tok);
    } else {
        w->eos = w->info.eos_id;
        srv_log(w->p.log, w->p.log_ud, DSV4_LOG_WARN, "%s: no tokenizer.json: token ids only (/v1/completions)",
                w->p.model_dir);
    }
    struct dsv4_sched_params sp;
    dsv4_sched_params_default(&sp);
    sp.max_ctx        = w->p.ctx < w->info.max_ctx ? w->p.ctx : w->info.max_ctx;
    if (w->p.ctx > w->info.max_ctx)
        srv_log(w->p.log, w->p.log_ud, DSV4_LOG_WARN,
                "--ctx %d is above the model's maximum context of %d tokens: serving %d tokens per sequence",
                w->p.ctx, w->info.max_ctx, w->info.max_ctx);
    sp.max_seqs       = w->p.max_seqs;
    sp.max_queue      = w->p.max_queue;
    sp.tier_tokens[0] = w->p.tier_tokens[0];
    sp.tier_tokens[1] = w->p.tier_tokens[1];
    if (w->p.max_batch_tokens) sp.max_batch_tokens = w->p.max_batch_tokens;
    if (sp.max_batch_tokens < sp.max_seqs) sp.max_batch_tokens = sp.max_seqs;
    if (w->p.max_prefill_tokens >= 0) sp.max_prefill_tokens = w->p.max_prefill_tokens;
    if (w->p.prefill_share >= 0) sp.prefill_share = w->p.prefill_share;
    if (w->p.kv_pages) sp.kv_pages = w->p.kv_pages;
    if (w->p.prefix_entries != -2) sp.prefix_entries = w->p.prefix_entries;
    sp.keep_finished = w->p.keep_finished;
    sp.kv_disk_dir    = w->p.kv_disk_dir;
    sp.kv_disk_budget = w->p.kv_disk_budget;
    sp.spec_draft = w->p.spec_draft >= 0 ? w->p.spec_draft : w->info.has_mtp ? DSV4_SPEC_DRAFT_DEFAULT : 0;
    if (w->p.mem_limit) sp.mem_limit = w->p.mem_limit;
    if ((rc = dsv4_sched_plan(w->e, &sp, &w->plan, err))) return rc;
    srv_log(w->p.log, w->p.log_ud, DSV4_LOG_INFO,
            "%d sequences of %d tokens, %d KV pages of %d positions, %d prefix-cache entries: %.1f MiB planned",
            w->plan.n_slots, sp.max_ctx, w->plan.n_pages, w->plan.page_tokens, w->plan.n_prefix_entries,
            (double)w->plan.total / (1024.0 * 1024.0));
    if ((rc = dsv4_sched_create(w->e, &sp, &w->sched, err))) return rc;
    w->ctx = sp.max_ctx;
    return DSV4_OK;
}

/* log p of every token is logits - lse; the chosen token's and the n_top best. */
static void fill_logprobs(const float *logits, int vocab, int n_top, struct srv_token *t)
{
    float mx = logits[0];
    for (int i = 1; i < vocab; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0;
    for (int i = 0; i < vocab; i++) sum += exp((double)logits[i] - mx);
    double lse = (double)mx + log(sum);
    t->logprob = (float)((double)logits[t->id] - lse);
    t->n_top   = 0;
    for (int i = 0; i < vocab && n_top > 0; i++) { /* insertion into a sorted top list; ties: lower id first */
        float v = logits[i];
        if (t->n_top == n_top && v <= t->top_lp[n_top - 1]) continue;
        int k = t->n_top < n_top ? t->n_top++ : n_top - 1;
        while (k > 0 && t->top_lp[k - 1] < v) {
            t->top_lp[k] = t->top_lp[k - 1];
            t->top_id[k] = t->top_id[k - 1];
            k--;
        }
        t->top_lp[k] = v;
        t->top_id[k] = i;
    }
    for (int k = 0; k < t->n_top; k++) t->top_lp[k] = (float)((double)t->top_lp[k] - lse);
}

static void unlink_job(struct srv_worker *w, struct srv_job *j)
{
    pthread_mutex_lock(&w->mu);
    if (j->prev) j->prev->next = j->next;
    else if (w->live == j) w->live = j->next;
    if (j->next) j->next->prev = j->prev;
    j->prev = j->next = NULL;
    w->live_by_tier[j->tier]--;
    pthread_mutex_unlock(&w->mu);
}

/* The scheduler's events, on the worker thread. */
static void on_event(void *ud, const struct dsv4_sched_event *ev)
{
    struct srv_job    *j = ud;
    struct srv_worker *w = j->worker;
    double             now = srv_now();
    if (ev->kind == DSV4_SCHED_TOKEN) {
        struct srv_token t = { .id = ev->token };
        if (j->logprobs && ev->logits) fill_logprobs(ev->logits, w->info.vocab_size, j->top_logprobs, &t);
        if (!j->slow && !srv_job_push(j, &t)) {
            j->slow = true;
            dsv4_sched_cancel(w->sched, j->sched_id);
            return;
        }
        srv_metrics_add(w->p.metrics, SRV_C_GEN_TOKENS, 1);
        srv_metrics_observe(w->p.metrics, ev->index ? SRV_H_ITL : SRV_H_TTFT,
                            ev->index ? now - j->t_last : now - j->t_submit);
        j->t_last = now;
        return;
    }
    const struct dsv4_sched_usage *u = &ev->usage;
    srv_metrics_add(w->p.metrics, SRV_C_PROMPT_TOKENS, u->prompt_tokens);
    srv_metrics_add(w->p.metrics, SRV_C_CACHED_TOKENS, u->cached_tokens);
    srv_metrics_add(w->p.metrics, SRV_C_PREEMPTIONS, u->preemptions);
    srv_metrics_observe(w->p.metrics, SRV_H_QUEUE, u->queue_s);
    if (u->completion_tokens > 0) srv_metrics_observe(w->p.metrics, SRV_H_E2E, u->total_s);
    enum srv_finish f   = SRV_FINISH_ERROR;
    char            msg[160] = "";
    switch (ev->finish) {
    case DSV4_FINISH_STOP: f = SRV_FINISH_EOS; break;
    case DSV4_FINISH_LENGTH: f = SRV_FINISH_LENGTH; break;
    case DSV4_FINISH_CANCELLED: f = j->slow ? SRV_FINISH_SLOW : SRV_FINISH_CANCELLED; break;
    case DSV4_FINISH_DEADLINE: snprintf(msg, sizeof(msg), "the request's deadline passed"); break;
    default: snprintf(msg, sizeof(msg), "the forward pass failed (%s)", dsv4_status_str(ev->status)); break;
    }
    if (f == SRV_FINISH_SLOW) {
        snprintf(msg, sizeof(msg), "the client did not read the stream fast enough");
        srv_metrics_add(w->p.metrics, SRV_C_FINISH_SLOW, 1);
    }
    pthread_mutex_lock(&j->mu);
    j->n_cached = u->cached_tokens;
    pthread_mutex_unlock(&j->mu);
    unlink_job(w, j);
    srv_job_finish(j, f, msg[0] ? msg : NULL);
    srv_job_unref(j); /* the worker's reference */
}

static void warm_event(void *ud, const struct dsv4_sched_event *ev)
{
    struct srv_worker *w = ud;
    if (ev->kind != DSV4_SCHED_TOKEN) w->warm_done = true;
}

/* Before the state turns READY (unless --lazy-weights): every page of the weights read in
 * place read into memory and mapped, so that the first requests do not pay a page fault per
 * 4 KiB of checkpoint they touch (on a 12 GB model, about a third of the first 512-token
 * prefill: docs/PERF.md "Issue 40 so far"). */
static void map_weights(struct srv_worker *w)
{
    double  t0    = srv_now();
    int64_t bytes = dsv4_engine_make_resident(w->e);
    if (bytes < 0) srv_log(w->p.log, w->p.log_ud, DSV4_LOG_WARN, "out of memory reading the weights in");
    else
        srv_log(w->p.log, w->p.log_ud, DSV4_LOG_INFO, "%.2f GB of weights read into memory and mapped in %.2f s",
                (double)bytes / 1e9, srv_now() - t0);
}

/* A standby's warm-up, after map_weights: one short request (two prompt tokens, one
 * generated) through the scheduler, so that the step's code, its scratch and the thread pool
 * have run once. */
static void warm(struct srv_worker *w)
{
    double  t1    = srv_now();
    int32_t prompt[2] = { w->info.bos_id >= 0 ? w->info.bos_id : 0, 0 };
    struct dsv4_request req = { .prompt = prompt, .n_prompt = 2, .max_tokens = 1, .on_event = warm_event, .ud = w };
    dsv4_sampler_params_default(&req.sampling);
    uint64_t        id;
    struct dsv4_err err;
    int             rc = dsv4_sched_submit(w->sched, &req, &id, &err);
    for (int steps = 0; !rc && !w->warm_done; steps++) { /* bounded: one that cannot be scheduled must not hang us */
        if (steps < 64) {
            rc = dsv4_sched_step(w->sched, &err);
        } else {
            dsv4_sched_cancel(w->sched, id); /* it ends in the worker loop */
            rc = srv_err(&err, DSV4_EINVAL, "it did not finish in 64 steps");
        }
    }
    if (rc) srv_log(w->p.log, w->p.log_ud, DSV4_LOG_WARN, "standby: the warm-up request failed: %s", err.msg);
    else srv_log(w->p.log, w->p.log_ud, DSV4_LOG_INFO, "standby: warm-up request in %.2f s", srv_now() - t1);
}

static void *worker_main(void *arg)
{
    struct srv_worker *w = arg;
    struct dsv4_err    err;
    int                rc = load(w, &err);
    if (!rc && w->p.map_weights) map_weights(w);
    if (!rc && w->p.warm) warm(w);
    pthread_mutex_lock(&w->mu);
    if (rc) {
        w->load_err = err;
        w->state    = SRV_STATE_FAILED;
        pthread_mutex_unlock(&w->mu);
        srv_log(w->p.log, w->p.log_ud, DSV4_LOG_ERROR, "%s", err.msg);
        return NULL;
    }
    w->state = SRV_STATE_READY;
    pthread_mutex_unlock(&w->mu);
    struct dsv4_sched_metrics before, after;
    dsv4_sched_metrics(w->sched, &before);
    for (;;) {
        pthread_mutex_lock(&w->mu);
        bool stop = w->stop;
        pthread_mutex_unlock(&w->mu);
        if (stop) break;
        if (dsv4_sched_is_idle(w->sched)) {
            dsv4_sched_wait(w->sched, 0.05);
            continue;
        }
        double t0 = srv_now();
        if (dsv4_sched_step(w->sched, &err))
            srv_log(w->p.log, w->p.log_ud, DSV4_LOG_ERROR, "scheduler step: %s", err.msg);
        double t1 = srv_now();
        dsv4_sched_metrics(w->sched, &after);
        if (after.steps > before.steps) {
            srv_metrics_observe(w->p.metrics, SRV_H_STEP, t1 - t0);
            srv_metrics_observe(w->p.metrics, SRV_H_BATCH,
                                (double)(after.prefill_tokens + after.decode_tokens - before.prefill_tokens -
                                         before.decode_tokens));
        } else {
            struct timespec ts = { 0, 1000 * 1000 }; /* nothing could run (e.g. memory): do not spin */
            nanosleep(&ts, NULL);
        }
        before = after;
    }
    /* every job still pending ends CANCELLED through its DONE event */
    dsv4_sched_free(w->sched);
    w->sched = NULL;
    return NULL;
}

int srv_worker_start(struct srv_worker **out, const struct srv_worker_params *p, struct dsv4_err *err)
{
    *out = NULL;
    if (srv_worker_params_check(p, err)) return DSV4_EINVAL;
    struct srv_worker *w = calloc(1, sizeof(*w));
    if (!w) return srv_err(err, DSV4_ENOMEM, "out of memory for the worker");
    w->p = *p;
    pthread_mutex_init(&w->mu, NULL);
    w->state = SRV_STATE_LOADING;
    if (pthread_create(&w->th, NULL, worker_main, w) != 0) {
        pthread_mutex_destroy(&w->mu);
        free(w);
        return srv_err(err, DSV4_ENOMEM, "could not start the worker thread");
    }
    w->started = true;
    *out       = w;
    return DSV4_OK;
}

enum srv_state srv_worker_state(struct srv_worker *w, struct dsv4_err *err)
{
    pthread_mutex_lock(&w->mu);
    enum srv_state st = w->state;
    if (st == SRV_STATE_FAILED && err) *err = w->load_err;
    pthread_mutex_unlock(&w->mu);
    return st;
}

const dsv4_tokenizer *srv_worker_tokenizer(struct srv_worker *w)
{
    return w->tok;
}

void srv_worker_info(struct srv_worker *w, struct dsv4_model_info *info, int *ctx)
{
    *info = w->info;
    if (ctx) *ctx = w->ctx;
}

int srv_worker_tier(const struct srv_worker *w, int n_prompt)
{
    return n_prompt <= w->p.tier_tokens[0] ? 0 : n_prompt <= w->p.tier_tokens[1] ? 1 : 2;
}

int srv_worker_submit(struct srv_worker *w, struct srv_job *j, struct dsv4_err *err)
{
    pthread_mutex_lock(&w->mu);
    if (w->state != SRV_STATE_READY || w->stop) {
        pthread_mutex_unlock(&w->mu);
        return srv_err(err, DSV4_ECANCELED, "the model is not ready");
    }
    /* registered first: the scheduler may finish the job before submit returns */
    j->worker = w;
    j->tier   = srv_worker_tier(w, j->n_prompt);
    j->next   = w->live;
    j->prev   = NULL;
    if (w->live) w->live->prev = j;
    w->live = j;
    w->live_by_tier[j->tier]++;
    srv_job_ref(j);
    pthread_mutex_unlock(&w->mu);
    struct dsv4_request req = {
        .prompt     = j->prompt,
        .n_prompt   = j->n_prompt,
        .max_tokens = j->max_tokens,
        .sampling   = j->sp,
        .stop_ids   = &w->eos,
        .n_stop     = j->ignore_eos ? 0 : 1,
        .spec_draft = j->spec_draft,
        .on_event   = on_event,
        .ud         = j,
    };
    uint64_t id = 0;
    pthread_mutex_lock(&j->mu); /* sched_id is read by cancel on other threads */
    int rc = dsv4_sched_submit(w->sched, &req, &id, err);
    j->sched_id = id;
    pthread_mutex_unlock(&j->mu);
    if (rc) {
        unlink_job(w, j);
        srv_job_unref(j);
    }
    return rc;
}

void srv_worker_cancel(struct srv_worker *w, struct srv_job *j)
{
    atomic_store(&j->cancel, true);
    pthread_mutex_lock(&j->mu);
    bool     done = j->finish != SRV_FINISH_NONE;
    uint64_t id   = j->sched_id;
    pthread_mutex_unlock(&j->mu);
    if (!done && id) dsv4_sched_cancel(w->sched, id);
}

void srv_worker_cancel_all(struct srv_worker *w)
{
    pthread_mutex_lock(&w->mu);
    for (struct srv_job *j = w->live; j; j = j->next) {
        atomic_store(&j->cancel, true);
        if (j->sched_id) dsv4_sched_cancel(w->sched, j->sched_id);
    }
    pthread_mutex_unlock(&w->mu);
}

void srv_worker_stats(struct srv_worker *w, struct srv_worker_stats *st)
{
    memset(st, 0, sizeof(*st));
    pthread_mutex_lock(&w->mu);
    st->state = w->state;
    int live[SRV_N_TIERS];
    memcpy(live, w->live_by_tier, sizeof(live));
    pthread_mutex_unlock(&w->mu);
    if (st->state != SRV_STATE_READY) return;
    dsv4_sched_metrics(w->sched, &st->sched);
    st->max_seqs    = w->plan.n_slots;
    st->ctx         = w->ctx;
    st->max_queue   = w->p.max_queue;
    st->page_tokens = w->plan.page_tokens;
    st->has_engine  = true;
    st->engine      = w->settings;
    for (int t = 0; t < SRV_N_TIERS; t++) {
        st->running[t] = st->sched.running_by_tier[t];
        st->waiting[t] = live[t] > st->running[t] ? live[t] - st->running[t] : 0;
    }
}

void srv_worker_stop(struct srv_worker *w)
{
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_mutex_unlock(&w->mu);
    if (w->started) pthread_join(w->th, NULL);
    dsv4_sched_free(w->sched); /* only if the loop never ran (load failed after creating it) */
    dsv4_tokenizer_free(w->tok);
    dsv4_engine_close(w->e);
    pthread_mutex_destroy(&w->mu);
    free(w);
}
