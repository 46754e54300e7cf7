/*
 * strict_mem.c - the memory of `cpu-strict` (strict_mem.h): an anonymous shared file
 * (memfd) mapped twice, the host's view without access and the backend's view readable and
 * writable, and a first-fit allocator over it.
 *
 * The free list is a fixed array made at create, so neither alloc nor free calls malloc
 * (the allocation guard of the tests watches malloc while decoding). Free space is always
 * zero: the file starts sparse, and release punches the block's pages out of it, which
 * gives the memory back and reads as zeros afterwards.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/cpu/strict_mem.h"

enum { MAX_EXTENTS = 1 << 14 };

struct extent {
    size_t off, len;
};

struct strict_alloc {
    pthread_mutex_t mu;
    size_t          high;  /* every block lies below */
    size_t          used;  /* bytes handed out now */
    size_t          page;
    struct extent   ext[MAX_EXTENTS]; /* free extents below high, by address, never adjacent */
    int             n_ext;
};

/* Maps the file twice; false when the system refuses views of `reserve` bytes. */
static bool map_views(struct dsv4_strict_mem *g, int fd, size_t reserve)
{
    if (ftruncate(fd, (off_t)reserve) != 0) return false;
    void *host = mmap(NULL, reserve, PROT_NONE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (host == MAP_FAILED) return false;
    void *own = mmap(NULL, reserve, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (own == MAP_FAILED) {
        munmap(host, reserve);
        return false;
    }
    g->host    = host;
    g->own     = own;
    g->reserve = reserve;
    return true;
}

int dsv4_strict_mem_create(struct dsv4_strict_mem **out, size_t reserve, struct dsv4_err *err)
{
    *out                     = NULL;
    struct dsv4_strict_mem *g = calloc(1, sizeof(*g));
    struct strict_alloc    *a = calloc(1, sizeof(*a));
    if (!g || !a) {
        free(g);
        free(a);
        return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    }
    int  fd = memfd_create("dsv4-strict", MFD_CLOEXEC);
    bool ok = false;
    for (; fd >= 0 && !ok && reserve >= ((size_t)1 << 30); reserve /= 2) ok = map_views(g, fd, reserve);
    int e = errno;
    if (fd >= 0) close(fd); /* the mappings keep the file */
    if (!ok) {
        free(g);
        free(a);
        return dsv4_err_set(err, DSV4_ENOMEM, "cannot map the strict backend's memory: %s", strerror(e));
    }
    a->page  = (size_t)sysconf(_SC_PAGESIZE);
    pthread_mutex_init(&a->mu, NULL);
    g->alloc = a;
    *out     = g;
    return DSV4_OK;
}

void dsv4_strict_mem_free(struct dsv4_strict_mem *g)
{
    if (!g) return;
    struct strict_alloc *a = g->alloc;
    munmap(g->host, g->reserve);
    munmap(g->own, g->reserve);
    pthread_mutex_destroy(&a->mu);
    free(a);
    free(g);
}

/* Takes n bytes (a page multiple) from the first free extent that holds them, else from the
 * top; returns the offset, or (size_t)-1 when the range is full. */
static size_t take(struct strict_alloc *a, size_t reserve, size_t n)
{
    for (int i = 0; i < a->n_ext; i++) {
        struct extent *e = &a->ext[i];
        if (e->len < n) continue;
        size_t off = e->off;
        e->off += n;
        e->len -= n;
        if (!e->len) {
            memmove(e, e + 1, sizeof(*e) * (size_t)(a->n_ext - i - 1));
            a->n_ext--;
        }
        return off;
    }
    if (reserve - a->high < n) return (size_t)-1;
    a->high += n;
    return a->high - n;
}

static size_t pages(const struct strict_alloc *a, size_t bytes)
{
    size_t n = (bytes + a->page - 1) / a->page * a->page;
    return n ? n : a->page;
}

void *dsv4_strict_alloc(struct dsv4_strict_mem *g, size_t bytes)
{
    struct strict_alloc *a = g->alloc;
    size_t               n = pages(a, bytes);
    pthread_mutex_lock(&a->mu);
    size_t off = take(a, g->reserve, n);
    if (off != (size_t)-1) a->used += n;
    pthread_mutex_unlock(&a->mu);
    /* zero already (free space is); committed when an op first writes it */
    return off == (size_t)-1 ? NULL : g->host + off;
}

/* Puts [off, off + n) back into the sorted list, merged with the extents it touches. */
static void give_back(struct strict_alloc *a, size_t off, size_t n)
{
    int i = 0;
    while (i < a->n_ext && a->ext[i].off < off) i++;
    bool prev = i > 0 && a->ext[i - 1].off + a->ext[i - 1].len == off;
    bool next = i < a->n_ext && off + n == a->ext[i].off;
    if (prev && next) {
        a->ext[i - 1].len += n + a->ext[i].len;
        memmove(&a->ext[i], &a->ext[i + 1], sizeof(*a->ext) * (size_t)(a->n_ext - i - 1));
        a->n_ext--;
    } else if (prev) {
        a->ext[i - 1].len += n;
    } else if (next) {
        a->ext[i].off = off;
        a->ext[i].len += n;
    } else if (a->n_ext < MAX_EXTENTS) {
        memmove(&a->ext[i + 1], &a->ext[i], sizeof(*a->ext) * (size_t)(a->n_ext - i));
        a->ext[i] = (struct extent){ off, n };
        a->n_ext++;
    } /* else: the list is full and these pages stay unused (their memory is given back) */
}

void dsv4_strict_release(struct dsv4_strict_mem *g, void *p, size_t bytes)
{
    if (!p) return;
    struct strict_alloc *a = g->alloc;
    size_t n = pages(a, bytes), off = (size_t)((uint8_t *)p - g->host);
    DSV4_ASSERT(dsv4_strict_owns(g, p) && off % a->page == 0 && off + n <= a->high);
    /* the pages leave the file: memory back to the system, zeros when next read */
    if (madvise(g->own + off, n, MADV_REMOVE) != 0) memset(g->own + off, 0, n);
    pthread_mutex_lock(&a->mu);
    give_back(a, off, n);
    a->used -= n;
    pthread_mutex_unlock(&a->mu);
}

void dsv4_strict_usage(struct dsv4_strict_mem *g, size_t *reserved, size_t *used)
{
    struct strict_alloc *a = g->alloc;
    pthread_mutex_lock(&a->mu);
    *reserved = g->reserve;
    *used     = a->used;
    pthread_mutex_unlock(&a->mu);
}
