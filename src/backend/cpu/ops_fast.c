/*
 * ops_fast.c - the optimised CPU op table: the reference's numerics (same rounding points),
 * f32 accumulation on the level's SIMD kernels, work split over the engine's thread pool.
 *
 * What is parallel and how:
 *   linear      output rows across threads; activations quantised once by the caller
 *   attention   bf16 levels: rows decoded to bf16 in pairs (threads over row pairs), then
 *               pairs of 16-head groups over the threads (x86_avx512bf16_attn.c); other
 *               levels: f32 rows decoded once, scores and P.V threads over heads
 *   indexer     keys across threads (bf16 levels: blocks of 12 keys, heads in lanes)
 *   hc_*        the mix projections through the SIMD dot product, then rows in parallel
 *   row ops     RMSNorm, per-head RMS, RoPE, Hadamard, FP8/FP4 simulation and SwiGLU: rows
 *               in parallel on the level's SIMD kernels with the reference's bits
 *               (simd_rows.inc: avx2, avx512, neon); scalar: the reference's code
 *   data ops    embed, scale, add_streams, moe_combine: ops_data.c's arithmetic on the
 *               level's kernels, rows over threads; the rest of ops_data.c as it is
 * The router and the expert/compressor glue reuse the reference code (O(d) per row); their
 * projections go through fast linear.
 *
 * Scratch (dsv4_backend.scratch), sized by dsv4_cpu_scratch_floats: the dequantised
 * activations of the current projection at its start ([n_tok, n_in]), then GEMM panels; the
 * current query's attention buffers at its end (f32 rows and scores, or the bf16 layouts of
 * struct dsv4_attn_bf16), or the indexer's query panel and per-thread key blocks; the size
 * covers each at its largest, so the two ends never overlap.
 */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/fp4_exact.h"
#include "backend/cpu/ops_data.h"
#include "backend/cpu/ref.h"
#include "backend/cpu/ref_num.h"

static int imax(int a, int b)
{
    return a > b ? a : b;
}

static int max_in(const struct dsv4_plan_dims *c)
{
    int m = imax(imax(c->d_model, c->q_lora_rank), imax(c->n_head * c->d_head / c->o_groups, c->o_groups * c->o_lora_rank));
    return imax(imax(m, c->wide_in), imax(c->d_ff_exp, c->d_idx_head));
}

static size_t attn_bf16_floats(int n_head, int d_head, int n_rows);

/* Row stride of the f32 activations the kernels read (xq below). The GEMM of
 * simd_kernels.inc sweeps 1 KiB of each of 24 token rows at a time; with a stride that is a
 * multiple of 4 KiB (any width a multiple of 1024) all those lines fall in the same 16 of the
 * L1's 64 sets, 24 rows for 8 ways, and every activation load went to L2. An odd multiple of
 * 256 floats puts consecutive rows a quarter of the sets apart: 6 rows a set. */
static int act_ld(int K)
{
    if (K < 512) return K;
    int m = (K + 255) / 256;
    return (m | 1) * 256;
}

/* The stride of rows in the avx2-int sub-level's exact-sum layout (fp4_exact.h), padded alike. */
static int act_ld_x(int K)
{
    return act_ld((int)dsv4_fp4x_floats(K));
}

/* Whether an FP4 projection on quantised activations takes the avx2-int layout and kernels:
 * e8m0 scales (the layout's block scale table) and whole 32-blocks. */
static bool use_fp4x(const struct dsv4_cpu *cpu, const struct dsv4_linear *w, bool quant)
{
    return cpu->k->quant_fp4x && quant && w->fmt == DSV4_WFMT_FP4 && !w->scale_f32 && w->n_in % 32 == 0;
}

/* The f32 kernels a projection runs on: the level's table, except that on avx2-int an FP4
 * projection outside use_fp4x takes the avx2 level's own dot_fp4 (the table's reads the
 * layout). */
static const struct dsv4_kernels *f32_kernels(const struct dsv4_cpu *cpu, const struct dsv4_linear *w, bool quant)
{
    return cpu->k->quant_fp4x && !use_fp4x(cpu, w, quant) ? dsv4_cpu_kernels(cpu->level) : cpu->k;
}

/* What the reference ops take: a dequantised weight row and its activation scales, one
 * query's scores and a decoded row, an indexer key. */
static size_t ref_scratch_floats(const struct dsv4_plan_dims *c)
{
    size_t lin = (size_t)max_in(c), sc = lin + lin / 32 + 2; /* activation groups of 32 at least */
    size_t att = (size_t)c->n_head * (size_t)c->max_attn_rows + (size_t)c->d_head;
    if (att > sc) sc = att;
    if ((size_t)c->d_idx_head > sc) sc = (size_t)c->d_idx_head;
    return sc;
}

static size_t fast_scratch_floats(const struct dsv4_plan_dims *c, int n_threads, bool fp4x)
{
    /* the MTP block projects hc streams per row (h_proj); the grouped experts hold every
     * (token, expert) pair; GEMM panels: DSV4_GEMM_PANEL rows of bf16 per thread */
    size_t rows  = (size_t)c->max_rows * (size_t)c->hc;
    size_t pairs = (size_t)c->max_rows * (size_t)c->n_exp_used;
    if (pairs > rows) rows = pairs;
    size_t x     = rows * (size_t)(fp4x ? act_ld_x(max_in(c)) : act_ld(max_in(c))) + (size_t)(n_threads > 0 ? n_threads : 1) * (DSV4_GEMM_PANEL / 2 + 1) * (size_t)max_in(c) + 64;
    size_t attn = (size_t)c->max_attn_rows * (size_t)(c->d_head + c->n_head) + 64;
    size_t ab   = attn_bf16_floats(c->n_head, c->d_head, c->max_attn_rows);
    if (ab > attn) attn = ab;
    /* the indexer's bf16 query panel and per-thread buffers (scores and keys of one block) */
    size_t ix = (size_t)(c->n_idx_head + 15) / 16 * 8 * (size_t)c->d_idx_head
              + (size_t)(n_threads > 0 ? n_threads : 1) * ((size_t)dsv4_idx_bf16_s_floats(c->n_idx_head, c->d_idx_head) + 16) + 64;
    if (ix > attn) attn = ix;
    return x + attn;
}

size_t dsv4_cpu_scratch_floats(const struct dsv4_plan_dims *dims, int n_threads, bool fp4x)
{
    size_t r = ref_scratch_floats(dims), f = fast_scratch_floats(dims, n_threads, fp4x);
    /* the row lists of attention and the indexer go in front of the kernels' own */
    return dsv4_cpu_data_scratch_floats(dims) + (r > f ? r : f);
}

/* Token count from which projections take the panel GEMM path instead of the GEMV one
 * (both give the same bits). Measured with `dsv4 bench --threads 1 --gemm M,2048,4096,FMT`:
 * FP8 and BF16 gain from 6 tokens (e4m3 decoding is the GEMV's cost, done once per panel);
 * FP4's table decoding is cheap enough that the GEMV keeps up to about 12. */
static int gemm_min_tokens(enum dsv4_wfmt fmt)
{
    return dsv4_cpu_gemm_min_tokens(fmt, false); /* the numbers: cpu.h, so dsv4 ops prints these */
}

/* The same for weights held as interleaved tiles (x86_avx512bf16_i16.c), where the GEMV
 * decodes each tile once per pass of up to 12 tokens (4 below 5 tokens) and the GEMM once
 * into a panel for all of them. One thread, 2048 x 4096 (dsv4 bench --threads 1 --gemm
 * M,2048,4096,FMT,i16), GFLOP/s GEMV / GEMM: FP8 at 12 tokens 332 / 262, 24: 334 / 332,
 * 48: 317 / 377; FP4 at 12: 411 / 278, 24: 410 / 358, 48: 403 / 394, 64: 392 / 412. BF16
 * has nothing to decode and the GEMV stays as fast up to hundreds of tokens. */
static int i16_gemm_min_tokens(enum dsv4_wfmt fmt)
{
    return dsv4_cpu_gemm_min_tokens(fmt, true);
}

static struct dsv4_cpu *cpu_of(struct dsv4_backend *be)
{
    return be->impl;
}

/* ------------------------------------------------------------------ linear */

struct lin_job {
    const struct dsv4_kernels *k;
    const struct dsv4_linear  *w;
    int                        nt, ldx, ldy;
    const float               *x;
    const uint16_t            *xb; /* bf16 activations (bf16 kernels) or NULL */
    float                     *y;
    enum dsv4_out              out;
    uint16_t                  *panels; /* per-thread GEMM panels, or NULL (GEMV kernels) */
    size_t                     panel_len;
    bool                       i16; /* the weights' interleaved tiles (w->prep) */
    int                        gmin; /* the f32 kernels' GEMM crossover (dsv4_cpu_f32_gemm_min) */
};

/* Whether a projection runs on its interleaved tiles at this level. */
static bool use_i16(const struct dsv4_cpu *cpu, const struct dsv4_linear *w)
{
    return w->prep && cpu->kb && cpu->kb->dotb_i16 && w->row_off % 16 == 0;
}

static void lin_rows(void *ctx, int64_t o0, int64_t o1, int tid)
{
    (void)tid;
    struct lin_job *j = ctx;
    if (j->i16) {
        if (j->panels)
            j->k->gemmb_i16(j->w, (int)o0, (int)o1, j->nt, j->xb, j->ldx, j->y, j->ldy, j->panels + (size_t)tid * j->panel_len);
        else j->k->dotb_i16(j->w, (int)o0, (int)o1, j->nt, j->xb, j->ldx, j->y, j->ldy);
    } else if (j->panels) {
        j->k->gemmb(j->w, (int)o0, (int)o1, j->nt, j->xb, j->ldx, j->y, j->ldy, j->panels + (size_t)tid * j->panel_len);
    } else if (j->xb) {
        switch (j->w->fmt) {
        case DSV4_WFMT_FP8: j->k->dotb_fp8(j->w, (int)o0, (int)o1, j->nt, j->xb, j->ldx, j->y, j->ldy); break;
        case DSV4_WFMT_FP4: j->k->dotb_fp4(j->w, (int)o0, (int)o1, j->nt, j->xb, j->ldx, j->y, j->ldy); break;
        default: j->k->dotb_bf16(j->w, (int)o0, (int)o1, j->nt, j->xb, j->ldx, j->y, j->ldy); break;
        }
    } else switch (j->w->fmt) {
    case DSV4_WFMT_FP8: j->k->dot_fp8(j->w, (int)o0, (int)o1, j->nt, j->x, j->ldx, j->y, j->ldy, j->gmin); break;
    case DSV4_WFMT_FP4: j->k->dot_fp4(j->w, (int)o0, (int)o1, j->nt, j->x, j->ldx, j->y, j->ldy, j->gmin); break;
    case DSV4_WFMT_BF16: j->k->dot_bf16(j->w, (int)o0, (int)o1, j->nt, j->x, j->ldx, j->y, j->ldy, j->gmin); break;
    case DSV4_WFMT_F32: j->k->dot_f32(j->w, (int)o0, (int)o1, j->nt, j->x, j->ldx, j->y, j->ldy, j->gmin); break;
    }
    if (j->out == DSV4_OUT_BF16)
        for (int t = 0; t < j->nt; t++) {
            float *yr = j->y + (size_t)t * (size_t)j->ldy;
            for (int64_t o = o0; o < o1; o++) {
                /* round to nearest even bf16 (finite values: no NaN handling needed) */
                uint32_t u;
                memcpy(&u, &yr[o], 4);
                u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
                memcpy(&yr[o], &u, 4);
            }
        }
}

/* v rounded to the nearest e4m3 value, ties to even, saturating at 448: the value the
 * codec (dsv4_e4m3_from_f32, tested exhaustively) gives, computed on the float's bits. */
static inline float e4m3_round(float v)
{
    float a = fabsf(v), r;
    if (a < 0x1p-6f) {
        r = rintf(a * 512.0f) * (1.0f / 512.0f); /* subnormals: multiples of 2^-9 */
    } else {
        uint32_t u;
        memcpy(&u, &a, 4);
        u = (u + 0x7ffffu + ((u >> 20) & 1u)) & 0xfff00000u; /* 3 mantissa bits, ties to even */
        memcpy(&r, &u, 4);
    }
    return copysignf(fminf(r, 448.0f), v);
}

/* Quantises one row to e4m3 per group of B and writes the dequantised (exact) values. */
static void quantise_row(const float *xr, int n_in, int B, float *qr)
{
    for (int b = 0; b < n_in; b += B) {
        int   e    = b + B < n_in ? b + B : n_in;
        float amax = 0;
        for (int k = b; k < e; k++) {
            float a = fabsf(xr[k]);
            amax    = a > amax ? a : amax; /* fmaxf's rule (a NaN leaves amax), without the libm call */
        }
        float s = dsv4_act_scale(amax, 448.0f, 1e-4f), inv = 1.0f / s; /* s is a power of two */
        for (int k = b; k < e; k++) qr[k] = e4m3_round(xr[k] * inv) * s;
    }
}

/*
 * Activations of a projection as its kernels read them, rows in parallel: quantised to
 * e4m3 per group of w->block (FP8/FP4 weights) or as they are, as f32 rows into xq or, on the bf16
 * levels, straight to bf16 rows into xb. x is never the scratch these are written to.
 */
struct prep_job {
    const struct dsv4_kernels *k, *kb;
    const float               *x;
    int                        ldx, K, ldq; /* ldq: act_ld(K), the stride of xq */
    int                        B;           /* the activation group (w->block) */
    bool                       quant;
    bool                       fp4x; /* write the avx2-int layout (quant_fp4x), stride ldq = act_ld_x(K) */
    float                     *xq;
    uint16_t                  *xb;
};

static void prep_rows(void *ctx, int64_t t0, int64_t t1, int tid)
{
    (void)tid;
    const struct prep_job *J = ctx;
    for (int64_t t = t0; t < t1; t++) {
        const float *xr = J->x + (size_t)t * (size_t)J->ldx;
        if (J->xb) {
            uint16_t *br = J->xb + (size_t)t * (size_t)J->K;
            if (J->quant) J->kb->quant_bf16(xr, J->K, J->B, br);
            else J->kb->to_bf16(xr, J->K, br);
        } else {
            float *qr = J->xq + (size_t)t * (size_t)J->ldq;
            if (J->fp4x) J->k->quant_fp4x(xr, J->K, J->B, qr);
            else if (J->quant && J->k->quant_f32) J->k->quant_f32(xr, J->K, J->B, qr);
            else if (J->quant) quantise_row(xr, J->K, J->B, qr);
            else memcpy(qr, xr, sizeof(float) * (size_t)J->K);
        }
    }
}

/* n rows of x into xq (the start of the scratch), quantised in groups of qb (0: as they
 * are): bf16 rows of K when kb is given (*xb set), else f32 rows of stride act_ld(K) (*xb
 * NULL), or with fp4x (quantised, no kb) rows in the avx2-int layout of stride act_ld_x(K). */
static void prepare_rows(struct dsv4_cpu *cpu, const struct dsv4_kernels *kb, const float *x, int ldx, int n, int K,
                         int qb, bool fp4x, float *xq, uint16_t **xb)
{
    struct prep_job J = { .k = cpu->k, .kb = kb, .x = x, .ldx = ldx, .K = K, .ldq = fp4x ? act_ld_x(K) : act_ld(K),
                          .quant = qb > 0, .B = qb, .fp4x = fp4x, .xq = xq, .xb = kb ? (uint16_t *)(void *)xq : NULL };
    /* about 8 KiB of input a thread at least: the split costs more below that */
    dsv4_pool_for(cpu->pool, n, 1, 1 + 2048 / K, prep_rows, &J);
    *xb = J.xb;
}

static void fast_linear(struct dsv4_backend *be, const struct dsv4_linear *w, int n_tok, const float *x, int ldx,
                        float *y, int ldy, enum dsv4_act act, enum dsv4_out out)
{
    struct dsv4_cpu *cpu = cpu_of(be);
    bool             x4  = use_fp4x(cpu, w, act == DSV4_ACT_FP8);
    struct lin_job   j   = { .k    = f32_kernels(cpu, w, act == DSV4_ACT_FP8), .w = w, .nt = n_tok, .ldx = ldx,
                             .ldy = ldy, .x = x, .y = y, .out = out, .gmin = dsv4_cpu_f32_gemm_min(cpu, w->fmt) };
    float           *xq  = be->scratch; /* the start of the scratch (see the file header) */
    DSV4_ASSERT(be->scratch_len >= (size_t)n_tok * (size_t)(x4 ? act_ld_x(w->n_in) : act_ld(w->n_in)));
    bool bf = cpu->kb && w->fmt != DSV4_WFMT_F32;
    if (act == DSV4_ACT_FP8 || bf) {
        /* an F32 projection on a bf16 level reads f32 activations (quantised or not) */
        uint16_t *xb;
        prepare_rows(cpu, bf ? cpu->kb : NULL, x, ldx, n_tok, w->n_in, act == DSV4_ACT_FP8 ? w->block : 0, x4, xq,
                     &xb);
        j.x   = xq;
        j.ldx = bf ? w->n_in : x4 ? act_ld_x(w->n_in) : act_ld(w->n_in);
        if (xb) {
            j.k  = cpu->kb;
            j.xb = xb;
        }
    }
    j.i16 = bf && use_i16(cpu, w);
    if (bf) {
        /* many tokens: dequantise weight panels once and sweep them with every token */
        if (j.i16 ? n_tok >= i16_gemm_min_tokens(w->fmt)
                  : n_tok >= gemm_min_tokens(w->fmt) && cpu->kb->gemmb && !w->scale_f32 && w->n_in % 32 == 0) {
            j.panel_len = (size_t)DSV4_GEMM_PANEL * (size_t)w->n_in;
            size_t off  = ((size_t)n_tok * (size_t)w->n_in + 31) / 2 + 16; /* floats after the bf16 x */
            DSV4_ASSERT(be->scratch_len >= off + (size_t)cpu->n_threads * j.panel_len / 2 + 16);
            j.panels = (uint16_t *)(void *)(be->scratch + off);
        }
    }
    /* row ranges: whole panels for the GEMMs, whole 16-row groups for the tile GEMV */
    dsv4_pool_for(cpu->pool, w->n_out, j.panels ? DSV4_GEMM_PANEL : j.i16 ? 16 : 4, 16, lin_rows, &j);
}

/* ------------------------------------------------------------------ grouped experts */

/*
 * All routed experts of a layer in three parallel phases (fewer, bigger jobs than one
 * projection at a time, so two threads share every expert's rows):
 *   1. gate and up projections of every (expert, token) pair: 16-row tiles of w1 and w3 of
 *      every used expert, spread over the threads;
 *   2. SwiGLU with the clamp and the routing weight, rounded to bf16 and quantised (per pair);
 *   3. the down projections, 16-row tiles of every used expert's w2.
 * Numerics are those of `expert` (same kernels, same rounding points).
 */
struct exp_job {
    struct dsv4_cpu            *cpu;
    const struct dsv4_expert_w *experts;
    const int                  *ids, *off, *tile_off; /* tile_off: [n_groups + 1] first tile of each group */
    int                         n_groups, phase, d, f, tiles_per_mat;
    int                         tile_rows; /* 16, or 64 on interleaved tiles (4 groups: independent sums) */
    bool                        fp4x;      /* xq in the avx2-int layout (use_fp4x) */
    const float                *xq;   /* f32 kernels: dequantised activations [n_pairs, K] */
    const uint16_t             *xb;   /* bf16 kernels: the same as bf16 */
    float                      *out;  /* phase 1: g then v ([2][n_pairs, f]); phase 3: y [n_pairs, d] */
    size_t                      n_pairs;
    uint16_t                   *panels;
    size_t                      panel_len;
};

static void exp_tiles(void *ctx, int64_t t0, int64_t t1, int tid)
{
    struct exp_job *J = ctx;
    int             g = 0;
    for (int64_t tile = t0; tile < t1; tile++) {
        while (tile >= J->tile_off[g + 1]) g++;
        int                       local = (int)(tile - J->tile_off[g]);
        const struct dsv4_expert_w *e   = &J->experts[J->ids[g]];
        const struct dsv4_linear   *w;
        int                        mat = 0, ldy, K;
        if (J->phase == 1) {
            mat = local / J->tiles_per_mat;
            w   = mat ? &e->w3 : &e->w1;
            ldy = J->f;
            K   = J->d;
        } else {
            w   = &e->w2;
            ldy = J->d;
            K   = J->f;
        }
        int   row0 = (local % J->tiles_per_mat) * J->tile_rows;
        int   row1 = row0 + J->tile_rows < w->n_out ? row0 + J->tile_rows : w->n_out;
        int   nt   = J->off[g + 1] - J->off[g];
        float *y   = J->out + (size_t)mat * J->n_pairs * (size_t)ldy + (size_t)J->off[g] * (size_t)ldy;
        const struct dsv4_kernels *k = J->fp4x ? J->cpu->k : f32_kernels(J->cpu, w, false);
        if (J->xb && use_i16(J->cpu, w)) {
            const uint16_t *x = J->xb + (size_t)J->off[g] * (size_t)K;
            if (nt >= i16_gemm_min_tokens(w->fmt))
                J->cpu->kb->gemmb_i16(w, row0, row1, nt, x, K, y, ldy, J->panels + (size_t)tid * J->panel_len);
            else J->cpu->kb->dotb_i16(w, row0, row1, nt, x, K, y, ldy);
        } else if (J->xb) {
            const uint16_t *x = J->xb + (size_t)J->off[g] * (size_t)K;
            if (nt >= gemm_min_tokens(w->fmt) && J->cpu->kb->gemmb && !w->scale_f32 && K % 32 == 0)
                J->cpu->kb->gemmb(w, row0, row1, nt, x, K, y, ldy, J->panels + (size_t)tid * J->panel_len);
            else if (w->fmt == DSV4_WFMT_FP8) J->cpu->kb->dotb_fp8(w, row0, row1, nt, x, K, y, ldy);
            else if (w->fmt == DSV4_WFMT_FP4) J->cpu->kb->dotb_fp4(w, row0, row1, nt, x, K, y, ldy);
            else J->cpu->kb->dotb_bf16(w, row0, row1, nt, x, K, y, ldy);
        } else {
            int          ldq  = J->fp4x ? act_ld_x(K) : act_ld(K), gmin = dsv4_cpu_f32_gemm_min(J->cpu, w->fmt);
            const float *x    = J->xq + (size_t)J->off[g] * (size_t)ldq;
            if (w->fmt == DSV4_WFMT_FP8) k->dot_fp8(w, row0, row1, nt, x, ldq, y, ldy, gmin);
            else if (w->fmt == DSV4_WFMT_FP4) k->dot_fp4(w, row0, row1, nt, x, ldq, y, ldy, gmin);
            else if (w->fmt == DSV4_WFMT_BF16) k->dot_bf16(w, row0, row1, nt, x, ldq, y, ldy, gmin);
            else k->dot_f32(w, row0, row1, nt, x, ldq, y, ldy, gmin);
        }
        for (int t = 0; t < nt; t++)
            for (int o = row0; o < row1; o++) {
                float   *p = &y[(size_t)t * (size_t)ldy + (size_t)o];
                uint32_t u;
                memcpy(&u, p, 4);
                u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u; /* bf16 output */
                memcpy(p, &u, 4);
            }
    }
}


/* Phase 2 of the grouped experts, pairs in parallel: g[p] = bf16(w[p] * silu(min(g, limit))
 * * clamp(v, limit)), the reference expert's rounding points. */
struct swiglu_job {
    const struct dsv4_kernels *k;
    float                     *g;
    const float               *v, *row_w;
    int                        f;
    double                     limit;
};

static void swiglu_rows(void *ctx, int64_t p0, int64_t p1, int tid)
{
    (void)tid;
    const struct swiglu_job *J = ctx;
    for (int64_t p = p0; p < p1; p++) {
        if (J->k->swiglu_bf16) {
            size_t k = (size_t)p * (size_t)J->f;
            J->k->swiglu_bf16(J->g + k, J->v + k, J->f, J->row_w ? J->row_w[p] : 1.0f, J->limit);
            continue;
        }
        for (int i = 0; i < J->f; i++) {
            size_t k  = (size_t)p * (size_t)J->f + (size_t)i;
            double gg = J->g[k], vv = J->v[k];
            if (J->limit > 0) {
                vv = fmin(fmax(vv, -J->limit), J->limit);
                gg = fmin(gg, J->limit);
            }
            double h = rf32(rf32(gg * (1.0 / (1.0 + exp(-gg)))) * vv);
            if (J->row_w) h = rf32((double)J->row_w[p] * h);
            J->g[k] = rbf16(h);
        }
    }
}

static void fast_experts(struct dsv4_backend *be, const struct dsv4_expert_w *experts, int n_exp, int n_pairs_max,
                         const int *grp, const float *x, const float *row_w, double limit, float *y, float *scratch)
{
    struct dsv4_cpu *cpu = cpu_of(be);
    /* the group count from the dispatch's table, in this backend's memory (backend.h) */
    int        n_groups = grp[0];
    const int *ids = grp + 1, *off = grp + 1 + n_exp;
    DSV4_ASSERT(n_groups >= 0 && n_groups <= n_exp && n_exp <= DSV4_MAX_EXPERTS && off[n_groups] <= n_pairs_max);
    if (n_groups < 1) return;
    const struct dsv4_expert_w *e0 = &experts[ids[0]];
    if (e0->w1.fmt == DSV4_WFMT_F32) { /* no such checkpoints: keep the simple path */
        dsv4_ref_experts(be, experts, n_exp, n_pairs_max, grp, x, row_w, limit, y, scratch);
        return;
    }
    int    d = e0->w1.n_in, f = e0->w1.n_out, n_pairs = off[n_groups];
    bool   quant = e0->w1.fmt == DSV4_WFMT_FP8 || e0->w1.fmt == DSV4_WFMT_FP4;
    bool   x4    = use_fp4x(cpu, &e0->w1, quant) && use_fp4x(cpu, &e0->w2, quant);
    int    tile_off[DSV4_MAX_EXPERTS + 1];
    /* scratch: activations [n_pairs, max(d, f)] floats at the start, GEMM panels after */
    size_t xlen = (size_t)n_pairs * (size_t)(x4 ? act_ld_x(d > f ? d : f) : act_ld(d > f ? d : f));
    size_t plen = (size_t)DSV4_GEMM_PANEL * (size_t)(d > f ? d : f);
    DSV4_ASSERT(be->scratch_len >= xlen + (size_t)cpu->n_threads * plen / 2 + 32);
    float *xq = be->scratch;
    struct exp_job J = { .cpu = cpu, .experts = experts, .ids = ids, .off = off, .tile_off = tile_off,
                         .n_groups = n_groups, .d = d, .f = f, .n_pairs = (size_t)n_pairs,
                         .panels = (uint16_t *)(void *)(be->scratch + xlen + 16), .panel_len = plen };
    uint16_t *xb;
    /* phase 1: gate and up */
    prepare_rows(cpu, cpu->kb, x, d, n_pairs, d, quant ? e0->w1.block : 0, x4, xq, &xb);
    J.fp4x = x4;
    J.phase = 1;
    /* on interleaved tiles a job covers 64 rows: the GEMV then keeps four independent sums in
     * flight (16 rows were one dependent chain per token) and the GEMM two 32-row panels */
    J.tile_rows     = use_i16(cpu, &e0->w1) ? 64 : 16;
    J.tiles_per_mat = (f + J.tile_rows - 1) / J.tile_rows;
    J.xq = xq, J.xb = xb, J.out = scratch;
    for (int g = 0; g <= n_groups; g++) tile_off[g] = g * 2 * J.tiles_per_mat;
    dsv4_pool_for(cpu->pool, tile_off[n_groups], 1, 1, exp_tiles, &J);
    /* phase 2: h = silu(min(g, limit)) * clamp(v) * w, bf16 (as the reference expert) */
    float *gbuf = scratch;
    struct swiglu_job S = { .k = cpu->k, .g = gbuf, .v = scratch + (size_t)n_pairs * (size_t)f, .row_w = row_w, .f = f, .limit = limit };
    dsv4_pool_for(cpu->pool, n_pairs, 1, 1 + 4096 / f, swiglu_rows, &S);
    /* phase 3: down */
    prepare_rows(cpu, cpu->kb, gbuf, f, n_pairs, f, quant ? e0->w2.block : 0, x4, xq, &xb);
    J.phase = 3;
    J.tiles_per_mat = (d + J.tile_rows - 1) / J.tile_rows;
    J.xq = xq, J.xb = xb, J.out = y;
    for (int g = 0; g <= n_groups; g++) tile_off[g] = g * J.tiles_per_mat;
    dsv4_pool_for(cpu->pool, tile_off[n_groups], 1, 1, exp_tiles, &J);
}

/* One expert over n rows (the shared expert): the reference's steps, with the projections on
 * fast linear and SwiGLU rows in parallel (row_w NULL: no routing weight, as a weight of 1). */
static void fast_expert(struct dsv4_backend *be, const struct dsv4_expert_w *e, int n, const float *x, int ldx,
                        const float *row_w, double limit, float *y, float *scratch)
{
    struct dsv4_cpu *cpu = cpu_of(be);
    if (e->w1.fmt == DSV4_WFMT_F32) {
        dsv4_ref_expert(be, e, n, x, ldx, row_w, limit, y, scratch);
        return;
    }
    int           f   = e->w1.n_out;
    float        *g   = scratch, *v = scratch + (size_t)n * (size_t)f;
    enum dsv4_act act = (e->w1.fmt == DSV4_WFMT_FP8 || e->w1.fmt == DSV4_WFMT_FP4) ? DSV4_ACT_FP8 : DSV4_ACT_NONE;
    be->ops->linear(be, &e->w1, n, x, ldx, g, f, act, DSV4_OUT_BF16); /* be->ops: seen by the profiler */
    be->ops->linear(be, &e->w3, n, x, ldx, v, f, act, DSV4_OUT_BF16);
    struct swiglu_job S = { .k = cpu->k, .g = g, .v = v, .row_w = row_w, .f = f, .limit = limit };
    dsv4_pool_for(cpu->pool, n, 1, 1 + 4096 / f, swiglu_rows, &S);
    be->ops->linear(be, &e->w2, n, g, f, y, e->w2.n_out, act, DSV4_OUT_BF16);
}

/* ------------------------------------------------------------------ attention */

struct attn_job {
    struct dsv4_backend      *be;
    const uint8_t *const     *rows;
    int                       n_rows, d_head, d_rope;
    enum dsv4_row_fmt         fmt;
    const float              *q, *sink;
    float                     scale;
    float                    *kbuf, *sbuf, *o;
    float                     den[1024]; /* softmax denominators (sink included); config allows <= 1024 heads */
};

static void attn_decode(void *ctx, int64_t t0, int64_t t1, int tid)
{
    (void)tid;
    struct attn_job *j = ctx;
    for (int64_t t = t0; t < t1; t++)
        dsv4_row_decode(j->fmt, j->d_head, j->d_rope, j->rows[t], j->kbuf + (size_t)t * (size_t)j->d_head);
}

/* Rows per block of the head loop: a block of decoded rows (ATTN_RB * d_head floats, 128 KiB
 * at d_head 512) stays in L2 while every head of the thread's range passes over it. Heads
 * outermost would stream all n_rows rows from L3 once per head (V4: 64 heads, 640 rows of
 * 2 KiB at a 2048-token context). Each score and each output sum keeps its order over rows. */
enum { ATTN_RB = 64 };

static void attn_heads(void *ctx, int64_t h0, int64_t h1, int tid)
{
    (void)tid;
    struct attn_job           *j = ctx;
    const struct dsv4_kernels *k = cpu_of(j->be)->k;
    int                        D = j->d_head, n = j->n_rows;
    for (int t0 = 0; t0 < n; t0 += ATTN_RB) {
        int t1 = t0 + ATTN_RB < n ? t0 + ATTN_RB : n;
        for (int64_t h = h0; h < h1; h++) {
            const float *qh = j->q + (size_t)h * (size_t)D;
            float       *sh = j->sbuf + (size_t)h * (size_t)n;
            for (int t = t0; t < t1; t++) sh[t] = k->vdot(qh, j->kbuf + (size_t)t * (size_t)D, D) * j->scale;
        }
    }
    for (int64_t h = h0; h < h1; h++) {
        float *sh = j->sbuf + (size_t)h * (size_t)n, mx = -INFINITY, sum = 0;
        for (int t = 0; t < n; t++) mx = fmaxf(mx, sh[t]);
        for (int t = 0; t < n; t++) {
            float e = expf(sh[t] - mx);
            sum += e;
            sh[t] = dsv4_round_bf16(e);
        }
        j->den[h] = sum + expf(j->sink[h] - mx);
        memset(j->o + (size_t)h * (size_t)D, 0, sizeof(float) * (size_t)D);
    }
    for (int t0 = 0; t0 < n; t0 += ATTN_RB) {
        int t1 = t0 + ATTN_RB < n ? t0 + ATTN_RB : n;
        for (int64_t h = h0; h < h1; h++) {
            const float *sh = j->sbuf + (size_t)h * (size_t)n;
            float       *oh = j->o + (size_t)h * (size_t)D;
            for (int t = t0; t < t1; t++)
                if (sh[t] != 0) k->axpy(oh, sh[t], j->kbuf + (size_t)t * (size_t)D, D);
        }
    }
    for (int64_t h = h0; h < h1; h++) {
        float *oh = j->o + (size_t)h * (size_t)D;
        for (int i = 0; i < D; i++) oh[i] = dsv4_round_bf16(oh[i] / j->den[h]);
    }
}

/* The bf16 path (x86_avx512bf16_attn.c): rows decoded in pairs over the threads, then pairs
 * of 16-head groups over the threads. */
struct attn_bf16_job {
    struct dsv4_attn_bf16      a;
    const struct dsv4_kernels *kb;
};

static void attn_rows_job(void *ctx, int64_t p0, int64_t p1, int tid)
{
    (void)tid;
    const struct attn_bf16_job *J = ctx;
    J->kb->attn_rows(&J->a, (int)p0, (int)p1);
}

static bool attn_bf16_ok(const struct dsv4_cpu *cpu, int d_head, int d_rope, enum dsv4_row_fmt fmt)
{
    return cpu->kb && cpu->kb->attn_rows && d_head % 32 == 0 && (fmt == DSV4_ROW_BF16 || (d_head - d_rope) % 64 == 0);
}

/* Floats of scratch the bf16 attention needs for n_rows rows (layout in cpu.h). */
static size_t attn_bf16_floats(int n_head, int d_head, int n_rows)
{
    size_t G = (size_t)(n_head + 15) / 16, npad = (size_t)(n_rows + DSV4_ATTN_NR - 1) / DSV4_ATTN_NR * DSV4_ATTN_NR;
    size_t D = (size_t)d_head;
    /* kr + vp (bf16), qp (bf16), s (f32), pp (bf16), den, and 64-byte alignment of each */
    return npad * D + G * 8 * D + G * 16 * npad + G * 8 * npad + G * 16 + 6 * 16;
}

static float *align64(float *p)
{
    return (float *)(((uintptr_t)p + 63) & ~(uintptr_t)63);
}

static void attn_heads_job(void *ctx, int64_t u0, int64_t u1, int tid)
{
    (void)tid;
    const struct attn_bf16_job *J = ctx;
    J->kb->attn_heads(&J->a, (int)u0, (int)u1);
}

static void fast_attend_rows(struct dsv4_backend *be, int n_head, int d_head, int d_rope, const float *q,
                             const uint8_t *const *rows, int n_rows, enum dsv4_row_fmt fmt, const float *sink,
                           float scale, float *o)
{
    struct dsv4_cpu *cpu = cpu_of(be);
    DSV4_ASSERT(n_head <= (int)(sizeof(((struct attn_job *)0)->den) / sizeof(float)));
    if (attn_bf16_ok(cpu, d_head, d_rope, fmt)) {
        size_t need = attn_bf16_floats(n_head, d_head, n_rows);
        DSV4_ASSERT(be->scratch_len >= need);
        int    G = (n_head + 15) / 16, npad = (n_rows + DSV4_ATTN_NR - 1) / DSV4_ATTN_NR * DSV4_ATTN_NR;
        size_t D = (size_t)d_head;
        float *f = align64(be->scratch + be->scratch_len - need);
        struct attn_bf16_job J = { .kb = cpu->kb };
        struct dsv4_attn_bf16 *a = &J.a;
        *a = (struct dsv4_attn_bf16){ .n_head = n_head, .d_head = d_head, .d_rope = d_rope, .n_rows = n_rows,
                                      .n_pad = npad, .fmt = fmt, .rows = rows, .q = q, .sink = sink, .scale = scale,
                                      .o = o };
        a->kr  = (uint16_t *)f, f = align64(f + (size_t)npad * D / 2);
        a->vp  = (uint16_t *)f, f = align64(f + (size_t)npad * D / 2);
        a->qp  = (uint16_t *)f, f = align64(f + (size_t)G * 8 * D);
        a->s   = f, f = align64(f + (size_t)G * 16 * (size_t)npad);
        a->pp  = (uint16_t *)f, f = align64(f + (size_t)G * 8 * (size_t)npad);
        a->den = f;
        dsv4_pool_for(cpu->pool, npad / 2, 1, 8, attn_rows_job, &J);
        dsv4_pool_for(cpu->pool, (G + 1) / 2, 1, 1, attn_heads_job, &J);
        return;
    }
    /* decoded rows and scores at the end of the scratch (see the file header) */
    size_t           need = (size_t)n_rows * (size_t)d_head + (size_t)n_head * (size_t)n_rows;
    DSV4_ASSERT(be->scratch_len >= need);
    float           *kbuf = be->scratch + be->scratch_len - need;
    struct attn_job  j    = { .be = be, .rows = rows, .n_rows = n_rows, .d_head = d_head, .d_rope = d_rope, .fmt = fmt,
                              .q = q, .sink = sink, .scale = scale, .kbuf = kbuf,
                              .sbuf = kbuf + (size_t)n_rows * (size_t)d_head, .o = o };
    dsv4_pool_for(cpu->pool, n_rows, 1, 32, attn_decode, &j);
    dsv4_pool_for(cpu->pool, n_head, 1, 1, attn_heads, &j);
}

static void fast_attention(struct dsv4_backend *be, const struct dsv4_step_desc *desc, int n_head, int d_head, int d_rope,
                        const float *q, const struct dsv4_attn_src *src, enum dsv4_row_fmt fmt, const float *sink,
                        float scale, float *o)
{
    dsv4_cpu_attention_with(fast_attend_rows, be, desc, n_head, d_head, d_rope, q, src, fmt, sink, scale, o);
}

/* ------------------------------------------------------------------ indexer */

struct idx_job {
    const struct dsv4_kernels *k;
    int                        n_head, d;
    const float               *q, *w;
    const uint8_t *const      *blocks;
    int                        block_keys;
    float                     *score;
};

static void idx_keys(void *ctx, int64_t j0, int64_t j1, int tid)
{
    (void)tid;
    struct idx_job *J  = ctx;
    int             kb = dsv4_idx_key_bytes(J->d);
    float           key[4096];
    for (int64_t j = j0; j < j1; j++) {
        dsv4_idx_key_decode(J->d, J->blocks[j / J->block_keys] + (size_t)(j % J->block_keys) * (size_t)kb, key);
        float sum = 0;
        for (int h = 0; h < J->n_head; h++) {
            float dot = dsv4_round_bf16(J->k->vdot(J->q + (size_t)h * (size_t)J->d, key, J->d));
            if (dot < 0) dot = 0;
            sum += dsv4_round_bf16(dot * J->w[h]);
        }
        J->score[j] = dsv4_round_bf16(sum);
    }
}

struct idx_bf16_job {
    const struct dsv4_idx_bf16 *x;
    const struct dsv4_kernels  *kb;
    float                      *s;      /* per-thread buffers */
    size_t                      s_len;
};

static void idx_bf16_keys(void *ctx, int64_t b0, int64_t b1, int tid)
{
    struct idx_bf16_job *J = ctx;
    J->kb->idx_keys(J->x, (int)b0, (int)b1, J->s + (size_t)tid * J->s_len);
}

static void fast_scores_rows(struct dsv4_backend *be, int n_head, int d, const float *q, const float *w,
                             const uint8_t *const *blocks, int block_keys, int n_keys, float *score)
{
    DSV4_ASSERT(d <= 4096);
    struct dsv4_cpu *cpu = cpu_of(be);
    if (cpu->kb && cpu->kb->idx_keys && d % 32 == 0) {
        int    nb = (n_keys + DSV4_ATTN_NR - 1) / DSV4_ATTN_NR, G = (n_head + 15) / 16;
        size_t sl = (size_t)dsv4_idx_bf16_s_floats(n_head, d) + 16;
        size_t need = (size_t)G * 8 * (size_t)d + (size_t)cpu->n_threads * sl + 32;
        DSV4_ASSERT(be->scratch_len >= need);
        float *f = align64(be->scratch + be->scratch_len - need);
        struct dsv4_idx_bf16 x = { .n_head = n_head, .d = d, .n_keys = n_keys, .block_keys = block_keys, .q = q, .w = w,
                                   .blocks = blocks, .score = score };
        x.qp = (uint16_t *)f, f = align64(f + (size_t)G * 8 * (size_t)d);
        cpu->kb->idx_query(&x);
        struct idx_bf16_job J = { &x, cpu->kb, f, sl };
        dsv4_pool_for(cpu->pool, nb, 1, 4, idx_bf16_keys, &J);
        return;
    }
    struct idx_job J = { cpu->k, n_head, d, q, w, blocks, block_keys, score };
    dsv4_pool_for(cpu->pool, n_keys, 1, 64, idx_keys, &J);
}

static void fast_indexer_scores(struct dsv4_backend *be, int n_head, int d, const float *q, const float *w,
                                const struct dsv4_kv_rows *keys, int n_keys, float *score)
{
    dsv4_cpu_indexer_scores_with(fast_scores_rows, be, n_head, d, q, w, keys, n_keys, score);
}

/* ------------------------------------------------------------------ row ops */

struct rows_job {
    const struct dsv4_kernels *k;
    float                     *x;
    int                        d, ld, block;
    double                     eps;
};

static void fp4_rows(void *ctx, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    struct rows_job *J = ctx;
    J->k->fp4_sim_rows(J->x + (size_t)r0 * (size_t)J->ld, (int)(r1 - r0), J->d, J->ld);
}

static void fast_fp4_sim(struct dsv4_backend *be, int n, int d, int ld, float *x, int block, bool e4m3_scale)
{
    struct dsv4_cpu *cpu = cpu_of(be);
    /* V4.1's e4m3-scaled groups: the plain-C reference (a compressed row per `ratio` tokens) */
    if (!cpu->k->fp4_sim_rows || block != 32 || d % 32 || e4m3_scale) {
        dsv4_ref_fp4_sim(be, n, d, ld, x, block, e4m3_scale);
        return;
    }
    struct rows_job J = { .k = cpu->k, .x = x, .d = d, .ld = ld };
    dsv4_pool_for(cpu->pool, n, 1, 64, fp4_rows, &J);
}

static void fp8_rows(void *ctx, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    struct rows_job *J = ctx;
    J->k->fp8_sim_rows(J->x + (size_t)r0 * (size_t)J->ld, (int)(r1 - r0), J->d, J->ld, J->block);
}

static void fast_fp8_sim(struct dsv4_backend *be, int n, int d, int ld, float *x, int block)
{
    struct dsv4_cpu *cpu = cpu_of(be);
    if (!cpu->k->fp8_sim_rows || block % 16 || d % block) {
        dsv4_ref_fp8_sim(be, n, d, ld, x, block);
        return;
    }
    struct rows_job J = { .k = cpu->k, .x = x, .d = d, .ld = ld, .block = block };
    dsv4_pool_for(cpu->pool, n, 1, 16, fp8_rows, &J);
}

struct rmsnorm_job {
    const struct dsv4_kernels *k;
    const float               *x;
    const uint16_t            *w;
    int                        d, ldx, ldy;
    double                     eps;
    float                     *y;
};

static void rmsnorm_rows(void *ctx, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const struct rmsnorm_job *J = ctx;
    for (int64_t r = r0; r < r1; r++)
        J->k->rmsnorm_row(J->x + (size_t)r * (size_t)J->ldx, J->d, J->w, J->eps, J->y + (size_t)r * (size_t)J->ldy);
}

static void fast_rmsnorm(struct dsv4_backend *be, int n, int d, const float *x, int ldx, const uint16_t *w, double eps,
                         float *y, int ldy)
{
    struct dsv4_cpu *cpu = cpu_of(be);
    if (!cpu->k->rmsnorm_row) {
        dsv4_ref_rmsnorm(be, n, d, x, ldx, w, eps, y, ldy);
        return;
    }
    struct rmsnorm_job J = { cpu->k, x, w, d, ldx, ldy, eps, y };
    dsv4_pool_for(cpu->pool, n, 1, 1 + 8192 / d, rmsnorm_rows, &J);
}

enum { ROPE_MAX_HALF = 256 };
struct rope_job {
    const struct dsv4_kernels    *k;
    float                        *x;
    const int                    *pos;
    const struct dsv4_rope_table *t;
    int                           n_vec, d_full;
    bool                          inverse;
};

static void rope_rows(void *ctx, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const struct rope_job *J = ctx;
    int    half = J->t->d_rope / 2;
    double c[ROPE_MAX_HALF], s[ROPE_MAX_HALF];
    for (int64_t r = r0; r < r1; r++) {
        /* the angles and their cos / sin exactly as dsv4_ref_rope computes them */
        for (int i = 0; i < half; i++) {
            double ang = rf32((double)J->pos[r] * J->t->freq[i]);
            c[i]       = rf32(cos(ang));
            s[i]       = rf32(sin(ang));
            if (J->inverse) s[i] = -s[i];
        }
        J->k->rope_row(J->x + (size_t)r * (size_t)J->n_vec * (size_t)J->d_full, J->n_vec, J->d_full, J->t->d_rope, c, s);
    }
}

static void fast_rope(struct dsv4_backend *be, int n, int n_vec, int d_full, float *x, const int *pos,
                      const struct dsv4_rope_table *t, bool inverse)
{
    struct dsv4_cpu *cpu = cpu_of(be);
    if (!cpu->k->rope_row || t->d_rope / 2 > ROPE_MAX_HALF) {
        dsv4_ref_rope(be, n, n_vec, d_full, x, pos, t, inverse);
        return;
    }
    struct rope_job J = { cpu->k, x, pos, t, n_vec, d_full, inverse };
    dsv4_pool_for(cpu->pool, n, 1, 1 + 64 / n_vec, rope_rows, &J);
}

static void hadamard_job(void *ctx, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    struct rows_job *J = ctx;
    J->k->hadamard_rows(J->x + (size_t)r0 * (size_t)J->d, (int)(r1 - r0), J->d);
}

static void fast_hadamard(struct dsv4_backend *be, int n, int d, float *x)
{
    struct dsv4_cpu *cpu = cpu_of(be);
    if (!cpu->k->hadamard_rows || d < 8 || d > 4096 || (d & (d - 1))) {
        dsv4_ref_hadamard(be, n, d, x);
        return;
    }
    struct rows_job J = { .k = cpu->k, .x = x, .d = d };
    dsv4_pool_for(cpu->pool, n, 1, 16, hadamard_job, &J);
}

/* Per-head RMS norm with the reference's roundings (dsv4_ref_head_rms). */
static void head_rms_rows(void *ctx, int64_t v0, int64_t v1, int tid)
{
    (void)tid;
    struct rows_job *J = ctx;
    for (int64_t h = v0; h < v1; h++) {
        float *v = J->x + (size_t)h * (size_t)J->d;
        double m = rbf16(J->k->sumsq_bf16(v, J->d) / J->d);
        double e = rbf16(m + J->eps);
        J->k->scale_bf16(v, J->d, rbf16(1.0 / sqrt(e)));
    }
}

static void fast_head_rms(struct dsv4_backend *be, int n, int n_head, int d_head, float *q, double eps)
{
    struct dsv4_cpu *cpu = cpu_of(be);
    if (!cpu->k->sumsq_bf16) {
        dsv4_ref_head_rms(be, n, n_head, d_head, q, eps);
        return;
    }
    struct rows_job J = { .k = cpu->k, .x = q, .d = d_head, .ld = d_head, .eps = eps };
    dsv4_pool_for(cpu->pool, (int64_t)n * n_head, 1, 16, head_rms_rows, &J);
}

/* ------------------------------------------------------------------ hyper-connections */

static double sigmoid(double x)
{
    return 1.0 / (1.0 + exp(-x));
}

struct mix_job {
    const struct dsv4_kernels *k;
    int                        n, hc, d, n_mix;
    const float               *X, *fn;
    float                     *mix; /* [n, n_mix] raw dot products */
};

static void mix_rows(void *ctx, int64_t m0, int64_t m1, int tid)
{
    (void)tid;
    struct mix_job *J  = ctx;
    int             hd = J->hc * J->d;
    for (int r = 0; r < J->n; r++)
        for (int64_t m = m0; m < m1; m++)
            J->mix[(size_t)r * (size_t)J->n_mix + (size_t)m] =
                J->k->vdot(J->X + (size_t)r * (size_t)hd, J->fn + (size_t)m * (size_t)hd, hd);
}

/* mix[n, n_mix] = (X_flat . fn) / rms(X_flat) */
static void fast_mix(struct dsv4_backend *be, int n, int hc, int d, const float *X, const float *fn, int n_mix,
                     double eps, float *mix)
{
    struct dsv4_cpu *cpu = cpu_of(be);
    struct mix_job   J   = { cpu->k, n, hc, d, n_mix, X, fn, mix };
    dsv4_pool_for(cpu->pool, n_mix, 1, 1, mix_rows, &J);
    int hd = hc * d;
    for (int r = 0; r < n; r++) {
        const float *Xr = X + (size_t)r * (size_t)hd;
        float        ss = cpu->k->vdot(Xr, Xr, hd);
        float        rs = (float)(1.0 / sqrt((double)(ss / (float)hd) + eps));
        for (int m = 0; m < n_mix; m++) mix[(size_t)r * (size_t)n_mix + (size_t)m] *= rs;
    }
}

/* The per-row part of hc_pre after the mix (rows in parallel): pre and post weights, the
 * Sinkhorn-normalised combination, and u = bf16(sum_j pre_j X_j). */
struct hc_pre_job {
    const struct dsv4_kernels *k;
    int                        r0, hc, d, iters;
    const float               *mixbuf, *X, *scale, *base;
    double                     hc_eps;
    float                     *lag, *u, *post, *comb;
};

/* u = bf16(sum_j w_j X_j) on the level's kernels (f32 products and sums, as before). */
static void hc_collapse_row(const struct dsv4_kernels *k, int hc, int d, const float *w, const float *Xr, float *ur)
{
    for (int i = 0; i < d; i++) ur[i] = w[0] * Xr[i];
    for (int j = 1; j < hc; j++) k->axpy(ur, w[j], Xr + (size_t)j * (size_t)d, d);
    for (int i = 0; i < d; i++) ur[i] = dsv4_round_bf16(ur[i]);
}

static void hc_pre_rows(void *ctx, int64_t a, int64_t b, int tid)
{
    (void)tid;
    const struct hc_pre_job *J = ctx;
    int hc = J->hc, d = J->d, n_mix = (2 + hc) * hc;
    const float *scale = J->scale, *base = J->base;
    for (int64_t r = J->r0 + a; r < J->r0 + b; r++) {
        const float *Xr    = J->X + (size_t)r * (size_t)hc * (size_t)d;
        float       *ur    = J->u + (size_t)r * (size_t)d;
        float       *lag_r = J->lag ? J->lag + (size_t)r * (size_t)hc : NULL;
        if (!J->mixbuf) { /* V4.1's final collapse: the lagged mix alone */
            hc_collapse_row(J->k, hc, d, lag_r, Xr, ur);
            continue;
        }
        const float *mix = J->mixbuf + (size_t)(r - J->r0) * (size_t)n_mix;
        double       c[DSV4_MAX_HC * DSV4_MAX_HC];
        float        pre[DSV4_MAX_HC], w[DSV4_MAX_HC];
        for (int j = 0; j < hc; j++) {
            pre[j]              = (float)(sigmoid((double)(mix[j] * scale[0] + base[j])) + J->hc_eps);
            J->post[r * hc + j] = (float)(2.0 * sigmoid((double)(mix[hc + j] * scale[1] + base[hc + j])));
        }
        for (int m = 0; m < hc * hc; m++) c[m] = mix[2 * hc + m] * scale[2] + base[2 * hc + m];
        dsv4_ref_sinkhorn(hc, c, J->iters, J->hc_eps);
        for (int m = 0; m < hc * hc; m++) J->comb[(size_t)r * (size_t)(hc * hc) + (size_t)m] = (float)c[m];
        for (int j = 0; j < hc; j++) { /* lagged (V4.1): collapse with the previous mix, keep this one */
            w[j] = lag_r ? lag_r[j] : pre[j];
            if (lag_r) lag_r[j] = pre[j];
        }
        hc_collapse_row(J->k, hc, d, w, Xr, ur);
    }
}

static void fast_hc_pre(struct dsv4_backend *be, int n, int hc, int d, const float *X, const float *fn,
                        const float *scale, const float *base, int iters, double norm_eps, double hc_eps, float *lag,
                        float *u, float *post, float *comb)
{
    int   n_mix = (2 + hc) * hc;
    float mixbuf[(2 + DSV4_MAX_HC) * DSV4_MAX_HC * 64];
    struct hc_pre_job J = { cpu_of(be)->k, 0, hc, d, iters, fn ? mixbuf : NULL, X, scale, base, hc_eps, lag, u, post,
                            comb };
    for (int r0 = 0; r0 < n; r0 += 64) {
        int nr = n - r0 < 64 ? n - r0 : 64;
        if (fn) fast_mix(be, nr, hc, d, X + (size_t)r0 * (size_t)hc * (size_t)d, fn, n_mix, norm_eps, mixbuf);
        J.r0 = r0;
        dsv4_pool_for(cpu_of(be)->pool, nr, 1, 2, hc_pre_rows, &J);
    }
}

/* hc_post, rows in parallel: X_out[k] = bf16(post_k f + sum_j comb[j][k] X_j). */
struct hc_post_job {
    const struct dsv4_kernels *k;
    int                        hc, d;
    const float               *f, *Xres, *post, *comb;
    float                     *Xout;
};

static void hc_post_rows(void *ctx, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const struct hc_post_job *J = ctx;
    int hc = J->hc, d = J->d;
    for (int64_t r = r0; r < r1; r++) {
        const float *fr = J->f + (size_t)r * (size_t)d;
        const float *Xr = J->Xres + (size_t)r * (size_t)hc * (size_t)d;
        const float *c  = J->comb + (size_t)r * (size_t)(hc * hc);
        for (int kk = 0; kk < hc; kk++) {
            float *Yr = J->Xout + ((size_t)r * (size_t)hc + (size_t)kk) * (size_t)d;
            for (int i = 0; i < d; i++) Yr[i] = J->post[r * hc + kk] * fr[i];
            for (int j = 0; j < hc; j++) J->k->axpy(Yr, c[j * hc + kk], Xr + (size_t)j * (size_t)d, d);
            for (int i = 0; i < d; i++) Yr[i] = dsv4_round_bf16(Yr[i]);
        }
    }
}

static void fast_hc_post(struct dsv4_backend *be, int n, int hc, int d, const float *f, const float *Xres,
                         const float *post, const float *comb, float *Xout)
{
    struct hc_post_job J = { cpu_of(be)->k, hc, d, f, Xres, post, comb, Xout };
    dsv4_pool_for(cpu_of(be)->pool, n, 1, 2, hc_post_rows, &J);
}

static void fast_hc_head(struct dsv4_backend *be, int n, int hc, int d, const float *X, const float *fn,
                         const float *scale, const float *base, double norm_eps, double hc_eps, float *y)
{
    float mix[DSV4_MAX_HC];
    for (int r = 0; r < n; r++) {
        const float *Xr = X + (size_t)r * (size_t)hc * (size_t)d;
        fast_mix(be, 1, hc, d, Xr, fn, hc, norm_eps, mix);
        float w[DSV4_MAX_HC];
        for (int j = 0; j < hc; j++) w[j] = (float)(sigmoid((double)(mix[j] * scale[0] + base[j])) + hc_eps);
        float *yr = y + (size_t)r * (size_t)d;
        for (int i = 0; i < d; i++) yr[i] = w[0] * Xr[i];
        for (int j = 1; j < hc; j++) cpu_of(be)->k->axpy(yr, w[j], Xr + (size_t)j * (size_t)d, d);
        for (int i = 0; i < d; i++) yr[i] = dsv4_round_bf16(yr[i]);
    }
}

/* ------------------------------------------------------------------ data ops */

/* The element-wise data ops of ops_data.c on the level's kernels where it has them (the same
 * expressions lane by lane, so the same bits), rows over the threads; else ops_data.c's
 * plain C. */
struct data_job {
    const struct dsv4_kernels *k;
    const int                 *tok, *pair_of;
    const uint16_t            *table;
    const float               *e, *ye, *shared;
    float                     *x;
    int                        d, hc, copies, kk;
    size_t                     n;
    double                     s;
};

static void embed_rows(void *ctx, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const struct data_job *J = ctx;
    size_t                 D = (size_t)J->d;
    for (int64_t r = r0; r < r1; r++) {
        float *x = J->x + (size_t)r * (size_t)J->copies * D;
        J->k->bf16_to_f32(J->table + (size_t)J->tok[r] * D, D, x);
        for (int c = 1; c < J->copies; c++) memcpy(x + (size_t)c * D, x, sizeof(float) * D);
    }
}

static void fast_embed(struct dsv4_backend *be, int n, const int *tok, const uint16_t *table, int d, int copies,
                       float *X)
{
    struct dsv4_cpu *cpu = cpu_of(be);
    if (!cpu->k->bf16_to_f32) {
        dsv4_cpu_embed(be, n, tok, table, d, copies, X);
        return;
    }
    struct data_job J = { .k = cpu->k, .tok = tok, .table = table, .x = X, .d = d, .copies = copies };
    dsv4_pool_for(cpu->pool, n, 1, 1 + 8192 / (d * copies), embed_rows, &J);
}

enum { SCALE_CHUNK = 4096 }; /* floats of one scale job: a flat array in pieces */

static void scale_chunks(void *ctx, int64_t c0, int64_t c1, int tid)
{
    (void)tid;
    const struct data_job *J = ctx;
    size_t                 n = J->n, a = (size_t)c0 * SCALE_CHUNK, b = (size_t)c1 * SCALE_CHUNK;
    J->k->scale_rows(J->x + a, (b < n ? b : n) - a, J->s);
}

static void fast_scale(struct dsv4_backend *be, size_t n, float *x, double s)
{
    struct dsv4_cpu *cpu = cpu_of(be);
    if (!cpu->k->scale_rows) {
        dsv4_cpu_scale(be, n, x, s);
        return;
    }
    struct data_job J = { .k = cpu->k, .x = x, .n = n, .s = s };
    dsv4_pool_for(cpu->pool, (int64_t)((n + SCALE_CHUNK - 1) / SCALE_CHUNK), 1, 2, scale_chunks, &J);
}

static void add_rows(void *ctx, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const struct data_job *J = ctx;
    size_t                 D = (size_t)J->d;
    for (int64_t r = r0; r < r1; r++)
        for (int c = 0; c < J->hc; c++)
            J->k->add_rows(J->x + ((size_t)r * (size_t)J->hc + (size_t)c) * D, J->e + (size_t)r * D, D);
}

static void fast_add_streams(struct dsv4_backend *be, int n, int hc, int d, const float *e, float *X)
{
    struct dsv4_cpu *cpu = cpu_of(be);
    if (!cpu->k->add_rows) {
        dsv4_cpu_add_streams(be, n, hc, d, e, X);
        return;
    }
    struct data_job J = { .k = cpu->k, .e = e, .x = X, .d = d, .hc = hc };
    dsv4_pool_for(cpu->pool, n, 1, 1 + 8192 / (d * hc), add_rows, &J);
}

static void combine_rows(void *ctx, int64_t r0, int64_t r1, int tid)
{
    (void)tid;
    const struct data_job *J = ctx;
    size_t                 D = (size_t)J->d;
    for (int64_t r = r0; r < r1; r++) {
        int p[64];
        dsv4_cpu_moe_pairs(J->kk, J->pair_of + (size_t)r * (size_t)J->kk, p);
        J->k->combine_row(J->kk, J->d, p, J->ye, J->shared + (size_t)r * D, J->x + (size_t)r * D);
    }
}

static void fast_moe_combine(struct dsv4_backend *be, int n, int k, int d, const int *pair_of, const float *ye,
                             const float *shared, float *f)
{
    struct dsv4_cpu *cpu = cpu_of(be);
    if (!cpu->k->combine_row) {
        dsv4_cpu_moe_combine(be, n, k, d, pair_of, ye, shared, f);
        return;
    }
    DSV4_ASSERT(k >= 1 && k <= 64);
    struct data_job J = { .k = cpu->k, .pair_of = pair_of, .ye = ye, .shared = shared, .x = f, .d = d, .kk = k };
    dsv4_pool_for(cpu->pool, n, 1, 1 + 4096 / d, combine_rows, &J);
}

const struct dsv4_backend_ops dsv4_cpu_fast_ops = {
    .name           = "cpu",
    .linear         = fast_linear,
    .rmsnorm        = fast_rmsnorm,
    .head_rms       = fast_head_rms,
    .rope           = fast_rope,
    .fp8_sim        = fast_fp8_sim,
    .fp4_sim        = fast_fp4_sim,
    .hadamard       = fast_hadamard,
    .hc_pre         = fast_hc_pre,
    .hc_post        = fast_hc_post,
    .hc_head        = fast_hc_head,
    .step_begin     = dsv4_cpu_step_begin,
    .attention      = fast_attention,
    .indexer_scores = fast_indexer_scores,
    .router         = dsv4_ref_router,
    .expert         = fast_expert,
    .experts        = fast_experts,
    .indexer_topk   = dsv4_cpu_indexer_topk,
    .compress       = dsv4_cpu_compress,
    .store_rows     = dsv4_cpu_store_rows,
    .embed          = fast_embed,
    .scale          = fast_scale,
    .add_streams    = fast_add_streams,
    .engram_rows    = dsv4_cpu_engram_rows, /* ops_engram.c: written once for every level */
    .engram_gate    = dsv4_cpu_engram_gate,
    .moe_dispatch   = dsv4_cpu_moe_dispatch,
    .moe_combine    = fast_moe_combine,
};
