/*
 * prof.c - the op profiler: a wrapper op table that times every call (see backend.h).
 *
 * Events go into one buffer allocated when the profiler is created, so profiling does not
 * allocate while tokens are evaluated; when it is full, further events are counted but not
 * kept. Only the thread that calls the ops records (ops run their own worker threads inside
 * one call). The trace uses the Chrome "complete event" format: one JSON object per event
 * with name, ts and dur in microseconds.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"

enum { OP_LINEAR, OP_RMSNORM, OP_HEAD_RMS, OP_ROPE, OP_FP8_SIM, OP_FP4_SIM, OP_HADAMARD, OP_HC_PRE, OP_HC_POST,
       OP_HC_HEAD, OP_ATTENTION, OP_INDEXER, OP_ROUTER, OP_EXPERT, OP_EXPERTS, OP_STEP, OP_EMBED, OP_COUNT };

static const char *const op_names[OP_COUNT] = { "linear", "rmsnorm", "head_rms", "rope", "fp8_sim", "fp4_sim",
                                                "hadamard", "hc_pre", "hc_post", "hc_head", "attention",
                                                "indexer_scores", "router", "expert", "experts", "step", "embed" };

struct event {
    uint64_t t0, dur; /* ns */
    uint16_t op;
    uint16_t depth;
    uint32_t arg;     /* linear: weight format and rows */
};

struct dsv4_prof {
    const struct dsv4_backend_ops *inner;
    char                          *path;
    struct event                  *ev;
    size_t                         n, cap, dropped;
    uint64_t                       origin;
    int                            depth;
    size_t                         open[64]; /* stack of events being timed */
    uint64_t                       self_ns[OP_COUNT], calls[OP_COUNT];
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

struct dsv4_prof *dsv4_prof_create(const char *path, const struct dsv4_backend_ops *inner, size_t max_events)
{
    struct dsv4_prof *p = calloc(1, sizeof(*p));
    if (!p) return NULL;
    p->inner  = inner;
    p->path   = strdup(path);
    p->cap    = max_events;
    p->ev     = malloc(sizeof(*p->ev) * max_events);
    p->origin = now_ns();
    if (!p->path || !p->ev) {
        free(p->path);
        free(p->ev);
        free(p);
        return NULL;
    }
    return p;
}

static void begin(struct dsv4_prof *p, int op, uint32_t arg)
{
    size_t idx = p->n < p->cap ? p->n++ : (size_t)-1;
    if (idx == (size_t)-1) p->dropped++;
    else p->ev[idx] = (struct event){ now_ns(), 0, (uint16_t)op, (uint16_t)p->depth, arg };
    if (p->depth < 64) p->open[p->depth] = idx;
    p->depth++;
}

static void end(struct dsv4_prof *p)
{
    p->depth--;
    if (p->depth < 0 || p->depth >= 64) return;
    size_t idx = p->open[p->depth];
    if (idx != (size_t)-1) p->ev[idx].dur = now_ns() - p->ev[idx].t0;
}

void dsv4_prof_begin(struct dsv4_prof *p, const char *name)
{
    if (p) begin(p, strcmp(name, "embed") ? OP_STEP : OP_EMBED, 0);
}

void dsv4_prof_end(struct dsv4_prof *p)
{
    if (p) end(p);
}

void dsv4_prof_finish(struct dsv4_prof *p, FILE *f)
{
    if (!p) return;
    /* self time: an event's duration minus its direct children's, found by walking the
     * events in order with a stack of the open ones */
    uint64_t total = 0;
    size_t   stack[65];
    uint64_t stack_child[65];
    int      sp = 0;
    for (size_t i = 0; i < p->n; i++) {
        struct event *e = &p->ev[i];
        while (sp > 0 && p->ev[stack[sp - 1]].depth >= e->depth) {
            struct event *o = &p->ev[stack[sp - 1]];
            p->self_ns[o->op] += o->dur > stack_child[sp - 1] ? o->dur - stack_child[sp - 1] : 0;
            p->calls[o->op]++;
            sp--;
            if (sp > 0) stack_child[sp - 1] += o->dur;
        }
        if (sp < 65) {
            stack[sp]         = i;
            stack_child[sp++] = 0;
        }
    }
    while (sp > 0) {
        struct event *o = &p->ev[stack[sp - 1]];
        p->self_ns[o->op] += o->dur > stack_child[sp - 1] ? o->dur - stack_child[sp - 1] : 0;
        p->calls[o->op]++;
        sp--;
        if (sp > 0) stack_child[sp - 1] += o->dur;
    }
    for (int op = 0; op < OP_COUNT; op++)
        if (op != OP_STEP) total += p->self_ns[op];
    FILE *tf = fopen(p->path, "w");
    if (tf) {
        fprintf(tf, "{\"traceEvents\":[\n");
        for (size_t i = 0; i < p->n; i++) {
            struct event *e = &p->ev[i];
            fprintf(tf, "%s{\"name\":\"%s\",\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"arg\":%u}}\n",
                    i ? "," : "", op_names[e->op], (double)(e->t0 - p->origin) / 1e3, (double)e->dur / 1e3, e->arg);
        }
        fprintf(tf, "]}\n");
        fclose(tf);
    }
    if (f) {
        fprintf(f, "profile: %zu events%s, trace written to %s\n", p->n, p->dropped ? " (buffer full: later events dropped)" : "",
                p->path);
        fprintf(f, "  %-16s %10s %12s %8s\n", "op", "calls", "self ms", "share");
        for (int op = 0; op < OP_COUNT; op++) {
            if (op == OP_STEP || !p->calls[op]) continue;
            fprintf(f, "  %-16s %10llu %12.2f %7.1f%%\n", op_names[op], (unsigned long long)p->calls[op],
                    (double)p->self_ns[op] / 1e6, total ? 100.0 * (double)p->self_ns[op] / (double)total : 0.0);
        }
    }
    free(p->ev);
    free(p->path);
    free(p);
}

/* ------------------------------------------------------------------ the wrapper table */

static inline struct dsv4_prof *P(struct dsv4_backend *be)
{
    return be->prof;
}

static void p_linear(struct dsv4_backend *be, const struct dsv4_linear *w, int n_tok, const float *x, int ldx, float *y,
                     int ldy, enum dsv4_act act, enum dsv4_out out)
{
    begin(P(be), OP_LINEAR, (uint32_t)w->fmt << 24 | (uint32_t)(n_tok & 0xffffff));
    P(be)->inner->linear(be, w, n_tok, x, ldx, y, ldy, act, out);
    end(P(be));
}

static void p_rmsnorm(struct dsv4_backend *be, int n, int d, const float *x, int ldx, const uint16_t *w, double eps, float *y,
                      int ldy)
{
    begin(P(be), OP_RMSNORM, (uint32_t)n);
    P(be)->inner->rmsnorm(be, n, d, x, ldx, w, eps, y, ldy);
    end(P(be));
}

static void p_head_rms(struct dsv4_backend *be, int n, int n_head, int d_head, float *q, double eps)
{
    begin(P(be), OP_HEAD_RMS, (uint32_t)n);
    P(be)->inner->head_rms(be, n, n_head, d_head, q, eps);
    end(P(be));
}

static void p_rope(struct dsv4_backend *be, int n, int n_vec, int d_full, float *x, const int *pos,
                   const struct dsv4_rope_table *t, bool inverse)
{
    begin(P(be), OP_ROPE, (uint32_t)n);
    P(be)->inner->rope(be, n, n_vec, d_full, x, pos, t, inverse);
    end(P(be));
}

static void p_fp8_sim(struct dsv4_backend *be, int n, int d, int ld, float *x, int block)
{
    begin(P(be), OP_FP8_SIM, (uint32_t)n);
    P(be)->inner->fp8_sim(be, n, d, ld, x, block);
    end(P(be));
}

static void p_fp4_sim(struct dsv4_backend *be, int n, int d, int ld, float *x, int block)
{
    begin(P(be), OP_FP4_SIM, (uint32_t)n);
    P(be)->inner->fp4_sim(be, n, d, ld, x, block);
    end(P(be));
}

static void p_hadamard(struct dsv4_backend *be, int n, int d, float *x)
{
    begin(P(be), OP_HADAMARD, (uint32_t)n);
    P(be)->inner->hadamard(be, n, d, x);
    end(P(be));
}

static void p_hc_pre(struct dsv4_backend *be, int n, int hc, int d, const float *X, const float *fn, const float *scale,
                     const float *base, int iters, double norm_eps, double hc_eps, float *u, float *post, float *comb)
{
    begin(P(be), OP_HC_PRE, (uint32_t)n);
    P(be)->inner->hc_pre(be, n, hc, d, X, fn, scale, base, iters, norm_eps, hc_eps, u, post, comb);
    end(P(be));
}

static void p_hc_post(struct dsv4_backend *be, int n, int hc, int d, const float *f, const float *Xres, const float *post,
                      const float *comb, float *Xout)
{
    begin(P(be), OP_HC_POST, (uint32_t)n);
    P(be)->inner->hc_post(be, n, hc, d, f, Xres, post, comb, Xout);
    end(P(be));
}

static void p_hc_head(struct dsv4_backend *be, int n, int hc, int d, const float *X, const float *fn, const float *scale,
                      const float *base, double norm_eps, double hc_eps, float *y)
{
    begin(P(be), OP_HC_HEAD, (uint32_t)n);
    P(be)->inner->hc_head(be, n, hc, d, X, fn, scale, base, norm_eps, hc_eps, y);
    end(P(be));
}

static void p_attention(struct dsv4_backend *be, int n_head, int d_head, int d_rope, const float *q,
                        const uint8_t *const *rows, int n_rows, enum dsv4_row_fmt fmt, const float *sink, float scale,
                        float *o)
{
    begin(P(be), OP_ATTENTION, (uint32_t)n_rows);
    P(be)->inner->attention(be, n_head, d_head, d_rope, q, rows, n_rows, fmt, sink, scale, o);
    end(P(be));
}

static void p_indexer(struct dsv4_backend *be, int n_head, int d, const float *q, const float *w,
                      const uint8_t *const *blocks, int block_keys, int n_keys, float *score)
{
    begin(P(be), OP_INDEXER, (uint32_t)n_keys);
    P(be)->inner->indexer_scores(be, n_head, d, q, w, blocks, block_keys, n_keys, score);
    end(P(be));
}

static void p_router(struct dsv4_backend *be, int n, const float *x, const struct dsv4_linear *gate, const float *bias,
                     const int64_t *tid2eid, const int *tokens, int n_exp, int n_used, double route_scale, int *ids,
                     float *weights, float *scratch)
{
    begin(P(be), OP_ROUTER, (uint32_t)n);
    P(be)->inner->router(be, n, x, gate, bias, tid2eid, tokens, n_exp, n_used, route_scale, ids, weights, scratch);
    end(P(be));
}

static void p_expert(struct dsv4_backend *be, const struct dsv4_expert_w *e, int n, const float *x, int ldx,
                     const float *row_w, double limit, float *y, float *scratch)
{
    begin(P(be), OP_EXPERT, (uint32_t)n);
    P(be)->inner->expert(be, e, n, x, ldx, row_w, limit, y, scratch);
    end(P(be));
}

static void p_experts(struct dsv4_backend *be, const struct dsv4_expert_w *experts, int n_groups, const int *ids,
                      const int *off, const float *x, const float *row_w, double limit, float *y, float *scratch)
{
    begin(P(be), OP_EXPERTS, (uint32_t)n_groups);
    P(be)->inner->experts(be, experts, n_groups, ids, off, x, row_w, limit, y, scratch);
    end(P(be));
}

const struct dsv4_backend_ops dsv4_prof_ops = {
    .name = "profiled", .linear = p_linear, .rmsnorm = p_rmsnorm, .head_rms = p_head_rms, .rope = p_rope,
    .fp8_sim = p_fp8_sim, .fp4_sim = p_fp4_sim, .hadamard = p_hadamard, .hc_pre = p_hc_pre, .hc_post = p_hc_post,
    .hc_head = p_hc_head, .attention = p_attention, .indexer_scores = p_indexer, .router = p_router,
    .expert = p_expert, .experts = p_experts,
};
