/*
 * cpu_describe.c - what runs each op of the CPU backend at its level (`dsv4 ops`, struct
 * dsv4_backend_kind.describe_op) and the levels in order (.level, for `dsv4 test-ops`).
 *
 * The lines are read off the state the fast ops dispatch on (the level's kernel tables and
 * which of their entries exist), the thresholds off the function ops_fast.c uses, and an op
 * whose fast entry is the reference's own function is reported as such, so the description
 * cannot drift from the code by retyping.
 */
#include <stdio.h>

#include "backend/cpu/cpu.h"

const char *dsv4_cpu_level_at(int i, bool *here)
{
    int n_built = 0;
    while (n_built < DSV4_CPU_LEVELS && dsv4_cpu_level_built((enum dsv4_cpu_level)n_built)) n_built++;
    if ((i == n_built || i == n_built + 1) && dsv4_cpu_fp4x_built()) { /* the sub-levels, after the levels */
        *here = dsv4_cpu_detect() >= (i == n_built ? DSV4_CPU_AVX2 : DSV4_CPU_AVX512);
        return i == n_built ? DSV4_CPU_FP4X_NAME : DSV4_CPU_FP4X512_NAME;
    }
    if (i < 0 || i >= DSV4_CPU_LEVELS || !dsv4_cpu_level_built((enum dsv4_cpu_level)i)) return NULL;
    *here = i <= (int)dsv4_cpu_detect();
    return dsv4_cpu_level_name((enum dsv4_cpu_level)i);
}

/* A row op with a kernel of the level (reference bits, rows over threads) or the reference. */
static int row_op(char *buf, size_t cap, const struct dsv4_kernels *k, bool has, const char *when)
{
    if (!has) {
        snprintf(buf, cap, "the reference's plain C (no %s kernel)", k->name);
        return 1;
    }
    snprintf(buf, cap, "%s (reference bits), rows in parallel%s%s", k->name, *when ? "; " : "", when);
    return 0;
}

/* An element-wise data op (ops_data.c's arithmetic) on a kernel of the level, or plain C. */
static int data_op(char *buf, size_t cap, const struct dsv4_kernels *k, bool has, const char *what)
{
    if (!has) {
        snprintf(buf, cap, "plain C of ops_data.c (no %s kernel)", k->name);
        return 1;
    }
    snprintf(buf, cap, "%s (reference bits: %s), rows in parallel", k->name, what);
    return 0;
}

static int linear(const struct dsv4_cpu *cpu, char *buf, size_t cap)
{
    const struct dsv4_kernels *k = cpu->k, *kb = cpu->kb;
    if (!kb) {
        /* no bf16 kernels: f32 dot products */
        if (cpu->level == DSV4_CPU_SCALAR) {
            snprintf(buf, cap, "%s dot kernels (GEMV at every token count); FP8 activation quantiser in plain C", k->name);
            return 1;
        }
        const int *gmin = cpu->gemm_min;
#if DSV4_HAVE_X86
        if (k->quant_fp4x) {
            snprintf(buf, cap,
                     "%s: FP4 with exact block sums (fp4_exact.h): GEMV on %s integer dot products, 4 rows x up to 4 "
                     "tokens, below %d tokens, then an f32 GEMM on the same sums (the same bits); FP8/BF16/F32 as %s "
                     "(GEMM from %d / %d / %d tokens); FP8 activation quantiser %s (reference bits)",
                     k->name,
                     k->dot_fp4 == dsv4_fp4x_dot_vnni    ? "ymm AVX-VNNI"
                     : k->dot_fp4 == dsv4_fp4x_dot_v512  ? "ymm AVX-512 VNNI"
                     : k->dot_fp4 == dsv4_fp4x_dot_z512v ? "zmm AVX-512 VNNI (two rows a vector)"
                     : k->dot_fp4 == dsv4_fp4x_dot_z512  ? "zmm AVX-512 BW (two rows a vector)"
                                                         : "ymm AVX2",
                     gmin[1], dsv4_cpu_level_name(cpu->level), gmin[0], gmin[2], gmin[3], dsv4_cpu_level_name(cpu->level));
            return 0;
        }
#endif
        snprintf(buf, cap,
                 "%s dot kernels: GEMV of 4 rows x up to 4 tokens (weights decoded again every 4 tokens) below %d "
                 "(fp8) / %d (fp4) / %d (bf16) tokens, then 4 rows decoded once per 256 inputs for tiles of 4 rows x "
                 "%d tokens (the same bits; --gemm-min); FP8 activation quantiser %s%s",
                 k->name, gmin[0], gmin[1], gmin[2], k->gemm_tn, k->quant_f32 ? k->name : "in plain C",
                 k->quant_f32 ? " (reference bits)" : "");
        return 0;
    }
    if (cpu->level >= DSV4_CPU_AMX) {
        snprintf(buf, cap,
                 "amx: on 16-row tiles (made at load) TDPBF16PS, 32 tokens x 32 rows per pass, FP8/FP4 tiles decoded "
                 "per 32 inputs, or once into a panel above 32 tokens (the same bits); release layout as avx512bf16: "
                 "GEMV below %d (fp8, bf16) / %d (fp4) tokens, then bf16 panel GEMM; f32 weights: %s; activations "
                 "quantised straight to bf16",
                 dsv4_cpu_gemm_min_tokens(DSV4_WFMT_FP8, false), dsv4_cpu_gemm_min_tokens(DSV4_WFMT_FP4, false),
                 k->name);
        return 0;
    }
    snprintf(buf, cap,
             "%s: on 16-row tiles (made at load) GEMV below %d (fp8) / %d (fp4) / %d (bf16) tokens, then GEMM; "
             "release layout GEMV below %d (fp8, bf16) / %d (fp4) tokens, then bf16 panel GEMM; f32 weights: %s; "
             "activations quantised straight to bf16",
             kb->name, dsv4_cpu_gemm_min_tokens(DSV4_WFMT_FP8, true), dsv4_cpu_gemm_min_tokens(DSV4_WFMT_FP4, true),
             dsv4_cpu_gemm_min_tokens(DSV4_WFMT_BF16, true), dsv4_cpu_gemm_min_tokens(DSV4_WFMT_FP8, false),
             dsv4_cpu_gemm_min_tokens(DSV4_WFMT_FP4, false), k->name);
    return 0;
}

int dsv4_cpu_describe_op(void *impl, enum dsv4_op op, char *buf, size_t cap)
{
    const struct dsv4_cpu     *cpu = impl;
    const struct dsv4_kernels *k = cpu->k, *kb = cpu->kb;
    bool                       sc = cpu->level == DSV4_CPU_SCALAR;
    if (cpu->ref) {
        snprintf(buf, cap, "reference (sums in double, one thread)");
        return 1;
    }
    dsv4_op_fn fast = dsv4_op_entry(&dsv4_cpu_fast_ops, op);
    if (!fast) {
        snprintf(buf, cap, "MISSING from the fast table");
        return 1;
    }
    if (fast == dsv4_op_entry(&dsv4_cpu_ref_ops, op)) {
        /* why each stays so on every level */
        snprintf(buf, cap, "plain C shared with the reference%s",
                 op == DSV4_OP_ROUTER ? " (gate projection through linear; the rest is libm softplus/sqrt in double "
                                        "over n_exp scores and a top-k of comparisons)"
                 : op == DSV4_OP_INDEXER_TOPK ? " (scores through indexer_scores; the rest is a heap of comparisons)"
                 : op == DSV4_OP_COMPRESS     ? " (the pooling's softmax needs libm's exp in double bit for bit, which "
                                                "a SIMD exp cannot promise; O(d) per compressed row)"
                 : op == DSV4_OP_STORE_ROWS   ? " (the row codec of backend/row_codec.c: byte packing, memory-bound)"
                 : op == DSV4_OP_STEP_BEGIN   ? " (nothing to do: the ops read the descriptor's host arrays in place)"
                 : op == DSV4_OP_MOE_DISPATCH ? " (a counting sort and row copies: no arithmetic)"
                                              : "");
        return 1;
    }
    switch (op) {
    case DSV4_OP_LINEAR: return linear(cpu, buf, cap);
    case DSV4_OP_RMSNORM: return row_op(buf, cap, k, k->rmsnorm_row, "");
    case DSV4_OP_HEAD_RMS: return row_op(buf, cap, k, k->sumsq_bf16 && k->scale_bf16, "");
    case DSV4_OP_ROPE: return row_op(buf, cap, k, k->rope_row, "");
    case DSV4_OP_HADAMARD: return row_op(buf, cap, k, k->hadamard_rows, "d a power of two in 8..4096");
    case DSV4_OP_FP8_SIM: return row_op(buf, cap, k, k->fp8_sim_rows, "blocks a multiple of 16 dividing d");
    case DSV4_OP_FP4_SIM: return row_op(buf, cap, k, k->fp4_sim_rows, "blocks of 32");
    case DSV4_OP_HC_PRE:
    case DSV4_OP_HC_HEAD:
        snprintf(buf, cap, "mix projections on %s dot products, Sinkhorn in double, rows in parallel", k->name);
        return sc;
    case DSV4_OP_HC_POST: snprintf(buf, cap, "%s axpy, rows in parallel", k->name); return sc;
    case DSV4_OP_ATTENTION:
        if (kb && kb->attn_rows) {
            snprintf(buf, cap, "%s (heads in lanes, bf16 rows once per query; d_head %% 32 == 0), else %s f32", kb->name,
                     k->name);
            return 0;
        }
        snprintf(buf, cap, "%s dot / axpy on f32 rows decoded once a query, heads over threads", k->name);
        return sc;
    case DSV4_OP_INDEXER_SCORES:
        if (kb && kb->idx_keys) {
            snprintf(buf, cap, "%s (heads in lanes, blocks of %d keys over threads)", kb->name, DSV4_ATTN_NR);
            return 0;
        }
        snprintf(buf, cap, "%s dot products, keys over threads", k->name);
        return sc;
    case DSV4_OP_EXPERT:
    case DSV4_OP_EXPERTS:
        snprintf(buf, cap, "projections as linear%s; SwiGLU %s%s",
                 op == DSV4_OP_EXPERTS ? " (every expert's rows in one parallel pass)" : "",
                 k->swiglu_bf16 ? k->name : "plain C", k->swiglu_bf16 ? " in double (reference roundings)" : "");
        return !k->swiglu_bf16;
    case DSV4_OP_EMBED: return data_op(buf, cap, k, k->bf16_to_f32, "bf16 widening by shifts");
    case DSV4_OP_SCALE: return data_op(buf, cap, k, k->scale_rows, "products in double");
    case DSV4_OP_ADD_STREAMS: return data_op(buf, cap, k, k->add_rows, "sums in double");
    case DSV4_OP_MOE_COMBINE: return data_op(buf, cap, k, k->combine_row, "sums in double in the experts' order");
    default: snprintf(buf, cap, "plain C (%s)", dsv4_cpu_fast_ops.name); return 1;
    }
}
