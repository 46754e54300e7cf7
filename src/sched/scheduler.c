/*
 * scheduler.c - continuous batching (include/dsv4.h "Serving"; docs/SERVING.md): a bounded
 * waiting queue, a running set of at most max_seqs sequences, and steps that each run one
 * forward pass over one decode row per decoding sequence plus prefill chunks.
 *
 * Policy, in the order a step applies it:
 *   1. requests submitted since the last step join the waiting queue (FIFO);
 *   2. cancelled requests and those past their deadline end (slot and pages freed);
 *   3. admission, oldest first: a request is admitted when a slot is free, its length tier
 *      is below its concurrency limit (a request of a full tier is skipped, so long prompts
 *      do not hold back short ones) and the pool can hold its known tokens plus one; the
 *      kept sequences (keep_finished: finished ones whose slot stayed as it ended) and then
 *      the prefix cache are consulted first (a kept sequence whose tokens begin the request's
 *      resumes at its end, a cache hit at a page boundary, both bit-exactly); kept sequences
 *      give way for slots and pages. When memory is short admission stops, so a large
 *      request is not overtaken forever;
 *   4. the batch: every decoding sequence gets its row (decode is never starved), then
 *      prefilling sequences, oldest first, get chunks from what is left of max_batch_tokens,
 *      while anything decodes at most max_prefill_tokens in all and at most what fits in
 *      prefill_share of a decode step's time (the bound on the latency a long prompt adds to
 *      running streams; the cost of a decode step and of one prefill row are measured as
 *      the steps run, as moving averages). With the prefix cache on, a chunk ends at the
 *      next page boundary, where the state is snapshotted;
 *   5. pages for the batch: when the pool runs dry (after evicting cache entries and kept
 *      sequences), the newest
 *      running sequence is preempted - its slot and pages freed, the request put back at the
 *      head of the queue with its tokens so far, to be recomputed - until the rest fits;
 *   6. the forward pass and sampling, inside the allocation guard;
 *   7. results: full pages enter the prefix cache, tokens are reported, sequences that
 *      sampled a stop id, reached max_tokens or filled the context end, as do requests
 *      cancelled during the step.
 *
 * Determinism: a request's output is a function of its tokens and sampler alone. The
 * forward pass is batch- and chunk-invariant, a prefix-cache hit restores the exact state,
 * and a preempted request recomputes its own tokens and keeps its sampler's state.
 *
 * Threads: submit, cancel, metrics, is_idle and wait may be called from any thread; they
 * touch only the fields marked "mu" below. Everything else, including the KV pool and the
 * waiting and running sets, belongs to the thread that steps.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv/kv_pool.h"
#include "model/runtime.h"

/* Host memory for the disk tier's read buffers (kv_tier.h: prefetch). */
#define PREFETCH_BYTES ((size_t)64 << 20)

enum rq_state { RQ_QUEUED, RQ_WAITING, RQ_RUNNING };

struct rq {
    uint64_t            id;
    struct rq          *prev, *next; /* inbox (mu) or waiting queue (stepper) */
    enum rq_state       state;
    int                 live_idx;    /* index in live[] (mu) */
    atomic_bool         cancel;
    int32_t            *tok;         /* [cap] prompt, then generated tokens */
    int                 n_prompt, n_tok, cap, n_gen, max_tokens;
    int32_t            *stop;        /* [n_stop] */
    int                 n_stop;
    dsv4_sampler       *sampler;
    enum dsv4_tier      tier;
    double              t_submit, t_admit, t_first, deadline;
    dsv4_sched_event_fn fn;
    void               *ud;
    int                 slot;        /* KV slot while running */
    int                 cached;      /* positions resumed from the prefix cache, first admission */
    int                 n_preempt;
    bool                admitted;    /* admitted at least once */
    bool                pf_asked;    /* its disk chain's prefetch was asked for (or not needed) */
    /* speculative decoding (docs/SPECULATIVE.md) */
    int                 spec_k;      /* most drafts a step (0: never) */
    float               spec_rate;   /* moving average of the share of drafts kept */
    int                 spec_pause;  /* tokens to decode without drafts (low acceptance) */
    /* this step */
    int                 chunk;       /* rows in the batch (0: none) */
    int                 k;           /* drafts among them (chunk = 1 + k) */
    bool                logits;      /* samples after this step */
    int32_t             sampled;
    float               prob;
    int32_t             out[DSV4_SPEC_MAX_DRAFT + 1]; /* a verify step's tokens and their probabilities */
    float               out_prob[DSV4_SPEC_MAX_DRAFT + 1];
    int                 n_out;
};

/* A finished sequence kept as it ended (keep_finished): its slot, still holding the state of
 * tok[0, n), and those tokens. */
struct kept_seq {
    int      slot, n;
    int32_t *tok;
};

struct dsv4_sched {
    dsv4_engine              *engine;
    const struct dsv4_model  *m;
    struct dsv4_sched_params  p;      /* resolved */
    struct dsv4_sched_plan    plan;
    int                       tier_limit[DSV4_TIER_COUNT];
    struct dsv4_kv_pool       kv;
    struct dsv4_kv_tier      *disk;    /* the prefix cache's disk tier (kv_disk_dir), or NULL */
    struct dsv4_kv_disk_key  *pf_keys; /* [pages_per_seq] a waiting request's disk chain */
    struct rq                *pf_owner; /* the request whose chain is prefetched, or NULL */
    struct dsv4_step          step;
    float                    *logits;  /* [max_seqs * (spec_draft + 1), vocab] the rows sampled from */
    struct dsv4_fwd_seq      *fs;      /* [max_seqs] */
    struct dsv4_spec_undo    *undo;    /* [max_seqs] per slot, when speculating */
    float                    *draft_logits; /* [max_seqs, draft_rows, vocab] the MTP block's (V4.1: the
                                               DSpark block's), per slot */
    int                       draft_rows;   /* spec_draft (V4.1: at least dspark_block, spec_rows()) */
    struct dsv4_fwd_seq      *dfs;     /* [max_seqs] one depth of draft rows */
    int32_t                  *dprev;   /* [max_seqs] V4.1: the token before each DSpark row */
    int                      *dcand;   /* [max_seqs] V4.1: the candidate of each DSpark block of a call */
    struct rq               **cand;    /* [max_seqs] candidates of the batch being built */
    struct rq               **running; /* [max_seqs] in admission order */
    int                       n_running;
    struct kept_seq          *kept;    /* [max_seqs] kept sequences, least recently finished first */
    int                       n_kept;
    int                       running_by_tier[DSV4_TIER_COUNT];
    struct rq                *wait_head, *wait_tail;
    int                       n_waiting;
    struct dsv4_sched_metrics acc;     /* stepper's counters */
    double                    t_decode; /* moving average: seconds of a decode-only step */
    double                    t_row;    /* moving average: seconds one prefill row adds (< 0: unknown) */

    pthread_mutex_t           mu;
    pthread_cond_t            cv;      /* signalled on submission (mu) */
    struct rq                *in_head, *in_tail; /* submitted, not yet seen by a step (mu) */
    int                       n_queued;          /* inbox + waiting: the queue bound (mu) */
    int                       n_active;          /* queued + running (mu) */
    struct rq               **live;              /* [live_cap] every pending request (mu) */
    int                       n_live, live_cap;
    uint64_t                  next_id;           /* (mu) */
    uint64_t                  submitted, refused; /* (mu) */
    struct dsv4_sched_metrics pub;               /* as of the last step (mu) */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int max_i(int a, int b)
{
    return a > b ? a : b;
}

static int min_i(int a, int b)
{
    return a < b ? a : b;
}

const char *dsv4_finish_str(enum dsv4_finish f)
{
    switch (f) {
    case DSV4_FINISH_STOP: return "stop";
    case DSV4_FINISH_LENGTH: return "length";
    case DSV4_FINISH_CANCELLED: return "cancelled";
    case DSV4_FINISH_DEADLINE: return "deadline";
    case DSV4_FINISH_ERROR: return "error";
    default: return "";
    }
}

/* ------------------------------------------------------------------ parameters and plan */

void dsv4_sched_params_default(struct dsv4_sched_params *p)
{
    memset(p, 0, sizeof(*p));
    p->max_ctx            = 0;
    p->max_seqs           = 8;
    p->max_batch_tokens   = 512;
    p->max_prefill_tokens = 128;
    p->prefill_share      = 1.0f;
    p->prefix_entries     = -1;
    p->max_queue          = 256;
    p->tier_tokens[0]     = 512;
    p->tier_tokens[1]     = 4096;
}

/* Fills the defaults that depend on other parameters or the model, and checks ranges. */
static int resolve(const struct dsv4_model *m, const struct dsv4_sched_params *in, struct dsv4_sched_params *p,
                   int tier_limit[DSV4_TIER_COUNT], struct dsv4_err *err)
{
    *p = *in;
    if (p->max_ctx == 0) p->max_ctx = m->cfg.max_ctx < 4096 ? m->cfg.max_ctx : 4096;
    if (p->max_ctx < 1 || p->max_ctx > m->cfg.max_ctx)
        return dsv4_err_set(err, DSV4_EINVAL, "context length %d outside [1, %d] (max_position_embeddings)", p->max_ctx,
                            m->cfg.max_ctx);
    if (p->max_seqs < 1 || p->max_seqs > 4096)
        return dsv4_err_set(err, DSV4_EINVAL, "max_seqs %d outside [1, 4096]", p->max_seqs);
    if (p->max_batch_tokens < p->max_seqs || p->max_batch_tokens > 65536)
        return dsv4_err_set(err, DSV4_EINVAL, "max_batch_tokens %d outside [max_seqs = %d, 65536]", p->max_batch_tokens,
                            p->max_seqs);
    if (p->max_prefill_tokens < 0)
        return dsv4_err_set(err, DSV4_EINVAL, "max_prefill_tokens %d is negative", p->max_prefill_tokens);
    if (!(p->prefill_share >= 0) || p->prefill_share > 1000)
        return dsv4_err_set(err, DSV4_EINVAL, "prefill_share %g outside [0, 1000]", (double)p->prefill_share);
    if (p->page_tokens == 0) p->page_tokens = DSV4_KV_PAGE_TOKENS;
    if (!dsv4_kv_page_tokens_ok(&m->cfg.kv, p->page_tokens))
        return dsv4_err_set(err, DSV4_EINVAL, "page size %d is not a power of two that every compression ratio divides",
                            p->page_tokens);
    int pps = (p->max_ctx + p->page_tokens - 1) / p->page_tokens;
    if (p->kv_pages == 0) p->kv_pages = p->max_seqs * pps;
    if (p->kv_pages < 1) return dsv4_err_set(err, DSV4_EINVAL, "kv_pages %d must be positive", p->kv_pages);
    if (p->prefix_entries < 0) p->prefix_entries = 4 * p->max_seqs;
    if (p->max_queue < 1) return dsv4_err_set(err, DSV4_EINVAL, "max_queue %d must be positive", p->max_queue);
    if (p->kv_disk_budget == 0) p->kv_disk_budget = (uint64_t)10 << 30;
    if (p->kv_disk_dir && !*p->kv_disk_dir) p->kv_disk_dir = NULL;
    if (p->kv_disk_dir && p->prefix_entries == 0)
        return dsv4_err_set(err, DSV4_EINVAL, "the prefix cache's disk tier needs the prefix cache (prefix entries 0)");
    if (p->tier_tokens[0] < 1 || p->tier_tokens[1] < p->tier_tokens[0])
        return dsv4_err_set(err, DSV4_EINVAL, "tier limits %d and %d must be positive and increasing", p->tier_tokens[0],
                            p->tier_tokens[1]);
    if (p->spec_draft < 0 || p->spec_draft > DSV4_SPEC_MAX_DRAFT)
        return dsv4_err_set(err, DSV4_EINVAL, "spec_draft %d outside [0, %d]", p->spec_draft, DSV4_SPEC_MAX_DRAFT);
    if (p->spec_draft && !m->w.has_mtp)
        return dsv4_err_set(err, DSV4_EUNSUPPORTED, "speculative decoding needs a checkpoint with an MTP block");
    if (p->spec_max_batch < 0) return dsv4_err_set(err, DSV4_EINVAL, "spec_max_batch %d is negative", p->spec_max_batch);
    if (p->spec_max_batch == 0) p->spec_max_batch = 4;
    if (p->keep_finished < -1) return dsv4_err_set(err, DSV4_EINVAL, "keep_finished %d is below -1", p->keep_finished);
    if (p->keep_finished == -1 || p->keep_finished > p->max_seqs) p->keep_finished = p->max_seqs;
    for (int t = 0; t < DSV4_TIER_COUNT; t++) {
        int def = t == DSV4_TIER_LONG ? (p->max_seqs / 4 > 1 ? p->max_seqs / 4 : 1) : p->max_seqs;
        tier_limit[t] = p->tier_max_running[t] > 0 ? p->tier_max_running[t] : def;
        if (p->tier_max_running[t] < 0)
            return dsv4_err_set(err, DSV4_EINVAL, "tier %d concurrency %d is negative", t, p->tier_max_running[t]);
    }
    return DSV4_OK;
}

static double gib(size_t b)
{
    return (double)b / (1024.0 * 1024.0 * 1024.0);
}

/* Draft logits rows a slot keeps: one per draft (V4's MTP block), a whole block (V4.1's DSpark
 * stages draft dspark_block rows at once). */
static int spec_rows(const struct dsv4_model *m, const struct dsv4_sched_params *p)
{
    int B = m->cfg.arch == DSV4_ARCH_V4_1 ? m->cfg.v41.dspark_block : 0;
    return p->spec_draft > B ? p->spec_draft : B;
}

static int make_plan(const struct dsv4_model *m, const struct dsv4_sched_params *p, struct dsv4_sched_plan *plan,
                     struct dsv4_err *err)
{
    memset(plan, 0, sizeof(*plan));
    struct dsv4_kv_pool_params kp = { p->max_ctx, p->max_seqs, p->page_tokens, p->kv_pages, p->prefix_entries,
                                      p->spec_draft > 0 };
    struct dsv4_kv_plan        kv;
    int                        rc = dsv4_kv_pool_plan(&m->cfg.kv, m->row_fmt, &kp, &kv, err);
    if (rc) return rc;
    plan->page_tokens      = p->page_tokens;
    plan->n_slots          = p->max_seqs;
    plan->n_pages          = p->kv_pages;
    plan->n_prefix_entries = p->prefix_entries;
    plan->slot_bytes       = kv.slot_bytes;
    plan->page_bytes       = kv.page_bytes;
    plan->snapshot_bytes   = kv.snap_bytes;
    plan->slots            = kv.slots;
    plan->pages            = kv.pages;
    plan->snapshots        = kv.snapshots;
    plan->tables           = kv.tables + (sizeof(struct dsv4_fwd_seq) + 2 * sizeof(void *)) * (size_t)p->max_seqs;
    plan->step             = dsv4_step_bytes(m, p->max_batch_tokens, p->max_ctx);
    size_t V = (size_t)m->cfg.vocab_size, K = (size_t)p->spec_draft;
    plan->logits           = sizeof(float) * V * (size_t)p->max_seqs * (K + 1);
    plan->spec             = K ? (dsv4_spec_undo_bytes(&m->cfg, (int)K + 1) + sizeof(float) * V * (size_t)spec_rows(m, p) +
                                  sizeof(struct dsv4_fwd_seq) + sizeof(int32_t)) * (size_t)p->max_seqs
                               : 0;
    plan->total = plan->slots + plan->pages + plan->snapshots + plan->tables + plan->step + plan->logits + plan->spec;
    if (p->mem_limit) {
        plan->mem_limit = p->mem_limit;
    } else {
        /* the backend's memory, as it says (the CPU: /proc/meminfo) */
        size_t avail, total;
        if (!m->backend->memory || m->backend->memory(m->backend_impl, &avail, &total) != DSV4_OK) {
            plan->mem_limit = (size_t)-1; /* no way to tell: no limit */
            return DSV4_OK;
        }
        struct dsv4_model_stats ms;
        dsv4_model_stats(&m->cfg, &m->ck, &ms);
        plan->mem_available = avail;
        /* weights in that memory that `avail` does not show yet, as the backend says (the CPU:
         * the checkpoint pages read in place, all but those its tiles replaced; the tiles
         * themselves are allocated already, so they are out of `avail`) */
        plan->weights_bytes = m->backend->weights_resident
                                  ? m->backend->weights_resident(m->backend_impl, (size_t)ms.bytes_total)
                                  : 0;
        plan->margin        = total / 20 > ((size_t)512 << 20) ? total / 20 : ((size_t)512 << 20);
        size_t used         = plan->weights_bytes + plan->margin;
        plan->mem_limit     = avail > used ? avail - used : 0;
    }
    if (plan->total > plan->mem_limit) {
        if (p->mem_limit)
            return dsv4_err_set(err, DSV4_ENOMEM,
                                "the serving plan needs %.2f GiB (KV pages %.2f, slots %.2f, prefix snapshots %.2f, "
                                "step scratch %.2f) but the memory limit is %.2f GiB; lower the context, the sequence "
                                "count or the page count",
                                gib(plan->total), gib(plan->pages), gib(plan->slots), gib(plan->snapshots),
                                gib(plan->step), gib(plan->mem_limit));
        return dsv4_err_set(err, DSV4_ENOMEM,
                            "the serving plan needs %.2f GiB (KV pages %.2f, slots %.2f, prefix snapshots %.2f, step "
                            "scratch %.2f) but only %.2f GiB may be used (available %.2f GiB - weights %.2f GiB - "
                            "margin %.2f GiB); lower the context, the sequence count or the page count",
                            gib(plan->total), gib(plan->pages), gib(plan->slots), gib(plan->snapshots), gib(plan->step),
                            gib(plan->mem_limit), gib(plan->mem_available), gib(plan->weights_bytes),
                            gib(plan->margin));
    }
    return DSV4_OK;
}

int dsv4_sched_plan(const dsv4_engine *engine, const struct dsv4_sched_params *params, struct dsv4_sched_plan *plan,
                    struct dsv4_err *err)
{
    const struct dsv4_model *m = dsv4_engine_model(engine);
    struct dsv4_sched_params p;
    int                      tl[DSV4_TIER_COUNT];
    int                      rc = resolve(m, params, &p, tl, err);
    if (rc) {
        memset(plan, 0, sizeof(*plan));
        return rc;
    }
    return make_plan(m, &p, plan, err);
}

/* ------------------------------------------------------------------ create and free */

/* The prefix cache's disk tier when kv_disk_dir is set (the pool then reads and writes it). */
static int open_disk_tier(dsv4_sched *s, struct dsv4_err *err)
{
    if (!s->p.kv_disk_dir) return DSV4_OK;
    uint8_t id[DSV4_KV_DISK_ID_BYTES];
    char    compute[256];
    dsv4_engine_compute_text(s->engine, compute, sizeof(compute));
    if (dsv4_model_kv_identity(s->m, compute, s->kv.p.mtp, s->p.page_tokens, s->kv.plan.page_bytes,
                               s->kv.plan.snap_bytes, id))
        return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    struct dsv4_kv_tier_params tp = { .dir = s->p.kv_disk_dir, .budget = s->p.kv_disk_budget,
                                      .page_tokens = s->p.page_tokens, .page_bytes = s->kv.plan.page_bytes,
                                      .snap_bytes = s->kv.plan.snap_bytes };
    /* read buffers for a whole chain, within PREFETCH_BYTES; the rest of a longer one is
     * read on the stepping thread */
    size_t payload = sizeof(int32_t) * (size_t)s->p.page_tokens + tp.page_bytes + tp.snap_bytes;
    tp.n_prefetch  = min_i(s->kv.pages_per_seq, (int)(PREFETCH_BYTES / payload));
    if (!(s->pf_keys = calloc((size_t)s->kv.pages_per_seq, sizeof(*s->pf_keys))))
        return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    struct dsv4_kv_mem kvmem = dsv4_model_kv_mem(s->m);
    int rc = dsv4_kv_tier_open(&s->disk, &tp, id, &kvmem, dsv4_engine_logger(s->engine), err);
    s->kv.tier = s->disk;
    return rc;
}

int dsv4_sched_create(dsv4_engine *engine, const struct dsv4_sched_params *params, dsv4_sched **out,
                      struct dsv4_err *err)
{
    *out = NULL;
    struct dsv4_sched_params def;
    if (!params) {
        dsv4_sched_params_default(&def);
        def.max_ctx = 0;
        params      = &def;
    }
    dsv4_sched *s = calloc(1, sizeof(*s));
    if (!s) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    s->engine = engine;
    s->m      = dsv4_engine_model(engine);
    int rc    = resolve(s->m, params, &s->p, s->tier_limit, err);
    if (!rc) rc = make_plan(s->m, &s->p, &s->plan, err);
    if (rc) {
        free(s);
        return rc;
    }
    const struct dsv4_sched_params *p = &s->p;
    struct dsv4_kv_pool_params kp = { p->max_ctx, p->max_seqs, p->page_tokens, p->kv_pages, p->prefix_entries,
                                      p->spec_draft > 0 };
    struct dsv4_kv_mem kvmem = dsv4_model_kv_mem(s->m);
    rc = dsv4_kv_pool_init(&s->kv, &s->m->cfg.kv, s->m->row_fmt, &kp, &kvmem, err);
    if (rc) {
        free(s);
        return rc;
    }
    rc = dsv4_step_init(&s->step, s->m, p->max_batch_tokens, p->max_ctx, err);
    if (rc) {
        dsv4_kv_pool_free(&s->kv);
        free(s);
        return rc;
    }
    if ((rc = open_disk_tier(s, err))) {
        free(s->pf_keys); /* the tier itself is freed by its open when that fails */
        dsv4_step_free(&s->step);
        dsv4_kv_pool_free(&s->kv);
        free(s);
        return rc;
    }
    size_t ns   = (size_t)p->max_seqs;
    s->live_cap = p->max_queue + 2 * p->max_seqs;
    size_t K    = (size_t)p->spec_draft, V = (size_t)s->m->cfg.vocab_size;
    s->logits   = calloc(ns * (K + 1) * V, sizeof(float));
    s->fs       = calloc(ns, sizeof(*s->fs));
    if (K) {
        s->undo         = calloc(ns, sizeof(*s->undo));
        s->draft_rows   = spec_rows(s->m, p);
        s->draft_logits = calloc(ns * (size_t)s->draft_rows * V, sizeof(float));
        s->dfs          = calloc(ns, sizeof(*s->dfs));
        s->dprev        = calloc(ns, sizeof(*s->dprev));
        s->dcand        = calloc(ns, sizeof(*s->dcand));
        if (!s->undo || !s->draft_logits || !s->dfs || !s->dprev || !s->dcand) {
            dsv4_sched_free(s);
            return dsv4_err_set(err, DSV4_ENOMEM, "out of memory for the speculative buffers");
        }
        for (size_t i = 0; i < ns; i++)
            if ((rc = dsv4_spec_undo_init(&s->undo[i], s->m, (int)K + 1, err))) {
                dsv4_sched_free(s);
                return rc;
            }
    }
    s->cand     = calloc(ns, sizeof(*s->cand));
    s->running  = calloc(ns, sizeof(*s->running));
    s->kept     = calloc(ns, sizeof(*s->kept));
    s->live     = calloc((size_t)s->live_cap, sizeof(*s->live));
    if (!s->logits || !s->fs || !s->cand || !s->running || !s->kept || !s->live) {
        dsv4_sched_free(s);
        return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->t_row           = -1;
    s->pub.slots_total = p->max_seqs;
    s->pub.pages_total = s->pub.pages_free = p->kv_pages;
    s->pub.kv_disk_on  = s->disk != NULL; /* its counters read 0 before the first step */
    *out = s;
    return DSV4_OK;
}

void dsv4_sched_get_plan(const dsv4_sched *s, struct dsv4_sched_plan *plan)
{
    *plan = s->plan;
}

/* ------------------------------------------------------------------ submission (any thread) */

static enum dsv4_tier tier_of(const struct dsv4_sched_params *p, int n_prompt)
{
    return n_prompt <= p->tier_tokens[0] ? DSV4_TIER_SHORT : n_prompt <= p->tier_tokens[1] ? DSV4_TIER_MEDIUM
                                                                                            : DSV4_TIER_LONG;
}

static void rq_free(struct rq *r)
{
    if (!r) return;
    dsv4_sampler_free(r->sampler);
    free(r->tok);
    free(r->stop);
    free(r);
}

int dsv4_sched_submit(dsv4_sched *s, const struct dsv4_request *req, uint64_t *id, struct dsv4_err *err)
{
    const struct dsv4_sched_params *p = &s->p;
    int V = s->m->cfg.vocab_size, pt = p->page_tokens;
    if (id) *id = 0;
    if (!req || !req->prompt || req->n_prompt < 1) return dsv4_err_set(err, DSV4_EINVAL, "empty prompt");
    if (req->n_prompt > p->max_ctx)
        return dsv4_err_set(err, DSV4_ERANGE, "a prompt of %d tokens exceeds the context of %d", req->n_prompt,
                            p->max_ctx);
    if (req->max_tokens < 1) return dsv4_err_set(err, DSV4_EINVAL, "max_tokens %d must be at least 1", req->max_tokens);
    if (req->n_stop < 0 || (req->n_stop > 0 && !req->stop_ids))
        return dsv4_err_set(err, DSV4_EINVAL, "bad stop id list");
    if (!(req->deadline_s >= 0)) return dsv4_err_set(err, DSV4_EINVAL, "deadline %g is negative", req->deadline_s);
    for (int i = 0; i < req->n_prompt; i++)
        if (req->prompt[i] < 0 || req->prompt[i] >= V)
            return dsv4_err_set(err, DSV4_ERANGE, "token id %d at index %d is outside the vocabulary [0, %d)",
                                req->prompt[i], i, V);
    for (int i = 0; i < req->n_stop; i++)
        if (req->stop_ids[i] < 0 || req->stop_ids[i] >= V)
            return dsv4_err_set(err, DSV4_ERANGE, "stop id %d is outside the vocabulary [0, %d)", req->stop_ids[i], V);
    long long longest = (long long)req->n_prompt + req->max_tokens;
    if (longest > p->max_ctx) longest = p->max_ctx;
    if ((longest + pt - 1) / pt > p->kv_pages)
        return dsv4_err_set(err, DSV4_ERANGE, "a request of up to %lld tokens needs more than the %d KV pages of the pool",
                            longest, p->kv_pages);

    struct rq *r = calloc(1, sizeof(*r));
    if (!r) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    long long cap = (long long)req->n_prompt + req->max_tokens;
    if (cap > (long long)p->max_ctx + 1) cap = (long long)p->max_ctx + 1;
    r->spec_k    = req->spec_draft == 0 ? p->spec_draft : req->spec_draft < 0 ? 0 : min_i(req->spec_draft, p->spec_draft);
    if (dsv4_sampler_has_history(&req->sampling)) r->spec_k = 0; /* drafts verify exactly only without penalties */
    r->spec_rate = 1.0f;
    r->cap       = (int)cap + r->spec_k; /* the drafts sit after the tokens while verified */
    r->tok  = malloc(sizeof(int32_t) * (size_t)r->cap);
    r->stop = malloc(sizeof(int32_t) * (size_t)(req->n_stop + 1));
    int rc  = r->tok && r->stop ? dsv4_sampler_create(&r->sampler, V, &req->sampling, err)
                                : dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    if (rc) {
        rq_free(r);
        return rc;
    }
    memcpy(r->tok, req->prompt, sizeof(int32_t) * (size_t)req->n_prompt);
    dsv4_sampler_prime(r->sampler, req->prompt, req->n_prompt);
    if (req->n_stop) memcpy(r->stop, req->stop_ids, sizeof(int32_t) * (size_t)req->n_stop);
    r->n_prompt   = r->n_tok = req->n_prompt;
    r->n_stop     = req->n_stop;
    r->max_tokens = req->max_tokens;
    r->tier       = tier_of(p, req->n_prompt);
    r->fn         = req->on_event;
    r->ud         = req->ud;
    r->slot       = -1;
    r->t_submit   = now_s();
    r->deadline   = req->deadline_s > 0 ? r->t_submit + req->deadline_s : 0;
    atomic_init(&r->cancel, false);

    pthread_mutex_lock(&s->mu);
    if (s->n_queued >= p->max_queue || s->n_live >= s->live_cap) {
        s->refused++;
        int n = s->n_queued;
        pthread_mutex_unlock(&s->mu);
        rq_free(r);
        return dsv4_err_set(err, DSV4_EFULL, "the waiting queue is full (%d requests); retry later", n);
    }
    r->id       = ++s->next_id;
    r->state    = RQ_QUEUED;
    r->live_idx = s->n_live;
    s->live[s->n_live++] = r;
    r->prev = s->in_tail;
    r->next = NULL;
    if (s->in_tail) s->in_tail->next = r;
    else s->in_head = r;
    s->in_tail = r;
    s->n_queued++;
    s->n_active++;
    s->submitted++;
    if (id) *id = r->id;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return DSV4_OK;
}

int dsv4_sched_cancel(dsv4_sched *s, uint64_t id)
{
    int rc = DSV4_EINVAL;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_live; i++)
        if (s->live[i]->id == id) {
            atomic_store(&s->live[i]->cancel, true);
            rc = DSV4_OK;
            break;
        }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

bool dsv4_sched_is_idle(dsv4_sched *s)
{
    pthread_mutex_lock(&s->mu);
    bool idle = s->n_active == 0;
    pthread_mutex_unlock(&s->mu);
    return idle;
}

void dsv4_sched_wait(dsv4_sched *s, double timeout_s)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double t     = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + (timeout_s > 0 ? timeout_s : 0);
    ts.tv_sec    = (time_t)t;
    ts.tv_nsec   = (long)((t - (double)ts.tv_sec) * 1e9);
    pthread_mutex_lock(&s->mu);
    while (s->n_active == 0) {
        if (pthread_cond_timedwait(&s->cv, &s->mu, &ts) != 0) break;
    }
    pthread_mutex_unlock(&s->mu);
}

void dsv4_sched_metrics(dsv4_sched *s, struct dsv4_sched_metrics *m)
{
    pthread_mutex_lock(&s->mu);
    *m           = s->pub;
    m->submitted = s->submitted;
    m->refused   = s->refused;
    pthread_mutex_unlock(&s->mu);
}

/* ------------------------------------------------------------------ request lifecycle (stepper) */

static void emit(struct rq *r, const struct dsv4_sched_event *ev)
{
    if (r->fn) r->fn(r->ud, ev);
}

static void waiting_unlink(dsv4_sched *s, struct rq *r)
{
    if (r->prev) r->prev->next = r->next;
    else s->wait_head = r->next;
    if (r->next) r->next->prev = r->prev;
    else s->wait_tail = r->prev;
    r->prev = r->next = NULL;
    s->n_waiting--;
}

static void running_remove(dsv4_sched *s, struct rq *r)
{
    int i = 0;
    while (s->running[i] != r) i++;
    memmove(s->running + i, s->running + i + 1, sizeof(*s->running) * (size_t)(s->n_running - i - 1));
    s->n_running--;
    s->running_by_tier[r->tier]--;
}

/* Drops a request from the shared bookkeeping (after this, cancel cannot find it). */
static void forget(dsv4_sched *s, struct rq *r, bool queued)
{
    if (s->pf_owner == r) {
        dsv4_kv_tier_prefetch_drop(s->disk);
        s->pf_owner = NULL;
    }
    pthread_mutex_lock(&s->mu);
    if (queued) s->n_queued--;
    s->n_active--;
    struct rq *last = s->live[--s->n_live];
    s->live[r->live_idx] = last;
    last->live_idx       = r->live_idx;
    pthread_mutex_unlock(&s->mu);
}

/* ------------------------------------------------------------------ kept sequences */

/* Removes kept sequence i from the list (its slot is then the caller's) and returns it. */
static struct kept_seq kept_take(dsv4_sched *s, int i)
{
    struct kept_seq k = s->kept[i];
    memmove(&s->kept[i], &s->kept[i + 1], sizeof(*s->kept) * (size_t)(s->n_kept - i - 1));
    s->n_kept--;
    return k;
}

/* The least recently finished kept sequence gives way: its slot and pages are freed. False
 * when none is kept. */
static bool kept_evict(dsv4_sched *s)
{
    if (!s->n_kept) return false;
    struct kept_seq k = kept_take(s, 0);
    dsv4_kv_slot_release(&s->kv, k.slot);
    free(k.tok);
    s->acc.kept_evictions++;
    return true;
}

/* Keeps a running request's slot as it ends, when its state is exactly that of tok[0, pos):
 * a normal end (a stop id or a length limit; a cancelled or failed request may end mid-step)
 * and no position past its tokens (a verify step that met a stop among its kept drafts fed
 * tokens the request no longer has). Takes r->tok. */
static bool kept_add(dsv4_sched *s, struct rq *r, enum dsv4_finish why)
{
    int pos = s->kv.seq[r->slot].pos;
    if (!s->p.keep_finished || (why != DSV4_FINISH_STOP && why != DSV4_FINISH_LENGTH) || pos <= 0 || pos > r->n_tok)
        return false;
    if (s->n_kept == s->p.keep_finished) kept_evict(s);
    s->kept[s->n_kept++] = (struct kept_seq){ .slot = r->slot, .n = pos, .tok = r->tok };
    r->tok = NULL;
    return true;
}

/* The kept sequence whose tokens are the longest prefix of r's, leaving at least one token
 * of r to evaluate (its logits are sampled), or -1. */
static int kept_match(const dsv4_sched *s, const struct rq *r)
{
    int best = -1;
    for (int i = 0; i < s->n_kept; i++) {
        const struct kept_seq *k = &s->kept[i];
        if (k->n < r->n_tok && (best < 0 || k->n > s->kept[best].n) &&
            !memcmp(k->tok, r->tok, sizeof(int32_t) * (size_t)k->n))
            best = i;
    }
    return best;
}

/* Ends a request wherever it is: frees (or keeps) its slot and pages, reports DONE, frees it. */
static void finish(dsv4_sched *s, struct rq *r, enum dsv4_finish why, int32_t stop_id, int status)
{
    bool queued = r->state == RQ_WAITING;
    if (r->state == RQ_RUNNING) {
        if (!kept_add(s, r, why)) dsv4_kv_slot_release(&s->kv, r->slot);
        running_remove(s, r);
    } else if (queued) {
        waiting_unlink(s, r);
    }
    double t = now_s();
    struct dsv4_sched_event ev = { .kind = DSV4_SCHED_DONE, .id = r->id, .token = stop_id, .finish = why,
                                   .status = status };
    ev.usage = (struct dsv4_sched_usage){ .prompt_tokens = r->n_prompt, .completion_tokens = r->n_gen,
                                          .cached_tokens = r->cached, .preemptions = r->n_preempt,
                                          .queue_s = r->admitted ? r->t_admit - r->t_submit : t - r->t_submit,
                                          .ttft_s = r->t_first > 0 ? r->t_first - r->t_submit : 0,
                                          .total_s = t - r->t_submit };
    s->acc.finished++;
    if (why == DSV4_FINISH_CANCELLED) s->acc.cancelled++;
    if (why == DSV4_FINISH_DEADLINE) s->acc.deadline_expired++;
    if (why == DSV4_FINISH_ERROR) s->acc.errors++;
    forget(s, r, queued);
    emit(r, &ev);
    rq_free(r);
}

/* Frees a running sequence's slot and pages and puts the request back at the queue's head. */
static void preempt(dsv4_sched *s, struct rq *r)
{
    dsv4_kv_slot_release(&s->kv, r->slot);
    running_remove(s, r);
    r->slot  = -1;
    r->state = RQ_WAITING;
    r->chunk = 0;
    r->n_preempt++;
    r->prev = NULL;
    r->next = s->wait_head;
    if (s->wait_head) s->wait_head->prev = r;
    else s->wait_tail = r;
    s->wait_head = r;
    s->n_waiting++;
    s->acc.preemptions++;
    pthread_mutex_lock(&s->mu);
    s->n_queued++;
    pthread_mutex_unlock(&s->mu);
}

void dsv4_sched_free(dsv4_sched *s)
{
    if (!s) return;
    if (s->running) {
        while (s->n_running) finish(s, s->running[0], DSV4_FINISH_CANCELLED, -1, 0);
        while (s->wait_head) finish(s, s->wait_head, DSV4_FINISH_CANCELLED, -1, 0);
        pthread_mutex_lock(&s->mu);
        struct rq *in = s->in_head;
        s->in_head = s->in_tail = NULL;
        pthread_mutex_unlock(&s->mu);
        while (in) {
            struct rq *next = in->next;
            forget(s, in, true);
            struct dsv4_sched_event ev = { .kind = DSV4_SCHED_DONE, .id = in->id, .token = -1,
                                           .finish = DSV4_FINISH_CANCELLED };
            ev.usage.prompt_tokens = in->n_prompt;
            emit(in, &ev);
            rq_free(in);
            in = next;
        }
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
    }
    while (s->kept && s->n_kept) kept_evict(s);
    free(s->kept);
    dsv4_step_free(&s->step);
    dsv4_kv_tier_close(s->disk); /* finishes the queued writes */
    free(s->pf_keys);
    dsv4_kv_pool_free(&s->kv);
    if (s->undo)
        for (int i = 0; i < s->p.max_seqs; i++) dsv4_spec_undo_free(&s->undo[i]);
    free(s->undo);
    free(s->draft_logits);
    free(s->dfs);
    free(s->dprev);
    free(s->dcand);
    free(s->logits);
    free(s->fs);
    free(s->cand);
    free(s->running);
    free(s->live);
    free(s);
}

/* ------------------------------------------------------------------ one step */

/* Moves submitted requests to the waiting queue. */
static void drain_inbox(dsv4_sched *s)
{
    pthread_mutex_lock(&s->mu);
    struct rq *in = s->in_head;
    s->in_head = s->in_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    while (in) {
        struct rq *next = in->next;
        in->state       = RQ_WAITING;
        in->next        = NULL;
        in->prev        = s->wait_tail;
        if (s->wait_tail) s->wait_tail->next = in;
        else s->wait_head = in;
        s->wait_tail = in;
        s->n_waiting++;
        in = next;
    }
}

/* Ends cancelled requests (and, with check_deadline, those past their deadline). */
static void expire(dsv4_sched *s, double t, bool check_deadline)
{
    for (struct rq *r = s->wait_head, *next; r; r = next) {
        next = r->next;
        if (atomic_load(&r->cancel)) finish(s, r, DSV4_FINISH_CANCELLED, -1, 0);
        else if (check_deadline && r->deadline > 0 && t > r->deadline) finish(s, r, DSV4_FINISH_DEADLINE, -1, 0);
    }
    for (int i = s->n_running - 1; i >= 0; i--) {
        struct rq *r = s->running[i];
        if (atomic_load(&r->cancel)) finish(s, r, DSV4_FINISH_CANCELLED, -1, 0);
        else if (check_deadline && r->deadline > 0 && t > r->deadline) finish(s, r, DSV4_FINISH_DEADLINE, -1, 0);
    }
}


/* False while r's disk chain is being read (it waits, and so do those behind it). The
 * first time r comes up, the pages past the RAM chain are handed to the tier's reader;
 * once read, attach takes them from its buffers, which stay r's until r is admitted or ends,
 * so a request that then waits for free pages does not read them again. */
static bool prefetched(dsv4_sched *s, struct rq *r)
{
    if (!s->disk || r->pf_asked) return s->pf_owner != r || !dsv4_kv_tier_prefetch_busy(s->disk);
    r->pf_asked = true;
    int first, n = dsv4_kv_prefix_disk_keys(&s->kv, r->tok, r->n_tok, s->pf_keys, s->kv.pages_per_seq, &first);
    if (n == 0 || s->pf_owner) return true; /* nothing on disk to read, or the reader is taken */
    if (!dsv4_kv_tier_prefetch(s->disk, s->pf_keys, r->tok + (size_t)first * (size_t)s->p.page_tokens, n))
        return true;
    s->pf_owner = r;
    return false;
}

static void admit(dsv4_sched *s, double t)
{
    int admitted = 0;
    for (struct rq *r = s->wait_head, *next; r && s->n_running < s->p.max_seqs; r = next) {
        next = r->next;
        if (s->running_by_tier[r->tier] >= s->tier_limit[r->tier]) continue;
        int             ki = kept_match(s, r), slot, hit;
        struct kept_seq k  = { .slot = -1 };
        if (ki >= 0) { /* resume exactly where a finished sequence with these tokens stopped */
            k    = kept_take(s, ki);
            slot = k.slot;
            hit  = k.n;
        } else {
            if (!prefetched(s, r)) break;
            while ((slot = dsv4_kv_slot_acquire(&s->kv)) < 0 && kept_evict(s)) {
            }
            DSV4_ASSERT(slot >= 0);
            hit = dsv4_kv_prefix_attach(&s->kv, slot, r->tok, r->n_tok);
        }
        int need = dsv4_kv_pages_needed(&s->kv, slot, min_i(r->n_tok + 1, s->p.max_ctx));
        while (need > dsv4_kv_pages_available(&s->kv) && kept_evict(s)) {
        }
        if (need > dsv4_kv_pages_available(&s->kv)) {
            if (ki >= 0) s->kept[s->n_kept++] = k; /* still valid: kept again, now the newest */
            else dsv4_kv_slot_release(&s->kv, slot);
            break; /* memory: wait for running sequences to end, keeping the order */
        }
        if (ki >= 0) {
            free(k.tok);
            s->acc.kept_resumes++;
            s->acc.kept_resume_tokens += (uint64_t)hit;
        }
        if (s->pf_owner == r) { /* attached: its records are in its pages now */
            dsv4_kv_tier_prefetch_drop(s->disk);
            s->pf_owner = NULL;
        }
        waiting_unlink(s, r);
        admitted++;
        r->state = RQ_RUNNING;
        r->slot  = slot;
        s->running[s->n_running++] = r;
        s->running_by_tier[r->tier]++;
        if (!r->admitted) {
            r->admitted = true;
            r->t_admit  = t;
            r->cached   = hit;
        }
    }
    if (admitted) {
        pthread_mutex_lock(&s->mu);
        s->n_queued -= admitted;
        pthread_mutex_unlock(&s->mu);
    }
}

/* Prefill rows allowed next to decode rows: max_prefill_tokens, and what prefill_share of a
 * decode step's time buys at the measured cost per row (a few rows until it is measured). */
static int prefill_cap(const dsv4_sched *s)
{
    int cap = s->p.max_prefill_tokens > 0 ? s->p.max_prefill_tokens : s->p.max_batch_tokens;
    if (s->p.prefill_share <= 0) return cap;
    if (s->t_decode <= 0 || s->t_row < 0) return min_i(cap, 8);
    double fit = s->t_row > 0 ? (double)s->p.prefill_share * s->t_decode / s->t_row : cap;
    return fit < 1 ? 1 : fit < cap ? (int)fit : cap;
}

/* Updates the step-cost averages from one step of n_decode decode rows and n_prefill rows. */
static void note_step_time(dsv4_sched *s, int n_decode, int n_prefill, double dt)
{
    const double a = 0.25; /* weight of the newest step */
    if (n_decode && !n_prefill) s->t_decode = s->t_decode > 0 ? (1 - a) * s->t_decode + a * dt : dt;
    else if (n_decode && n_prefill && s->t_decode > 0) {
        double row = (dt > s->t_decode ? dt - s->t_decode : 0) / n_prefill;
        s->t_row   = s->t_row >= 0 ? (1 - a) * s->t_row + a * row : row;
    }
}

/* A sequence is decoding when exactly one known token remains to feed after it has sampled. */
static bool is_decoding(const dsv4_sched *s, const struct rq *r)
{
    return r->n_gen > 0 && r->n_tok - s->kv.seq[r->slot].pos == 1;
}

/* Drafts for a decoding sequence this step: its K while speculation pays (at most
 * spec_max_batch sequences decoding, not paused for low acceptance), within the tokens it may
 * still generate, its context, the rows left and, with the prefix cache, the page (a verify
 * chunk ends at the boundary at the latest, where the state is snapshotted). */
static int drafts_for(const dsv4_sched *s, const struct rq *r, int n_decode, int rows_left)
{
    if (!r->spec_k || r->spec_pause > 0 || n_decode > s->p.spec_max_batch) return 0;
    int pos = s->kv.seq[r->slot].pos, pt = s->p.page_tokens;
    int k   = min_i(r->spec_k, min_i(r->max_tokens - r->n_gen - 1, s->p.max_ctx - pos - 1));
    if (s->m->cfg.arch == DSV4_ARCH_V4_1) /* one DSpark block, whose rows the step must hold */
        k = s->step.max_rows < s->m->cfg.v41.dspark_block ? 0 : min_i(k, s->m->cfg.v41.dspark_block);
    if (s->p.prefix_entries > 0) k = min_i(k, (pos / pt + 1) * pt - pos - 1);
    return k < 0 ? 0 : min_i(k, rows_left);
}

/* Chooses every running sequence's rows for this step and maps their pages, preempting the
 * newest sequences when the pool runs dry. Returns the number of sequences in the batch. */
static int plan_batch(dsv4_sched *s)
{
    int n_cand = 0, n_decode = 0, n_rows = 0, pt = s->p.page_tokens;
    for (int i = 0; i < s->n_running; i++) {
        struct rq *r = s->running[i];
        r->chunk = r->k = 0;
        if (is_decoding(s, r)) {
            r->chunk = 1;
            s->cand[n_cand++] = r;
            n_decode++;
        }
    }
    for (int i = 0; i < n_cand; i++) { /* speculative rows come out of the same budget */
        struct rq *r = s->cand[i];
        r->k = drafts_for(s, r, n_decode, s->p.max_batch_tokens - n_decode - n_rows);
        r->chunk += r->k;
        n_rows += r->k;
    }
    int budget = s->p.max_batch_tokens - n_decode - n_rows;
    if (n_decode) budget = min_i(budget, prefill_cap(s));
    for (int i = 0; i < s->n_running && budget > 0; i++) {
        struct rq *r = s->running[i];
        if (r->chunk) continue;
        int pos = s->kv.seq[r->slot].pos, n = min_i(r->n_tok - pos, budget);
        if (n <= 0) continue;
        if (s->p.prefix_entries > 0) n = min_i(n, (pos / pt + 1) * pt - pos); /* stop at the page boundary */
        r->chunk = n;
        budget -= n;
        s->cand[n_cand++] = r;
    }
    /* pages, oldest first; the newest running sequence gives way */
    for (int i = 0; i < n_cand; i++) {
        struct rq *r = s->cand[i];
        if (r->state != RQ_RUNNING) continue;
        int end = s->kv.seq[r->slot].pos + r->chunk;
        while (dsv4_kv_reserve(&s->kv, r->slot, end) != DSV4_OK) {
            if (kept_evict(s)) continue; /* kept sequences give way before running ones */
            struct rq *victim = s->running[s->n_running - 1];
            preempt(s, victim);
            if (victim == r) break;
        }
    }
    int n = 0;
    for (int i = 0; i < n_cand; i++)
        if (s->cand[i]->state == RQ_RUNNING) s->cand[n++] = s->cand[i];
    return n;
}

static void disk_metrics(struct dsv4_kv_tier *t, const struct dsv4_kv_counters *kc, struct dsv4_sched_metrics *a)
{
    struct dsv4_kv_tier_counters c;
    dsv4_kv_tier_counters(t, &c);
    a->kv_disk_on             = true;
    a->kv_disk_hits           = kc->prefix_disk_loads;
    a->kv_disk_hit_tokens     = kc->prefix_disk_hit_tokens;
    a->kv_disk_misses         = c.disk.misses + c.token_mismatch;
    a->kv_disk_bytes_read     = c.disk.bytes_read;
    a->kv_disk_bytes_written  = c.disk.bytes_written;
    a->kv_disk_evictions      = c.disk.evictions;
    a->kv_disk_corrupt        = c.disk.corrupt_removed;
    a->kv_disk_refused        = c.disk.refused;
    a->kv_disk_write_errors   = c.disk.write_errors;
    a->kv_disk_writes_dropped = c.writes_dropped;
    a->kv_disk_queue_depth    = c.queue_depth;
    a->kv_disk_loads          = c.loads;
    a->kv_disk_load_s         = c.load_s;
}

static void publish_metrics(dsv4_sched *s)
{
    struct dsv4_kv_counters kc;
    dsv4_kv_pool_counters(&s->kv, &kc);
    struct dsv4_sched_metrics *a = &s->acc;
    a->waiting          = s->n_waiting;
    a->running          = s->n_running;
    for (int t = 0; t < DSV4_TIER_COUNT; t++) a->running_by_tier[t] = s->running_by_tier[t];
    a->slots_total       = kc.slots_total;
    a->slots_used        = kc.slots_used - s->n_kept;
    a->seqs_kept         = s->n_kept;
    a->pages_total       = kc.pages_total;
    a->pages_free        = kc.pages_free;
    a->pages_cached      = kc.pages_cached;
    a->pages_evictable   = kc.pages_evictable;
    a->fragmentation     = kc.fragmentation;
    a->prefix_entries    = kc.prefix_entries;
    a->prefix_lookups    = kc.prefix_lookups;
    a->prefix_hits       = kc.prefix_hits;
    a->prefix_hit_tokens = kc.prefix_hit_tokens;
    a->prefix_inserts    = kc.prefix_inserts;
    a->prefix_evictions  = kc.prefix_evictions;
    if (s->disk) disk_metrics(s->disk, &kc, a);
    pthread_mutex_lock(&s->mu);
    s->pub = *a;
    pthread_mutex_unlock(&s->mu);
}

static bool is_stop(const struct rq *r, int32_t tok)
{
    for (int i = 0; i < r->n_stop; i++)
        if (r->stop[i] == tok) return true;
    return false;
}

/* Reports the token a sequence sampled and ends it when it is done (then r is freed and
 * true is returned). */
static bool take_token(dsv4_sched *s, struct rq *r, const float *logits, double t)
{
    int32_t tok = r->sampled;
    r->n_gen++;
    dsv4_sampler_accept(r->sampler, tok);
    if (r->t_first == 0) r->t_first = t;
    s->acc.generated_tokens++;
    if (is_stop(r, tok)) {
        finish(s, r, DSV4_FINISH_STOP, tok, 0);
        return true;
    }
    DSV4_ASSERT(r->n_tok < r->cap);
    r->tok[r->n_tok++] = tok;
    struct dsv4_sched_event ev = { .kind = DSV4_SCHED_TOKEN, .id = r->id, .token = tok, .prob = r->prob,
                                   .logits = logits, .index = r->n_gen - 1 };
    emit(r, &ev);
    /* feeding the new token needs position n_tok - 1 < max_ctx */
    if (r->n_gen >= r->max_tokens || r->n_tok > s->p.max_ctx) {
        finish(s, r, DSV4_FINISH_LENGTH, -1, 0);
        return true;
    }
    return false;
}

/* Share of drafts kept below which a sequence stops drafting for SPEC_PAUSE tokens: at the
 * demo model's costs a draft row is worth it from about this acceptance on
 * (docs/SPECULATIVE.md); after the pause it drafts again from a neutral estimate. */
#define SPEC_MIN_RATE 0.25f
enum { SPEC_PAUSE = 32 };

/* The MTP block drafts for every sequence with r->k > 0: depth by depth, one row per
 * sequence that drafts that deep, each draft drawn by the request's sampler and put after
 * its tokens (r->tok[n_tok + d]), where the verify chunk reads it. */
static int run_drafts(dsv4_sched *s, int n, struct dsv4_err *err)
{
    size_t V = (size_t)s->m->cfg.vocab_size, K = (size_t)s->draft_rows;
    for (int d = 0; d < s->p.spec_draft; d++) {
        int nd = 0;
        for (int i = 0; i < n; i++) {
            struct rq *r = s->cand[i];
            if (r->k <= d) continue;
            s->dfs[nd++] = (struct dsv4_fwd_seq){ .st = &s->kv.seq[r->slot], .tokens = r->tok + r->n_tok - 1 + d, .n = 1,
                                                  .mtp_logits = s->draft_logits + ((size_t)r->slot * K + (size_t)d) * V,
                                                  .draft_depth = d };
        }
        if (!nd) break;
        int rc = dsv4_forward_draft(s->m, &s->step, s->dfs, nd, err);
        if (rc) return rc;
        for (int i = 0, j = 0; i < n; i++) {
            struct rq *r = s->cand[i];
            if (r->k <= d) continue;
            r->tok[r->n_tok + d] = dsv4_sampler_sample(r->sampler, s->dfs[j++].mtp_logits, NULL);
        }
    }
    return DSV4_OK;
}

/* V4.1: one DSpark block per drafting sequence, as many blocks a step as the step's rows hold,
 * then depth by depth the Markov logits of the token before each row (over the block's every
 * sequence: the heads keep their rows by position in the call) and each draft sampled from
 * its row (model/dspark.c). */
static int run_dspark(dsv4_sched *s, int n, struct dsv4_err *err)
{
    const struct dsv4_model *m = s->m;
    size_t V = (size_t)m->cfg.vocab_size, D = (size_t)s->draft_rows;
    int    per = s->step.max_rows / m->cfg.v41.dspark_block, i = 0, rc = DSV4_OK;
    while (i < n && rc == DSV4_OK) {
        int nd = 0, deepest = 0;
        for (; i < n && nd < per; i++) {
            struct rq *r = s->cand[i];
            if (!r->k) continue;
            s->dcand[nd] = i;
            s->dfs[nd++] = (struct dsv4_fwd_seq){ .st = &s->kv.seq[r->slot], .tokens = r->tok + r->n_tok - 1, .n = 1,
                                                  .mtp_logits = s->draft_logits + (size_t)r->slot * D * V };
            deepest = max_i(deepest, r->k);
        }
        rc = nd ? dsv4_forward_draft(m, &s->step, s->dfs, nd, err) : DSV4_OK;
        for (int d = 0; d < deepest && rc == DSV4_OK; d++) {
            for (int j = 0; j < nd; j++) { /* past its drafts a sequence's row takes a token it has */
                const struct rq *r = s->cand[s->dcand[j]];
                s->dprev[j] = r->tok[r->n_tok - 1 + min_i(d, r->k)];
            }
            rc = dsv4_dspark_markov(m, &s->step, s->dfs, nd, d, s->dprev, err);
            for (int j = 0; j < nd && rc == DSV4_OK; j++) {
                struct rq *r = s->cand[s->dcand[j]];
                if (r->k > d)
                    r->tok[r->n_tok + d] = dsv4_sampler_sample(r->sampler, s->dfs[j].mtp_logits + (size_t)d * V, NULL);
            }
        }
    }
    return rc;
}

/* After the verify forward: the sampler's verdict on each draft in order (the first
 * rejection's token replaces it; with every draft kept, one more token from the last row),
 * the rollback to the kept rows, the counters and the acceptance estimate. */
static void verify_drafts(dsv4_sched *s, struct rq *r, const float *rows)
{
    size_t V = (size_t)s->m->cfg.vocab_size;
    int    kept = 0;
    r->n_out    = 0;
    while (kept < r->k) {
        bool accepted;
        const float *q = s->draft_logits + ((size_t)r->slot * (size_t)s->draft_rows + (size_t)kept) * V;
        r->out[r->n_out] = dsv4_sampler_verify(r->sampler, rows + (size_t)kept * V, q, r->tok[r->n_tok + kept], &accepted,
                                               &r->out_prob[r->n_out]);
        r->n_out++;
        if (!accepted) break;
        kept++;
    }
    if (kept == r->k) {
        r->out[r->n_out] = dsv4_sampler_sample(r->sampler, rows + (size_t)kept * V, &r->out_prob[r->n_out]);
        r->n_out++;
    }
    dsv4_spec_rollback(s->m, &s->step, &s->kv.seq[r->slot], &s->undo[r->slot], kept + 1);
    s->acc.spec_steps++;
    s->acc.spec_drafted += (uint64_t)r->k;
    s->acc.spec_kept += (uint64_t)kept;
    for (int i = 0; i < kept; i++) s->acc.spec_kept_at[i]++;
    r->spec_rate = 0.8f * r->spec_rate + 0.2f * (float)kept / (float)r->k;
    if (r->spec_rate < SPEC_MIN_RATE) {
        r->spec_pause = SPEC_PAUSE;
        r->spec_rate  = 2 * SPEC_MIN_RATE;
    }
}

int dsv4_sched_step(dsv4_sched *s, struct dsv4_err *err)
{
    double t0 = now_s();
    drain_inbox(s);
    expire(s, t0, true);
    admit(s, t0);
    int n = plan_batch(s);
    if (n == 0) {
        /* nothing to run while a waiting request's chain is read: wait for the reader here
         * rather than spin (the caller steps again at once, is_idle being false) */
        if (s->pf_owner) dsv4_kv_tier_prefetch_wait(s->disk, 0.01);
        publish_metrics(s);
        return DSV4_OK;
    }
    size_t V = (size_t)s->m->cfg.vocab_size;
    int    n_logits = 0, n_dec = 0, n_pre = 0;
    for (int i = 0; i < n; i++) {
        struct rq             *r  = s->cand[i];
        struct dsv4_seq_state *st = &s->kv.seq[r->slot];
        int                    nl;
        r->logits = st->pos + r->chunk - r->k == r->n_tok;
        nl        = r->logits ? 1 + r->k : 0;
        s->fs[i] = (struct dsv4_fwd_seq){ .st = st, .tokens = r->tok + st->pos, .n = r->chunk, .n_logits = nl,
                                          .logits = nl ? s->logits + (size_t)n_logits * V : NULL,
                                          .undo = r->k ? &s->undo[r->slot] : NULL };
        n_logits += nl;
        if (is_decoding(s, r)) n_dec++;
        else n_pre += r->chunk;
    }
    s->acc.decode_tokens += (uint64_t)n_dec;
    s->acc.prefill_tokens += (uint64_t)n_pre;
    double tf = now_s();
    dsv4_alloc_guard_enter();
    int rc = !s->p.spec_draft ? DSV4_OK : s->m->cfg.arch == DSV4_ARCH_V4_1 ? run_dspark(s, n, err) : run_drafts(s, n, err);
    if (rc == DSV4_OK) rc = dsv4_forward(s->m, &s->step, s->fs, n, err);
    if (rc == DSV4_OK)
        for (int i = 0; i < n; i++) {
            struct rq *r = s->cand[i];
            if (r->k) verify_drafts(s, r, s->fs[i].logits);
            else if (r->logits) r->sampled = dsv4_sampler_sample(r->sampler, s->fs[i].logits, &r->prob);
        }
    dsv4_alloc_guard_leave();
    if (rc) {
        for (int i = 0; i < n; i++) finish(s, s->cand[i], DSV4_FINISH_ERROR, -1, rc);
        publish_metrics(s);
        return rc;
    }
    double t1 = now_s();
    note_step_time(s, n_dec, n_pre, t1 - tf);
    for (int i = 0; i < n; i++) {
        struct rq *r = s->cand[i];
        dsv4_kv_prefix_publish(&s->kv, r->slot, r->tok);
        if (r->k) {
            int n_out = r->n_out;
            for (int j = 0; j < n_out; j++) {
                r->sampled = r->out[j];
                r->prob    = r->out_prob[j];
                if (take_token(s, r, s->fs[i].logits + (size_t)j * V, t1)) break;
            }
        } else if (r->logits) {
            if (r->spec_pause > 0) r->spec_pause--;
            take_token(s, r, s->fs[i].logits, t1);
        }
    }
    expire(s, t1, false); /* cancellations that arrived during the step */
    s->acc.steps++;
    s->acc.busy_s += now_s() - t0;
    publish_metrics(s);
    return DSV4_OK;
}
