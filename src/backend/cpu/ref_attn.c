/*
 * ref_attn.c - scalar reference of the sink attention of one query and of the lightning
 * indexer's scores.
 *
 * Attention is computed exactly (two passes: scores and their maximum, then the weighted
 * sum), not with the block-wise running maximum of the demo's kernel, so the result does not
 * depend on how rows are grouped (docs/MODEL.md §R11.1). As in the kernel, scores and the
 * exponentials are f32, probabilities are rounded to bf16 for the P.V product while the
 * denominator sums them unrounded; the sink is one more logit with a zero value vector, used
 * unscaled. Sums in double (ref_num.h).
 */
#include <math.h>

#include "backend/cpu/ops_data.h"
#include "backend/cpu/ref.h"
#include "backend/cpu/ref_num.h"

void dsv4_ref_attend_rows(struct dsv4_backend *be, int n_head, int d_head, int d_rope, const float *q,
                          const uint8_t *const *rows, int n_rows, enum dsv4_row_fmt fmt, const float *sink,
                        float scale, float *o)
{
    DSV4_ASSERT(n_rows >= 1 && n_head <= 1024 && d_head <= 4096);
    DSV4_ASSERT(be->scratch_len >= (size_t)n_head * (size_t)n_rows + (size_t)d_head);
    float *s  = be->scratch;                                   /* [n_head, n_rows] scores, then p */
    float *kv = be->scratch + (size_t)n_head * (size_t)n_rows; /* [d_head] */
    for (int t = 0; t < n_rows; t++) {
        dsv4_row_decode(fmt, d_head, d_rope, rows[t], kv);
        for (int h = 0; h < n_head; h++) {
            const float *qh  = q + (size_t)h * (size_t)d_head;
            double       acc = 0;
            for (int i = 0; i < d_head; i++) acc += (double)qh[i] * kv[i];
            s[(size_t)h * (size_t)n_rows + (size_t)t] = (float)(rf32(acc) * scale);
        }
    }
    double den[1024];
    for (int h = 0; h < n_head; h++) {
        float *sh = s + (size_t)h * (size_t)n_rows, mx = sh[0];
        double sum = 0;
        for (int t = 1; t < n_rows; t++) mx = fmaxf(mx, sh[t]);
        for (int t = 0; t < n_rows; t++) {
            float e = (float)exp((double)sh[t] - mx);
            sum += e;
            sh[t] = dsv4_round_bf16(e);
        }
        den[h] = rf32(sum) + rf32(exp((double)sink[h] - mx));
    }
    static const int CH = 256; /* output dims per pass, accumulated in double */
    double acc[256];
    for (int h = 0; h < n_head; h++) {
        const float *ph = s + (size_t)h * (size_t)n_rows;
        float       *oh = o + (size_t)h * (size_t)d_head;
        for (int c0 = 0; c0 < d_head; c0 += CH) {
            int c1 = c0 + CH < d_head ? c0 + CH : d_head;
            for (int i = c0; i < c1; i++) acc[i - c0] = 0;
            for (int t = 0; t < n_rows; t++) {
                if (ph[t] == 0) continue;
                dsv4_row_decode(fmt, d_head, d_rope, rows[t], kv);
                for (int i = c0; i < c1; i++) acc[i - c0] += (double)ph[t] * kv[i];
            }
            for (int i = c0; i < c1; i++) oh[i] = rbf16(rf32(acc[i - c0]) / den[h]);
        }
    }
}

void dsv4_ref_scores_rows(struct dsv4_backend *be, int n_head, int d, const float *q, const float *w,
                          const uint8_t *const *blocks, int block_keys, int n_keys, float *score)
{
    DSV4_ASSERT(be->scratch_len >= (size_t)d);
    float *k  = be->scratch;
    int    kb = dsv4_idx_key_bytes(d);
    for (int j = 0; j < n_keys; j++) {
        dsv4_idx_key_decode(d, blocks[j / block_keys] + (size_t)(j % block_keys) * (size_t)kb, k);
        double sum = 0;
        for (int h = 0; h < n_head; h++) {
            const float *qh  = q + (size_t)h * (size_t)d;
            double       dot = 0;
            for (int i = 0; i < d; i++) dot += (double)qh[i] * k[i];
            double sd = rbf16(dot);
            if (sd < 0) sd = 0;
            sum += rbf16(sd * w[h]);
        }
        score[j] = rbf16(sum);
    }
}

/* The table ops: the row lists of each query (ops_data.c), then the kernels above. */
void dsv4_ref_attention(struct dsv4_backend *be, const struct dsv4_step_desc *desc, int n_head, int d_head, int d_rope,
                        const float *q, const struct dsv4_attn_src *src, enum dsv4_row_fmt fmt, const float *sink,
                        float scale, float *o)
{
    dsv4_cpu_attention_with(dsv4_ref_attend_rows, be, desc, n_head, d_head, d_rope, q, src, fmt, sink, scale, o);
}

void dsv4_ref_indexer_scores(struct dsv4_backend *be, int n_head, int d, const float *q, const float *w,
                             const struct dsv4_kv_rows *keys, int n_keys, float *score)
{
    dsv4_cpu_indexer_scores_with(dsv4_ref_scores_rows, be, n_head, d, q, w, keys, n_keys, score);
}
