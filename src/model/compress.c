/*
 * compress.c - the KV compressor of one sequence's chunk (gated softmax pooling, docs/MODEL.md
 * §R3.6) and what follows it: each completed block's pooled row is normalised, rotated to
 * its block's first position and stored into the page that holds the block (kv.h), as a
 * compressed KV row or, for the indexer's compressor, as a Hadamard-rotated FP4 key.
 *
 * The compress op walks the chunk token by token against the sequence's frontier state, so
 * the rows do not depend on how a prompt is chunked: prefill and decode are the same code.
 * The rows a chunk completes are post-processed together (every op here is row-wise).
 */
#include "model/runtime.h"

void dsv4_compress_chunk(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_compressor_w *cw,
                         bool is_indexer, const struct dsv4_seq_state *st, struct dsv4_layer_state *ls,
                         const float *a, const float *g, int n, int p0, int il, int seq)
{
    const struct dsv4_config *c  = &m->cfg;
    struct dsv4_backend      *be = &S->be;
    int r = cw->ratio, d = cw->d_out;
    float *kv = is_indexer ? ls->ikv : ls->ckv, *sc = is_indexer ? ls->isc : ls->csc;
    /* blocks completed by positions p0 .. p0 + n - 1: rows j0 .. j1 - 1 */
    int j0 = p0 / r, j1 = (p0 + n) / r, rows = j1 - j0;
    struct dsv4_spec_undo *u = S->seqs[seq].undo;
    if (u && il < c->n_layer) dsv4_spec_save_compressor(S, u, il, is_indexer, ls, d, a, g, n, p0);
    be->ops->compress(be, r, d, n, p0, a, g, cw->ape, kv, sc, S->crows);
    if (!rows) return;
    for (int j = 0; j < rows; j++) S->cpos[j] = (j0 + j) * r; /* each row's first position */
    be->ops->rmsnorm(be, rows, d, S->crows, d, cw->norm, c->norm_eps, S->crows, d);
    be->ops->rope(be, rows, 1, d, S->crows, S->cpos, dsv4_layer_rope(m, r), false);
    struct dsv4_kv_rows dst = is_indexer ? dsv4_kv_idx_rows(st, ls) : dsv4_kv_comp_rows(st, ls);
    if (is_indexer) {
        be->ops->hadamard(be, rows, d, S->crows);
        be->ops->fp4_sim(be, rows, d, d, S->crows, 32);
        be->ops->store_rows(be, DSV4_ROW_IDX_FP4, d, 0, rows, S->crows, d, &dst, j0, 0);
    } else {
        if (m->row_fmt == DSV4_ROW_FP8) be->ops->fp8_sim(be, rows, c->d_nope, d, S->crows, 64);
        be->ops->store_rows(be, m->row_fmt, d, c->d_rope, rows, S->crows, d, &dst, j0, 0);
    }
    for (int j = 0; j < rows; j++)
        dsv4_dump_dev(S, is_indexer ? "idx_keys" : "comp", il, seq, j0 + j, 1, d, S->crows + (size_t)j * (size_t)d);
}
