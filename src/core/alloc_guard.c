/*
 * alloc_guard.c - proves that evaluating tokens allocates nothing.
 *
 * dsv4_session_eval runs inside dsv4_alloc_guard_enter/leave. This file interposes malloc,
 * calloc, realloc, posix_memalign and aligned_alloc (forwarding to glibc's __libc_*
 * functions) and counts every call made on a thread that is inside a guarded region; debug
 * builds (DSV4_DEBUG) abort instead, naming the size. A test asserts the count stays zero
 * across decoding. Sanitizer builds keep their own allocator and call its malloc hook
 * (__sanitizer_malloc_hook, a weak symbol of the ASan and TSan runtimes) after every
 * allocation, so the count is the same there.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/core.h"

static _Thread_local int guard_depth;
static _Atomic unsigned long guarded_allocs;

void dsv4_alloc_guard_enter(void)
{
    guard_depth++;
}

void dsv4_alloc_guard_leave(void)
{
    guard_depth--;
}

unsigned long dsv4_alloc_guard_count(void)
{
    return guarded_allocs;
}

static void note(size_t n)
{
    if (guard_depth <= 0) return;
    guarded_allocs++;
#ifdef DSV4_DEBUG
    fprintf(stderr, "dsv4: allocation of %zu bytes inside a guarded region (token evaluation)\n", n);
    abort();
#else
    (void)n;
#endif
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
void __sanitizer_malloc_hook(const volatile void *ptr, size_t size);

void __sanitizer_malloc_hook(const volatile void *ptr, size_t size)
{
    (void)ptr;
    note(size);
}
#else

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);


void *malloc(size_t n)
{
    note(n);
    return __libc_malloc(n);
}

void *calloc(size_t a, size_t b)
{
    note(a * b);
    return __libc_calloc(a, b);
}

void *realloc(void *p, size_t n)
{
    note(n);
    return __libc_realloc(p, n);
}

int posix_memalign(void **out, size_t align, size_t n)
{
    note(n);
    if (align < sizeof(void *) || (align & (align - 1))) return EINVAL;
    void *p = __libc_memalign(align, n);
    if (!p && n) return ENOMEM;
    *out = p;
    return 0;
}

void *aligned_alloc(size_t align, size_t n)
{
    note(n);
    return __libc_memalign(align, n);
}
#endif
