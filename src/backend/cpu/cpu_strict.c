/*
 * cpu_strict.c - `cpu-strict`: the CPU ops on memory the host cannot peek into.
 *
 * Like cpu-staged it tells the model that its buffers are not host memory (host_visible
 * false) and copies every each_tensor table into its own memory. Unlike cpu-staged, the
 * addresses its alloc hands out cannot be read or written by anyone (strict_mem.h: the host's
 * view of its memory is PROT_NONE), so a host access of a backend buffer anywhere in the
 * program faults (SIGSEGV) in the tests instead of passing unseen. Its own code reaches the
 * bytes through a second view: every op of its table translates the addresses it is given
 * (buffers, the placed tables, the scratch, the rows' bases inside the row descriptors) and
 * calls the CPU's op; upload, download and copy translate theirs. The weights stay the
 * mapped checkpoint (read-only host memory, which the contract allows ops to read).
 *
 * Cost: a few adds per op; no system call. docs/BACKENDS.md gives the figures, and those of
 * the mprotect gate this replaced. Results are the CPU's, bit for bit: the same ops run on
 * the same values.
 */
#include <stdio.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/strict_mem.h"

/* Shared memory reserved at create (nothing is committed until written): more than any test
 * or tiny model needs; strict_mem.c halves it where the system refuses that much. */
#define STRICT_RESERVE ((size_t)64 << 30)

static struct dsv4_strict_mem *guard_of(void *impl)
{
    return ((struct dsv4_cpu *)impl)->guard;
}

/* ------------------------------------------------------------------ the op table */

/* The CPU table the wrappers call: the reference ops at level ref, else the fast ones, as
 * the CPU kind chooses. Nested ops go through be->ops again (the strict table, or the
 * profiler's around it), with addresses already translated: translating is idempotent. */
static const struct dsv4_backend_ops *inner(const struct dsv4_backend *be)
{
    const struct dsv4_cpu *cpu = be->impl;
    return cpu->ref ? &dsv4_cpu_ref_ops : &dsv4_cpu_fast_ops;
}

/* An address as the CPU's code must see it: in the backend's view when it is strict memory
 * (buffers, the placed tables), else unchanged (host arrays, the mapped weights). */
static void *tr(const struct dsv4_backend *be, const void *p)
{
    return dsv4_strict_in(guard_of(be->impl), p);
}

#define T(p) tr(be, (p))

/* The context with its scratch (strict memory) translated. */
static struct dsv4_backend ctx(const struct dsv4_backend *be)
{
    struct dsv4_backend b = *be;
    b.scratch             = T(be->scratch);
    return b;
}

static struct dsv4_kv_rows rows_of(const struct dsv4_backend *be, const struct dsv4_kv_rows *r)
{
    struct dsv4_kv_rows o = *r;
    o.base                = T(r->base);
    return o;
}

static void s_linear(struct dsv4_backend *be, const struct dsv4_linear *w, int n_tok, const float *x, int ldx, float *y,
                     int ldy, enum dsv4_act act, enum dsv4_out out)
{
    struct dsv4_backend b = ctx(be);
    inner(be)->linear(&b, w, n_tok, T(x), ldx, T(y), ldy, act, out);
}

static void s_rmsnorm(struct dsv4_backend *be, int n, int d, const float *x, int ldx, const uint16_t *w, double eps,
                      float *y, int ldy)
{
    struct dsv4_backend b = ctx(be);
    inner(be)->rmsnorm(&b, n, d, T(x), ldx, T(w), eps, T(y), ldy);
}

static void s_head_rms(struct dsv4_backend *be, int n, int n_head, int d_head, float *q, double eps)
{
    struct dsv4_backend b = ctx(be);
    inner(be)->head_rms(&b, n, n_head, d_head, T(q), eps);
}

static void s_rope(struct dsv4_backend *be, int n, int n_vec, int d_full, float *x, const int *pos,
                   const struct dsv4_rope_table *t, bool inverse)
{
    struct dsv4_backend    b  = ctx(be);
    struct dsv4_rope_table tt = { t->d_rope, T(t->freq) };
    inner(be)->rope(&b, n, n_vec, d_full, T(x), T(pos), &tt, inverse);
}

static void s_fp8_sim(struct dsv4_backend *be, int n, int d, int ld, float *x, int block)
{
    struct dsv4_backend b = ctx(be);
    inner(be)->fp8_sim(&b, n, d, ld, T(x), block);
}

static void s_fp4_sim(struct dsv4_backend *be, int n, int d, int ld, float *x, int block, bool e4m3_scale)
{
    struct dsv4_backend b = ctx(be);
    inner(be)->fp4_sim(&b, n, d, ld, T(x), block, e4m3_scale);
}

static void s_hadamard(struct dsv4_backend *be, int n, int d, float *x)
{
    struct dsv4_backend b = ctx(be);
    inner(be)->hadamard(&b, n, d, T(x));
}

static void s_hc_pre(struct dsv4_backend *be, int n, int hc, int d, const float *X, const float *fn, const float *scale,
                     const float *base, int iters, double norm_eps, double hc_eps, float *lag, float *u, float *post,
                     float *comb)
{
    struct dsv4_backend b = ctx(be);
    inner(be)->hc_pre(&b, n, hc, d, T(X), T(fn), T(scale), T(base), iters, norm_eps, hc_eps, T(lag), T(u), T(post),
                      T(comb));
}

static void s_hc_post(struct dsv4_backend *be, int n, int hc, int d, const float *f, const float *Xres, const float *post,
                      const float *comb, float *Xout)
{
    struct dsv4_backend b = ctx(be);
    inner(be)->hc_post(&b, n, hc, d, T(f), T(Xres), T(post), T(comb), T(Xout));
}

static void s_hc_head(struct dsv4_backend *be, int n, int hc, int d, const float *X, const float *fn, const float *scale,
                      const float *base, double norm_eps, double hc_eps, float *y)
{
    struct dsv4_backend b = ctx(be);
    inner(be)->hc_head(&b, n, hc, d, T(X), T(fn), T(scale), T(base), norm_eps, hc_eps, T(y));
}

/* The step descriptor as the CPU's code must see it: each sequence's slot and pages in the
 * backend's view. The copy is the calling thread's (a step's ops run on the thread that
 * issued them; the pool's workers only read it while the op runs), so nothing is allocated
 * and concurrent contexts on other threads keep their own. */
enum { STRICT_MAX_SEQS = 1024 };

static const struct dsv4_step_desc *desc_of(const struct dsv4_backend *be, const struct dsv4_step_desc *d,
                                            struct dsv4_step_desc *out)
{
    static _Thread_local struct dsv4_step_seq seq[STRICT_MAX_SEQS];
    DSV4_ASSERT(d->n_seqs <= STRICT_MAX_SEQS);
    *out = *d;
    for (int s = 0; s < d->n_seqs; s++) {
        seq[s]           = d->seq[s];
        seq[s].slot      = T(d->seq[s].slot);
        seq[s].page_base = T(d->seq[s].page_base);
        seq[s].page      = T(d->seq[s].page);
    }
    out->seq = seq, out->pos = T(d->pos), out->tok = T(d->tok);
    return out;
}

static void s_step_begin(struct dsv4_backend *be, const struct dsv4_step_desc *desc)
{
    struct dsv4_backend   b = ctx(be);
    struct dsv4_step_desc d;
    inner(be)->step_begin(&b, desc_of(be, desc, &d));
}

static void s_attention(struct dsv4_backend *be, const struct dsv4_step_desc *desc, int n_head, int d_head, int d_rope,
                        const float *q, const struct dsv4_attn_src *src, enum dsv4_row_fmt fmt, const float *sink,
                        float scale, float *o)
{
    struct dsv4_backend   b = ctx(be);
    struct dsv4_step_desc d;
    struct dsv4_attn_src  s = *src;
    s.chunk                 = T(src->chunk);
    s.sel                   = T(src->sel);
    s.n_sel                 = T(src->n_sel);
    inner(be)->attention(&b, desc_of(be, desc, &d), n_head, d_head, d_rope, T(q), &s, fmt, T(sink), scale, T(o));
}

static void s_indexer_scores(struct dsv4_backend *be, int n_head, int d, const float *q, const float *w,
                             const struct dsv4_kv_rows *keys, int n_keys, float *score)
{
    struct dsv4_backend b = ctx(be);
    struct dsv4_kv_rows k = rows_of(be, keys);
    inner(be)->indexer_scores(&b, n_head, d, T(q), T(w), &k, n_keys, T(score));
}

static void s_indexer_topk(struct dsv4_backend *be, const struct dsv4_step_desc *desc, int ratio, int n_head, int d,
                           const float *q, const float *w, size_t keys_off, int key_bytes, int topk, int *sel,
                           int *n_sel, const struct dsv4_idx_cand *cand)
{
    struct dsv4_backend   b = ctx(be);
    struct dsv4_step_desc dd;
    struct dsv4_idx_cand  c = cand ? *cand : (struct dsv4_idx_cand){ 0 };
    c.blocks                = T(c.blocks);
    inner(be)->indexer_topk(&b, desc_of(be, desc, &dd), ratio, n_head, d, T(q), T(w), keys_off, key_bytes, topk,
                            T(sel), T(n_sel), cand ? &c : NULL);
}

static void s_compress(struct dsv4_backend *be, const struct dsv4_step_desc *desc, int ratio, bool overlap, int d,
                       const float *a, const float *g, const float *ape, size_t kv_off, size_t sc_off, float *out)
{
    struct dsv4_backend   b = ctx(be);
    struct dsv4_step_desc dd;
    inner(be)->compress(&b, desc_of(be, desc, &dd), ratio, overlap, d, T(a), T(g), T(ape), kv_off, sc_off, T(out));
}

static void s_store_rows(struct dsv4_backend *be, const struct dsv4_step_desc *desc, enum dsv4_row_fmt fmt, int d,
                         int d_rope, const float *x, int ldx, const struct dsv4_store_dst *dst)
{
    struct dsv4_backend   b = ctx(be);
    struct dsv4_step_desc dd;
    struct dsv4_store_dst to = *dst;
    to.rows                  = T(dst->rows);
    inner(be)->store_rows(&b, desc_of(be, desc, &dd), fmt, d, d_rope, T(x), ldx, &to);
}

static void s_embed(struct dsv4_backend *be, int n, const int *tok, const uint16_t *table, int d, int copies, float *X)
{
    struct dsv4_backend b = ctx(be);
    inner(be)->embed(&b, n, T(tok), T(table), d, copies, T(X));
}

static void s_scale(struct dsv4_backend *be, size_t n, float *x, double s)
{
    struct dsv4_backend b = ctx(be);
    inner(be)->scale(&b, n, T(x), s);
}

static void s_add_streams(struct dsv4_backend *be, int n, int hc, int d, const float *e, float *X)
{
    struct dsv4_backend b = ctx(be);
    inner(be)->add_streams(&b, n, hc, d, T(e), T(X));
}

static void s_engram_rows(struct dsv4_backend *be, int n, int n_cols, const int64_t *ids, int ld_ids,
                          const uint8_t *table, const uint8_t *scale, int64_t n_rows, int d, float *out)
{
    struct dsv4_backend b = ctx(be);
    inner(be)->engram_rows(&b, n, n_cols, T(ids), ld_ids, T(table), T(scale), n_rows, d, T(out));
}

static void s_engram_gate(struct dsv4_backend *be, int n, int hc, int d, const float *kv, const float *w, double eps,
                          float *X)
{
    struct dsv4_backend b = ctx(be);
    inner(be)->engram_gate(&b, n, hc, d, T(kv), T(w), eps, T(X));
}

static void s_router(struct dsv4_backend *be, int n, const float *x, const struct dsv4_linear *gate, const float *bias,
                     const int64_t *tid2eid, const int *tokens, int n_exp, int n_used, double route_scale,
                     double gate_temp, int *ids,
                     float *weights, float *scratch)
{
    struct dsv4_backend b = ctx(be);
    inner(be)->router(&b, n, T(x), gate, T(bias), T(tid2eid), T(tokens), n_exp, n_used, route_scale,
                      gate_temp, T(ids),
                      T(weights), T(scratch));
}

static void s_expert(struct dsv4_backend *be, const struct dsv4_expert_w *e, int n, const float *x, int ldx,
                     const float *row_w, double limit, float *y, float *scratch)
{
    struct dsv4_backend b = ctx(be);
    inner(be)->expert(&b, e, n, T(x), ldx, T(row_w), limit, T(y), T(scratch));
}

static void s_experts(struct dsv4_backend *be, const struct dsv4_expert_w *experts, int n_exp, int n_pairs,
                      const int *grp, const float *x, const float *row_w, double limit, float *y, float *scratch)
{
    struct dsv4_backend b = ctx(be);
    inner(be)->experts(&b, experts, n_exp, n_pairs, T(grp), T(x), T(row_w), limit, T(y), T(scratch));
}

static void s_moe_dispatch(struct dsv4_backend *be, int n, int k, int n_exp, const int *ids, const float *w,
                           const float *x, int d, float *xe, float *row_w, int *pair_of, int *grp)
{
    struct dsv4_backend b = ctx(be);
    inner(be)->moe_dispatch(&b, n, k, n_exp, T(ids), T(w), T(x), d, T(xe), T(row_w), T(pair_of), T(grp));
}

static void s_moe_combine(struct dsv4_backend *be, int n, int k, int d, const int *pair_of, const float *ye,
                          const float *shared, float *f)
{
    struct dsv4_backend b = ctx(be);
    inner(be)->moe_combine(&b, n, k, d, T(pair_of), T(ye), T(shared), T(f));
}

/* Complete by construction: a missing wrapper does not compile (op_list.h). */
static const struct dsv4_backend_ops strict_ops = {
#define WRAP_(u, l) .l = s_##l,
    .name = "cpu-strict",
    DSV4_OP_LIST(WRAP_)
#undef WRAP_
};

/* ------------------------------------------------------------------ lifecycle */

static int strict_create(void **impl, const struct dsv4_backend_params *p, struct dsv4_err *err)
{
    int rc = dsv4_backend_cpu.create(impl, p, err);
    if (rc) return rc;
    struct dsv4_cpu *cpu = *impl;
    rc                   = dsv4_strict_mem_create(&cpu->guard, STRICT_RESERVE, err);
    if (rc) {
        dsv4_backend_cpu.destroy(cpu);
        *impl = NULL;
    }
    return rc;
}

static void strict_destroy(void *impl)
{
    struct dsv4_strict_mem *g = guard_of(impl);
    dsv4_backend_cpu.destroy(impl); /* the tiles and the pool; the tables go with the range */
    dsv4_strict_mem_free(g);
}

static const struct dsv4_backend_ops *strict_ops_of(void *impl)
{
    (void)impl;
    return &strict_ops;
}

static void strict_describe(void *impl, char *buf, size_t cap)
{
    char cpu[96];
    dsv4_backend_cpu.describe(impl, cpu, sizeof(cpu));
    snprintf(buf, cap, "%s, strict memory", cpu);
}

static void strict_settings(void *impl, struct dsv4_backend_settings *s)
{
    dsv4_backend_cpu.settings(impl, s);
}

static size_t strict_scratch_floats(void *impl, const struct dsv4_plan_dims *dims)
{
    return dsv4_backend_cpu.scratch_floats(impl, dims);
}

/* ------------------------------------------------------------------ memory */

static void *strict_alloc(void *impl, size_t bytes, enum dsv4_mem_kind kind)
{
    (void)kind;
    return dsv4_strict_alloc(guard_of(impl), bytes);
}

static void strict_free(void *impl, void *buf, size_t bytes)
{
    dsv4_strict_release(guard_of(impl), buf, bytes);
}

/* upload, download and copy alike: a memmove in the backend's view */
static void strict_move(void *impl, void *dst, const void *src, size_t bytes)
{
    if (!bytes) return;
    struct dsv4_strict_mem *g = guard_of(impl);
    memmove(dsv4_strict_in(g, dst), dsv4_strict_in(g, src), bytes);
}

static void strict_sync(void *impl)
{
    (void)impl; /* ops return when done */
}

/* The host's memory, capped at what is left of the reserved range. */
static int strict_memory(void *impl, size_t *avail, size_t *total)
{
    size_t reserved, used;
    dsv4_strict_usage(guard_of(impl), &reserved, &used);
    int rc = dsv4_backend_cpu.memory(impl, avail, total);
    if (rc) return rc;
    if (*total > reserved) *total = reserved;
    if (*avail > reserved - used) *avail = reserved - used;
    return DSV4_OK;
}

struct place_tables {
    struct dsv4_cpu *cpu;
    uint8_t         *at;    /* placing: the next free byte of the block */
    size_t           bytes; /* sizing: the tables, each 64-byte aligned */
};

/* Sizes the tables (at NULL) or uploads each one and repoints the model's pointer to it. */
static void place_one(const void **t, size_t bytes, void *ud)
{
    struct place_tables *P = ud;
    if (P->at) {
        strict_move(P->cpu, P->at, *t, bytes);
        *t = P->at;
        P->at += (bytes + 63) & ~(size_t)63;
    } else {
        P->bytes += (bytes + 63) & ~(size_t)63;
    }
}

/* As the CPU's (tiles or read-ahead), then every each_tensor table into strict memory: the
 * ops read no table where the host put it, and the host cannot read the copies. */
static int strict_prepare_weights(void *impl, struct dsv4_weight_set *ws, const struct dsv4_backend_params *p,
                                  struct dsv4_err *err)
{
    int rc = dsv4_backend_cpu.prepare_weights(impl, ws, p, err);
    if (rc) return rc;
    struct place_tables P = { .cpu = impl };
    ws->each_tensor(ws->ctx, place_one, &P);
    if (!P.bytes) return DSV4_OK;
    P.at = strict_alloc(impl, P.bytes, DSV4_MEM_WEIGHTS); /* freed with the range at destroy */
    if (!P.at)
        return dsv4_err_set(err, DSV4_ENOMEM, "out of strict memory for the %.2f GB of tables", (double)P.bytes / 1e9);
    ws->each_tensor(ws->ctx, place_one, &P);
    return DSV4_OK;
}

/* ------------------------------------------------------------------ machine figures */

static double strict_read_bandwidth(void *impl, const void *buf, size_t bytes, int reps)
{
    return dsv4_backend_cpu.read_bandwidth(impl, dsv4_strict_in(guard_of(impl), buf), bytes, reps);
}

static void strict_peaks(void *impl, double *f32, double *bf16)
{
    dsv4_backend_cpu.peaks(impl, f32, bf16);
}

/* The checkpoint stays mapped host memory, as on the CPU: the memory plan counts it so. */
static size_t strict_weights_resident(void *impl, size_t mapped)
{
    return dsv4_backend_cpu.weights_resident(impl, mapped);
}

const struct dsv4_backend_kind dsv4_backend_cpu_strict = {
    .name = "cpu-strict", .host_visible = false,
    .create = strict_create, .destroy = strict_destroy, .ops = strict_ops_of, .describe = strict_describe,
    .settings = strict_settings, .prepare_weights = strict_prepare_weights, .scratch_floats = strict_scratch_floats,
    .alloc = strict_alloc, .free = strict_free, .upload = strict_move, .download = strict_move, .copy = strict_move,
    .sync = strict_sync, .memory = strict_memory, .weights_resident = strict_weights_resident,
    .describe_op = dsv4_cpu_describe_op, .level = dsv4_cpu_level_at, /* cpu_describe.c */
    .read_bandwidth = strict_read_bandwidth, .peaks = strict_peaks,
};
