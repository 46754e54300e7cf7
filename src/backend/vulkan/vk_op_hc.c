/*
 * vk_op_hc.c - the Vulkan backend's hyper-connection ops (docs/MODEL.md §R3.2): hc_pre (the
 * mixing weights, Sinkhorn and the collapse in one dispatch), hc_post, hc_head
 * (shaders/hc_*.comp). The weights fn, scale and base are tables the engine uploads.
 */
#include "backend/vulkan/vk.h"

/* The bindings hc_pre and hc_head share: X, fn (n_mix rows of hc d), scale (3), base
 * (n_mix); their element indices in i[0..3]. False (and a fault) when one fails or hc is
 * more than the shaders hold. */
static bool hc_weights_args(struct dsv4_vk *v, int n, int hc, int d, int n_mix, const float *X, const float *fn,
                            const float *scale, const float *base, struct vk_bind *b, uint32_t *i)
{
    if (hc > DSV4_MAX_HC) {
        dsv4_vk_fault(v, "a hyper-connection op over %d streams: more than %d", hc, DSV4_MAX_HC);
        return false;
    }
    uint64_t hd = (uint64_t)hc * (uint64_t)d, xn = (uint64_t)n * hd, fnn = (uint64_t)n_mix * hd;
    int64_t  a[4] = { dsv4_vk_arg(v, X, 4, xn * 4, &b[0]), dsv4_vk_arg(v, fn, 4, fnn * 4, &b[1]),
                      dsv4_vk_arg(v, scale, 4, 3 * 4, &b[2]), dsv4_vk_arg(v, base, 4, (size_t)n_mix * 4, &b[3]) };
    for (int k = 0; k < 4; k++) {
        if (a[k] < 0) return false;
        i[k] = (uint32_t)a[k];
    }
    return dsv4_vk_fits_u32(v, xn + i[0], "hc") && dsv4_vk_fits_u32(v, fnn + i[1], "hc");
}

struct hc_pre_pc {
    double   norm_eps, hc_eps;
    uint32_t x0, fn0, s0, b0, u0, p0, c0, n, hc, d, iters, l0, mode;
};

/* V4.1's final collapse (fn NULL): only X, u and lag are read; the unread bindings of the
 * weights and of post / comb are given X's and u's buffers. */
static bool hc_collapse_args(struct dsv4_vk *v, int n, int hc, int d, const float *X, float *u, struct vk_bind *b,
                             struct hc_pre_pc *pc)
{
    if (hc > DSV4_MAX_HC) {
        dsv4_vk_fault(v, "a hyper-connection op over %d streams: more than %d", hc, DSV4_MAX_HC);
        return false;
    }
    int64_t x0 = dsv4_vk_arg(v, X, 4, (size_t)n * (size_t)hc * (size_t)d * 4, &b[0]);
    int64_t u0 = dsv4_vk_arg(v, u, 4, (size_t)n * (size_t)d * 4, &b[4]);
    b[1] = b[2] = b[3] = b[0];
    b[5] = b[6] = b[4];
    pc->x0 = (uint32_t)x0, pc->u0 = (uint32_t)u0, pc->mode = 2;
    return x0 >= 0 && u0 >= 0;
}

/* The mix's bindings (X, fn, scale, base, u, post, comb) into b[0..6] and their indices. */
static bool hc_mix_args(struct dsv4_vk *v, int n, int hc, int d, const float *X, const float *fn, const float *scale,
                        const float *base, float *u, float *post, float *comb, struct vk_bind *b, struct hc_pre_pc *pc)
{
    uint32_t i[4];
    if (!hc_weights_args(v, n, hc, d, (2 + hc) * hc, X, fn, scale, base, b, i)) return false;
    int64_t u0 = dsv4_vk_arg(v, u, 4, (size_t)n * (size_t)d * 4, &b[4]);
    int64_t p0 = dsv4_vk_arg(v, post, 4, (size_t)n * (size_t)hc * 4, &b[5]);
    int64_t c0 = dsv4_vk_arg(v, comb, 4, (size_t)n * (size_t)(hc * hc) * 4, &b[6]);
    pc->x0 = i[0], pc->fn0 = i[1], pc->s0 = i[2], pc->b0 = i[3];
    pc->u0 = (uint32_t)u0, pc->p0 = (uint32_t)p0, pc->c0 = (uint32_t)c0;
    return u0 >= 0 && p0 >= 0 && c0 >= 0;
}

void dsv4_vk_hc_pre(struct dsv4_backend *be, int n, int hc, int d, const float *X, const float *fn, const float *scale,
                    const float *base, int iters, double norm_eps, double hc_eps, float *lag, float *u, float *post,
                    float *comb)
{
    struct dsv4_vk *v = be->impl;
    if (n <= 0 || hc <= 0 || d <= 0) return;
    pthread_mutex_lock(&v->mu);
    struct vk_bind   b[8] = { { 0 } };
    struct hc_pre_pc pc   = { norm_eps, hc_eps, 0, 0, 0, 0, 0, 0, 0, (uint32_t)n, (uint32_t)hc, (uint32_t)d,
                              (uint32_t)(iters > 0 ? iters : 0), 0, lag ? 1u : 0u };
    bool ok = fn ? hc_mix_args(v, n, hc, d, X, fn, scale, base, u, post, comb, b, &pc)
                 : hc_collapse_args(v, n, hc, d, X, u, b, &pc);
    int64_t l0 = 0;
    if (ok && lag) l0 = dsv4_vk_arg(v, lag, 4, (size_t)n * (size_t)hc * 4, &b[7]);
    else b[7] = b[4]; /* unread without lag */
    if (ok && l0 >= 0 && dsv4_vk_fits_u32(v, (uint64_t)n * (uint64_t)d + pc.u0, "hc_pre")) {
        pc.l0 = (uint32_t)l0;
        dsv4_vk_dispatch(v, "hc_pre", b, 8, &pc, sizeof(pc), dsv4_vk_groups((uint64_t)n, 1), 1, 1);
    }
    pthread_mutex_unlock(&v->mu);
}

void dsv4_vk_hc_head(struct dsv4_backend *be, int n, int hc, int d, const float *X, const float *fn,
                     const float *scale, const float *base, double norm_eps, double hc_eps, float *y)
{
    struct dsv4_vk *v = be->impl;
    if (n <= 0 || hc <= 0 || d <= 0) return;
    pthread_mutex_lock(&v->mu);
    struct vk_bind b[5] = { { 0 } };
    uint32_t       i[4];
    if (hc_weights_args(v, n, hc, d, hc, X, fn, scale, base, b, i)) {
        int64_t y0 = dsv4_vk_arg(v, y, 4, (size_t)n * (size_t)d * 4, &b[4]);
        if (y0 >= 0 && dsv4_vk_fits_u32(v, (uint64_t)n * (uint64_t)d + (uint64_t)y0, "hc_head")) {
            struct { double norm_eps, hc_eps; uint32_t x0, fn0, s0, b0, y0, n, hc, d; } pc = {
                norm_eps, hc_eps, i[0], i[1], i[2], i[3], (uint32_t)y0, (uint32_t)n, (uint32_t)hc, (uint32_t)d
            };
            dsv4_vk_dispatch(v, "hc_head", b, 5, &pc, sizeof(pc), dsv4_vk_groups((uint64_t)n, 1), 1, 1);
        }
    }
    pthread_mutex_unlock(&v->mu);
}

void dsv4_vk_hc_post(struct dsv4_backend *be, int n, int hc, int d, const float *f, const float *Xres,
                     const float *post, const float *comb, float *Xout)
{
    struct dsv4_vk *v     = be->impl;
    uint64_t        total = (uint64_t)n * (uint64_t)hc * (uint64_t)d;
    if (!total) return;
    pthread_mutex_lock(&v->mu);
    struct vk_bind b[5] = { { 0 } };
    int64_t        a[5] = { dsv4_vk_arg(v, f, 4, (size_t)n * (size_t)d * 4, &b[0]), dsv4_vk_arg(v, Xres, 4, total * 4, &b[1]),
                            dsv4_vk_arg(v, post, 4, (size_t)n * (size_t)hc * 4, &b[2]),
                            dsv4_vk_arg(v, comb, 4, (size_t)n * (size_t)(hc * hc) * 4, &b[3]),
                            dsv4_vk_arg(v, Xout, 4, total * 4, &b[4]) };
    bool           ok   = dsv4_vk_fits_u32(v, total + (uint64_t)(a[1] > a[4] ? a[1] : a[4]), "hc_post");
    for (int k = 0; k < 5; k++) ok = ok && a[k] >= 0;
    if (ok) {
        uint32_t pc[8] = { (uint32_t)a[0], (uint32_t)a[1], (uint32_t)a[2], (uint32_t)a[3], (uint32_t)a[4],
                           (uint32_t)n,    (uint32_t)hc,   (uint32_t)d };
        dsv4_vk_dispatch(v, "hc_post", b, 5, pc, sizeof(pc), dsv4_vk_groups(total, 256), 1, 1);
    }
    pthread_mutex_unlock(&v->mu);
}
