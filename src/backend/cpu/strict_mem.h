/*
 * strict_mem.h - memory the host cannot peek into, for the `cpu-strict` backend
 * (cpu_strict.c): one reserved range of address space, kept without access (PROT_NONE)
 * except while the backend itself touches it (an op, upload, download or copy), so that a
 * stray host read or write of a backend buffer faults instead of passing.
 *
 * Blocks are handed out page-aligned from the range by a first-fit allocator that coalesces
 * on free. Access is a gate: dsv4_strict_open / dsv4_strict_close nest (ops call ops) and
 * may run on several threads at once (server workers, scheduler threads); the first open
 * makes [base, high-water) readable and writable in one mprotect, the last close takes it
 * back in one more. Each transition is a system call, counted for the cost figures.
 */
#ifndef DSV4_STRICT_MEM_H
#define DSV4_STRICT_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/core.h"

struct dsv4_strict_mem;

/* Reserves `reserve` bytes of address space (no memory is committed: MAP_NORESERVE), or less
 * when the system refuses that much (halving down to 1 GiB: valgrind, ulimit -v). */
int  dsv4_strict_mem_create(struct dsv4_strict_mem **out, size_t reserve, struct dsv4_err *err);
void dsv4_strict_mem_free(struct dsv4_strict_mem *g);

/* bytes, zero-filled, page-aligned, without access outside the gate; NULL when the range is
 * full. Pages are committed when an op first writes them. Release zeroes the block (whole
 * huge pages go back to the system; the range stays reserved). */
void *dsv4_strict_alloc(struct dsv4_strict_mem *g, size_t bytes);
void  dsv4_strict_release(struct dsv4_strict_mem *g, void *p, size_t bytes);

/* The gate: open before the backend touches its memory, close after; nests and is thread
 * safe (a mutex over the count, access given on 0 -> 1 and taken on 1 -> 0). */
void dsv4_strict_open(struct dsv4_strict_mem *g);
void dsv4_strict_close(struct dsv4_strict_mem *g);

/* Whether p lies in the reserved range. */
bool     dsv4_strict_owns(const struct dsv4_strict_mem *g, const void *p);
/* The mprotect calls made so far (two per outermost open/close pair). */
uint64_t dsv4_strict_transitions(struct dsv4_strict_mem *g);
/* Bytes reserved and bytes handed out now. */
void     dsv4_strict_usage(struct dsv4_strict_mem *g, size_t *reserved, size_t *used);

#endif /* DSV4_STRICT_MEM_H */
