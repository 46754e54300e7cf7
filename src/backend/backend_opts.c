/*
 * backend_opts.c - the backend options string (dsv4_engine_params.backend_opts,
 * dsv4_backend_params.opts): "key=value" entries separated by commas, where a piece without
 * '=' continues the value before it, so that a value may hold commas ("gemm_min=3,7,9").
 * A key given twice takes its last value: front ends append the flags after the
 * environment. The generic layer only splits; each backend says which keys it takes.
 */
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"

enum { OPTS_MAX = 512 };

/* Whether the piece of s from i to the next comma (or the end) holds a '='. */
static bool piece_has_eq(const char *s, size_t i)
{
    for (; s[i] && s[i] != ','; i++)
        if (s[i] == '=') return true;
    return false;
}

int dsv4_backend_opts_each(const char *opts, const char *backend, struct dsv4_err *err,
                           int (*fn)(const char *key, const char *val, void *ud), void *ud)
{
    if (!opts || !*opts) return DSV4_OK;
    char buf[OPTS_MAX];
    if (strlen(opts) >= sizeof(buf))
        return dsv4_err_set(err, DSV4_EINVAL, "backend '%s': options longer than %d characters", backend, OPTS_MAX - 1);
    snprintf(buf, sizeof(buf), "%s", opts);
    /* entries begin at 0 and after each comma whose piece holds '=': cut there */
    for (size_t i = 0; buf[i]; i++)
        if (buf[i] == ',' && piece_has_eq(buf, i + 1)) buf[i] = '\0';
    size_t n = strlen(opts);
    for (size_t at = 0, len; at < n; at += len + 1) {
        char *entry = buf + at, *eq = strchr(entry, '=');
        len         = strlen(entry); /* before the cut at '=' */
        if (!eq || eq == entry)
            return dsv4_err_set(err, DSV4_EINVAL, "backend '%s': option '%s' is not key=value", backend, entry);
        *eq    = '\0';
        int rc = fn(entry, eq + 1, ud);
        if (rc) return rc;
    }
    return DSV4_OK;
}

struct opt_find {
    const char *key;
    char       *buf;
    size_t      cap;
    bool        found;
};

static int find_one(const char *key, const char *val, void *ud)
{
    struct opt_find *f = ud;
    if (strcmp(key, f->key)) return DSV4_OK;
    snprintf(f->buf, f->cap, "%s", val); /* the last one given wins */
    f->found = true;
    return DSV4_OK;
}

bool dsv4_backend_opt_get(const char *opts, const char *key, char *buf, size_t cap)
{
    struct opt_find f = { key, buf, cap, false };
    if (dsv4_backend_opts_each(opts, "", NULL, find_one, &f)) return false;
    return f.found;
}
