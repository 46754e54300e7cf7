/*
 * test_kv.c - the serving KV manager (src/kv/kv_pool.h) on its own: slot and page free
 * lists under random acquire / reserve / release (no leak, no page used twice, EFULL exactly
 * when the pool is dry), the prefix cache's reference counts, LRU eviction and dedup under
 * random traffic (every invariant re-derived from scratch after each operation), the
 * layout sizes, and snapshots that round-trip a state.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/gen.h"
#include "kv/kv_pool.h"
#include "model/runtime.h"
#include "test_cases.h"

static dsv4_engine *open_tiny(struct test_ctx *t, const char *preset)
{
    char dir[256];
    snprintf(dir, sizeof(dir), "%s/kv-%s", t->tmpdir, preset);
    struct gen_opts o;
    gen_opts_default(&o);
    o.preset = preset;
    o.seed   = 3;
    o.quiet  = true;
    struct dsv4_err err;
    dsv4_engine    *e = NULL;
    struct dsv4_engine_params ep;
    test_engine_params(&ep);
    if (gen_checkpoint(&o, dir, &err) || dsv4_engine_open(&e, dir, &ep, &err)) {
        CHECKF(0, "model: %s", err.msg);
        return NULL;
    }
    return e;
}

/* Re-derives every invariant of the pool from its tables; returns false on the first break. */
static bool pool_consistent(struct test_ctx *t, const struct dsv4_kv_pool *pool)
{
    int      np = pool->p.n_pages, ns = pool->p.max_seqs, pps = pool->pages_per_seq;
    int32_t *refs = calloc((size_t)np, sizeof(int32_t));
    bool     ok = true;
    for (int s = 0; s < ns; s++)
        for (int k = 0; k < pps; k++) {
            int32_t id = pool->map[(size_t)s * (size_t)pps + (size_t)k];
            if (id < 0) {
                ok &= pool->seq[s].page[k] == -1;
                continue;
            }
            ok &= pool->slot_busy[s];
            ok &= pool->seq[s].page[k] == id && pool->seq[s].page_base == pool->page_mem &&
                  pool->seq[s].page_bytes == pool->plan.page_bytes;
            refs[id]++;
        }
    int n_cached = 0, n_evictable = 0, n_lru = 0;
    /* the LRU list holds exactly the evictable entries: cache-only pages without children */
    for (int n = 0; n < pool->p.n_snapshots; n++) {
        const struct dsv4_pc_node *e = &pool->node[n];
        if (!e->used) continue;
        ok &= pool->page_node[e->page] == n;
        ok &= e->in_lru == (pool->page_ref[e->page] == 1 && e->n_children == 0);
        n_lru += e->in_lru;
    }
    for (int32_t n = pool->lru_head, k = 0; n >= 0 && k <= n_lru; n = pool->node[n].lru_next, k++) {
        ok &= pool->node[n].in_lru;
        if (pool->node[n].lru_next < 0) ok &= pool->lru_tail == n && k + 1 == n_lru;
    }
    ok &= n_lru > 0 || (pool->lru_head < 0 && pool->lru_tail < 0);
    for (int p = 0; p < np; p++) {
        if (pool->page_node[p] >= 0) {
            refs[p]++;
            n_cached++;
            if (pool->page_ref[p] == 1) n_evictable++;
        }
        if (refs[p] != pool->page_ref[p]) {
            CHECKF(0, "page %d: reference count %d, holders %d", p, pool->page_ref[p], refs[p]);
            ok = false;
        }
    }
    /* the free list holds exactly the unreferenced pages, each once */
    int   n_free = 0;
    char *seen   = calloc((size_t)np, 1);
    for (int32_t id = pool->free_head; id >= 0 && n_free <= np; id = pool->page_next[id]) {
        ok &= !seen[id] && pool->page_ref[id] == 0;
        seen[id] = 1;
        n_free++;
    }
    for (int p = 0; p < np; p++) ok &= (pool->page_ref[p] == 0) == (seen[p] != 0);
    ok &= n_free == pool->n_free;
    ok &= n_cached == pool->cnt.prefix_entries && n_evictable == pool->cnt.pages_evictable;
    int busy = 0;
    for (int s = 0; s < ns; s++) busy += pool->slot_busy[s];
    ok &= busy + pool->n_slot_free == ns;
    CHECKF(ok, "pool invariants broken (free %d/%d, cached %d/%d, evictable %d/%d)", n_free, pool->n_free, n_cached,
           pool->cnt.prefix_entries, n_evictable, pool->cnt.pages_evictable);
    free(refs);
    free(seen);
    return ok;
}

static void test_pool_random(struct test_ctx *t)
{
    dsv4_engine *e = open_tiny(t, "tiny-a");
    if (!e) return;
    const struct dsv4_model   *m = dsv4_engine_model(e);
    struct dsv4_kv_pool        pool;
    struct dsv4_kv_pool_params pp = { .max_ctx = 200, .max_seqs = 6, .page_tokens = 16, .n_pages = 40, .n_snapshots = 0 };
    struct dsv4_err            err;
    if (dsv4_kv_pool_init(&pool, &m->cfg.kv, m->row_fmt, &pp, NULL, &err)) {
        CHECKF(0, "%s", err.msg);
        dsv4_engine_close(e);
        return;
    }
    unsigned long long seed = 77;
    int                slots[6], n_slots = 0, efull = 0;
    for (int it = 0; it < 4000; it++) {
        int op = (int)(test_rand_u64(&seed) % 4);
        if (op == 0 && n_slots < 6) {
            int s = dsv4_kv_slot_acquire(&pool);
            CHECK(s >= 0);
            if (s >= 0) slots[n_slots++] = s;
        } else if (op == 1 && n_slots) {
            int i = (int)(test_rand_u64(&seed) % (unsigned)n_slots);
            dsv4_kv_slot_release(&pool, slots[i]);
            slots[i] = slots[--n_slots];
        } else if (n_slots) {
            int s   = slots[test_rand_u64(&seed) % (unsigned)n_slots];
            int end = 1 + (int)(test_rand_u64(&seed) % 200);
            int need = dsv4_kv_pages_needed(&pool, s, end), avail = dsv4_kv_pages_available(&pool);
            int rc   = dsv4_kv_reserve(&pool, s, end);
            CHECK((rc == DSV4_OK) == (need <= avail));
            efull += rc == DSV4_EFULL;
            if (rc == DSV4_OK) CHECK(dsv4_kv_mapped(&pool.seq[s], 0, end));
        }
        if (it % 97 == 0 && !pool_consistent(t, &pool)) break;
    }
    CHECK(efull > 0); /* the pool did run dry */
    while (n_slots) dsv4_kv_slot_release(&pool, slots[--n_slots]);
    CHECK(pool_consistent(t, &pool));
    struct dsv4_kv_counters c;
    dsv4_kv_pool_counters(&pool, &c);
    CHECK(c.pages_free == 40 && c.slots_used == 0 && c.fragmentation == 0);
    CHECK(dsv4_kv_slot_acquire(&pool) >= 0); /* still usable */
    dsv4_kv_pool_free(&pool);
    dsv4_engine_close(e);
}

/* Token prompts from a few families that share prefixes, so that lookups hit at several depths. */
static void family_tokens(unsigned long long *seed, int32_t *toks, int n)
{
    int fam = (int)(test_rand_u64(seed) % 3), split = 16 * (int)(test_rand_u64(seed) % 5);
    for (int i = 0; i < n; i++) toks[i] = i < split ? (int32_t)(fam * 100 + i) : (int32_t)(test_rand_u64(seed) % 2048);
}

static void test_prefix_cache_random(struct test_ctx *t)
{
    dsv4_engine *e = open_tiny(t, "tiny-a");
    if (!e) return;
    const struct dsv4_model   *m = dsv4_engine_model(e);
    struct dsv4_kv_pool        pool;
    struct dsv4_kv_pool_params pp = { .max_ctx = 128, .max_seqs = 4, .page_tokens = 16, .n_pages = 24, .n_snapshots = 10 };
    struct dsv4_err            err;
    if (dsv4_kv_pool_init(&pool, &m->cfg.kv, m->row_fmt, &pp, NULL, &err)) {
        CHECKF(0, "%s", err.msg);
        dsv4_engine_close(e);
        return;
    }
    unsigned long long seed = 5;
    int32_t            toks[4][128];
    int                slots[4], n_slots = 0, hits = 0, dedups = 0;
    for (int it = 0; it < 3000; it++) {
        int op = (int)(test_rand_u64(&seed) % 5);
        if (op == 0 && n_slots < 4) {
            int s = dsv4_kv_slot_acquire(&pool);
            family_tokens(&seed, toks[n_slots], 128);
            int got = dsv4_kv_prefix_attach(&pool, s, toks[n_slots], 1 + (int)(test_rand_u64(&seed) % 127));
            CHECK(got % 16 == 0 && pool.seq[s].pos == got);
            hits += got > 0;
            slots[n_slots++] = s;
        } else if (op == 1 && n_slots) {
            int i = (int)(test_rand_u64(&seed) % (unsigned)n_slots);
            dsv4_kv_slot_release(&pool, slots[i]);
            slots[i] = slots[--n_slots];
            memcpy(toks[i], toks[n_slots], sizeof(toks[i]));
        } else if (n_slots) {
            /* advance one sequence to the next page boundary and publish, as a step would */
            int                    i  = (int)(test_rand_u64(&seed) % (unsigned)n_slots);
            struct dsv4_seq_state *st = &pool.seq[slots[i]];
            int                    end = (st->pos / 16 + 1) * 16;
            if (end > 128) continue;
            if (dsv4_kv_reserve(&pool, slots[i], end) != DSV4_OK) continue;
            int before = dsv4_kv_pages_needed(&pool, slots[i], end);
            st->pos    = end;
            uint64_t ins = pool.cnt.prefix_inserts;
            dsv4_kv_prefix_publish(&pool, slots[i], toks[i]);
            dedups += pool.cnt.prefix_inserts == ins && !pool.slot_pc_off[slots[i]];
            CHECK(before == 0 && dsv4_kv_mapped(st, 0, end));
        }
        if (!pool_consistent(t, &pool)) break;
    }
    CHECKF(hits > 20 && dedups > 5 && pool.cnt.prefix_evictions > 0, "hits %d, dedups %d, evictions %llu", hits,
           dedups, (unsigned long long)pool.cnt.prefix_evictions);
    while (n_slots) dsv4_kv_slot_release(&pool, slots[--n_slots]);
    CHECK(pool_consistent(t, &pool));
    struct dsv4_kv_counters c;
    dsv4_kv_pool_counters(&pool, &c);
    CHECK(c.pages_free + c.pages_evictable == c.pages_total && c.pages_cached == c.pages_evictable);
    dsv4_kv_prefix_clear(&pool);
    dsv4_kv_pool_counters(&pool, &c);
    CHECK(c.pages_free == c.pages_total && c.prefix_entries == 0 && c.slots_used == 0);
    CHECK(pool_consistent(t, &pool));
    dsv4_kv_pool_free(&pool);
    dsv4_engine_close(e);
}

static void test_layout_and_snapshot(struct test_ctx *t)
{
    dsv4_engine *e = open_tiny(t, "tiny-a");
    if (!e) return;
    const struct dsv4_model    *m = dsv4_engine_model(e);
    const struct dsv4_kv_dims  *c = &m->cfg.kv;
    /* tiny-a: ratios 0, 4, 16, 4; 64 compressed rows + 64 keys per CSA layer per 256 positions */
    size_t rb = (size_t)dsv4_row_bytes(m->row_fmt, c->d_head, c->d_rope), ib = (size_t)dsv4_idx_key_bytes(c->d_idx_head);
    size_t want = 2 * (((64 * rb + 63) & ~(size_t)63) + ((64 * ib + 63) & ~(size_t)63)) + ((16 * rb + 63) & ~(size_t)63);
    CHECKF(dsv4_kv_page_bytes(c, m->row_fmt, 256) == want, "page bytes %zu, expected %zu",
           dsv4_kv_page_bytes(c, m->row_fmt, 256), want);
    CHECK(dsv4_kv_page_tokens_ok(c, 16) && dsv4_kv_page_tokens_ok(c, 256));
    CHECK(!dsv4_kv_page_tokens_ok(c, 8) && !dsv4_kv_page_tokens_ok(c, 48) && !dsv4_kv_page_tokens_ok(c, 0));
    /* a snapshot restores rings and previous blocks exactly */
    struct dsv4_seq_state a, b;
    struct dsv4_err       err;
    int rc_a = dsv4_seq_state_init(&a, c, 64, m->row_fmt, false, NULL, &err);
    int rc_b = rc_a ? rc_a : dsv4_seq_state_init(&b, c, 64, m->row_fmt, false, NULL, &err);
    CHECKF(rc_a == DSV4_OK && rc_b == DSV4_OK, "state: %s", err.msg);
    if (rc_a || rc_b) { /* no states to snapshot */
        if (!rc_a) dsv4_seq_state_free(&a);
        dsv4_engine_close(e);
        return;
    }
    unsigned long long seed = 9;
    for (size_t i = 0; i < a.mem_bytes; i++) ((uint8_t *)a.mem)[i] = (uint8_t)test_rand_u64(&seed);
    a.page_tokens = b.page_tokens = 16; /* any boundary of the snapshot's own page size */
    a.pos = 32;
    size_t   sb   = dsv4_kv_snap_bytes(c, m->row_fmt, false);
    uint8_t *snap = malloc(sb);
    dsv4_kv_snapshot_save(&a, snap);
    dsv4_kv_snapshot_restore(&b, snap, 32);
    CHECK(b.pos == 32);
    for (int il = 0; il < a.n_states; il++) {
        const struct dsv4_layer_state *la = &a.layers[il], *lb = &b.layers[il];
        CHECK(!memcmp(la->ring, lb->ring, (size_t)c->window * rb));
        if (la->kind.overlap) { /* the previous block: ratio rows of 2 halves */
            size_t r = (size_t)la->kind.ratio, half = sizeof(float) * r * 2 * (size_t)c->d_head;
            size_t ihalf = sizeof(float) * r * 2 * (size_t)c->d_idx_head;
            CHECK(!memcmp(la->ckv, lb->ckv, half) && !memcmp(la->csc, lb->csc, half));
            CHECK(!memcmp(la->ikv, lb->ikv, ihalf) && !memcmp(la->isc, lb->isc, ihalf));
        }
    }
    free(snap);
    dsv4_seq_state_free(&a);
    dsv4_seq_state_free(&b);
    dsv4_engine_close(e);
}

const struct test_case test_group_kv[] = {
    { "pool_random_alloc_free", test_pool_random },
    { "prefix_cache_random", test_prefix_cache_random },
    { "layout_and_snapshot", test_layout_and_snapshot },
    { NULL, NULL },
};
