/*
 * attention_v41.c - DeepSeek-V4.1's attention sublayer (docs/MODEL.md §6; semantics
 * tools/ref/model_v41.py `attention`): q = wq_b(q_norm(wq_a(x))) with RoPE and no per-head
 * RMS; the window KV row kv_norm(wkv(x)) with RoPE, FP8-simulated per 32 over the whole row.
 *
 * Only a kv source compresses: ratio 2 pools each group of two tokens (the compress op,
 * softmax gate, no overlap, a zero APE), ratio 1 is norm(wkv(x)) per token. From the latent
 * of each completed group it stores its index keys k_norm(wk(latent)) (RoPE at the group's
 * first position, FP4 per 32) and its compressed row (RoPE, FP4 per 16 with e4m3 scales,
 * held exactly in bf16). A source stores before any layer reads, so every index source
 * scores the keys as the prefill does, whatever the chunking.
 *
 * Only an index source runs its indexer (FP4 queries, no Hadamard) over its kv source's
 * keys; the candidate source picks the candidate blocks into S->cand, later index sources
 * choose inside them. A layer that is not an index source attends over the selection the
 * latest one left in S->isel (it ran earlier in this step: layers run in order).
 */
#include "model/runtime.h"

void dsv4_v41_window_kv(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_layer_w *L, int R)
{
    const struct dsv4_config *c  = &m->cfg;
    struct dsv4_backend      *be = &S->be;
    int D = c->d_head;
    enum dsv4_act act = c->fp8 ? DSV4_ACT_FP8 : DSV4_ACT_NONE;
    be->ops->linear(be, &L->wkv, R, S->u, c->d_model, S->kv, D, act, DSV4_OUT_BF16);
    be->ops->rmsnorm(be, R, D, S->kv, D, L->kv_norm, c->norm_eps, S->kv, D);
    be->ops->rope(be, R, 1, D, S->kv, S->pos, dsv4_layer_rope(m, L->kind.ratio), false);
    be->ops->fp8_sim(be, R, D, D, S->kv, 32);
}

/* q into S->q (and q_norm's output in S->qr for the indexer), the window row into S->kv. */
static void project(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_layer_w *L, int R)
{
    const struct dsv4_config *c  = &m->cfg;
    struct dsv4_backend      *be = &S->be;
    int H = c->n_head, D = c->d_head, rank = c->q_lora_rank;
    enum dsv4_act act = c->fp8 ? DSV4_ACT_FP8 : DSV4_ACT_NONE;
    const struct dsv4_rope_table *rope = dsv4_layer_rope(m, L->kind.ratio);
    be->ops->linear(be, &L->wq_a, R, S->u, c->d_model, S->qr, rank, act, DSV4_OUT_BF16);
    be->ops->rmsnorm(be, R, rank, S->qr, rank, L->q_norm, c->norm_eps, S->qr, rank);
    be->ops->linear(be, &L->wq_b, R, S->qr, rank, S->q, H * D, act, DSV4_OUT_BF16);
    be->ops->rope(be, R, H, D, S->q, S->pos, rope, false);
    dsv4_v41_window_kv(m, S, L, R);
    for (int s = 0; s < S->n_seqs; s++)
        dsv4_dump_dev(S, "kv", L->il, s, S->seq_pos0[s], S->seq_n[s], D, S->kv + (size_t)S->seq_row0[s] * (size_t)D);
}

/* The latents (before RoPE) of the groups the step completes into S->crows, normalised;
 * returns their count (positions in S->cpos). */
static int latents(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_layer_w *L,
                   const struct dsv4_layer_state *ls, int R)
{
    const struct dsv4_config *c  = &m->cfg;
    struct dsv4_backend      *be = &S->be;
    const struct dsv4_compressor_w *cw = &L->comp;
    const struct dsv4_seq_state    *st = dsv4_layout_seq(S);
    int D = c->d_head, r = L->kind.ratio;
    if (r == 1) {
        be->ops->linear(be, &cw->wkv, R, S->u, c->d_model, S->crows, D, DSV4_ACT_NONE, DSV4_OUT_BF16);
    } else {
        be->ops->linear(be, &cw->wkv, R, S->u, c->d_model, S->ca, D, DSV4_ACT_NONE, DSV4_OUT_F32);
        be->ops->linear(be, &cw->wgate, R, S->u, c->d_model, S->cg, D, DSV4_ACT_NONE, DSV4_OUT_F32);
        dsv4_compress_save_undo(S, L->il, false, L->il, D, (size_t)D);
        be->ops->compress(be, &S->desc, r, false, D, S->ca, S->cg, m->v41->zero_ape, dsv4_kv_slot_off(st, ls->ckv),
                          dsv4_kv_slot_off(st, ls->csc), S->crows);
    }
    int rows = dsv4_group_positions(S, r);
    if (rows) be->ops->rmsnorm(be, rows, D, S->crows, D, cw->norm, c->norm_eps, S->crows, D);
    return rows;
}

/* A kv source's groups: index keys, then compressed rows, stored into the sequences' pages. */
static void compress_v41(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_layer_w *L, int R)
{
    const struct dsv4_config      *c  = &m->cfg;
    struct dsv4_backend           *be = &S->be;
    const struct dsv4_seq_state   *st = dsv4_layout_seq(S);
    const struct dsv4_layer_state *ls = &st->layers[L->il];
    int D = c->d_head, dI = c->d_idx_head, r = L->kind.ratio;
    int rows = latents(m, S, L, ls, R);
    if (!rows) return;
    const struct dsv4_rope_table *rope = dsv4_layer_rope(m, r);
    be->ops->linear(be, &L->idx.wk, rows, S->crows, D, S->ckeys, dI, DSV4_ACT_NONE, DSV4_OUT_BF16);
    be->ops->rmsnorm(be, rows, dI, S->ckeys, dI, L->idx.k_norm, c->norm_eps, S->ckeys, dI);
    be->ops->rope(be, rows, 1, dI, S->ckeys, S->cpos, rope, false);
    be->ops->fp4_sim(be, rows, dI, dI, S->ckeys, 32, false);
    struct dsv4_store_dst keys = { .to = DSV4_STORE_BLOCKS, .off = ls->idx_off, .ratio = r, .row_bytes = st->idx_bytes };
    be->ops->store_rows(be, &S->desc, DSV4_ROW_IDX_FP4, dI, 0, S->ckeys, dI, &keys);
    be->ops->rope(be, rows, 1, D, S->crows, S->cpos, rope, false);
    be->ops->fp4_sim(be, rows, D, D, S->crows, 16, true);
    struct dsv4_store_dst comp = { .to = DSV4_STORE_BLOCKS, .off = ls->comp_off, .ratio = r, .row_bytes = st->row_bytes };
    be->ops->store_rows(be, &S->desc, m->row_fmt, D, c->d_rope, S->crows, D, &comp);
}

/* An index source's selection: FP4 queries over its kv source's keys, with the candidate
 * blocks picked (the candidate source) or obeyed (index sources after it). */
static void select_rows(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_layer_w *L, int R)
{
    const struct dsv4_v41_config *v = &m->cfg.v41;
    const struct dsv4_layer_kind *k = &L->kind;
    struct dsv4_idx_cand cand = { .block = v->cand_block, .n_keep = v->cand_topk_blocks,
                                  .pick = k->cand_source == L->il, .blocks = S->cand };
    dsv4_indexer_queries(m, S, L, R);
    dsv4_indexer_select(m, S, dsv4_layout_seq(S), k, L->il, k->cand_source >= 0 ? &cand : NULL);
}

void dsv4_attention_v41(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_layer_w *L, int R)
{
    const struct dsv4_layer_kind *k = &L->kind;
    project(m, S, L, R);
    if (k->ratio && k->kv_source == L->il) compress_v41(m, S, L, R);
    if (k->ratio && k->index_source == L->il) select_rows(m, S, L, R);
    dsv4_attend_rows(m, S, L, L->il, k->ratio > 0);
    dsv4_attn_output(m, S, L, R);
}
