/*
 * cmd_ops.c - `dsv4 ops`: which implementation runs each backend op on this machine, and
 * which ops run on plain C. The O(d)-per-row ops (norms, RoPE, FP8/FP4 simulation,
 * Hadamard, routing and expert glue) are scalar by design; a profile (DSV4_PROFILE=FILE)
 * shows their share of the time.
 */
#include <stdio.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "cli.h"

int cmd_ops(int argc, char **argv)
{
    struct dsv4_engine_params ep;
    dsv4_engine_params_default(&ep);
    cli_engine_env(&ep);
    for (int i = 1; i < argc; i++) {
        int eo = cli_engine_option("ops", argc, argv, &i, &ep);
        if (eo < 0) return 2;
        if (eo > 0) continue;
        bool help = !strcmp(argv[i], "-h") || !strcmp(argv[i], "--help");
        if (!help) fprintf(stderr, "dsv4 ops: unknown option '%s'\n", argv[i]);
        fprintf(help ? stdout : stderr, "usage: dsv4 ops [--cpu-level L]   (or DSV4_CPU)\n");
        return help ? 0 : 2;
    }
    struct dsv4_err  err;
    struct dsv4_cpu *cpu;
    if (dsv4_cpu_create(&cpu, ep.cpu_level, 0, &err)) {
        fprintf(stderr, "dsv4 ops: %s\n", err.msg);
        return 1;
    }
    printf("cpu: best level %s, using %s, %d threads\n", dsv4_cpu_level_name(dsv4_cpu_detect()),
           cpu->ref ? "ref (DSV4_CPU=ref)" : dsv4_cpu_level_name(cpu->level), cpu->n_threads);
    struct dsv4_op_impl ops[64];
    int                 n = dsv4_cpu_describe(cpu, ops, 64), n_scalar = 0;
    for (int i = 0; i < n; i++) {
        printf("  %-40s %s%s\n", ops[i].op, ops[i].impl, ops[i].scalar ? "   [scalar]" : "");
        n_scalar += ops[i].scalar;
    }
    printf("%d of %d ops on plain C on this machine\n", n_scalar, n);
    dsv4_cpu_free(cpu);
    return 0;
}
