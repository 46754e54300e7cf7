/*
 * engram_map.c - engram_token_map.json into a token id -> compressed id table, and the choice
 * between that file and the tokenizer (engram_map_tok.c) for a checkpoint (engram_map.h).
 *
 * Every way the file can be wrong is an error naming the file and the element: the map decides
 * every Engram row a token reads, and a map from another tokenizer revision would hash
 * silently into the wrong rows (docs/ENGRAM.md).
 */
#include "model/engram_map.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "io/io.h"

enum {
    MAP_MAX_BYTES = 64 << 20, /* ~8 bytes per token id: room for vocabularies of millions */
};

/* Fills map[0..n) from the array's elements; the largest id into *top. */
static int read_ids(json_t *arr, const char *path, int64_t compressed_vocab, int32_t *map,
                    int64_t *top, struct dsv4_err *err)
{
    size_t  i;
    json_t *v;
    *top = -1;
    json_array_foreach(arr, i, v) {
        if (!json_is_integer(v))
            return dsv4_err_set(err, DSV4_EFORMAT, "%s: element %zu is not an integer", path, i);
        json_int_t id = json_integer_value(v);
        if (id < 0 || id >= compressed_vocab)
            return dsv4_err_set(err, DSV4_EFORMAT, "%s: element %zu is %lld, not a compressed id "
                                "(0 to %lld)", path, i, (long long)id,
                                (long long)compressed_vocab - 1);
        map[i] = (int32_t)id;
        if (id > *top) *top = id;
    }
    return 0;
}

static int check_array(json_t *root, const char *path, int64_t n_vocab, struct dsv4_err *err)
{
    if (!json_is_array(root))
        return dsv4_err_set(err, DSV4_EFORMAT, "%s: not a JSON array of compressed ids", path);
    int64_t n = (int64_t)json_array_size(root);
    if (n == 0) return dsv4_err_set(err, DSV4_EFORMAT, "%s: empty token map", path);
    if (n_vocab > 0 && n != n_vocab)
        return dsv4_err_set(err, DSV4_EFORMAT, "%s: %lld entries, the vocabulary has %lld token "
                            "ids", path, (long long)n, (long long)n_vocab);
    return 0;
}

int dsv4_engram_map_parse(const char *text, const char *path, int64_t n_vocab,
                          int64_t compressed_vocab, int32_t **map, int64_t *n,
                          struct dsv4_err *err)
{
    *map = NULL;
    *n   = 0;
    if (compressed_vocab < 1 || compressed_vocab > INT32_MAX)
        return dsv4_err_set(err, DSV4_EINVAL, "%s: compressed vocab size %lld out of range", path,
                            (long long)compressed_vocab);
    json_error_t je;
    json_t      *root = json_loads(text, 0, &je);
    if (!root)
        return dsv4_err_set(err, DSV4_EFORMAT, "%s: line %d: not valid JSON: %s", path, je.line,
                            je.text);
    int rc = check_array(root, path, n_vocab, err);
    if (rc) {
        json_decref(root);
        return rc;
    }
    size_t   count = json_array_size(root);
    int32_t *m     = malloc(count * sizeof(*m));
    int64_t  top   = -1;
    if (!m) rc = dsv4_err_set(err, DSV4_ENOMEM, "%s: out of memory", path);
    if (!rc) rc = read_ids(root, path, compressed_vocab, m, &top, err);
    if (!rc && top + 1 != compressed_vocab)
        rc = dsv4_err_set(err, DSV4_EFORMAT, "%s: the largest compressed id is %lld, the config's "
                          "engram_compressed_vocab_size is %lld (a map of another tokenizer?)",
                          path, (long long)top, (long long)compressed_vocab);
    json_decref(root);
    if (rc) {
        free(m);
        return rc;
    }
    *map = m;
    *n   = (int64_t)count;
    return 0;
}

int dsv4_engram_map_load(const char *path, int64_t n_vocab, int64_t compressed_vocab,
                         int32_t **map, int64_t *n, struct dsv4_err *err)
{
    char  *text = NULL;
    size_t len  = 0;
    *map = NULL;
    *n   = 0;
    int rc = dsv4_read_file(path, &text, &len, MAP_MAX_BYTES, err);
    if (rc) return rc;
    rc = dsv4_engram_map_parse(text, path, n_vocab, compressed_vocab, map, n, err);
    free(text);
    return rc;
}

const char *dsv4_engram_map_source_name(enum dsv4_engram_map_source source)
{
    return source == DSV4_ENGRAM_MAP_SOURCE_FILE ? "engram_token_map.json" : "tokenizer.json";
}

/* The map computed from path (a tokenizer.json), with the checks of the file's map. */
static int from_tokenizer_file(const char *path, int64_t n_vocab, int64_t compressed_vocab,
                               int32_t **map, int64_t *n, struct dsv4_err *err)
{
    dsv4_tokenizer *tok = NULL;
    int             rc  = dsv4_tokenizer_load(&tok, path, err);
    if (rc) return rc;
    rc = dsv4_engram_map_from_tokenizer(tok, compressed_vocab, map, n, err);
    dsv4_tokenizer_free(tok);
    if (rc && err) { /* name the file the tokenizer came from */
        char msg[sizeof(err->msg)];
        memcpy(msg, err->msg, sizeof(msg));
        dsv4_err_set(err, rc, "%s: %s", path, msg);
    }
    if (rc == 0 && n_vocab > 0 && *n != n_vocab) {
        rc = dsv4_err_set(err, DSV4_EFORMAT, "%s: %lld token ids, the vocabulary has %lld", path,
                          (long long)*n, (long long)n_vocab);
        free(*map);
        *map = NULL;
        *n   = 0;
    }
    return rc;
}

int dsv4_engram_map_open(const char *dir, int64_t n_vocab, int64_t compressed_vocab, int32_t **map,
                         int64_t *n, enum dsv4_engram_map_source *source, struct dsv4_err *err)
{
    *map      = NULL;
    *n        = 0;
    char *file = dsv4_path_join(dir, "engram_token_map.json");
    char *tok  = dsv4_path_join(dir, "tokenizer.json");
    int   rc;
    if (!file || !tok) {
        rc = dsv4_err_set(err, DSV4_ENOMEM, "%s: out of memory", dir);
    } else if (access(file, F_OK) == 0) {
        *source = DSV4_ENGRAM_MAP_SOURCE_FILE;
        rc      = dsv4_engram_map_load(file, n_vocab, compressed_vocab, map, n, err);
    } else if (access(tok, F_OK) == 0) {
        *source = DSV4_ENGRAM_MAP_SOURCE_TOKENIZER;
        rc      = from_tokenizer_file(tok, n_vocab, compressed_vocab, map, n, err);
    } else {
        rc = dsv4_err_set(err, DSV4_EIO, "%s: no engram_token_map.json and no tokenizer.json: the "
                          "Engram token map needs one of them", dir);
    }
    free(file);
    free(tok);
    return rc;
}
