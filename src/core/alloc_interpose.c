/*
 * alloc_interpose.c - the allocation guard's view of malloc (see alloc_guard.c).
 *
 * Compiled to code only with DSV4_ALLOC_INTERPOSE (the test runner's copy, built by the
 * Makefile from this file) or DSV4_DEBUG; the release library's object is empty. Plain
 * builds interpose malloc, calloc, realloc, posix_memalign and aligned_alloc, forwarding to
 * glibc's __libc_* functions. Sanitizer builds keep their runtime's allocator, which calls
 * the weak __sanitizer_malloc_hook after every allocation (ASan and TSan), so the count is
 * the same there.
 */
#if defined(DSV4_ALLOC_INTERPOSE) || defined(DSV4_DEBUG)
#include <errno.h>
#include <stdlib.h>

#include "core/core.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
void __sanitizer_malloc_hook(const volatile void *ptr, size_t size);

void __sanitizer_malloc_hook(const volatile void *ptr, size_t size)
{
    (void)ptr;
    dsv4_alloc_guard_note(size);
}
#else
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

void *malloc(size_t n)
{
    dsv4_alloc_guard_note(n);
    return __libc_malloc(n);
}

void *calloc(size_t a, size_t b)
{
    dsv4_alloc_guard_note(a * b);
    return __libc_calloc(a, b);
}

void *realloc(void *p, size_t n)
{
    dsv4_alloc_guard_note(n);
    return __libc_realloc(p, n);
}

int posix_memalign(void **out, size_t align, size_t n)
{
    dsv4_alloc_guard_note(n);
    if (align < sizeof(void *) || (align & (align - 1))) return EINVAL;
    void *p = __libc_memalign(align, n);
    if (!p && n) return ENOMEM;
    *out = p;
    return 0;
}

void *aligned_alloc(size_t align, size_t n)
{
    dsv4_alloc_guard_note(n);
    return __libc_memalign(align, n);
}
#endif
#endif
