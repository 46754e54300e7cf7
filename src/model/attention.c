/*
 * attention.c - the attention sublayer of a block (docs/MODEL.md §R3.4-3.7): q and kv
 * projections, RoPE, the KV compressor and indexer, sink attention over the window and the
 * compressed rows, inverse RoPE of the output and the grouped low-rank output projection.
 *
 * Rows of several sequences are projected together; the state-dependent parts (compressor,
 * indexer, attention) run per sequence, reaching compressed rows and indexer keys through
 * the sequence's page table (kv.h). Within a chunk the window of a query at position p
 * is read from the ring for positions before the chunk and from the chunk's own rows
 * (staging) after it; the ring is updated only after the whole chunk, so any chunking of a
 * prompt reads exactly the same rows.
 */
#include <math.h>
#include <string.h>

#include "model/runtime.h"


/* Runs a compressor over every sequence's rows of the step. */
static void run_compressor(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_compressor_w *cw,
                           bool is_indexer, int state, int il, int R)
{
    struct dsv4_backend *be = &S->be;
    int width = cw->coff * cw->d_out;
    be->ops->linear(be, &cw->wkv, R, S->u, m->cfg.d_model, S->ca, width, DSV4_ACT_NONE, DSV4_OUT_F32);
    be->ops->linear(be, &cw->wgate, R, S->u, m->cfg.d_model, S->cg, width, DSV4_ACT_NONE, DSV4_OUT_F32);
    for (int s = 0; s < S->n_seqs; s++) {
        struct dsv4_seq_state   *st = S->seqs[s].st;
        struct dsv4_layer_state *ls = &st->layers[state];
        size_t off = (size_t)S->seq_row0[s] * (size_t)width;
        dsv4_compress_chunk(m, S, cw, is_indexer, st, ls, S->ca + off, S->cg + off, S->seq_n[s], S->seq_pos0[s], il, s);
    }
}

/* Indexer queries and head weights for every row (docs/MODEL.md §R3.7). */
static void indexer_queries(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_layer_w *L, int R)
{
    const struct dsv4_config *c  = &m->cfg;
    struct dsv4_backend      *be = &S->be;
    int nI = c->n_idx_head, dI = c->d_idx_head;
    enum dsv4_act act = c->fp8 ? DSV4_ACT_FP8 : DSV4_ACT_NONE;
    be->ops->linear(be, &L->idx.wq_b, R, S->qr, c->q_lora_rank, S->qi, nI * dI, act, DSV4_OUT_BF16);
    be->ops->rope(be, R, nI, dI, S->qi, S->pos, dsv4_layer_rope(m, L->ratio), false);
    be->ops->hadamard(be, R * nI, dI, S->qi);
    be->ops->fp4_sim(be, R * nI, dI, dI, S->qi, 32);
    be->ops->linear(be, &L->idx.weights_proj, R, S->u, c->d_model, S->wi, nI, DSV4_ACT_NONE, DSV4_OUT_BF16);
    double wscale = (float)(pow(dI, -0.5) * pow(nI, -0.5)); /* an f32 constant, as in the demo */
    be->ops->scale(be, (size_t)R * (size_t)nI, S->wi, wscale);
}

/* The chunk's own KV rows, encoded: one page of max_rows rows. */
static struct dsv4_kv_rows staging_rows(struct dsv4_step *S, const struct dsv4_seq_state *st, int r0)
{
    static const int32_t page0[1] = { 0 };
    return (struct dsv4_kv_rows){ .base = S->staging + (size_t)r0 * (size_t)st->row_bytes, .page = page0,
                                  .page_rows = S->max_rows, .row_bytes = st->row_bytes };
}

/* Attention of every row of one sequence: the chunk's rows are encoded into staging, the
 * indexer picks compressed rows (CSA), every query attends, then the ring keeps the last
 * `window` rows. */
static void attend_seq(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_layer_w *L, int state,
                       int s, int il)
{
    const struct dsv4_config *c  = &m->cfg;
    struct dsv4_backend      *be = &S->be;
    struct dsv4_seq_state    *st = S->seqs[s].st;
    struct dsv4_layer_state  *ls = &st->layers[state];
    int    r0 = S->seq_row0[s], n = S->seq_n[s], p0 = S->seq_pos0[s], win = c->window;
    int    HD = c->n_head * c->d_head;
    float  scale = (float)pow(c->d_head, -0.5);
    struct dsv4_attn_src src = { .p0 = p0, .window = win, .ratio = L->ratio, .ring = dsv4_kv_ring_rows(st, ls),
                                 .chunk = staging_rows(S, st, r0) };
    if (L->ratio) src.comp = dsv4_kv_comp_rows(st, ls);
    const float *kv = S->kv + (size_t)r0 * (size_t)c->d_head;
    be->ops->store_rows(be, st->fmt, c->d_head, c->d_rope, n, kv, c->d_head, &src.chunk, 0, 0);
    if (L->ratio == 4) {
        struct dsv4_kv_rows keys = dsv4_kv_idx_rows(st, ls);
        int nI = c->n_idx_head, dI = c->d_idx_head;
        be->ops->indexer_topk(be, n, p0, nI, dI, S->qi + (size_t)r0 * (size_t)(nI * dI), S->wi + (size_t)r0 * (size_t)nI,
                              &keys, c->idx_topk, S->isel, S->n_isel);
        src.sel        = S->isel;
        src.n_sel      = S->n_isel;
        src.sel_stride = c->idx_topk;
        if (S->dump.fn)
            for (int t = 0; t < n; t++) {
                /* the selected set, -1 padded to index_topk, as floats (read back: the
                 * selection is backend memory) */
                float fsel[4096];
                int   sel[4096], n_sel, w = c->idx_topk < 4096 ? c->idx_topk : 4096;
                dsv4_dump_read(S, &n_sel, S->n_isel + t, sizeof(int));
                dsv4_dump_read(S, sel, S->isel + (size_t)t * (size_t)c->idx_topk, sizeof(int) * (size_t)w);
                for (int i = 0; i < w; i++) fsel[i] = i < n_sel ? (float)sel[i] : -1.0f;
                dsv4_dump(S, "idx_topk", il, s, p0 + t, 1, w, fsel);
            }
    }
    be->ops->attention(be, n, c->n_head, c->d_head, c->d_rope, S->q + (size_t)r0 * (size_t)HD, &src, st->fmt,
                       L->attn_sink, scale, S->o + (size_t)r0 * (size_t)HD);
    /* the ring keeps the last `win` rows (after every query of the chunk has read it), at
     * position % ring_rows */
    int from = n > win ? n - win : 0;
    be->ops->store_rows(be, st->fmt, c->d_head, c->d_rope, n - from, kv + (size_t)from * (size_t)c->d_head, c->d_head,
                        &src.ring, p0 + from, st->ring_rows);
}

void dsv4_attention_sublayer(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_layer_w *L,
                             int state, int R)
{
    const struct dsv4_config *c  = &m->cfg;
    struct dsv4_backend      *be = &S->be;
    int il = L->il, H = c->n_head, D = c->d_head, HD = H * D;
    enum dsv4_act act = c->fp8 ? DSV4_ACT_FP8 : DSV4_ACT_NONE;
    const struct dsv4_rope_table *rope = dsv4_layer_rope(m, L->ratio);

    /* q: low-rank projection, q_norm, per-head RMS, RoPE on the last d_rope dims */
    be->ops->linear(be, &L->wq_a, R, S->u, c->d_model, S->qr, c->q_lora_rank, act, DSV4_OUT_BF16);
    be->ops->rmsnorm(be, R, c->q_lora_rank, S->qr, c->q_lora_rank, L->q_norm, c->norm_eps, S->qr, c->q_lora_rank);
    for (int s = 0; s < S->n_seqs; s++)
        dsv4_dump_dev(S, "qr", il, s, S->seq_pos0[s], S->seq_n[s], c->q_lora_rank,
                      S->qr + (size_t)S->seq_row0[s] * (size_t)c->q_lora_rank);
    be->ops->linear(be, &L->wq_b, R, S->qr, c->q_lora_rank, S->q, HD, act, DSV4_OUT_BF16);
    be->ops->head_rms(be, R, H, D, S->q, c->norm_eps);
    be->ops->rope(be, R, H, D, S->q, S->pos, rope, false);
    /* kv: one latent row per token, used as both K and V */
    be->ops->linear(be, &L->wkv, R, S->u, c->d_model, S->kv, D, act, DSV4_OUT_BF16);
    be->ops->rmsnorm(be, R, D, S->kv, D, L->kv_norm, c->norm_eps, S->kv, D);
    be->ops->rope(be, R, 1, D, S->kv, S->pos, rope, false);
    if (m->row_fmt == DSV4_ROW_FP8) be->ops->fp8_sim(be, R, c->d_nope, D, S->kv, 64);
    for (int s = 0; s < S->n_seqs; s++) {
        int r0 = S->seq_row0[s];
        dsv4_dump_dev(S, "q", il, s, S->seq_pos0[s], S->seq_n[s], HD, S->q + (size_t)r0 * (size_t)HD);
        dsv4_dump_dev(S, "kv", il, s, S->seq_pos0[s], S->seq_n[s], D, S->kv + (size_t)r0 * (size_t)D);
    }
    /* compressed rows (and indexer keys) of the completed blocks, then the indexer queries */
    if (L->has_indexer) {
        run_compressor(m, S, &L->idx.comp, true, state, il, R);
        indexer_queries(m, S, L, R);
    }
    if (L->has_comp) run_compressor(m, S, &L->comp, false, state, il, R);
    for (int s = 0; s < S->n_seqs; s++) attend_seq(m, S, L, state, s, il);
    /* undo the query-position rotation of the output, then the grouped output projection */
    be->ops->rope(be, R, H, D, S->o, S->pos, rope, true);
    for (int s = 0; s < S->n_seqs; s++)
        dsv4_dump_dev(S, "o", il, s, S->seq_pos0[s], S->seq_n[s], HD, S->o + (size_t)S->seq_row0[s] * (size_t)HD);
    int G = c->o_groups, gin = HD / G, gout = c->o_lora_rank;
    for (int g = 0; g < G; g++) {
        struct dsv4_linear wa = L->wo_a;
        wa.n_out   = gout;
        wa.row_off = g * gout;
        be->ops->linear(be, &wa, R, S->o + (size_t)g * (size_t)gin, HD, S->z + (size_t)g * (size_t)gout, G * gout,
                        DSV4_ACT_NONE, DSV4_OUT_BF16);
    }
    be->ops->linear(be, &L->wo_b, R, S->z, G * gout, S->f, c->d_model, act, DSV4_OUT_BF16);
    for (int s = 0; s < S->n_seqs; s++)
        dsv4_dump_dev(S, "attn_out", il, s, S->seq_pos0[s], S->seq_n[s], c->d_model,
                      S->f + (size_t)S->seq_row0[s] * (size_t)c->d_model);
}
