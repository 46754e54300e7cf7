/*
 * strict_mem.h - memory the host cannot peek into, for the `cpu-strict` backend
 * (cpu_strict.c): one reserved range of shared memory mapped twice. The addresses the
 * backend hands out (alloc) lie in the host's view, which has no access at all
 * (PROT_NONE), so a stray host read or write of a backend buffer faults instead of passing.
 * The backend's own code (its ops, upload, download, copy) reaches the same bytes through a
 * second, readable and writable view at a fixed distance: dsv4_strict_in translates.
 *
 * Why two views and not mprotect around each op: an mprotect is a system call and a TLB
 * flush; measured on this project's machine, about 20 us a transition, two per op, which
 * made a tiny model's decode step 10 to 20 times slower. A translation costs an add.
 * Blocks are handed out page-aligned by a first-fit allocator that coalesces on free.
 */
#ifndef DSV4_STRICT_MEM_H
#define DSV4_STRICT_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/core.h"

struct dsv4_strict_mem {
    uint8_t *host;    /* the host's view: PROT_NONE, what alloc hands out */
    uint8_t *own;     /* the backend's view of the same bytes: read and write */
    size_t   reserve; /* bytes of each view */
    void    *alloc;   /* the allocator's state (strict_mem.c) */
};

/* Reserves `reserve` bytes of shared memory (nothing is committed until written), or less
 * when the system refuses that much (halving down to 1 GiB: valgrind, ulimit -v). */
int  dsv4_strict_mem_create(struct dsv4_strict_mem **out, size_t reserve, struct dsv4_err *err);
void dsv4_strict_mem_free(struct dsv4_strict_mem *g);

/* bytes, zero-filled, page-aligned, in the host's view (no access there); NULL when the
 * range is full. Release gives the pages back to the system (the range stays reserved). */
void *dsv4_strict_alloc(struct dsv4_strict_mem *g, size_t bytes);
void  dsv4_strict_release(struct dsv4_strict_mem *g, void *p, size_t bytes);

/* Whether p lies in the host's view. */
static inline bool dsv4_strict_owns(const struct dsv4_strict_mem *g, const void *p)
{
    const uint8_t *b = p;
    return g && b >= g->host && b < g->host + g->reserve;
}

/* The backend's address of p: the same byte in its own view when p is in the host's view,
 * p itself otherwise (host arrays, the mapped checkpoint, an address already translated). */
static inline void *dsv4_strict_in(const struct dsv4_strict_mem *g, const void *p)
{
    return dsv4_strict_owns(g, p) ? g->own + ((const uint8_t *)p - g->host) : (void *)(uintptr_t)p;
}

/* Bytes reserved and bytes handed out now. */
void dsv4_strict_usage(struct dsv4_strict_mem *g, size_t *reserved, size_t *used);

#endif /* DSV4_STRICT_MEM_H */
