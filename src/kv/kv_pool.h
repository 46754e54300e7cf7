/*
 * kv_pool.h - the serving KV manager: fixed per-sequence slots, a paged pool for what grows
 * with the position, and the prefix cache (internal: the scheduler and tests use it).
 *
 * Everything is allocated once, at start-up, from (max_ctx, max_seqs, n_pages,
 * n_snapshots); serving only moves indices between free lists:
 *   slots      [max_seqs] of kv.h slot bytes (rings, frontiers), a stack of free slots;
 *   pages      [n_pages] of kv.h page bytes, a singly linked free list and a reference count
 *              per page (sequences mapping it, plus one while the prefix cache holds it);
 *   prefix     [n_snapshots] cache entries, each one full page of one token prefix plus the
 *              snapshot of the state at its end (kv.h), keyed by a hash chain over the token
 *              ids page by page, verified on the ids themselves (no false hits).
 * Each operation is O(1) apart from the prefix lookup (one hash probe per page, comparing
 * page_tokens ids) and mapping the pages a sequence needs.
 *
 * Reference counting: a page returns to the free list when its count drops to zero. A cache
 * entry whose page only the cache holds, and which has no cached child (entries form a tree
 * through their parent prefix), is evictable; evictable entries sit on an LRU list and are
 * evicted, leaves first, when a page or an entry is wanted and none is free. A sequence
 * that resumes from the cache maps the entries' pages (their counts rise, so they cannot
 * be evicted under it) and restores the snapshot of the deepest one.
 *
 * Single-threaded: the scheduler's stepping thread owns the pool.
 */
#ifndef DSV4_KV_POOL_H
#define DSV4_KV_POOL_H

#include "kv/kv.h"
#include "kv/kv_tier.h"

struct dsv4_kv_pool_params {
    int max_ctx;     /* positions per sequence */
    int max_seqs;    /* slots */
    int page_tokens; /* positions per page (power of two; every ratio divides it) */
    int n_pages;     /* pages in the pool */
    int n_snapshots; /* prefix-cache entries; 0 disables the cache */
    bool mtp;        /* slots (and snapshots) carry the MTP block's state (speculative decoding) */
};

/* Bytes of each part, for the start-up plan. */
struct dsv4_kv_plan {
    size_t slot_bytes, page_bytes, snap_bytes; /* one of each */
    size_t slots, pages, snapshots, tables;    /* totals */
    size_t total;
};

struct dsv4_kv_counters {
    int      slots_total, slots_used;
    int      pages_total, pages_free;
    int      pages_cached;       /* held by the prefix cache (shared or not) */
    int      pages_evictable;    /* held by the cache alone */
    int64_t  fragmentation;      /* mapped positions that hold no token yet (all slots) */
    int      prefix_entries;
    uint64_t prefix_lookups, prefix_hits, prefix_hit_tokens, prefix_inserts, prefix_evictions;
    uint64_t prefix_disk_loads;      /* entries read back from the disk tier */
    uint64_t prefix_disk_hit_tokens; /* hit tokens of those entries (part of prefix_hit_tokens) */
};

/* One prefix-cache entry. */
struct dsv4_pc_node {
    uint64_t hash;       /* chain hash: the parent's hash and this page's token ids */
    int32_t  parent;     /* entry of the previous page, -1 for the first page */
    int32_t  page;       /* the page it holds (one reference) */
    int32_t  depth;      /* page index within the prefix */
    int32_t  n_children;
    int32_t  hnext;      /* next entry in the hash bucket; next free entry when unused */
    int32_t  lru_prev, lru_next;
    bool     in_lru, used;
};

struct dsv4_kv_pool {
    struct dsv4_kv_pool_params p;
    struct dsv4_kv_plan        plan;
    const struct dsv4_kv_dims *dims;     /* the model's (cfg.kv), outlives the pool */
    enum dsv4_row_fmt          fmt;
    int                        pages_per_seq;
    struct dsv4_kv_mem         kvmem;     /* where slots, pages and snapshots live */
    uint8_t                   *slot_mem;  /* [max_seqs, slot_bytes] */
    uint8_t                   *page_mem;  /* [n_pages, page_bytes] */
    uint8_t                   *snap_mem;  /* [n_snapshots, snap_bytes] */
    struct dsv4_seq_state     *seq;       /* [max_seqs] states bound to the slots */
    int32_t                   *map;       /* [max_seqs, pages_per_seq] page id or -1 */
    int32_t                   *slot_free; /* [max_seqs] stack of free slots */
    int                        n_slot_free;
    bool                      *slot_busy; /* [max_seqs] */
    int32_t                   *slot_node; /* [max_seqs] deepest cache entry of the slot's prefix; -1
                                           * with slot_depth > 0: the prefix goes on on disk only */
    int32_t                   *slot_depth;/* [max_seqs] pages of the slot's prefix in the cache or on disk */
    uint64_t                  *slot_hash; /* [max_seqs] chain hash of page slot_depth - 1 */
    bool                      *slot_pc_off; /* [max_seqs] stop publishing this slot's pages */
    int32_t                   *page_ref;  /* [n_pages] */
    int32_t                   *page_next; /* [n_pages] free-list link */
    int32_t                   *page_node; /* [n_pages] cache entry holding the page, or -1 */
    int32_t                    free_head;
    int                        n_free;
    /* prefix cache */
    struct dsv4_pc_node       *node;      /* [n_snapshots] */
    int32_t                   *node_tok;  /* [n_snapshots, page_tokens] */
    int32_t                   *bucket;    /* [n_bucket] first entry of each hash chain, -1 */
    int                        n_bucket;  /* power of two */
    int32_t                    node_free;
    int32_t                    lru_head, lru_tail; /* evictable entries, oldest first */
    struct dsv4_kv_counters    cnt;       /* cumulative prefix counters; the rest on demand */
    struct dsv4_kv_tier       *tier;      /* the disk tier under the cache (not owned), or NULL */
};

/* The plan (sizes) for these parameters; DSV4_EINVAL names a bad parameter. */
int  dsv4_kv_pool_plan(const struct dsv4_kv_dims *dims, enum dsv4_row_fmt fmt, const struct dsv4_kv_pool_params *p,
                       struct dsv4_kv_plan *plan, struct dsv4_err *err);
/* Allocates and zero-fills everything (pages touched now, not while serving). */
int  dsv4_kv_pool_init(struct dsv4_kv_pool *pool, const struct dsv4_kv_dims *dims, enum dsv4_row_fmt fmt,
                       const struct dsv4_kv_pool_params *p, const struct dsv4_kv_mem *mem, struct dsv4_err *err);
void dsv4_kv_pool_free(struct dsv4_kv_pool *pool);
void dsv4_kv_pool_counters(const struct dsv4_kv_pool *pool, struct dsv4_kv_counters *c);

/* A free slot at position 0 with no page mapped, or -1. */
int  dsv4_kv_slot_acquire(struct dsv4_kv_pool *pool);
/* Unmaps every page of the slot (dropping its references) and frees the slot. */
void dsv4_kv_slot_release(struct dsv4_kv_pool *pool, int slot);
static inline struct dsv4_seq_state *dsv4_kv_slot_state(struct dsv4_kv_pool *pool, int slot)
{
    return &pool->seq[slot];
}

/* Pages still to map so that positions [0, pos_end) of the slot are mapped. */
int dsv4_kv_pages_needed(const struct dsv4_kv_pool *pool, int slot, int pos_end);
/* Pages that could be had now: free plus evictable cache pages. */
int dsv4_kv_pages_available(const struct dsv4_kv_pool *pool);
/* Maps pages so that positions [0, pos_end) are mapped, evicting cache entries when the
 * free list is empty; DSV4_EFULL when the pool runs out (what was mapped stays mapped). */
int dsv4_kv_reserve(struct dsv4_kv_pool *pool, int slot, int pos_end);

/* Prefix cache. Attach: for a fresh slot, maps the longest cached prefix of tokens[0, n)
 * that leaves at least one token to evaluate, restores its snapshot and returns the
 * positions resumed (0 on a miss or with the cache off); where the RAM chain ends, the
 * disk tier (pool->tier) is asked for the next pages, which enter the cache as if
 * published while it has entries, and past that are read into the slot's own pages (only
 * the deepest one's snapshot is restored). Publish: once the slot's position is a page
 * boundary, enters the page just completed (tokens: the slot's tokens so far) and queues
 * it for the disk tier; when the cache has no entry for it (or for an earlier page of the
 * prefix), the disk tier still gets it, its snapshot taken into the tier's scratch. */
int  dsv4_kv_prefix_attach(struct dsv4_kv_pool *pool, int slot, const int32_t *tokens, int n);
/* The disk tier's keys of the pages attach would look for on disk: those of tokens[0, n)
 * past the RAM chain (up to max of them). Returns how many; *first: the depth of the
 * first (its ids start at tokens + *first * page_tokens). 0 with the cache or the tier off. */
int  dsv4_kv_prefix_disk_keys(const struct dsv4_kv_pool *pool, const int32_t *tokens, int n,
                              struct dsv4_kv_disk_key *keys, int max, int *first);
void dsv4_kv_prefix_publish(struct dsv4_kv_pool *pool, int slot, const int32_t *tokens);
/* Evicts every evictable cache entry (tests; memory pressure relief). */
void dsv4_kv_prefix_clear(struct dsv4_kv_pool *pool);

/* The chain hash of page k (page_tokens ids at toks) below the page whose hash is prev_hash
 * (ignored for k = 0): the prefix cache's key, shared with the session cache
 * (engine/session_cache.c) so both key a prefix the same way. */
uint64_t dsv4_kv_chain_hash(int page_tokens, int k, uint64_t prev_hash, const int32_t *toks);

#endif
