/*
 * gen.h - random-weight DeepSeek-V4 checkpoints in the exact official release layout, for
 * tests and benchmarks (`dsv4 gen`). Deterministic from a seed: each tensor's bytes depend
 * only on (seed, tensor name), not on write order.
 */
#ifndef DSV4_GEN_H
#define DSV4_GEN_H

#include <stdbool.h>

#include "dsv4.h"

struct gen_opts {
    const char *preset;        /* "tiny-a", "tiny-b", "flash-shaped", "tiny-v41" (DeepSeek-V4.1) */
    unsigned long long seed;
    int         layers;        /* flash-shaped only: main layers (default 2) */
    int         experts;       /* flash-shaped only: routed experts per layer (0 = 256, V4-Flash's) */
    double      swiglu_limit;  /* < 0: preset default */
    bool        no_mtp;        /* omit the MTP block (config keeps num_nextn_predict_layers) */
    bool        fp8_experts;   /* routed experts as FP8 128x128 (first Flash release) */
    bool        f32_scales;    /* scale tensors as F32 (base checkpoints) instead of E8M0 */
    bool        single_file;   /* one model.safetensors, no index */
    bool        quiet;
    /* Corruptions for tests of the loader (NULL = none). */
    const char *drop_tensor;   /* leave this tensor out */
    const char *bad_shape;     /* write this tensor with its first dimension + 1 */
    const char *bad_dtype;     /* write this tensor as U8 with its byte size kept */
    const char *extra_tensor;  /* add an F32 [4] tensor of this name */
};

void gen_opts_default(struct gen_opts *o);
int  gen_checkpoint(const struct gen_opts *o, const char *dir, struct dsv4_err *err);

#endif
