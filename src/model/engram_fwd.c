/*
 * engram_fwd.c - DeepSeek-V4.1's Engram in the forward (docs/ENGRAM.md, docs/MODEL.md §6):
 * once per step the row ids of every row (each sequence's tokens through the token map and
 * the n-gram hashing, continuing the history its slot keeps), then on each Engram layer,
 * before the block, the table rows (FP8, dequantised to bf16), wkv to one key per stream and
 * a value, and the gated add into the streams.
 */
#include <string.h>

#include "model/runtime.h"

int dsv4_engram_check(const struct dsv4_model *m, const struct dsv4_fwd_seq *seqs, int n_seqs, struct dsv4_err *err)
{
    const struct dsv4_v41_model *v = m->v41;
    if (!v || !v->n_engram) return DSV4_OK;
    for (int s = 0; s < n_seqs; s++)
        for (int t = 0; t < seqs[s].n; t++)
            if (seqs[s].tokens[t] >= v->map_n)
                return dsv4_err_set(err, DSV4_ERANGE, "token id %d is not in engram_token_map.json (%lld tokens)",
                                    seqs[s].tokens[t], (long long)v->map_n);
    return DSV4_OK;
}

void dsv4_engram_hash_step(const struct dsv4_model *m, struct dsv4_step *S)
{
    const struct dsv4_v41_model *v = m->v41;
    if (!v || !v->n_engram) return;
    size_t ld = (size_t)v->n_engram * (size_t)v->hash.n_cols;
    for (int s = 0; s < S->n_seqs; s++) {
        struct dsv4_fwd_seq    *q    = &S->seqs[s];
        struct dsv4_engram_seq *hist = (struct dsv4_engram_seq *)(void *)q->st->engram;
        int                     r0   = S->seq_row0[s];
        if (q->st->pos == 0) dsv4_engram_seq_reset(hist);
        for (int t = 0; t < q->n; t++) S->ecomp[r0 + t] = v->map[q->tokens[t]];
        if (q->undo) { /* a verify chunk: what the rollback needs to keep a prefix (spec.c) */
            q->undo->engram_saved = true;
            q->undo->engram_hist  = *hist;
            memcpy(q->undo->engram_ids, S->ecomp + r0, sizeof(int32_t) * (size_t)q->n);
        }
        struct dsv4_err err;
        int rc = dsv4_engram_chunk(&v->hash, hist, S->ecomp + r0, q->n, S->eids + (size_t)r0 * ld, &err);
        DSV4_ASSERT(rc == DSV4_OK); /* the map's ids are below compressed_vocab (engram_map.c) */
    }
}

void dsv4_engram_layer(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_layer_w *L, int R,
                       float *X)
{
    const struct dsv4_config    *c  = &m->cfg;
    const struct dsv4_v41_model *v  = m->v41;
    const struct dsv4_engram_w  *ew = &L->engram;
    struct dsv4_backend         *be = &S->be;
    int e = v->engram_of[L->il], cols = v->hash.n_cols, ed = c->v41.engram_d_head, d = c->d_model;
    int ld = v->n_engram * cols;
    enum dsv4_act act = c->fp8 ? DSV4_ACT_FP8 : DSV4_ACT_NONE;
    be->ops->engram_rows(be, R, cols, S->eids + (size_t)e * (size_t)cols, ld, ew->table, ew->scale, ew->rows, ed,
                         S->erows);
    be->ops->linear(be, &ew->wkv, R, S->erows, cols * ed, S->ekv, (c->hc + 1) * d, act, DSV4_OUT_BF16);
    be->ops->engram_gate(be, R, c->hc, d, S->ekv, v->engram_w[e], c->norm_eps, X);
}
