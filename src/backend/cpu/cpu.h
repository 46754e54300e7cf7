/*
 * cpu.h - the CPU backend: dispatch levels, the per-ISA kernel table, and the backend
 * state shared by all execution contexts of an engine (thread pool, chosen level).
 *
 * Levels, lowest first: scalar (plain C, always compiled), avx2 (AVX2+FMA+F16C), avx512
 * (F/BW/VL/DQ), avx512-bf16, amx (the avx512bf16 kernels, with the projections on
 * interleaved tiles on AMX: x86_amx_i16.c). The best level the CPU and OS support is picked at engine open;
 * dsv4_engine_params.cpu_level (the tools' --cpu-level or DSV4_CPU) =
 * scalar|avx2|avx512|avx512bf16|amx caps it (valgrind cannot run AVX-512: avx2). ISA code
 * lives in x86_*.c files compiled with their own -m flags and is only ever called after the
 * check.
 */
#ifndef DSV4_CPU_H
#define DSV4_CPU_H

#include "backend/backend.h"
#include "core/pool.h"

/*
 * DSV4_HAVE_X86: this build holds the x86 kernel files (x86_*.c) and their tables. The
 * Makefile builds them for ARCH=x86_64 only and passes DSV4_HAVE_X86=0 otherwise, so that
 * the portable C path builds on any 64-bit little-endian target; there every level above
 * scalar is "not built" (dsv4_cpu_level_built) and the x86 symbols below are not declared,
 * so a portable file that names one fails to compile rather than to link.
 */
#ifndef DSV4_HAVE_X86
#if defined(__x86_64__)
#define DSV4_HAVE_X86 1
#else
#define DSV4_HAVE_X86 0
#endif
#endif
#if DSV4_HAVE_X86 && !defined(__x86_64__)
#error "DSV4_HAVE_X86=1 needs a compiler for x86_64"
#endif
/* DSV4_HAVE_NEON: the same for the AArch64 kernel files (arm_*.c), built for ARCH=aarch64. */
#ifndef DSV4_HAVE_NEON
#if defined(__aarch64__)
#define DSV4_HAVE_NEON 1
#else
#define DSV4_HAVE_NEON 0
#endif
#endif
#if DSV4_HAVE_NEON && !defined(__aarch64__)
#error "DSV4_HAVE_NEON=1 needs a compiler for aarch64"
#endif

/* Levels are ranks, lowest first; a build holds a prefix of them (dsv4_cpu_level_built). On
 * aarch64 rank 1 is neon and the ranks above are not built; elsewhere the x86 names hold. */
enum dsv4_cpu_level {
    DSV4_CPU_SCALAR,
    DSV4_CPU_AVX2,
    DSV4_CPU_NEON = DSV4_CPU_AVX2,
    DSV4_CPU_AVX512,
    DSV4_CPU_AVX512BF16,
    DSV4_CPU_AMX,
    DSV4_CPU_LEVELS,
};

const char *dsv4_cpu_level_name(enum dsv4_cpu_level l);
/* Whether this build holds the level's kernels: scalar always, the x86 levels only where
 * DSV4_HAVE_X86, neon only where DSV4_HAVE_NEON. */
bool dsv4_cpu_level_built(enum dsv4_cpu_level l);
/* Best level this CPU and OS support among those built (asks the kernel for AMX tile
 * permission once). */
enum dsv4_cpu_level dsv4_cpu_detect(void);
/* The level to use: detected, capped by name if given (an unknown name, or a level this
 * build lacks, is an error); "ref" selects the scalar reference ops (double precision,
 * single thread); "avx2-int" / "avx512-int" the avx2 / avx512 level with the exact FP4 block
 * sums of fp4_exact.h (*fp4x set; x86 builds with AVX2; avx512-int is capped to avx2-int on a
 * CPU without AVX-512, as the levels are capped). */
int dsv4_cpu_pick(const char *name, enum dsv4_cpu_level *level, bool *ref, bool *fp4x, struct dsv4_err *err);
/* The sub-levels' names, and whether this build has them (x86). */
#define DSV4_CPU_FP4X_NAME    "avx2-int"
#define DSV4_CPU_FP4X512_NAME "avx512-int"
enum { DSV4_FP4X_GEMM_MIN = 16 }; /* its FP4 GEMV/GEMM crossover unless --gemm-min says otherwise */
bool dsv4_cpu_fp4x_built(void);

/*
 * ISA kernels. Projections: for output rows o in [o0, o1) and tokens t in [0, nt),
 * y[t * ldy + o] = sum_k W[o][k] * x[t * ldx + k] in f32, with W dequantised exactly
 * (codes times block scales) and x already dequantised (bf16-exact values when the
 * activations were quantised). nt is small (decode); prefill GEMMs use gemm_bf16.
 */
struct dsv4_attn_bf16;
struct dsv4_idx_bf16;
struct dsv4_kernels {
    const char *name;
    int         gemm_tn; /* tokens per GEMM register tile (simd_kernels.inc K_TN; `dsv4 ops`) */
    /* gmin: the token count from which the SIMD kernels take their GEMM instead of the GEMV
     * (the same bits either way; the caller's backend state, struct dsv4_cpu.gemm_min, so
     * two engines in one process keep their own); the scalar kernels ignore it. */
    void (*dot_fp8)(const struct dsv4_linear *w, int o0, int o1, int nt, const float *x, int ldx, float *y, int ldy,
                    int gmin);
    void (*dot_fp4)(const struct dsv4_linear *w, int o0, int o1, int nt, const float *x, int ldx, float *y, int ldy,
                    int gmin);
    void (*dot_bf16)(const struct dsv4_linear *w, int o0, int o1, int nt, const float *x, int ldx, float *y, int ldy,
                     int gmin);
    void (*dot_f32)(const struct dsv4_linear *w, int o0, int o1, int nt, const float *x, int ldx, float *y, int ldy,
                    int gmin);
    /* The same on bf16 activations (levels with VDPBF16PS; NULL elsewhere): x [nt, ldx]
     * uint16 bf16 patterns, exact copies of the f32 values (to_bf16). */
    void (*dotb_fp8)(const struct dsv4_linear *w, int o0, int o1, int nt, const uint16_t *x, int ldx, float *y, int ldy);
    void (*dotb_fp4)(const struct dsv4_linear *w, int o0, int o1, int nt, const uint16_t *x, int ldx, float *y, int ldy);
    void (*dotb_bf16)(const struct dsv4_linear *w, int o0, int o1, int nt, const uint16_t *x, int ldx, float *y, int ldy);
    void (*to_bf16)(const float *x, int n, uint16_t *out);
    /* Activation quantisation of one row straight to bf16: e4m3 per group of B (w->block)
     * with a power-of-two scale (dsv4_act_scale), the dequantised values written as bf16
     * (exact). */
    void (*quant_bf16)(const float *x, int n, int B, uint16_t *out);
    /* f32 helpers for attention and small ops */
    float (*vdot)(const float *a, const float *b, int n);
    void (*axpy)(float *y, float a, const float *x, int n); /* y += a * x */
    /* Prefill (many tokens): rows [o0, o1) against nt bf16 token rows, weights dequantised
     * panel by panel into `panel` (per-thread scratch, DSV4_GEMM_PANEL * n_in uint16). Only for e8m0
     * scales and n_in % 32 == 0; NULL when the level has none. */
    void (*gemmb)(const struct dsv4_linear *w, int o0, int o1, int nt, const uint16_t *x, int ldx, float *y, int ldy,
                  uint16_t *panel);
    /* The same two on interleaved tiles (w->prep set, row_off and o0 multiples of 16): GEMV for
     * a few tokens, GEMM with panels of 32 rows; both give the same bits for a row. */
    void (*dotb_i16)(const struct dsv4_linear *w, int o0, int o1, int nt, const uint16_t *x, int ldx, float *y,
                     int ldy);
    void (*gemmb_i16)(const struct dsv4_linear *w, int o0, int o1, int nt, const uint16_t *x, int ldx, float *y,
                      int ldy, uint16_t *panel);
    /* Attention and indexer scores of one query on bf16 dot products (NULL: the f32 path;
     * see struct dsv4_attn_bf16): decode row pairs [p0, p1), then head-group pairs [u0, u1);
     * the indexer's query panel, then key blocks [b0, b1) of DSV4_ATTN_NR keys with a
     * per-thread buffer s of dsv4_idx_bf16_s_floats floats. */
    /* Row ops with the reference's results (simd_rows.inc, one template for every SIMD level;
     * NULL on scalar, where the fast ops run the reference's plain C): the FP4
     * simulation with blocks of 32 (d % 32 == 0); sum of bf16(v[i]^2) in double; and
     * v[i] = bf16(v[i] * r). */
    void (*fp4_sim_rows)(float *x, int n, int d, int ld);
    double (*sumsq_bf16)(const float *v, int d);
    void (*scale_bf16)(float *v, int d, float r);
    /* The grouped experts' SwiGLU of one (token, expert) pair in place of its gate row g (n
     * values, up row v, routing weight w, clamp limit if > 0), the reference's expression and
     * rounding points in double. */
    void (*swiglu_bf16)(float *g, const float *v, int n, float w, double limit);
    /* FP8 cache simulation (block % 16 == 0), RMSNorm of one row, RoPE of one row's n_vec
     * vectors given the pairs' cos and sin, Hadamard of n rows (d a power of two, 8..4096). */
    void (*fp8_sim_rows)(float *x, int n, int d, int ld, int block);
    void (*rmsnorm_row)(const float *x, int d, const uint16_t *w, double eps, float *y);
    void (*rope_row)(float *x, int n_vec, int d_full, int d_rope, const double *c, const double *s);
    void (*hadamard_rows)(float *x, int n, int d);
    /* The f32 levels' activation quantiser (FP8/FP4 projections): one row, e4m3 per group of
     * B (w->block) with a power-of-two scale (the last group may be short), the dequantised
     * values (exact) as f32. NULL: plain C in ops_fast.c. */
    void (*quant_f32)(const float *x, int n, int B, float *out);
    /* The -int sub-levels (fp4_exact.h; NULL on every other table): one row quantised as
     * quant_f32 does and written in the exact-sum layout its dot_fp4 reads (n % 32 == 0,
     * dsv4_fp4x_floats(n) floats). FP4 projections on quantised activations take it. */
    void (*quant_fp4x)(const float *x, int n, int B, float *out);
    /* The data ops' arithmetic (ops_data.c's expressions, NULL: those plain C loops): bf16 ->
     * f32; x[i] = bf16(f32(x[i] * s)) and x[i] = bf16(f32(x[i] + e[i])) in double; a MoE
     * combine row, f[i] = bf16(f32(sum_j ye[p[j] * d + i] + sh[i])) summed in double in the
     * order of p. */
    void (*bf16_to_f32)(const uint16_t *h, size_t n, float *x);
    void (*scale_rows)(float *x, size_t n, double s);
    void (*add_rows)(float *x, const float *e, size_t n);
    void (*combine_row)(int k, int d, const int *p, const float *ye, const float *sh, float *f);
    void (*attn_rows)(const struct dsv4_attn_bf16 *a, int p0, int p1);
    void (*attn_heads)(const struct dsv4_attn_bf16 *a, int u0, int u1);
    void (*idx_query)(const struct dsv4_idx_bf16 *x);
    void (*idx_keys)(const struct dsv4_idx_bf16 *x, int b0, int b1, float *s);
    /* The level's arithmetic peak on one core, for `dsv4 bench`: n passes over 12 independent
     * accumulator chains (enough to cover the latency of two FMA pipes), f32 FMAs on the f32
     * tables, VDPBF16PS on the bf16 one; returns the flops done (2 per multiply-add). */
    double (*peak)(long n);
};

/*
 * One query's attention on the bf16 kernels (x86_avx512bf16_attn.c): heads in groups of 16
 * (the lanes of a register), rows padded to n_pad, a multiple of DSV4_ATTN_NR (pad rows are
 * zero and get probability zero). Needs d_head % 32 == 0. Scratch, all from the caller:
 * kr [n_pad][d_head] rows as bf16; vp [n_pad/2][d_head][2] row pairs interleaved; per head
 * group g of G = ceil(n_head/16): qp [G][d_head/2][16][2] query, s [G][n_pad][16] scores,
 * pp [G][n_pad/2][16][2] probabilities, den [G][16] denominators.
 */
enum { DSV4_ATTN_NR = 12 };
struct dsv4_attn_bf16 {
    int                   n_head, d_head, d_rope, n_rows, n_pad;
    enum dsv4_row_fmt     fmt;
    const uint8_t *const *rows;
    const float          *q, *sink;
    float                 scale;
    float                *o;
    uint16_t             *kr, *vp, *qp, *pp;
    float                *s, *den;
};
/* The indexer's scores of one query against n_keys FP4 keys in blocks of block_keys (qp:
 * [G][d/2][16][2]); each thread's buffer holds one block's dot products and bf16 keys. */
struct dsv4_idx_bf16 {
    int                   n_head, d, n_keys, block_keys;
    const float          *q, *w;
    const uint8_t *const *blocks;
    float                *score;
    uint16_t             *qp;
};
static inline int dsv4_idx_bf16_s_floats(int n_head, int d)
{
    return (n_head + 31) / 32 * 32 * DSV4_ATTN_NR + DSV4_ATTN_NR * d / 2;
}
#if DSV4_HAVE_X86
/* The bf16 attention and indexer of the avx512bf16 table (x86_avx512bf16_attn.c), reached
 * through the tables only. */
void dsv4_avx512bf16_attn_rows(const struct dsv4_attn_bf16 *a, int p0, int p1);
void dsv4_avx512bf16_attn_heads(const struct dsv4_attn_bf16 *a, int u0, int u1);
void dsv4_avx512bf16_idx_query(const struct dsv4_idx_bf16 *x);
void dsv4_avx512bf16_idx_keys(const struct dsv4_idx_bf16 *x, int b0, int b1, float *s);
#endif

/*
 * Interleaved 16-row tiles ("i16", repack.c): whether a projection can be held so (FP8/FP4
 * with e8m0 scales all within the range the kernels fold into bf16 exponents, or BF16; n_in
 * a multiple of 32; a whole tensor), its sizes, and the packing of groups [g0, g1) of 16 rows
 * (callers split the groups over threads). Kernels take the tiles when w->prep is set: it
 * points at the projection's struct dsv4_cpu_tiles (cpu_backend.c's prepare_weights makes
 * them, owned by the backend state).
 */
struct dsv4_cpu_tiles {
    const void *wi; /* the weights as interleaved 16-row tiles */
    const void *si; /* FP4's scales in tile order, or NULL */
};

static inline const void *dsv4_i16_w(const struct dsv4_linear *l)
{
    return l->prep ? ((const struct dsv4_cpu_tiles *)l->prep)->wi : NULL;
}

static inline const void *dsv4_i16_s(const struct dsv4_linear *l)
{
    return l->prep ? ((const struct dsv4_cpu_tiles *)l->prep)->si : NULL;
}

bool dsv4_i16_eligible(const struct dsv4_linear *l);
int  dsv4_i16_groups(const struct dsv4_linear *l);
void dsv4_i16_sizes(const struct dsv4_linear *l, size_t *w_bytes, size_t *s_bytes);
void dsv4_i16_pack(const struct dsv4_linear *l, int g0, int g1, void *wi, void *si);
/* The kind's export_prepared (backend.h): l's tiles as `dsv4 convert --tiles` stores them,
 * "W.i16" beside the weight tensor and, for FP4, "S.i16" beside its scales. */
size_t dsv4_i16_export(const struct dsv4_linear *l, size_t parts[2], void *buf);

/* Rows of a prefill GEMM panel: each panel is dequantised once and swept by every token, so
 * the token rows are streamed from L3 once per panel (taller panels: less traffic, more L2). */
enum { DSV4_GEMM_PANEL = 32 };

/* Token count from which the f32 kernels (avx2, avx512: simd_kernels.inc) decode four rows once
 * per chunk of inputs for every token instead of once per four tokens (the same bits either
 * way; `dsv4 ops` prints it): the default, and the limit of what dsv4_cpu_gemm_min accepts. */
enum { DSV4_F32_GEMM_MIN_TOKENS = 5, DSV4_F32_GEMM_MIN_MAX = 64 };

/* The crossovers (fp8, fp4, bf16, f32) the f32 kernels of `level` use on this CPU: spec NULL or
 * "" = the ones measured for this core (cpu.c), else "FP8,FP4,BF16" token counts in
 * 1..DSV4_F32_GEMM_MIN_MAX (the f32 one stays the default). DSV4_EINVAL names a bad spec. */
int dsv4_cpu_gemm_min(enum dsv4_cpu_level level, const char *spec, int min[4], struct dsv4_err *err);

extern const struct dsv4_kernels dsv4_kernels_scalar;
#if DSV4_HAVE_NEON
extern const struct dsv4_kernels dsv4_kernels_neon;
#endif
#if DSV4_HAVE_X86
extern const struct dsv4_kernels dsv4_kernels_avx2;
extern const struct dsv4_kernels dsv4_kernels_avx512;
extern const struct dsv4_kernels dsv4_kernels_avx512bf16;
/* The i16 kernels of the avx512bf16 table (x86_avx512bf16_i16.c); only after the CPU check. */
void dsv4_avx512bf16_dotb_i16(const struct dsv4_linear *w, int o0, int o1, int nt, const uint16_t *x, int ldx, float *y,
                              int ldy);
void dsv4_avx512bf16_gemmb_i16(const struct dsv4_linear *w, int o0, int o1, int nt, const uint16_t *x, int ldx, float *y,
                               int ldy, uint16_t *panel);
/* The AMX table (x86_avx512bf16.c) and its tile kernels (x86_amx_i16.c); only after the CPU
 * check, which also asks the kernel for the XTILEDATA permission. */
extern const struct dsv4_kernels dsv4_kernels_amx;
void   dsv4_amx_dotb_i16(const struct dsv4_linear *w, int o0, int o1, int nt, const uint16_t *x, int ldx, float *y, int ldy);
void   dsv4_amx_gemmb_i16(const struct dsv4_linear *w, int o0, int o1, int nt, const uint16_t *x, int ldx, float *y, int ldy,
                          uint16_t *panel);
double dsv4_amx_peak(long n);
/* The -int sub-levels' FP4 kernels (x86_fp4_exact.c, x86_fp4_exact512.c): dot_fp4 on the
 * exact-sum layout with plain AVX2, AVX-VNNI or AVX-512 VNNI (VL) integer dot products on ymm,
 * or AVX-512 BW / VNNI on zmm (two rows per vector), all with the same bits, and the layout's
 * writer (quant_fp4x). Only after the CPU check. */
void dsv4_fp4x_dot_avx2(const struct dsv4_linear *w, int o0, int o1, int nt, const float *x, int ldx, float *y, int ldy,
                        int gmin);
void dsv4_fp4x_dot_vnni(const struct dsv4_linear *w, int o0, int o1, int nt, const float *x, int ldx, float *y, int ldy,
                        int gmin);
void dsv4_fp4x_dot_v512(const struct dsv4_linear *w, int o0, int o1, int nt, const float *x, int ldx, float *y, int ldy,
                        int gmin);
void dsv4_fp4x_dot_z512(const struct dsv4_linear *w, int o0, int o1, int nt, const float *x, int ldx, float *y, int ldy,
                        int gmin);
void dsv4_fp4x_dot_z512v(const struct dsv4_linear *w, int o0, int o1, int nt, const float *x, int ldx, float *y,
                         int ldy, int gmin);
void dsv4_fp4x_quant_avx2(const float *x, int n, int B, float *out);
#endif
/* A built level's tables, for code that must not name an x86 table (tests, cpu.c): the f32
 * kernels (scalar, avx2, or avx512 for avx512 and up) and the bf16-activation kernels
 * (avx512bf16 and up; NULL below). Call them only for a level <= dsv4_cpu_detect(). */
const struct dsv4_kernels *dsv4_cpu_kernels(enum dsv4_cpu_level l);
const struct dsv4_kernels *dsv4_cpu_kernels_bf16(enum dsv4_cpu_level l);

struct dsv4_strict_mem;

/* Backend state shared by contexts: pointed to by dsv4_backend.impl. */
struct dsv4_cpu {
    enum dsv4_cpu_level         level;
    bool                        ref;   /* level "ref": the reference op table */
    bool                        fp4x;  /* avx2-int / avx512-int: k is kx, the level's table with fp4_exact.h's FP4 */
    const struct dsv4_kernels  *k;   /* f32 kernels of the level (avx512 for the higher ones) */
    struct dsv4_kernels         kx;  /* the avx2-int table (fp4x), else unused */
    const struct dsv4_kernels  *kb;  /* bf16-activation kernels, or NULL */
    struct dsv4_pool           *pool;
    int                         n_threads;
    /* The token counts (fp8, fp4, bf16, f32) from which the f32 dot kernels take their GEMM
     * (dsv4_cpu_gemm_min at creation; this backend's own, not the process's). */
    int                         gemm_min[4];
    void                       *tiles;       /* interleaved copies of the projections (mmap), or NULL */
    size_t                      tiles_bytes;
    struct dsv4_cpu_tiles      *preps;       /* what each tiled projection's prep points at, or NULL */
    bool                        repack;      /* option tiles: prepare_weights makes the tiles */
    size_t                      replaced;    /* checkpoint bytes the tiles stand in for (no longer read) */
    void                       *placed;      /* cpu-staged: its copies of the each_tensor tables, or NULL */
    struct dsv4_strict_mem     *guard;       /* cpu-strict: its guarded memory (strict_mem.h), or NULL */
};

/* The CPU backend's lifecycle table (cpu_backend.c). */
extern const struct dsv4_backend_kind dsv4_backend_cpu;
/* The same, declared not host-visible ("cpu-staged"): the model's device-memory path. */
extern const struct dsv4_backend_kind dsv4_backend_cpu_staged;
/* The same ops on memory the host cannot read or write outside them ("cpu-strict",
 * cpu_strict.c): a stray host access of a backend buffer faults. */
extern const struct dsv4_backend_kind dsv4_backend_cpu_strict;

/* The level from dsv4_cpu_pick (environment) and the GEMM crossovers from dsv4_cpu_gemm_min
 * (gemm_min: its spec, NULL = this core's), or an explicit level with this core's crossovers
 * (tests, `dsv4 ops`). */
int  dsv4_cpu_create(struct dsv4_cpu **out, const char *level_name, const char *gemm_min, int n_threads,
                     struct dsv4_err *err);
int  dsv4_cpu_create_at(struct dsv4_cpu **out, enum dsv4_cpu_level level, bool ref, int n_threads,
                        struct dsv4_err *err);
/* The avx2-int sub-level (tests): DSV4_EUNSUPPORTED where the build or the CPU lacks it. Its
 * name as dsv4_cpu_name gives it: "avx2-int" or "avx512-int" (level avx512 and fp4x). */
int  dsv4_cpu_create_fp4x(struct dsv4_cpu **out, int n_threads, struct dsv4_err *err);
/* The level's name as the options give it: "ref", a level's name, or "avx2-int". */
const char *dsv4_cpu_name(const struct dsv4_cpu *cpu);
void dsv4_cpu_free(struct dsv4_cpu *cpu);

/* The optimised op table (ops_fast.c): every op on the kernels of cpu->k and the pool. */
extern const struct dsv4_backend_ops dsv4_cpu_fast_ops;

/* The lifecycle table's introspection (cpu_describe.c, struct dsv4_backend_kind): what runs
 * each op at cpu's level, and the levels in order with whether this machine runs them. */
int         dsv4_cpu_describe_op(void *cpu, enum dsv4_op op, char *buf, size_t cap);
const char *dsv4_cpu_level_at(int i, bool *here);

/* Token count from which a projection on the bf16 levels takes the panel GEMM instead of the
 * GEMV (both give the same bits), on interleaved tiles or on the release layout; the
 * measurements behind the numbers are at their use in ops_fast.c. `dsv4 ops` prints them. */
/* The f32 kernels' crossover for a weight format (struct dsv4_cpu.gemm_min). */
static inline int dsv4_cpu_f32_gemm_min(const struct dsv4_cpu *cpu, enum dsv4_wfmt fmt)
{
    return cpu->gemm_min[fmt == DSV4_WFMT_FP8 ? 0 : fmt == DSV4_WFMT_FP4 ? 1 : fmt == DSV4_WFMT_BF16 ? 2 : 3];
}

static inline int dsv4_cpu_gemm_min_tokens(enum dsv4_wfmt fmt, bool tiles)
{
    if (tiles) return fmt == DSV4_WFMT_FP8 ? 24 : fmt == DSV4_WFMT_FP4 ? 56 : 128;
    return fmt == DSV4_WFMT_FP4 ? 12 : 6;
}

/* Scratch floats one context needs for a plan: the row lists of ops_data.c, then the
 * larger of the reference's and the fast ops' needs (activation buffers, per-thread
 * attention and GEMM panels). */
size_t dsv4_cpu_scratch_floats(const struct dsv4_plan_dims *dims, int n_threads, bool fp4x);

#endif
