/*
 * vk_op_rows2.c - the Vulkan backend's in-place per-row ops of attention's inputs: head_rms,
 * rope, fp8_sim / fp4_sim (one shader, act_sim), hadamard (shaders/NAME.comp). As
 * vk_op_rows.c: addresses resolved to bindings (dsv4_vk_arg), element indices and scalars as
 * push constants, one dispatch each.
 */
#include "backend/vulkan/vk.h"

void dsv4_vk_head_rms(struct dsv4_backend *be, int n, int n_head, int d_head, float *q, double eps)
{
    struct dsv4_vk *v     = be->impl;
    uint64_t        heads = (uint64_t)n * (uint64_t)n_head, total = heads * (uint64_t)d_head;
    if (!total) return;
    pthread_mutex_lock(&v->mu);
    struct vk_bind b = { 0 };
    int64_t        q0 = dsv4_vk_arg(v, q, 4, total * 4, &b);
    if (q0 >= 0 && dsv4_vk_fits_u32(v, total + (uint64_t)q0, "head_rms")) {
        struct { double eps; uint32_t q0, heads, d; } pc = { eps, (uint32_t)q0, (uint32_t)heads, (uint32_t)d_head };
        dsv4_vk_dispatch(v, "head_rms", &b, 1, &pc, sizeof(pc), dsv4_vk_groups(heads, 1), 1, 1);
    }
    pthread_mutex_unlock(&v->mu);
}

/* Positions are host metadata in the engine (or backend memory from a test): dsv4_vk_in; the
 * frequencies are a table the engine uploads. */
void dsv4_vk_rope(struct dsv4_backend *be, int n, int n_vec, int d_full, float *x, const int *pos,
                  const struct dsv4_rope_table *t, bool inverse)
{
    struct dsv4_vk *v     = be->impl;
    int             half  = t->d_rope / 2;
    uint64_t        total = (uint64_t)n * (uint64_t)n_vec * (uint64_t)d_full;
    if (!total || half <= 0) return;
    pthread_mutex_lock(&v->mu);
    struct vk_bind b[3] = { { 0 } };
    dsv4_vk_meta_room(v, (size_t)n * sizeof(int));
    int64_t x0 = dsv4_vk_arg(v, x, 4, total * 4, &b[2]), f0 = dsv4_vk_arg(v, t->freq, 4, (size_t)half * 4, &b[1]);
    int64_t p0 = x0 >= 0 && f0 >= 0 ? dsv4_vk_in(v, pos, 4, (size_t)n * sizeof(int), &b[0]) : -1;
    if (p0 >= 0 && dsv4_vk_fits_u32(v, total + (uint64_t)x0, "rope")) {
        uint32_t pc[8] = { (uint32_t)p0, (uint32_t)f0,     (uint32_t)x0,     (uint32_t)n,
                           (uint32_t)n_vec, (uint32_t)d_full, (uint32_t)t->d_rope, inverse };
        dsv4_vk_dispatch(v, "rope", b, 3, pc, sizeof(pc), dsv4_vk_groups((uint64_t)n * (uint64_t)half, 64), 1, 1);
    }
    pthread_mutex_unlock(&v->mu);
}

/* fp8_sim and fp4_sim: the format's qmax and amax floor (backend.h) select the rounding. */
static void act_sim(struct dsv4_backend *be, int n, int d, int ld, float *x, int block, bool fp8, bool e4m3_scale)
{
    struct dsv4_vk *v = be->impl;
    if (n <= 0 || d <= 0 || block <= 0) return;
    pthread_mutex_lock(&v->mu);
    struct vk_bind b     = { 0 };
    size_t         bytes = ((size_t)(n - 1) * (size_t)ld + (size_t)d) * 4;
    int64_t        x0    = dsv4_vk_arg(v, x, 4, bytes, &b);
    if (x0 >= 0 && dsv4_vk_fits_u32(v, bytes / 4 + (uint64_t)x0, fp8 ? "fp8_sim" : "fp4_sim")) {
        float qmax = fp8 ? 448.0f : 6.0f;
        struct { uint32_t x0, n, d, ld, block, fp8, e4m3_scale; float inv_qmax, floor_; } pc = {
            (uint32_t)x0, (uint32_t)n, (uint32_t)d, (uint32_t)ld, (uint32_t)block, fp8, e4m3_scale, 1.0f / qmax,
            fp8 ? 1e-4f : e4m3_scale ? 6.0f * 0x1p-9f : 6.0f * 0x1p-126f
        };
        uint64_t blocks = (uint64_t)n * (uint64_t)(d / block);
        dsv4_vk_dispatch(v, "act_sim", &b, 1, &pc, sizeof(pc), dsv4_vk_groups(blocks, 64), 1, 1);
    }
    pthread_mutex_unlock(&v->mu);
}

void dsv4_vk_fp8_sim(struct dsv4_backend *be, int n, int d, int ld, float *x, int block)
{
    act_sim(be, n, d, ld, x, block, true, false);
}

void dsv4_vk_fp4_sim(struct dsv4_backend *be, int n, int d, int ld, float *x, int block, bool e4m3_scale)
{
    act_sim(be, n, d, ld, x, block, false, e4m3_scale);
}

/* The shader holds a row in shared memory: d <= 4096, as the reference. */
void dsv4_vk_hadamard(struct dsv4_backend *be, int n, int d, float *x)
{
    struct dsv4_vk *v     = be->impl;
    uint64_t        total = (uint64_t)n * (uint64_t)d;
    if (!total) return;
    pthread_mutex_lock(&v->mu);
    struct vk_bind b  = { 0 };
    int64_t        x0 = dsv4_vk_arg(v, x, 4, total * 4, &b);
    if (d > 4096 || (d & (d - 1))) dsv4_vk_fault(v, "hadamard over d %d: not a power of two up to 4096", d);
    else if (x0 >= 0 && dsv4_vk_fits_u32(v, total + (uint64_t)x0, "hadamard")) {
        uint32_t pc[3] = { (uint32_t)x0, (uint32_t)n, (uint32_t)d };
        dsv4_vk_dispatch(v, "hadamard", &b, 1, pc, sizeof(pc), dsv4_vk_groups((uint64_t)n, 1), 1, 1);
    }
    pthread_mutex_unlock(&v->mu);
}
