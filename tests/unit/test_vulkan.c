/*
 * test_vulkan.c - the Vulkan backend as far as it goes (issue 37, docs/BACKENDS.md "The
 * Vulkan backend"): a device is found (lavapipe in CI), its memory half moves bytes exactly
 * at odd sizes and offsets, an address it hands out faults when the host reads it, the ops
 * it has pass the op checker against the scalar reference, and an engine refuses to open on
 * it while ops are missing, naming them. Skipped, with the fix, where the build has no
 * Vulkan or the machine no Vulkan device.
 */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/op_check.h"
#include "dsv4.h"
#include "support/gen.h"
#include "test.h"
#include "test_cases.h"
#include "test_fault.h"


/* The kind and a created backend on its default device, or NULL after a skip. */
static const struct dsv4_backend_kind *open_vk(struct test_ctx *t, void **impl)
{
    const struct dsv4_backend_kind *k = dsv4_backend_find("vulkan");
    if (!test_need_backend(t, "vulkan")) return NULL;
    struct dsv4_backend_params p = { .opts = NULL, .n_threads = 1 };
    struct dsv4_err            err;
    if (k->create(impl, &p, &err)) {
        CHECKF(0, "vulkan started once and not again: %s", err.msg);
        return NULL;
    }
    return k;
}

static void test_device_found(struct test_ctx *t)
{
    void                           *impl = NULL;
    const struct dsv4_backend_kind *k = open_vk(t, &impl);
    if (!k) return;
    char line[256], devs[2048];
    k->describe(impl, line, sizeof(line));
    CHECKF(!strncmp(line, "vulkan device ", 14), "describe: %s", line);
    CHECK(k->devices != NULL && !k->host_visible);
    k->devices(impl, devs, sizeof(devs));
    CHECKF(strchr(devs, '*') && strstr(devs, "maxStorageBufferRange") && strstr(devs, "subgroup"), "devices: %s", devs);
    size_t avail = 0, total = 0;
    CHECK(k->memory(impl, &avail, &total) == DSV4_OK && total > 0 && avail <= total);
    struct dsv4_backend_settings s;
    k->settings(impl, &s);
    CHECK(!strcmp(s.level, "") && k->level == NULL);
    k->destroy(impl);
    /* options: a device past the list, a level (it has none) and an unknown key are refused */
    const char     *bad[] = { "device=15", "level=avx2", "colour=blue", "device=x" };
    struct dsv4_err err;
    for (int i = 0; i < 4; i++) {
        struct dsv4_backend_params p = { .opts = bad[i], .n_threads = 1 };
        void                      *x = NULL;
        int                        rc = k->create(&x, &p, &err);
        CHECKF(rc != DSV4_OK && strstr(err.msg, "vulkan"), "'%s' accepted (%s)", bad[i], rc ? err.msg : "");
        if (!rc) k->destroy(x);
    }
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)((i * 131u + seed * 7u + (i >> 9)) & 0xffu);
}

/* Zero-filled blocks; upload, download and copy at odd offsets and sizes, one larger than
 * the staging buffer (8 MiB: several chunks); free gives the memory back. */
static void test_memory_round_trip(struct test_ctx *t)
{
    void                           *impl = NULL;
    const struct dsv4_backend_kind *k = open_vk(t, &impl);
    if (!k) return;
    const size_t sizes[3] = { 1, 4097, ((size_t)9 << 20) + 3 };
    uint8_t     *blk[3];
    size_t       avail0 = 0, avail1 = 0, total;
    k->memory(impl, &avail0, &total);
    for (int i = 0; i < 3; i++) {
        blk[i] = k->alloc(impl, sizes[i], DSV4_MEM_ACT);
        CHECKF(blk[i] && ((uintptr_t)blk[i] & 63) == 0, "alloc of %zu bytes", sizes[i]);
        if (!blk[i]) goto out;
    }
    size_t   big = sizes[2];
    uint8_t *host = malloc(big), *back = malloc(big);
    k->download(impl, back, blk[1], sizes[1]);
    k->sync(impl);
    size_t nz = 0;
    for (size_t i = 0; i < sizes[1]; i++) nz += back[i] != 0;
    CHECKF(nz == 0, "a new block is not zero-filled (%zu bytes)", nz);
    fill(host, big, 1);
    k->upload(impl, blk[0], host, 1);
    k->upload(impl, blk[1] + 3, host + 5, 4000);
    k->upload(impl, blk[2], host, big);
    memset(back, 0xee, big);
    k->download(impl, back, blk[1] + 3, 4000);
    k->sync(impl);
    CHECK(!memcmp(back, host + 5, 4000));
    k->download(impl, back, blk[1], 3);
    CHECK(back[0] == 0 && back[1] == 0 && back[2] == 0); /* before the upload's range: untouched */
    k->download(impl, back, blk[2], big);
    CHECKF(!memcmp(back, host, big), "a %zu-byte upload did not come back", big);
    k->copy(impl, blk[2] + 17, blk[1] + 5, 777);
    k->download(impl, back, blk[2] + 16, 779);
    CHECK(back[0] == host[16] && !memcmp(back + 1, host + 7, 777) && back[778] == host[17 + 777]);
    k->download(impl, back, blk[0], 1);
    CHECK(back[0] == host[0]);
    free(host);
    free(back);
out:
    for (int i = 0; i < 3; i++)
        if (blk[i]) k->free(impl, blk[i], sizes[i]);
    k->memory(impl, &avail1, &total);
    CHECKF(avail1 == avail0, "memory not given back: %zu then %zu", avail0, avail1);
    k->destroy(impl);
}

/* An address alloc hands out is not host memory: a host read or write faults. */
static void test_host_access_faults(struct test_ctx *t)
{
    void                           *impl = NULL;
    const struct dsv4_backend_kind *k = open_vk(t, &impl);
    if (!k) return;
    float *buf = k->alloc(impl, 4096, DSV4_MEM_ACT);
    CHECK(buf != NULL);
    if (buf) {
        int rd = test_touch_in_child(buf + 7, 4096, false), wr = test_touch_in_child(buf, 4096, true);
        CHECKF(test_faulted(rd), "a host read of a vulkan buffer did not fault (child %d)", rd);
        CHECKF(test_faulted(wr), "a host write of a vulkan buffer did not fault (child %d)", wr);
        k->free(impl, buf, 4096);
    }
    k->destroy(impl);
}

/* The ops the backend has pass the op checker bit for bit on this device (hc_pre, hc_post and
 * hc_head too, though their check has a tolerance); one it lacks (linear) is reported missing. */
static void test_ops_pass_checker(struct test_ctx *t)
{
    void                           *impl = NULL;
    const struct dsv4_backend_kind *k = open_vk(t, &impl);
    if (!k) return;
    k->destroy(impl);
    const enum dsv4_op have[] = { DSV4_OP_SCALE,   DSV4_OP_ADD_STREAMS, DSV4_OP_EMBED,   DSV4_OP_RMSNORM,
                                  DSV4_OP_HEAD_RMS, DSV4_OP_ROPE,       DSV4_OP_FP8_SIM, DSV4_OP_FP4_SIM,
                                  DSV4_OP_HADAMARD, DSV4_OP_HC_PRE,     DSV4_OP_HC_POST, DSV4_OP_HC_HEAD,
                                  DSV4_OP_LINEAR };
    static struct dsv4_check_report r; /* large */
    for (size_t i = 0; i < sizeof(have) / sizeof(have[0]); i++) {
        enum dsv4_op           op = have[i];
        struct dsv4_check_opts o  = { .backend = "vulkan", .op = (int)op };
        struct dsv4_err        err;
        CHECKF(dsv4_op_check(&o, &r, &err) == DSV4_OK, "%s: %s", dsv4_op_name(op), err.msg);
        const struct dsv4_check_cell *c = &r.cell[op][0];
        if (op == DSV4_OP_LINEAR) {
            CHECKF(c->status == DSV4_CHECK_MISSING, "linear: status %d, not missing", (int)c->status);
            continue;
        }
        CHECKF(c->status == DSV4_CHECK_OK && c->runs > 0 && dsv4_op_check_failures(&r) == 0, "%s: %s",
               dsv4_op_name(op), c->why);
        CHECKF(c->differ == 0, "%s: %zu values not bit-identical to the reference", dsv4_op_name(op), c->differ);
    }
}

/* Uploads n floats of a fixed pseudo-random sequence (values in [-1, 1)) into a new block. */
static float *upload_floats(const struct dsv4_backend_kind *k, void *impl, size_t n, unsigned seed)
{
    float   *host = malloc(n * sizeof(float)), *dev = k->alloc(impl, n * sizeof(float), DSV4_MEM_ACT);
    uint32_t x    = seed * 2654435761u + 1u;
    for (size_t i = 0; i < n; i++) {
        x       = x * 1664525u + 1013904223u;
        host[i] = (float)((double)(x >> 8) / (double)(1u << 23) - 1.0);
    }
    if (dev) k->upload(impl, dev, host, n * sizeof(float));
    free(host);
    return dev;
}

/* Whether n floats at a and b (backend memory) are bit-identical. */
static bool same_floats(const struct dsv4_backend_kind *k, void *impl, const float *a, const float *b, size_t n)
{
    float *ha = malloc(n * sizeof(float)), *hb = malloc(n * sizeof(float));
    k->download(impl, ha, a, n * sizeof(float));
    k->download(impl, hb, b, n * sizeof(float));
    k->sync(impl);
    bool same = !memcmp(ha, hb, n * sizeof(float));
    free(ha);
    free(hb);
    return same;
}

/* hc_pre and hc_head reduce a row in a tree: a row's outputs are the same bits alone as
 * inside a batch (the tree is the row's, not the call's). */
static void test_hc_row_alone_as_in_batch(struct test_ctx *t)
{
    void                           *impl = NULL;
    const struct dsv4_backend_kind *k = open_vk(t, &impl);
    if (!k) return;
    enum { N = 5, HC = 4, D = 300, MIX = (2 + HC) * HC, R = 3 };
    struct dsv4_backend be = { k->ops(impl), impl, NULL, 0, NULL };
    float *X = upload_floats(k, impl, (size_t)N * HC * D, 1), *fn = upload_floats(k, impl, (size_t)MIX * HC * D, 2);
    float *sc = upload_floats(k, impl, 3, 3), *base = upload_floats(k, impl, MIX, 4);
    float *u = upload_floats(k, impl, (size_t)N * D, 5), *u1 = upload_floats(k, impl, D, 6);
    float *post = upload_floats(k, impl, N * HC, 7), *post1 = upload_floats(k, impl, HC, 8);
    float *comb = upload_floats(k, impl, N * HC * HC, 9), *comb1 = upload_floats(k, impl, HC * HC, 10);
    CHECK(X && fn && sc && base && u && u1 && post && post1 && comb && comb1);
    if (X && fn && sc && base && u && u1 && post && post1 && comb && comb1) {
        const float *Xr = X + (size_t)R * HC * D;
        be.ops->hc_pre(&be, N, HC, D, X, fn, sc, base, 20, 1e-6, 1e-6, u, post, comb);
        be.ops->hc_pre(&be, 1, HC, D, Xr, fn, sc, base, 20, 1e-6, 1e-6, u1, post1, comb1);
        CHECK(same_floats(k, impl, u + (size_t)R * D, u1, D));
        CHECK(same_floats(k, impl, post + R * HC, post1, HC));
        CHECK(same_floats(k, impl, comb + R * HC * HC, comb1, HC * HC));
        be.ops->hc_head(&be, N, HC, D, X, fn, sc, base, 1e-6, 1e-6, u);
        be.ops->hc_head(&be, 1, HC, D, Xr, fn, sc, base, 1e-6, 1e-6, u1);
        CHECK(same_floats(k, impl, u + (size_t)R * D, u1, D));
    }
    k->destroy(impl); /* frees the blocks */
}

/* ---- the whole-step ops (vk_op_step.c, vk_op_kv.c, vk_op_attn.c, vk_op_idx.c) */

/* Each passes the op checker bit for bit. */
static void test_step_ops_pass_checker(struct test_ctx *t)
{
    void                           *impl = NULL;
    const struct dsv4_backend_kind *k = open_vk(t, &impl);
    if (!k) return;
    k->destroy(impl);
    const enum dsv4_op ops[] = { DSV4_OP_STEP_BEGIN, DSV4_OP_STORE_ROWS, DSV4_OP_COMPRESS, DSV4_OP_ATTENTION,
                                 DSV4_OP_INDEXER_SCORES, DSV4_OP_INDEXER_TOPK };
    static struct dsv4_check_report r; /* large */
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        struct dsv4_check_opts o = { .backend = "vulkan", .op = (int)ops[i] };
        struct dsv4_err        err;
        CHECKF(dsv4_op_check(&o, &r, &err) == DSV4_OK, "%s: %s", dsv4_op_name(ops[i]), err.msg);
        const struct dsv4_check_cell *c = &r.cell[ops[i]][0];
        CHECKF(c->status == DSV4_CHECK_OK && c->runs > 0 && dsv4_op_check_failures(&r) == 0 && c->differ == 0,
               "%s: %s (%zu values not bit-identical)", dsv4_op_name(ops[i]), c->why, c->differ);
    }
}

/* Ring stores of step a (3 sequences) then step b (1), twice, recorded into one command
 * buffer with no download between: each step's store sees its own descriptor (step_begin's
 * upload is recorded in order), the second time without the descriptor's buffer growing. */
static void test_two_steps_one_command_buffer(struct test_ctx *t)
{
    void                           *impl = NULL;
    const struct dsv4_backend_kind *k = open_vk(t, &impl);
    if (!k) return;
    struct dsv4_backend be = { .ops = k->ops(impl), .impl = impl };
    enum { D = 64, RB = 2 * D, RING = 4, SLOT = 64 + RING * RB };
    static float x[2][8 * D];
    static uint8_t got[4 * SLOT], want[4 * SLOT];
    for (int i = 0; i < 8 * D; i++) x[0][i] = dsv4_round_bf16((float)i * 0.25f), x[1][i] = -x[0][i];
    uint8_t *slots = k->alloc(impl, 4 * SLOT, DSV4_MEM_KV);
    float   *dx    = k->alloc(impl, sizeof(x), DSV4_MEM_ACT);
    CHECK(slots && dx);
    if (!slots || !dx) goto out;
    k->upload(impl, dx, x, sizeof(x));
    int pos[8] = { 0 }, tok[8] = { 0 };
    struct dsv4_step_seq sa[3], sb = { 0, 3, 2, slots + 3 * SLOT, NULL, NULL };
    for (int s = 0; s < 3; s++) sa[s] = (struct dsv4_step_seq){ 2 * s, 2, 5 + 4 * s, slots + s * SLOT, NULL, NULL };
    struct dsv4_step_desc a = { 3, 6, sa, pos, tok, 16, 4096 }, b = { 1, 3, &sb, pos, tok, 16, 4096 };
    struct dsv4_store_dst dst = { .to = DSV4_STORE_RING, .off = 64, .window = RING, .ring_rows = RING, .row_bytes = RB };
    for (int it = 0; it < 2; it++) {
        be.ops->step_begin(&be, &a);
        be.ops->store_rows(&be, &a, DSV4_ROW_BF16, D, 0, dx, D, &dst);
        be.ops->step_begin(&be, &b);
        be.ops->store_rows(&be, &b, DSV4_ROW_BF16, D, 0, dx + 8 * D, D, &dst);
    }
    k->download(impl, got, slots, sizeof(got));
    for (int s = 0; s < 3; s++)
        for (int r = 0; r < 2; r++)
            dsv4_row_encode(DSV4_ROW_BF16, D, 0, x[0] + (2 * s + r) * D, want + s * SLOT + 64 + ((5 + 4 * s + r) % RING) * RB);
    for (int r = 0; r < 3; r++) dsv4_row_encode(DSV4_ROW_BF16, D, 0, x[1] + r * D, want + 3 * SLOT + 64 + ((2 + r) % RING) * RB);
    CHECKF(!memcmp(got, want, sizeof(got)), "the rings of two steps recorded together differ from the encoded rows");
out:
    if (dx) k->free(impl, dx, sizeof(x));
    if (slots) k->free(impl, slots, 4 * SLOT);
    k->destroy(impl);
}

/* Engine open on a backend with missing ops fails, naming them (no silent CPU fallback). */
/* Engine open on a backend with missing ops fails, naming them (no silent CPU fallback). */
static void test_engine_refuses_missing_ops(struct test_ctx *t)
{
    void                           *impl = NULL;
    const struct dsv4_backend_kind *k = open_vk(t, &impl);
    if (!k) return;
    k->destroy(impl);
    char dir[256];
    snprintf(dir, sizeof(dir), "%s/vk-tiny-a", t->tmpdir);
    struct gen_opts go;
    gen_opts_default(&go);
    go.preset = "tiny-a";
    go.quiet  = true;
    struct dsv4_err err;
    CHECKF(gen_checkpoint(&go, dir, &err) == DSV4_OK, "gen: %s", err.msg);
    struct dsv4_engine_params ep;
    dsv4_engine_params_default(&ep);
    ep.backend      = "vulkan";
    dsv4_engine *e  = NULL;
    int          rc = dsv4_engine_open(&e, dir, &ep, &err);
    CHECKF(rc == DSV4_EUNSUPPORTED, "open on vulkan: %d (%s)", rc, rc ? err.msg : "opened");
    if (!rc) {
        dsv4_engine_close(e);
        return;
    }
    CHECKF(strstr(err.msg, "backend 'vulkan' lacks") && strstr(err.msg, "linear") &&
               !strstr(err.msg, "rmsnorm") && !strstr(err.msg, "scale"),
           "error: %s", err.msg);
}

/* bench's machine figures on the device: a read bandwidth and an FMA peak above zero, and the
 * probed buffer as it was (the probe only reads). */
static void test_machine_figures(struct test_ctx *t)
{
    void                           *impl = NULL;
    const struct dsv4_backend_kind *k = open_vk(t, &impl);
    if (!k) return;
    size_t   bytes = (size_t)48 << 20;
    uint8_t *buf = k->alloc(impl, bytes, DSV4_MEM_ACT), probe[4096];
    CHECK(buf != NULL && k->read_bandwidth && k->peaks);
    if (buf && k->read_bandwidth && k->peaks) {
        double bw = k->read_bandwidth(impl, buf, bytes, 2), f32 = 0, bf16 = 0;
        k->peaks(impl, &f32, &bf16);
        CHECKF(bw > 0.01 && bw < 1e5, "read bandwidth %.3g GB/s", bw);
        CHECKF(f32 > 0.01 && f32 < 1e7, "f32 peak %.3g GFLOP/s", f32);
        bool zero = true;
        for (size_t at = 0; at < bytes; at += bytes / 8) {
            k->download(impl, probe, buf + at, sizeof(probe));
            for (size_t i = 0; i < sizeof(probe); i++) zero &= probe[i] == 0;
        }
        CHECKF(zero, "the bandwidth probe wrote into the buffer it read");
    }
    if (buf) k->free(impl, buf, bytes);
    k->destroy(impl);
}

/* --profile on the device: created with profile, the backend times each command with GPU
 * timestamps and prints GPU time per shader (two scale dispatches, one upload, one download). */
static void test_gpu_timestamps(struct test_ctx *t)
{
    const struct dsv4_backend_kind *k = dsv4_backend_find("vulkan");
    if (!test_need_backend(t, "vulkan")) return;
    void                      *impl = NULL;
    struct dsv4_backend_params p    = { .n_threads = 1, .profile = true };
    struct dsv4_err            err;
    CHECKF(k->create(&impl, &p, &err) == DSV4_OK, "create: %s", err.msg);
    if (!impl) return;
    const struct dsv4_backend_ops *ops = k->ops(impl);
    struct dsv4_backend            be  = { .ops = ops, .impl = impl };
    float                          host[1000], back[1000];
    for (int i = 0; i < 1000; i++) host[i] = (float)(i % 200); /* bf16 values: scale rounds to bf16 */
    float *x = k->alloc(impl, sizeof(host), DSV4_MEM_ACT);
    CHECK(x != NULL && k->device_profile != NULL);
    if (x && k->device_profile) {
        k->upload(impl, x, host, sizeof(host));
        ops->scale(&be, 1000, x, 2.0);
        ops->scale(&be, 1000, x, 0.5);
        k->download(impl, back, x, sizeof(back));
        CHECK(!memcmp(back, host, sizeof(host)));
        char  *text = NULL;
        size_t len  = 0;
        FILE  *f    = open_memstream(&text, &len);
        k->device_profile(impl, f);
        fclose(f);
        CHECKF(text && strstr(text, "GPU time") && strstr(text, "scale") && strstr(text, "upload"),
               "device profile:\n%s", text ? text : "");
        const char *sc = text ? strstr(text, "scale") : NULL;
        unsigned    calls = 0;
        CHECKF(sc && sscanf(sc, "scale %u", &calls) == 1 && calls == 2, "scale timed %u times:\n%s", calls,
               text ? text : "");
        free(text);
    }
    if (x) k->free(impl, x, sizeof(host));
    k->destroy(impl);
}

const struct test_case test_group_vulkan[] = {
    { "device_found", test_device_found },
    { "memory_round_trip", test_memory_round_trip },
    { "host_access_faults", test_host_access_faults },
    { "ops_pass_checker", test_ops_pass_checker },
    { "hc_row_alone_as_in_batch", test_hc_row_alone_as_in_batch },
    { "step_ops_pass_checker", test_step_ops_pass_checker },
    { "two_steps_one_command_buffer", test_two_steps_one_command_buffer },
    { "engine_refuses_missing_ops", test_engine_refuses_missing_ops },
    { "machine_figures", test_machine_figures },
    { "gpu_timestamps", test_gpu_timestamps },
    { NULL, NULL },
};
