/*
 * tokenizer.c - encoding and decoding with a loaded byte-level BPE tokenizer.
 *
 * Encoding follows the Hugging Face pipeline step for step, because matching it id for id
 * is the whole point:
 *
 *   1. UTF-8 repair (invalid input only): each maximal invalid subpart becomes U+FFFD.
 *   2. Added tokens: leftmost-longest matches of the non-normalized added tokens on the raw
 *      text, then of the normalized ones inside the remaining gaps (the reference's two
 *      passes; with the empty normalizer both see the same bytes).
 *   3. Pre-tokenizer: each Split step runs its Oniguruma regex over each piece left by the
 *      previous step (the regex sees only that piece, so lookaheads stop at its edge) and
 *      cuts it by the step's behaviour. Matches are found exactly as the Rust onig crate's
 *      find_iter finds them, including its rule for empty matches.
 *   4. ByteLevel maps bytes to symbols one to one, so BPE starts from byte ids directly.
 *   5. BPE merges the lowest-ranked adjacent pair first, leftmost on ties (a min-heap of
 *      rank << 32 | position, with stale entries skipped), as the reference's Word does.
 *
 * Nothing here allocates in the tokenizer: scratch (BPE arrays, heap, the repaired copy of
 * invalid input, and a small direct-mapped cache of piece -> ids that makes repeated words
 * nearly free on long inputs) belongs to the call, so one tokenizer serves many threads.
 */
#include <oniguruma.h>
#include <stdlib.h>
#include <string.h>

#include "tok/tok.h"

enum {
    CACHE_SLOTS    = 4096, /* direct-mapped; a power of two */
    CACHE_MAX_LEN  = 48,   /* longest piece kept (bytes) */
    CACHE_MAX_IDS  = 8,    /* most ids kept per piece */
    CACHE_MIN_TEXT = 4096, /* shorter inputs skip the cache (its setup would dominate) */
};

struct cache_slot {
    const char *key; /* into the text being encoded; NULL when empty */
    uint32_t    len;
    uint32_t    n_ids;
    int32_t     ids[CACHE_MAX_IDS];
};

/* The pending piece of a merging split behaviour. */
struct pend {
    size_t s, e;
    bool   match; /* flag of the last segment folded into it */
    bool   has;
};

struct enc {
    const struct dsv4_tokenizer *t;
    const char                  *text;
    int32_t                     *out;
    size_t                       cap;
    size_t                       n; /* ids produced (may exceed cap) */
    OnigRegion                  *region;

    /* BPE scratch, grown to the longest piece seen */
    int32_t  *sym, *prv, *nxt;
    uint64_t *heap;
    size_t    scratch_cap;
    char     *spell; /* byte-level spelling of a piece (ignore_merges) */

    struct cache_slot *cache;
    int                status;
    struct dsv4_err   *err;
    const uint8_t     *literal; /* [len] or NULL: no added token may cover a marked byte */
};

static void emit(struct enc *e, int32_t id)
{
    if (e->n < e->cap) e->out[e->n] = id;
    e->n++;
}

/* ------------------------------------------------------------------ BPE */

static const struct tok_merge *merge_find(const struct dsv4_tokenizer *t, int32_t a, int32_t b)
{
    uint64_t pair = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint64_t h    = pair * 0x9e3779b97f4a7c15ull;
    size_t   s    = (size_t)(h ^ (h >> 29)) & t->merge_mask;
    for (;;) {
        const struct tok_merge *m = &t->merges[s];
        if (m->pair == pair) return m;
        if (m->pair == TOK_MERGE_EMPTY) return NULL;
        s = (s + 1) & t->merge_mask;
    }
}

static bool grow_scratch(struct enc *e, size_t n)
{
    if (n <= e->scratch_cap) return true;
    size_t cap = e->scratch_cap ? e->scratch_cap : 64;
    while (cap < n) cap *= 2;
    int32_t  *sym  = realloc(e->sym, cap * sizeof(*sym));
    if (sym) e->sym = sym;
    int32_t  *prv  = realloc(e->prv, cap * sizeof(*prv));
    if (prv) e->prv = prv;
    int32_t  *nxt  = realloc(e->nxt, cap * sizeof(*nxt));
    if (nxt) e->nxt = nxt;
    uint64_t *heap = realloc(e->heap, 3 * cap * sizeof(*heap)); /* n - 1 pairs + 2 per merge */
    if (heap) e->heap = heap;
    char     *sp   = realloc(e->spell, 2 * cap + 1);
    if (sp) e->spell = sp;
    if (!sym || !prv || !nxt || !heap || !sp) return false;
    e->scratch_cap = cap;
    return true;
}

static void heap_push(uint64_t *h, size_t *n, uint64_t v)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i    = p;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n)
{
    uint64_t top  = h[0];
    uint64_t last = h[--*n];
    size_t   i = 0, m = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m) break;
        if (c + 1 < m && h[c + 1] < h[c]) c++;
        if (last <= h[c]) break;
        h[i] = h[c];
        i    = c;
    }
    if (m) h[i] = last;
    return top;
}

static void push_pair(struct enc *e, size_t *nh, int32_t pos)
{
    const struct tok_merge *m = merge_find(e->t, e->sym[pos], e->sym[e->nxt[pos]]);
    if (m) heap_push(e->heap, nh, (uint64_t)(uint32_t)m->rank << 32 | (uint32_t)pos);
}

/* Merges the bytes of one piece; the result is the live symbols from position 0 on. */
static void bpe_merge(struct enc *e, const unsigned char *p, size_t n)
{
    const struct dsv4_tokenizer *t = e->t;
    int32_t *sym = e->sym, *prv = e->prv, *nxt = e->nxt;
    for (size_t i = 0; i < n; i++) {
        sym[i] = t->byte_id[p[i]];
        prv[i] = (int32_t)i - 1;
        nxt[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    size_t nh = 0;
    for (size_t i = 0; i + 1 < n; i++) push_pair(e, &nh, (int32_t)i);
    while (nh) {
        uint64_t top  = heap_pop(e->heap, &nh);
        int32_t  pos  = (int32_t)(uint32_t)top;
        int32_t  rank = (int32_t)(top >> 32);
        if (sym[pos] < 0 || nxt[pos] < 0) continue;
        int32_t                 q = nxt[pos];
        const struct tok_merge *m = merge_find(t, sym[pos], sym[q]);
        if (!m || m->rank != rank) continue; /* stale: a neighbour changed since the push */
        sym[pos] = m->id;
        sym[q]   = -1;
        nxt[pos] = nxt[q];
        if (nxt[q] >= 0) prv[nxt[q]] = pos;
        if (prv[pos] >= 0) push_pair(e, &nh, prv[pos]);
        if (nxt[pos] >= 0) push_pair(e, &nh, pos);
    }
}

static uint32_t piece_hash(const unsigned char *p, size_t n)
{
    uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return (uint32_t)(h ^ (h >> 32));
}

static void bpe_piece(struct enc *e, size_t start, size_t end)
{
    const struct dsv4_tokenizer *t = e->t;
    const unsigned char         *p = (const unsigned char *)e->text + start;
    size_t                       n = end - start;
    if (n == 1) {
        emit(e, t->byte_id[p[0]]);
        return;
    }
    struct cache_slot *slot = NULL;
    if (e->cache && n <= CACHE_MAX_LEN) {
        slot = &e->cache[piece_hash(p, n) & (CACHE_SLOTS - 1)];
        if (slot->key && slot->len == n && memcmp(slot->key, p, n) == 0) {
            for (uint32_t i = 0; i < slot->n_ids; i++) emit(e, slot->ids[i]);
            return;
        }
        slot->key = NULL; /* refilled below, or left empty if the piece has too many ids */
    }
    if (!grow_scratch(e, n)) {
        e->status = dsv4_err_set(e->err, DSV4_ENOMEM, "out of memory encoding a %zu-byte piece", n);
        return;
    }
    if (t->ignore_merges) {
        /* The whole piece may be a vocabulary token by itself. */
        size_t o = 0;
        for (size_t i = 0; i < n; i++) o += tok_utf8_encode(tok_byte_to_cp(p[i]), e->spell + o);
        e->spell[o]   = '\0';
        intptr_t hit = (intptr_t)dsv4_strmap_get(&t->vocab_str, e->spell);
        if (hit) {
            emit(e, (int32_t)hit - 1);
            return;
        }
    }
    bpe_merge(e, p, n);
    uint32_t k = 0;
    for (int32_t i = 0; i >= 0; i = e->nxt[i]) {
        if (slot && k < CACHE_MAX_IDS) slot->ids[k] = e->sym[i];
        k++;
        emit(e, e->sym[i]);
    }
    if (slot && k <= CACHE_MAX_IDS) {
        slot->key   = (const char *)p;
        slot->len   = (uint32_t)n;
        slot->n_ids = k;
    }
}

/* ------------------------------------------------------------------ pre-tokenizer */

static void pretok(struct enc *e, int level, size_t start, size_t end);

static void piece(struct enc *e, int level, size_t s, size_t end)
{
    if (s < end) pretok(e, level + 1, s, end);
}

/* Folds one segment (a match or the gap before it) into the pieces of a behaviour. The
 * merging behaviours are the reference's folds written forwards: MergedWithPrevious glues a
 * match to the gap before it, MergedWithNext a match to the gap after it, Contiguous runs of
 * equal flags. Zero-length segments take part in the folds; empty pieces are dropped. */
static void segment(struct enc *e, int level, struct pend *pd, size_t s, size_t end, bool match)
{
    switch (e->t->splits[level].behavior) {
    case TOK_SPLIT_ISOLATED:
        piece(e, level, s, end);
        break;
    case TOK_SPLIT_REMOVED:
        if (!match) piece(e, level, s, end);
        break;
    case TOK_SPLIT_CONTIGUOUS:
        if (pd->has && pd->match == match) {
            pd->e = end;
            break;
        }
        if (pd->has) piece(e, level, pd->s, pd->e);
        *pd = (struct pend){ s, end, match, true };
        break;
    case TOK_SPLIT_MERGED_WITH_PREVIOUS:
        if (match && pd->has && !pd->match) {
            pd->e     = end;
            pd->match = true;
            break;
        }
        if (pd->has) piece(e, level, pd->s, pd->e);
        *pd = (struct pend){ s, end, match, true };
        break;
    case TOK_SPLIT_MERGED_WITH_NEXT:
        if (pd->has && !match) { /* pd holds a match waiting for this gap */
            piece(e, level, pd->s, end);
            pd->has = false;
            break;
        }
        if (pd->has) piece(e, level, pd->s, pd->e);
        pd->has = false;
        if (match) *pd = (struct pend){ s, end, true, true };
        else piece(e, level, s, end);
        break;
    }
}

static void pretok(struct enc *e, int level, size_t start, size_t end)
{
    if (e->status) return;
    if (level == e->t->n_splits) {
        bpe_piece(e, start, end);
        return;
    }
    const struct tok_split *sp   = &e->t->splits[level];
    const UChar            *str  = (const UChar *)e->text + start;
    const UChar            *stop = (const UChar *)e->text + end;
    struct pend             pd   = { 0, 0, false, false };
    size_t                  prev = start, pos = start, last_match_end = 0;
    bool                    have_last = false;
    while (pos <= end && !e->status) {
        int r = onig_search((OnigRegex)sp->regex, str, stop, (const UChar *)e->text + pos, stop, e->region,
                            ONIG_OPTION_NONE);
        if (r == ONIG_MISMATCH) break;
        if (r < 0) {
            UChar msg[ONIG_MAX_ERROR_MESSAGE_LEN];
            onig_error_code_to_str(msg, r);
            e->status = dsv4_err_set(e->err, DSV4_EUNSUPPORTED, "pre-tokenizer step %d: regex search failed: %s",
                                     level, (const char *)msg);
            return;
        }
        size_t ms = start + (size_t)e->region->beg[0], me = start + (size_t)e->region->end[0];
        /* The onig crate's find_iter: an empty match right where the previous match ended is
         * skipped by stepping one character. */
        if (ms == me && have_last && last_match_end == me) {
            if (pos >= end) break;
            size_t full;
            size_t cl = tok_utf8_prefix((const unsigned char *)e->text + pos, end - pos, &full);
            pos += cl ? cl : 1;
            continue;
        }
        pos            = me;
        have_last      = true;
        last_match_end = me;
        if (prev != ms) segment(e, level, &pd, prev, ms, sp->invert);
        segment(e, level, &pd, ms, me, !sp->invert);
        prev = me;
    }
    if (prev != end) segment(e, level, &pd, prev, end, sp->invert);
    if (pd.has) piece(e, level, pd.s, pd.e);
}

/* ------------------------------------------------------------------ added tokens */

static void added_split(struct enc *e, int pass, size_t start, size_t end);

static void gap(struct enc *e, int pass, size_t s, size_t end)
{
    if (s >= end) return;
    if (pass == 0) added_split(e, 1, s, end);
    else pretok(e, 0, s, end);
}

static void added_split(struct enc *e, int pass, size_t start, size_t end)
{
    const struct tok_trie *tr   = pass == 0 ? &e->t->trie_raw : &e->t->trie_norm;
    const unsigned char   *s    = (const unsigned char *)e->text;
    size_t                 prev = start, i = start;
    const uint8_t         *lit  = e->literal;
    if (tr->n_nodes > 1) {
        while (i < end) {
            if (!tr->first_byte[s[i]] || (lit && lit[i])) {
                i++;
                continue;
            }
            int32_t node = 0, best = -1;
            size_t  best_end = 0;
            for (size_t j = i; j < end && !(lit && lit[j]); j++) {
                int32_t c = tr->nodes[node].first_child;
                while (c >= 0 && tr->nodes[c].byte != s[j]) c = tr->nodes[c].next_sibling;
                if (c < 0) break;
                node = c;
                if (tr->nodes[c].token_id >= 0) {
                    best     = tr->nodes[c].token_id;
                    best_end = j + 1;
                }
            }
            if (best < 0) {
                i++;
                continue;
            }
            gap(e, pass, prev, i);
            emit(e, best);
            prev = i = best_end;
        }
    }
    gap(e, pass, prev, end);
}

/* ------------------------------------------------------------------ public */

int dsv4_tokenizer_encode(const dsv4_tokenizer *tok, const char *text, size_t len, unsigned flags,
                          int32_t *ids, size_t cap, size_t *n_ids, struct dsv4_err *err)
{
    return dsv4_tokenizer_encode_marked(tok, text, len, NULL, flags, ids, cap, n_ids, err);
}

int dsv4_tokenizer_encode_marked(const dsv4_tokenizer *tok, const char *text, size_t len,
                                 const uint8_t *literal, unsigned flags, int32_t *ids, size_t cap,
                                 size_t *n_ids, struct dsv4_err *err)
{
    *n_ids = 0;
    if (!text && len) return dsv4_err_set(err, DSV4_EINVAL, "encode: text is NULL");
    if (len > (size_t)INT32_MAX) return dsv4_err_set(err, DSV4_EINVAL, "encode: %zu bytes is too long", len);
    /* the marks index the bytes as given: repairing invalid UTF-8 would move them */
    if (literal && !tok_utf8_valid(text, len))
        return dsv4_err_set(err, DSV4_EINVAL, "encode: marked text is not valid UTF-8");
    struct enc e = { .t = tok, .text = text, .out = ids, .cap = ids ? cap : 0, .err = err, .literal = literal };
    char      *repaired = NULL;
    if (!tok_utf8_valid(text, len)) {
        repaired = malloc(3 * len);
        if (!repaired) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory repairing %zu bytes of text", len);
        len    = tok_utf8_repair(text, len, repaired);
        e.text = repaired;
    }
    e.region = onig_region_new();
    if (len >= CACHE_MIN_TEXT) e.cache = calloc(CACHE_SLOTS, sizeof(*e.cache));
    if (!e.region || (len >= CACHE_MIN_TEXT && !e.cache)) {
        e.status = dsv4_err_set(err, DSV4_ENOMEM, "out of memory encoding %zu bytes", len);
    } else {
        if (flags & DSV4_TOKENIZE_BOS) emit(&e, tok->bos);
        added_split(&e, 0, 0, len);
    }
    if (e.region) onig_region_free(e.region, 1);
    free(e.cache);
    free(e.sym);
    free(e.prv);
    free(e.nxt);
    free(e.heap);
    free(e.spell);
    free(repaired);
    if (e.status) return e.status;
    *n_ids = e.n;
    if (e.n > e.cap)
        return dsv4_err_set(err, DSV4_ERANGE, "encode: %zu ids do not fit in a buffer of %zu", e.n, cap);
    return DSV4_OK;
}

int dsv4_tokenizer_decode(const dsv4_tokenizer *tok, const int32_t *ids, size_t n_ids, char *out,
                          size_t cap, size_t *n_out, struct dsv4_err *err)
{
    size_t o = 0;
    *n_out   = 0;
    for (size_t i = 0; i < n_ids; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= tok->n_vocab || !tok->id_str[id])
            return dsv4_err_set(err, DSV4_ERANGE, "decode: token id %d (position %zu) is not in the vocabulary (%d ids)",
                                (int)id, i, (int)tok->n_vocab);
        size_t n = tok->dec_off[id + 1] - tok->dec_off[id];
        if (o + n <= cap) memcpy(out + o, tok->dec_blob + tok->dec_off[id], n);
        o += n;
    }
    *n_out = o;
    if (o > cap) return dsv4_err_set(err, DSV4_ERANGE, "decode: %zu bytes do not fit in a buffer of %zu", o, cap);
    return DSV4_OK;
}

int32_t dsv4_tokenizer_n_vocab(const dsv4_tokenizer *tok)
{
    return tok->n_vocab;
}

int32_t dsv4_tokenizer_bos(const dsv4_tokenizer *tok)
{
    return tok->bos;
}

int32_t dsv4_tokenizer_eos(const dsv4_tokenizer *tok)
{
    return tok->eos;
}

int dsv4_tokenizer_token_id(const dsv4_tokenizer *tok, const char *token, int32_t *id, struct dsv4_err *err)
{
    intptr_t v = token ? (intptr_t)dsv4_strmap_get(&tok->by_str, token) : 0;
    *id        = (int32_t)v - 1;
    if (!v) return dsv4_err_set(err, DSV4_EINVAL, "no token \"%s\" in the tokenizer", token ? token : "(null)");
    return DSV4_OK;
}

const char *dsv4_tokenizer_token_str(const dsv4_tokenizer *tok, int32_t id)
{
    return id >= 0 && id < tok->n_vocab ? tok->id_str[id] : NULL;
}

bool dsv4_tokenizer_is_special(const dsv4_tokenizer *tok, int32_t id)
{
    return id >= 0 && id < tok->n_vocab && (tok->id_flags[id] & TOK_ID_SPECIAL);
}

bool dsv4_tokenizer_is_added(const dsv4_tokenizer *tok, int32_t id)
{
    return id >= 0 && id < tok->n_vocab && (tok->id_flags[id] & TOK_ID_ADDED);
}

size_t dsv4_tokenizer_max_token_bytes(const dsv4_tokenizer *tok)
{
    return tok->max_token_bytes;
}
