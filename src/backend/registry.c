/*
 * registry.c - the backends this build has, by name (backend.h dsv4_backend_find). A new
 * backend adds its struct dsv4_backend_kind here (docs/BACKENDS.md).
 */
#include <string.h>

#include "backend/cpu/cpu.h"

const struct dsv4_backend_kind *dsv4_backend_find(const char *name)
{
    static const struct dsv4_backend_kind *const kinds[] = { &dsv4_backend_cpu, &dsv4_backend_cpu_staged };
    if (!name || !*name) return kinds[0];
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
        if (!strcmp(kinds[i]->name, name)) return kinds[i];
    return NULL;
}
