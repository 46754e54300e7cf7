/*
 * io.h - files: read-only mappings, the safetensors format (reader for single and sharded
 * checkpoints, streaming writer), and small JSON helpers on jansson.
 */
#ifndef DSV4_IO_H
#define DSV4_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/core.h"

/* ------------------------------------------------------------------ dtypes */

enum dsv4_dtype {
    DSV4_DTYPE_F64,
    DSV4_DTYPE_F32,
    DSV4_DTYPE_F16,
    DSV4_DTYPE_BF16,
    DSV4_DTYPE_I64,
    DSV4_DTYPE_I32,
    DSV4_DTYPE_I16,
    DSV4_DTYPE_I8,
    DSV4_DTYPE_U8,
    DSV4_DTYPE_BOOL,
    DSV4_DTYPE_F8_E4M3,
    DSV4_DTYPE_F8_E5M2,
    DSV4_DTYPE_F8_E8M0,
    DSV4_DTYPE_COUNT,
};

size_t      dsv4_dtype_size(enum dsv4_dtype t);
const char *dsv4_dtype_name(enum dsv4_dtype t);
/* Returns true and sets *t when name is a safetensors dtype name ("F8_E4M3", ...). */
bool        dsv4_dtype_from_name(const char *name, enum dsv4_dtype *t);

/* ------------------------------------------------------------------ mapped files */

struct dsv4_mapped_file {
    const uint8_t *data; /* read-only mapping of the whole file (NULL when size is 0) */
    size_t         size;
};

int  dsv4_file_map(struct dsv4_mapped_file *f, const char *path, struct dsv4_err *err);
void dsv4_file_unmap(struct dsv4_mapped_file *f);

/* ------------------------------------------------------------------ tensors */

enum { DSV4_MAX_DIMS = 8 };

struct dsv4_tensor {
    const char     *name;
    enum dsv4_dtype dtype;
    int             ndim;
    int64_t         shape[DSV4_MAX_DIMS];
    const void     *data;   /* into the mapping */
    uint64_t        nbytes;
    uint64_t        offset; /* absolute byte offset of the data in its file */
    int             file;   /* index into the checkpoint's shard list */
};

/* "[2048, 4096]" into buf. */
const char *dsv4_shape_str(int ndim, const int64_t *shape, char *buf, size_t n);
uint64_t    dsv4_tensor_numel(const struct dsv4_tensor *t);

/* ------------------------------------------------------------------ safetensors reader */

/* Largest header accepted (the reference implementation's limit is 100 MB). */
#define DSV4_ST_MAX_HEADER ((uint64_t)100 << 20)

/*
 * Parses the header of a safetensors file held in buf[0..size) (the whole file: header and
 * data). Strict: header length sane and inside the file, valid UTF-8 JSON object (no
 * duplicate keys), every entry with exactly dtype/shape/data_offsets, offsets inside the data
 * area, entries contiguous and non-overlapping and covering the data area exactly, byte size =
 * product(shape) x dtype size, all with overflow-checked arithmetic. On failure err names the
 * first problem and the byte offset where it was found. Names and tensors are allocated in
 * arena. tensors[i].data points into buf.
 */
int dsv4_st_parse(const uint8_t *buf, size_t size, const char *what, struct dsv4_arena *arena,
                  struct dsv4_tensor **tensors, size_t *n_tensors, struct dsv4_err *err);

/* Copies the value of key in the file's __metadata__ into out (NUL-terminated). Returns
 * false when the file has no such entry or it does not fit. buf must hold a parsed file. */
bool dsv4_st_metadata(const uint8_t *buf, size_t size, const char *key, char *out, size_t cap);

/* A checkpoint: one or more mapped safetensors shards and a name -> tensor index. */
/* A shard that dsv4_checkpoint_open_lenient refused: the error (with its byte offset) and the
 * tensors the model lacks because of it, named by the index, or else by the shard's header
 * when it still parses (none when neither can be read). */
struct dsv4_shard_refusal {
    int          file;                  /* index into file_names */
    int          code;                  /* DSV4_E* */
    char         msg[DSV4_ERR_MSG_MAX];
    const char **names;                 /* [n_names], in the checkpoint's arena */
    size_t       n_names;
};

struct dsv4_checkpoint {
    char                    *dir;
    int                      n_files;
    char                   **file_names;  /* [n_files], relative to dir */
    struct dsv4_mapped_file *files;       /* [n_files] */
    struct dsv4_tensor      *tensors;     /* [n_tensors], in file then header order */
    size_t                   n_tensors;
    struct dsv4_strmap       by_name;
    struct dsv4_shard_refusal *refused;   /* [n_refused], lenient open only */
    int                      n_refused;
    struct dsv4_strmap       refused_by_name; /* tensor name -> its refusal (lenient open only) */
    struct dsv4_arena        arena;
};

/*
 * Opens path: a directory (model.safetensors.index.json if present, else model.safetensors,
 * else every *.safetensors in name order) or a single .safetensors file. Validates every
 * shard (dsv4_st_parse) and the index (each listed tensor is in its shard, no tensor in two
 * shards, no shard tensor missing from the index, shard names without path components).
 */
int  dsv4_checkpoint_open(struct dsv4_checkpoint *ck, const char *path, struct dsv4_err *err);
/* The same, except that a shard which cannot be mapped or parsed is recorded in ck->refused
 * and left out instead of failing the open, so that `dsv4 inspect` can check what remains and
 * name every tensor the model therefore lacks. Problems of the checkpoint as a whole (no
 * shards, a malformed index, a tensor in two shards) still fail. */
int  dsv4_checkpoint_open_lenient(struct dsv4_checkpoint *ck, const char *path, struct dsv4_err *err);
/* The refusal that took this tensor away, or NULL. */
const struct dsv4_shard_refusal *dsv4_checkpoint_refusal_of(const struct dsv4_checkpoint *ck, const char *name);
void dsv4_checkpoint_close(struct dsv4_checkpoint *ck);
const struct dsv4_tensor *dsv4_checkpoint_find(const struct dsv4_checkpoint *ck, const char *name);

/* ------------------------------------------------------------------ safetensors writer */

/*
 * Streaming writer: declare every tensor (dsv4_st_writer_add), then write their bytes in
 * declaration order (dsv4_st_writer_write, any number of calls), then close. The header is
 * written when the first data byte arrives; only the header lives in memory.
 */
struct dsv4_st_writer;

int dsv4_st_writer_open(struct dsv4_st_writer **w, const char *path, struct dsv4_err *err);
int dsv4_st_writer_add(struct dsv4_st_writer *w, const char *name, enum dsv4_dtype dtype, int ndim,
                       const int64_t *shape, struct dsv4_err *err);
int dsv4_st_writer_set_metadata(struct dsv4_st_writer *w, const char *key, const char *value);
/* Page-aligns the data: the header is padded so the data area starts at a multiple of
 * `align` (a power of two) in the file, and tensors added afterwards start at multiples of it,
 * the gaps being filled by U8 tensors named "__pad.N" (the file stays valid safetensors,
 * which allows no holes; readers skip __pad tensors). */
int dsv4_st_writer_set_alignment(struct dsv4_st_writer *w, size_t align);
/* Names of padding tensors start with this. */
#define DSV4_ST_PAD_PREFIX "__pad."
int dsv4_st_writer_write(struct dsv4_st_writer *w, const void *data, size_t n, struct dsv4_err *err);
/* Flushes, checks every declared byte was written, frees w (also on error). */
int dsv4_st_writer_close(struct dsv4_st_writer *w, struct dsv4_err *err);
/* Closes and deletes the partial file (error paths). */
void dsv4_st_writer_abort(struct dsv4_st_writer *w);

/* ------------------------------------------------------------------ misc file helpers */

/* Reads a whole (small) file into a malloc'd NUL-terminated buffer. */
int dsv4_read_file(const char *path, char **out, size_t *len, size_t max_len, struct dsv4_err *err);
bool dsv4_path_exists(const char *path);
/* dir + "/" + name into a malloc'd string (NULL on OOM). */
char *dsv4_path_join(const char *dir, const char *name);

#endif /* DSV4_IO_H */
