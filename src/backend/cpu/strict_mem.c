/*
 * strict_mem.c - the guarded memory of `cpu-strict` (strict_mem.h): a reserved range, a
 * first-fit allocator over it, and the access gate.
 *
 * Why one range and not an mmap per buffer: the gate then changes the protection of every
 * buffer the backend has in one mprotect call, whatever their number (a session has a step
 * plan, KV state, undo buffers; a server pool has slots, pages and snapshots). The free list
 * is a fixed array made at create, so neither alloc nor free calls malloc (the allocation
 * guard of the tests watches malloc while decoding).
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/cpu/strict_mem.h"

enum { MAX_EXTENTS = 1 << 14 };

/* The gate changes whole 2 MiB pages (transparent huge pages, asked for with MADV_HUGEPAGE):
 * mprotect's cost grows with the page-table entries it rewrites, so on 4 KiB pages a gate
 * over 128 MiB took 5 ms a transition, on huge pages about 25 us whatever the size. The gate's
 * range ends on a huge-page boundary so that no transition splits one. */
#define HUGE_PAGE ((size_t)2 << 20)

struct extent {
    size_t off, len;
};

struct dsv4_strict_mem {
    pthread_mutex_t mu;
    void           *map;      /* the mapping (map_len bytes); base is its first huge page */
    size_t          map_len;
    uint8_t        *base;
    size_t          reserve;  /* bytes of address space */
    size_t          high;     /* every block lies below: the part the gate changes */
    size_t          used;     /* bytes handed out now */
    size_t          page;
    int             depth;    /* opens not yet closed, over all threads */
    uint64_t        transitions;
    struct extent  *ext;      /* free extents below high, by address, never adjacent */
    int             n_ext;
};

/* A protection change the backend cannot go on without: memory it must reach would stay
 * out of reach (or open to stray reads), so this is a broken invariant, not an error. */
static void protect(uint8_t *p, size_t n, int prot)
{
    if (!n) return;
    int rc = mprotect(p, n, prot);
    DSV4_ASSERT(rc == 0);
}

/* The part of the range the gate opens and closes: every block, to a huge-page boundary. */
static size_t gate_len(const struct dsv4_strict_mem *g)
{
    size_t n = (g->high + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    return n < g->reserve ? n : g->reserve;
}

int dsv4_strict_mem_create(struct dsv4_strict_mem **out, size_t reserve, struct dsv4_err *err)
{
    *out                     = NULL;
    struct dsv4_strict_mem *g = calloc(1, sizeof(*g));
    if (g) g->ext = malloc(sizeof(*g->ext) * MAX_EXTENTS);
    if (!g || !g->ext) {
        free(g);
        return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    }
    g->page = (size_t)sysconf(_SC_PAGESIZE);
    void *map = MAP_FAILED;
    for (; reserve >= ((size_t)1 << 30); reserve /= 2) {
        map = mmap(NULL, reserve + HUGE_PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (map != MAP_FAILED) break;
    }
    if (map == MAP_FAILED) {
        free(g->ext);
        free(g);
        return dsv4_err_set(err, DSV4_ENOMEM, "cannot reserve address space for the strict backend's memory: %s",
                            strerror(errno));
    }
    g->map     = map;
    g->map_len = reserve + HUGE_PAGE;
    g->base    = (uint8_t *)(((uintptr_t)map + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    g->reserve = reserve;
#ifdef MADV_HUGEPAGE
    (void)madvise(g->base, reserve, MADV_HUGEPAGE); /* where THP is off, transitions cost more */
#endif
    pthread_mutex_init(&g->mu, NULL);
    *out = g;
    return DSV4_OK;
}

void dsv4_strict_mem_free(struct dsv4_strict_mem *g)
{
    if (!g) return;
    munmap(g->map, g->map_len);
    pthread_mutex_destroy(&g->mu);
    free(g->ext);
    free(g);
}

/* Takes n bytes (a page multiple) from the first free extent that holds them, else from the
 * top; returns the offset, or (size_t)-1 when the range is full. */
static size_t take(struct dsv4_strict_mem *g, size_t n)
{
    for (int i = 0; i < g->n_ext; i++) {
        struct extent *e = &g->ext[i];
        if (e->len < n) continue;
        size_t off = e->off;
        e->off += n;
        e->len -= n;
        if (!e->len) {
            memmove(e, e + 1, sizeof(*e) * (size_t)(g->n_ext - i - 1));
            g->n_ext--;
        }
        return off;
    }
    if (g->reserve - g->high < n) return (size_t)-1;
    g->high += n;
    return g->high - n;
}

void *dsv4_strict_alloc(struct dsv4_strict_mem *g, size_t bytes)
{
    size_t n = (bytes + g->page - 1) / g->page * g->page;
    if (!n) n = g->page;
    pthread_mutex_lock(&g->mu);
    size_t off = take(g, n);
    if (off != (size_t)-1) g->used += n;
    pthread_mutex_unlock(&g->mu);
    /* zero already: every free byte of the range is (never touched, or zeroed at release).
     * Not touched here, unlike the CPU's alloc: a page nothing writes is never committed, and
     * every transition of the gate costs in proportion to the committed pages. */
    return off == (size_t)-1 ? NULL : g->base + off;
}

/* Puts [off, off + n) back into the sorted list, merged with the extents it touches. */
static void give_back(struct dsv4_strict_mem *g, size_t off, size_t n)
{
    int i = 0;
    while (i < g->n_ext && g->ext[i].off < off) i++;
    bool prev = i > 0 && g->ext[i - 1].off + g->ext[i - 1].len == off;
    bool next = i < g->n_ext && off + n == g->ext[i].off;
    if (prev && next) {
        g->ext[i - 1].len += n + g->ext[i].len;
        memmove(&g->ext[i], &g->ext[i + 1], sizeof(*g->ext) * (size_t)(g->n_ext - i - 1));
        g->n_ext--;
    } else if (prev) {
        g->ext[i - 1].len += n;
    } else if (next) {
        g->ext[i].off = off;
        g->ext[i].len += n;
    } else if (g->n_ext < MAX_EXTENTS) {
        memmove(&g->ext[i + 1], &g->ext[i], sizeof(*g->ext) * (size_t)(g->n_ext - i));
        g->ext[i] = (struct extent){ off, n };
        g->n_ext++;
    } /* else: the list is full and these pages stay unused (their memory is given back) */
}

/* Zeroes [p, p + n), below high: the whole huge pages inside go back to the system (advice on
 * part of one would split it), the edges are written, through the gate. Keeps every free byte
 * of the range zero. Called with the mutex held. */
static void zero_block(struct dsv4_strict_mem *g, uint8_t *p, size_t n)
{
    uint8_t *a = (uint8_t *)(((uintptr_t)p + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    uint8_t *b = (uint8_t *)(((uintptr_t)p + n) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (b <= a) a = b = p + n; /* no whole huge page inside: write it all */
    if (!g->depth) protect(g->base, gate_len(g), PROT_READ | PROT_WRITE);
    memset(p, 0, (size_t)(a - p));
    memset(b, 0, (size_t)(p + n - b));
    if (!g->depth) protect(g->base, gate_len(g), PROT_NONE);
    if (b > a) (void)madvise(a, (size_t)(b - a), MADV_DONTNEED);
}

void dsv4_strict_release(struct dsv4_strict_mem *g, void *p, size_t bytes)
{
    if (!p) return;
    size_t n = (bytes + g->page - 1) / g->page * g->page, off = (size_t)((uint8_t *)p - g->base);
    if (!n) n = g->page;
    DSV4_ASSERT(dsv4_strict_owns(g, p) && off % g->page == 0 && off + n <= g->high);
    pthread_mutex_lock(&g->mu);
    zero_block(g, p, n);
    give_back(g, off, n);
    g->used -= n;
    pthread_mutex_unlock(&g->mu);
}

void dsv4_strict_open(struct dsv4_strict_mem *g)
{
    pthread_mutex_lock(&g->mu);
    if (g->depth++ == 0) {
        protect(g->base, gate_len(g), PROT_READ | PROT_WRITE);
        g->transitions++;
    }
    pthread_mutex_unlock(&g->mu);
}

void dsv4_strict_close(struct dsv4_strict_mem *g)
{
    pthread_mutex_lock(&g->mu);
    DSV4_ASSERT(g->depth > 0);
    if (--g->depth == 0) {
        protect(g->base, gate_len(g), PROT_NONE);
        g->transitions++;
    }
    pthread_mutex_unlock(&g->mu);
}

bool dsv4_strict_owns(const struct dsv4_strict_mem *g, const void *p)
{
    const uint8_t *b = p;
    return g && b >= g->base && b < g->base + g->reserve;
}

uint64_t dsv4_strict_transitions(struct dsv4_strict_mem *g)
{
    pthread_mutex_lock(&g->mu);
    uint64_t n = g->transitions;
    pthread_mutex_unlock(&g->mu);
    return n;
}

void dsv4_strict_usage(struct dsv4_strict_mem *g, size_t *reserved, size_t *used)
{
    pthread_mutex_lock(&g->mu);
    *reserved = g->reserve;
    *used     = g->used;
    pthread_mutex_unlock(&g->mu);
}
