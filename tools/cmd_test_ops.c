/*
 * cmd_test_ops.c - `dsv4 test-ops`: the op checker (src/backend/op_check.h) outside the test
 * suite. Every backend op, at every level this machine runs (or one), against the scalar
 * reference on the checker's table of cases; prints a row per op and a column per level,
 * then each failure's reason. Exit 0 when all pass, 1 on any failure, 2 on a usage error.
 * No environment variable is read: the levels checked are the flags'.
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "backend/op_check.h"
#include "cli.h"

struct test_ops_opts {
    struct dsv4_check_opts c;
    bool                   verbose, list;
};

static bool set_op(const struct cli_opt *o, const char *cmd, const char *v, void *base)
{
    int *op = (int *)(void *)((char *)base + o->off);
    if ((*op = dsv4_op_find(v)) < 0) {
        fprintf(stderr, "dsv4 %s: no op '%s' (dsv4 test-ops --list)\n", cmd, v);
        return false;
    }
    return true;
}

#define TO(field) offsetof(struct test_ops_opts, field)
static const struct cli_opt TEST_OPS_OPTS[] = {
    { "--backend", NULL, "NAME", "the backend to check (default cpu)", CLI_STR, TO(c.backend), 0, 0, NULL },
    { "--cpu-level", NULL, "L", "only this level (default: every level; those this CPU lacks are not run)", CLI_STR,
      TO(c.level), 0, 0, NULL },
    { "--op", NULL, "NAME", "only this op (--list shows them)", CLI_CALL, TO(c.op), 0, 0, set_op },
    { "--threads", NULL, "N", "threads of the contexts checked (default 2)", CLI_INT, TO(c.n_threads), 1, 1024, NULL },
    { "--profile", NULL, "FILE", "run them through the op profiler's table, Chrome trace to FILE", CLI_STR, TO(c.profile),
      0, 0, NULL },
    { "--verbose", "-v", NULL, "a line per case and level", CLI_FLAG, TO(verbose), 0, 0, NULL },
    { "--list", NULL, NULL, "the ops and their tolerances", CLI_FLAG, TO(list), 0, 0, NULL },
};
#undef TO

int cmd_test_ops(int argc, char **argv)
{
    struct test_ops_opts   t     = { .c = { .op = -1 } };
    const struct cli_group group = { NULL, TEST_OPS_OPTS, sizeof(TEST_OPS_OPTS) / sizeof(TEST_OPS_OPTS[0]), &t };
    const struct cli_spec  spec  = { "test-ops", "usage: dsv4 test-ops [options]\n", &group, 1, NULL };
    int                    rc    = cli_parse(&spec, argc, argv);
    if (rc != CLI_PARSED) return rc;
    if (t.list) {
        for (int op = 0; op < DSV4_OP_COUNT; op++)
            printf("%-15s %s\n", dsv4_op_name((enum dsv4_op)op), dsv4_op_check_tolerance((enum dsv4_op)op));
        return 0;
    }
    struct dsv4_check_opts o = t.c;
    if (t.verbose) o.verbose = stdout;
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
