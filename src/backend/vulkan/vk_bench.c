/*
 * vk_bench.c - the machine figures `dsv4 bench` asks a backend for (backend.h,
 * read_bandwidth and peaks), measured on the Vulkan device: the read bandwidth of device
 * memory by a compute shader (shaders/read_bw.comp) and the f32 FMA peak
 * (shaders/peak_fma.comp). Timed on the host around a submission that holds only the probe
 * (submit and wait), best of reps: the submission's fixed cost is in the figure, which is why
 * the probes are large (bench reads 1 GiB; the FMA loop grows until it runs 50 ms).
 */
#include <time.h>

#include "backend/vulkan/vk.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Seconds of one submission with one dispatch of shader (push constants pc), or -1. */
static double timed_dispatch(struct dsv4_vk *v, const char *shader, const void *pc, uint32_t pc_bytes, uint32_t groups)
{
    dsv4_vk_finish(v); /* nothing else in the timed submission */
    double t0 = now_s();
    if (!dsv4_vk_dispatch(v, shader, NULL, 0, pc, pc_bytes, groups, 1, 1)) return -1;
    dsv4_vk_finish(v);
    return v->fault[0] ? -1 : now_s() - t0;
}

double dsv4_vk_read_bandwidth(void *impl, const void *buf, size_t bytes, int reps)
{
    struct dsv4_vk *v = impl;
    pthread_mutex_lock(&v->mu);
    VkDeviceAddress a    = dsv4_vk_addr(v, buf, bytes);
    double          best = 0;
    struct { uint64_t buf, n_words; uint32_t key; } pc = { a, bytes / 16, 0x9e3779b9u };
    for (int r = 0; a && r < reps; r++) {
        double s = timed_dispatch(v, "read_bw", &pc, sizeof(pc), 4096);
        if (s > 0 && (double)(pc.n_words * 16) / s / 1e9 > best) best = (double)(pc.n_words * 16) / s / 1e9;
    }
    pthread_mutex_unlock(&v->mu);
    return best;
}

void dsv4_vk_peaks(void *impl, double *f32, double *bf16)
{
    struct dsv4_vk *v = impl;
    *f32 = *bf16 = 0;
    pthread_mutex_lock(&v->mu);
    void *out = NULL;
    pthread_mutex_unlock(&v->mu);
    out = dsv4_vk_alloc(v, 4096 * 4, DSV4_MEM_ACT);
    if (!out) return;
    pthread_mutex_lock(&v->mu);
    VkDeviceAddress a = dsv4_vk_addr(v, out, 4096 * 4);
    /* groups x 256 invocations x 8 chains x iters FMAs, 2 flops each; iters doubled until a
     * run takes 50 ms (a GPU does 10^10 in that time, lavapipe 10^8), then best of 3 */
    uint32_t groups = 1024;
    struct { uint64_t out; uint32_t iters; float a, b; } pc = { a, 16, 0.999f, 1e-3f };
    double s = 0;
    while (a && pc.iters < (1u << 20) && (s = timed_dispatch(v, "peak_fma", &pc, sizeof(pc), groups)) >= 0 && s < 0.05)
        pc.iters *= 2;
    for (int r = 0; a && s > 0 && r < 3; r++) {
        s        = timed_dispatch(v, "peak_fma", &pc, sizeof(pc), groups);
        double g = (double)groups * 256 * 8 * pc.iters * 2 / s / 1e9;
        if (s > 0 && g > *f32) *f32 = g;
    }
    pthread_mutex_unlock(&v->mu);
    dsv4_vk_free(v, out, 4096 * 4);
}
