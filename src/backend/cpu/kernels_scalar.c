/*
 * kernels_scalar.c - the portable kernels (plain C, f32 accumulation): the fallback level
 * of the fast backend on CPUs without AVX2, and the shape every ISA file follows.
 */
#include <string.h>

#include "backend/cpu/cpu.h"

static float e4m3_tab[256], e2m1_tab[16], e8m0_tab[256];

static void tables(void)
{
    static int done;
    if (__atomic_load_n(&done, __ATOMIC_ACQUIRE)) return;
    for (int i = 0; i < 256; i++) {
        e4m3_tab[i] = dsv4_f32_from_e4m3((uint8_t)i);
        e8m0_tab[i] = dsv4_f32_from_e8m0((uint8_t)i);
    }
    for (int i = 0; i < 16; i++) e2m1_tab[i] = dsv4_f32_from_e2m1((uint8_t)i);
    __atomic_store_n(&done, 1, __ATOMIC_RELEASE);
}

static float wscale(const struct dsv4_linear *w, size_t idx)
{
    if (w->scale_f32) {
        float s;
        memcpy(&s, (const uint8_t *)w->scale + idx * 4, 4);
        return s;
    }
    return e8m0_tab[((const uint8_t *)w->scale)[idx]];
}

static void dot_fp8(const struct dsv4_linear *w, int o0, int o1, int nt, const float *x, int ldx, float *y, int ldy,
                   int gmin)
{
    (void)gmin; /* one path at every token count */
    tables();
    int B = w->block;
    for (int o = o0; o < o1; o++) {
        int            ow = o + w->row_off;
        const uint8_t *wr = (const uint8_t *)w->w + (size_t)ow * (size_t)w->n_in;
        for (int t = 0; t < nt; t++) {
            const float *xt  = x + (size_t)t * (size_t)ldx;
            float        acc = 0;
            for (int b = 0; b < w->n_in; b += B) {
                int   e    = b + B < w->n_in ? b + B : w->n_in;
                float part = 0;
                for (int k = b; k < e; k++) part += e4m3_tab[wr[k]] * xt[k];
                acc += part * wscale(w, dsv4_fp8_scale_index(w, ow, b));
            }
            y[(size_t)t * (size_t)ldy + (size_t)o] = acc;
        }
    }
}

static void dot_fp4(const struct dsv4_linear *w, int o0, int o1, int nt, const float *x, int ldx, float *y, int ldy,
                   int gmin)
{
    (void)gmin; /* one path at every token count */
    tables();
    for (int o = o0; o < o1; o++) {
        int            ow = o + w->row_off;
        const uint8_t *wr = (const uint8_t *)w->w + (size_t)ow * (size_t)(w->n_in / 2);
        for (int t = 0; t < nt; t++) {
            const float *xt  = x + (size_t)t * (size_t)ldx;
            float        acc = 0;
            for (int b = 0; b < w->n_in; b += 32) {
                float part = 0;
                for (int k = b; k < b + 32; k += 2) {
                    uint8_t byte = wr[k / 2];
                    part += e2m1_tab[byte & 15] * xt[k] + e2m1_tab[byte >> 4] * xt[k + 1];
                }
                acc += part * wscale(w, (size_t)ow * (size_t)(w->n_in / 32) + (size_t)(b / 32));
            }
            y[(size_t)t * (size_t)ldy + (size_t)o] = acc;
        }
    }
}

static void dot_bf16(const struct dsv4_linear *w, int o0, int o1, int nt, const float *x, int ldx, float *y, int ldy,
                    int gmin)
{
    (void)gmin; /* one path at every token count */
    for (int o = o0; o < o1; o++) {
        const uint16_t *wr = (const uint16_t *)w->w + (size_t)(o + w->row_off) * (size_t)w->n_in;
        for (int t = 0; t < nt; t++) {
            const float *xt  = x + (size_t)t * (size_t)ldx;
            float        acc = 0;
            for (int k = 0; k < w->n_in; k++) acc += dsv4_f32_from_bf16(wr[k]) * xt[k];
            y[(size_t)t * (size_t)ldy + (size_t)o] = acc;
        }
    }
}

static void dot_f32(const struct dsv4_linear *w, int o0, int o1, int nt, const float *x, int ldx, float *y, int ldy,
                   int gmin)
{
    (void)gmin; /* one path at every token count */
    for (int o = o0; o < o1; o++) {
        const float *wr = (const float *)w->w + (size_t)(o + w->row_off) * (size_t)w->n_in;
        for (int t = 0; t < nt; t++) {
            const float *xt  = x + (size_t)t * (size_t)ldx;
            float        acc = 0;
            for (int k = 0; k < w->n_in; k++) acc += wr[k] * xt[k];
            y[(size_t)t * (size_t)ldy + (size_t)o] = acc;
        }
    }
}

static float vdot(const float *a, const float *b, int n)
{
    float acc = 0;
    for (int i = 0; i < n; i++) acc += a[i] * b[i];
    return acc;
}

static void axpy(float *y, float a, const float *x, int n)
{
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

/* 12 chains of a multiply and an add (C11 contracts nothing into FMAs here). */
static double peak(long n)
{
    float a[12];
    for (int i = 0; i < 12; i++) a[i] = (float)i;
    for (long j = 0; j < n; j++)
        for (int i = 0; i < 12; i++) a[i] = a[i] * 0.999f + 1e-3f;
    volatile float sink = 0;
    for (int i = 0; i < 12; i++) sink += a[i];
    return 24.0 * (double)n;
}

const struct dsv4_kernels dsv4_kernels_scalar = {
    .name     = "scalar",
    .dot_fp8  = dot_fp8,
    .dot_fp4  = dot_fp4,
    .dot_bf16 = dot_bf16,
    .dot_f32  = dot_f32,
    .vdot     = vdot,
    .axpy     = axpy,
    .peak     = peak,
};
