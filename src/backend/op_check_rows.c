/*
 * op_check_rows.c - the op checker's cases for the row ops (norms, RoPE, the FP8/FP4
 * simulations, Hadamard), the hyper-connection ops and the element-wise data ops (embed,
 * scale, add_streams). Shapes: awkward sizes (1, 3, 17, 31, widths off the vector and block
 * sizes, row strides wider than the rows, in place), then the widths these ops see in the
 * tiny and flash-shaped models (d_model, q_lora, d_head, d_nope, the indexer's d, hc).
 */
#include <math.h>
#include <string.h>

#include "backend/op_check_int.h"

/* Rows of n x ld with magnitudes that vary by row and a few special values in the first
 * rows: NaN, -NaN, +-inf and signed zeros (the ops must treat them as the reference). */
static void fill_rows(struct chk *h, float *x, int n, int ld, bool specials)
{
    for (int r = 0; r < n; r++)
        for (int i = 0; i < ld; i++)
            x[(size_t)r * ld + i] = (float)chk_uniform(h) * ldexpf(1.0f, (int)(chk_u64(h) % 20) - 10);
    if (!specials) return;
    int d = ld;
    if (n > 1) x[ld + 3 % d] = NAN;
    if (n > 2) x[2 * ld + 1 % d] = -0.0f;
    if (n > 3) x[3 * ld + 5 % d] = INFINITY;
    if (n > 4) x[4 * ld + 2 % d] = -INFINITY;
    if (n > 5) x[5 * ld + 4 % d] = -NAN;
}

static void run_rmsnorm(struct chk *h)
{
    const struct chk_model *M = chk_models;
    /* n, d, ld, in place */
    const int shapes[][4] = { { 1, 1, 1, 0 },   { 3, 17, 17, 0 }, { 5, 31, 40, 1 }, { 7, 160, 170, 0 },
                              { 17, M[0].d_model, M[0].d_model, 0 }, { 4, M[0].q_lora, M[0].q_lora, 1 },
                              { 3, M[0].d_head, M[0].d_head, 0 },  { 2, M[2].d_model, M[2].d_model, 0 },
                              { 3, M[2].q_lora, M[2].q_lora, 1 },  { 2, M[2].d_head, M[2].d_head, 0 } };
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int n = shapes[s][0], d = shapes[s][1], ld = shapes[s][2];
        bool inplace = shapes[s][3];
        struct dsv4_plan_dims dims = chk_dims();
        dims.max_rows = n, dims.d_model = d;
        chk_case(h, &dims, "n %d d %d ld %d%s", n, d, ld, inplace ? " in place" : "");
        float    *x = chk_floats(h, (size_t)n * ld);
        uint16_t *w = chk_alloc(h, sizeof(uint16_t) * (size_t)d);
        for (int r = 0; r < n; r++)
            for (int i = 0; i < ld; i++) x[(size_t)r * ld + i] = (float)chk_uniform(h) * (float)(1 + (r * ld + i) % 13);
        for (int i = 0; i < d; i++) w[i] = dsv4_bf16_from_f32(1.0f + 0.5f * (float)chk_uniform(h));
        for (struct dsv4_backend *be; (be = chk_next(h));) {
            float *y = chk_out_f32(h, 0, (size_t)n * ld, CHK_EXACT, inplace ? x : NULL, NULL);
            be->ops->rmsnorm(be, n, d, inplace ? y : chk_in(h, x), ld, chk_in(h, w), 1e-6, y, ld);
        }
    }
}

static void run_head_rms(struct chk *h)
{
    const struct chk_model *M = chk_models;
    const int shapes[][3] = { { 1, 1, 1 }, { 3, 5, 68 }, { 17, 3, 31 }, { 1, M[0].n_head, M[0].d_head },
                              { 5, M[0].n_head, M[0].d_head }, { 2, M[2].n_head, M[2].d_head } };
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int n = shapes[s][0], H = shapes[s][1], D = shapes[s][2];
        struct dsv4_plan_dims dims = chk_dims();
        dims.max_rows = n, dims.n_head = H, dims.d_head = D;
        chk_case(h, &dims, "n %d heads %d d_head %d", n, H, D);
        size_t N = (size_t)n * H * D;
        float *q = chk_floats(h, N);
        for (size_t i = 0; i < N; i++) q[i] = dsv4_round_bf16((float)chk_uniform(h) * (float)(1 + i % 7));
        for (struct dsv4_backend *be; (be = chk_next(h));) {
            float *y = chk_out_f32(h, 0, N, CHK_EXACT, q, NULL);
            be->ops->head_rms(be, n, H, D, y, 1e-6);
        }
    }
}

static void run_rope(struct chk *h)
{
    const struct chk_model *M = chk_models;
    /* n_vec, d_full, d_rope: heads of q, the kv row, the indexer's heads; then awkward pairs */
    const int shapes[][3] = { { M[0].n_head, M[0].d_head, M[0].d_rope }, { 1, M[0].d_head, M[0].d_rope },
                              { M[0].n_idx_head, M[0].d_idx, M[0].d_rope }, { M[2].n_head, M[2].d_head, M[2].d_rope },
                              { M[2].n_idx_head, M[2].d_idx, M[2].d_rope }, { 3, 40, 16 }, { 1, 3, 2 }, { 2, 96, 62 } };
    static const int pos[] = { 0, 1, 17, 4095, 70000, 1048575, 31, 3 };
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
        for (int inv = 0; inv < 2; inv++) {
            int nv = shapes[s][0], df = shapes[s][1], dr = shapes[s][2], n = s % 2 ? 8 : 3;
            struct dsv4_plan_dims dims = chk_dims();
            dims.max_rows = n;
            chk_case(h, &dims, "n %d vectors %d of %d, d_rope %d%s", n, nv, df, dr, inv ? " inverse" : "");
            float *freq = chk_floats(h, (size_t)dr / 2 + 1);
            for (int i = 0; i < dr / 2; i++) freq[i] = powf(10000.0f, -2.0f * (float)i / (float)dr);
            size_t N = (size_t)n * nv * df;
            float *x = chk_floats(h, N);
            chk_fill_bf16(h, x, N, 3.0f);
            for (struct dsv4_backend *be; (be = chk_next(h));) {
                float                 *y = chk_out_f32(h, 0, N, CHK_EXACT, x, NULL);
                struct dsv4_rope_table t = { dr, chk_in(h, freq) }; /* positions: host metadata */
                be->ops->rope(be, n, nv, df, y, pos, &t, inv);
            }
        }
}

static void run_sim(struct chk *h, bool fp8)
{
    const struct chk_model *M = chk_models;
    /* n, d, ld, block: the kv row's nope part (d_head - d_rope, stride d_head), the
     * indexer's keys (FP4), awkward widths and blocks (d is whole blocks: the reference's
     * precondition) */
    const int s8[][4] = { { 7, 128, 170, 64 }, { 7, 128, 170, 32 }, { 3, 96, 100, 48 }, { 1, 17, 17, 17 },
                          { 17, M[0].d_head - M[0].d_rope, M[0].d_head, 64 }, { 31, 64, 64, 64 },
                          { 3, M[2].d_head - M[2].d_rope, M[2].d_head, 64 } };
    /* FP4 with a fifth column: e4m3 scales (V4.1's compressed KV rows, groups of 16, tiny and
     * Flash head widths) */
    const int s4[][5] = { { 7, 160, 170, 32, 0 }, { 1, 32, 32, 32, 0 }, { 2, 64, 70, 32, 0 }, { 3, 48, 48, 16, 0 },
                          { 1, 17, 17, 17, 0 }, { 17, M[0].d_idx, M[0].d_idx, 32, 0 }, { 5, M[2].d_idx, M[2].d_idx, 32, 0 },
                          { 7, 160, 170, 16, 1 }, { 3, 64, 64, 16, 1 }, { 17, 512, 512, 16, 1 }, { 2, 17, 20, 17, 1 } };
    size_t n_shapes = fp8 ? sizeof(s8) / sizeof(s8[0]) : sizeof(s4) / sizeof(s4[0]);
    for (size_t s = 0; s < n_shapes; s++) {
        const int *sh = fp8 ? s8[s] : s4[s];
        int  n = sh[0], d = sh[1], ld = sh[2], block = sh[3];
        bool e4m3 = !fp8 && sh[4];
        struct dsv4_plan_dims dims = chk_dims();
        dims.max_rows = n;
        chk_case(h, &dims, "n %d d %d ld %d block %d%s", n, d, ld, block, e4m3 ? " e4m3 scales" : "");
        float *x = chk_floats(h, (size_t)n * ld);
        fill_rows(h, x, n, ld, true);
        if (!fp8 && n > 6)
            for (int i = 0; i < ld; i++) x[6 * ld + i] = (float)((int)(chk_u64(h) % 25) - 12) * 0.25f; /* e2m1 ties */
        for (struct dsv4_backend *be; (be = chk_next(h));) {
            float *y = chk_out_f32(h, 0, (size_t)n * ld, CHK_EXACT, x, NULL);
            if (fp8) be->ops->fp8_sim(be, n, d, ld, y, block);
            else be->ops->fp4_sim(be, n, d, ld, y, block, e4m3);
        }
    }
}

static void run_fp8_sim(struct chk *h)
{
    run_sim(h, true);
}

static void run_fp4_sim(struct chk *h)
{
    run_sim(h, false);
}

static void run_hadamard(struct chk *h)
{
    const int shapes[][2] = { { 2, 2 }, { 4, 8 }, { 3, 16 }, { 1, 128 }, { 17, 128 }, { 31, 64 }, { 2, 512 }, { 1, 4096 } };
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int n = shapes[s][0], d = shapes[s][1];
        struct dsv4_plan_dims dims = chk_dims();
        dims.max_rows = n, dims.d_idx_head = d;
        chk_case(h, &dims, "n %d d %d", n, d);
        float *x = chk_floats(h, (size_t)n * d);
        chk_fill_bf16(h, x, (size_t)n * d, 2.0f);
        if (n > 1) { /* a NaN with every payload bit set: its rounding must not reach the sign */
            uint32_t ones = 0xffffffffu;
            memcpy(&x[d + 1], &ones, 4);
        }
        for (struct dsv4_backend *be; (be = chk_next(h));) {
            float *y = chk_out_f32(h, 0, (size_t)n * d, CHK_EXACT, x, NULL);
            be->ops->hadamard(be, n, d, y);
        }
    }
}

/* n, hc, d of the hyper-connection cases: awkward, then the models' (hc streams of d_model). */
static const int hc_shapes[][3] = { { 1, 4, 17 }, { 5, 2, 31 }, { 1, 1, 96 }, { 2, 8, 64 }, { 3, 4, 256 }, { 17, 4, 256 },
                                    { 2, 4, 4096 } };
enum { N_HC = sizeof(hc_shapes) / sizeof(hc_shapes[0]) };

struct hc_in {
    int    n, hc, d, n_mix;
    float *X, *fn, *base, *scale;
};

/* One bf16 rounding, and an absolute floor for outputs that cancel: the mixing weights come
 * from f32 dot products over hc x d values (the reference's are double), a few sqrt(hc d)
 * f32 ulps off, times values below 2 summed over the streams. */
static struct chk_tol hc_tol(const struct hc_in *in)
{
    return (struct chk_tol){ 0.0079, 1e-6 + 16.0 * sqrt((double)in->hc * in->d) * 0x1p-24, 0, 0 };
}

static void hc_inputs(struct chk *h, struct hc_in *in, int s, bool head, const char *what)
{
    in->n = hc_shapes[s][0], in->hc = hc_shapes[s][1], in->d = hc_shapes[s][2];
    in->n_mix = head ? in->hc : (2 + in->hc) * in->hc;
    size_t hd = (size_t)in->hc * in->d;
    struct dsv4_plan_dims dims = chk_dims();
    dims.max_rows = in->n, dims.hc = in->hc, dims.d_model = in->d;
    chk_case(h, &dims, "n %d hc %d d %d%s", in->n, in->hc, in->d, what);
    in->X    = chk_floats(h, (size_t)in->n * hd);
    in->fn   = chk_floats(h, (size_t)in->n_mix * hd);
    in->base = chk_floats(h, (size_t)in->n_mix);
    in->scale = chk_floats(h, 3);
    chk_fill_bf16(h, in->X, (size_t)in->n * hd, 2.0f);
    for (size_t i = 0; i < (size_t)in->n_mix * hd; i++) in->fn[i] = (float)chk_uniform(h) * 0.05f;
    for (int i = 0; i < in->n_mix; i++) in->base[i] = (float)chk_uniform(h) * 0.5f;
    for (int i = 0; i < 3; i++) in->scale[i] = 0.9f + 0.2f * (float)chk_uniform(h);
}

/* hc_pre in its three modes: V4 (no lag), V4.1's lagged mix (lag in and out) and V4.1's
 * final collapse (fn NULL: lag alone; the weights, post and comb unused, so NULL here). */
static void run_hc_pre(struct chk *h)
{
    for (int s = 0; s < N_HC; s++)
        for (int mode = 0; mode < 3; mode++) {
            struct hc_in in;
            hc_inputs(h, &in, s, false, mode == 0 ? "" : mode == 1 ? " lagged" : " collapse only");
            float *lag0 = chk_floats(h, (size_t)in.n * in.hc);
            for (int i = 0; i < in.n * in.hc; i++) lag0[i] = 0.5f + 0.5f * (float)chk_uniform(h);
            /* the mixing weights go through a sigmoid and Sinkhorn in double on both sides:
             * f32 dot products move them by far less than 1e-5 */
            struct chk_tol w = { 0, 1e-5, 0, 0 };
            for (struct dsv4_backend *be; (be = chk_next(h));) {
                float *u    = chk_out_f32(h, 0, (size_t)in.n * in.d, hc_tol(&in), NULL, NULL);
                float *lag  = mode ? chk_out_f32(h, 1, (size_t)in.n * in.hc, w, lag0, NULL) : NULL;
                float *post = mode < 2 ? chk_out_f32(h, 2, (size_t)in.n * in.hc, w, NULL, NULL) : NULL;
                float *comb = mode < 2 ? chk_out_f32(h, 3, (size_t)in.n * in.hc * in.hc, w, NULL, NULL) : NULL;
                bool   mix  = mode < 2;
                be->ops->hc_pre(be, in.n, in.hc, in.d, chk_in(h, in.X), mix ? chk_in(h, in.fn) : NULL,
                                mix ? chk_in(h, in.scale) : NULL, mix ? chk_in(h, in.base) : NULL, 20, 1e-6, 1e-6, lag,
                                u, post, comb);
            }
        }
}

static void run_hc_post(struct chk *h)
{
    for (int s = 0; s < N_HC; s++) {
        struct hc_in in;
        hc_inputs(h, &in, s, true, "");
        int    n = in.n, hc = in.hc, d = in.d;
        float *f = chk_floats(h, (size_t)n * d), *post = chk_floats(h, (size_t)n * hc);
        float *comb = chk_floats(h, (size_t)n * hc * hc);
        chk_fill_bf16(h, f, (size_t)n * d, 2.0f);
        for (int i = 0; i < n * hc; i++) post[i] = 2.0f * (float)fabs(chk_uniform(h));
        for (int i = 0; i < n * hc * hc; i++) comb[i] = (float)fabs(chk_uniform(h)) / (float)hc;
        for (struct dsv4_backend *be; (be = chk_next(h));) {
            float *y = chk_out_f32(h, 0, (size_t)n * hc * d, hc_tol(&in), NULL, NULL);
            be->ops->hc_post(be, n, hc, d, chk_in(h, f), chk_in(h, in.X), chk_in(h, post), chk_in(h, comb), y);
        }
    }
}

static void run_hc_head(struct chk *h)
{
    for (int s = 0; s < N_HC; s++) {
        struct hc_in in;
        hc_inputs(h, &in, s, true, "");
        for (struct dsv4_backend *be; (be = chk_next(h));) {
            float *y = chk_out_f32(h, 0, (size_t)in.n * in.d, hc_tol(&in), NULL, NULL);
            be->ops->hc_head(be, in.n, in.hc, in.d, chk_in(h, in.X), chk_in(h, in.fn), chk_in(h, in.scale),
                             chk_in(h, in.base), 1e-6, 1e-6, y);
        }
    }
}

static void run_embed(struct chk *h)
{
    const struct chk_model *M = chk_models;
    /* n, d, copies, vocab rows (a slice of the real vocabulary: the gather does not care) */
    const int shapes[][4] = { { 1, 1, 1, 1 }, { 3, 17, 1, 50 }, { 31, 31, 3, 7 }, { 17, M[0].d_model, M[0].hc, 2048 },
                              { 2, M[2].d_model, M[2].hc, 300 } };
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int n = shapes[s][0], d = shapes[s][1], copies = shapes[s][2], vocab = shapes[s][3];
        struct dsv4_plan_dims dims = chk_dims();
        dims.max_rows = n, dims.d_model = d, dims.hc = copies;
        chk_case(h, &dims, "n %d d %d copies %d", n, d, copies);
        uint16_t *table = chk_alloc(h, sizeof(uint16_t) * (size_t)vocab * d);
        int      *tok   = chk_alloc(h, sizeof(int) * (size_t)n);
        for (size_t i = 0; i < (size_t)vocab * d; i++) table[i] = dsv4_bf16_from_f32((float)chk_uniform(h) * 0.1f);
        for (int r = 0; r < n; r++) tok[r] = r == 0 ? vocab - 1 : r == 1 ? 0 : (int)(chk_u64(h) % (uint64_t)vocab);
        for (struct dsv4_backend *be; (be = chk_next(h));) {
            float *X = chk_out_f32(h, 0, (size_t)n * copies * d, CHK_EXACT, NULL, NULL);
            be->ops->embed(be, n, tok, chk_in(h, table), d, copies, X); /* token ids: host metadata */
        }
    }
}

static void run_scale(struct chk *h)
{
    static const struct { size_t n; double s; } shapes[] = { { 1, 0.5 }, { 17, 0.0883883476483184 }, { 31, -3.3 },
                                                             { 4 * 4096, 1.7320508075688772 }, { 3, 1e-30 } };
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        size_t n = shapes[s].n;
        struct dsv4_plan_dims dims = chk_dims();
        chk_case(h, &dims, "n %zu s %g", n, shapes[s].s);
        float *x = chk_floats(h, n);
        chk_fill_bf16(h, x, n, 5.0f);
        for (struct dsv4_backend *be; (be = chk_next(h));) {
            float *y = chk_out_f32(h, 0, n, CHK_EXACT, x, NULL);
            be->ops->scale(be, n, y, shapes[s].s);
        }
    }
}

static void run_add_streams(struct chk *h)
{
    const struct chk_model *M = chk_models;
    const int shapes[][3] = { { 1, 1, 1 }, { 3, 1, 17 }, { 5, 8, 31 }, { 17, M[0].hc, M[0].d_model }, { 2, M[2].hc, M[2].d_model } };
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int n = shapes[s][0], hc = shapes[s][1], d = shapes[s][2];
        struct dsv4_plan_dims dims = chk_dims();
        dims.max_rows = n, dims.hc = hc, dims.d_model = d;
        chk_case(h, &dims, "n %d hc %d d %d", n, hc, d);
        float *X = chk_floats(h, (size_t)n * hc * d), *e = chk_floats(h, (size_t)n * d);
        chk_fill_bf16(h, X, (size_t)n * hc * d, 3.0f);
        chk_fill_bf16(h, e, (size_t)n * d, 3.0f);
        for (struct dsv4_backend *be; (be = chk_next(h));) {
            float *y = chk_out_f32(h, 0, (size_t)n * hc * d, CHK_EXACT, X, NULL);
            be->ops->add_streams(be, n, hc, d, chk_in(h, e), y);
        }
    }
}

/* Engram rows: ids inside and outside the table (zeros), e4m3 codes of every value (NaN
 * codes included) and e8m0 scales over a wide band. */
static void run_engram_rows(struct chk *h)
{
    /* n, cols, d, table rows */
    const int shapes[][4] = { { 1, 1, 32, 1 }, { 3, 4, 64, 37 }, { 17, 6, 96, 500 }, { 2, 24, 256, 1000 } };
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int n = shapes[s][0], cols = shapes[s][1], d = shapes[s][2], rows = shapes[s][3], ld = cols + 3;
        struct dsv4_plan_dims dims = chk_dims();
        dims.max_rows = n;
        chk_case(h, &dims, "n %d cols %d d %d rows %d", n, cols, d, rows);
        uint8_t *table = chk_alloc(h, (size_t)rows * d), *scale = chk_alloc(h, (size_t)rows * d / 32);
        int64_t *ids   = chk_alloc(h, sizeof(int64_t) * (size_t)n * ld);
        for (size_t i = 0; i < (size_t)rows * d; i++) table[i] = (uint8_t)chk_u64(h);
        for (size_t i = 0; i < (size_t)rows * d / 32; i++) scale[i] = (uint8_t)(100 + chk_u64(h) % 50);
        for (int i = 0; i < n * ld; i++) {
            uint64_t u = chk_u64(h);
            ids[i] = u % 11 == 0 ? (u % 2 ? -1 : rows + (int64_t)(u % 5)) : (int64_t)(u % (uint64_t)rows);
        }
        for (struct dsv4_backend *be; (be = chk_next(h));) {
            float *y = chk_out_f32(h, 0, (size_t)n * cols * d, CHK_EXACT, NULL, NULL);
            /* ids: host metadata (the host hashes); the table: the mapped checkpoint, host memory */
            be->ops->engram_rows(be, n, cols, ids, ld, table, scale, rows, d, y);
        }
    }
}

/* Engram gate: streams and keys of unit scale (dots of both signs, some near zero: the
 * clamp), bf16 values as the projection leaves them. */
static void run_engram_gate(struct chk *h)
{
    /* one bf16 rounding: a device's f32 exp may move the gate by an ulp (engram_gate.comp) */
    const struct chk_tol gate_tol = { 0.0079, 1e-6, 0, 0 };
    const struct chk_model *M = chk_models;
    const int shapes[][3] = { { 1, 1, 1 }, { 3, 2, 17 }, { 5, 4, 31 }, { 17, M[0].hc, M[0].d_model },
                              { 2, M[2].hc, M[2].d_model } };
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int n = shapes[s][0], hc = shapes[s][1], d = shapes[s][2];
        struct dsv4_plan_dims dims = chk_dims();
        dims.max_rows = n, dims.hc = hc, dims.d_model = d;
        chk_case(h, &dims, "n %d hc %d d %d", n, hc, d);
        float *X = chk_floats(h, (size_t)n * hc * d), *kv = chk_floats(h, (size_t)n * (hc + 1) * d);
        float *w = chk_floats(h, (size_t)hc * d);
        chk_fill_bf16(h, X, (size_t)n * hc * d, 2.0f);
        chk_fill_bf16(h, kv, (size_t)n * (hc + 1) * d, 2.0f);
        for (int i = 0; i < hc * d; i++) w[i] = 1.0f + 0.5f * (float)chk_uniform(h);
        if (n > 1) memset(kv + (size_t)(hc + 1) * d, 0, sizeof(float) * (size_t)d); /* a zero key: dot 0 */
        for (struct dsv4_backend *be; (be = chk_next(h));) {
            float *y = chk_out_f32(h, 0, (size_t)n * hc * d, gate_tol, X, NULL);
            be->ops->engram_gate(be, n, hc, d, chk_in(h, kv), chk_in(h, w), 1e-20, y);
        }
    }
}

const struct chk_op chk_ops_rows[] = {
    { DSV4_OP_RMSNORM, "bit-exact", run_rmsnorm },
    { DSV4_OP_HEAD_RMS, "bit-exact", run_head_rms },
    { DSV4_OP_ROPE, "bit-exact", run_rope },
    { DSV4_OP_FP8_SIM, "bit-exact", run_fp8_sim },
    { DSV4_OP_FP4_SIM, "bit-exact", run_fp4_sim },
    { DSV4_OP_HADAMARD, "bit-exact", run_hadamard },
    { DSV4_OP_HC_PRE, "u 2^-7 rel + 1e-6 + 2^-20 sqrt(hc d); post, comb 1e-5", run_hc_pre },
    { DSV4_OP_HC_POST, "2^-7 rel + 1e-6 + 2^-20 sqrt(hc d)", run_hc_post },
    { DSV4_OP_HC_HEAD, "2^-7 rel + 1e-6 + 2^-20 sqrt(hc d)", run_hc_head },
    { DSV4_OP_EMBED, "bit-exact", run_embed },
    { DSV4_OP_SCALE, "bit-exact", run_scale },
    { DSV4_OP_ADD_STREAMS, "bit-exact", run_add_streams },
    { DSV4_OP_ENGRAM_ROWS, "bit-exact", run_engram_rows },
    { DSV4_OP_ENGRAM_GATE, "2^-7 rel + 1e-6 (the CPU levels: bit-exact)", run_engram_gate },
    { DSV4_OP_COUNT, NULL, NULL },
};
