/*
 * alloc_guard.c - proves that evaluating tokens allocates nothing.
 *
 * dsv4_session_eval runs inside dsv4_alloc_guard_enter/leave, which only count (per thread,
 * a few instructions). The hook that sees allocations is alloc_interpose.c, compiled into
 * the test runner and into DSV4_DEBUG builds only: a release library interposes nothing, so
 * a program linking libdsv4 keeps its own allocator. Where the hook is in, every allocation
 * made on a thread inside a guarded region is counted (debug builds abort instead, naming
 * the size), and a test asserts the count stays zero across decoding.
 */
#include <stdio.h>
#include <stdlib.h>

#include "core/core.h"

static _Thread_local int guard_depth, exempt_depth;
static _Atomic unsigned long guarded_allocs;

void dsv4_alloc_guard_enter(void)
{
    guard_depth++;
}

void dsv4_alloc_guard_leave(void)
{
    guard_depth--;
}

void dsv4_alloc_guard_exempt(bool on)
{
    exempt_depth += on ? 1 : -1;
}

unsigned long dsv4_alloc_guard_count(void)
{
    return guarded_allocs;
}

void dsv4_alloc_guard_note(size_t n)
{
    if (guard_depth <= 0 || exempt_depth > 0) return;
    guarded_allocs++;
#ifdef DSV4_DEBUG
    fprintf(stderr, "dsv4: allocation of %zu bytes inside a guarded region (token evaluation)\n", n);
    abort();
#else
    (void)n;
#endif
}
