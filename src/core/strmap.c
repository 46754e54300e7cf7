/*
 * strmap.c - open-addressing hash map from C strings to pointers (linear probing).
 * Keys are not copied: they must outlive the map (they live in an arena or a mapped file).
 */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

uint64_t dsv4_hash_bytes(const void *p, size_t n, uint64_t seed)
{
    /* FNV-1a, then a final avalanche so that low bits are usable as a table index. */
    const unsigned char *s = p;
    uint64_t             h = 0xcbf29ce484222325ull ^ seed;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 0x100000001b3ull;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

int dsv4_strmap_init(struct dsv4_strmap *m, size_t expected)
{
    size_t cap = 16;
    while (cap < expected * 2 + 1) cap *= 2;
    m->keys = calloc(cap, sizeof(*m->keys));
    m->vals = calloc(cap, sizeof(*m->vals));
    m->cap  = cap;
    m->len  = 0;
    if (!m->keys || !m->vals) {
        dsv4_strmap_free(m);
        return DSV4_ENOMEM;
    }
    return DSV4_OK;
}

void dsv4_strmap_free(struct dsv4_strmap *m)
{
    free(m->keys);
    free(m->vals);
    m->keys = NULL;
    m->vals = NULL;
    m->cap = m->len = 0;
}

static size_t find_slot(const struct dsv4_strmap *m, const char *key)
{
    size_t i = (size_t)dsv4_hash_bytes(key, strlen(key), 0) & (m->cap - 1);
    while (m->keys[i] && strcmp(m->keys[i], key) != 0) i = (i + 1) & (m->cap - 1);
    return i;
}

static int grow(struct dsv4_strmap *m)
{
    struct dsv4_strmap n;
    int                rc = dsv4_strmap_init(&n, m->cap);
    if (rc) return rc;
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->keys[i]) continue;
        size_t j  = find_slot(&n, m->keys[i]);
        n.keys[j] = m->keys[i];
        n.vals[j] = m->vals[i];
        n.len++;
    }
    dsv4_strmap_free(m);
    *m = n;
    return DSV4_OK;
}

int dsv4_strmap_put(struct dsv4_strmap *m, const char *key, void *val, void **old)
{
    if (old) *old = NULL;
    if ((m->len + 1) * 2 > m->cap) {
        int rc = grow(m);
        if (rc) return rc;
    }
    size_t i = find_slot(m, key);
    if (m->keys[i]) {
        if (old) *old = m->vals[i];
    } else {
        m->keys[i] = key;
        m->len++;
    }
    m->vals[i] = val;
    return DSV4_OK;
}

void *dsv4_strmap_get(const struct dsv4_strmap *m, const char *key)
{
    if (!m->cap) return NULL;
    size_t i = find_slot(m, key);
    return m->keys[i] ? m->vals[i] : NULL;
}
