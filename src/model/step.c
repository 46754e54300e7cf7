/*
 * step.c - the scratch of one forward step, planned once and carved from two allocations
 * (llm.c's malloc-and-point): the buffers the ops use, from the backend's memory, and the
 * host metadata. Sizes follow from the config, the largest batch of rows and the largest
 * context; nothing in the forward allocates afterwards.
 */
#include <stdlib.h>
#include <string.h>

#include "dist/ep.h"
#include "model/runtime.h"

static size_t a64(size_t v)
{
    return (v + 63) & ~(size_t)63;
}

static int imax(int a, int b)
{
    return a > b ? a : b;
}

/* Largest number of cached rows one query attends to: the window and the compressed rows
 * (all of them, or what the indexer keeps). */
static int max_attn_rows(const struct dsv4_config *c, int max_ctx)
{
    int most = 0;
    for (int il = 0; il < c->n_layer; il++) {
        const struct dsv4_layer_kind *k = &c->kind[il];
        if (!k->ratio) continue;
        int rows = max_ctx / k->ratio;
        most     = imax(most, k->indexer ? imax(0, k->idx_topk < rows ? k->idx_topk : rows) : rows);
    }
    /* a DSpark draft block reads its ring and all its rows (dspark.c) */
    if (c->arch == DSV4_ARCH_V4_1 && c->n_mtp) most = imax(most, c->v41.dspark_block);
    return c->window + most;
}

/* The smallest ratio of the layers with an indexer (0: none): a query scores at most
 * max_ctx / it keys. */
static int idx_ratio(const struct dsv4_config *c)
{
    int least = 0;
    for (int il = 0; il < c->n_layer; il++)
        if (c->kind[il].indexer && (!least || c->kind[il].ratio < least)) least = c->kind[il].ratio;
    return least;
}

/* DeepSeek-V4.1's projection inputs wider than V4's kinds: Engram's wkv over the table rows of
 * a token, the first DSpark stage's main_proj over its targets, the confidence head. */
static int wide_in(const struct dsv4_config *c)
{
    if (c->arch != DSV4_ARCH_V4_1) return 0;
    const struct dsv4_v41_config *v = &c->v41;
    int w = v->n_engram ? (v->engram_max_ngram - 1) * v->engram_n_head * v->engram_d_head : 0;
    if (c->n_mtp) w = imax(w, imax(v->n_dspark_target * c->d_model, c->d_model + v->dspark_markov_rank));
    return w;
}

/* The widths a backend sizes its scratch by. */
static struct dsv4_plan_dims plan_dims(const struct dsv4_config *c, int R, int max_ctx)
{
    return (struct dsv4_plan_dims){ .wide_in = wide_in(c), .max_rows = R, .max_ctx = max_ctx, .max_attn_rows = max_attn_rows(c, max_ctx),
                                    .d_model = c->d_model, .hc = c->hc, .n_head = c->n_head, .d_head = c->d_head,
                                    .d_rope = c->d_rope, .q_lora_rank = c->q_lora_rank, .o_groups = c->o_groups,
                                    .o_lora_rank = c->o_lora_rank, .n_exp = c->n_exp, .n_exp_used = c->n_exp_used,
                                    .d_ff_exp = c->d_ff_exp, .n_idx_head = c->n_idx_head,
                                    .d_idx_head = c->d_idx_head, .idx_topk = c->idx_topk,
                                    .idx_ratio = idx_ratio(c) };
}

/* Lays out both parts (dev: backend buffers, host: metadata) from base pointers, or only
 * sizes them when the bases are NULL. */
static void plan(struct dsv4_step *s, const struct dsv4_model *m, int R, int max_ctx, uint8_t *dev, uint8_t *host,
                 size_t *dev_bytes, size_t *host_bytes)
{
    const struct dsv4_config *c = &m->cfg;
    size_t off = 0;
    size_t d = (size_t)c->d_model, hc = (size_t)c->hc, r = (size_t)R;
    struct dsv4_plan_dims dims = plan_dims(c, R, max_ctx);
    uint8_t *base = dev;
#define F(ptr, n)                                                                                                  \
    do {                                                                                                           \
        if (base) (ptr) = (void *)(base + off);                                                                    \
        off += a64(sizeof(float) * (size_t)(n));                                                                   \
    } while (0)
#define B(ptr, n)                                                                                                  \
    do {                                                                                                           \
        if (base) (ptr) = (void *)(base + off);                                                                    \
        off += a64((size_t)(n));                                                                                   \
    } while (0)
    F(s->X, r * hc * d);
    F(s->Xn, r * hc * d);
    F(s->Xm, r * hc * d);
    F(s->u, r * d);
    F(s->f, r * d);
    F(s->post, r * hc);
    F(s->comb, r * hc * hc);
    F(s->qr, r * (size_t)c->q_lora_rank);
    F(s->q, r * (size_t)c->n_head * (size_t)c->d_head);
    F(s->o, r * (size_t)c->n_head * (size_t)c->d_head);
    F(s->kv, r * (size_t)c->d_head);
    F(s->z, r * (size_t)c->o_groups * (size_t)c->o_lora_rank);
    F(s->ca, r * 2 * (size_t)c->d_head);
    F(s->cg, r * 2 * (size_t)c->d_head);
    F(s->crows, (r + 1) * (size_t)imax(c->d_head, c->d_idx_head));
    F(s->qi, r * (size_t)c->n_idx_head * (size_t)c->d_idx_head);
    F(s->wi, r * (size_t)c->n_idx_head);
    F(s->isel, r * (size_t)imax(c->idx_topk, 1));
    F(s->n_isel, r);
    size_t pairs = r * (size_t)c->n_exp_used;
    F(s->xe, pairs * d);
    F(s->ye, pairs * d);
    F(s->row_w, pairs);
    F(s->pair_of, pairs);
    F(s->grp, 2 * (size_t)c->n_exp + 2); /* fixed capacity: n_exp groups whatever the routing */
    F(s->shared_y, r * d);
    F(s->exp_scratch, 2 * (pairs > r ? pairs : r) * (size_t)c->d_ff_exp);
    F(s->router_scratch, (r + 1) * (size_t)c->n_exp);
    F(s->ids, r * (size_t)c->n_exp_used);
    F(s->rw, r * (size_t)c->n_exp_used);
    F(s->hid, r * d);
    B(s->staging, r * (size_t)dsv4_row_bytes(m->row_fmt, c->d_head, c->d_rope));
    if (m->backend && !m->backend->host_visible) F(s->logits_dev, r * (size_t)c->vocab_size);
    if (c->arch == DSV4_ARCH_V4_1) {
        const struct dsv4_v41_config *v = &c->v41;
        size_t cols = v->n_engram ? (size_t)(v->engram_max_ngram - 1) * (size_t)v->engram_n_head : 0;
        F(s->lag, r * hc);
        F(s->cand, r * (size_t)imax(v->cand_topk_blocks, 1));
        F(s->ckeys, (r + 1) * (size_t)c->d_idx_head);
        F(s->erows, r * cols * (size_t)v->engram_d_head);
        F(s->ekv, v->n_engram ? r * (hc + 1) * d : 0);
        if (c->n_mtp) {
            F(s->mh, r * (size_t)v->n_dspark_target * d);
            F(s->mmix, r * hc);
            F(s->dconf, r * (d + (size_t)v->dspark_markov_rank));
            F(s->conf, r);
            F(s->mbias, (size_t)imax(1, R / imax(1, v->dspark_block)) * (size_t)c->vocab_size);
        }
    }
    size_t sc = m->backend ? m->backend->scratch_floats(m->backend_impl, &dims) : 0;
    F(s->be.scratch, sc);
    *dev_bytes = off;
    /* host metadata */
    off  = 0;
    base = host;
    F(s->pos, r);
    F(s->tok, r);
    F(s->cpos, r + 1);
    F(s->seq_row0, r);
    F(s->seq_n, r);
    F(s->seq_pos0, r);
    B(s->dseq, r * sizeof(struct dsv4_step_seq));
    if (c->arch == DSV4_ARCH_V4_1 && c->v41.n_engram) {
        const struct dsv4_v41_config *v = &c->v41;
        B(s->eids, r * sizeof(int64_t) * (size_t)v->n_engram * (size_t)(v->engram_max_ngram - 1) *
                       (size_t)v->engram_n_head);
        B(s->ecomp, r * sizeof(int32_t));
    }
    *host_bytes = off;
    if (dev) {
        s->be.scratch_len = sc;
        s->max_attn_rows  = dims.max_attn_rows;
    }
#undef F
#undef B
}

size_t dsv4_step_bytes(const struct dsv4_model *m, int max_rows, int max_ctx)
{
    struct dsv4_step tmp;
    size_t           dev, host;
    memset(&tmp, 0, sizeof(tmp));
    plan(&tmp, m, max_rows, max_ctx, NULL, NULL, &dev, &host);
    return dev + host;
}

size_t dsv4_step_expert_bytes(const struct dsv4_model *m, int max_rows)
{
    const struct dsv4_config *c     = &m->cfg;
    size_t                    pairs = (size_t)max_rows * (size_t)c->n_exp_used, d = (size_t)c->d_model;
    /* no attention runs there: the smallest context keeps the backend's attention part small */
    struct dsv4_plan_dims dims = plan_dims(c, max_rows, 1);
    size_t sc = m->backend ? m->backend->scratch_floats(m->backend_impl, &dims) : 0;
    /* as plan() lays them out: xe, ye, row_w, pair_of, grp, exp_scratch, the backend's */
    return 2 * a64(sizeof(float) * pairs * d) + 2 * a64(sizeof(float) * pairs) +
           a64(sizeof(float) * (2 * (size_t)c->n_exp + 2)) + a64(sizeof(float) * 2 * pairs * (size_t)c->d_ff_exp) +
           a64(sizeof(float) * sc);
}

int dsv4_step_init(struct dsv4_step *s, const struct dsv4_model *m, int max_rows, int max_ctx, struct dsv4_err *err)
{
    memset(s, 0, sizeof(*s));
    size_t dev_bytes, host_bytes;
    plan(s, m, max_rows, max_ctx, NULL, NULL, &dev_bytes, &host_bytes);
    void *dev = m->backend->alloc(m->backend_impl, dev_bytes, DSV4_MEM_ACT), *host = NULL;
    if (!dev || posix_memalign(&host, 64, host_bytes) != 0 || !host) {
        if (dev) m->backend->free(m->backend_impl, dev, dev_bytes);
        return dsv4_err_set(err, DSV4_ENOMEM, "cannot allocate %.1f MiB of step scratch for %d rows",
                            (double)(dev_bytes + host_bytes) / 1048576.0, max_rows);
    }
    memset(host, 0, host_bytes);
    plan(s, m, max_rows, max_ctx, dev, host, &dev_bytes, &host_bytes);
    s->m          = m;
    s->dev        = dev;
    s->host       = host;
    s->dev_bytes  = dev_bytes;
    s->host_bytes = host_bytes;
    s->max_rows   = max_rows;
    s->max_ctx    = max_ctx;
    s->be.ops     = m->ops;
    s->be.impl    = m->backend_impl;
    s->be.prof    = m->prof;
    /* the expert ranks size their buffers for these steps now, not during one */
    int rc = m->ep ? dsv4_ep_reserve(m->ep, max_rows, err) : DSV4_OK;
    if (rc) dsv4_step_free(s);
    return rc;
}

void dsv4_step_describe(struct dsv4_step *S, int n_rows)
{
    for (int s = 0; s < S->n_seqs; s++) {
        const struct dsv4_seq_state *st = S->seqs[s].st;
        S->dseq[s] = (struct dsv4_step_seq){ .row0 = S->seq_row0[s], .n = S->seq_n[s], .p0 = S->seq_pos0[s],
                                             .slot = st->slot, .page_base = st->page_base, .page = st->page };
    }
    const struct dsv4_seq_state *st0 = S->n_seqs ? S->seqs[0].st : NULL;
    S->desc = (struct dsv4_step_desc){ .n_seqs = S->n_seqs, .n_rows = n_rows, .seq = S->dseq, .pos = S->pos,
                                       .tok = S->tok, .page_tokens = st0 ? st0->page_tokens : 0,
                                       .page_bytes = st0 ? st0->page_bytes : 0 };
    S->be.ops->step_begin(&S->be, &S->desc);
}

int dsv4_step_check_layout(const struct dsv4_fwd_seq *seqs, int n_seqs, struct dsv4_err *err)
{
    for (int s = 1; s < n_seqs; s++)
        if (seqs[s].st->page_tokens != seqs[0].st->page_tokens || seqs[s].st->page_bytes != seqs[0].st->page_bytes)
            return dsv4_err_set(err, DSV4_EINVAL, "sequences of one step with different KV page sizes (%d, %d tokens)",
                                seqs[0].st->page_tokens, seqs[s].st->page_tokens);
    return DSV4_OK;
}

void dsv4_step_free(struct dsv4_step *s)
{
    if (s->dev) s->m->backend->free(s->m->backend_impl, s->dev, s->dev_bytes);
    free(s->host);
    free(s->dump_host);
    memset(s, 0, sizeof(*s));
}
