/*
 * ref.h - the scalar reference implementation of every backend op (ref_*.c). These read like
 * the paper and define the numerics; optimised kernels are tested against them. The op table
 * dsv4_cpu_ref_ops (ref_table.c) points at them.
 */
#ifndef DSV4_CPU_REF_H
#define DSV4_CPU_REF_H

#include "backend/backend.h"

void dsv4_ref_linear(struct dsv4_backend *be, const struct dsv4_linear *w, int n_tok, const float *x, int ldx,
                     float *y, int ldy, enum dsv4_act act, enum dsv4_out out);
void dsv4_ref_rmsnorm(struct dsv4_backend *be, int n, int d, const float *x, int ldx, const uint16_t *w, double eps,
                      float *y, int ldy);
void dsv4_ref_head_rms(struct dsv4_backend *be, int n, int n_head, int d_head, float *q, double eps);
void dsv4_ref_rope(struct dsv4_backend *be, int n, int n_vec, int d_full, float *x, const int *pos,
                   const struct dsv4_rope_table *t, bool inverse);
/* Sinkhorn on c[hc][hc] in double (docs/MODEL.md §R3.2); shared by the reference and fast hc_pre. */
void dsv4_ref_sinkhorn(int hc, double *c, int iters, double eps);
void dsv4_ref_fp8_sim(struct dsv4_backend *be, int n, int d, int ld, float *x, int block);
void dsv4_ref_fp4_sim(struct dsv4_backend *be, int n, int d, int ld, float *x, int block, bool e4m3_scale);
void dsv4_ref_hadamard(struct dsv4_backend *be, int n, int d, float *x);
void dsv4_ref_hc_pre(struct dsv4_backend *be, int n, int hc, int d, const float *X, const float *fn,
                     const float *scale, const float *base, int iters, double norm_eps, double hc_eps, float *lag,
                     float *u,
                     float *post, float *comb);
void dsv4_ref_hc_post(struct dsv4_backend *be, int n, int hc, int d, const float *f, const float *Xres,
                      const float *post, const float *comb, float *Xout);
void dsv4_ref_hc_head(struct dsv4_backend *be, int n, int hc, int d, const float *X, const float *fn,
                      const float *scale, const float *base, double norm_eps, double hc_eps, float *y);
/* Row-pointer kernels (one query; keys in blocks) and the table ops built on them. */
void dsv4_ref_attend_rows(struct dsv4_backend *be, int n_head, int d_head, int d_rope, const float *q,
                          const uint8_t *const *rows, int n_rows, enum dsv4_row_fmt fmt, const float *sink,
                          float scale, float *o);
void dsv4_ref_scores_rows(struct dsv4_backend *be, int n_head, int d, const float *q, const float *w,
                          const uint8_t *const *blocks, int block_keys, int n_keys, float *score);
void dsv4_ref_attention(struct dsv4_backend *be, const struct dsv4_step_desc *desc, int n_head, int d_head, int d_rope,
                        const float *q, const struct dsv4_attn_src *src, enum dsv4_row_fmt fmt, const float *sink,
                        float scale, float *o);
void dsv4_ref_indexer_scores(struct dsv4_backend *be, int n_head, int d, const float *q, const float *w,
                             const struct dsv4_kv_rows *keys, int n_keys, float *score);
void dsv4_ref_router(struct dsv4_backend *be, int n, const float *x, const struct dsv4_linear *gate,
                     const float *bias, const int64_t *tid2eid, const int *tokens, int n_exp, int n_used,
                     double route_scale, double gate_temp, int *ids, float *weights, float *scratch);
void dsv4_ref_expert(struct dsv4_backend *be, const struct dsv4_expert_w *e, int n, const float *x, int ldx,
                     const float *row_w, double limit, float *y, float *scratch);

void dsv4_ref_experts(struct dsv4_backend *be, const struct dsv4_expert_w *experts, int n_exp, int n_pairs,
                      const int *grp, const float *x, const float *row_w, double limit, float *y, float *scratch);

#endif
