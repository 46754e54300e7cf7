/*
 * cmd_convert.c - `dsv4 convert`: the dsv4-native checkpoint.
 *
 * Format (docs/FORMAT.md): a directory with config.json, the tokenizer files of the source,
 * and one model.safetensors whose header carries {"format": "dsv4-native", "version": "1"}
 * in __metadata__, whose data area starts on a 4096-byte boundary and whose every tensor
 * starts on one (gaps filled by "__pad.N" U8 tensors, so the file stays valid safetensors
 * that any reader opens). Tensors keep the release's layouts (row-major codes with block
 * scales), grouped by layer in forward order, so a decode step walks the file front to back.
 * With --tiles, every projection the backend (--backend, default the first) prepares in a
 * form of its own also gets that stored beside it, made by the backend's export_prepared
 * (backend.h; the CPU: the interleaved 16-row tiles of the AVX512-BF16 kernels, "NAME.i16",
 * U8, and "SCALE.i16" for FP4's scales; about as many bytes again), so that it loads with no
 * repacking either. Opening it is one mmap and one JSON header parse.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/backend.h"
#include "cli.h"
#include "model/model.h"

static int copy_file(const char *src, const char *dst)
{
    FILE *in = fopen(src, "rb");
    if (!in) return errno == ENOENT ? 1 : -1;
    FILE *out = fopen(dst, "wb");
    if (!out) {
        fclose(in);
        return -1;
    }
    char   buf[65536];
    size_t n;
    int    rc = 0;
    while ((n = fread(buf, 1, sizeof(buf), in)) > 0)
        if (fwrite(buf, 1, n, out) != n) rc = -1;
    if (ferror(in)) rc = -1;
    fclose(in);
    if (fclose(out) != 0) rc = -1;
    return rc;
}

/* Forward order: globals, then layers.0.., then mtp (name order within each). */
static int rank_of(const char *name)
{
    if (!strncmp(name, "layers.", 7)) return 1 + atoi(name + 7);
    if (!strncmp(name, "mtp.", 4)) return 100000;
    return 0;
}

/* One tensor of the output: a source tensor, or the part of a projection's prepared form
 * stored beside its weight (part 0) or its scale tensor (part 1), made when written. */
struct out_tensor {
    char                            name[300];
    const struct dsv4_tensor       *src;
    const struct dsv4_linear       *lin;
    const struct dsv4_backend_kind *kind; /* whose prepared form */
    int                             part;
    uint64_t                        nbytes;
};

static int cmp_out(const void *a, const void *b)
{
    const struct out_tensor *x = a, *y = b;
    int                      rx = rank_of(x->name), ry = rank_of(y->name);
    if (rx != ry) return rx < ry ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Whether a tensor is a prepared form the backend stored in an earlier conversion
 * ("NAME.SUFFIX"): made again when asked for, else left out. */
static bool is_prepared(const struct dsv4_backend_kind *kind, const char *name, size_t len)
{
    size_t s = kind->prepared_suffix ? strlen(kind->prepared_suffix) : 0;
    return s && len > s + 1 && name[len - s - 1] == '.' && !strcmp(name + len - s, kind->prepared_suffix);
}

struct tile_list {
    struct out_tensor              *out;
    size_t                          n;
    const struct dsv4_backend_kind *kind;
};

static void add_tiles(struct dsv4_linear *l, void *ud)
{
    struct tile_list *T = ud;
    size_t            parts[2];
    if (!T->kind->export_prepared(l, parts, NULL)) return;
    for (int p = 0; p < 2; p++) {
        const struct dsv4_tensor *t = p ? l->st : l->wt;
        if (!parts[p] || !t) continue;
        struct out_tensor *o = &T->out[T->n++];
        snprintf(o->name, sizeof(o->name), "%s.%s", t->name, T->kind->prepared_suffix);
        o->lin = l, o->kind = T->kind, o->part = p, o->nbytes = parts[p];
    }
}

static void count_linear(struct dsv4_linear *l, void *ud)
{
    (void)l;
    *(size_t *)ud += 2;
}

/* The bytes of out entry o: the source tensor's, or tiles packed into buf (grown as needed). */
static const void *out_bytes(const struct out_tensor *o, uint8_t **buf, size_t *cap)
{
    if (o->src) return o->src->data;
    size_t parts[2], need = o->kind->export_prepared(o->lin, parts, NULL);
    if (*cap < need) {
        free(*buf);
        *cap = need;
        *buf = malloc(*cap);
        if (!*buf) {
            *cap = 0;
            return NULL;
        }
    }
    o->kind->export_prepared(o->lin, parts, *buf);
    return o->part ? *buf + parts[0] : *buf;
}

struct convert_opts {
    const char *src, *dst, *backend;
    bool        quiet, tiles;
};

static const struct cli_opt CONVERT_OPTS[] = {
    { "-m", NULL, "HF_DIR", "the checkpoint in the official layout", CLI_STR, offsetof(struct convert_opts, src), 0, 0,
      NULL },
    { "-o", NULL, "OUT_DIR", "where to write the dsv4-native checkpoint", CLI_STR, offsetof(struct convert_opts, dst), 0,
      0, NULL },
    { "--tiles", NULL, NULL,
      "also store the backend's prepared projections (cpu: the interleaved 16-row tiles\nof the AVX512-BF16 kernels)",
      CLI_FLAG, offsetof(struct convert_opts, tiles), 0, 0, NULL },
    { "--backend", NULL, "NAME", "whose prepared projections --tiles stores (default: the first backend)", CLI_STR,
      offsetof(struct convert_opts, backend), 0, 0, NULL },
    { "-q", NULL, NULL, "no progress or summary", CLI_FLAG, offsetof(struct convert_opts, quiet), 0, 0, NULL },
};

/* Writes the n tensors of order (total bytes) through wr, with progress on a terminal. */
static int write_tensors(struct dsv4_st_writer *wr, const struct out_tensor *order, size_t n, uint64_t total,
                         const char *tiles, bool quiet, struct dsv4_err *err)
{
    int rc = DSV4_OK;
    dsv4_st_writer_set_alignment(wr, 4096);
    dsv4_st_writer_set_metadata(wr, "format", "dsv4-native");
    dsv4_st_writer_set_metadata(wr, "version", "1");
    if (tiles) dsv4_st_writer_set_metadata(wr, "tiles", tiles);
    for (size_t i = 0; i < n && rc == DSV4_OK; i++) {
        const struct out_tensor *o   = &order[i];
        int64_t                  len = (int64_t)o->nbytes;
        rc = o->src ? dsv4_st_writer_add(wr, o->name, o->src->dtype, o->src->ndim, o->src->shape, err)
                    : dsv4_st_writer_add(wr, o->name, DSV4_DTYPE_U8, 1, &len, err);
    }
    uint64_t done = 0, shown = 0;
    bool     tty  = !quiet && isatty(2);
    uint8_t *buf  = NULL;
    size_t   cap  = 0;
    for (size_t i = 0; i < n && rc == DSV4_OK; i++) {
        const void *data = out_bytes(&order[i], &buf, &cap);
        rc = data ? dsv4_st_writer_write(wr, data, (size_t)order[i].nbytes, err)
                  : dsv4_err_set(err, DSV4_ENOMEM, "out of memory packing %s", order[i].name);
        done += order[i].nbytes;
        if (tty && (done - shown > ((uint64_t)256 << 20) || i + 1 == n)) {
            fprintf(stderr, "\rdsv4 convert: %5.1f%% of %.2f GB", 100.0 * (double)done / (double)(total ? total : 1),
                    (double)total / 1e9);
            shown = done;
        }
    }
    free(buf);
    if (tty) fprintf(stderr, "\n");
    if (rc) dsv4_st_writer_abort(wr);
    else rc = dsv4_st_writer_close(wr, err);
    return rc;
}

int cmd_convert(int argc, char **argv)
{
    struct convert_opts    co    = { 0 };
    const struct cli_group group = { NULL, CONVERT_OPTS, sizeof(CONVERT_OPTS) / sizeof(CONVERT_OPTS[0]), &co };
    const struct cli_spec  spec  = { "convert", "usage: dsv4 convert -m HF_DIR -o OUT_DIR [--tiles [--backend NAME]] [-q]\n", &group, 1,
                                     NULL };
    int                    prc   = cli_parse(&spec, argc, argv);
    if (prc != CLI_PARSED) return prc;
    if (!co.src || !co.dst) return cli_usage_error(&spec, "-m and -o are required");
    const char *src = co.src, *dst = co.dst;
    bool        quiet = co.quiet, tiles = co.tiles;
    const struct dsv4_backend_kind *kind = dsv4_backend_find(co.backend);
    if (!kind || (tiles && (!kind->export_prepared || !kind->prepared_suffix))) {
        fprintf(stderr, "dsv4 convert: %s '%s'\n", kind ? "--tiles: nothing to store for backend" : "no backend",
                co.backend ? co.backend : kind ? kind->name : "");
        return 1;
    }
    struct dsv4_err        err;
    struct dsv4_config     cfg;
    struct dsv4_checkpoint ck;
    /* V4.1: nothing to prepare for a forward that does not exist yet */
    if (dsv4_config_load(&cfg, src, &err) || dsv4_config_check_convertible(&cfg, &err) ||
        dsv4_checkpoint_open(&ck, src, &err)) {
        fprintf(stderr, "dsv4 convert: %s\n", err.msg);
        return 1;
    }
    /* refuse to convert a checkpoint that would not load */
    struct dsv4_arena       arena;
    struct dsv4_weights     w;
    struct dsv4_bind_report rep;
    dsv4_arena_init(&arena, 1 << 20);
    int rc = dsv4_weights_bind(&w, &cfg, &ck, &arena, &rep, &err);
    for (int i = 0; i < rep.n_problems; i++) fprintf(stderr, "dsv4 convert: %s\n", rep.problems[i].text);
    dsv4_bind_report_free(&rep);
    if (rc) {
        fprintf(stderr, "dsv4 convert: %s\n", err.msg);
        dsv4_arena_free(&arena);
        dsv4_checkpoint_close(&ck);
        return 1;
    }
    if (mkdir(dst, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "dsv4 convert: cannot create %s: %s\n", dst, strerror(errno));
        dsv4_arena_free(&arena);
        dsv4_checkpoint_close(&ck);
        return 1;
    }
    size_t n_lin = 0;
    if (tiles) dsv4_weights_each_linear(&w, &cfg, count_linear, &n_lin);
    struct out_tensor *order = calloc(ck.n_tensors + n_lin + 1, sizeof(*order));
    size_t             n     = 0;
    uint64_t           total = 0;
    for (size_t i = 0; order && i < ck.n_tensors; i++) {
        const struct dsv4_tensor *t = &ck.tensors[i];
        size_t                    l = strlen(t->name);
        /* padding, and tiles of an earlier conversion (made again below when asked for) */
        if (!strncmp(t->name, DSV4_ST_PAD_PREFIX, strlen(DSV4_ST_PAD_PREFIX)) || is_prepared(kind, t->name, l)) continue;
        snprintf(order[n].name, sizeof(order[n].name), "%s", t->name);
        order[n].src    = t;
        order[n].nbytes = t->nbytes;
        n++;
    }
    if (order && tiles) {
        struct tile_list T = { order + n, 0, kind };
        dsv4_weights_each_linear(&w, &cfg, add_tiles, &T);
        n += T.n;
    }
    for (size_t i = 0; i < n; i++) total += order[i].nbytes;
    if (order) qsort(order, n, sizeof(*order), cmp_out);
    char *out = dsv4_path_join(dst, "model.safetensors");
    struct dsv4_st_writer *wr;
    rc = order ? dsv4_st_writer_open(&wr, out, &err) : dsv4_err_set(&err, DSV4_ENOMEM, "out of memory");
    if (rc == DSV4_OK) rc = write_tensors(wr, order, n, total, tiles ? kind->prepared_suffix : NULL, quiet, &err);
    if (rc) fprintf(stderr, "dsv4 convert: %s\n", err.msg);
    const char *extra[] = { "config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json" };
    for (size_t i = 0; i < sizeof(extra) / sizeof(extra[0]) && rc == DSV4_OK; i++) {
        char *a = dsv4_path_join(src, extra[i]), *b = dsv4_path_join(dst, extra[i]);
        if (copy_file(a, b) < 0) {
            fprintf(stderr, "dsv4 convert: cannot copy %s to %s\n", a, b);
            rc = DSV4_EIO;
        }
        free(a);
        free(b);
    }
    if (rc == DSV4_OK && !quiet)
        fprintf(stderr, "dsv4 convert: wrote %zu tensors (%.2f GB, page-aligned) to %s\n", n, (double)total / 1e9, out);
    free(out);
    free(order);
    dsv4_arena_free(&arena);
    dsv4_checkpoint_close(&ck);
    return rc ? 1 : 0;
}
