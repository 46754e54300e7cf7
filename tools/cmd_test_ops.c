/*
 * cmd_test_ops.c - `dsv4 test-ops`: the op checker (src/backend/op_check.h) outside the test
 * suite. Every backend op, at every level this machine runs (or one), against the scalar
 * reference on the checker's table of cases; prints a row per op and a column per level,
 * then each failure's reason. Exit 0 when all pass, 1 on any failure, 2 on a usage error.
 * No environment variable is read: the levels checked are the flags'.
 */
#include <stdio.h>
#include <string.h>

#include "backend/op_check.h"
#include "cli.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: dsv4 test-ops [options]\n"
               "  --backend NAME    the backend to check (default cpu)\n"
               "  --cpu-level L     only this level (default: every level; those this CPU lacks are not run)\n"
               "  --op NAME         only this op (--list shows them)\n"
               "  --threads N       threads of the contexts checked (default 2)\n"
               "  --profile FILE    run them through the op profiler's table, Chrome trace to FILE\n"
               "  -v, --verbose     a line per case and level\n"
               "  --list            the ops and their tolerances\n");
}

int cmd_test_ops(int argc, char **argv)
{
    struct dsv4_check_opts o = { .op = -1 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long long   n;
        if (!strcmp(a, "--backend")) {
            if (!(v = cli_value("test-ops", argc, argv, &i))) return 2;
            o.backend = v;
        } else if (!strcmp(a, "--cpu-level")) {
            if (!(v = cli_value("test-ops", argc, argv, &i))) return 2;
            o.level = v;
        } else if (!strcmp(a, "--op")) {
            if (!(v = cli_value("test-ops", argc, argv, &i))) return 2;
            if ((o.op = dsv4_op_find(v)) < 0) {
                fprintf(stderr, "dsv4 test-ops: no op '%s' (dsv4 test-ops --list)\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--threads")) {
            if (!(v = cli_value("test-ops", argc, argv, &i)) || !cli_parse_int("test-ops", a, v, 1, 1024, &n)) return 2;
            o.n_threads = (int)n;
        } else if (!strcmp(a, "--profile")) {
            if (!(v = cli_value("test-ops", argc, argv, &i))) return 2;
            o.profile = v;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            o.verbose = stdout;
        } else if (!strcmp(a, "--list")) {
            for (int op = 0; op < DSV4_OP_COUNT; op++)
                printf("%-15s %s\n", dsv4_op_name((enum dsv4_op)op), dsv4_op_check_tolerance((enum dsv4_op)op));
            return 0;
        } else {
            bool help = !strcmp(a, "-h") || !strcmp(a, "--help");
            if (!help) fprintf(stderr, "dsv4 test-ops: unknown option '%s'\n", a);
            usage(help ? stdout : stderr);
            return help ? 0 : 2;
        }
    }
    static struct dsv4_check_report r; /* a few tens of KiB: not on the stack */
    struct dsv4_err                 err;
    double                          t0 = cli_now();
    if (dsv4_op_check(&o, &r, &err)) {
        fprintf(stderr, "dsv4 test-ops: %s\n", err.msg);
        return 1;
    }
    dsv4_op_check_print(&r, stdout);
    printf("(%.1f s)\n", cli_now() - t0);
    return dsv4_op_check_failures(&r) ? 1 : 0;
}
