/*
 * turns.c - keeps a conversation's next turn on the tokens its last turn ran.
 *
 * A chat client sends the whole conversation again each turn, as text. The server renders
 * and tokenizes it anew, but the tokens the model generated last turn need not be the
 * canonical tokenization of their own text, so the new prompt can differ from last turn's
 * tokens right where the answer began. Then the prefix cache misses every page from there on.
 * So the server keeps the token ids of recent finished turns (prompt + generated, the
 * sequence the KV pages were computed for). Before a chat request is submitted, its prompt is
 * compared with them by bytes. Where a stored turn's text is a prefix of the new prompt's text,
 * ending at a token boundary of both, the stored tokens stand in for that prefix. The prompt
 * means the same bytes, it now continues the exact sequence whose pages the cache holds, and
 * the model sees its own earlier tokens.
 *
 * The comparison is on the text as the client got it back: bytes the model wrote that are
 * not valid UTF-8 reach the client as U+FFFD, so they compare as U+FFFD (the stored tokens,
 * with the model's own bytes, then stand in for them). Control tokens (added tokens: turn
 * markers, </think>, DSML) compare by id, never by their text: each stands for a byte 0xFF
 * (never in repaired text) followed by its id, so a control token only matches itself.
 *
 * The store is a ring of SRV_TURNS entries, guarded by a mutex; the lookup takes the
 * longest match over all of them. Cost per request: decoding both token lists to bytes,
 * O(prompt bytes x entries), microseconds next to a prefill.
 */
#include <stdlib.h>
#include <string.h>

#include "server/server.h"

enum { SRV_TURNS = 64 };

struct turn {
    int32_t *ids;
    int      n;
    char    *bytes; /* their bytes (bytes_of), and each token's end offset */
    size_t  *ends, len;
};

struct srv_turns {
    pthread_mutex_t mu;
    struct turn     t[SRV_TURNS];
    int             next; /* ring position of the next insert */
};

struct srv_turns *srv_turns_new(void)
{
    struct srv_turns *s = calloc(1, sizeof(*s));
    if (s) pthread_mutex_init(&s->mu, NULL);
    return s;
}

void srv_turns_free(struct srv_turns *s)
{
    if (!s) return;
    for (int i = 0; i < SRV_TURNS; i++) {
        free(s->t[i].ids);
        free(s->t[i].bytes);
        free(s->t[i].ends);
    }
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* Appends run[0..n) to b as the responses carry text: each byte that starts no valid UTF-8
 * sequence becomes U+FFFD (srv_json_str). map[k] = b's length at run offset k. */
static void put_repaired(struct srv_buf *b, const char *run, size_t n, size_t *map)
{
    for (size_t k = 0; k < n;) {
        size_t q = srv_utf8_seq((const unsigned char *)run + k, n - k);
        for (size_t x = 0; x < (q ? q : 1); x++) map[k + x] = b->len + (q ? x : 0);
        if (q) srv_buf_put(b, run + k, q);
        else srv_buf_puts(b, "\xef\xbf\xbd");
        k += q ? q : 1;
    }
    map[n] = b->len;
}

/* The text of ids as a client gets it back (invalid UTF-8 repaired as in the responses;
 * control tokens as 0xFF, id, ';', which no repaired text contains) and each token's end
 * offset in it. */
static char *bytes_of(const dsv4_tokenizer *tok, const int32_t *ids, int n, size_t **ends, size_t *len)
{
    size_t         max = dsv4_tokenizer_max_token_bytes(tok) + 8;
    struct srv_buf raw = { 0 }, b = { 0 };
    size_t        *rend = malloc(sizeof(size_t) * (size_t)(n > 0 ? n : 1));
    *ends               = malloc(sizeof(size_t) * (size_t)(n > 0 ? n : 1));
    char *piece         = malloc(max);
    for (int i = 0; i < n && rend && piece && !raw.oom; i++) { /* the raw bytes of the text tokens */
        size_t k = 0;
        if (!dsv4_tokenizer_is_added(tok, ids[i]) && dsv4_tokenizer_decode(tok, &ids[i], 1, piece, max, &k, NULL))
            k = 0;
        srv_buf_put(&raw, piece, k);
        rend[i] = raw.len;
    }
    size_t *map = rend && !raw.oom ? malloc(sizeof(size_t) * (raw.len + 1)) : NULL;
    size_t  run = 0; /* raw offset where the current text run began */
    int     first = 0;  /* its first token */
    for (int i = 0; i <= n && map && *ends && !b.oom; i++) {
        bool ctl = i < n && dsv4_tokenizer_is_added(tok, ids[i]);
        if (i < n && !ctl) continue;
        size_t end = i < n ? rend[i] : raw.len; /* a control token adds no raw bytes */
        put_repaired(&b, raw.p ? raw.p + run : "", end - run, map + run);
        for (int j = first; j < i; j++) (*ends)[j] = map[rend[j]];
        if (i < n) {
            srv_buf_printf(&b, "\xff%d;", (int)ids[i]);
            (*ends)[i] = b.len;
        }
        run   = end;
        first = i + 1;
    }
    bool ok = map && *ends && piece && !b.oom && !raw.oom;
    free(map);
    free(rend);
    free(piece);
    srv_buf_free(&raw);
    if (!ok) {
        free(*ends);
        *ends = NULL;
        srv_buf_free(&b);
        return NULL;
    }
    *len = b.len;
    return b.p ? b.p : calloc(1, 1);
}

void srv_turns_put(struct srv_turns *s, const dsv4_tokenizer *tok, const int32_t *prompt, int n_prompt,
                   const int32_t *gen, int n_gen)
{
    if (!s || !tok || n_prompt + n_gen <= 0) return;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(n_prompt + n_gen));
    if (!ids) return;
    memcpy(ids, prompt, sizeof(int32_t) * (size_t)n_prompt);
    if (n_gen) memcpy(ids + n_prompt, gen, sizeof(int32_t) * (size_t)n_gen);
    size_t *ends = NULL, len = 0;
    char   *bytes = bytes_of(tok, ids, n_prompt + n_gen, &ends, &len);
    if (!bytes) {
        free(ids);
        return;
    }
    pthread_mutex_lock(&s->mu);
    struct turn *t = &s->t[s->next];
    free(t->ids);
    free(t->bytes);
    free(t->ends);
    *t      = (struct turn){ .ids = ids, .n = n_prompt + n_gen, .bytes = bytes, .ends = ends, .len = len };
    s->next = (s->next + 1) % SRV_TURNS;
    pthread_mutex_unlock(&s->mu);
}

int srv_turns_splice(struct srv_turns *s, const dsv4_tokenizer *tok, int32_t **prompt, int *n_prompt, int max_n)
{
    if (!s || !tok || *n_prompt <= 0) return 0;
    size_t *pe = NULL, pl = 0;
    char   *pb = bytes_of(tok, *prompt, *n_prompt, &pe, &pl);
    if (!pb) return 0;
    int32_t *best_ids = NULL;
    int      best_i = 0, best_j = 0; /* stored tokens [0, best_i) stand for prompt tokens [0, best_j) */
    size_t   best_bytes = 0;
    bool     same = false;         /* the best match is the prompt's own tokens: nothing to do */
    pthread_mutex_lock(&s->mu);
    for (int k = 0; k < SRV_TURNS; k++) {
        const struct turn *t = &s->t[k];
        if (!t->ids) continue;
        size_t l = 0;
        while (l < t->len && l < pl && t->bytes[l] == pb[l]) l++;
        /* the longest common token boundary within the common bytes */
        int i = t->n - 1, j = *n_prompt - 1;
        while (i >= 0 && j >= 0) {
            if (t->ends[i] > l) i--;
            else if (pe[j] > l) j--;
            else if (t->ends[i] > pe[j]) i--;
            else if (pe[j] > t->ends[i]) j--;
            else break;
        }
        /* keep one prompt token to compute, and only a splice that fits the context */
        if (i < 0 || j < 0 || j + 1 >= *n_prompt || t->ends[i] <= best_bytes || *n_prompt - (j + 1) + (i + 1) > max_n)
            continue;
        free(best_ids);
        best_ids = malloc(sizeof(int32_t) * (size_t)(i + 1));
        if (best_ids) memcpy(best_ids, t->ids, sizeof(int32_t) * (size_t)(i + 1));
        best_i     = i + 1;
        best_j     = j + 1;
        best_bytes = t->ends[i];
        same       = i == j && !memcmp(t->ids, *prompt, sizeof(int32_t) * (size_t)(i + 1));
    }
    pthread_mutex_unlock(&s->mu);
    free(pb);
    free(pe);
    if (same) {
        free(best_ids);
        return 0;
    }
    if (!best_ids) return 0;
    int      n   = *n_prompt - best_j + best_i;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    if (!ids) {
        free(best_ids);
        return 0;
    }
    memcpy(ids, best_ids, sizeof(int32_t) * (size_t)best_i);
    memcpy(ids + best_i, *prompt + best_j, sizeof(int32_t) * (size_t)(*n_prompt - best_j));
    free(best_ids);
    free(*prompt);
    *prompt   = ids;
    *n_prompt = n;
    return best_i;
}
