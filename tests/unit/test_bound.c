/* test_bound.c - binding a generated checkpoint for the tests (test_bound.h). */
#include <string.h>

#include "test_bound.h"

int bound_open(struct bound *b, const char *dir, struct dsv4_err *err)
{
    memset(b, 0, sizeof(*b));
    int rc = dsv4_config_load(&b->cfg, dir, err);
    if (rc) return rc;
    rc = dsv4_checkpoint_open(&b->ck, dir, err);
    if (rc) return rc;
    b->open = true;
    dsv4_arena_init(&b->arena, 1 << 16);
    return dsv4_weights_bind(&b->w, &b->cfg, &b->ck, &b->arena, &b->rep, err);
}

void bound_close(struct bound *b)
{
    if (!b->open) return;
    dsv4_bind_report_free(&b->rep);
    dsv4_arena_free(&b->arena);
    dsv4_checkpoint_close(&b->ck);
    b->open = false;
}

bool report_has(const struct dsv4_bind_report *r, const char *a, const char *b)
{
    for (int i = 0; i < r->n_problems; i++)
        if (strstr(r->problems[i].text, a) && (!b || strstr(r->problems[i].text, b))) return true;
    return false;
}
