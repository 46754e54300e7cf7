/* cmd_gen.c - `dsv4 gen`: write a random-weight checkpoint in the official layout. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "support/gen.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dsv4 gen --preset tiny-a|tiny-b|flash-shaped -o DIR [options]\n"
            "  --seed N            random seed (default 1)\n"
            "  --layers N          flash-shaped: number of main layers (default 2: one CSA, one HCA)\n"
            "  --swiglu-limit X    override the SwiGLU clamp (e.g. 0.5 so that clamps fire)\n"
            "  --no-mtp            leave out the MTP block\n"
            "  --fp8-experts       routed experts as FP8 128x128 (first Flash release) instead of FP4\n"
            "  --f32-scales        F32 scale tensors (base checkpoints) instead of E8M0\n"
            "  --single-file       one model.safetensors instead of shards + index\n"
            "  -q                  quiet\n");
}

int cmd_gen(int argc, char **argv)
{
    struct gen_opts o;
    gen_opts_default(&o);
    const char *out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long long   n;
        double      x;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--preset")) {
            if (!(o.preset = cli_value("gen", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--out")) {
            if (!(out = cli_value("gen", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--seed")) {
            if (!(v = cli_value("gen", argc, argv, &i)) || !cli_parse_int("gen", a, v, 0, (long long)1 << 62, &n)) return 2;
            o.seed = (unsigned long long)n;
        } else if (!strcmp(a, "--layers")) {
            if (!(v = cli_value("gen", argc, argv, &i)) || !cli_parse_int("gen", a, v, 1, 43, &n)) return 2;
            o.layers = (int)n;
        } else if (!strcmp(a, "--swiglu-limit")) {
            if (!(v = cli_value("gen", argc, argv, &i)) || !cli_parse_float("gen", a, v, 0, 1e6, &x)) return 2;
            o.swiglu_limit = x;
        } else if (!strcmp(a, "--no-mtp")) {
            o.no_mtp = true;
        } else if (!strcmp(a, "--fp8-experts")) {
            o.fp8_experts = true;
        } else if (!strcmp(a, "--f32-scales")) {
            o.f32_scales = true;
        } else if (!strcmp(a, "--single-file")) {
            o.single_file = true;
        } else if (!strcmp(a, "-q")) {
            o.quiet = true;
        } else {
            fprintf(stderr, "dsv4 gen: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!out) {
        fprintf(stderr, "dsv4 gen: -o DIR is required\n");
        usage(stderr);
        return 2;
    }
    struct dsv4_err err;
    if (gen_checkpoint(&o, out, &err) != DSV4_OK) {
        fprintf(stderr, "dsv4 gen: %s\n", err.msg);
        return 1;
    }
    if (!o.quiet) fprintf(stderr, "dsv4 gen: wrote %s checkpoint (seed %llu) to %s\n", o.preset, o.seed, out);
    return 0;
}
