/*
 * safetensors.c - strict reader of safetensors files and sharded checkpoints.
 *
 * File layout: u64 little-endian header length N, N bytes of UTF-8 JSON (an object mapping
 * tensor names to {dtype, shape, data_offsets} plus an optional "__metadata__" object of
 * strings), then the data area. data_offsets are relative to the start of the data area.
 *
 * The parser trusts nothing: every length and offset is checked with overflow-safe
 * arithmetic before use, and the first problem found is reported with the byte offset where
 * it was found (the offset of the tensor's name in the header for per-tensor problems). The
 * rules match the reference implementation (huggingface/safetensors): entries must tile the
 * data area exactly, without overlaps or holes.
 */
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/io.h"

/* ------------------------------------------------------------------ dtypes */

static const struct {
    const char *name;
    size_t      size;
} dtype_info[DSV4_DTYPE_COUNT] = {
    [DSV4_DTYPE_F64] = { "F64", 8 },         [DSV4_DTYPE_F32] = { "F32", 4 },
    [DSV4_DTYPE_F16] = { "F16", 2 },         [DSV4_DTYPE_BF16] = { "BF16", 2 },
    [DSV4_DTYPE_I64] = { "I64", 8 },         [DSV4_DTYPE_I32] = { "I32", 4 },
    [DSV4_DTYPE_I16] = { "I16", 2 },         [DSV4_DTYPE_I8] = { "I8", 1 },
    [DSV4_DTYPE_U8] = { "U8", 1 },           [DSV4_DTYPE_BOOL] = { "BOOL", 1 },
    [DSV4_DTYPE_F8_E4M3] = { "F8_E4M3", 1 }, [DSV4_DTYPE_F8_E5M2] = { "F8_E5M2", 1 },
    [DSV4_DTYPE_F8_E8M0] = { "F8_E8M0", 1 },
};

size_t dsv4_dtype_size(enum dsv4_dtype t)
{
    return (unsigned)t < DSV4_DTYPE_COUNT ? dtype_info[t].size : 0;
}

const char *dsv4_dtype_name(enum dsv4_dtype t)
{
    return (unsigned)t < DSV4_DTYPE_COUNT ? dtype_info[t].name : "?";
}

bool dsv4_dtype_from_name(const char *name, enum dsv4_dtype *t)
{
    for (int i = 0; i < DSV4_DTYPE_COUNT; i++) {
        if (strcmp(name, dtype_info[i].name) == 0) {
            *t = (enum dsv4_dtype)i;
            return true;
        }
    }
    return false;
}

const char *dsv4_shape_str(int ndim, const int64_t *shape, char *buf, size_t n)
{
    size_t k = 0;
    k += (size_t)snprintf(buf + k, n - k, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
    return buf;
}

uint64_t dsv4_tensor_numel(const struct dsv4_tensor *t)
{
    uint64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (uint64_t)t->shape[i];
    return n;
}

/* ------------------------------------------------------------------ header parser */

struct parse {
    const uint8_t   *buf;
    size_t           size;
    uint64_t         hlen;   /* JSON header length */
    const char      *what;   /* file name for messages */
    struct dsv4_err *err;
};

/* Byte offset (in the file) of the first occurrence of "name" as a JSON key, for messages. */
static uint64_t key_offset(const struct parse *p, const char *name)
{
    size_t      nl = strlen(name);
    const char *h  = (const char *)p->buf + 8;
    for (uint64_t i = 0; i + nl + 2 <= p->hlen; i++) {
        if (h[i] == '"' && memcmp(h + i + 1, name, nl) == 0 && h[i + 1 + nl] == '"') return 8 + i;
    }
    return 8;
}

static int fail(struct parse *p, uint64_t off, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(struct parse *p, uint64_t off, const char *fmt, ...)
{
    char    msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return dsv4_err_set(p->err, DSV4_EFORMAT, "%s: byte %llu: %s", p->what, (unsigned long long)off,
                        msg);
}

static bool json_uint(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v)) return false;
    json_int_t i = json_integer_value(v);
    if (i < 0) return false;
    *out = (uint64_t)i;
    return true;
}

static int cmp_offset(const void *a, const void *b)
{
    const struct dsv4_tensor *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset ? 1 : (x->nbytes > y->nbytes) - (x->nbytes < y->nbytes);
}

static int parse_entry(struct parse *p, const char *name, json_t *v, struct dsv4_tensor *t,
                       uint64_t data_size)
{
    /* the byte offset of the entry (key_offset) is only searched for when reporting */
    if (!json_is_object(v)) return fail(p, key_offset(p, name), "tensor '%s': entry is not an object%s", name, "");
    const char *key;
    json_t     *val;
    json_object_foreach(v, key, val) {
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
            return fail(p, key_offset(p, name), "tensor '%s': unknown field '%s'", name, key);
    }
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
           *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd)) return fail(p, key_offset(p, name), "tensor '%s': missing or non-string dtype%s", name, "");
    if (!dsv4_dtype_from_name(json_string_value(jd), &t->dtype))
        return fail(p, key_offset(p, name), "tensor '%s': unknown dtype '%s'", name, json_string_value(jd));
    if (!json_is_array(js)) return fail(p, key_offset(p, name), "tensor '%s': missing or non-array shape%s", name, "");
    size_t nd = json_array_size(js);
    if (nd > DSV4_MAX_DIMS) return fail(p, key_offset(p, name), "tensor '%s': more than 8 dimensions%s", name, "");
    t->ndim = (int)nd;
    uint64_t numel = 1;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        if (!json_uint(json_array_get(js, i), &d) || d > (uint64_t)INT64_MAX)
            return fail(p, key_offset(p, name), "tensor '%s': shape entries must be non-negative integers%s", name, "");
        t->shape[i] = (int64_t)d;
        if (dsv4_mul_overflows(numel, d, &numel))
            return fail(p, key_offset(p, name), "tensor '%s': shape product overflows%s", name, "");
    }
    uint64_t nbytes;
    if (dsv4_mul_overflows(numel, dsv4_dtype_size(t->dtype), &nbytes))
        return fail(p, key_offset(p, name), "tensor '%s': byte size overflows%s", name, "");
    if (!json_is_array(jo) || json_array_size(jo) != 2)
        return fail(p, key_offset(p, name), "tensor '%s': data_offsets must be [begin, end]%s", name, "");
    uint64_t b, e;
    if (!json_uint(json_array_get(jo, 0), &b) || !json_uint(json_array_get(jo, 1), &e))
        return fail(p, key_offset(p, name), "tensor '%s': data_offsets must be non-negative integers%s", name, "");
    if (e < b) return fail(p, key_offset(p, name), "tensor '%s': data_offsets end before begin%s", name, "");
    if (e > data_size) {
        char extra[128];
        snprintf(extra, sizeof(extra), " (end %llu, data area %llu bytes)", (unsigned long long)e,
                 (unsigned long long)data_size);
        return fail(p, key_offset(p, name), "tensor '%s': data_offsets outside the data area%s", name, extra);
    }
    if (e - b != nbytes) {
        char extra[160];
        snprintf(extra, sizeof(extra), " (%llu bytes between offsets, shape x dtype needs %llu)",
                 (unsigned long long)(e - b), (unsigned long long)nbytes);
        return fail(p, key_offset(p, name), "tensor '%s': byte size does not match shape and dtype%s", name, extra);
    }
    t->nbytes = nbytes;
    t->offset = 8 + p->hlen + b;
    t->data   = p->buf + t->offset;
    return DSV4_OK;
}

int dsv4_st_parse(const uint8_t *buf, size_t size, const char *what, struct dsv4_arena *arena,
                  struct dsv4_tensor **tensors, size_t *n_tensors, struct dsv4_err *err)
{
    struct parse p = { buf, size, 0, what ? what : "safetensors", err };
    *tensors   = NULL;
    *n_tensors = 0;
    if (size < 8) return fail(&p, 0, "file too short for a header length (%s%s)", "need 8 bytes", "");
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    if (hlen == 0) return fail(&p, 0, "header length is zero%s%s", "", "");
    if (hlen > DSV4_ST_MAX_HEADER) return fail(&p, 0, "header length is larger than 100 MB%s%s", "", "");
    if (hlen > size - 8) {
        char extra[96];
        snprintf(extra, sizeof(extra), "%llu > %llu", (unsigned long long)hlen,
                 (unsigned long long)(size - 8));
        return fail(&p, 0, "header length runs past the end of the file (%s)%s", extra, "");
    }
    p.hlen             = hlen;
    uint64_t data_size = size - 8 - hlen;

    json_error_t je;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        return fail(&p, 8 + (uint64_t)(je.position > 0 ? je.position : 0),
                    "header is not valid JSON: %s%s", je.text, "");
    }
    int rc = DSV4_OK;
    if (!json_is_object(root)) {
        rc = fail(&p, 8, "header is not a JSON object%s%s", "", "");
        goto out;
    }
    size_t      n = 0;
    const char *key;
    json_t     *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(val)) {
                rc = fail(&p, key_offset(&p, key), "__metadata__ is not an object%s%s", "", "");
                goto out;
            }
            const char *mk;
            json_t     *mv;
            json_object_foreach(val, mk, mv) {
                if (!json_is_string(mv)) {
                    rc = fail(&p, key_offset(&p, mk), "__metadata__ value '%s' is not a string%s", mk, "");
                    goto out;
                }
            }
            continue;
        }
        if (key[0] == '\0') {
            rc = fail(&p, 8, "empty tensor name%s%s", "", "");
            goto out;
        }
        n++;
    }
    struct dsv4_tensor *ts = n ? dsv4_arena_zalloc(arena, n * sizeof(*ts), 16) : NULL;
    if (n && !ts) {
        rc = dsv4_err_set(err, DSV4_ENOMEM, "%s: out of memory for %zu tensors", p.what, n);
        goto out;
    }
    size_t i = 0;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) continue;
        rc = parse_entry(&p, key, val, &ts[i], data_size);
        if (rc) goto out;
        ts[i].name = dsv4_arena_strdup(arena, key);
        if (!ts[i].name) {
            rc = dsv4_err_set(err, DSV4_ENOMEM, "%s: out of memory", p.what);
            goto out;
        }
        i++;
    }
    /* Entries must tile the data area: sort by offset and walk. */
    struct dsv4_tensor *sorted = n ? malloc(n * sizeof(*sorted)) : NULL;
    if (n && !sorted) {
        rc = dsv4_err_set(err, DSV4_ENOMEM, "%s: out of memory", p.what);
        goto out;
    }
    if (n) memcpy(sorted, ts, n * sizeof(*sorted));
    if (n) qsort(sorted, n, sizeof(*sorted), cmp_offset);
    uint64_t expect = 8 + hlen;
    for (size_t k = 0; k < n && rc == DSV4_OK; k++) {
        if (sorted[k].offset < expect) {
            rc = fail(&p, key_offset(&p, sorted[k].name), "tensor '%s' overlaps tensor '%s'",
                      sorted[k].name, k ? sorted[k - 1].name : "?");
        } else if (sorted[k].offset > expect) {
            rc = fail(&p, key_offset(&p, sorted[k].name),
                      "hole in the data area before tensor '%s'%s", sorted[k].name, "");
        }
        expect = sorted[k].offset + sorted[k].nbytes;
    }
    if (rc == DSV4_OK && expect != size)
        rc = fail(&p, expect, "%s trailing bytes after the last tensor%s",
                  "unindexed", "");
    free(sorted);
    if (rc == DSV4_OK) {
        *tensors   = ts;
        *n_tensors = n;
    }
out:
    json_decref(root);
    return rc;
}

bool dsv4_st_metadata(const uint8_t *buf, size_t size, const char *key, char *out, size_t cap)
{
    if (size < 8) return false;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    if (hlen == 0 || hlen > size - 8) return false;
    json_error_t je;
    json_t      *root = json_loadb((const char *)buf + 8, (size_t)hlen, 0, &je);
    bool         ok   = false;
    json_t      *v    = json_object_get(json_object_get(root, "__metadata__"), key);
    if (json_is_string(v) && strlen(json_string_value(v)) < cap) {
        strcpy(out, json_string_value(v));
        ok = true;
    }
    json_decref(root);
    return ok;
}

/* ------------------------------------------------------------------ checkpoints */

static bool is_plain_file_name(const char *s)
{
    return s[0] && s[0] != '.' && !strchr(s, '/') && strlen(s) < 256;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static bool has_suffix(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* Lists the shard names: from the index, model.safetensors, or *.safetensors in dir. */
static int list_shards(struct dsv4_checkpoint *ck, json_t **index_map, struct dsv4_err *err)
{
    *index_map = NULL;
    char *ipath = dsv4_path_join(ck->dir, "model.safetensors.index.json");
    if (!ipath) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    if (dsv4_path_exists(ipath)) {
        json_error_t je;
        json_t      *root = json_load_file(ipath, JSON_REJECT_DUPLICATES, &je);
        if (!root) {
            int rc = dsv4_err_set(err, DSV4_EFORMAT, "%s: byte %d: not valid JSON: %s", ipath,
                                  je.position, je.text);
            free(ipath);
            return rc;
        }
        json_t *wm = json_object_get(root, "weight_map");
        if (!json_is_object(wm) || json_object_size(wm) == 0) {
            json_decref(root);
            int rc = dsv4_err_set(err, DSV4_EFORMAT, "%s: missing or empty \"weight_map\" object", ipath);
            free(ipath);
            return rc;
        }
        const char *k;
        json_t     *v;
        size_t      cap = 8;
        ck->file_names  = dsv4_arena_alloc(&ck->arena, cap * sizeof(char *), 8);
        json_object_foreach(wm, k, v) {
            if (!json_is_string(v) || !is_plain_file_name(json_string_value(v))) {
                int rc = dsv4_err_set(err, DSV4_EFORMAT,
                                      "%s: weight_map entry '%s' must name a file in the same directory",
                                      ipath, k);
                json_decref(root);
                free(ipath);
                return rc;
            }
            const char *fn   = json_string_value(v);
            bool        seen = false;
            for (int i = 0; i < ck->n_files && !seen; i++) seen = !strcmp(ck->file_names[i], fn);
            if (seen) continue;
            if ((size_t)ck->n_files == cap) {
                char **nf = dsv4_arena_alloc(&ck->arena, cap * 2 * sizeof(char *), 8);
                if (!nf) break;
                memcpy(nf, ck->file_names, cap * sizeof(char *));
                ck->file_names = nf;
                cap *= 2;
            }
            ck->file_names[ck->n_files++] = dsv4_arena_strdup(&ck->arena, fn);
        }
        qsort(ck->file_names, (size_t)ck->n_files, sizeof(char *), cmp_str);
        *index_map = json_incref(wm);
        json_decref(root);
        free(ipath);
        return DSV4_OK;
    }
    free(ipath);
    char *single = dsv4_path_join(ck->dir, "model.safetensors");
    if (!single) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    bool has_single = dsv4_path_exists(single);
    free(single);
    if (has_single) {
        ck->file_names    = dsv4_arena_alloc(&ck->arena, sizeof(char *), 8);
        ck->file_names[0] = dsv4_arena_strdup(&ck->arena, "model.safetensors");
        ck->n_files       = 1;
        return DSV4_OK;
    }
    DIR *d = opendir(ck->dir);
    if (!d) return dsv4_err_set(err, DSV4_EIO, "cannot open directory %s: %s", ck->dir, strerror(errno));
    size_t         cap = 8;
    struct dirent *de;
    ck->file_names = dsv4_arena_alloc(&ck->arena, cap * sizeof(char *), 8);
    while ((de = readdir(d)) != NULL) {
        if (!has_suffix(de->d_name, ".safetensors") || de->d_name[0] == '.') continue;
        if ((size_t)ck->n_files == cap) {
            char **nf = dsv4_arena_alloc(&ck->arena, cap * 2 * sizeof(char *), 8);
            if (!nf) break;
            memcpy(nf, ck->file_names, cap * sizeof(char *));
            ck->file_names = nf;
            cap *= 2;
        }
        ck->file_names[ck->n_files++] = dsv4_arena_strdup(&ck->arena, de->d_name);
    }
    closedir(d);
    if (ck->n_files == 0)
        return dsv4_err_set(err, DSV4_EIO, "%s holds no .safetensors file (and no model.safetensors.index.json)",
                            ck->dir);
    qsort(ck->file_names, (size_t)ck->n_files, sizeof(char *), cmp_str);
    return DSV4_OK;
}

static bool is_refused_file(const struct dsv4_checkpoint *ck, const char *file)
{
    for (int r = 0; r < ck->n_refused; r++)
        if (strcmp(ck->file_names[ck->refused[r].file], file) == 0) return true;
    return false;
}

static int check_index(struct dsv4_checkpoint *ck, json_t *wm, struct dsv4_err *err)
{
    const char *k;
    json_t     *v;
    json_object_foreach(wm, k, v) {
        if (ck->n_refused && is_refused_file(ck, json_string_value(v))) continue;
        const struct dsv4_tensor *t = dsv4_checkpoint_find(ck, k);
        if (!t)
            return dsv4_err_set(err, DSV4_EFORMAT,
                                "tensor '%s' is listed in model.safetensors.index.json for %s but is not in that file",
                                k, json_string_value(v));
        if (strcmp(ck->file_names[t->file], json_string_value(v)) != 0)
            return dsv4_err_set(err, DSV4_EFORMAT,
                                "tensor '%s' is listed in model.safetensors.index.json for %s but is in %s",
                                k, json_string_value(v), ck->file_names[t->file]);
    }
    for (size_t i = 0; i < ck->n_tensors; i++) {
        if (!json_object_get(wm, ck->tensors[i].name))
            return dsv4_err_set(err, DSV4_EFORMAT,
                                "tensor '%s' in %s is missing from model.safetensors.index.json",
                                ck->tensors[i].name, ck->file_names[ck->tensors[i].file]);
    }
    return DSV4_OK;
}

/* ------------------------------------------------------------------ refused shards */

/* The tensor names of a refused shard: from the index when there is one, else from its
 * header if that still parses as JSON (a truncated data area or a hole leaves it intact). */
static size_t refused_names(struct dsv4_checkpoint *ck, int file, json_t *wm, const char ***out)
{
    json_t *root = NULL, *src = NULL;
    if (wm) {
        src = wm;
    } else if (ck->files[file].data && ck->files[file].size >= 8) {
        const uint8_t *buf  = ck->files[file].data;
        uint64_t       hlen = 0;
        for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
        if (hlen <= ck->files[file].size - 8 && hlen <= DSV4_ST_MAX_HEADER)
            root = json_loadb((const char *)buf + 8, (size_t)hlen, 0, NULL);
        src = json_is_object(root) ? root : NULL;
    }
    size_t       n = 0, cap = src ? json_object_size(src) : 0;
    const char **names = cap ? dsv4_arena_alloc(&ck->arena, cap * sizeof(char *), 8) : NULL;
    const char  *k;
    json_t      *v;
    if (names) {
        json_object_foreach(src, k, v) {
            if (!strcmp(k, "__metadata__") || !strncmp(k, DSV4_ST_PAD_PREFIX, strlen(DSV4_ST_PAD_PREFIX))) continue;
            if (wm && strcmp(json_string_value(v), ck->file_names[file]) != 0) continue;
            const char *dup = dsv4_arena_strdup(&ck->arena, k);
            if (dup) names[n++] = dup;
        }
    }
    json_decref(root);
    *out = names;
    return n;
}

static int refuse_shard(struct dsv4_checkpoint *ck, int file, json_t *wm, const struct dsv4_err *why)
{
    struct dsv4_shard_refusal *r = &ck->refused[ck->n_refused++];
    r->file                      = file;
    r->code                      = why ? why->code : DSV4_EFORMAT;
    snprintf(r->msg, sizeof(r->msg), "%s", why ? why->msg : "refused");
    r->n_names = refused_names(ck, file, wm, &r->names);
    for (size_t i = 0; i < r->n_names; i++) {
        void *old = NULL;
        if (dsv4_strmap_put(&ck->refused_by_name, r->names[i], r, &old)) return DSV4_ENOMEM;
    }
    return DSV4_OK;
}

const struct dsv4_shard_refusal *dsv4_checkpoint_refusal_of(const struct dsv4_checkpoint *ck, const char *name)
{
    return ck->n_refused ? dsv4_strmap_get(&ck->refused_by_name, name) : NULL;
}

/* ------------------------------------------------------------------ checkpoints */

static int checkpoint_open(struct dsv4_checkpoint *ck, const char *path, bool lenient, struct dsv4_err *err);

int dsv4_checkpoint_open(struct dsv4_checkpoint *ck, const char *path, struct dsv4_err *err)
{
    return checkpoint_open(ck, path, false, err);
}

int dsv4_checkpoint_open_lenient(struct dsv4_checkpoint *ck, const char *path, struct dsv4_err *err)
{
    return checkpoint_open(ck, path, true, err);
}

static int checkpoint_open(struct dsv4_checkpoint *ck, const char *path, bool lenient, struct dsv4_err *err)
{
    memset(ck, 0, sizeof(*ck));
    dsv4_arena_init(&ck->arena, 1 << 20);
    json_t *wm = NULL;
    int     rc;
    struct stat st;
    if (stat(path, &st) != 0) {
        rc = dsv4_err_set(err, DSV4_EIO, "cannot open %s: %s", path, strerror(errno));
        goto fail;
    }
    if (S_ISDIR(st.st_mode)) {
        ck->dir = dsv4_arena_strdup(&ck->arena, path);
        rc      = list_shards(ck, &wm, err);
        if (rc) goto fail;
    } else {
        const char *slash = strrchr(path, '/');
        char        dir[4096];
        if (slash) {
            size_t n = (size_t)(slash - path);
            if (n >= sizeof(dir)) n = sizeof(dir) - 1;
            memcpy(dir, path, n);
            dir[n] = '\0';
        } else {
            strcpy(dir, ".");
        }
        ck->dir           = dsv4_arena_strdup(&ck->arena, dir);
        ck->file_names    = dsv4_arena_alloc(&ck->arena, sizeof(char *), 8);
        ck->file_names[0] = dsv4_arena_strdup(&ck->arena, slash ? slash + 1 : path);
        ck->n_files       = 1;
    }
    ck->files = calloc((size_t)ck->n_files, sizeof(*ck->files));
    struct dsv4_tensor **per_file = calloc((size_t)ck->n_files, sizeof(*per_file));
    size_t              *per_n    = calloc((size_t)ck->n_files, sizeof(*per_n));
    if (lenient) {
        ck->refused = dsv4_arena_zalloc(&ck->arena, (size_t)ck->n_files * sizeof(*ck->refused), 8);
        if (!ck->refused || dsv4_strmap_init(&ck->refused_by_name, 64)) {
            free(per_file);
            free(per_n);
            rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
            goto fail;
        }
    }
    if (!ck->files || !per_file || !per_n) {
        free(per_file);
        free(per_n);
        rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
        goto fail;
    }
    size_t total = 0;
    rc           = DSV4_OK;
    for (int i = 0; i < ck->n_files && rc == DSV4_OK; i++) {
        char *fp = dsv4_path_join(ck->dir, ck->file_names[i]);
        if (!fp) {
            rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
            break;
        }
        rc = dsv4_file_map(&ck->files[i], fp, err);
        if (rc == DSV4_OK)
            rc = dsv4_st_parse(ck->files[i].data, ck->files[i].size, fp, &ck->arena, &per_file[i],
                               &per_n[i], err);
        else if (wm)
            dsv4_err_set(err, rc, "shard %s listed in model.safetensors.index.json cannot be opened: %s",
                         fp, err ? err->msg : "");
        free(fp);
        if (rc != DSV4_OK && rc != DSV4_ENOMEM && lenient) {
            per_n[i] = 0;
            rc       = refuse_shard(ck, i, wm, err);
            if (rc) dsv4_err_set(err, rc, "out of memory");
        }
        total += per_n[i];
    }
    if (rc == DSV4_OK) {
        ck->tensors = total ? dsv4_arena_alloc(&ck->arena, total * sizeof(*ck->tensors), 16) : NULL;
        rc          = dsv4_strmap_init(&ck->by_name, total);
        if (rc || (total && !ck->tensors)) rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    }
    for (int i = 0; i < ck->n_files && rc == DSV4_OK; i++) {
        for (size_t k = 0; k < per_n[i] && rc == DSV4_OK; k++) {
            struct dsv4_tensor *t = &ck->tensors[ck->n_tensors++];
            *t                    = per_file[i][k];
            t->file               = i;
            void *old             = NULL;
            rc                    = dsv4_strmap_put(&ck->by_name, t->name, t, &old);
            if (rc == DSV4_OK && old) {
                const struct dsv4_tensor *o = old;
                rc = dsv4_err_set(err, DSV4_EFORMAT, "tensor '%s' appears in both %s and %s", t->name,
                                  ck->file_names[o->file], ck->file_names[i]);
            }
        }
    }
    free(per_file);
    free(per_n);
    if (rc == DSV4_OK && wm) rc = check_index(ck, wm, err);
    if (rc) goto fail;
    json_decref(wm);
    return DSV4_OK;
fail:
    json_decref(wm);
    dsv4_checkpoint_close(ck);
    return rc;
}

void dsv4_checkpoint_close(struct dsv4_checkpoint *ck)
{
    if (ck->files)
        for (int i = 0; i < ck->n_files; i++) dsv4_file_unmap(&ck->files[i]);
    free(ck->files);
    dsv4_strmap_free(&ck->by_name);
    if (ck->refused) dsv4_strmap_free(&ck->refused_by_name);
    dsv4_arena_free(&ck->arena);
    memset(ck, 0, sizeof(*ck));
}

const struct dsv4_tensor *dsv4_checkpoint_find(const struct dsv4_checkpoint *ck, const char *name)
{
    return dsv4_strmap_get(&ck->by_name, name);
}
