/*
 * tokenizer_load.c - reads a Hugging Face tokenizer.json into a struct dsv4_tokenizer.
 *
 * Supported (everything DeepSeek's byte-level BPE files use, plus the small generalisations
 * that cost nothing): model BPE with vocab and merges (legacy "a b" strings or [a, b]
 * pairs), ignore_merges; normalizer null or an empty Sequence; pre_tokenizer ByteLevel
 * alone or a Sequence of Split steps (Regex or String pattern, all five behaviours, invert)
 * ending in ByteLevel (use_regex adds GPT-2's split); post_processor null or ByteLevel;
 * decoder ByteLevel; added tokens, special or not, normalized or not.
 *
 * Anything else is refused with DSV4_EUNSUPPORTED and a sentence naming the field, never
 * approximated: a tokenizer that splits one string differently from the reference silently
 * degrades every answer. Structural problems (wrong types, merges of unknown tokens, a
 * regex Oniguruma rejects) are DSV4_EFORMAT with the JSON path of the culprit.
 *
 * Every table is allocated in the tokenizer's arena, so freeing is one call. The jansson
 * document only lives during the load.
 */
#include <oniguruma.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/io.h"
#include "tok/tok.h"

/* ------------------------------------------------------------------ byte-level alphabet */

/*
 * GPT-2's reversible byte -> code point map: printable Latin-1 bytes (33..126, 161..172,
 * 174..255) stand for themselves; the 68 others take U+0100.. in byte order.
 */
static bool byte_is_printable(unsigned b)
{
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
}

uint32_t tok_byte_to_cp(uint8_t b)
{
    if (byte_is_printable(b)) return b;
    if (b <= 32) return 256u + b;
    if (b <= 160) return 256u + 33u + (b - 127u);
    return 256u + 67u; /* 173, the soft hyphen */
}

int tok_cp_to_byte(uint32_t cp)
{
    if (cp < 256) return byte_is_printable(cp) ? (int)cp : -1;
    if (cp < 256 + 33) return (int)(cp - 256);
    if (cp < 256 + 67) return (int)(cp - 256 - 33 + 127);
    if (cp == 256 + 67) return 173;
    return -1;
}

/* ------------------------------------------------------------------ regexes */

static pthread_once_t onig_once = PTHREAD_ONCE_INIT;

static void onig_init_once(void)
{
    OnigEncoding enc[1] = { ONIG_ENCODING_UTF8 };
    onig_initialize(enc, 1);
}

int tok_regex_compile(void **out, const char *pattern, size_t len, bool literal, const char *where,
                      struct dsv4_err *err)
{
    pthread_once(&onig_once, onig_init_once);
    *out = NULL;
    /* A String pattern matches itself: escape Oniguruma's metacharacters, as the reference
     * does with regex::escape before compiling. */
    char *esc = NULL;
    if (literal) {
        esc = malloc(2 * len + 1);
        if (!esc) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory compiling %s", where);
        size_t o = 0;
        for (size_t i = 0; i < len; i++) {
            if (pattern[i] != '\0' && strchr("\\.+*?()|[]{}^$-#&~", pattern[i])) esc[o++] = '\\';
            esc[o++] = pattern[i];
        }
        pattern = esc;
        len     = o;
    }
    OnigRegex      reg;
    OnigErrorInfo  einfo;
    const UChar   *p  = (const UChar *)pattern;
    int            rc = onig_new(&reg, p, p + len, ONIG_OPTION_NONE, ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT,
                                 &einfo);
    free(esc);
    if (rc != ONIG_NORMAL) {
        UChar msg[ONIG_MAX_ERROR_MESSAGE_LEN];
        onig_error_code_to_str(msg, rc, &einfo);
        return dsv4_err_set(err, DSV4_EFORMAT, "%s: Oniguruma rejects the regex: %s", where, (const char *)msg);
    }
    *out = reg;
    return DSV4_OK;
}

void tok_regex_free(void *regex)
{
    if (regex) onig_free((OnigRegex)regex);
}

/* ------------------------------------------------------------------ field helpers */

/* The load context: the document name for messages and the tokenizer under construction. */
struct loader {
    const char            *name;
    struct dsv4_tokenizer *t;
    struct dsv4_err       *err;
};

static const char *type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* A missing or null member reads as absent. */
static const json_t *member(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    return v && !json_is_null(v) ? v : NULL;
}

static int get_bool(struct loader *L, const json_t *obj, const char *path, const char *key, bool dflt,
                    bool *out)
{
    const json_t *v = member(obj, key);
    *out            = dflt;
    if (!v) return DSV4_OK;
    if (!json_is_boolean(v))
        return dsv4_err_set(L->err, DSV4_EFORMAT, "%s: %s.%s must be true or false, not %s", L->name, path, key,
                            type_name(v));
    *out = json_is_true(v);
    return DSV4_OK;
}

/* A member that must be a string (or absent when dflt is given). */
static int get_str(struct loader *L, const json_t *obj, const char *path, const char *key, const char **out)
{
    const json_t *v = member(obj, key);
    *out            = NULL;
    if (!v) return DSV4_OK;
    if (!json_is_string(v))
        return dsv4_err_set(L->err, DSV4_EFORMAT, "%s: %s.%s must be a string, not %s", L->name, path, key,
                            type_name(v));
    *out = json_string_value(v);
    return DSV4_OK;
}

static int require_type(struct loader *L, const json_t *obj, const char *path, const char **type)
{
    if (!json_is_object(obj))
        return dsv4_err_set(L->err, DSV4_EFORMAT, "%s: %s must be an object, not %s", L->name, path,
                            type_name(obj));
    int rc = get_str(L, obj, path, "type", type);
    if (rc) return rc;
    if (!*type) return dsv4_err_set(L->err, DSV4_EFORMAT, "%s: %s has no \"type\"", L->name, path);
    return DSV4_OK;
}

/* ------------------------------------------------------------------ vocabulary */

static int put_map(struct loader *L, struct dsv4_strmap *m, const char *key, int32_t id)
{
    if (dsv4_strmap_put(m, key, (void *)(intptr_t)(id + 1), NULL))
        return dsv4_err_set(L->err, DSV4_ENOMEM, "%s: out of memory building the token map", L->name);
    return DSV4_OK;
}

static int32_t map_get(const struct dsv4_strmap *m, const char *key)
{
    return (int32_t)(intptr_t)dsv4_strmap_get(m, key) - 1;
}

/* One past the largest token id accepted. The tables are indexed by id (n_vocab = largest
 * id + 1), so the largest id sizes the load: without a bound, a 100-byte document with one
 * id near INT32_MAX made the loader allocate and clear gigabytes (found by
 * tests/fuzz/fuzz_tokenizer.c). 1 << 22 is the largest vocab_size config.c accepts, so no
 * model could use a higher id anyway; DeepSeek's own vocabulary has 129280. */
#define TOK_ID_LIMIT (1 << 22)

/* Finds the largest id of model.vocab and added_tokens and checks their shapes. */
static int scan_ids(struct loader *L, const json_t *vocab, const json_t *added, int64_t *max_id)
{
    const char *key;
    json_t     *v;
    *max_id = -1;
    json_object_foreach((json_t *)vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= TOK_ID_LIMIT)
            return dsv4_err_set(L->err, DSV4_EFORMAT, "%s: model.vocab[\"%s\"] must be a token id, not %s",
                                L->name, key, json_is_integer(v) ? "a negative or huge integer" : type_name(v));
        if (key[0] == '\0') return dsv4_err_set(L->err, DSV4_EFORMAT, "%s: model.vocab has an empty token", L->name);
        if (json_integer_value(v) > *max_id) *max_id = json_integer_value(v);
    }
    size_t i;
    json_array_foreach(added, i, v) {
        const json_t *id = json_object_get(v, "id");
        if (!json_is_object(v) || !json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= TOK_ID_LIMIT)
            return dsv4_err_set(L->err, DSV4_EFORMAT, "%s: added_tokens[%zu] needs an \"id\" that is a token id",
                                L->name, i);
        if (json_integer_value(id) > *max_id) *max_id = json_integer_value(id);
    }
    if (*max_id < 0) return dsv4_err_set(L->err, DSV4_EFORMAT, "%s: model.vocab is empty", L->name);
    return DSV4_OK;
}

static int load_vocab(struct loader *L, const json_t *vocab)
{
    struct dsv4_tokenizer *t = L->t;
    const char            *key;
    json_t                *v;
    int                    rc;
    json_object_foreach((json_t *)vocab, key, v) {
        int32_t id = (int32_t)json_integer_value(v);
        if (t->id_flags[id] & TOK_ID_VOCAB)
            return dsv4_err_set(L->err, DSV4_EFORMAT, "%s: model.vocab gives id %d to both \"%s\" and \"%s\"",
                                L->name, (int)id, t->id_str[id], key);
        char *s = dsv4_arena_strdup(&t->arena, key);
        if (!s) return dsv4_err_set(L->err, DSV4_ENOMEM, "%s: out of memory", L->name);
        t->id_str[id] = s;
        t->id_flags[id] |= TOK_ID_VOCAB;
        if ((rc = put_map(L, &t->vocab_str, s, id)) || (rc = put_map(L, &t->by_str, s, id))) return rc;
    }
    /* Every byte must have its symbol: a byte-level BPE starts from single bytes, and with
     * no byte fallback a missing one could not be encoded at all. */
    for (int b = 0; b < 256; b++) {
        char   sym[5];
        size_t n = tok_utf8_encode(tok_byte_to_cp((uint8_t)b), sym);
        sym[n]   = '\0';
        int32_t id = map_get(&t->vocab_str, sym);
        if (id < 0)
            return dsv4_err_set(L->err, DSV4_EFORMAT, "%s: model.vocab lacks \"%s\", the byte-level symbol of byte 0x%02x",
                                L->name, sym, b);
        t->byte_id[b] = id;
    }
    return DSV4_OK;
}

/* ------------------------------------------------------------------ merges */

static size_t merge_slot(const struct dsv4_tokenizer *t, uint64_t pair)
{
    uint64_t h = pair * 0x9e3779b97f4a7c15ull;
    return (size_t)(h ^ (h >> 29)) & t->merge_mask;
}

static int load_merges(struct loader *L, const json_t *merges)
{
    struct dsv4_tokenizer *t = L->t;
    size_t                 n = json_array_size(merges), cap = 16;
    while (cap < 2 * n + 16) cap *= 2;
    t->merges = dsv4_arena_alloc(&t->arena, cap * sizeof(*t->merges), 8);
    if (!t->merges) return dsv4_err_set(L->err, DSV4_ENOMEM, "%s: out of memory for %zu merges", L->name, n);
    for (size_t i = 0; i < cap; i++) t->merges[i].pair = TOK_MERGE_EMPTY;
    t->merge_mask = cap - 1;

    char  *joined = NULL;
    size_t jcap   = 0;
    int    rc     = DSV4_OK;
    for (size_t i = 0; i < n && rc == DSV4_OK; i++) {
        const json_t *m = json_array_get(merges, i);
        const char   *a, *b;
        size_t        la, lb;
        if (json_is_string(m)) {
            a              = json_string_value(m);
            const char *sp = strchr(a, ' ');
            if (!sp || sp == a || sp[1] == '\0' || strchr(sp + 1, ' ')) {
                rc = dsv4_err_set(L->err, DSV4_EFORMAT,
                                  "%s: model.merges[%zu] \"%s\" is not two tokens separated by one space", L->name, i, a);
                break;
            }
            la = (size_t)(sp - a);
            b  = sp + 1;
            lb = strlen(b);
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            a  = json_string_value(json_array_get(m, 0));
            b  = json_string_value(json_array_get(m, 1));
            la = strlen(a);
            lb = strlen(b);
        } else {
            rc = dsv4_err_set(L->err, DSV4_EFORMAT, "%s: model.merges[%zu] must be a string \"a b\" or a pair [\"a\", \"b\"], not %s",
                              L->name, i, type_name(m));
            break;
        }
        if (la + lb + 2 > jcap) {
            jcap     = 2 * (la + lb + 2);
            char *nj = realloc(joined, jcap);
            if (!nj) {
                rc = dsv4_err_set(L->err, DSV4_ENOMEM, "%s: out of memory", L->name);
                break;
            }
            joined = nj;
        }
        /* The two halves, then their concatenation, must all be vocabulary tokens. */
        memcpy(joined, a, la);
        joined[la]   = '\0';
        int32_t ia   = map_get(&t->vocab_str, joined);
        memcpy(joined, b, lb);
        joined[lb]   = '\0';
        int32_t ib   = map_get(&t->vocab_str, joined);
        memcpy(joined, a, la);
        memcpy(joined + la, b, lb);
        joined[la + lb] = '\0';
        int32_t iab     = map_get(&t->vocab_str, joined);
        if (ia < 0 || ib < 0 || iab < 0) {
            const char *what = ia < 0 ? "its left token" : ib < 0 ? "its right token" : "the merged token";
            rc = dsv4_err_set(L->err, DSV4_EFORMAT, "%s: model.merges[%zu]: %s is not in model.vocab", L->name, i,
                              what);
            break;
        }
        /* A repeated pair takes the later rank, as the reference's hash map does. */
        uint64_t pair = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
        size_t   s    = merge_slot(t, pair);
        while (t->merges[s].pair != TOK_MERGE_EMPTY && t->merges[s].pair != pair) s = (s + 1) & t->merge_mask;
        t->merges[s].pair = pair;
        t->merges[s].rank = (int32_t)i;
        t->merges[s].id   = iab;
    }
    free(joined);
    return rc;
}

/* ------------------------------------------------------------------ added tokens */

static int trie_insert(struct loader *L, struct tok_trie *tr, const char *s, int32_t id, size_t *cap)
{
    int32_t node = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        int32_t c = tr->nodes[node].first_child;
        while (c >= 0 && tr->nodes[c].byte != *p) c = tr->nodes[c].next_sibling;
        if (c < 0) {
            if ((size_t)tr->n_nodes == *cap) {
                size_t                nc = *cap * 2;
                struct tok_trie_node *nn = realloc(tr->nodes, nc * sizeof(*nn));
                if (!nn) return dsv4_err_set(L->err, DSV4_ENOMEM, "%s: out of memory", L->name);
                tr->nodes = nn;
                *cap      = nc;
            }
            c                              = tr->n_nodes++;
            tr->nodes[c].byte              = *p;
            tr->nodes[c].token_id          = -1;
            tr->nodes[c].first_child       = -1;
            tr->nodes[c].next_sibling      = tr->nodes[node].first_child;
            tr->nodes[node].first_child    = c;
        }
        node = c;
    }
    if (tr->nodes[node].token_id >= 0)
        return dsv4_err_set(L->err, DSV4_EFORMAT, "%s: added_tokens lists \"%s\" twice", L->name, s);
    tr->nodes[node].token_id                    = id;
    tr->first_byte[(unsigned char)s[0]] = true;
    return DSV4_OK;
}

/* Moves a trie built with realloc into the arena. */
static int trie_seal(struct loader *L, struct tok_trie *tr)
{
    struct tok_trie_node *n = dsv4_arena_alloc(&L->t->arena, (size_t)tr->n_nodes * sizeof(*n), 8);
    if (!n) return dsv4_err_set(L->err, DSV4_ENOMEM, "%s: out of memory", L->name);
    memcpy(n, tr->nodes, (size_t)tr->n_nodes * sizeof(*n));
    free(tr->nodes);
    tr->nodes = n;
    return DSV4_OK;
}

static int load_added(struct loader *L, const json_t *added)
{
    struct dsv4_tokenizer *t = L->t;
    size_t                 cap[2] = { 64, 64 };
    struct tok_trie       *tries[2] = { &t->trie_raw, &t->trie_norm };
    int                    rc       = DSV4_OK;
    for (int k = 0; k < 2; k++) {
        tries[k]->nodes = malloc(cap[k] * sizeof(struct tok_trie_node));
        if (!tries[k]->nodes) return dsv4_err_set(L->err, DSV4_ENOMEM, "%s: out of memory", L->name);
        tries[k]->n_nodes  = 1;
        tries[k]->nodes[0] = (struct tok_trie_node){ -1, -1, -1, 0 };
    }
    size_t  i;
    json_t *a;
    json_array_foreach(added, i, a) {
        char path[48];
        snprintf(path, sizeof(path), "added_tokens[%zu]", i);
        const char *content;
        bool        special, normalized, lstrip, rstrip, single_word;
        if ((rc = get_str(L, a, path, "content", &content)) ||
            (rc = get_bool(L, a, path, "special", false, &special)) ||
            (rc = get_bool(L, a, path, "normalized", true, &normalized)) ||
            (rc = get_bool(L, a, path, "lstrip", false, &lstrip)) ||
            (rc = get_bool(L, a, path, "rstrip", false, &rstrip)) ||
            (rc = get_bool(L, a, path, "single_word", false, &single_word)))
            break;
        if (!content || !content[0]) {
            rc = dsv4_err_set(L->err, DSV4_EFORMAT, "%s: %s needs a non-empty \"content\"", L->name, path);
            break;
        }
        if (lstrip || rstrip || single_word) {
            rc = dsv4_err_set(L->err, DSV4_EUNSUPPORTED, "%s: %s (\"%s\") sets %s, which dsv4 does not support",
                              L->name, path, content, lstrip ? "lstrip" : rstrip ? "rstrip" : "single_word");
            break;
        }
        int32_t id = (int32_t)json_integer_value(json_object_get(a, "id"));
        char   *s  = dsv4_arena_strdup(&t->arena, content);
        if (!s) {
            rc = dsv4_err_set(L->err, DSV4_ENOMEM, "%s: out of memory", L->name);
            break;
        }
        if (t->id_flags[id] & TOK_ID_ADDED) {
            rc = dsv4_err_set(L->err, DSV4_EFORMAT, "%s: %s reuses id %d of \"%s\"", L->name, path, (int)id,
                              t->id_str[id]);
            break;
        }
        t->id_str[id] = s;
        t->id_flags[id] |= TOK_ID_ADDED | (special ? TOK_ID_SPECIAL : 0);
        if ((rc = put_map(L, &t->by_str, s, id))) break;
        if ((rc = trie_insert(L, tries[normalized ? 1 : 0], s, id, &cap[normalized ? 1 : 0]))) break;
        t->n_added++;
    }
    for (int k = 0; k < 2; k++) {
        if (rc == DSV4_OK) {
            rc = trie_seal(L, tries[k]);
        } else {
            free(tries[k]->nodes);
            tries[k]->nodes = NULL;
        }
    }
    return rc;
}

/* ------------------------------------------------------------------ decoder table */

/* What the ByteLevel decoder makes of each token: a token whose characters all belong to the
 * byte-level alphabet becomes those bytes; any other (an added token such as "<｜User｜>")
 * stays its own UTF-8 text. */
static int build_decoder(struct loader *L)
{
    struct dsv4_tokenizer *t     = L->t;
    size_t                 total = 0;
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (t->id_str[id]) total += strlen(t->id_str[id]);
    t->dec_off  = dsv4_arena_alloc(&t->arena, ((size_t)t->n_vocab + 1) * sizeof(*t->dec_off), 8);
    t->dec_blob = dsv4_arena_alloc(&t->arena, total + 1, 1);
    if (!t->dec_off || !t->dec_blob || total > UINT32_MAX)
        return dsv4_err_set(L->err, DSV4_ENOMEM, "%s: out of memory for the decoder table", L->name);
    uint32_t o = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        t->dec_off[id] = o;
        const char *s  = t->id_str[id];
        if (!s) continue;
        size_t n = strlen(s), i = 0, k = 0;
        bool   bytes = true;
        while (i < n && bytes) {
            size_t   cl;
            uint32_t cp = tok_utf8_decode((const unsigned char *)s + i, &cl);
            int      b  = tok_cp_to_byte(cp);
            if (b < 0) bytes = false;
            else t->dec_blob[o + k++] = (char)b;
            i += cl;
        }
        if (!bytes) {
            memcpy(t->dec_blob + o, s, n);
            k = n;
        }
        o += (uint32_t)k;
        if (k > t->max_token_bytes) t->max_token_bytes = k;
    }
    t->dec_off[t->n_vocab] = o;
    return DSV4_OK;
}

/* ------------------------------------------------------------------ pipeline components */

static int check_normalizer(struct loader *L, const json_t *n)
{
    if (!n) return DSV4_OK;
    const char *type;
    int         rc = require_type(L, n, "normalizer", &type);
    if (rc) return rc;
    if (strcmp(type, "Sequence") == 0) {
        const json_t *list = json_object_get(n, "normalizers");
        if (!json_is_array(list))
            return dsv4_err_set(L->err, DSV4_EFORMAT, "%s: normalizer.normalizers must be an array", L->name);
        if (json_array_size(list) == 0) return DSV4_OK;
        const char *inner = NULL;
        get_str(L, json_array_get(list, 0), "normalizer.normalizers[0]", "type", &inner);
        return dsv4_err_set(L->err, DSV4_EUNSUPPORTED, "%s: normalizer.normalizers[0] of type \"%s\" is not supported (only an empty normalizer is)",
                            L->name, inner ? inner : "?");
    }
    return dsv4_err_set(L->err, DSV4_EUNSUPPORTED, "%s: normalizer of type \"%s\" is not supported (only an empty normalizer is)",
                        L->name, type);
}

static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int add_split(struct loader *L, void *regex, enum tok_split_behavior behavior, bool invert)
{
    struct dsv4_tokenizer *t = L->t;
    struct tok_split      *s = realloc(t->splits, ((size_t)t->n_splits + 1) * sizeof(*s));
    if (!s) {
        tok_regex_free(regex);
        return dsv4_err_set(L->err, DSV4_ENOMEM, "%s: out of memory", L->name);
    }
    t->splits                = s;
    s[t->n_splits].regex     = regex;
    s[t->n_splits].behavior  = behavior;
    s[t->n_splits].invert    = invert;
    t->n_splits++;
    return DSV4_OK;
}

static int load_split(struct loader *L, const json_t *p, const char *path)
{
    static const char *const names[] = { "Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                         "Contiguous" };
    const char *behavior;
    bool        invert;
    int         rc;
    if ((rc = get_str(L, p, path, "behavior", &behavior)) || (rc = get_bool(L, p, path, "invert", false, &invert)))
        return rc;
    int b = -1;
    for (int i = 0; behavior && i < (int)DSV4_ARRAY_LEN(names); i++)
        if (strcmp(behavior, names[i]) == 0) b = i;
    if (!behavior) return dsv4_err_set(L->err, DSV4_EFORMAT, "%s: %s has no \"behavior\"", L->name, path);
    if (b < 0)
        return dsv4_err_set(L->err, DSV4_EUNSUPPORTED, "%s: %s.behavior \"%s\" is not supported", L->name, path,
                            behavior);
    const json_t *pat = json_object_get(p, "pattern");
    const json_t *re  = json_is_object(pat) ? json_object_get(pat, "Regex") : NULL;
    const json_t *str = json_is_object(pat) ? json_object_get(pat, "String") : NULL;
    if (!json_is_string(re) && !json_is_string(str))
        return dsv4_err_set(L->err, DSV4_EFORMAT, "%s: %s.pattern must be {\"Regex\": \"...\"} or {\"String\": \"...\"}",
                            L->name, path);
    const json_t *src = json_is_string(re) ? re : str;
    char          where[128];
    snprintf(where, sizeof(where), "%s: %s.pattern", L->name, path);
    void *regex;
    if ((rc = tok_regex_compile(&regex, json_string_value(src), json_string_length(src), src == str, where, L->err)))
        return rc;
    return add_split(L, regex, (enum tok_split_behavior)b, invert);
}

static int load_byte_level(struct loader *L, const json_t *p, const char *path)
{
    bool prefix, use_regex;
    int  rc;
    if ((rc = get_bool(L, p, path, "add_prefix_space", false, &prefix)) ||
        (rc = get_bool(L, p, path, "use_regex", true, &use_regex)))
        return rc;
    if (prefix)
        return dsv4_err_set(L->err, DSV4_EUNSUPPORTED, "%s: %s.add_prefix_space = true is not supported", L->name, path);
    if (!use_regex) return DSV4_OK;
    void *regex;
    char  where[128];
    snprintf(where, sizeof(where), "%s: %s (GPT-2 regex)", L->name, path);
    if ((rc = tok_regex_compile(&regex, GPT2_PATTERN, sizeof(GPT2_PATTERN) - 1, false, where, L->err))) return rc;
    return add_split(L, regex, TOK_SPLIT_ISOLATED, false);
}

static int load_pre_tokenizer(struct loader *L, const json_t *p)
{
    if (!p)
        return dsv4_err_set(L->err, DSV4_EUNSUPPORTED, "%s: pre_tokenizer is null; a byte-level BPE needs ByteLevel", L->name);
    const char *type;
    int         rc = require_type(L, p, "pre_tokenizer", &type);
    if (rc) return rc;
    if (strcmp(type, "ByteLevel") == 0) return load_byte_level(L, p, "pre_tokenizer");
    if (strcmp(type, "Sequence") != 0)
        return dsv4_err_set(L->err, DSV4_EUNSUPPORTED, "%s: pre_tokenizer of type \"%s\" is not supported", L->name, type);
    const json_t *list = json_object_get(p, "pretokenizers");
    if (!json_is_array(list))
        return dsv4_err_set(L->err, DSV4_EFORMAT, "%s: pre_tokenizer.pretokenizers must be an array", L->name);
    size_t n = json_array_size(list);
    for (size_t i = 0; i < n; i++) {
        char path[64];
        snprintf(path, sizeof(path), "pre_tokenizer.pretokenizers[%zu]", i);
        const json_t *step = json_array_get(list, i);
        if ((rc = require_type(L, step, path, &type))) return rc;
        if (strcmp(type, "Split") == 0) {
            if (i + 1 == n)
                return dsv4_err_set(L->err, DSV4_EUNSUPPORTED, "%s: pre_tokenizer ends with %s instead of ByteLevel",
                                    L->name, path);
            if ((rc = load_split(L, step, path))) return rc;
        } else if (strcmp(type, "ByteLevel") == 0) {
            if (i + 1 != n)
                return dsv4_err_set(L->err, DSV4_EUNSUPPORTED, "%s: %s: ByteLevel must be the last pre-tokenizer", L->name,
                                    path);
            if ((rc = load_byte_level(L, step, path))) return rc;
        } else {
            return dsv4_err_set(L->err, DSV4_EUNSUPPORTED, "%s: %s of type \"%s\" is not supported (only Split and ByteLevel are)",
                                L->name, path, type);
        }
    }
    if (n == 0)
        return dsv4_err_set(L->err, DSV4_EUNSUPPORTED, "%s: pre_tokenizer is an empty Sequence; a byte-level BPE needs ByteLevel",
                            L->name);
    return DSV4_OK;
}

static int load_model(struct loader *L, const json_t *m, const json_t **vocab, const json_t **merges)
{
    const char *type;
    int         rc;
    if (!m) return dsv4_err_set(L->err, DSV4_EFORMAT, "%s: no \"model\"", L->name);
    if ((rc = require_type(L, m, "model", &type))) return rc;
    if (strcmp(type, "BPE") != 0)
        return dsv4_err_set(L->err, DSV4_EUNSUPPORTED, "%s: model of type \"%s\" is not supported (only BPE is)", L->name, type);
    *vocab  = json_object_get(m, "vocab");
    *merges = json_object_get(m, "merges");
    if (!json_is_object(*vocab))
        return dsv4_err_set(L->err, DSV4_EFORMAT, "%s: model.vocab must be an object, not %s", L->name,
                            *vocab ? type_name(*vocab) : "missing");
    if (!json_is_array(*merges))
        return dsv4_err_set(L->err, DSV4_EFORMAT, "%s: model.merges must be an array, not %s", L->name,
                            *merges ? type_name(*merges) : "missing");
    bool byte_fallback;
    if ((rc = get_bool(L, m, "model", "byte_fallback", false, &byte_fallback)) ||
        (rc = get_bool(L, m, "model", "ignore_merges", false, &L->t->ignore_merges)))
        return rc;
    if (byte_fallback)
        return dsv4_err_set(L->err, DSV4_EUNSUPPORTED, "%s: model.byte_fallback = true is not supported", L->name);
    const json_t *dropout = member(m, "dropout");
    if (dropout && !(json_is_number(dropout) && json_number_value(dropout) == 0.0))
        return dsv4_err_set(L->err, DSV4_EUNSUPPORTED, "%s: model.dropout is set; BPE dropout is not supported", L->name);
    static const char *const affixes[] = { "continuing_subword_prefix", "end_of_word_suffix" };
    for (size_t i = 0; i < DSV4_ARRAY_LEN(affixes); i++) {
        const char *s;
        if ((rc = get_str(L, m, "model", affixes[i], &s))) return rc;
        if (s && s[0])
            return dsv4_err_set(L->err, DSV4_EUNSUPPORTED, "%s: model.%s = \"%s\" is not supported", L->name, affixes[i], s);
    }
    const char *unk;
    return get_str(L, m, "model", "unk_token", &unk);
}

static int check_simple(struct loader *L, const json_t *root, const char *key, const char *allowed)
{
    const json_t *v = member(root, key);
    if (!v) return DSV4_OK;
    const char *type;
    int         rc = require_type(L, v, key, &type);
    if (rc) return rc;
    if (allowed && strcmp(type, allowed) == 0) return DSV4_OK;
    return dsv4_err_set(L->err, DSV4_EUNSUPPORTED, "%s: %s of type \"%s\" is not supported%s%s%s", L->name, key, type,
                        allowed ? " (only " : "", allowed ? allowed : "", allowed ? " is)" : "");
}

/* ------------------------------------------------------------------ load */

static int load_root(struct loader *L, const json_t *root)
{
    struct dsv4_tokenizer *t = L->t;
    const json_t          *vocab = NULL, *merges = NULL;
    int                    rc;
    if (!json_is_object(root))
        return dsv4_err_set(L->err, DSV4_EFORMAT, "%s: the document must be a JSON object", L->name);
    if (member(root, "truncation"))
        return dsv4_err_set(L->err, DSV4_EUNSUPPORTED, "%s: truncation is set; dsv4 never truncates", L->name);
    if (member(root, "padding"))
        return dsv4_err_set(L->err, DSV4_EUNSUPPORTED, "%s: padding is set; dsv4 never pads", L->name);
    if ((rc = load_model(L, member(root, "model"), &vocab, &merges)) ||
        (rc = check_normalizer(L, member(root, "normalizer"))) ||
        (rc = check_simple(L, root, "post_processor", "ByteLevel")))
        return rc;
    const json_t *dec = member(root, "decoder");
    if (!dec)
        return dsv4_err_set(L->err, DSV4_EUNSUPPORTED, "%s: decoder is null; a byte-level BPE needs the ByteLevel decoder",
                            L->name);
    if ((rc = check_simple(L, root, "decoder", "ByteLevel"))) return rc;

    const json_t *added = member(root, "added_tokens");
    json_t       *empty = json_array();
    if (!added) added = empty;
    if (!json_is_array(added)) {
        json_decref(empty);
        return dsv4_err_set(L->err, DSV4_EFORMAT, "%s: added_tokens must be an array", L->name);
    }
    int64_t max_id;
    rc = scan_ids(L, vocab, added, &max_id);
    if (rc == DSV4_OK) {
        t->n_vocab  = (int32_t)max_id + 1;
        t->id_str   = dsv4_arena_zalloc(&t->arena, (size_t)t->n_vocab * sizeof(*t->id_str), 8);
        t->id_flags = dsv4_arena_zalloc(&t->arena, (size_t)t->n_vocab, 1);
        /* the maps hold one entry per token listed (they grow if need be), whatever the ids */
        size_t n_tokens = json_object_size(vocab) + json_array_size(added);
        if (!t->id_str || !t->id_flags || dsv4_strmap_init(&t->by_str, n_tokens) ||
            dsv4_strmap_init(&t->vocab_str, json_object_size(vocab)))
            rc = dsv4_err_set(L->err, DSV4_ENOMEM, "%s: out of memory for %d tokens", L->name, (int)t->n_vocab);
    }
    if (rc == DSV4_OK) rc = load_vocab(L, vocab);
    if (rc == DSV4_OK) rc = load_merges(L, merges);
    if (rc == DSV4_OK) rc = load_added(L, added);
    json_decref(empty);
    if (rc == DSV4_OK) rc = load_pre_tokenizer(L, member(root, "pre_tokenizer"));
    if (rc == DSV4_OK) rc = build_decoder(L);
    if (rc) return rc;
    t->bos = map_get(&t->by_str, "<｜begin▁of▁sentence｜>");
    t->eos = map_get(&t->by_str, "<｜end▁of▁sentence｜>");
    if (t->bos < 0) t->bos = 0;
    if (t->eos < 0) t->eos = 1;
    return DSV4_OK;
}

int dsv4_tokenizer_load_json(dsv4_tokenizer **out, const char *json, size_t len, const char *name,
                             struct dsv4_err *err)
{
    *out = NULL;
    struct dsv4_tokenizer *t = calloc(1, sizeof(*t));
    if (!t) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory loading %s", name);
    dsv4_arena_init(&t->arena, (size_t)1 << 20);
    struct loader L = { name, t, err };

    json_error_t jerr;
    json_t      *root = json_loadb(json ? json : "", json ? len : 0, 0, &jerr);
    int          rc;
    if (!root) {
        rc = dsv4_err_set(err, DSV4_EFORMAT, "%s: invalid JSON at line %d, column %d: %s", name, jerr.line,
                          jerr.column, jerr.text);
    } else {
        rc = load_root(&L, root);
        json_decref(root);
    }
    if (rc) {
        dsv4_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return DSV4_OK;
}

int dsv4_tokenizer_load(dsv4_tokenizer **out, const char *path, struct dsv4_err *err)
{
    *out = NULL;
    char        buf[4096];
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        if ((size_t)snprintf(buf, sizeof(buf), "%s/tokenizer.json", path) >= sizeof(buf))
            return dsv4_err_set(err, DSV4_EINVAL, "path too long: %s", path);
        path = buf;
    }
    struct dsv4_mapped_file f;
    int                     rc = dsv4_file_map(&f, path, err);
    if (rc) return rc;
    rc = dsv4_tokenizer_load_json(out, (const char *)f.data, f.size, path, err);
    dsv4_file_unmap(&f);
    return rc;
}

void dsv4_tokenizer_free(dsv4_tokenizer *t)
{
    if (!t) return;
    for (int i = 0; i < t->n_splits; i++) tok_regex_free(t->splits[i].regex);
    free(t->splits);
    dsv4_strmap_free(&t->by_str);
    dsv4_strmap_free(&t->vocab_str);
    dsv4_arena_free(&t->arena);
    free(t);
}
