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
#include "backend/prof_xfer.h"

/* Events name an op (enum dsv4_op) or, from DSV4_OP_COUNT on, a named span (a forward step):
 * spans hold the host work between ops and are left out of the ops' shares. */
enum { MAX_SPANS = 8, N_KINDS = DSV4_OP_COUNT + MAX_SPANS };

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
    const char                    *span[MAX_SPANS]; /* names of the spans seen so far */
    int                            n_spans;
    uint64_t                       self_ns[N_KINDS], calls[N_KINDS];
    uint64_t                       xfer_n[DSV4_XFER_COUNT], xfer_bytes[DSV4_XFER_COUNT]; /* prof_xfer.h */
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

static const char *kind_name(const struct dsv4_prof *p, int k)
{
    return k < DSV4_OP_COUNT ? dsv4_op_name((enum dsv4_op)k) : p->span[k - DSV4_OP_COUNT];
}

void dsv4_prof_begin(struct dsv4_prof *p, const char *name)
{
    if (!p) return;
    int s = 0;
    while (s < p->n_spans && strcmp(p->span[s], name)) s++;
    if (s == p->n_spans && s < MAX_SPANS) p->span[p->n_spans++] = name; /* callers pass literals */
    begin(p, DSV4_OP_COUNT + (s < MAX_SPANS ? s : MAX_SPANS - 1), 0);
}

void dsv4_prof_end(struct dsv4_prof *p)
{
    if (p) end(p);
}

void dsv4_prof_xfer(struct dsv4_prof *p, enum dsv4_xfer x, size_t bytes)
{
    if (!p) return;
    p->xfer_n[x]++;
    p->xfer_bytes[x] += bytes;
}

void dsv4_prof_xfers(const struct dsv4_prof *p, uint64_t counts[DSV4_XFER_COUNT])
{
    for (int x = 0; x < DSV4_XFER_COUNT; x++) counts[x] = p ? p->xfer_n[x] : 0;
}

void dsv4_prof_calls(const struct dsv4_prof *p, uint64_t counts[DSV4_OP_COUNT])
{
    for (int op = 0; op < DSV4_OP_COUNT; op++) counts[op] = 0;
    for (size_t i = 0; p && i < p->n; i++)
        if (p->ev[i].op < DSV4_OP_COUNT) counts[p->ev[i].op]++;
}

/* The transfers, in all and per step (the forward's "step" spans). */
static void print_xfers(const struct dsv4_prof *p, FILE *f)
{
    static const char *const names[DSV4_XFER_COUNT] = { "upload", "download", "copy", "sync" };
    uint64_t steps = 0;
    for (int s = 0; s < p->n_spans; s++)
        if (!strcmp(p->span[s], "step")) steps = p->calls[DSV4_OP_COUNT + s];
    fprintf(f, "  transfers over %llu steps:\n", (unsigned long long)steps);
    for (int x = 0; x < DSV4_XFER_COUNT; x++)
        fprintf(f, "  %-16s %10llu %12.3f MB  %8.2f per step\n", names[x], (unsigned long long)p->xfer_n[x],
                (double)p->xfer_bytes[x] / 1e6, steps ? (double)p->xfer_n[x] / (double)steps : 0.0);
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
    for (int op = 0; op < DSV4_OP_COUNT; op++) total += p->self_ns[op];
    FILE *tf = fopen(p->path, "w");
    if (tf) {
        fprintf(tf, "{\"traceEvents\":[\n");
        for (size_t i = 0; i < p->n; i++) {
            struct event *e = &p->ev[i];
            fprintf(tf, "%s{\"name\":\"%s\",\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"arg\":%u}}\n",
                    i ? "," : "", kind_name(p, e->op), (double)(e->t0 - p->origin) / 1e3, (double)e->dur / 1e3, e->arg);
        }
        fprintf(tf, "]}\n");
        fclose(tf);
    }
    if (f) {
        fprintf(f, "profile: %zu events%s, trace written to %s\n", p->n, p->dropped ? " (buffer full: later events dropped)" : "",
                p->path);
        fprintf(f, "  %-16s %10s %12s %8s\n", "op", "calls", "self ms", "share");
        for (int op = 0; op < DSV4_OP_COUNT; op++) {
            if (!p->calls[op]) continue;
            fprintf(f, "  %-16s %10llu %12.2f %7.1f%%\n", kind_name(p, op), (unsigned long long)p->calls[op],
                    (double)p->self_ns[op] / 1e6, total ? 100.0 * (double)p->self_ns[op] / (double)total : 0.0);
        }
        /* a span's self time is the host work between the ops it contains */
        for (int s = 0; s < p->n_spans; s++)
            fprintf(f, "  %-16s %10llu %12.2f   (span: host work outside ops)\n", p->span[s],
                    (unsigned long long)p->calls[DSV4_OP_COUNT + s], (double)p->self_ns[DSV4_OP_COUNT + s] / 1e6);
        print_xfers(p, f);
    }
    free(p->ev);
    free(p->path);
    free(p);
}

/* ------------------------------------------------------------------ the wrapper table */

/* Every op of the table is wrapped (dsv4_prof_ops is complete: the op checker runs it,
 * `dsv4 test-ops --profiled`). arg: the op's row count, which a trace shows per event. */
static inline struct dsv4_prof *P(struct dsv4_backend *be)
{
    return be->prof;
}

#define TIMED(op, arg, call)                                                                                       \
    do {                                                                                                           \
        begin(P(be), op, (uint32_t)(arg));                                                                         \
        call;                                                                                                      \
        end(P(be));                                                                                                \
    } while (0)

static void p_linear(struct dsv4_backend *be, const struct dsv4_linear *w, int n_tok, const float *x, int ldx, float *y,
                     int ldy, enum dsv4_act act, enum dsv4_out out)
{
    /* the weight format in the top byte: a trace tells FP8 from FP4 projections apart */
    TIMED(DSV4_OP_LINEAR, (uint32_t)w->fmt << 24 | (uint32_t)(n_tok & 0xffffff),
          P(be)->inner->linear(be, w, n_tok, x, ldx, y, ldy, act, out));
}

static void p_rmsnorm(struct dsv4_backend *be, int n, int d, const float *x, int ldx, const uint16_t *w, double eps,
                      float *y, int ldy)
{
    TIMED(DSV4_OP_RMSNORM, n, P(be)->inner->rmsnorm(be, n, d, x, ldx, w, eps, y, ldy));
}

static void p_head_rms(struct dsv4_backend *be, int n, int n_head, int d_head, float *q, double eps)
{
    TIMED(DSV4_OP_HEAD_RMS, n, P(be)->inner->head_rms(be, n, n_head, d_head, q, eps));
}

static void p_rope(struct dsv4_backend *be, int n, int n_vec, int d_full, float *x, const int *pos,
                   const struct dsv4_rope_table *t, bool inverse)
{
    TIMED(DSV4_OP_ROPE, n, P(be)->inner->rope(be, n, n_vec, d_full, x, pos, t, inverse));
}

static void p_fp8_sim(struct dsv4_backend *be, int n, int d, int ld, float *x, int block)
{
    TIMED(DSV4_OP_FP8_SIM, n, P(be)->inner->fp8_sim(be, n, d, ld, x, block));
}

static void p_fp4_sim(struct dsv4_backend *be, int n, int d, int ld, float *x, int block, bool e4m3_scale)
{
    TIMED(DSV4_OP_FP4_SIM, n, P(be)->inner->fp4_sim(be, n, d, ld, x, block, e4m3_scale));
}

static void p_hadamard(struct dsv4_backend *be, int n, int d, float *x)
{
    TIMED(DSV4_OP_HADAMARD, n, P(be)->inner->hadamard(be, n, d, x));
}

static void p_hc_pre(struct dsv4_backend *be, int n, int hc, int d, const float *X, const float *fn, const float *scale,
                     const float *base, int iters, double norm_eps, double hc_eps, float *lag, float *u, float *post,
                     float *comb)
{
    TIMED(DSV4_OP_HC_PRE, n,
          P(be)->inner->hc_pre(be, n, hc, d, X, fn, scale, base, iters, norm_eps, hc_eps, lag, u, post, comb));
}

static void p_hc_post(struct dsv4_backend *be, int n, int hc, int d, const float *f, const float *Xres, const float *post,
                      const float *comb, float *Xout)
{
    TIMED(DSV4_OP_HC_POST, n, P(be)->inner->hc_post(be, n, hc, d, f, Xres, post, comb, Xout));
}

static void p_hc_head(struct dsv4_backend *be, int n, int hc, int d, const float *X, const float *fn, const float *scale,
                      const float *base, double norm_eps, double hc_eps, float *y)
{
    TIMED(DSV4_OP_HC_HEAD, n, P(be)->inner->hc_head(be, n, hc, d, X, fn, scale, base, norm_eps, hc_eps, y));
}

static void p_step_begin(struct dsv4_backend *be, const struct dsv4_step_desc *desc)
{
    /* the sequences, not rows: what a device uploads here grows with them */
    TIMED(DSV4_OP_STEP_BEGIN, desc->n_seqs, P(be)->inner->step_begin(be, desc));
}

static void p_attention(struct dsv4_backend *be, const struct dsv4_step_desc *desc, int n_head, int d_head, int d_rope,
                        const float *q, const struct dsv4_attn_src *src, enum dsv4_row_fmt fmt, const float *sink,
                        float scale, float *o)
{
    TIMED(DSV4_OP_ATTENTION, desc->n_rows,
          P(be)->inner->attention(be, desc, n_head, d_head, d_rope, q, src, fmt, sink, scale, o));
}

static void p_indexer_scores(struct dsv4_backend *be, int n_head, int d, const float *q, const float *w,
                             const struct dsv4_kv_rows *keys, int n_keys, float *score)
{
    TIMED(DSV4_OP_INDEXER_SCORES, n_keys, P(be)->inner->indexer_scores(be, n_head, d, q, w, keys, n_keys, score));
}

static void p_indexer_topk(struct dsv4_backend *be, const struct dsv4_step_desc *desc, int ratio, int n_head, int d,
                           const float *q, const float *w, size_t keys_off, int key_bytes, int topk, int *sel,
                           int *n_sel, const struct dsv4_idx_cand *cand)
{
    TIMED(DSV4_OP_INDEXER_TOPK, desc->n_rows,
          P(be)->inner->indexer_topk(be, desc, ratio, n_head, d, q, w, keys_off, key_bytes, topk, sel, n_sel,
                                     cand));
}

static void p_compress(struct dsv4_backend *be, const struct dsv4_step_desc *desc, int ratio, bool overlap, int d,
                       const float *a, const float *g, const float *ape, size_t kv_off, size_t sc_off, float *out)
{
    TIMED(DSV4_OP_COMPRESS, desc->n_rows,
          P(be)->inner->compress(be, desc, ratio, overlap, d, a, g, ape, kv_off, sc_off, out));
}

static void p_store_rows(struct dsv4_backend *be, const struct dsv4_step_desc *desc, enum dsv4_row_fmt fmt, int d,
                         int d_rope, const float *x, int ldx, const struct dsv4_store_dst *dst)
{
    TIMED(DSV4_OP_STORE_ROWS, desc->n_rows, P(be)->inner->store_rows(be, desc, fmt, d, d_rope, x, ldx, dst));
}

static void p_embed(struct dsv4_backend *be, int n, const int *tok, const uint16_t *table, int d, int copies, float *X)
{
    TIMED(DSV4_OP_EMBED, n, P(be)->inner->embed(be, n, tok, table, d, copies, X));
}

static void p_scale(struct dsv4_backend *be, size_t n, float *x, double s)
{
    TIMED(DSV4_OP_SCALE, n, P(be)->inner->scale(be, n, x, s));
}

static void p_add_streams(struct dsv4_backend *be, int n, int hc, int d, const float *e, float *X)
{
    TIMED(DSV4_OP_ADD_STREAMS, n, P(be)->inner->add_streams(be, n, hc, d, e, X));
}

static void p_engram_rows(struct dsv4_backend *be, int n, int n_cols, const int64_t *ids, int ld_ids,
                          const uint8_t *table, const uint8_t *scale, int64_t n_rows, int d, float *out)
{
    TIMED(DSV4_OP_ENGRAM_ROWS, n, P(be)->inner->engram_rows(be, n, n_cols, ids, ld_ids, table, scale, n_rows, d, out));
}

static void p_engram_gate(struct dsv4_backend *be, int n, int hc, int d, const float *kv, const float *w, double eps,
                          float *X)
{
    TIMED(DSV4_OP_ENGRAM_GATE, n, P(be)->inner->engram_gate(be, n, hc, d, kv, w, eps, X));
}

static void p_router(struct dsv4_backend *be, int n, const float *x, const struct dsv4_linear *gate, const float *bias,
                     const int64_t *tid2eid, const int *tokens, int n_exp, int n_used, double route_scale,
                     double gate_temp, int *ids,
                     float *weights, float *scratch)
{
    TIMED(DSV4_OP_ROUTER, n,
          P(be)->inner->router(be, n, x, gate, bias, tid2eid, tokens, n_exp, n_used, route_scale, gate_temp,
                               ids, weights, scratch));
}

static void p_expert(struct dsv4_backend *be, const struct dsv4_expert_w *e, int n, const float *x, int ldx,
                     const float *row_w, double limit, float *y, float *scratch)
{
    TIMED(DSV4_OP_EXPERT, n, P(be)->inner->expert(be, e, n, x, ldx, row_w, limit, y, scratch));
}

static void p_experts(struct dsv4_backend *be, const struct dsv4_expert_w *experts, int n_exp, int n_pairs,
                      const int *grp, const float *x, const float *row_w, double limit, float *y, float *scratch)
{
    /* the pairs, not the groups: the group count stays in the backend's memory */
    TIMED(DSV4_OP_EXPERTS, n_pairs,
          P(be)->inner->experts(be, experts, n_exp, n_pairs, grp, x, row_w, limit, y, scratch));
}

static void p_moe_dispatch(struct dsv4_backend *be, int n, int k, int n_exp, const int *ids, const float *w,
                           const float *x, int d, float *xe, float *row_w, int *pair_of, int *grp)
{
    TIMED(DSV4_OP_MOE_DISPATCH, n,
          P(be)->inner->moe_dispatch(be, n, k, n_exp, ids, w, x, d, xe, row_w, pair_of, grp));
}

static void p_moe_combine(struct dsv4_backend *be, int n, int k, int d, const int *pair_of, const float *ye,
                          const float *shared, float *f)
{
    TIMED(DSV4_OP_MOE_COMBINE, n, P(be)->inner->moe_combine(be, n, k, d, pair_of, ye, shared, f));
}

const struct dsv4_backend_ops dsv4_prof_ops = {
#define WRAP_(u, l) .l = p_##l,
    .name = "profiled",
    DSV4_OP_LIST(WRAP_)
#undef WRAP_
};
