/*
 * ops_data.h - the CPU's data-movement and bookkeeping ops (ops_data.c): embedding gather,
 * MoE dispatch and combine, the compressor's frontier loop, row stores into KV pages, the
 * indexer's top-k and the attention row lists. Plain C, shared by the reference and the
 * fast op tables: they move bytes and compare numbers, their cost is memory traffic, and a
 * row's result is the same whatever else is in the step. The fast table runs the arithmetic
 * of embed, scale, add_streams and moe_combine on the level's kernels where it has them
 * (ops_fast.c; the same expressions, so the same bits).
 */
#ifndef DSV4_CPU_OPS_DATA_H
#define DSV4_CPU_OPS_DATA_H

#include "backend/backend.h"

void dsv4_cpu_embed(struct dsv4_backend *be, int n, const int *tok, const uint16_t *table, int d, int copies,
                    float *X);
void dsv4_cpu_scale(struct dsv4_backend *be, size_t n, float *x, double s);
void dsv4_cpu_add_streams(struct dsv4_backend *be, int n, int hc, int d, const float *e, float *X);
/* The Engram ops (ops_engram.c): one plain-C implementation for every level. */
void dsv4_cpu_engram_rows(struct dsv4_backend *be, int n, int n_cols, const int64_t *ids, int ld_ids,
                          const uint8_t *table, const uint8_t *scale, int64_t n_rows, int d, float *out);
void dsv4_cpu_engram_gate(struct dsv4_backend *be, int n, int hc, int d, const float *kv, const float *w, double eps,
                          float *X);
/* One stream's gate (engram_gate's g), for the tests that hold it to the official f32 steps. */
float dsv4_cpu_engram_gate_of(const float *h, const float *k, const float *w, size_t d, double eps);
void dsv4_cpu_moe_dispatch(struct dsv4_backend *be, int n, int k, int n_exp, const int *ids, const float *w,
                           const float *x, int d, float *xe, float *row_w, int *pair_of, int *grp);
void dsv4_cpu_moe_combine(struct dsv4_backend *be, int n, int k, int d, const int *pair_of, const float *ye,
                          const float *shared, float *f);
void dsv4_cpu_step_begin(struct dsv4_backend *be, const struct dsv4_step_desc *desc);
void dsv4_cpu_compress(struct dsv4_backend *be, const struct dsv4_step_desc *desc, int ratio, bool overlap, int d,
                       const float *a, const float *g, const float *ape, size_t kv_off, size_t sc_off, float *out);
void dsv4_cpu_store_rows(struct dsv4_backend *be, const struct dsv4_step_desc *desc, enum dsv4_row_fmt fmt, int d,
                         int d_rope, const float *x, int ldx, const struct dsv4_store_dst *dst);
void dsv4_cpu_indexer_topk(struct dsv4_backend *be, const struct dsv4_step_desc *desc, int ratio, int n_head, int d,
                           const float *q, const float *w, size_t keys_off, int key_bytes, int topk, int *sel,
                           int *n_sel, const struct dsv4_idx_cand *cand);
/* The k best of n scores (higher first, ties to the lower id), ids ascending, into sel. */
void dsv4_cpu_top_k(const float *sc, int n, int k, int *sel);
/* V4.1's candidate blocks (ops_cand.c; backend.h struct dsv4_idx_cand) of one row over its
 * n_done key scores: the source's pick into blocks[n_keep], and a later indexer's top-k among
 * the keys of those blocks (returns its count). be's scratch holds the work. */
void dsv4_cpu_cand_pick(struct dsv4_backend *be, const float *score, int n_done, int block, int n_keep, int *blocks);
int  dsv4_cpu_cand_top_k(struct dsv4_backend *be, const float *score, int n_done, int block, int n_keep,
                         const int *blocks, int topk, int *sel);

/* A combine row's pairs (its k entries of pair_of) in ascending order, the order the experts
 * ran in and the order moe_combine sums them in. */
void dsv4_cpu_moe_pairs(int k, const int *pair_of, int *p);

/* The cached rows one sequence's chunk of queries attends to (positions p0, p0 + 1, ..):
 * struct dsv4_attn_src resolved for that sequence (its ring, its staging rows, its
 * compressed rows and its slice of the selection). */
struct dsv4_cpu_attn_seq {
    int                 p0, window, ratio;
    int                 block_n; /* a draft block's rows (struct dsv4_attn_src .block), else 0 */
    struct dsv4_kv_rows ring, chunk, comp;
    const int          *sel, *n_sel;
    int                 sel_stride;
};

/* The rows query t of a sequence's chunk reads, as row addresses in order; returns their
 * count. */
int dsv4_cpu_attn_rows(const struct dsv4_cpu_attn_seq *src, int t, const uint8_t **rows);

/* The row-pointer form of the attention and indexer kernels that the table ops wrap. */
typedef void (*dsv4_cpu_attend_fn)(struct dsv4_backend *be, int n_head, int d_head, int d_rope, const float *q,
                                   const uint8_t *const *rows, int n_rows, enum dsv4_row_fmt fmt, const float *sink,
                                   float scale, float *o);
typedef void (*dsv4_cpu_scores_fn)(struct dsv4_backend *be, int n_head, int d, const float *q, const float *w,
                                   const uint8_t *const *blocks, int block_keys, int n_keys, float *score);

/* The table ops on top of those kernels: row lists (and key block lists) are built at the
 * start of the context's scratch, and the kernel gets the rest of it. */
void dsv4_cpu_attention_with(dsv4_cpu_attend_fn fn, struct dsv4_backend *be, const struct dsv4_step_desc *desc,
                             int n_head, int d_head, int d_rope, const float *q, const struct dsv4_attn_src *src,
                             enum dsv4_row_fmt fmt, const float *sink, float scale, float *o);
void dsv4_cpu_indexer_scores_with(dsv4_cpu_scores_fn fn, struct dsv4_backend *be, int n_head, int d, const float *q,
                                  const float *w, const struct dsv4_kv_rows *keys, int n_keys, float *score);

/* Scratch floats the wrappers above take in front of the kernels' own, for a plan. */
size_t dsv4_cpu_data_scratch_floats(const struct dsv4_plan_dims *dims);

#endif
