/*
 * gen_plan.h - the planning and writing steps of `dsv4 gen` (gen.c) that its presets share:
 * a plan is the list of tensors to write (name, dtype, shape, how to fill it, shard), which
 * gen_write_plan turns into safetensors shards and their index, applying the corruption
 * options of gen_opts. gen.c plans DeepSeek-V4, gen_v41.c DeepSeek-V4.1.
 */
#ifndef DSV4_GEN_PLAN_H
#define DSV4_GEN_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "io/io.h"
#include "support/gen.h"

enum fill {
    FILL_UNIFORM,   /* mean a, standard deviation b (bf16 or f32) */
    FILL_E4M3,      /* e4m3 codes, exponent band [5, 9] */
    FILL_FP4,       /* uniform e2m1 codes, two per byte */
    FILL_SCALE,     /* e8m0 (or f32) block scales so that codes * scale have std b */
    FILL_TID2EID,   /* a rows of b distinct expert ids in [0, n_exp) */
};

struct job {
    char            name[128];
    enum dsv4_dtype dtype;
    int             ndim;
    int64_t         shape[2];
    enum fill       fill;
    double          a, b;
    int             n_exp;      /* FILL_TID2EID */
    double          code_std;   /* FILL_SCALE: std of the codes it scales */
    int             shard;
    int             seq;        /* declaration order */
};

struct plan {
    struct job *jobs;
    int         n, cap;
    int         shard;          /* shard new jobs go to */
    int         fp8_block;      /* FP8 scale blocks: 128 x 128 (V4), 32 x 32 (V4.1) */
    bool        oom;
    const struct gen_opts *o;
};

enum lin_kind { LIN_BF16, LIN_FP8, LIN_FP4 };

/* The model's widths a plan is made from (HF config names in docs/MODEL.md §R1.1). */
struct gen_shape {
    int    vocab, dim, n_layers, n_mtp, n_hash, n_heads, head_dim, rope_dim, q_lora, o_groups, o_lora;
    int    window, ratios[256];
    int    idx_heads, idx_dim, idx_topk, n_exp, n_exp_used, inter, hc, max_pos;
    double swiglu_limit, route_scale;
};

/* Appends a tensor to the plan (NULL when out of memory: p->oom). */
struct job *gen_add(struct plan *p, const char *name, enum dsv4_dtype dt, int ndim, int64_t d0, int64_t d1,
                    enum fill fill, double a, double b);
/* A projection [n_out, n_in] of standard deviation std: prefix.weight, and for FP8 / FP4 its scales. */
void gen_add_linear(struct plan *p, const char *prefix, enum lin_kind kind, int n_out, int n_in, double std);
/* A block's hyper-connection mix tensors pre"hc_"which"_{fn,base,scale}". */
void gen_add_hc(struct plan *p, const char *pre, const char *which, int hc, int dim);
/* A block's attn_norm, ffn_norm and mixes (pre: "layers.N." or "mtp.S."). */
void gen_add_block_norms(struct plan *p, const struct gen_shape *s, const char *pre);
/* attn_sink, the q / kv / output projections (FP8) and their norms. */
void gen_add_attn_core(struct plan *p, const struct gen_shape *s, const char *pre);
/* The shared expert (FP8) and n_exp routed experts of kind ek. */
void gen_add_experts(struct plan *p, const struct gen_shape *s, const char *pre, int n_exp, enum lin_kind ek);
/* The standard deviation of the e4m3 codes FILL_E4M3 draws. */
double gen_e4m3_code_std(void);
int    gen_mkdir(const char *dir, struct dsv4_err *err);
/* Writes the plan's tensors into dir (config.json written by the caller) and frees the plan. */
int gen_write_plan(struct plan *p, const char *dir, struct dsv4_err *err);

/* gen_v41.c: the tiny-v41 preset (docs/MODEL.md "DeepSeek-V4.1"). */
int gen_v41_checkpoint(const struct gen_opts *o, const char *dir, struct dsv4_err *err);

#endif
