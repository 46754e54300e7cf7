/* cmd_gen.c - `dsv4 gen`: write a random-weight checkpoint in the official layout. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "support/gen.h"

static const char GEN_SYNOPSIS[] = "usage: dsv4 gen --preset tiny-a|tiny-b|flash-shaped|tiny-v41 -o DIR [options]\n";

struct gen_args {
    struct gen_opts g;
    const char     *out;
};

#define GA(field) offsetof(struct gen_args, field)
static const struct cli_opt GEN_OPTS[] = {
    { "--preset", NULL, "NAME", "tiny-a, tiny-b, flash-shaped or tiny-v41 (DeepSeek-V4.1; default tiny-a)", CLI_STR, GA(g.preset), 0, 0, NULL },
    { "--out", "-o", "DIR", "the checkpoint directory to write", CLI_STR, GA(out), 0, 0, NULL },
    { "--seed", NULL, "N", "random seed (default 1)", CLI_LLONG, GA(g.seed), 0, (double)(1LL << 62), NULL },
    { "--layers", NULL, "N", "flash-shaped: number of main layers (default 2: one CSA, one HCA)", CLI_INT, GA(g.layers), 1,
      43, NULL },
    { "--experts", NULL, "N",
      "flash-shaped: routed experts per layer (default 256; fewer fit more layers in memory\nwith the same reads per "
      "token: docs/PERF.md)",
      CLI_INT, GA(g.experts), 6, 256, NULL },
    { "--swiglu-limit", NULL, "X", "override the SwiGLU clamp (e.g. 0.5 so that clamps fire)", CLI_DOUBLE,
      GA(g.swiglu_limit), 0, 1e6, NULL },
    { "--no-mtp", NULL, NULL, "leave out the MTP block", CLI_FLAG, GA(g.no_mtp), 0, 0, NULL },
    { "--fp8-experts", NULL, NULL, "routed experts as FP8 128x128 (first Flash release) instead of FP4", CLI_FLAG,
      GA(g.fp8_experts), 0, 0, NULL },
    { "--f32-scales", NULL, NULL, "F32 scale tensors (base checkpoints) instead of E8M0", CLI_FLAG, GA(g.f32_scales), 0, 0,
      NULL },
    { "--single-file", NULL, NULL, "one model.safetensors instead of shards + index", CLI_FLAG, GA(g.single_file), 0, 0,
      NULL },
    { "-q", NULL, NULL, "quiet", CLI_FLAG, GA(g.quiet), 0, 0, NULL },
};
#undef GA

int cmd_gen(int argc, char **argv)
{
    struct gen_args a = { .out = NULL };
    gen_opts_default(&a.g);
    const struct cli_group group = { NULL, GEN_OPTS, sizeof(GEN_OPTS) / sizeof(GEN_OPTS[0]), &a };
    const struct cli_spec  spec  = { "gen", GEN_SYNOPSIS, &group, 1, NULL };
    int                    rc    = cli_parse(&spec, argc, argv);
    if (rc != CLI_PARSED) return rc;
    if (!a.out) return cli_usage_error(&spec, "-o DIR is required");
    struct dsv4_err err;
    if (gen_checkpoint(&a.g, a.out, &err) != DSV4_OK) {
        fprintf(stderr, "dsv4 gen: %s\n", err.msg);
        return 1;
    }
    if (!a.g.quiet) fprintf(stderr, "dsv4 gen: wrote %s checkpoint (seed %llu) to %s\n", a.g.preset, a.g.seed, a.out);
    return 0;
}
