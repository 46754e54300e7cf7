/*
 * kv_pool.c - the serving KV manager (see kv_pool.h): start-up plan and allocation, slot and
 * page free lists with reference counts, and the prefix cache (hash chain over token ids,
 * snapshots at page boundaries, LRU eviction of leaf entries).
 *
 * Memory policy: every byte is allocated and zero-filled in dsv4_kv_pool_init, so page
 * faults happen at start-up. Pages handed out again are not cleared: a compressed row or an
 * indexer key is always written before it is read (row j is read only once its block is
 * complete), so stale bytes are never seen.
 *
 * Invariant behind eviction: a sequence whose prefix is in the cache maps every page of
 * that chain (it attached to it, entered it, or swapped its own page for an identical
 * cached one), so an entry held by the cache alone never has a child used by a sequence;
 * evicting leaves first therefore always makes progress.
 */
#include <stdlib.h>
#include <string.h>

#include "kv/kv_pool.h"

static const uint64_t CHAIN_SEED = 0x6a09e667f3bcc908ull;

static size_t a64(size_t v)
{
    return (v + 63) & ~(size_t)63;
}

/* ------------------------------------------------------------------ plan and allocation */

static size_t table_bytes(const struct dsv4_kv_dims *dims, const struct dsv4_kv_pool_params *p, int pages_per_seq,
                          int n_bucket)
{
    size_t per_slot = sizeof(struct dsv4_seq_state) + sizeof(struct dsv4_layer_state) * (size_t)(dims->n_layer + 1) +
                      (sizeof(uint8_t *) + sizeof(int32_t)) * (size_t)pages_per_seq + 24;
    size_t per_page = 3 * sizeof(int32_t);
    size_t per_node = sizeof(struct dsv4_pc_node) + sizeof(int32_t) * (size_t)p->page_tokens;
    return per_slot * (size_t)p->max_seqs + per_page * (size_t)p->n_pages + per_node * (size_t)p->n_snapshots +
           sizeof(int32_t) * (size_t)n_bucket;
}

static int bucket_count(int n_snapshots)
{
    int n = 1;
    while (n < 2 * n_snapshots) n *= 2;
    return n;
}

int dsv4_kv_pool_plan(const struct dsv4_kv_dims *dims, enum dsv4_row_fmt fmt, const struct dsv4_kv_pool_params *p,
                      struct dsv4_kv_plan *plan, struct dsv4_err *err)
{
    memset(plan, 0, sizeof(*plan));
    if (p->max_ctx < 1) return dsv4_err_set(err, DSV4_EINVAL, "context length %d must be at least 1", p->max_ctx);
    if (p->max_seqs < 1 || p->max_seqs > (1 << 16))
        return dsv4_err_set(err, DSV4_EINVAL, "sequence count %d outside [1, 65536]", p->max_seqs);
    if (!dsv4_kv_page_tokens_ok(dims, p->page_tokens))
        return dsv4_err_set(err, DSV4_EINVAL, "page size %d is not a power of two that every compression ratio divides",
                            p->page_tokens);
    if (p->n_pages < 1 || p->n_pages > (1 << 28))
        return dsv4_err_set(err, DSV4_EINVAL, "page count %d outside [1, 2^28]", p->n_pages);
    if (p->n_snapshots < 0 || p->n_snapshots > (1 << 24))
        return dsv4_err_set(err, DSV4_EINVAL, "prefix-cache entry count %d outside [0, 2^24]", p->n_snapshots);
    int pps          = (p->max_ctx + p->page_tokens - 1) / p->page_tokens;
    plan->slot_bytes = dsv4_kv_slot_bytes(dims, fmt, p->mtp);
    plan->page_bytes = dsv4_kv_page_bytes(dims, fmt, p->page_tokens);
    plan->snap_bytes = dsv4_kv_snap_bytes(dims, fmt, p->mtp);
    plan->slots      = plan->slot_bytes * (size_t)p->max_seqs;
    plan->pages      = plan->page_bytes * (size_t)p->n_pages;
    plan->snapshots  = plan->snap_bytes * (size_t)p->n_snapshots;
    plan->tables     = table_bytes(dims, p, pps, bucket_count(p->n_snapshots));
    plan->total      = plan->slots + plan->pages + plan->snapshots + plan->tables;
    return DSV4_OK;
}

/* 64-byte aligned, zero-filled by writing (so the pages are resident now). */
static void *zalloc(size_t bytes)
{
    void *p = NULL;
    if (bytes == 0) bytes = 64;
    if (posix_memalign(&p, 64, a64(bytes)) != 0) return NULL;
    memset(p, 0, a64(bytes));
    return p;
}

int dsv4_kv_pool_init(struct dsv4_kv_pool *pool, const struct dsv4_kv_dims *dims, enum dsv4_row_fmt fmt,
                      const struct dsv4_kv_pool_params *p, const struct dsv4_kv_mem *mem, struct dsv4_err *err)
{
    memset(pool, 0, sizeof(*pool));
    if (mem) pool->kvmem = *mem;
    int rc = dsv4_kv_pool_plan(dims, fmt, p, &pool->plan, err);
    if (rc) return rc;
    pool->p             = *p;
    pool->dims          = dims;
    pool->fmt           = fmt;
    pool->pages_per_seq = (p->max_ctx + p->page_tokens - 1) / p->page_tokens;
    pool->n_bucket      = bucket_count(p->n_snapshots);
    size_t ns = (size_t)p->max_seqs, np = (size_t)p->n_pages, nn = (size_t)p->n_snapshots;
    pool->slot_mem    = dsv4_kv_mem_alloc(&pool->kvmem, pool->plan.slots);
    pool->page_mem    = dsv4_kv_mem_alloc(&pool->kvmem, pool->plan.pages);
    pool->snap_mem    = dsv4_kv_mem_alloc(&pool->kvmem, pool->plan.snapshots);
    pool->seq         = zalloc(sizeof(*pool->seq) * ns);
    pool->map         = zalloc(sizeof(int32_t) * ns * (size_t)pool->pages_per_seq);
    pool->slot_free   = zalloc(sizeof(int32_t) * ns);
    pool->slot_busy   = zalloc(sizeof(bool) * ns);
    pool->slot_node   = zalloc(sizeof(int32_t) * ns);
    pool->slot_depth  = zalloc(sizeof(int32_t) * ns);
    pool->slot_hash   = zalloc(sizeof(uint64_t) * ns);
    pool->slot_pc_off = zalloc(sizeof(bool) * ns);
    pool->page_ref    = zalloc(sizeof(int32_t) * np);
    pool->page_next   = zalloc(sizeof(int32_t) * np);
    pool->page_node   = zalloc(sizeof(int32_t) * np);
    pool->node        = zalloc(sizeof(*pool->node) * nn);
    pool->node_tok    = zalloc(sizeof(int32_t) * nn * (size_t)p->page_tokens);
    pool->bucket      = zalloc(sizeof(int32_t) * (size_t)pool->n_bucket);
    if (!pool->slot_mem || !pool->page_mem || !pool->snap_mem || !pool->seq || !pool->map || !pool->slot_free ||
        !pool->slot_busy || !pool->slot_node || !pool->slot_depth || !pool->slot_hash || !pool->slot_pc_off || !pool->page_ref ||
        !pool->page_next || !pool->page_node || !pool->node || !pool->node_tok || !pool->bucket) {
        dsv4_kv_pool_free(pool);
        return dsv4_err_set(err, DSV4_ENOMEM, "cannot allocate the KV pool (%.1f MiB)",
                            (double)pool->plan.total / 1048576.0);
    }
    for (size_t i = 0; i < ns; i++) {
        rc = dsv4_seq_state_bind(&pool->seq[i], dims, p->max_ctx, p->page_tokens, fmt, p->mtp, &pool->kvmem,
                                 pool->slot_mem + i * pool->plan.slot_bytes, err);
        if (rc) {
            dsv4_kv_pool_free(pool);
            return rc;
        }
        pool->seq[i].page_base  = pool->page_mem;
        pool->seq[i].page_bytes = pool->plan.page_bytes;
        pool->slot_free[i] = (int32_t)(ns - 1 - i);
    }
    pool->n_slot_free = (int)ns;
    for (size_t i = 0; i < ns * (size_t)pool->pages_per_seq; i++) pool->map[i] = -1;
    for (size_t i = 0; i < np; i++) {
        pool->page_next[i] = i + 1 < np ? (int32_t)(i + 1) : -1;
        pool->page_node[i] = -1;
    }
    pool->free_head = 0;
    pool->n_free    = (int)np;
    for (size_t i = 0; i < nn; i++) pool->node[i].hnext = i + 1 < nn ? (int32_t)(i + 1) : -1;
    pool->node_free = nn ? 0 : -1;
    for (int i = 0; i < pool->n_bucket; i++) pool->bucket[i] = -1;
    pool->lru_head = pool->lru_tail = -1;
    return DSV4_OK;
}

void dsv4_kv_pool_free(struct dsv4_kv_pool *pool)
{
    if (pool->seq)
        for (int i = 0; i < pool->p.max_seqs; i++) dsv4_seq_state_unbind(&pool->seq[i]);
    dsv4_kv_mem_free(&pool->kvmem, pool->slot_mem, pool->plan.slots);
    dsv4_kv_mem_free(&pool->kvmem, pool->page_mem, pool->plan.pages);
    dsv4_kv_mem_free(&pool->kvmem, pool->snap_mem, pool->plan.snapshots);
    free(pool->seq);
    free(pool->map);
    free(pool->slot_free);
    free(pool->slot_busy);
    free(pool->slot_node);
    free(pool->slot_depth);
    free(pool->slot_hash);
    free(pool->slot_pc_off);
    free(pool->page_ref);
    free(pool->page_next);
    free(pool->page_node);
    free(pool->node);
    free(pool->node_tok);
    free(pool->bucket);
    memset(pool, 0, sizeof(*pool));
}

/* ------------------------------------------------------------------ LRU of evictable entries */

static void lru_remove(struct dsv4_kv_pool *pool, int32_t n)
{
    struct dsv4_pc_node *e = &pool->node[n];
    if (!e->in_lru) return;
    if (e->lru_prev >= 0) pool->node[e->lru_prev].lru_next = e->lru_next;
    else pool->lru_head = e->lru_next;
    if (e->lru_next >= 0) pool->node[e->lru_next].lru_prev = e->lru_prev;
    else pool->lru_tail = e->lru_prev;
    e->in_lru = false;
}

static void lru_insert(struct dsv4_kv_pool *pool, int32_t n, bool at_head)
{
    struct dsv4_pc_node *e = &pool->node[n];
    e->in_lru = true;
    if (at_head) {
        e->lru_prev = -1;
        e->lru_next = pool->lru_head;
        if (pool->lru_head >= 0) pool->node[pool->lru_head].lru_prev = n;
        else pool->lru_tail = n;
        pool->lru_head = n;
    } else {
        e->lru_next = -1;
        e->lru_prev = pool->lru_tail;
        if (pool->lru_tail >= 0) pool->node[pool->lru_tail].lru_next = n;
        else pool->lru_head = n;
        pool->lru_tail = n;
    }
}

/* Puts an entry on the LRU list exactly when it is evictable: held by the cache alone and
 * without children. at_head: it is as old as the entry just evicted below it. */
static void lru_update(struct dsv4_kv_pool *pool, int32_t n, bool at_head)
{
    struct dsv4_pc_node *e = &pool->node[n];
    bool evictable = pool->page_ref[e->page] == 1 && e->n_children == 0;
    if (evictable && !e->in_lru) lru_insert(pool, n, at_head);
    else if (!evictable && e->in_lru) lru_remove(pool, n);
}

/* ------------------------------------------------------------------ pages */

static void page_push_free(struct dsv4_kv_pool *pool, int32_t id)
{
    pool->page_next[id] = pool->free_head;
    pool->free_head     = id;
    pool->n_free++;
}

static void page_ref_inc(struct dsv4_kv_pool *pool, int32_t id)
{
    pool->page_ref[id]++;
    if (pool->page_node[id] >= 0 && pool->page_ref[id] == 2) {
        pool->cnt.pages_evictable--;
        lru_remove(pool, pool->page_node[id]);
    }
}

static void page_unref(struct dsv4_kv_pool *pool, int32_t id)
{
    DSV4_ASSERT(pool->page_ref[id] > 0);
    pool->page_ref[id]--;
    if (pool->page_ref[id] == 0) {
        DSV4_ASSERT(pool->page_node[id] < 0);
        page_push_free(pool, id);
    } else if (pool->page_ref[id] == 1 && pool->page_node[id] >= 0) {
        pool->cnt.pages_evictable++;
        lru_update(pool, pool->page_node[id], false);
    }
}

static void node_evict(struct dsv4_kv_pool *pool, int32_t n)
{
    struct dsv4_pc_node *e = &pool->node[n];
    DSV4_ASSERT(e->used && e->in_lru);
    lru_remove(pool, n);
    int32_t *link = &pool->bucket[e->hash & (uint64_t)(pool->n_bucket - 1)];
    while (*link != n) link = &pool->node[*link].hnext;
    *link = e->hnext;
    if (e->parent >= 0) {
        pool->node[e->parent].n_children--;
        lru_update(pool, e->parent, true);
    }
    pool->page_node[e->page] = -1;
    pool->cnt.pages_evictable--;
    pool->cnt.prefix_entries--;
    pool->cnt.prefix_evictions++;
    page_unref(pool, e->page);
    e->used         = false;
    e->hnext        = pool->node_free;
    pool->node_free = n;
}

/* A free page, evicting the least recently used cache entry when none is free; -1 if none. */
static int32_t page_take(struct dsv4_kv_pool *pool)
{
    if (!pool->n_free && pool->lru_head >= 0) node_evict(pool, pool->lru_head);
    if (!pool->n_free) return -1;
    int32_t id      = pool->free_head;
    pool->free_head = pool->page_next[id];
    pool->n_free--;
    DSV4_ASSERT(pool->page_ref[id] == 0);
    pool->page_ref[id] = 1;
    return id;
}

static void map_page(struct dsv4_kv_pool *pool, int slot, int k, int32_t id)
{
    pool->map[(size_t)slot * (size_t)pool->pages_per_seq + (size_t)k] = id;
    pool->seq[slot].page[k] = id;
}

/* ------------------------------------------------------------------ slots */

int dsv4_kv_slot_acquire(struct dsv4_kv_pool *pool)
{
    if (!pool->n_slot_free) return -1;
    int slot = pool->slot_free[--pool->n_slot_free];
    pool->slot_busy[slot]   = true;
    pool->slot_node[slot]   = -1;
    pool->slot_depth[slot]  = 0;
    pool->slot_pc_off[slot] = pool->p.n_snapshots == 0;
    dsv4_seq_state_reset(&pool->seq[slot], pool->dims);
    return slot;
}

void dsv4_kv_slot_release(struct dsv4_kv_pool *pool, int slot)
{
    DSV4_ASSERT(slot >= 0 && slot < pool->p.max_seqs && pool->slot_busy[slot]);
    int32_t *m = pool->map + (size_t)slot * (size_t)pool->pages_per_seq;
    for (int k = pool->pages_per_seq - 1; k >= 0; k--)
        if (m[k] >= 0) {
            page_unref(pool, m[k]);
            map_page(pool, slot, k, -1);
        }
    pool->seq[slot].pos              = 0;
    pool->slot_busy[slot]            = false;
    pool->slot_free[pool->n_slot_free++] = slot;
}

int dsv4_kv_pages_needed(const struct dsv4_kv_pool *pool, int slot, int pos_end)
{
    const int32_t *m = pool->map + (size_t)slot * (size_t)pool->pages_per_seq;
    int            n = 0, last = (pos_end + pool->p.page_tokens - 1) / pool->p.page_tokens;
    for (int k = 0; k < last && k < pool->pages_per_seq; k++) n += m[k] < 0;
    return n;
}

int dsv4_kv_pages_available(const struct dsv4_kv_pool *pool)
{
    return pool->n_free + pool->cnt.pages_evictable;
}

int dsv4_kv_reserve(struct dsv4_kv_pool *pool, int slot, int pos_end)
{
    DSV4_ASSERT(pos_end <= pool->p.max_ctx);
    int32_t *m    = pool->map + (size_t)slot * (size_t)pool->pages_per_seq;
    int      last = (pos_end + pool->p.page_tokens - 1) / pool->p.page_tokens;
    for (int k = 0; k < last; k++) {
        if (m[k] >= 0) continue;
        int32_t id = page_take(pool);
        if (id < 0) return DSV4_EFULL;
        map_page(pool, slot, k, id);
    }
    return DSV4_OK;
}

/* ------------------------------------------------------------------ prefix cache */

static int32_t find_node(const struct dsv4_kv_pool *pool, uint64_t h, int32_t parent, const int32_t *toks)
{
    size_t pt = (size_t)pool->p.page_tokens;
    for (int32_t n = pool->bucket[h & (uint64_t)(pool->n_bucket - 1)]; n >= 0; n = pool->node[n].hnext) {
        const struct dsv4_pc_node *e = &pool->node[n];
        if (e->hash == h && e->parent == parent && !memcmp(pool->node_tok + (size_t)n * pt, toks, pt * sizeof(int32_t)))
            return n;
    }
    return -1;
}

/* The chain hash of a page: the previous page's (prev_hash, or the seed for the first
 * page), the depth and this page's token ids; it and the depth key the disk tier, so pages
 * outside the RAM cache have one too. The RAM cache compares the parent entry and the ids
 * exactly, but a disk record is found by this key alone (and its own page's ids), so the key
 * is cryptographic: the first 64 bits of SHA-256 over (prev_hash, k, SHA-256 of the ids).
 * Making another prefix's record answer for a victim's prefix takes a second preimage of
 * those 64 bits, not the trivial collision of a non-cryptographic hash. About 3 us a page. */
uint64_t dsv4_kv_chain_hash(int page_tokens, int k, uint64_t prev_hash, const int32_t *toks)
{
    uint8_t  in[8 + 4 + 32], out[32];
    uint64_t prev = k ? prev_hash : CHAIN_SEED;
    uint32_t kk   = (uint32_t)k;
    memcpy(in, &prev, 8);
    memcpy(in + 8, &kk, 4);
    dsv4_sha256(toks, sizeof(int32_t) * (size_t)page_tokens, in + 12);
    dsv4_sha256(in, sizeof(in), out);
    uint64_t h;
    memcpy(&h, out, 8);
    return h;
}

static uint64_t chain_hash(const struct dsv4_kv_pool *pool, int k, uint64_t prev_hash, const int32_t *toks)
{
    return dsv4_kv_chain_hash(pool->p.page_tokens, k, prev_hash, toks);
}

/* Enters a new cache entry for page id at depth k below parent, holding the cache's
 * reference (the caller's sequence holds another); -1 when no entry can be had. */
static int32_t node_insert(struct dsv4_kv_pool *pool, uint64_t h, int32_t parent, int32_t id, int k,
                           const int32_t *toks)
{
    size_t pt = (size_t)pool->p.page_tokens;
    if (pool->node_free < 0 && pool->lru_head >= 0) node_evict(pool, pool->lru_head);
    if (pool->node_free < 0) return -1;
    int32_t e       = pool->node_free;
    pool->node_free = pool->node[e].hnext;
    struct dsv4_pc_node *n = &pool->node[e];
    *n = (struct dsv4_pc_node){ .hash = h, .parent = parent, .page = id, .depth = k, .used = true,
                                .lru_prev = -1, .lru_next = -1 };
    memcpy(pool->node_tok + (size_t)e * pt, toks, sizeof(int32_t) * pt);
    pool->page_ref[id]++;
    pool->page_node[id] = e;
    size_t b            = h & (uint64_t)(pool->n_bucket - 1);
    n->hnext            = pool->bucket[b];
    pool->bucket[b]     = e;
    if (parent >= 0) {
        pool->node[parent].n_children++;
        lru_update(pool, parent, false);
    }
    pool->cnt.prefix_entries++;
    pool->cnt.prefix_inserts++;
    return e;
}

/* The disk tier's entry for page k of a prefix whose RAM chain ended at parent (in_ram:
 * parent is the RAM entry of page k - 1, or k == 0): read, checked against toks and put on
 * a fresh page, which enters the cache while it can take an entry (one reference for the
 * caller's sequence, one for the cache); past that the page is the sequence's alone and its
 * snapshot stays in the tier's last load. *e: the entry, or -1 for a page outside the
 * cache. The page, or -1 on a miss or when no page is free. */
static int32_t disk_load(struct dsv4_kv_pool *pool, uint64_t h, bool in_ram, int32_t parent, int k,
                         const int32_t *toks, int32_t *e)
{
    struct dsv4_kv_disk_key key = { h, (uint32_t)k };
    *e                          = -1;
    if (!pool->tier) return -1;
    /* the page first: a load makes the record the tier's "last load", whose snapshot attach
     * restores when the chain ends outside the cache; a page not to be had after the load
     * would end the chain at k - 1 with page k's snapshot in its place */
    int32_t id = page_take(pool);
    if (id < 0) return -1;
    if (!dsv4_kv_tier_load(pool->tier, key, toks)) {
        page_unref(pool, id);
        return -1;
    }
    if (in_ram) *e = node_insert(pool, h, parent, id, k, toks);
    dsv4_kv_tier_install(pool->tier, pool->page_mem + (size_t)id * pool->plan.page_bytes,
                         *e >= 0 ? pool->snap_mem + (size_t)*e * pool->plan.snap_bytes : NULL);
    pool->cnt.prefix_disk_loads++;
    return id;
}

int dsv4_kv_prefix_attach(struct dsv4_kv_pool *pool, int slot, const int32_t *tokens, int n)
{
    struct dsv4_seq_state *st = &pool->seq[slot];
    int                    pt = pool->p.page_tokens;
    if (pool->p.n_snapshots == 0 || n < 2) return 0;
    DSV4_ASSERT(st->pos == 0 && pool->slot_depth[slot] == 0);
    pool->cnt.prefix_lookups++;
    int      max_k = (n - 1) / pt, k = 0, from_disk = 0;
    int32_t  parent = -1; /* RAM entry of page k - 1 while in_ram */
    bool     in_ram = true;
    uint64_t h      = 0;
    if (max_k > pool->pages_per_seq) max_k = pool->pages_per_seq;
    for (; k < max_k; k++) {
        const int32_t *toks = tokens + (size_t)k * (size_t)pt;
        int32_t        e    = -1, id;
        h                   = chain_hash(pool, k, h, toks);
        if (in_ram && (e = find_node(pool, h, parent, toks)) >= 0) {
            id = pool->node[e].page;
            page_ref_inc(pool, id);
        } else if ((id = disk_load(pool, h, in_ram, parent, k, toks, &e)) >= 0) {
            from_disk++; /* RAM chain ended: disk */
        } else {
            break;
        }
        map_page(pool, slot, k, id);
        parent = e;
        in_ram = e >= 0;
        pool->slot_hash[slot] = h;
    }
    if (k == 0) return 0;
    /* the deepest page's snapshot: its entry's, or (outside the cache) the last load's */
    const uint8_t *snap = pool->snap_mem + (size_t)parent * pool->plan.snap_bytes;
    if (!in_ram) {
        snap = dsv4_kv_tier_scratch_snap(pool->tier);
        dsv4_kv_tier_install(pool->tier, NULL, (void *)snap);
    }
    dsv4_kv_snapshot_restore(st, snap, k * pt);
    pool->slot_node[slot]  = parent;
    pool->slot_depth[slot] = k;
    pool->cnt.prefix_hits++;
    pool->cnt.prefix_hit_tokens += (uint64_t)(k * pt);
    pool->cnt.prefix_disk_hit_tokens += (uint64_t)(from_disk * pt);
    return k * pt;
}

int dsv4_kv_prefix_disk_keys(const struct dsv4_kv_pool *pool, const int32_t *tokens, int n,
                             struct dsv4_kv_disk_key *keys, int max, int *first)
{
    int      pt = pool->p.page_tokens, max_k = (n - 1) / pt, k = 0, m = 0;
    int32_t  parent = -1;
    uint64_t h      = 0;
    *first          = 0;
    if (!pool->tier || pool->p.n_snapshots == 0 || n < 2) return 0;
    if (max_k > pool->pages_per_seq) max_k = pool->pages_per_seq;
    for (; k < max_k; k++) { /* the RAM chain, as attach walks it */
        const int32_t *toks = tokens + (size_t)k * (size_t)pt;
        h                   = chain_hash(pool, k, h, toks);
        if ((parent = find_node(pool, h, parent, toks)) < 0) break;
    }
    *first = k;
    for (; k < max_k && m < max; k++, m++) {
        if (m) h = chain_hash(pool, k, h, tokens + (size_t)k * (size_t)pt);
        keys[m] = (struct dsv4_kv_disk_key){ h, (uint32_t)k };
    }
    return m;
}

/* Queues page k of the slot (chain hash h) for the disk tier with the snapshot snap. */
static void disk_write(struct dsv4_kv_pool *pool, int slot, int k, uint64_t h, const int32_t *toks, int32_t page,
                       const uint8_t *snap)
{
    int                      pt   = pool->p.page_tokens;
    struct dsv4_kv_disk_meta meta = { k ? pool->slot_hash[slot] : 0, (uint64_t)(k + 1) * (uint64_t)pt };
    dsv4_kv_tier_write(pool->tier, (struct dsv4_kv_disk_key){ h, (uint32_t)k }, &meta, toks,
                       pool->page_mem + (size_t)page * pool->plan.page_bytes, snap);
}

void dsv4_kv_prefix_publish(struct dsv4_kv_pool *pool, int slot, const int32_t *tokens)
{
    struct dsv4_seq_state *st = &pool->seq[slot];
    int                    pt = pool->p.page_tokens;
    if (pool->slot_pc_off[slot] || st->pos == 0 || st->pos % pt != 0) return;
    int k = st->pos / pt - 1;
    if (pool->slot_depth[slot] != k) {
        pool->slot_pc_off[slot] = true; /* an earlier page of this prefix is in neither tier */
        return;
    }
    int32_t        parent = pool->slot_node[slot];
    bool           in_ram = k == 0 || parent >= 0;
    const int32_t *toks   = tokens + (size_t)k * (size_t)pt;
    uint64_t       h      = chain_hash(pool, k, pool->slot_hash[slot], toks);
    int32_t       *m      = pool->map + (size_t)slot * (size_t)pool->pages_per_seq;
    int32_t        e      = in_ram ? find_node(pool, h, parent, toks) : -1;
    if (e >= 0) {
        /* another sequence entered this prefix first: share its page (the contents are
         * identical, the forward being batch-invariant) and free ours */
        int32_t own = m[k];
        if (own != pool->node[e].page) {
            page_ref_inc(pool, pool->node[e].page);
            map_page(pool, slot, k, pool->node[e].page);
            page_unref(pool, own);
        }
    } else if (in_ram && (e = node_insert(pool, h, parent, m[k], k, toks)) >= 0) {
        uint8_t *snap = pool->snap_mem + (size_t)e * pool->plan.snap_bytes;
        dsv4_kv_snapshot_save(st, snap);
        if (pool->tier) disk_write(pool, slot, k, h, toks, m[k], snap);
    } else if (pool->tier) { /* no RAM entry for it: the disk tier alone keeps the prefix going */
        uint8_t *snap = dsv4_kv_tier_scratch_snap(pool->tier);
        dsv4_kv_snapshot_save(st, snap);
        disk_write(pool, slot, k, h, toks, m[k], snap);
    } else {
        pool->slot_pc_off[slot] = true;
        return;
    }
    pool->slot_node[slot]  = e;
    pool->slot_depth[slot] = k + 1;
    pool->slot_hash[slot]  = h;
}

void dsv4_kv_prefix_clear(struct dsv4_kv_pool *pool)
{
    while (pool->lru_head >= 0) node_evict(pool, pool->lru_head);
}

/* ------------------------------------------------------------------ counters */

void dsv4_kv_pool_counters(const struct dsv4_kv_pool *pool, struct dsv4_kv_counters *c)
{
    *c             = pool->cnt;
    c->slots_total = pool->p.max_seqs;
    c->slots_used  = pool->p.max_seqs - pool->n_slot_free;
    c->pages_total = pool->p.n_pages;
    c->pages_free  = pool->n_free;
    c->pages_cached = pool->cnt.prefix_entries;
    c->fragmentation = 0;
    for (int s = 0; s < pool->p.max_seqs; s++) {
        if (!pool->slot_busy[s]) continue;
        const int32_t *m = pool->map + (size_t)s * (size_t)pool->pages_per_seq;
        int64_t        mapped = 0;
        for (int k = 0; k < pool->pages_per_seq; k++) mapped += m[k] >= 0;
        c->fragmentation += mapped * pool->p.page_tokens - pool->seq[s].pos;
    }
}
