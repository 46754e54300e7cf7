/*
 * op_list.h - the backend ops by number: one list, in the order of the fields of struct
 * dsv4_backend_ops (backend.h), that the profiler, `dsv4 ops` and the op checker
 * (op_check.h, `dsv4 test-ops`) all walk. Adding an op is one line of DSV4_OP_LIST next to
 * its field; op_list.c fails to compile when the list and the table disagree in length.
 */
#ifndef DSV4_OP_LIST_H
#define DSV4_OP_LIST_H

#include <stdbool.h>

/* X(ENUM_SUFFIX, field_name) for every op, in table order. */
#define DSV4_OP_LIST(X)                                                                      \
    X(LINEAR, linear)                                                                        \
    X(RMSNORM, rmsnorm)                                                                      \
    X(HEAD_RMS, head_rms)                                                                    \
    X(ROPE, rope)                                                                            \
    X(FP8_SIM, fp8_sim)                                                                      \
    X(FP4_SIM, fp4_sim)                                                                      \
    X(HADAMARD, hadamard)                                                                    \
    X(HC_PRE, hc_pre)                                                                        \
    X(HC_POST, hc_post)                                                                      \
    X(HC_HEAD, hc_head)                                                                      \
    X(STEP_BEGIN, step_begin)                                                                \
    X(ATTENTION, attention)                                                                  \
    X(INDEXER_SCORES, indexer_scores)                                                        \
    X(INDEXER_TOPK, indexer_topk)                                                            \
    X(COMPRESS, compress)                                                                    \
    X(STORE_ROWS, store_rows)                                                                \
    X(EMBED, embed)                                                                          \
    X(SCALE, scale)                                                                          \
    X(ADD_STREAMS, add_streams)                                                              \
    X(ENGRAM_ROWS, engram_rows)                                                              \
    X(ENGRAM_GATE, engram_gate)                                                              \
    X(ROUTER, router)                                                                        \
    X(EXPERT, expert)                                                                        \
    X(EXPERTS, experts)                                                                      \
    X(MOE_DISPATCH, moe_dispatch)                                                            \
    X(MOE_COMBINE, moe_combine)

enum dsv4_op {
#define DSV4_OP_ENUM_(u, l) DSV4_OP_##u,
    DSV4_OP_LIST(DSV4_OP_ENUM_)
#undef DSV4_OP_ENUM_
    DSV4_OP_COUNT
};

struct dsv4_backend_ops;

/* The op's field name ("linear"), or "?" out of range. */
const char *dsv4_op_name(enum dsv4_op op);
/* The op called name, or -1. */
int         dsv4_op_find(const char *name);

/* A table's entry for op as an untyped function pointer (for comparing tables and finding
 * holes; never called through this type), NULL when the table has none. */
typedef void (*dsv4_op_fn)(void);
dsv4_op_fn dsv4_op_entry(const struct dsv4_backend_ops *ops, enum dsv4_op op);

#endif /* DSV4_OP_LIST_H */
