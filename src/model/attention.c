/*
 * attention.c - the attention sublayer of a block (docs/MODEL.md §R3.4-3.7): q and kv
 * projections, RoPE, the KV compressor and indexer, sink attention over the window and the
 * compressed rows, inverse RoPE of the output and the grouped low-rank output projection.
 *
 * Rows of several sequences are projected together, and the state-dependent parts
 * (compressor, indexer, attention, row stores) are one op call each for all the sequences
 * of the step: the step descriptor (backend.h, S->desc) gives each sequence's rows, slot and
 * page table, the call the layer's offsets in a slot and a page (kv.h). Within a chunk the
 * window of a query at position p is read from the ring for positions before the chunk and
 * from the chunk's own rows (staging) after it; the ring is updated only after the whole
 * chunk, so any chunking of a prompt reads exactly the same rows.
 */
#include <math.h>
#include <string.h>

#include "model/runtime.h"

/* A sequence of the step with rows: its state's offsets are every sequence's (kv.h). The
 * sublayer runs only for a step with rows, so there is one. */
const struct dsv4_seq_state *dsv4_layout_seq(const struct dsv4_step *S)
{
    for (int s = 0; s < S->n_seqs; s++)
        if (S->seq_n[s]) return S->seqs[s].st;
    DSV4_ASSERT(0);
    return NULL;
}

/* Runs a compressor over every sequence's rows of the step. */
static void run_compressor(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_compressor_w *cw,
                           bool is_indexer, int state, int il, int R)
{
    struct dsv4_backend *be = &S->be;
    int width = cw->coff * cw->d_out;
    be->ops->linear(be, &cw->wkv, R, S->u, m->cfg.d_model, S->ca, width, DSV4_ACT_NONE, DSV4_OUT_F32);
    be->ops->linear(be, &cw->wgate, R, S->u, m->cfg.d_model, S->cg, width, DSV4_ACT_NONE, DSV4_OUT_F32);
    dsv4_compress_step(m, S, cw, is_indexer, dsv4_layout_seq(S), state, il);
}

/* Indexer queries and head weights for every row (docs/MODEL.md §R3.7). */
void dsv4_indexer_queries(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_layer_w *L, int R)
{
    const struct dsv4_config *c  = &m->cfg;
    struct dsv4_backend      *be = &S->be;
    int nI = c->n_idx_head, dI = c->d_idx_head;
    enum dsv4_act act = c->fp8 ? DSV4_ACT_FP8 : DSV4_ACT_NONE;
    be->ops->linear(be, &L->idx.wq_b, R, S->qr, c->q_lora_rank, S->qi, nI * dI, act, DSV4_OUT_BF16);
    be->ops->rope(be, R, nI, dI, S->qi, S->pos, dsv4_layer_rope(m, L->kind.ratio), false);
    if (c->arch == DSV4_ARCH_V4) be->ops->hadamard(be, R * nI, dI, S->qi); /* V4.1: none */
    be->ops->fp4_sim(be, R * nI, dI, dI, S->qi, 32, false);
    be->ops->linear(be, &L->idx.weights_proj, R, S->u, c->d_model, S->wi, nI, DSV4_ACT_NONE, DSV4_OUT_BF16);
    double wscale = (float)(pow(dI, -0.5) * pow(nI, -0.5)); /* an f32 constant, as in the demo */
    be->ops->scale(be, (size_t)R * (size_t)nI, S->wi, wscale);
}

/* The indexer's choice for every row (layers with an indexer), over the keys of the layer's
 * keys source, into the step's isel / n_isel (row r's slice at r * idx_topk), and its dump:
 * the selected set, -1 padded to index_topk, as floats. */
void dsv4_indexer_select(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_seq_state *st,
                         const struct dsv4_layer_kind *k, int il, const struct dsv4_idx_cand *cand)
{
    const struct dsv4_config      *c    = &m->cfg;
    struct dsv4_backend           *be   = &S->be;
    const struct dsv4_layer_state *keys = &st->layers[k->keys_source];
    be->ops->indexer_topk(be, &S->desc, keys->kind.ratio, c->n_idx_head, c->d_idx_head, S->qi, S->wi, keys->idx_off,
                          st->idx_bytes, k->idx_topk, S->isel, S->n_isel, cand);
    if (!S->dump.fn) return;
    for (int s = 0; s < S->n_seqs; s++)
        for (int t = 0; t < S->seq_n[s]; t++) {
            /* read back: the selection is backend memory */
            float  fsel[4096];
            int    sel[4096], n_sel, w = k->idx_topk < 4096 ? k->idx_topk : 4096;
            size_t r = (size_t)(S->seq_row0[s] + t);
            dsv4_dump_read(S, &n_sel, S->n_isel + r, sizeof(int));
            dsv4_dump_read(S, sel, S->isel + r * (size_t)k->idx_topk, sizeof(int) * (size_t)w);
            for (int i = 0; i < w; i++) fsel[i] = i < n_sel ? (float)sel[i] : -1.0f;
            dsv4_dump(S, "idx_topk", il, s, S->seq_pos0[s] + t, 1, w, fsel);
        }
}

/* Attention of every row of the step, each of the three ops one call for all the sequences:
 * the chunks' rows are encoded into staging, every query attends (with sel, over the
 * compressed rows of the layer's kv source that S->isel names), then each ring keeps its
 * sequence's last `window` rows. A DeepSeek-V4.1 DSpark stage (kind.mtp) attends as a draft
 * block (its ring and all its block rows, not causal) and keeps nothing: its ring holds
 * the main model's rows (dspark.c). */
void dsv4_attend_rows(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_layer_w *L, int state,
                      bool sel)
{
    const struct dsv4_config     *c  = &m->cfg;
    struct dsv4_backend          *be = &S->be;
    const struct dsv4_seq_state  *st = dsv4_layout_seq(S);
    const struct dsv4_layer_state *ls = &st->layers[state];
    const struct dsv4_layer_kind  *k  = &L->kind;
    float  scale = (float)pow(c->d_head, -0.5);
    struct dsv4_store_dst stage = { .to = DSV4_STORE_STEP, .rows = S->staging, .row_bytes = st->row_bytes };
    be->ops->store_rows(be, &S->desc, st->fmt, c->d_head, c->d_rope, S->kv, c->d_head, &stage);
    struct dsv4_attn_src src = { .window = k->window, .ratio = k->ratio, .ring_rows = st->ring_rows,
                                 .row_bytes = st->row_bytes, .ring_off = dsv4_kv_slot_off(st, ls->ring),
                                 .chunk = S->staging, .block = c->arch == DSV4_ARCH_V4_1 && k->mtp };
    if (k->ratio) src.comp_off = st->layers[k->kv_source].comp_off;
    if (sel) {
        src.sel        = S->isel;
        src.n_sel      = S->n_isel;
        src.sel_stride = k->idx_topk;
    }
    be->ops->attention(be, &S->desc, c->n_head, c->d_head, c->d_rope, S->q, &src, st->fmt, L->attn_sink, scale, S->o);
    if (src.block) return;
    /* the ring keeps the last `window` rows (after every query of the chunk has read it), at
     * position % ring_rows */
    struct dsv4_store_dst ring = { .to = DSV4_STORE_RING, .off = src.ring_off, .window = k->window,
                                   .ring_rows = st->ring_rows, .row_bytes = st->row_bytes };
    be->ops->store_rows(be, &S->desc, st->fmt, c->d_head, c->d_rope, S->kv, c->d_head, &ring);
}

void dsv4_attn_output(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_layer_w *L, int R)
{
    const struct dsv4_config *c  = &m->cfg;
    struct dsv4_backend      *be = &S->be;
    int il = L->il, H = c->n_head, D = c->d_head, HD = H * D;
    enum dsv4_act act = c->fp8 ? DSV4_ACT_FP8 : DSV4_ACT_NONE;
    /* undo the query-position rotation of the output, then the grouped output projection */
    be->ops->rope(be, R, H, D, S->o, S->pos, dsv4_layer_rope(m, L->kind.ratio), true);
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

void dsv4_attention_sublayer(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_layer_w *L,
                             int state, int R)
{
    const struct dsv4_config *c  = &m->cfg;
    struct dsv4_backend      *be = &S->be;
    int il = L->il, H = c->n_head, D = c->d_head, HD = H * D;
    enum dsv4_act act = c->fp8 ? DSV4_ACT_FP8 : DSV4_ACT_NONE;
    const struct dsv4_rope_table *rope = dsv4_layer_rope(m, L->kind.ratio);

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
    if (L->kind.indexer) {
        run_compressor(m, S, &L->idx.comp, true, state, il, R);
        dsv4_indexer_queries(m, S, L, R);
    }
    if (L->kind.ratio) run_compressor(m, S, &L->comp, false, state, il, R);
    if (L->kind.indexer) dsv4_indexer_select(m, S, dsv4_layout_seq(S), &L->kind, il, NULL); /* V4: no candidates */
    dsv4_attend_rows(m, S, L, state, L->kind.indexer);
    dsv4_attn_output(m, S, L, R);
}
