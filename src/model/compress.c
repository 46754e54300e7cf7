/*
 * compress.c - the KV compressor of a step's chunks (gated softmax pooling, docs/MODEL.md
 * §R3.6) and what follows it: each completed block's pooled row is normalised, rotated to
 * its block's first position and stored into the page that holds the block (kv.h), as a
 * compressed KV row or, for the indexer's compressor, as a Hadamard-rotated FP4 key.
 *
 * The compress op walks each sequence's chunk token by token against the sequence's
 * frontier state, so the rows do not depend on how a prompt is chunked: prefill and decode
 * are the same code. It runs once for every sequence of the step (the step descriptor), and
 * the rows the chunks complete, packed sequence after sequence, are post-processed together
 * (every op here is row-wise) and stored by one store_rows call.
 */
#include "model/runtime.h"

/* The packed rows' first positions (for RoPE) and the dumps' layout, per sequence. */
int dsv4_group_positions(struct dsv4_step *S, int r)
{
    int rows = 0;
    for (int s = 0; s < S->n_seqs; s++) {
        int j0 = S->seq_pos0[s] / r, j1 = (S->seq_pos0[s] + S->seq_n[s]) / r;
        for (int j = j0; j < j1; j++) S->cpos[rows++] = j * r; /* each row's first position */
    }
    return rows;
}

static void dump_blocks(struct dsv4_step *S, bool is_indexer, int r, int d, int il)
{
    int row = 0;
    for (int s = 0; s < S->n_seqs; s++) {
        int j0 = S->seq_pos0[s] / r, j1 = (S->seq_pos0[s] + S->seq_n[s]) / r;
        for (int j = j0; j < j1; j++, row++)
            dsv4_dump_dev(S, is_indexer ? "idx_keys" : "comp", il, s, j, 1, d, S->crows + (size_t)row * (size_t)d);
    }
}

void dsv4_compress_save_undo(struct dsv4_step *S, int il, bool is_indexer, int state, int d, size_t W)
{
    for (int s = 0; s < S->n_seqs; s++) { /* a verify chunk's undo record, before the op moves the frontier */
        struct dsv4_spec_undo *u = S->seqs[s].undo;
        if (u && S->seq_n[s]) {
            size_t off = (size_t)S->seq_row0[s] * W;
            dsv4_spec_save_compressor(S, u, il, is_indexer, &S->seqs[s].st->layers[state], d, S->ca + off,
                                      S->cg + off, S->seq_n[s], S->seq_pos0[s]);
        }
    }
}

void dsv4_compress_step(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_compressor_w *cw,
                        bool is_indexer, const struct dsv4_seq_state *st, int state, int il)
{
    const struct dsv4_config *c  = &m->cfg;
    struct dsv4_backend      *be = &S->be;
    const struct dsv4_layer_state *ls = &st->layers[state];
    int    r = cw->ratio, d = cw->d_out;
    size_t W = (size_t)(cw->coff * d);
    const float *kv = is_indexer ? ls->ikv : ls->ckv, *sc = is_indexer ? ls->isc : ls->csc;
    if (il < c->n_layer) dsv4_compress_save_undo(S, il, is_indexer, state, d, W);
    be->ops->compress(be, &S->desc, r, cw->overlap, d, S->ca, S->cg, cw->ape, dsv4_kv_slot_off(st, kv),
                      dsv4_kv_slot_off(st, sc), S->crows);
    int rows = dsv4_group_positions(S, r);
    if (!rows) return;
    be->ops->rmsnorm(be, rows, d, S->crows, d, cw->norm, c->norm_eps, S->crows, d);
    be->ops->rope(be, rows, 1, d, S->crows, S->cpos, dsv4_layer_rope(m, r), false);
    struct dsv4_store_dst dst = { .to = DSV4_STORE_BLOCKS, .off = is_indexer ? ls->idx_off : ls->comp_off, .ratio = r,
                                  .row_bytes = is_indexer ? st->idx_bytes : st->row_bytes };
    if (is_indexer) {
        be->ops->hadamard(be, rows, d, S->crows);
        be->ops->fp4_sim(be, rows, d, d, S->crows, 32, false);
        be->ops->store_rows(be, &S->desc, DSV4_ROW_IDX_FP4, d, 0, S->crows, d, &dst);
    } else {
        if (m->row_fmt == DSV4_ROW_FP8) be->ops->fp8_sim(be, rows, c->d_nope, d, S->crows, 64);
        be->ops->store_rows(be, &S->desc, m->row_fmt, d, c->d_rope, S->crows, d, &dst);
    }
    dump_blocks(S, is_indexer, r, d, il);
}
