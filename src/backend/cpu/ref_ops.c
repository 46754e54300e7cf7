/*
 * ref_ops.c - scalar reference of the element-wise and small ops: RMSNorm, per-head q RMS,
 * RoPE, Hadamard, and the hyper-connection pre / post / head collapse with Sinkhorn.
 *
 * Each follows the dtype boundaries of the demo (docs/MODEL.md): f32 inside, bf16 out where
 * the demo's tensor is bf16. The per-head q RMS is the exception that computes in bf16 at
 * every step, because the demo applies it to a bf16 tensor (model-v4.md §11.5).
 */
#include <math.h>
#include <string.h>

#include "backend/cpu/ref.h"

void dsv4_ref_rmsnorm(struct dsv4_backend *be, int n, int d, const float *x, int ldx, const uint16_t *w, float eps,
                      float *y, int ldy)
{
    (void)be;
    for (int r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * (size_t)ldx;
        float       *yr = y + (size_t)r * (size_t)ldy;
        float        ss = 0;
        for (int i = 0; i < d; i++) ss += xr[i] * xr[i];
        float inv = 1.0f / sqrtf(ss / (float)d + eps);
        for (int i = 0; i < d; i++) yr[i] = dsv4_round_bf16(dsv4_f32_from_bf16(w[i]) * (xr[i] * inv));
    }
}

void dsv4_ref_head_rms(struct dsv4_backend *be, int n, int n_head, int d_head, float *q, float eps)
{
    (void)be;
    for (int h = 0; h < n * n_head; h++) {
        float *v  = q + (size_t)h * (size_t)d_head;
        float  ss = 0;
        for (int i = 0; i < d_head; i++) ss += dsv4_round_bf16(v[i] * v[i]);
        float m = dsv4_round_bf16(ss / (float)d_head);
        float e = dsv4_round_bf16(m + eps);
        float r = dsv4_round_bf16(1.0f / sqrtf(e));
        for (int i = 0; i < d_head; i++) v[i] = dsv4_round_bf16(v[i] * r);
    }
}

void dsv4_ref_rope(struct dsv4_backend *be, int n, int n_vec, int d_full, float *x, const int *pos,
                   const struct dsv4_rope_table *t, bool inverse)
{
    (void)be;
    int half = t->d_rope / 2;
    for (int r = 0; r < n; r++) {
        float p = (float)pos[r];
        for (int v = 0; v < n_vec; v++) {
            float *xr = x + ((size_t)r * (size_t)n_vec + (size_t)v) * (size_t)d_full + (size_t)(d_full - t->d_rope);
            for (int i = 0; i < half; i++) {
                float ang = p * t->freq[i];
                float c = cosf(ang), s = sinf(ang);
                if (inverse) s = -s;
                float a = xr[2 * i], b = xr[2 * i + 1];
                xr[2 * i]     = dsv4_round_bf16(a * c - b * s);
                xr[2 * i + 1] = dsv4_round_bf16(a * s + b * c);
            }
        }
    }
}

void dsv4_ref_hadamard(struct dsv4_backend *be, int n, int d, float *x)
{
    (void)be;
    float scale = 1.0f / sqrtf((float)d);
    for (int r = 0; r < n; r++) {
        float *v = x + (size_t)r * (size_t)d;
        for (int len = 1; len < d; len *= 2)
            for (int i = 0; i < d; i += 2 * len)
                for (int j = i; j < i + len; j++) {
                    float a = v[j], b = v[j + len];
                    v[j]       = a + b;
                    v[j + len] = a - b;
                }
        for (int i = 0; i < d; i++) v[i] = dsv4_round_bf16(v[i] * scale);
    }
}

static float sigmoidf(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

/* mix[m] = (X_flat . fn[m]) / rms(X_flat), m < n_mix. */
static void hc_mix(int hc, int d, const float *X, const float *fn, int n_mix, float norm_eps, float *mix)
{
    size_t n  = (size_t)hc * (size_t)d;
    float  ss = 0;
    for (size_t i = 0; i < n; i++) ss += X[i] * X[i];
    float rs = 1.0f / sqrtf(ss / (float)n + norm_eps);
    for (int m = 0; m < n_mix; m++) {
        const float *f   = fn + (size_t)m * n;
        float        acc = 0;
        for (size_t i = 0; i < n; i++) acc += X[i] * f[i];
        mix[m] = acc * rs;
    }
}

/* Sinkhorn on c[hc][hc] (row j = source stream, column k = destination), model-v4.md §3.2. */
static void sinkhorn(int hc, float *c, int iters, float eps)
{
    for (int j = 0; j < hc; j++) {
        float *row = c + j * hc, mx = row[0], sum = 0;
        for (int k = 1; k < hc; k++) mx = fmaxf(mx, row[k]);
        for (int k = 0; k < hc; k++) sum += (row[k] = expf(row[k] - mx));
        for (int k = 0; k < hc; k++) row[k] = row[k] / sum + eps;
    }
    for (int it = 0; it < iters; it++) {
        if (it > 0)
            for (int j = 0; j < hc; j++) {
                float sum = 0;
                for (int k = 0; k < hc; k++) sum += c[j * hc + k];
                for (int k = 0; k < hc; k++) c[j * hc + k] /= sum + eps;
            }
        for (int k = 0; k < hc; k++) {
            float sum = 0;
            for (int j = 0; j < hc; j++) sum += c[j * hc + k];
            for (int j = 0; j < hc; j++) c[j * hc + k] /= sum + eps;
        }
    }
}

void dsv4_ref_hc_pre(struct dsv4_backend *be, int n, int hc, int d, const float *X, const float *fn,
                     const float *scale, const float *base, int iters, float norm_eps, float hc_eps, float *u,
                     float *post, float *comb)
{
    (void)be;
    float mix[(2 + DSV4_MAX_HC) * DSV4_MAX_HC];
    int   n_mix = (2 + hc) * hc;
    for (int r = 0; r < n; r++) {
        const float *Xr = X + (size_t)r * (size_t)hc * (size_t)d;
        hc_mix(hc, d, Xr, fn, n_mix, norm_eps, mix);
        float pre[DSV4_MAX_HC];
        for (int j = 0; j < hc; j++) {
            pre[j]             = sigmoidf(mix[j] * scale[0] + base[j]) + hc_eps;
            post[r * hc + j]   = 2.0f * sigmoidf(mix[hc + j] * scale[1] + base[hc + j]);
        }
        float *c = comb + (size_t)r * (size_t)(hc * hc);
        for (int m = 0; m < hc * hc; m++) c[m] = mix[2 * hc + m] * scale[2] + base[2 * hc + m];
        sinkhorn(hc, c, iters, hc_eps);
        float *ur = u + (size_t)r * (size_t)d;
        for (int i = 0; i < d; i++) {
            float acc = 0;
            for (int j = 0; j < hc; j++) acc += pre[j] * Xr[(size_t)j * (size_t)d + (size_t)i];
            ur[i] = dsv4_round_bf16(acc);
        }
    }
}

void dsv4_ref_hc_post(struct dsv4_backend *be, int n, int hc, int d, const float *f, const float *Xres,
                      const float *post, const float *comb, float *Xout)
{
    (void)be;
    for (int r = 0; r < n; r++) {
        const float *fr = f + (size_t)r * (size_t)d;
        const float *Xr = Xres + (size_t)r * (size_t)hc * (size_t)d;
        const float *c  = comb + (size_t)r * (size_t)(hc * hc);
        float       *Yr = Xout + (size_t)r * (size_t)hc * (size_t)d;
        for (int k = 0; k < hc; k++)
            for (int i = 0; i < d; i++) {
                float acc = 0;
                for (int j = 0; j < hc; j++) acc += c[j * hc + k] * Xr[(size_t)j * (size_t)d + (size_t)i];
                Yr[(size_t)k * (size_t)d + (size_t)i] = dsv4_round_bf16(post[r * hc + k] * fr[i] + acc);
            }
    }
}

void dsv4_ref_hc_head(struct dsv4_backend *be, int n, int hc, int d, const float *X, const float *fn,
                      const float *scale, const float *base, float norm_eps, float hc_eps, float *y)
{
    (void)be;
    float mix[DSV4_MAX_HC];
    for (int r = 0; r < n; r++) {
        const float *Xr = X + (size_t)r * (size_t)hc * (size_t)d;
        hc_mix(hc, d, Xr, fn, hc, norm_eps, mix);
        float w[DSV4_MAX_HC];
        for (int j = 0; j < hc; j++) w[j] = sigmoidf(mix[j] * scale[0] + base[j]) + hc_eps;
        float *yr = y + (size_t)r * (size_t)d;
        for (int i = 0; i < d; i++) {
            float acc = 0;
            for (int j = 0; j < hc; j++) acc += w[j] * Xr[(size_t)j * (size_t)d + (size_t)i];
            yr[i] = dsv4_round_bf16(acc);
        }
    }
}
