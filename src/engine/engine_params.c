/*
 * engine_params.c - the default engine options (include/dsv4.h), in a file of their own:
 * code that only fills options (the server's front end, the fuzz harnesses that link the
 * library as an archive without the CPU backend) links this and not the engine.
 */
#include <string.h>

#include "dsv4.h"

void dsv4_engine_params_default(struct dsv4_engine_params *p)
{
    memset(p, 0, sizeof(*p));
    p->revision = DSV4_REVISION_CURRENT;
}
