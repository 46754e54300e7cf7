/*
 * cmd_ops.c - `dsv4 ops`: what runs each backend op (one row per op of op_list.h) at the
 * selected backend and level on this machine, and which ops run on plain C. The O(d)-per-row
 * ops (norms, RoPE, FP8/FP4 simulation, Hadamard, routing and the data-movement ops) are
 * plain C on some levels by design; a profile (DSV4_PROFILE=FILE) shows their share of the
 * time. The lines come from the backend's describe_op: this file names no backend's types.
 */
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "cli.h"

/* "levels: scalar avx2 (not on this machine: avx512 avx512bf16)" */
static void print_levels(const struct dsv4_backend_kind *kind)
{
    if (!kind->level) return;
    printf("levels:");
    bool here;
    for (int i = 0; kind->level(i, &here); i++)
        if (here) printf(" %s", kind->level(i, &here));
    int n_absent = 0;
    for (int i = 0; kind->level(i, &here); i++)
        if (!here) printf("%s%s", n_absent++ ? " " : " (not on this machine: ", kind->level(i, &here));
    printf("%s\n", n_absent ? ")" : "");
}

int cmd_ops(int argc, char **argv)
{
    struct dsv4_engine_params ep;
    cli_engine_params(&ep);
    const struct cli_group group = cli_engine_group(&ep, false);
    const struct cli_spec  spec  = { "ops", "usage: dsv4 ops [options]\n", &group, 1, NULL };
    int                    rc    = cli_parse(&spec, argc, argv);
    if (rc != CLI_PARSED) return rc;
    const struct dsv4_backend_kind *kind = dsv4_backend_find(ep.backend);
    char                            names[256];
    dsv4_backend_list(names, sizeof(names));
    if (!kind) {
        fprintf(stderr, "dsv4 ops: this build has no backend '%s' (it has: %s)\n", ep.backend, names);
        return 1;
    }
    struct dsv4_backend_params bp = { .opts = ep.backend_opts, .n_threads = ep.n_threads };
    struct dsv4_err            err;
    void                      *impl = NULL;
    if (kind->create(&impl, &bp, &err)) {
        fprintf(stderr, "dsv4 ops: %s\n", err.msg);
        return 1;
    }
    char line[512];
    kind->describe(impl, line, sizeof(line));
    printf("backends: %s\nbackend: %s\n", names, line);
    if (kind->devices) {
        char devs[2048];
        kind->devices(impl, devs, sizeof(devs));
        printf("devices (* in use; option device=N):\n%s", devs);
    }
    print_levels(kind);
    int n_plain = 0;
    for (int op = 0; op < DSV4_OP_COUNT; op++) {
        int plain = 1;
        if (kind->describe_op) plain = kind->describe_op(impl, (enum dsv4_op)op, line, sizeof(line));
        else snprintf(line, sizeof(line), "(the backend does not describe its ops)");
        printf("  %-15s %s%s\n", dsv4_op_name((enum dsv4_op)op), line, plain ? "   [plain C]" : "");
        n_plain += plain;
    }
    printf("%d of %d ops on plain C on this machine\n", n_plain, (int)DSV4_OP_COUNT);
    kind->destroy(impl);
    return 0;
}
