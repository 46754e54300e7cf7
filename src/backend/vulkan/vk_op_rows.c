/*
 * vk_op_rows.c - the Vulkan backend's element-wise and per-row ops: scale, add_streams,
 * embed, rmsnorm (shaders/NAME.comp). Each resolves its addresses (dsv4_vk_arg), passes the
 * element indices and scalars as push constants and records one dispatch.
 */
#include <string.h>

#include "backend/vulkan/vk.h"

void dsv4_vk_scale(struct dsv4_backend *be, size_t n, float *x, double s)
{
    struct dsv4_vk *v = be->impl;
    if (!n) return;
    pthread_mutex_lock(&v->mu);
    struct vk_bind b = { 0 };
    int64_t        x0 = dsv4_vk_arg(v, x, 4, n * 4, &b);
    if (x0 >= 0 && dsv4_vk_fits_u32(v, n, "scale")) {
        struct { double s; uint32_t x0, n; } pc = { s, (uint32_t)x0, (uint32_t)n };
        dsv4_vk_dispatch(v, "scale", &b, 1, &pc, sizeof(pc), dsv4_vk_groups(n, 256), 1, 1);
    }
    pthread_mutex_unlock(&v->mu);
}

void dsv4_vk_add_streams(struct dsv4_backend *be, int n, int hc, int d, const float *e, float *X)
{
    struct dsv4_vk *v     = be->impl;
    uint64_t        total = (uint64_t)n * (uint64_t)hc * (uint64_t)d;
    if (!total) return;
    pthread_mutex_lock(&v->mu);
    struct vk_bind b[2] = { { 0 } };
    int64_t        e0 = dsv4_vk_arg(v, e, 4, (size_t)n * (size_t)d * 4, &b[0]), x0 = dsv4_vk_arg(v, X, 4, total * 4, &b[1]);
    if (e0 >= 0 && x0 >= 0 && dsv4_vk_fits_u32(v, total, "add_streams")) {
        uint32_t pc[5] = { (uint32_t)e0, (uint32_t)x0, (uint32_t)n, (uint32_t)hc, (uint32_t)d };
        dsv4_vk_dispatch(v, "add_streams", b, 2, pc, sizeof(pc), dsv4_vk_groups(total, 256), 1, 1);
    }
    pthread_mutex_unlock(&v->mu);
}

/* Token ids are host metadata (or, from a test, backend memory): dsv4_vk_in. */
void dsv4_vk_embed(struct dsv4_backend *be, int n, const int *tok, const uint16_t *table, int d, int copies, float *X)
{
    struct dsv4_vk *v     = be->impl;
    uint64_t        total = (uint64_t)n * (uint64_t)copies * (uint64_t)d;
    if (!total) return;
    pthread_mutex_lock(&v->mu);
    struct vk_bind b[3] = { { 0 } };
    dsv4_vk_meta_room(v, (size_t)n * sizeof(int));
    int64_t x0 = dsv4_vk_arg(v, X, 4, total * 4, &b[2]);
    /* the table is read where the rows are; its extent is not known here: only its start is checked */
    int64_t t0 = dsv4_vk_arg(v, table, 2, 2, &b[1]);
    int64_t k0 = x0 >= 0 && t0 >= 0 ? dsv4_vk_in(v, tok, 4, (size_t)n * sizeof(int), &b[0]) : -1;
    if (k0 >= 0 && dsv4_vk_fits_u32(v, total, "embed")) {
        uint32_t pc[6] = { (uint32_t)k0, (uint32_t)t0, (uint32_t)x0, (uint32_t)n, (uint32_t)d, (uint32_t)copies };
        dsv4_vk_dispatch(v, "embed", b, 3, pc, sizeof(pc), dsv4_vk_groups(total, 256), 1, 1);
    }
    pthread_mutex_unlock(&v->mu);
}

void dsv4_vk_rmsnorm(struct dsv4_backend *be, int n, int d, const float *x, int ldx, const uint16_t *w, double eps,
                       float *y, int ldy)
{
    struct dsv4_vk *v = be->impl;
    if (n <= 0 || d <= 0) return;
    pthread_mutex_lock(&v->mu);
    struct vk_bind b[3] = { { 0 } };
    size_t         xb = ((size_t)(n - 1) * (size_t)ldx + (size_t)d) * 4, yb = ((size_t)(n - 1) * (size_t)ldy + (size_t)d) * 4;
    int64_t        x0 = dsv4_vk_arg(v, x, 4, xb, &b[0]), w0 = dsv4_vk_arg(v, w, 2, (size_t)d * 2, &b[1]), y0 = dsv4_vk_arg(v, y, 4, yb, &b[2]);
    if (x0 >= 0 && w0 >= 0 && y0 >= 0 && dsv4_vk_fits_u32(v, xb / 4 + (uint64_t)x0, "rmsnorm") &&
        dsv4_vk_fits_u32(v, yb / 4 + (uint64_t)y0, "rmsnorm")) {
        struct { double eps; uint32_t x0, w0, y0, n, d, ldx, ldy; } pc = {
            eps, (uint32_t)x0, (uint32_t)w0, (uint32_t)y0, (uint32_t)n, (uint32_t)d, (uint32_t)ldx, (uint32_t)ldy
        };
        dsv4_vk_dispatch(v, "rmsnorm", b, 3, &pc, sizeof(pc), dsv4_vk_groups((uint64_t)n, 1), 1, 1);
    }
    pthread_mutex_unlock(&v->mu);
}

