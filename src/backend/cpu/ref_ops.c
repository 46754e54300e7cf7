/*
 * ref_ops.c - scalar reference of the element-wise and small ops: RMSNorm, per-head q RMS,
 * RoPE, Hadamard, and the hyper-connection pre / post / head collapse with Sinkhorn.
 *
 * Each follows the dtype boundaries of the demo (docs/MODEL.md) with double arithmetic in
 * between (ref_num.h). The per-head q RMS rounds to bf16 at every step, because the demo
 * applies it to a bf16 tensor (docs/MODEL.md §R11.5).
 */
#include <math.h>
#include <string.h>

#include "backend/cpu/ref.h"
#include "backend/cpu/ref_num.h"

void dsv4_ref_rmsnorm(struct dsv4_backend *be, int n, int d, const float *x, int ldx, const uint16_t *w, double eps,
                      float *y, int ldy)
{
    (void)be;
    for (int r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * (size_t)ldx;
        float       *yr = y + (size_t)r * (size_t)ldy;
        double       ss = 0;
        for (int i = 0; i < d; i++) ss += (double)xr[i] * xr[i];
        double inv = 1.0 / sqrt(rf32(ss / d) + eps);
        for (int i = 0; i < d; i++) yr[i] = rbf16((double)dsv4_f32_from_bf16(w[i]) * ((double)xr[i] * inv));
    }
}

void dsv4_ref_head_rms(struct dsv4_backend *be, int n, int n_head, int d_head, float *q, double eps)
{
    (void)be;
    for (int h = 0; h < n * n_head; h++) {
        float *v  = q + (size_t)h * (size_t)d_head;
        double ss = 0;
        for (int i = 0; i < d_head; i++) ss += rbf16((double)v[i] * v[i]);
        double m = rbf16(ss / d_head);
        double e = rbf16(m + eps);
        double r = rbf16(1.0 / sqrt(e));
        for (int i = 0; i < d_head; i++) v[i] = rbf16(v[i] * r);
    }
}

void dsv4_ref_rope(struct dsv4_backend *be, int n, int n_vec, int d_full, float *x, const int *pos,
                   const struct dsv4_rope_table *t, bool inverse)
{
    (void)be;
    int half = t->d_rope / 2;
    for (int r = 0; r < n; r++) {
        for (int i = 0; i < half; i++) {
            double ang = rf32((double)pos[r] * t->freq[i]);
            double c = rf32(cos(ang)), s = rf32(sin(ang));
            if (inverse) s = -s;
            for (int v = 0; v < n_vec; v++) {
                float *xr = x + ((size_t)r * (size_t)n_vec + (size_t)v) * (size_t)d_full + (size_t)(d_full - t->d_rope);
                double a = xr[2 * i], b = xr[2 * i + 1];
                xr[2 * i]     = rbf16(a * c - b * s);
                xr[2 * i + 1] = rbf16(a * s + b * c);
            }
        }
    }
}

void dsv4_ref_hadamard(struct dsv4_backend *be, int n, int d, float *x)
{
    (void)be;
    DSV4_ASSERT(d <= 4096);
    double v[4096], scale = 1.0 / sqrt((double)d);
    for (int r = 0; r < n; r++) {
        float *xr = x + (size_t)r * (size_t)d;
        for (int i = 0; i < d; i++) v[i] = xr[i];
        for (int len = 1; len < d; len *= 2)
            for (int i = 0; i < d; i += 2 * len)
                for (int j = i; j < i + len; j++) {
                    double a = v[j], b = v[j + len];
                    v[j]       = a + b;
                    v[j + len] = a - b;
                }
        for (int i = 0; i < d; i++) xr[i] = rbf16(v[i] * scale);
    }
}

static double sigmoid(double x)
{
    return 1.0 / (1.0 + exp(-x));
}

/* mix[m] = f32(f32(X_flat . fn[m]) * r), r = f32(1 / sqrt(f32(mean(X_flat^2)) + eps)). */
static void hc_mix(int hc, int d, const float *X, const float *fn, int n_mix, double norm_eps, double *mix)
{
    size_t n  = (size_t)hc * (size_t)d;
    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += (double)X[i] * X[i];
    double rs = rf32(1.0 / sqrt(rf32(ss / (double)n) + norm_eps));
    for (int m = 0; m < n_mix; m++) {
        const float *f   = fn + (size_t)m * n;
        double       acc = 0;
        for (size_t i = 0; i < n; i++) acc += (double)X[i] * f[i];
        mix[m] = rf32(rf32(acc) * rs);
    }
}

/* Sinkhorn on c[hc][hc] (row j = source stream, column k = destination), docs/MODEL.md §R3.2,
 * in double; the result is rounded to f32 by the caller. */
void dsv4_ref_sinkhorn(int hc, double *c, int iters, double eps)
{
    for (int j = 0; j < hc; j++) {
        double *row = c + j * hc, mx = row[0], sum = 0;
        for (int k = 1; k < hc; k++) mx = fmax(mx, row[k]);
        for (int k = 0; k < hc; k++) sum += (row[k] = exp(row[k] - mx));
        for (int k = 0; k < hc; k++) row[k] = row[k] / sum + eps;
    }
    for (int it = 0; it < iters; it++) {
        if (it > 0)
            for (int j = 0; j < hc; j++) {
                double sum = 0;
                for (int k = 0; k < hc; k++) sum += c[j * hc + k];
                for (int k = 0; k < hc; k++) c[j * hc + k] /= sum + eps;
            }
        for (int k = 0; k < hc; k++) {
            double sum = 0;
            for (int j = 0; j < hc; j++) sum += c[j * hc + k];
            for (int j = 0; j < hc; j++) c[j * hc + k] /= sum + eps;
        }
    }
}

/* u[i] = bf16(sum_j w_j X_j[i]), in double. */
static void hc_collapse(int hc, int d, const double *w, const float *Xr, float *ur)
{
    for (int i = 0; i < d; i++) {
        double acc = 0;
        for (int j = 0; j < hc; j++) acc += w[j] * Xr[(size_t)j * (size_t)d + (size_t)i];
        ur[i] = rbf16(acc);
    }
}

/* The collapse weights of row r: the lagged mix (which then takes the row's own pre) or pre. */
static void hc_take_lag(int hc, float *lag_r, double *pre, double *w)
{
    for (int j = 0; j < hc; j++) {
        w[j] = lag_r ? (double)lag_r[j] : pre[j];
        if (lag_r) lag_r[j] = (float)pre[j];
    }
}

void dsv4_ref_hc_pre(struct dsv4_backend *be, int n, int hc, int d, const float *X, const float *fn,
                     const float *scale, const float *base, int iters, double norm_eps, double hc_eps, float *lag,
                     float *u, float *post, float *comb)
{
    (void)be;
    double mix[(2 + DSV4_MAX_HC) * DSV4_MAX_HC], c[DSV4_MAX_HC * DSV4_MAX_HC], pre[DSV4_MAX_HC], w[DSV4_MAX_HC];
    int    n_mix = (2 + hc) * hc;
    for (int r = 0; r < n; r++) {
        const float *Xr    = X + (size_t)r * (size_t)hc * (size_t)d;
        float       *lag_r = lag ? lag + (size_t)r * (size_t)hc : NULL;
        if (!fn) { /* the final collapse of V4.1: the lagged mix alone */
            for (int j = 0; j < hc; j++) w[j] = lag_r[j];
            hc_collapse(hc, d, w, Xr, u + (size_t)r * (size_t)d);
            continue;
        }
        hc_mix(hc, d, Xr, fn, n_mix, norm_eps, mix);
        for (int j = 0; j < hc; j++) {
            pre[j]           = rf32(sigmoid(rf32(mix[j] * scale[0] + base[j])) + hc_eps);
            post[r * hc + j] = (float)(2.0 * sigmoid(rf32(mix[hc + j] * scale[1] + base[hc + j])));
        }
        for (int m = 0; m < hc * hc; m++) c[m] = rf32(mix[2 * hc + m] * scale[2] + base[2 * hc + m]);
        dsv4_ref_sinkhorn(hc, c, iters, hc_eps);
        for (int m = 0; m < hc * hc; m++) comb[(size_t)r * (size_t)(hc * hc) + (size_t)m] = (float)c[m];
        hc_take_lag(hc, lag_r, pre, w);
        hc_collapse(hc, d, w, Xr, u + (size_t)r * (size_t)d);
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
                double acc = 0;
                for (int j = 0; j < hc; j++) acc += (double)c[j * hc + k] * Xr[(size_t)j * (size_t)d + (size_t)i];
                Yr[(size_t)k * (size_t)d + (size_t)i] = rbf16((double)post[r * hc + k] * fr[i] + acc);
            }
    }
}

void dsv4_ref_hc_head(struct dsv4_backend *be, int n, int hc, int d, const float *X, const float *fn,
                      const float *scale, const float *base, double norm_eps, double hc_eps, float *y)
{
    (void)be;
    double mix[DSV4_MAX_HC], w[DSV4_MAX_HC];
    for (int r = 0; r < n; r++) {
        const float *Xr = X + (size_t)r * (size_t)hc * (size_t)d;
        hc_mix(hc, d, Xr, fn, hc, norm_eps, mix);
        for (int j = 0; j < hc; j++) w[j] = rf32(sigmoid(rf32(mix[j] * scale[0] + base[j])) + hc_eps);
        float *yr = y + (size_t)r * (size_t)d;
        for (int i = 0; i < d; i++) {
            double acc = 0;
            for (int j = 0; j < hc; j++) acc += w[j] * Xr[(size_t)j * (size_t)d + (size_t)i];
            yr[i] = rbf16(acc);
        }
    }
}
