/*
 * op_check_moe.c - the op checker's cases for the ops with weights (linear, router, expert,
 * experts) and the MoE data ops (dispatch, combine). Projections in every format (bf16, f32,
 * FP8 e4m3 with e8m0 or f32 BxB scales, FP4 e2m1 with per-32 scales), FP8 blocks and
 * activation groups B of 128 (V4) and 32 (V4.1), awkward shapes,
 * views at a row offset (the grouped wo_a), the projections of the tiny and flash-shaped
 * models, and token counts on both sides of the CPU's GEMV/GEMM switch points (6, 12, 24,
 * 56: dsv4 ops prints them) so that both paths are compared.
 */
#include <math.h>
#include <string.h>

#include "backend/op_check_int.h"

/* ------------------------------------------------------------------ weights */

/* Weight (o, k) of l exactly (codes times scales), o counted from the tensor's first row. */
static double weight_at(const struct dsv4_linear *l, int o, int k)
{
    const uint8_t *w = l->w;
    double         s = 1;
    if (l->fmt == DSV4_WFMT_FP8 || l->fmt == DSV4_WFMT_FP4) {
        size_t i = l->fmt == DSV4_WFMT_FP8 ? dsv4_fp8_scale_index(l, o, k)
                                           : (size_t)o * (size_t)(l->n_in / 32) + (size_t)(k / 32);
        if (l->scale_f32) {
            float f;
            memcpy(&f, (const uint8_t *)l->scale + 4 * i, 4);
            s = f;
        } else {
            s = dsv4_f32_from_e8m0(((const uint8_t *)l->scale)[i]);
        }
    }
    switch (l->fmt) {
    case DSV4_WFMT_FP8: return dsv4_f32_from_e4m3(w[(size_t)o * (size_t)l->n_in + (size_t)k]) * s;
    case DSV4_WFMT_FP4: {
        uint8_t b = w[(size_t)o * (size_t)(l->n_in / 2) + (size_t)(k / 2)];
        return dsv4_f32_from_e2m1(k % 2 ? b >> 4 : b & 15) * s;
    }
    case DSV4_WFMT_BF16: {
        uint16_t v;
        memcpy(&v, w + 2 * ((size_t)o * (size_t)l->n_in + (size_t)k), 2);
        return dsv4_f32_from_bf16(v);
    }
    default: {
        float f;
        memcpy(&f, w + 4 * ((size_t)o * (size_t)l->n_in + (size_t)k), 4);
        return f;
    }
    }
}

/* A projection with random codes (no NaN e4m3 codes) and block scales of 2^-10 .. 2^-4
 * (FP8, FP4) or values of about 1/sqrt(n_in) (bf16, f32), in the case's memory; FP8 blocks
 * and activation groups of `block` (0: 128, V4's). */
static void make_linear(struct chk *h, struct dsv4_linear *l, enum dsv4_wfmt fmt, int n_out, int n_in, bool f32_scales,
                        int block)
{
    size_t no = (size_t)n_out, ni = (size_t)n_in;
    *l = (struct dsv4_linear){ .fmt = fmt, .n_out = n_out, .n_in = n_in, .block = block ? block : 128 };
    size_t nw = fmt == DSV4_WFMT_FP8 ? no * ni : fmt == DSV4_WFMT_FP4 ? no * ni / 2 : fmt == DSV4_WFMT_BF16 ? 2 * no * ni : 4 * no * ni;
    size_t ns = fmt == DSV4_WFMT_FP8 ? dsv4_fp8_scale_index(l, n_out - 1, n_in - 1) + 1 : fmt == DSV4_WFMT_FP4 ? no * (ni / 32) : 0;
    uint8_t *w = chk_alloc(h, nw), *s = ns ? chk_alloc(h, ns * (f32_scales ? 4 : 1)) : NULL;
    float    amp = 1.0f / sqrtf((float)n_in);
    if (fmt == DSV4_WFMT_FP8 || fmt == DSV4_WFMT_FP4) {
        for (size_t i = 0; i < nw; i += 8) {
            uint64_t r = chk_u64(h);
            for (size_t b = 0; b < 8 && i + b < nw; b++) w[i + b] = (uint8_t)(r >> (8 * b));
        }
        if (fmt == DSV4_WFMT_FP8)
            for (size_t i = 0; i < nw; i++)
                if ((w[i] & 0x7f) == 0x7f) w[i] ^= 1; /* 0x7f, 0xff: NaN */
    } else if (fmt == DSV4_WFMT_BF16) {
        for (size_t i = 0; i < no * ni; i++) {
            uint16_t v = dsv4_bf16_from_f32((float)chk_uniform(h) * amp);
            memcpy(w + 2 * i, &v, 2);
        }
    } else {
        for (size_t i = 0; i < no * ni; i++) {
            float v = (float)chk_uniform(h) * amp;
            memcpy(w + 4 * i, &v, 4);
        }
    }
    for (size_t i = 0; i < ns; i++) {
        int e = (int)(chk_u64(h) % 7) - 10;
        if (f32_scales) {
            float f = ldexpf(1.0f + 0.3f * (float)fabs(chk_uniform(h)), e);
            memcpy(s + 4 * i, &f, 4);
        } else {
            s[i] = (uint8_t)(127 + e);
        }
    }
    l->w = w, l->scale = s, l->scale_f32 = f32_scales;
}

/* sum_k |w(o, k)| for the n_out rows of l (view rows: from row_off). */
static double *row_abs(struct chk *h, const struct dsv4_linear *l)
{
    double *a = chk_alloc(h, sizeof(double) * (size_t)l->n_out);
    for (int o = 0; o < l->n_out; o++)
        for (int k = 0; k < l->n_in; k++) a[o] += fabs(weight_at(l, o + l->row_off, k));
    return a;
}

/* ------------------------------------------------------------------ linear */

struct lin_case {
    const char    *what;
    enum dsv4_wfmt fmt;
    int            n_out, n_in;
    bool           f32s;
    enum dsv4_act  act;
    enum dsv4_out  out;
    int            view_off, view_rows; /* a view of the tensor's rows [off, off + rows), or 0, 0 */
    int            toks[6];             /* token counts, 0-terminated */
};

/* Case c with FP8 blocks and activation groups of `block` (128 V4, 32 V4.1). */
static void linear_case(struct chk *h, const struct lin_case *c, int block)
{
    int max_t = 0, n_t = 0;
    for (; n_t < 6 && c->toks[n_t]; n_t++) max_t = c->toks[n_t] > max_t ? c->toks[n_t] : max_t;
    int K = c->n_in, O = c->view_rows ? c->view_rows : c->n_out, ldx = K + 5, ldy = O + 3;
    struct dsv4_plan_dims dims = chk_dims();
    dims.max_rows = max_t, dims.d_model = K;
    chk_case(h, &dims, "%s %s [%d x %d]%s%s%s", c->what, dsv4_wfmt_name(c->fmt), O, K, c->f32s ? " f32 scales" : "",
             c->act == DSV4_ACT_FP8 ? " fp8 act" : "", block == 32 ? " block 32" : "");
    struct dsv4_linear  whole;
    struct dsv4_linear *wp = &whole;
    make_linear(h, &whole, c->fmt, c->n_out, K, c->f32s, block);
    chk_weights(h, &wp, 1);
    float *x = chk_floats(h, (size_t)max_t * ldx);
    chk_fill_bf16(h, x, (size_t)max_t * ldx, 4.0f);
    /* the tolerance's magnitude per output: sum |w| times the row's largest |x| (quantised
     * activations are at most 1/16 larger), which bounds sum |w x| */
    struct dsv4_linear view = whole;
    view.row_off = c->view_off, view.n_out = O;
    double *ra  = row_abs(h, &view);
    float  *mag[6];
    for (int i = 0; i < n_t; i++) {
        mag[i] = chk_floats(h, (size_t)c->toks[i] * ldy);
        for (int t = 0; t < c->toks[i]; t++) {
            float xm = 0;
            for (int k = 0; k < K; k++) xm = fmaxf(xm, fabsf(x[(size_t)t * ldx + k]));
            for (int o = 0; o < O; o++) mag[i][(size_t)t * ldy + o] = (float)(ra[o] * xm * 1.07);
        }
    }
    /* f32 sums in another order than the reference's double ones: a few 2^-24 of sum |w x| */
    struct chk_tol tol = { c->out == DSV4_OUT_BF16 ? 0.0079 : 0, 1e-30, 2e-6, 0 };
    for (struct dsv4_backend *be; (be = chk_next(h));) {
        view = whole; /* prepared weights: the view shares the whole tensor's copy (backend.h) */
        view.row_off = c->view_off, view.n_out = O;
        for (int i = 0; i < n_t; i++) {
            float *y = chk_out_f32(h, i, (size_t)c->toks[i] * ldy, tol, NULL, mag[i]);
            be->ops->linear(be, &view, c->toks[i], chk_in(h, x), ldx, y, ldy, c->act, c->out);
        }
    }
}

static void run_linear(struct chk *h)
{
    const struct chk_model *A = &chk_models[0], *F = &chk_models[2];
#define B  DSV4_WFMT_BF16
#define F3 DSV4_WFMT_F32
#define E  DSV4_WFMT_FP8
#define Q  DSV4_WFMT_FP4
#define AN DSV4_ACT_NONE
#define A8 DSV4_ACT_FP8
#define OF DSV4_OUT_F32
#define OB DSV4_OUT_BF16
    const struct lin_case cases[] = {
        { "awkward", B, 3, 37, 0, AN, OF, 0, 0, { 1, 3, 17 } },
        { "awkward", B, 9, 200, 0, AN, OB, 0, 0, { 1, 6, 31 } },
        { "awkward", B, 64, 1024, 0, AN, OB, 0, 0, { 1, 5, 6, 7, 31 } },
        { "awkward", F3, 5, 33, 0, AN, OF, 0, 0, { 1, 3 } },
        { "awkward", F3, 16, 256, 0, AN, OF, 0, 0, { 2, 17 } },
        { "awkward", E, 1, 128, 0, A8, OB, 0, 0, { 1, 3 } },
        { "awkward", E, 31, 384, 0, A8, OB, 0, 0, { 1, 5, 6, 23, 24, 25 } },
        { "awkward", E, 130, 256, 1, A8, OB, 0, 0, { 1, 7 } },
        { "awkward view", E, 260, 1024, 0, A8, OB, 4, 250, { 1, 3, 24, 31 } },
        { "awkward", Q, 1, 32, 0, A8, OB, 0, 0, { 1 } },
        { "awkward", Q, 17, 160, 0, A8, OB, 0, 0, { 1, 11, 12, 13 } },
        { "awkward", Q, 66, 512, 0, A8, OB, 0, 0, { 1, 55, 56, 57 } },
        { "awkward", Q, 7, 160, 1, A8, OB, 0, 0, { 1, 3 } },
        { "tiny wq_a", E, A->q_lora, A->d_model, 0, A8, OB, 0, 0, { 1, 17 } },
        { "tiny wq_b", E, A->n_head * A->d_head, A->q_lora, 0, A8, OB, 0, 0, { 1, 5 } },
        { "tiny wo_a group 1", E, A->o_groups * A->o_lora, A->n_head * A->d_head / A->o_groups, 0, A8, OB, A->o_lora,
          A->o_lora, { 1, 17 } },
        { "tiny wo_b", E, A->d_model, A->o_groups * A->o_lora, 0, A8, OB, 0, 0, { 1, 3 } },
        { "tiny head", B, 2048, A->d_model, 0, AN, OF, 0, 0, { 1, 3 } },
        { "tiny expert w1", Q, A->d_ff, A->d_model, 0, A8, OB, 0, 0, { 1, 2, 17 } },
        { "tiny expert w2", Q, A->d_model, A->d_ff, 0, A8, OB, 0, 0, { 1, 4 } },
        { "tiny gate", B, A->n_exp, A->d_model, 0, AN, OF, 0, 0, { 1, 3 } },
        { "flash wq_a", E, F->q_lora, F->d_model, 0, A8, OB, 0, 0, { 1, 25 } },
        { "flash wo_b", E, F->d_model, F->o_groups * F->o_lora, 0, A8, OB, 0, 0, { 1, 6 } },
        { "flash wo_a group 1", E, 2 * F->o_lora, F->n_head * F->d_head / F->o_groups, 0, A8, OB, F->o_lora, F->o_lora,
          { 1, 24 } },
        { "flash expert w1", Q, F->d_ff, F->d_model, 0, A8, OB, 0, 0, { 1, 13 } },
        { "flash gate", B, F->n_exp, F->d_model, 0, AN, OF, 0, 0, { 2 } },
    };
    /* V4.1: FP8 blocks of 32x32, activations quantised per 32 (FP8 and FP4 weights) */
    const struct lin_case v41[] = {
        { "v4.1 awkward", E, 1, 32, 0, A8, OB, 0, 0, { 1, 3 } },
        { "v4.1 awkward", E, 31, 96, 0, A8, OB, 0, 0, { 1, 5, 6, 23, 24, 25 } },
        { "v4.1 awkward", E, 130, 160, 1, A8, OB, 0, 0, { 1, 7 } },
        { "v4.1 awkward", E, 67, 224, 0, AN, OF, 0, 0, { 1, 4 } },
        { "v4.1 awkward view", E, 260, 1024, 0, A8, OB, 4, 250, { 1, 3, 24, 31 } },
        { "v4.1 awkward view", E, 100, 96, 0, A8, OB, 36, 60, { 1, 7 } },
        { "v4.1 awkward", Q, 1, 32, 0, A8, OB, 0, 0, { 1 } },
        { "v4.1 awkward", Q, 17, 160, 0, A8, OB, 0, 0, { 1, 11, 12, 13 } },
        { "v4.1 awkward", Q, 66, 512, 0, A8, OB, 0, 0, { 1, 55, 56, 57 } },
        { "v4.1 awkward", Q, 7, 160, 1, A8, OB, 0, 0, { 1, 3 } },
        { "v4.1 flash wq_a", E, F->q_lora, F->d_model, 0, A8, OB, 0, 0, { 1, 25 } },
        { "v4.1 flash expert w1", Q, F->d_ff, F->d_model, 0, A8, OB, 0, 0, { 1, 13 } },
    };
#undef B
#undef F3
#undef E
#undef Q
#undef AN
#undef A8
#undef OF
#undef OB
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) linear_case(h, &cases[i], 128);
    for (size_t i = 0; i < sizeof(v41) / sizeof(v41[0]); i++) linear_case(h, &v41[i], 32);
}

/* ------------------------------------------------------------------ router */

struct router_check {
    int    n, n_exp, n_used;
    bool   hash;
    float *sel; /* [n, n_exp] the reference's selection scores (score + bias) */
};

/* Ids: the reference's, or (near-ties: the gate's f32 sums differ from the reference's
 * double ones) a best choice under the reference's scores within 1e-5; weights where the
 * ids agree, to 2e-5 relative. Hash routing takes the table's ids: those exactly. */
static void router_compare(struct chk *h, void *ud)
{
    const struct router_check *c = ud;
    const int   *ri = chk_ref(h, 0), *gi = chk_got(h, 0);
    const float *rw = chk_ref(h, 1), *gw = chk_got(h, 1);
    size_t       differ = 0;
    double       max_abs = 0, max_used = 0;
    for (int r = 0; r < c->n; r++) {
        const int *a = ri + (size_t)r * c->n_used, *b = gi + (size_t)r * c->n_used;
        if (memcmp(a, b, sizeof(int) * (size_t)c->n_used)) {
            differ++;
            if (c->hash) {
                chk_fail(h, "row %d: hash-routed ids differ from the reference's", r);
                continue;
            }
            const float *s  = c->sel + (size_t)r * c->n_exp;
            double       lo = INFINITY, hi = -INFINITY;
            for (int e = 0; e < c->n_exp; e++) {
                bool in = false;
                for (int k = 0; k < c->n_used; k++) in |= b[k] == e;
                double tol = 1e-5 * fabs(s[e]) + 1e-6;
                if (in) lo = fmin(lo, s[e] + tol);
                else hi = fmax(hi, s[e] - tol);
            }
            for (int k = 0; k < c->n_used; k++)
                for (int j = 0; j < k; j++)
                    if (b[k] == b[j] || b[k] < 0 || b[k] >= c->n_exp) lo = -INFINITY;
            if (hi > lo) chk_fail(h, "row %d: the chosen experts are not the best under the reference's scores", r);
            continue;
        }
        for (int k = 0; k < c->n_used; k++) {
            double x = rw[r * c->n_used + k], y = gw[r * c->n_used + k], e = fabs(x - y);
            double allowed = 2e-5 * fabs(x) + 1e-7;
            max_abs  = fmax(max_abs, e);
            max_used = fmax(max_used, e / allowed);
            differ += x != y;
            if (!(e <= allowed)) chk_fail(h, "row %d weight %d: %.9g, reference %.9g", r, k, y, x);
        }
    }
    chk_note(h, (size_t)c->n * c->n_used * 2, differ, max_abs, max_used);
}

static void run_router(struct chk *h)
{
    const struct chk_model *A = &chk_models[0], *F = &chk_models[2];
    /* n, d, n_exp, n_used, hash, bias, gate_temp x 4 (V4.1 divides the logits by gate_temp) */
    const int cases[][7] = { { 1, 31, 5, 5, 0, 1, 4 },  { 17, 37, 3, 1, 0, 0, 4 },  { 3, A->d_model, A->n_exp, A->n_used, 0, 1, 4 },
                             { 5, A->d_model, A->n_exp, A->n_used, 1, 0, 4 }, { 2, F->d_model, F->n_exp, F->n_used, 0, 1, 4 },
                             { 3, F->d_model, F->n_exp, F->n_used, 1, 0, 4 }, { 7, A->d_model, A->n_exp, A->n_used, 0, 1, 5 },
                             { 2, 37, 6, 2, 0, 0, 3 } };
    for (size_t s = 0; s < sizeof(cases) / sizeof(cases[0]); s++) {
        int n = cases[s][0], d = cases[s][1], ne = cases[s][2], nu = cases[s][3], vocab = 97;
        bool   hash = cases[s][4], has_bias = cases[s][5];
        double gate_temp = cases[s][6] / 4.0;
        struct dsv4_plan_dims dims = chk_dims();
        dims.max_rows = n, dims.d_model = d, dims.n_exp = ne, dims.n_exp_used = nu;
        chk_case(h, &dims, "n %d d %d, %d of %d experts%s%s, gate_temp %g", n, d, nu, ne, hash ? ", hash" : "",
                 has_bias ? ", bias" : "", gate_temp);
        struct dsv4_linear  gate;
        struct dsv4_linear *gp = &gate;
        make_linear(h, &gate, DSV4_WFMT_BF16, ne, d, false, 0);
        chk_weights(h, &gp, 1);
        float   *x = chk_floats(h, (size_t)n * d), *bias = has_bias ? chk_floats(h, (size_t)ne) : NULL;
        int64_t *tid2eid = NULL;
        int     *tok     = chk_alloc(h, sizeof(int) * (size_t)n);
        chk_fill_bf16(h, x, (size_t)n * d, 2.0f);
        for (int e = 0; bias && e < ne; e++) bias[e] = (float)chk_uniform(h) * 0.1f;
        if (hash) { /* rows of distinct ids, as the checkpoints' tid2eid */
            tid2eid = chk_alloc(h, sizeof(int64_t) * (size_t)vocab * nu);
            for (int v = 0; v < vocab; v++)
                for (int k = 0; k < nu; k++) tid2eid[(size_t)v * nu + k] = (v * 7 + k * 13) % ne;
            for (int r = 0; r < n; r++) tok[r] = (int)(chk_u64(h) % (uint64_t)vocab);
        }
        struct router_check rc = { n, ne, nu, hash, chk_floats(h, (size_t)n * ne) };
        chk_custom(h, router_compare, &rc);
        for (struct dsv4_backend *be; (be = chk_next(h));) {
            if (chk_is_reference(h)) { /* the selection scores of the contract, from the reference's gate */
                be->ops->linear(be, &gate, n, x, d, rc.sel, ne, DSV4_ACT_NONE, DSV4_OUT_F32);
                for (int i = 0; i < n * ne; i++) {
                    double l = (float)(rc.sel[i] / gate_temp), sp = l > 20 ? l : log1p(exp(l));
                    rc.sel[i] = (float)sqrt((float)sp) + (bias ? bias[i % ne] : 0.0f);
                }
            }
            int   *ids = chk_out_int(h, 0, (size_t)n * nu, NULL);
            float *w   = chk_out_f32(h, 1, (size_t)n * nu, CHK_EXACT, NULL, NULL);
            float *scr = chk_work(h, sizeof(float) * (size_t)(n + 1) * ne);
            be->ops->router(be, n, chk_in(h, x), &gate, chk_in(h, bias), chk_in(h, tid2eid), tok, ne, nu, 1.5, gate_temp,
                            ids, w, scr); /* token ids: host metadata */
        }
    }
}

/* ------------------------------------------------------------------ experts */

/* f32 against double sums may flip a bf16 or e4m3 rounding of an intermediate (the SwiGLU
 * input, its quantised output): 2% of a value plus 1e-4, all but 1% of the values. */
#define EXPERT_TOL ((struct chk_tol){ 0.02, 1e-4, 0, 10 })

static void make_expert(struct chk *h, struct dsv4_expert_w *e, enum dsv4_wfmt fmt, int d, int f, int block)
{
    make_linear(h, &e->w1, fmt, f, d, false, block);
    make_linear(h, &e->w3, fmt, f, d, false, block);
    make_linear(h, &e->w2, fmt, d, f, false, block);
}

static void run_expert(struct chk *h)
{
    const struct chk_model *A = &chk_models[0], *F = &chk_models[2];
    /* fmt, d, f, n, routing weights, limit, FP8 block / activation group (0: 128; 32: V4.1) */
    const int cases[][7] = { { DSV4_WFMT_FP8, 256, 96, 3, 1, 10, 32 }, { DSV4_WFMT_FP4, 160, 96, 5, 1, 0, 32 }, { DSV4_WFMT_FP8, A->d_model, A->d_ff, 1, 0, 10 }, { DSV4_WFMT_FP8, A->d_model, A->d_ff, 3, 1, 10 },
                             { DSV4_WFMT_FP8, A->d_model, A->d_ff, 17, 0, 0 }, { DSV4_WFMT_FP4, 160, 96, 5, 1, 0 },
                             { DSV4_WFMT_FP8, 384, 256, 1, 0, 10 },            { DSV4_WFMT_BF16, 96, 64, 3, 1, 10 },
                             { DSV4_WFMT_F32, 33, 17, 2, 0, 10 },               { DSV4_WFMT_FP8, F->d_model, F->d_ff, 2, 0, 10 } };
    for (size_t s = 0; s < sizeof(cases) / sizeof(cases[0]); s++) {
        enum dsv4_wfmt fmt = (enum dsv4_wfmt)cases[s][0];
        int d = cases[s][1], f = cases[s][2], n = cases[s][3], ldx = d + 1, limit = cases[s][5];
        struct dsv4_plan_dims dims = chk_dims();
        dims.max_rows = n, dims.d_model = d, dims.d_ff_exp = f;
        chk_case(h, &dims, "%s d %d f %d, %d rows%s, limit %d%s", dsv4_wfmt_name(fmt), d, f, n,
                 cases[s][4] ? ", weighted" : "", limit, cases[s][6] ? ", block 32" : "");
        struct dsv4_expert_w e;
        make_expert(h, &e, fmt, d, f, cases[s][6]);
        struct dsv4_linear *ws[] = { &e.w1, &e.w3, &e.w2 };
        chk_weights(h, ws, 3);
        float *x = chk_floats(h, (size_t)n * ldx), *rw = cases[s][4] ? chk_floats(h, (size_t)n) : NULL;
        chk_fill_bf16(h, x, (size_t)n * ldx, 4.0f);
        for (int i = 0; rw && i < n; i++) rw[i] = 0.2f + 0.5f * (float)fabs(chk_uniform(h));
        for (struct dsv4_backend *be; (be = chk_next(h));) {
            float *y = chk_out_f32(h, 0, (size_t)n * d, EXPERT_TOL, NULL, NULL);
            be->ops->expert(be, &e, n, chk_in(h, x), ldx, chk_in(h, rw), limit, y,
                            chk_work(h, sizeof(float) * 2 * (size_t)n * f));
        }
    }
}

struct experts_case {
    const char    *what;
    enum dsv4_wfmt fmt;
    int            d, f, n_exp, n_groups, ids[4], off[5], limit;
    int            block; /* FP8 block / activation group: 0 (128, V4) or 32 (V4.1) */
};

/* The group table `moe_dispatch` would write (backend.h): the count, the used experts' ids
 * (-1 past them), their first pairs (the pair count past them). */
static int *group_table(struct chk *h, int n_exp, int n_groups, const int *ids, const int *off)
{
    int *grp = chk_alloc(h, sizeof(int) * (2 * (size_t)n_exp + 2));
    grp[0]   = n_groups;
    for (int g = 0; g < n_exp; g++) grp[1 + g] = g < n_groups ? ids[g] : -1;
    for (int g = 0; g <= n_exp; g++) grp[1 + n_exp + g] = off[g < n_groups ? g : n_groups];
    return grp;
}

static void run_experts(struct chk *h)
{
    const struct chk_model *A = &chk_models[0], *F = &chk_models[2];
    /* groups of 1 row (GEMV), 3, 17 (the bf16 GEMM from 6 / 12 rows) and 60 (tiles' GEMM) */
    const struct experts_case cases[] = {
        { "tiny", DSV4_WFMT_FP4, A->d_model, A->d_ff, A->n_exp, 3, { 5, 0, 7 }, { 0, 1, 4, 21 }, 10, 0 },
        { "tiny", DSV4_WFMT_FP4, A->d_model, A->d_ff, A->n_exp, 2, { 2, 3 }, { 0, 60, 64 }, 0, 0 },
        { "tiny fp8 experts", DSV4_WFMT_FP8, A->d_model, A->d_ff, A->n_exp, 2, { 1, 6 }, { 0, 3, 10 }, 10, 0 },
        { "awkward", DSV4_WFMT_FP4, 160, 96, 3, 3, { 2, 0, 1 }, { 0, 1, 4, 13 }, 0, 0 },
        { "awkward", DSV4_WFMT_BF16, 96, 64, 2, 1, { 1 }, { 0, 7 }, 10, 0 },
        { "flash", DSV4_WFMT_FP4, F->d_model, F->d_ff, F->n_exp, 3, { 200, 7, 255 }, { 0, 1, 3, 9 }, 10, 0 },
        { "v4.1 tiny", DSV4_WFMT_FP4, A->d_model, A->d_ff, A->n_exp, 3, { 5, 0, 7 }, { 0, 1, 4, 21 }, 10, 32 },
        { "v4.1 tiny", DSV4_WFMT_FP4, A->d_model, A->d_ff, A->n_exp, 2, { 2, 3 }, { 0, 60, 64 }, 0, 32 },
        { "v4.1 tiny fp8 experts", DSV4_WFMT_FP8, A->d_model, A->d_ff, A->n_exp, 2, { 1, 6 }, { 0, 3, 10 }, 10, 32 },
    };
    for (size_t s = 0; s < sizeof(cases) / sizeof(cases[0]); s++) {
        const struct experts_case *c = &cases[s];
        int d = c->d, f = c->f, np = c->off[c->n_groups];
        struct dsv4_plan_dims dims = chk_dims();
        dims.max_rows = np, dims.d_model = d, dims.d_ff_exp = f, dims.n_exp = c->n_exp;
        chk_case(h, &dims, "%s %s d %d f %d, %d groups, %d rows, limit %d%s", c->what, dsv4_wfmt_name(c->fmt), d, f,
                 c->n_groups, np, c->limit, c->block ? ", block 32" : "");
        struct dsv4_expert_w *ex = chk_alloc(h, sizeof(*ex) * (size_t)c->n_exp); /* only the used ones have weights */
        struct dsv4_linear   *ws[12];
        for (int g = 0; g < c->n_groups; g++) {
            struct dsv4_expert_w *e = &ex[c->ids[g]];
            make_expert(h, e, c->fmt, d, f, c->block);
            ws[3 * g] = &e->w1, ws[3 * g + 1] = &e->w3, ws[3 * g + 2] = &e->w2;
        }
        chk_weights(h, ws, 3 * c->n_groups);
        float *x = chk_floats(h, (size_t)np * d), *rw = chk_floats(h, (size_t)np);
        int   *grp = group_table(h, c->n_exp, c->n_groups, c->ids, c->off);
        chk_fill_bf16(h, x, (size_t)np * d, 4.0f);
        for (int i = 0; i < np; i++) rw[i] = 0.2f + 0.5f * (float)fabs(chk_uniform(h));
        for (struct dsv4_backend *be; (be = chk_next(h));) {
            float *y = chk_out_f32(h, 0, (size_t)np * d, EXPERT_TOL, NULL, NULL);
            be->ops->experts(be, ex, c->n_exp, np, chk_in(h, grp), chk_in(h, x), chk_in(h, rw), c->limit, y,
                             chk_work(h, sizeof(float) * 2 * (size_t)np * f));
        }
    }
}

/* ------------------------------------------------------------------ dispatch, combine */

/* k distinct experts of n_exp per row. */
static void route_ids(struct chk *h, int *ids, int n, int k, int n_exp)
{
    for (int r = 0; r < n; r++)
        for (int s = 0; s < k; s++) {
            int e, dup;
            do {
                e   = (int)(chk_u64(h) % (uint64_t)n_exp);
                dup = 0;
                for (int j = 0; j < s; j++) dup |= ids[r * k + j] == e;
            } while (dup);
            ids[r * k + s] = e;
        }
}

static const int moe_shapes[][4] = { { 1, 1, 1, 1 }, { 31, 3, 5, 17 }, { 17, 2, 8, 256 }, { 3, 6, 256, 4096 } }; /* n, k, n_exp, d */

static void run_moe_dispatch(struct chk *h)
{
    for (size_t s = 0; s < sizeof(moe_shapes) / sizeof(moe_shapes[0]); s++) {
        int n = moe_shapes[s][0], k = moe_shapes[s][1], ne = moe_shapes[s][2], d = moe_shapes[s][3], np = n * k;
        struct dsv4_plan_dims dims = chk_dims();
        dims.max_rows = n, dims.n_exp_used = k, dims.n_exp = ne, dims.d_model = d;
        chk_case(h, &dims, "n %d, %d of %d experts, d %d", n, k, ne, d);
        int   *ids = chk_alloc(h, sizeof(int) * (size_t)np);
        float *w = chk_floats(h, (size_t)np), *x = chk_floats(h, (size_t)n * d);
        route_ids(h, ids, n, k, ne);
        chk_fill_bf16(h, w, (size_t)np, 1.0f);
        chk_fill_bf16(h, x, (size_t)n * d, 3.0f);
        for (struct dsv4_backend *be; (be = chk_next(h));) {
            float *xe      = chk_out_f32(h, 0, (size_t)np * d, CHK_EXACT, NULL, NULL);
            float *row_w   = chk_out_f32(h, 1, (size_t)np, CHK_EXACT, NULL, NULL);
            int   *pair_of = chk_out_int(h, 2, (size_t)np, NULL);
            int   *grp     = chk_out_int(h, 3, 2 * (size_t)ne + 2, NULL); /* the whole table, tail included */
            be->ops->moe_dispatch(be, n, k, ne, chk_in(h, ids), chk_in(h, w), chk_in(h, x), d, xe, row_w, pair_of, grp);
        }
    }
}

static void run_moe_combine(struct chk *h)
{
    for (size_t s = 0; s < sizeof(moe_shapes) / sizeof(moe_shapes[0]); s++) {
        int n = moe_shapes[s][0], k = moe_shapes[s][1], d = moe_shapes[s][3], np = n * k;
        struct dsv4_plan_dims dims = chk_dims();
        dims.max_rows = n, dims.n_exp_used = k, dims.d_model = d;
        chk_case(h, &dims, "n %d, %d experts a row, d %d", n, k, d);
        int   *pair_of = chk_alloc(h, sizeof(int) * (size_t)np);
        float *ye = chk_floats(h, (size_t)np * d), *shared = chk_floats(h, (size_t)n * d);
        for (int i = 0; i < np; i++) pair_of[i] = i;
        for (int i = np - 1; i > 0; i--) { /* pairs in expert order: any permutation of (row, slot) */
            int j = (int)(chk_u64(h) % (uint64_t)(i + 1)), t = pair_of[i];
            pair_of[i] = pair_of[j], pair_of[j] = t;
        }
        chk_fill_bf16(h, ye, (size_t)np * d, 2.0f);
        chk_fill_bf16(h, shared, (size_t)n * d, 2.0f);
        for (struct dsv4_backend *be; (be = chk_next(h));) {
            float *f = chk_out_f32(h, 0, (size_t)n * d, CHK_EXACT, NULL, NULL);
            be->ops->moe_combine(be, n, k, d, chk_in(h, pair_of), chk_in(h, ye), chk_in(h, shared), f);
        }
    }
}

const struct chk_op chk_ops_moe[] = {
    { DSV4_OP_LINEAR, "2^-7 rel if bf16 out, + 2e-6 x sum|w| max|x|", run_linear },
    { DSV4_OP_ROUTER, "ids: best choice within 1e-5; weights 2e-5 rel; hash ids exact", run_router },
    { DSV4_OP_EXPERT, "2e-2 rel + 1e-4 for 99% of values", run_expert },
    { DSV4_OP_EXPERTS, "2e-2 rel + 1e-4 for 99% of values", run_experts },
    { DSV4_OP_MOE_DISPATCH, "bit-exact", run_moe_dispatch },
    { DSV4_OP_MOE_COMBINE, "bit-exact", run_moe_combine },
    { DSV4_OP_COUNT, NULL, NULL },
};
