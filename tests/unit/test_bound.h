/* test_bound.h - a checkpoint bound and kept open so tests can look at the weights (groups
 * checkpoint and v41; test_bound.c). */
#ifndef DSV4_TEST_BOUND_H
#define DSV4_TEST_BOUND_H

#include <stdbool.h>

#include "model/model.h"

struct bound {
    struct dsv4_config      cfg;
    struct dsv4_checkpoint  ck;
    struct dsv4_arena       arena;
    struct dsv4_weights     w;
    struct dsv4_bind_report rep;
    bool                    open;
};

/* Loads dir's config, opens its checkpoint and binds it; bound_close undoes what was done. */
int  bound_open(struct bound *b, const char *dir, struct dsv4_err *err);
void bound_close(struct bound *b);
/* Whether a problem of r names both a and b (b NULL: a alone). */
bool report_has(const struct dsv4_bind_report *r, const char *a, const char *b);

#endif
