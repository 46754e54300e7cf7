/* op_list.c - names and table entries of the ops of op_list.h. */
#include <string.h>

#include "backend/backend.h"

/* Every field after `name` is an op of the list: a field added to the table without its line
 * in DSV4_OP_LIST (or the other way round) stops the build here. */
_Static_assert(sizeof(struct dsv4_backend_ops) == sizeof(const char *) + DSV4_OP_COUNT * sizeof(dsv4_op_fn),
               "DSV4_OP_LIST (op_list.h) and struct dsv4_backend_ops (backend.h) must list the same ops");

static const char *const names[DSV4_OP_COUNT] = {
#define NAME_(u, l) #l,
    DSV4_OP_LIST(NAME_)
#undef NAME_
};

const char *dsv4_op_name(enum dsv4_op op)
{
    return (unsigned)op < DSV4_OP_COUNT ? names[op] : "?";
}

int dsv4_op_find(const char *name)
{
    for (int i = 0; i < DSV4_OP_COUNT; i++)
        if (!strcmp(names[i], name)) return i;
    return -1;
}

dsv4_op_fn dsv4_op_entry(const struct dsv4_backend_ops *ops, enum dsv4_op op)
{
    switch (op) {
#define ENTRY_(u, l)                                                                                               \
    case DSV4_OP_##u: return (dsv4_op_fn)ops->l;
        DSV4_OP_LIST(ENTRY_)
#undef ENTRY_
    default: return NULL;
    }
}
