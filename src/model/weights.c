/*
 * weights.c - binds the checkpoint's tensors into typed per-layer structs.
 *
 * From the config alone we know every tensor the model needs (docs/MODEL.md §R2): its name,
 * the dtypes allowed and its shape. Each is looked up, checked and bound (a pointer into the
 * mmap); every problem is collected, so a wrong checkpoint is refused once, with the whole
 * list, instead of one error per attempt. Tensors the model does not use are reported too.
 * The MTP block may be absent as a whole (then has_mtp is false); a partial one is an error.
 * DeepSeek-V4.1's tensors are bound in weights_v41.c with the helpers here (weights_bind.h).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/weights_bind.h"

void dsv4_bind_problem(struct dsv4_binder *b, const char *fmt, ...)
{
    struct dsv4_bind_report *r = b->rep;
    if (r->n_problems == b->cap) {
        int   ncap = b->cap ? b->cap * 2 : 64;
        void *np   = realloc(r->problems, (size_t)ncap * sizeof(*r->problems));
        if (!np) {
            b->oom = true;
            return;
        }
        r->problems = np;
        b->cap      = ncap;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->problems[r->n_problems].text, sizeof(r->problems[0].text), fmt, ap);
    va_end(ap);
    r->n_problems++;
}

static void mask_str(uint32_t mask, char *buf, size_t n)
{
    size_t k = 0;
    buf[0]   = '\0';
    for (int i = 0; i < DSV4_DTYPE_COUNT; i++)
        if (mask & (1u << i))
            k += (size_t)snprintf(buf + k, n - k, "%s%s", k ? " or " : "", dsv4_dtype_name((enum dsv4_dtype)i));
}

/* The dtype the official release stores a tensor in, of those allowed: scales as E8M0,
 * FP4 codes packed in I8 (docs/MODEL.md §R2.1); otherwise the only one allowed. */
static enum dsv4_dtype release_dtype(uint32_t mask)
{
    if (mask & DSV4_DT(F8_E8M0)) return DSV4_DTYPE_F8_E8M0;
    if (mask & DSV4_DT(I8)) return DSV4_DTYPE_I8;
    return (enum dsv4_dtype)__builtin_ctz(mask);
}

/* Looks up one tensor and checks dtype and shape. Returns it (even with a wrong shape, so
 * callers can go on) or NULL when missing or of a wrong dtype. In layout mode it only
 * reports the tensor and returns NULL. */
const struct dsv4_tensor *dsv4_bind_expect(struct dsv4_binder *b, const char *name, uint32_t dtypes, int ndim,
                                        int64_t d0, int64_t d1)
{
    int64_t want[2] = { d0, d1 };
    if (!b->ck) {
        b->layout(b->layout_ud, name, release_dtype(dtypes), ndim, want);
        return NULL;
    }
    const struct dsv4_tensor *t = dsv4_checkpoint_find(b->ck, name);
    char                      ws[64], gs[64];
    dsv4_shape_str(ndim, want, ws, sizeof(ws));
    if (!t) {
        const struct dsv4_shard_refusal *r = dsv4_checkpoint_refusal_of(b->ck, name);
        if (r) dsv4_bind_problem(b, "tensor %s: missing (expected %s): its shard %s was refused", name, ws,
                                 b->ck->file_names[r->file]);
        else dsv4_bind_problem(b, "tensor %s: missing (expected %s)", name, ws);
        b->rep->n_missing++;
        return NULL;
    }
    b->used[t - b->ck->tensors] = 1;
    const char *file = b->ck->file_names[t->file];
    if (!(dtypes & (1u << t->dtype))) {
        char m[96];
        mask_str(dtypes, m, sizeof(m));
        dsv4_bind_problem(b, "tensor %s: dtype %s, expected %s (in %s)", name, dsv4_dtype_name(t->dtype), m, file);
        b->rep->n_dtype++;
        return NULL;
    }
    bool ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == want[i];
    if (!ok) {
        dsv4_bind_problem(b, "tensor %s: shape %s, expected %s (in %s)", name,
                          dsv4_shape_str(t->ndim, t->shape, gs, sizeof(gs)), ws, file);
        b->rep->n_shape++;
        return NULL;
    }
    return t;
}

/*
 * The data of a tensor the code reads as a typed array (f32, i64, bf16). safetensors places
 * tensors at any byte offset; the reference writer keeps them aligned, other writers may
 * not. A misaligned tensor is copied once into the (64-byte aligned) arena, so no code ever
 * makes a misaligned typed load.
 */
static const void *aligned_data(struct dsv4_binder *b, const struct dsv4_tensor *t)
{
    if (!t) return NULL;
    size_t es = dsv4_dtype_size(t->dtype);
    if (es <= 1 || (uintptr_t)t->data % es == 0) return t->data;
    void *copy = dsv4_arena_alloc(b->arena, (size_t)t->nbytes, 64);
    if (!copy) {
        b->oom = true;
        return NULL;
    }
    memcpy(copy, t->data, (size_t)t->nbytes);
    return copy;
}

const void *dsv4_bind_expect_data(struct dsv4_binder *b, const char *name, uint32_t dtypes, int ndim, int64_t d0,
                               int64_t d1)
{
    return aligned_data(b, dsv4_bind_expect(b, name, dtypes, ndim, d0, d1));
}

static int64_t cdiv(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

/* A projection [n_out, n_in] named prefix.weight (+ prefix.scale for FP8/FP4). */
void dsv4_bind_linear(struct dsv4_binder *b, struct dsv4_linear *l, const char *prefix, enum dsv4_wfmt fmt,
                        int n_out, int n_in)
{
    char wn[160], sn[160];
    snprintf(wn, sizeof(wn), "%s.weight", prefix);
    snprintf(sn, sizeof(sn), "%s.scale", prefix);
    l->fmt   = fmt;
    l->n_out = n_out;
    l->n_in  = n_in;
    l->block = b->cfg->fp8_block;
    const struct dsv4_tensor *w = NULL, *s = NULL;
    switch (fmt) {
    case DSV4_WFMT_BF16: w = dsv4_bind_expect(b, wn, DSV4_DT(BF16), 2, n_out, n_in); break;
    case DSV4_WFMT_F32:  w = dsv4_bind_expect(b, wn, DSV4_DT(F32), 2, n_out, n_in); break;
    case DSV4_WFMT_FP8:
        w = dsv4_bind_expect(b, wn, DSV4_DT(F8_E4M3), 2, n_out, n_in);
        s = dsv4_bind_expect(b, sn, DSV4_DT(F8_E8M0) | DSV4_DT(F32), 2, cdiv(n_out, l->block), cdiv(n_in, l->block));
        break;
    case DSV4_WFMT_FP4:
        if (n_in % 32 != 0)
            dsv4_bind_problem(b, "tensor %s: input width %d is not a multiple of 32 (FP4 blocks)", wn, n_in);
        w = dsv4_bind_expect(b, wn, DSV4_DT(I8) | DSV4_DT(U8), 2, n_out, n_in / 2);
        s = dsv4_bind_expect(b, sn, DSV4_DT(F8_E8M0) | DSV4_DT(F32), 2, n_out, n_in / 32);
        break;
    }
    l->wt        = w;
    l->st        = s;
    l->w         = (fmt == DSV4_WFMT_BF16 || fmt == DSV4_WFMT_F32) ? aligned_data(b, w) : w ? w->data : NULL;
    l->scale     = s ? s->data : NULL;
    l->scale_f32 = s && s->dtype == DSV4_DTYPE_F32;
}

static void bind_compressor(struct dsv4_binder *b, struct dsv4_compressor_w *c, const char *prefix,
                            const struct dsv4_layer_kind *k, int d_out)
{
    const struct dsv4_config *cfg = b->cfg;
    char                      n[160];
    c->ratio   = k->ratio;
    c->overlap = k->overlap;
    c->d_out   = d_out;
    c->coff    = dsv4_kind_coff(k);
    snprintf(n, sizeof(n), "%s.ape", prefix);
    c->ape = dsv4_bind_expect_data(b, n, DSV4_DT(F32), 2, c->ratio, (int64_t)c->coff * d_out);
    snprintf(n, sizeof(n), "%s.wkv", prefix);
    dsv4_bind_linear(b, &c->wkv, n, DSV4_WFMT_BF16, c->coff * d_out, cfg->d_model);
    snprintf(n, sizeof(n), "%s.wgate", prefix);
    dsv4_bind_linear(b, &c->wgate, n, DSV4_WFMT_BF16, c->coff * d_out, cfg->d_model);
    snprintf(n, sizeof(n), "%s.norm.weight", prefix);
    c->norm = dsv4_bind_expect_data(b, n, DSV4_DT(BF16), 1, d_out, 0);
}

static void bind_expert(struct dsv4_binder *b, struct dsv4_expert_w *e, const char *prefix, enum dsv4_wfmt fmt)
{
    const struct dsv4_config *c = b->cfg;
    char                      n[160];
    snprintf(n, sizeof(n), "%s.w1", prefix);
    dsv4_bind_linear(b, &e->w1, n, fmt, c->d_ff_exp, c->d_model);
    snprintf(n, sizeof(n), "%s.w3", prefix);
    dsv4_bind_linear(b, &e->w3, n, fmt, c->d_ff_exp, c->d_model);
    snprintf(n, sizeof(n), "%s.w2", prefix);
    dsv4_bind_linear(b, &e->w2, n, fmt, c->d_model, c->d_ff_exp);
}

static void bind_hc(struct dsv4_binder *b, const char *p, const char *which, const float **fn, const float **base,
                    const float **scale)
{
    const struct dsv4_config *c   = b->cfg;
    int64_t                   mix = (int64_t)(2 + c->hc) * c->hc;
    char                      n[160];
    snprintf(n, sizeof(n), "%shc_%s_fn", p, which);
    *fn = dsv4_bind_expect_data(b, n, DSV4_DT(F32), 2, mix, (int64_t)c->hc * c->d_model);
    snprintf(n, sizeof(n), "%shc_%s_base", p, which);
    *base = dsv4_bind_expect_data(b, n, DSV4_DT(F32), 1, mix, 0);
    snprintf(n, sizeof(n), "%shc_%s_scale", p, which);
    *scale = dsv4_bind_expect_data(b, n, DSV4_DT(F32), 1, 3, 0);
}

void dsv4_bind_block_common(struct dsv4_binder *b, struct dsv4_layer_w *L, const char *p)
{
    const struct dsv4_config *c = b->cfg;
    char                      n[160];
    snprintf(n, sizeof(n), "%sattn_norm.weight", p);
    L->attn_norm = dsv4_bind_expect_data(b, n, DSV4_DT(BF16), 1, c->d_model, 0);
    snprintf(n, sizeof(n), "%sffn_norm.weight", p);
    L->ffn_norm = dsv4_bind_expect_data(b, n, DSV4_DT(BF16), 1, c->d_model, 0);
    bind_hc(b, p, "attn", &L->hc_attn_fn, &L->hc_attn_base, &L->hc_attn_scale);
    bind_hc(b, p, "ffn", &L->hc_ffn_fn, &L->hc_ffn_base, &L->hc_ffn_scale);
}

void dsv4_bind_attn_core(struct dsv4_binder *b, struct dsv4_layer_w *L, const char *p)
{
    const struct dsv4_config *c = b->cfg;
    char                      n[160];
#define NAME(suffix) (snprintf(n, sizeof(n), "%s%s", p, suffix), n)
    L->attn_sink = dsv4_bind_expect_data(b, NAME("attn.attn_sink"), DSV4_DT(F32), 1, c->n_head, 0);
    dsv4_bind_linear(b, &L->wq_a, NAME("attn.wq_a"), c->wfmt, c->q_lora_rank, c->d_model);
    L->q_norm = dsv4_bind_expect_data(b, NAME("attn.q_norm.weight"), DSV4_DT(BF16), 1, c->q_lora_rank, 0);
    dsv4_bind_linear(b, &L->wq_b, NAME("attn.wq_b"), c->wfmt, c->n_head * c->d_head, c->q_lora_rank);
    dsv4_bind_linear(b, &L->wkv, NAME("attn.wkv"), c->wfmt, c->d_head, c->d_model);
    L->kv_norm = dsv4_bind_expect_data(b, NAME("attn.kv_norm.weight"), DSV4_DT(BF16), 1, c->d_head, 0);
    dsv4_bind_linear(b, &L->wo_a, NAME("attn.wo_a"), c->wfmt, c->o_groups * c->o_lora_rank,
                     c->n_head * c->d_head / c->o_groups);
    dsv4_bind_linear(b, &L->wo_b, NAME("attn.wo_b"), c->wfmt, c->d_model, c->o_groups * c->o_lora_rank);
#undef NAME
}

void dsv4_bind_experts(struct dsv4_binder *b, struct dsv4_layer_w *L, const char *p, int n_exp)
{
    const struct dsv4_config *c = b->cfg;
    char                      n[160];
    snprintf(n, sizeof(n), "%sffn.shared_experts", p);
    bind_expert(b, &L->shared, n, c->wfmt);
    L->n_exp   = n_exp;
    L->experts = dsv4_arena_zalloc(b->arena, (size_t)n_exp * sizeof(*L->experts), 16);
    if (!L->experts) {
        b->oom = true;
        return;
    }
    for (int e = 0; e < n_exp; e++) {
        snprintf(n, sizeof(n), "%sffn.experts.%d", p, e);
        bind_expert(b, &L->experts[e], n, c->expert_wfmt);
    }
}

/* One block: p is "layers.N." or "mtp.0.". */
static void bind_layer(struct dsv4_binder *b, struct dsv4_layer_w *L, const char *p, int il)
{
    const struct dsv4_config *c = b->cfg;
    char                      n[160];
    L->il   = il;
    L->kind = c->kind[il];
#define NAME(suffix) (snprintf(n, sizeof(n), "%s%s", p, suffix), n)
    dsv4_bind_block_common(b, L, p);
    dsv4_bind_attn_core(b, L, p);
    if (L->kind.ratio) bind_compressor(b, &L->comp, NAME("attn.compressor"), &L->kind, c->d_head);
    if (L->kind.indexer) {
        dsv4_bind_linear(b, &L->idx.wq_b, NAME("attn.indexer.wq_b"), c->wfmt, c->n_idx_head * c->d_idx_head,
                         c->q_lora_rank);
        dsv4_bind_linear(b, &L->idx.weights_proj, NAME("attn.indexer.weights_proj"), DSV4_WFMT_BF16,
                         c->n_idx_head, c->d_model);
        bind_compressor(b, &L->idx.comp, NAME("attn.indexer.compressor"), &L->kind, c->d_idx_head);
    }
    dsv4_bind_linear(b, &L->gate, NAME("ffn.gate"), DSV4_WFMT_BF16, c->n_exp, c->d_model);
    if (L->kind.hash_routed)
        L->tid2eid = dsv4_bind_expect_data(b, NAME("ffn.gate.tid2eid"), DSV4_DT(I64), 2, c->vocab_size, c->n_exp_used);
    else
        L->gate_bias = dsv4_bind_expect_data(b, NAME("ffn.gate.bias"), DSV4_DT(F32), 1, c->n_exp, 0);
    dsv4_bind_experts(b, L, p, c->n_exp);
    if (L->kind.mtp) {
        dsv4_bind_linear(b, &L->e_proj, NAME("e_proj"), c->wfmt, c->d_model, c->d_model);
        dsv4_bind_linear(b, &L->h_proj, NAME("h_proj"), c->wfmt, c->d_model, c->d_model);
        L->enorm    = dsv4_bind_expect_data(b, NAME("enorm.weight"), DSV4_DT(BF16), 1, c->d_model, 0);
        L->hnorm    = dsv4_bind_expect_data(b, NAME("hnorm.weight"), DSV4_DT(BF16), 1, c->d_model, 0);
        L->mtp_norm = dsv4_bind_expect_data(b, NAME("norm.weight"), DSV4_DT(BF16), 1, c->d_model, 0);
        L->hc_head_fn    = dsv4_bind_expect_data(b, NAME("hc_head_fn"), DSV4_DT(F32), 2, c->hc, (int64_t)c->hc * c->d_model);
        L->hc_head_base  = dsv4_bind_expect_data(b, NAME("hc_head_base"), DSV4_DT(F32), 1, c->hc, 0);
        L->hc_head_scale = dsv4_bind_expect_data(b, NAME("hc_head_scale"), DSV4_DT(F32), 1, 1, 0);
    }
#undef NAME
}

/* Checks the values of the hash-routing tables: expert ids must be in range. */
static void check_tid2eid(struct dsv4_binder *b, const struct dsv4_layer_w *L)
{
    if (!L->tid2eid) return;
    const struct dsv4_config *c = b->cfg;
    size_t                    n = (size_t)c->vocab_size * (size_t)c->n_exp_used;
    for (size_t i = 0; i < n; i++) {
        int64_t v;
        memcpy(&v, (const char *)L->tid2eid + i * 8, 8);
        if (v < 0 || v >= c->n_exp) {
            dsv4_bind_problem(b, "tensor layers.%d.ffn.gate.tid2eid: entry %zu (token %zu) is %lld, outside [0, %d)",
                              L->il, i, i / (size_t)c->n_exp_used, (long long)v, c->n_exp);
            return;
        }
    }
}

/*
 * "NAME.i16": the interleaved 16-row tiles of tensor NAME stored by `dsv4 convert --tiles`
 * (docs/FORMAT.md), a 1-D U8 tensor. Expected when NAME is a bound tensor; its size is checked
 * where the tiles are used (model.c), which repacks on a mismatch.
 */
static bool stored_tiles_of_used(const struct dsv4_checkpoint *ck, const uint8_t *used, const struct dsv4_tensor *t)
{
    size_t n = strlen(t->name);
    char   base[256];
    if (n <= 4 || n - 4 >= sizeof(base) || strcmp(t->name + n - 4, ".i16") != 0) return false;
    if (t->dtype != DSV4_DTYPE_U8 || t->ndim != 1) return false;
    memcpy(base, t->name, n - 4);
    base[n - 4] = 0;
    const struct dsv4_tensor *bt = dsv4_checkpoint_find(ck, base);
    return bt && used[bt - ck->tensors];
}

/* The globals and the main layers (everything but the MTP block). */
static void bind_main(struct dsv4_binder *b, struct dsv4_weights *w)
{
    const struct dsv4_config *cfg = b->cfg;
    w->embed = dsv4_bind_expect_data(b, "embed.weight", DSV4_DT(BF16), 2, cfg->vocab_size, cfg->d_model);
    dsv4_bind_linear(b, &w->head, "head", DSV4_WFMT_BF16, cfg->vocab_size, cfg->d_model);
    w->norm          = dsv4_bind_expect_data(b, "norm.weight", DSV4_DT(BF16), 1, cfg->d_model, 0);
    w->hc_head_fn    = dsv4_bind_expect_data(b, "hc_head_fn", DSV4_DT(F32), 2, cfg->hc, (int64_t)cfg->hc * cfg->d_model);
    w->hc_head_base  = dsv4_bind_expect_data(b, "hc_head_base", DSV4_DT(F32), 1, cfg->hc, 0);
    w->hc_head_scale = dsv4_bind_expect_data(b, "hc_head_scale", DSV4_DT(F32), 1, 1, 0);
    w->layers        = dsv4_arena_zalloc(b->arena, (size_t)cfg->n_layer * sizeof(*w->layers), 16);
    if (!w->layers) b->oom = true;
    for (int il = 0; il < cfg->n_layer && !b->oom; il++) {
        char p[32];
        snprintf(p, sizeof(p), "layers.%d.", il);
        bind_layer(b, &w->layers[il], p, il);
        check_tid2eid(b, &w->layers[il]);
    }
}

/* Every tensor of the checkpoint no binding used (padding and stored tiles aside). */
static void report_unexpected(struct dsv4_binder *b)
{
    const struct dsv4_checkpoint *ck = b->ck;
    for (size_t i = 0; i < ck->n_tensors; i++) {
        if (b->used[i] || strncmp(ck->tensors[i].name, DSV4_ST_PAD_PREFIX, strlen(DSV4_ST_PAD_PREFIX)) == 0) continue;
        const struct dsv4_tensor *t = &ck->tensors[i];
        if (stored_tiles_of_used(ck, b->used, t)) continue;
        char s[64];
        dsv4_bind_problem(b, "tensor %s: unexpected (%s %s in %s) - not part of this config's model", t->name,
                          dsv4_dtype_name(t->dtype), dsv4_shape_str(t->ndim, t->shape, s, sizeof(s)),
                          ck->file_names[t->file]);
        b->rep->n_unexpected++;
    }
}

/* DeepSeek-V4: the globals, the main layers and the MTP block, which may be absent as a
 * whole (reported unavailable) but not in part. */
static void bind_v4(struct dsv4_binder *b, struct dsv4_weights *w, bool any_mtp)
{
    bind_main(b, w);
    if (b->cfg->n_mtp > 0 && any_mtp && !b->oom) {
        int before = b->rep->n_problems;
        bind_layer(b, &w->mtp, "mtp.0.", b->cfg->n_layer);
        w->has_mtp = b->rep->n_problems == before;
    }
}

int dsv4_weights_bind(struct dsv4_weights *w, const struct dsv4_config *cfg, const struct dsv4_checkpoint *ck,
                      struct dsv4_arena *arena, struct dsv4_bind_report *rep, struct dsv4_err *err)
{
    memset(w, 0, sizeof(*w));
    memset(rep, 0, sizeof(*rep));
    struct dsv4_binder b = { cfg, ck, arena, rep, calloc(ck->n_tensors + 1, 1), 0, false, NULL, NULL };
    if (!b.used) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory binding weights");
    bool any_mtp = false;
    for (size_t i = 0; i < ck->n_tensors; i++) any_mtp |= strncmp(ck->tensors[i].name, "mtp.", 4) == 0;
    rep->mtp_absent = !any_mtp;
    if (cfg->arch == DSV4_ARCH_V4_1) dsv4_bind_v41(&b, w, any_mtp);
    else bind_v4(&b, w, any_mtp);
    report_unexpected(&b);
    free(b.used);
    if (b.oom) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory binding weights");
    if (rep->n_problems) {
        return dsv4_err_set(err, DSV4_ECHECKPOINT, "checkpoint %s has %d problem%s; first: %s", ck->dir,
                            rep->n_problems, rep->n_problems == 1 ? "" : "s", rep->problems[0].text);
    }
    return DSV4_OK;
}

int dsv4_weights_layout(const struct dsv4_config *cfg, bool with_mtp, dsv4_layout_fn fn, void *ud,
                        struct dsv4_err *err)
{
    if (cfg->arch == DSV4_ARCH_V4_1) /* stats_v41.c sizes V4.1 from its config */
        return dsv4_err_set(err, DSV4_EUNSUPPORTED, "the tensor layout of DeepSeek-V4.1 is not listed yet (issue 41)");
    struct dsv4_arena       arena;
    struct dsv4_bind_report rep;
    struct dsv4_weights     w;
    memset(&w, 0, sizeof(w));
    memset(&rep, 0, sizeof(rep));
    dsv4_arena_init(&arena, 1 << 16);
    struct dsv4_binder b = { cfg, NULL, &arena, &rep, NULL, 0, false, fn, ud };
    bind_main(&b, &w);
    if (with_mtp && cfg->n_mtp > 0 && !b.oom) bind_layer(&b, &w.mtp, "mtp.0.", cfg->n_layer);
    int rc = b.oom ? dsv4_err_set(err, DSV4_ENOMEM, "out of memory listing the weights")
             : rep.n_problems ? dsv4_err_set(err, DSV4_EFORMAT, "%s", rep.problems[0].text)
                              : DSV4_OK;
    dsv4_bind_report_free(&rep);
    dsv4_arena_free(&arena);
    return rc;
}

void dsv4_bind_report_free(struct dsv4_bind_report *r)
{
    free(r->problems);
    memset(r, 0, sizeof(*r));
}

/* Every projection of the model, in a fixed order (unbound ones have n_out 0). */
void dsv4_weights_each_linear(struct dsv4_weights *w, const struct dsv4_config *c,
                              void (*fn)(struct dsv4_linear *l, void *ud), void *ud)
{
    dsv4_weights_each_linear_of(w, c, 0, c->n_exp, true, fn, ud);
}

/* The projections one rank of expert parallelism holds (src/dist/ep.h): the routed experts
 * [exp_lo, exp_hi) of every MoE layer, and every other projection when trunk is set. */
void dsv4_weights_each_linear_of(struct dsv4_weights *w, const struct dsv4_config *c, int exp_lo, int exp_hi,
                                 bool trunk, void (*fn)(struct dsv4_linear *l, void *ud), void *ud)
{
    if (trunk) fn(&w->head, ud);
    for (int il = 0; il <= c->n_layer; il++) {
        if (il == c->n_layer && !w->has_mtp) break;
        struct dsv4_layer_w *L = il < c->n_layer ? &w->layers[il] : &w->mtp;
        struct dsv4_linear  *ls[] = { &L->wq_a,          &L->wq_b,         &L->wkv,          &L->wo_a,
                                      &L->wo_b,          &L->comp.wkv,     &L->comp.wgate,   &L->idx.wq_b,
                                      &L->idx.weights_proj, &L->idx.comp.wkv, &L->idx.comp.wgate, &L->gate,
                                      &L->shared.w1,     &L->shared.w3,    &L->shared.w2,    &L->e_proj,
                                      &L->h_proj };
        for (size_t i = 0; trunk && i < sizeof(ls) / sizeof(ls[0]); i++) fn(ls[i], ud);
        for (int e = exp_lo; L->experts && e < exp_hi && e < c->n_exp; e++) {
            fn(&L->experts[e].w1, ud);
            fn(&L->experts[e].w3, ud);
            fn(&L->experts[e].w2, ud);
        }
    }
}

/* Visits t when it is bound. */
static void visit(const void **t, size_t bytes, void (*fn)(const void **t, size_t bytes, void *ud), void *ud)
{
    if (*t) fn(t, bytes, ud);
}

static void each_compressor_tensor(struct dsv4_compressor_w *cw, void (*fn)(const void **, size_t, void *), void *ud)
{
    size_t width = (size_t)cw->coff * (size_t)cw->d_out;
    visit((const void **)&cw->ape, sizeof(float) * (size_t)cw->ratio * width, fn, ud);
    visit((const void **)&cw->norm, sizeof(uint16_t) * (size_t)cw->d_out, fn, ud);
}

void dsv4_weights_each_tensor(struct dsv4_weights *w, const struct dsv4_config *c,
                              void (*fn)(const void **t, size_t bytes, void *ud), void *ud)
{
    size_t d = (size_t)c->d_model, hc = (size_t)c->hc, mix = (2 + hc) * hc, f = sizeof(float), h = sizeof(uint16_t);
    visit((const void **)&w->embed, h * (size_t)c->vocab_size * d, fn, ud);
    visit((const void **)&w->norm, h * d, fn, ud);
    visit((const void **)&w->hc_head_fn, f * hc * hc * d, fn, ud);
    visit((const void **)&w->hc_head_base, f * hc, fn, ud);
    visit((const void **)&w->hc_head_scale, f, fn, ud);
    for (int il = 0; il <= c->n_layer; il++) {
        if (il == c->n_layer && !w->has_mtp) break;
        struct dsv4_layer_w *L = il < c->n_layer ? &w->layers[il] : &w->mtp;
        visit((const void **)&L->attn_norm, h * d, fn, ud);
        visit((const void **)&L->ffn_norm, h * d, fn, ud);
        visit((const void **)&L->hc_attn_fn, f * mix * hc * d, fn, ud);
        visit((const void **)&L->hc_ffn_fn, f * mix * hc * d, fn, ud);
        visit((const void **)&L->hc_attn_base, f * mix, fn, ud);
        visit((const void **)&L->hc_ffn_base, f * mix, fn, ud);
        visit((const void **)&L->hc_attn_scale, f * 3, fn, ud);
        visit((const void **)&L->hc_ffn_scale, f * 3, fn, ud);
        visit((const void **)&L->attn_sink, f * (size_t)c->n_head, fn, ud);
        visit((const void **)&L->q_norm, h * (size_t)c->q_lora_rank, fn, ud);
        visit((const void **)&L->kv_norm, h * (size_t)c->d_head, fn, ud);
        if (L->kind.ratio) each_compressor_tensor(&L->comp, fn, ud);
        if (L->kind.indexer) each_compressor_tensor(&L->idx.comp, fn, ud);
        visit((const void **)&L->tid2eid, sizeof(int64_t) * (size_t)c->vocab_size * (size_t)c->n_exp_used, fn, ud);
        visit((const void **)&L->gate_bias, f * (size_t)c->n_exp, fn, ud);
        visit((const void **)&L->enorm, h * d, fn, ud);
        visit((const void **)&L->hnorm, h * d, fn, ud);
        visit((const void **)&L->mtp_norm, h * d, fn, ud);
        visit((const void **)&L->hc_head_fn, f * hc * hc * d, fn, ud);
        visit((const void **)&L->hc_head_base, f * hc, fn, ud);
        visit((const void **)&L->hc_head_scale, f, fn, ud);
    }
}
