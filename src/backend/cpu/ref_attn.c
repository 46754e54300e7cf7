/*
 * ref_attn.c - scalar reference of the sink attention of one query and of the lightning
 * indexer's scores.
 *
 * Attention is computed exactly (two passes: scores and their maximum, then the weighted
 * sum), not with the block-wise running maximum of the demo's kernel, so the result does not
 * depend on how rows are grouped (model-v4.md §11.1). As in the kernel, probabilities are
 * rounded to bf16 for the P.V product while the denominator sums them unrounded; the sink is
 * one more logit with a zero value vector, used unscaled.
 */
#include <math.h>

#include "backend/cpu/ref.h"

void dsv4_ref_attention(struct dsv4_backend *be, int n_head, int d_head, int d_rope, const float *q,
                        const uint8_t *const *rows, int n_rows, enum dsv4_row_fmt fmt, const float *sink,
                        float scale, float *o)
{
    DSV4_ASSERT(n_rows >= 1);
    DSV4_ASSERT(be->scratch_len >= (size_t)n_head * (size_t)n_rows + (size_t)d_head);
    float *s   = be->scratch;                                  /* [n_head, n_rows] */
    float *kv  = be->scratch + (size_t)n_head * (size_t)n_rows; /* [d_head] */
    for (int t = 0; t < n_rows; t++) {
        dsv4_row_decode(fmt, d_head, d_rope, rows[t], kv);
        for (int h = 0; h < n_head; h++) {
            const float *qh  = q + (size_t)h * (size_t)d_head;
            float        acc = 0;
            for (int i = 0; i < d_head; i++) acc += qh[i] * kv[i];
            s[(size_t)h * (size_t)n_rows + (size_t)t] = acc * scale;
        }
    }
    float m[1024], den[1024];
    DSV4_ASSERT(n_head <= 1024);
    for (int h = 0; h < n_head; h++) {
        float *sh = s + (size_t)h * (size_t)n_rows, mx = sh[0], sum = 0;
        for (int t = 1; t < n_rows; t++) mx = fmaxf(mx, sh[t]);
        for (int t = 0; t < n_rows; t++) {
            float p = expf(sh[t] - mx);
            sum += p;
            sh[t] = dsv4_round_bf16(p);
        }
        m[h]   = mx;
        den[h] = sum + expf(sink[h] - mx);
        for (int i = 0; i < d_head; i++) o[(size_t)h * (size_t)d_head + (size_t)i] = 0;
    }
    for (int t = 0; t < n_rows; t++) {
        dsv4_row_decode(fmt, d_head, d_rope, rows[t], kv);
        for (int h = 0; h < n_head; h++) {
            float  p  = s[(size_t)h * (size_t)n_rows + (size_t)t];
            float *oh = o + (size_t)h * (size_t)d_head;
            for (int i = 0; i < d_head; i++) oh[i] += p * kv[i];
        }
    }
    for (int h = 0; h < n_head; h++)
        for (int i = 0; i < d_head; i++)
            o[(size_t)h * (size_t)d_head + (size_t)i] = dsv4_round_bf16(o[(size_t)h * (size_t)d_head + (size_t)i] / den[h]);
    (void)m;
}

void dsv4_ref_indexer_scores(struct dsv4_backend *be, int n_head, int d, const float *q, const float *w,
                             const uint8_t *keys, int n_keys, float *score)
{
    DSV4_ASSERT(be->scratch_len >= (size_t)d);
    float *k  = be->scratch;
    int    kb = dsv4_idx_key_bytes(d);
    for (int j = 0; j < n_keys; j++) {
        dsv4_idx_key_decode(d, keys + (size_t)j * (size_t)kb, k);
        float sum = 0;
        for (int h = 0; h < n_head; h++) {
            const float *qh  = q + (size_t)h * (size_t)d;
            float        dot = 0;
            for (int i = 0; i < d; i++) dot += qh[i] * k[i];
            dot = dsv4_round_bf16(dot);
            if (dot < 0) dot = 0;
            sum += dsv4_round_bf16(dot * w[h]);
        }
        score[j] = dsv4_round_bf16(sum);
    }
}
