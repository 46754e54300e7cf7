/*
 * session_cache.c - the prompt cache of `dsv4 run` and `dsv4 chat` (dsv4_prompt_cache_*,
 * include/dsv4.h): whole-session records at page boundaries of a prompt, in a kv-disk store
 * (kv_disk.h: budget with LRU eviction, lock file, crash-safe writes, every read verified),
 * so a later process given a prompt that starts the same way loads the state at the deepest
 * stored boundary and evaluates only the rest.
 *
 * A record is the payload of a saved session (session_file.h) after exactly P = k * page
 * tokens of a prompt (k >= 1), logits included. Its key: chain = the prefix cache's chain
 * hash of those k pages (dsv4_kv_chain_hash, the same value kv_pool.c keys page k - 1 by)
 * XOR SESSION_TAG, depth = SESSION_DEPTH_BIT | k. Serving's page records have depths below
 * the context's page count, and a single saved session file depth 0xFFFFFFFF, so no record
 * of one kind is read as another's. The chain is 64 bits: a hit is trusted only after the
 * record's token ids equal the prompt's (dsv4_session_decode's expect).
 *
 * The store lives in DIR/session, not DIR itself: a kv-disk store holds one identity, and
 * the session's (dsv4_session_identity: model, revision, compute, MTP state) may differ from
 * a server's on the same DIR, whose records an open would otherwise remove as invalid.
 * Records carry no parent (every one is a whole session), so eviction is plain LRU.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/session_file.h"
#include "kv/kv_pool.h"

static const uint64_t SESSION_TAG       = 0x4548434153345644ull; /* "DV4SACHE" little-endian */
static const uint32_t SESSION_DEPTH_BIT = 0x80000000u;

struct dsv4_prompt_cache {
    struct dsv4_kv_disk *disk;
    char                *dir; /* DIR/session, for messages */
    struct dsv4_logger   lg;
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int dsv4_prompt_cache_open(dsv4_prompt_cache **out, const dsv4_session *s, const char *dir, uint64_t budget,
                           struct dsv4_err *err)
{
    uint8_t id[DSV4_KV_DISK_ID_BYTES];
    *out = NULL;
    if (dsv4_session_identity(s, id)) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory for the model identity");
    dsv4_prompt_cache *pc = calloc(1, sizeof(*pc));
    char              *sub = dsv4_path_join(dir, "session");
    if (!pc || !sub) {
        free(pc);
        free(sub);
        return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    }
    pc->dir = sub;
    pc->lg  = *dsv4_engine_logger(s->engine);
    int rc  = dsv4_kv_disk_open(&pc->disk, sub, budget ? budget : (uint64_t)10 << 30, id, &pc->lg, err);
    if (rc) {
        dsv4_prompt_cache_close(pc);
        return rc;
    }
    *out = pc;
    return DSV4_OK;
}

void dsv4_prompt_cache_close(dsv4_prompt_cache *pc)
{
    if (!pc) return;
    dsv4_kv_disk_close(pc->disk);
    free(pc->dir);
    free(pc);
}

const char *dsv4_prompt_cache_dir(const dsv4_prompt_cache *pc) { return pc->dir; }

/* The key of the record after k pages whose chain hash is chain. */
static struct dsv4_kv_disk_key key_of(uint64_t chain, int k)
{
    return (struct dsv4_kv_disk_key){ chain ^ SESSION_TAG, SESSION_DEPTH_BIT | (uint32_t)k };
}

/* Chain hashes of the first n_pages pages of tokens into h[0, n_pages). */
static void chain_of(int page, const int32_t *tokens, int n_pages, uint64_t *h)
{
    for (int k = 0; k < n_pages; k++) h[k] = dsv4_kv_chain_hash(page, k, k ? h[k - 1] : 0, tokens + (size_t)k * page);
}

struct dsv4_kv_disk_key dsv4_prompt_cache_key(int page_tokens, const int32_t *tokens, int k)
{
    uint64_t h = 0;
    for (int i = 0; i < k; i++) h = dsv4_kv_chain_hash(page_tokens, i, h, tokens + (size_t)i * page_tokens);
    return key_of(h, k);
}

/* Loads into s (reset) the deepest stored record of tokens' first n_pages pages; its page
 * count, or 0 when none is valid (bad records are logged by the store or here). */
static int load_deepest(dsv4_prompt_cache *pc, dsv4_session *s, const int32_t *tokens, const uint64_t *h,
                        int n_pages)
{
    int      page = s->st.page_tokens;
    size_t   cap  = dsv4_session_payload_bytes(s, n_pages * page, true);
    uint8_t *buf  = malloc(cap);
    int      got  = 0;
    for (int k = n_pages; buf && k >= 1 && !got; k--) {
        struct dsv4_kv_disk_meta meta;
        struct dsv4_err          err;
        size_t                   len = dsv4_session_payload_bytes(s, k * page, true), n = 0;
        char                     why[256];
        int rc = dsv4_kv_disk_get_exact(pc->disk, key_of(h[k - 1], k), &meta, buf, len, &n, &err);
        if (rc == DSV4_KV_DISK_MISS) continue;
        if (rc) dsv4_log(&pc->lg, DSV4_LOG_WARN, "prompt cache %s: %s", pc->dir, err.msg);
        else if (dsv4_session_decode(s, buf, n, meta.n_tok, tokens, NULL, k * page, why, sizeof(why)))
            dsv4_log(&pc->lg, DSV4_LOG_WARN, "prompt cache %s: record of %d tokens ignored: %s", pc->dir, k * page,
                     why);
        else got = k;
    }
    free(buf);
    return got;
}

/* Stores the session (holding tokens[0, k pages)) as the record of k pages; false after a
 * failure, which is logged, not returned: the cache is an optimisation. */
static bool save_at(dsv4_prompt_cache *pc, const dsv4_session *s, const int32_t *tokens, uint64_t chain, int k)
{
    struct dsv4_err          err;
    uint8_t                 *buf = NULL;
    size_t                   len = 0;
    struct dsv4_kv_disk_meta meta = { 0, (uint64_t)dsv4_session_pos(s) };
    int rc = dsv4_session_encode(s, tokens, dsv4_session_pos(s), &buf, &len, &err);
    if (rc == DSV4_OK) rc = dsv4_kv_disk_put(pc->disk, key_of(chain, k), &meta, buf, len, &err);
    free(buf);
    if (rc && rc != DSV4_ERANGE) /* ERANGE: the store logs it once */
        dsv4_log(&pc->lg, DSV4_LOG_WARN, "prompt cache %s: not saved: %s", pc->dir, err.msg);
    return rc == DSV4_OK;
}

int dsv4_prompt_cache_eval(dsv4_prompt_cache *pc, dsv4_session *s, const int32_t *tokens, int n,
                           struct dsv4_prompt_cache_eval *res, struct dsv4_err *err)
{
    int page = s->st.page_tokens, pos = dsv4_session_pos(s), n_pages = n / page;
    memset(res, 0, sizeof(*res));
    if (n <= pos) return dsv4_err_set(err, DSV4_EINVAL, "nothing to evaluate: %d tokens, the session holds %d", n, pos);
    uint64_t *h = malloc(sizeof(uint64_t) * (size_t)(n_pages ? n_pages : 1));
    if (!h) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    chain_of(page, tokens, n_pages, h);
    if (pos == 0) {
        double t0    = now_ms();
        res->probed  = true;
        res->loaded  = n_pages ? load_deepest(pc, s, tokens, h, n_pages) * page : 0;
        res->load_ms = now_ms() - t0;
        pos          = res->loaded;
    }
    int rc = DSV4_OK, at = n_pages * page; /* the deepest boundary: stored unless held already */
    if (at > pos) {
        rc = dsv4_session_eval(s, tokens + pos, at - pos, NULL, NULL, NULL, err);
        if (rc == DSV4_OK && save_at(pc, s, tokens, h[n_pages - 1], n_pages)) res->saved = at;
        pos = at;
    }
    if (rc == DSV4_OK && n > pos) rc = dsv4_session_eval(s, tokens + pos, n - pos, NULL, NULL, NULL, err);
    free(h);
    return rc;
}
