/*
 * ops_engram.c - the CPU's two DeepSeek-V4.1 Engram ops (backend.h, docs/ENGRAM.md "The ops"):
 * the row gather that decodes the FP8 table rows a position's n-gram hashes pick, and the
 * gate that adds the value into each hyper-connection stream by how well its key matches.
 *
 * Written once, for every level: the gather moves a few KB a token (12 KB for V4.1-Flash) out
 * of a table that stays on disk, and the gate is O(hc d) a row, next to the wkv projection's
 * O(cols d hc d) between them; neither is worth a kernel per level. Plain C, so the reference
 * and the fast table share these functions, and a row's result never depends on the batch.
 */
#include <math.h>
#include <string.h>

#include "backend/cpu/ops_data.h"

void dsv4_cpu_engram_rows(struct dsv4_backend *be, int n, int n_cols, const int64_t *ids, int ld_ids,
                          const uint8_t *table, const uint8_t *scale, int64_t n_rows, int d, float *out)
{
    (void)be;
    size_t D = (size_t)d, nb = D / 32;
    for (int r = 0; r < n; r++)
        for (int j = 0; j < n_cols; j++) {
            int64_t id = ids[(size_t)r * (size_t)ld_ids + (size_t)j];
            float  *o  = out + ((size_t)r * (size_t)n_cols + (size_t)j) * D;
            if (id < 0 || id >= n_rows) { /* outside the table: the official lookup reads zeros */
                memset(o, 0, sizeof(float) * D);
                continue;
            }
            const uint8_t *w = table + (size_t)id * D, *s = scale + (size_t)id * nb;
            for (size_t i = 0; i < D; i++)
                o[i] = dsv4_round_bf16(dsv4_f32_from_e4m3(w[i]) * dsv4_f32_from_e8m0(s[i / 32]));
        }
}

/* mean(x^2) over d values, the sum in double, rounded to f32 as torch's f32 mean. */
static float mean_square(const float *x, size_t d)
{
    double s = 0;
    for (size_t i = 0; i < d; i++) s += (double)x[i] * x[i];
    return (float)(s / (double)d);
}

/* rsqrt(mean(x^2) + eps) as the official f32 tensors give it: the mean and the sum rounded. */
static float rstd_of(const float *x, size_t d, double eps)
{
    return (float)(1.0 / sqrt((double)(float)((double)mean_square(x, d) + eps)));
}

/* The gate of one stream: sigmoid of the signed sqrt of its normalised dot, every step at the
 * official f32 boundaries (Engram.forward): the dot's sum rounded, times the f32 rstd product,
 * times the f32 constant d^-0.5; the clamp at f32(1e-6) and the square root in f32. */
float dsv4_cpu_engram_gate_of(const float *h, const float *k, const float *w, size_t d, double eps)
{
    float  rstd = rstd_of(h, d, eps) * rstd_of(k, d, eps);
    float  dsc  = (float)pow((double)d, -0.5);
    double s    = 0;
    for (size_t i = 0; i < d; i++) s += (double)h[i] * w[i] * k[i];
    float dot = (float)((double)(float)((double)(float)s * rstd) * dsc);
    float m   = fabsf(dot) < 1e-6f ? 1e-6f : fabsf(dot);
    float sg  = copysignf((float)sqrt((double)m), dot);
    return (float)(1.0 / (1.0 + exp(-(double)sg)));
}

void dsv4_cpu_engram_gate(struct dsv4_backend *be, int n, int hc, int d, const float *kv, const float *w, double eps,
                          float *X)
{
    (void)be;
    size_t D = (size_t)d, H = (size_t)hc;
    for (int r = 0; r < n; r++) {
        const float *key = kv + (size_t)r * (H + 1) * D, *value = key + H * D;
        for (size_t c = 0; c < H; c++) {
            float *h = X + ((size_t)r * H + c) * D;
            float  g = dsv4_cpu_engram_gate_of(h, key + c * D, w + c * D, D, eps);
            for (size_t i = 0; i < D; i++) h[i] = dsv4_round_bf16((float)((double)h[i] + (double)g * value[i]));
        }
    }
}
