/*
 * arena.c - bump allocation for one lifetime (engine, session, step scratch, request).
 *
 * Blocks are malloc'd as the arena grows and freed all at once. A mark/reset pair gives a
 * temporary scope: memory handed out after the mark is reused after the reset. With
 * DSV4_DEBUG fresh memory is filled with 0xAA and reset memory with 0x55, so use of
 * uninitialised or stale scratch shows up as garbage instead of plausible zeros.
 */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

struct dsv4_arena_block {
    struct dsv4_arena_block *prev;
    size_t                   cap; /* usable bytes in data[] */
    size_t                   off; /* bytes used */
    _Alignas(64) unsigned char data[];
};

void dsv4_arena_init(struct dsv4_arena *a, size_t block_min)
{
    a->head      = NULL;
    a->block_min = block_min ? block_min : (size_t)1 << 20;
    a->used      = 0;
}

void dsv4_arena_free(struct dsv4_arena *a)
{
    struct dsv4_arena_block *b = a->head;
    while (b) {
        struct dsv4_arena_block *prev = b->prev;
        free(b);
        b = prev;
    }
    a->head = NULL;
    a->used = 0;
}

static size_t align_up(size_t v, size_t align)
{
    return (v + align - 1) & ~(align - 1);
}

void *dsv4_arena_alloc(struct dsv4_arena *a, size_t size, size_t align)
{
    if (align == 0) align = 16;
    DSV4_ASSERT((align & (align - 1)) == 0 && align <= 4096);
    struct dsv4_arena_block *b = a->head;
    if (b) {
        size_t off = align_up(b->off, align);
        if (off <= b->cap && size <= b->cap - off) {
            b->off = off + size;
            a->used += size;
#ifdef DSV4_DEBUG
            memset(b->data + off, 0xAA, size);
#endif
            return b->data + off;
        }
    }
    size_t cap = size + align;
    if (cap < size) return NULL; /* overflow */
    if (cap < a->block_min) cap = a->block_min;
    if (cap > SIZE_MAX - sizeof(*b)) return NULL;
    b = malloc(sizeof(*b) + cap);
    if (!b) return NULL;
    b->prev = a->head;
    b->cap  = cap;
    b->off  = 0;
    a->head = b;
    size_t off = align_up(0, align);
    b->off = off + size;
    a->used += size;
#ifdef DSV4_DEBUG
    memset(b->data + off, 0xAA, size);
#endif
    return b->data + off;
}

void *dsv4_arena_zalloc(struct dsv4_arena *a, size_t size, size_t align)
{
    void *p = dsv4_arena_alloc(a, size, align);
    if (p) memset(p, 0, size);
    return p;
}

char *dsv4_arena_strdup(struct dsv4_arena *a, const char *s)
{
    size_t n = strlen(s) + 1;
    char  *p = dsv4_arena_alloc(a, n, 1);
    if (p) memcpy(p, s, n);
    return p;
}

struct dsv4_arena_mark dsv4_arena_get_mark(const struct dsv4_arena *a)
{
    struct dsv4_arena_mark m = { a->head, a->head ? a->head->off : 0 };
    return m;
}

void dsv4_arena_reset_to(struct dsv4_arena *a, struct dsv4_arena_mark m)
{
    while (a->head && a->head != m.block) {
        struct dsv4_arena_block *prev = a->head->prev;
        free(a->head);
        a->head = prev;
    }
    if (a->head) {
#ifdef DSV4_DEBUG
        memset(a->head->data + m.off, 0x55, a->head->off - m.off);
#endif
        a->head->off = m.off;
    }
}
