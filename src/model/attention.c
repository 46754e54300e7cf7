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
    for (size_t i = 0; i < (size_t)R * (size_t)nI; i++) S->wi[i] = dsv4_round_bf16((float)(S->wi[i] * wscale));
}

/* Attention of every row of one sequence. */
static void attend_seq(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_layer_w *L, int state,
                       int s, int il)
{
    const struct dsv4_config *c  = &m->cfg;
    struct dsv4_backend      *be = &S->be;
    struct dsv4_seq_state    *st = S->seqs[s].st;
    struct dsv4_layer_state  *ls = &st->layers[state];
    int    r0 = S->seq_row0[s], n = S->seq_n[s], p0 = S->seq_pos0[s], win = c->window, rb = st->row_bytes;
    int    ratio = L->ratio, HD = c->n_head * c->d_head;
    float  scale = (float)pow(c->d_head, -0.5);
    uint8_t *staging = S->staging + (size_t)r0 * (size_t)rb;
    for (int t = 0; t < n; t++) dsv4_row_encode(st->fmt, c->d_head, c->d_rope, S->kv + (size_t)(r0 + t) * (size_t)c->d_head,
                                                 staging + (size_t)t * (size_t)rb);
    for (int t = 0; t < n; t++) {
        int p = p0 + t, nr = 0;
        int first = p - win + 1 > 0 ? p - win + 1 : 0;
        for (int q = first; q <= p; q++)
            S->rowptr[nr++] = q < p0 ? ls->ring + (size_t)(q % win) * (size_t)rb : staging + (size_t)(q - p0) * (size_t)rb;
        int n_done = ratio ? (p + 1) / ratio : 0;
        if (ratio == 4) {
            int *sel = S->isel;
            int  k   = dsv4_indexer_select(m, S, S->qi + (size_t)(r0 + t) * (size_t)(c->n_idx_head * c->d_idx_head),
                                           S->wi + (size_t)(r0 + t) * (size_t)c->n_idx_head, st, ls, n_done, sel);
            float fsel[4096];
            int   nd = k < 4096 ? k : 4096;
            for (int i = 0; i < k; i++) S->rowptr[nr++] = dsv4_kv_comp_row(st, ls, sel[i]);
            if (S->dump.fn) {
                /* the selected set, -1 padded to index_topk, as floats */
                int w = c->idx_topk < 4096 ? c->idx_topk : 4096;
                for (int i = 0; i < w; i++) fsel[i] = i < nd ? (float)sel[i] : -1.0f;
                dsv4_dump(S, "idx_topk", il, s, p, 1, w, fsel);
            }
        } else if (ratio) {
            for (int j = 0; j < n_done; j++) S->rowptr[nr++] = dsv4_kv_comp_row(st, ls, j);
        }
        DSV4_ASSERT(nr <= S->max_attn_rows);
        be->ops->attention(be, c->n_head, c->d_head, c->d_rope, S->q + (size_t)(r0 + t) * (size_t)HD, S->rowptr, nr,
                           st->fmt, L->attn_sink, scale, S->o + (size_t)(r0 + t) * (size_t)HD);
    }
    /* the ring keeps the last `win` rows */
    int from = n > win ? n - win : 0;
    for (int t = from; t < n; t++)
        memcpy(ls->ring + (size_t)((p0 + t) % win) * (size_t)rb, staging + (size_t)t * (size_t)rb, (size_t)rb);
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
        dsv4_dump(S, "qr", il, s, S->seq_pos0[s], S->seq_n[s], c->q_lora_rank,
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
        dsv4_dump(S, "q", il, s, S->seq_pos0[s], S->seq_n[s], HD, S->q + (size_t)r0 * (size_t)HD);
        dsv4_dump(S, "kv", il, s, S->seq_pos0[s], S->seq_n[s], D, S->kv + (size_t)r0 * (size_t)D);
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
        dsv4_dump(S, "o", il, s, S->seq_pos0[s], S->seq_n[s], HD, S->o + (size_t)S->seq_row0[s] * (size_t)HD);
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
        dsv4_dump(S, "attn_out", il, s, S->seq_pos0[s], S->seq_n[s], c->d_model,
                  S->f + (size_t)S->seq_row0[s] * (size_t)c->d_model);
}
