/*
 * op_check.h - the op checker ("test-backend-ops"): every op of op_list.h run through a
 * backend, at each level (code path) the backend names, against the CPU's scalar reference
 * table dsv4_cpu_ref_ops, on a table of cases per op: awkward sizes (1, 3, 17, 31, widths
 * that are not multiples of the vector or block sizes), the widths of every layer kind of the
 * tiny-a, tiny-b and flash-shaped presets, paged KV rows with a non-identity page table, and
 * weights in every format. Inputs are random with a fixed seed per case; every output is
 * compared with the reference's under the op's stated tolerance (dsv4_op_check_tolerance).
 *
 * Projections run twice per level where the backend's prepare_weights changes their
 * descriptors (the CPU's interleaved tiles on AVX512-BF16): on the release layout and on the
 * prepared copy. Levels the machine lacks are reported as not run. `dsv4 test-ops` and the
 * test suite (`kernels ops_vs_reference_all_levels`) print this report.
 */
#ifndef DSV4_OP_CHECK_H
#define DSV4_OP_CHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "backend/backend.h"

enum { DSV4_CHECK_MAX_LEVELS = 8 };

struct dsv4_check_opts {
    const char *backend;   /* the kind's name; NULL = the default */
    const struct dsv4_backend_kind *kind; /* or this kind itself (tests: a table with a hole) */
    const char *level;     /* only this level; NULL = every level the kind lists */
    int         op;        /* only this op (enum dsv4_op); -1 = all */
    int         n_threads; /* threads of the contexts checked; 0 = 2 (splits work, fits any machine) */
    const char *profile;   /* run the checked contexts through the profiler's table, trace to this file */
    FILE       *verbose;   /* a line per case and level, or NULL */
};

enum dsv4_check_status {
    DSV4_CHECK_NOT_RUN, /* the machine lacks the level (or the op was not selected) */
    DSV4_CHECK_OK,
    DSV4_CHECK_FAIL,    /* an output beyond the tolerance, or an error */
    DSV4_CHECK_MISSING, /* the level's table has no entry for the op: a failure */
};

/* One op at one level. */
struct dsv4_check_cell {
    enum dsv4_check_status status;
    int                    runs;          /* case runs compared (cases x weight layouts) */
    size_t                 values, differ; /* values compared; of those, not bit-identical */
    double                 max_abs;       /* largest difference from the reference */
    double                 max_used;      /* largest difference as a fraction of the one allowed */
    int                    refused;       /* cases whose weights the level refused as unsupported
                                           * (prepare_weights: DSV4_EUNSUPPORTED, e.g. Vulkan and
                                           * FP8 blocks of 32): not run, not failed */
    char                   why[200];      /* the first failure: case, index, values */
    char                   refusal[200];  /* the first refusal's message */
};

struct dsv4_check_report {
    char                   backend[96];   /* the backend's describe line at its default level */
    int                    n_levels;
    char                   level[DSV4_CHECK_MAX_LEVELS][24];
    bool                   here[DSV4_CHECK_MAX_LEVELS];
    bool                   selected[DSV4_OP_COUNT];
    struct dsv4_check_cell cell[DSV4_OP_COUNT][DSV4_CHECK_MAX_LEVELS];
};

/* Runs the check into *r (caller's memory). Returns DSV4_OK when it ran, whatever the
 * outcome (see dsv4_op_check_failures), or an error (no such backend or level; the backend
 * cannot be created). A backend whose buffers are not host memory gets its inputs through
 * upload and returns its outputs through download (op_check.c). */
int  dsv4_op_check(const struct dsv4_check_opts *o, struct dsv4_check_report *r, struct dsv4_err *err);
/* Cells that are FAIL or MISSING. */
int  dsv4_op_check_failures(const struct dsv4_check_report *r);
/* The report: a row per selected op, a column per level, the failures' reasons below. */
void dsv4_op_check_print(const struct dsv4_check_report *r, FILE *f);
/* The tolerance op is checked with, in words ("bit-exact", ...). */
const char *dsv4_op_check_tolerance(enum dsv4_op op);

#endif /* DSV4_OP_CHECK_H */
