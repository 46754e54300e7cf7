/*
 * test_strict.c - cpu-strict enforces what it claims: a host read or write of its memory
 * faults, the same bytes through upload, download or an op work, and its allocator reuses
 * what is freed. The faulting accesses run in a forked child (test_fault.h).
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/strict_mem.h"
#include "test.h"
#include "test_cases.h"
#include "test_fault.h"

static void test_host_access_faults(struct test_ctx *t)
{
    const struct dsv4_backend_kind *k = dsv4_backend_find("cpu-strict");
    CHECK(k && !k->host_visible);
    if (!k) return;
    struct dsv4_backend_params p = { .opts = "level=scalar", .n_threads = 1 };
    struct dsv4_err            err;
    void                      *impl = NULL;
    if (k->create(&impl, &p, &err)) {
        CHECKF(0, "create: %s", err.msg);
        return;
    }
    enum { N = 3000 };
    float *buf = k->alloc(impl, sizeof(float) * N, DSV4_MEM_ACT), host[N], back[N];
    CHECK(buf != NULL && ((uintptr_t)buf & 63) == 0);
    for (int i = 0; buf && i < N; i++) host[i] = (float)i - 1000.5f;
    if (buf) {
        int rd = test_touch_in_child(buf, sizeof(float) * N, false), wr = test_touch_in_child(buf, sizeof(float) * N, true);
        CHECKF(test_faulted(rd), "a host read of a cpu-strict buffer did not fault (child %d)", rd);
        CHECKF(test_faulted(wr), "a host write of a cpu-strict buffer did not fault (child %d)", wr);
        CHECKF(test_touch_in_child(host, sizeof(host), false) == TEST_CHILD_READ, "the child cannot read host memory");
        /* through the memory half it works, zero-filled at alloc */
        k->download(impl, back, buf, sizeof(back));
        bool zero = true;
        for (int i = 0; i < N; i++) zero &= back[i] == 0.0f;
        CHECK(zero);
        k->upload(impl, buf, host, sizeof(host));
        k->download(impl, back, buf, sizeof(back));
        CHECK(!memcmp(back, host, sizeof(back)));
        /* and inside an op: x = bf16(x * 2), exact for these values */
        struct dsv4_backend be = { .ops = k->ops(impl), .impl = impl };
        be.ops->scale(&be, N, buf, 2.0);
        k->download(impl, back, buf, sizeof(back));
        bool twice = true;
        for (int i = 0; i < N; i++) twice &= back[i] == dsv4_round_bf16(host[i] * 2.0f);
        CHECK(twice);
        rd = test_touch_in_child(buf, sizeof(float) * N, false);
        CHECKF(test_faulted(rd), "after an op the buffer is readable by the host (child %d)", rd);
        k->free(impl, buf, sizeof(float) * N);
    }
    k->destroy(impl);
}

/* The two views: the backend's address of a buffer reaches the same bytes, the host's faults;
 * anything else passes through unchanged. The allocator reuses freed blocks first fit,
 * merging neighbours, and hands them out zero-filled. */
static void test_views_and_allocator(struct test_ctx *t)
{
    struct dsv4_strict_mem *g;
    struct dsv4_err         err;
    if (dsv4_strict_mem_create(&g, (size_t)1 << 30, &err)) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    size_t   pg = (size_t)sysconf(_SC_PAGESIZE);
    uint8_t *a = dsv4_strict_alloc(g, 100), *b = dsv4_strict_alloc(g, 3 * pg), *c = dsv4_strict_alloc(g, pg);
    CHECK(a && b && c && b == a + pg && c == b + 3 * pg && dsv4_strict_owns(g, b) && !dsv4_strict_owns(g, &pg));
    uint8_t *bo = dsv4_strict_in(g, b);
    CHECK(bo != b && dsv4_strict_in(g, bo) == bo && dsv4_strict_in(g, &pg) == (void *)&pg);
    bo[5] = 7; /* through the backend's view */
    CHECK(test_touch_in_child(bo, 3 * pg, false) == TEST_CHILD_READ && test_faulted(test_touch_in_child(b, 3 * pg, false)));
    dsv4_strict_release(g, b, 3 * pg);
    uint8_t *d = dsv4_strict_alloc(g, 2 * pg);
    CHECK(d == b && ((uint8_t *)dsv4_strict_in(g, d))[5] == 0); /* first fit: the freed hole, zeroed */
    ((uint8_t *)dsv4_strict_in(g, d))[pg + 5] = 9;
    dsv4_strict_release(g, a, 100);
    dsv4_strict_release(g, d, 2 * pg);
    uint8_t *e = dsv4_strict_alloc(g, 4 * pg);
    CHECK(e == a); /* a, d and the rest of b merged into one hole */
    CHECK(((uint8_t *)dsv4_strict_in(g, e))[2 * pg + 5] == 0); /* d's 9 is gone */
    size_t reserved, used;
    dsv4_strict_usage(g, &reserved, &used);
    CHECK(reserved == (size_t)1 << 30 && used == 5 * pg);
    dsv4_strict_mem_free(g);
}

const struct test_case test_group_strict[] = {
    { "host_access_faults", test_host_access_faults },
    { "views_and_allocator", test_views_and_allocator },
    { NULL, NULL },
};
