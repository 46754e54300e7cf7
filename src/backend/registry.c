/*
 * registry.c - the backends this build has, by name (backend.h dsv4_backend_find) and in
 * order (dsv4_backend_at, dsv4_backend_list): the one list that engine open's error, `dsv4
 * ops` and the --backend usage read. A new backend adds its struct dsv4_backend_kind to
 * KINDS (docs/BACKENDS.md); the first one is the default.
 */
#include <stdio.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#if DSV4_HAVE_VULKAN
#include "backend/vulkan/vulkan.h"
#endif

/* vulkan only in builds with Vulkan (the Makefile's VULKAN switch): without it the list is
 * the CPU kinds alone. */
static const struct dsv4_backend_kind *const KINDS[] = {
    &dsv4_backend_cpu, &dsv4_backend_cpu_staged, &dsv4_backend_cpu_strict,
#if DSV4_HAVE_VULKAN
    &dsv4_backend_vulkan,
#endif
};
enum { N_KINDS = sizeof(KINDS) / sizeof(KINDS[0]) };

const struct dsv4_backend_kind *dsv4_backend_at(int i)
{
    return i >= 0 && i < N_KINDS ? KINDS[i] : NULL;
}

const struct dsv4_backend_kind *dsv4_backend_find(const char *name)
{
    if (!name || !*name) return KINDS[0];
    for (int i = 0; i < N_KINDS; i++)
        if (!strcmp(KINDS[i]->name, name)) return KINDS[i];
    return NULL;
}

void dsv4_backend_list(char *buf, size_t cap)
{
    size_t at = 0;
    if (cap) buf[0] = '\0';
    for (int i = 0; i < N_KINDS && at < cap; i++) {
        int n = snprintf(buf + at, cap - at, "%s%s", i ? ", " : "", KINDS[i]->name);
        if (n < 0) break;
        at += (size_t)n;
    }
}

int dsv4_backend_ops_missing(const struct dsv4_backend_ops *ops, char *buf, size_t cap)
{
    int    n  = 0;
    size_t at = 0;
    if (cap) buf[0] = '\0';
    for (int op = 0; op < DSV4_OP_COUNT; op++) {
        if (dsv4_op_entry(ops, (enum dsv4_op)op)) continue;
        if (at < cap) {
            int k = snprintf(buf + at, cap - at, "%s%s", n ? ", " : "", dsv4_op_name((enum dsv4_op)op));
            if (k > 0) at += (size_t)k;
        }
        n++;
    }
    return n;
}
