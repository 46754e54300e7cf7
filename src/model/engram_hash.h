/*
 * engram_hash.h - the row indices of DeepSeek-V4.1's Engram tables (docs/ENGRAM.md): for each
 * position, Engram layer, n-gram order (2 .. max_ngram) and head, the row of that layer's
 * table the position reads, exactly as the official inference/engram.py computes them
 * (compute_hash_multipliers, EngramLayout.from_args, NgramHashState.forward).
 *
 * Inputs are compressed token ids (engram_map.h maps token ids to them) or DSV4_ENGRAM_DEAD for
 * a position that takes part in no n-gram (engram.py's token_mask False). The sequence state
 * is the last max_ngram - 1 compressed ids, so token-by-token decode, chunked prefill and one
 * whole-sequence call give the same indices. No allocation; all integer arithmetic.
 */
#ifndef DSV4_ENGRAM_HASH_H
#define DSV4_ENGRAM_HASH_H

#include <stdint.h>

#include "dsv4.h"

enum {
    DSV4_ENGRAM_MAX_LAYERS = 8,
    DSV4_ENGRAM_MAX_NGRAM  = 8,  /* engram_max_ngram_size */
    DSV4_ENGRAM_MAX_HEADS  = 32, /* engram_n_heads */
    DSV4_ENGRAM_MAX_COLS   = (DSV4_ENGRAM_MAX_NGRAM - 1) * DSV4_ENGRAM_MAX_HEADS,
    DSV4_ENGRAM_DEAD       = -1, /* engram.py NgramHashState.DEAD */
};

/* The Engram fields of a V4.1 config (text_config.engram_*), as plain numbers. */
struct dsv4_engram_params {
    int     n_layers;                                /* entries of engram_layer_ids */
    int     layer_ids[DSV4_ENGRAM_MAX_LAYERS];       /* engram_layer_ids: seeds the multipliers */
    int64_t num_embeddings[DSV4_ENGRAM_MAX_LAYERS];  /* engram_num_embeddings: rows per table */
    int     max_ngram;                               /* engram_max_ngram_size, >= 2 */
    int     n_heads;                                 /* engram_n_heads */
    int64_t vocab_size;                              /* engram_vocab_size: primes start above it */
    int64_t compressed_vocab;                        /* engram_compressed_vocab_size */
    int32_t pad_compressed;                          /* compressed id of engram_pad_id */
};

/* What the parameters determine once: [layer][order] multipliers and [layer][column] primes
 * and row offsets, column = (order - 2) * n_heads + head. */
struct dsv4_engram_hash {
    struct dsv4_engram_params p;
    int     n_cols;                                              /* (max_ngram - 1) * n_heads */
    int64_t mult[DSV4_ENGRAM_MAX_LAYERS][DSV4_ENGRAM_MAX_NGRAM];  /* odd, < 2^63 / compressed_vocab */
    int64_t prime[DSV4_ENGRAM_MAX_LAYERS][DSV4_ENGRAM_MAX_COLS];  /* bucket count per column */
    int64_t offset[DSV4_ENGRAM_MAX_LAYERS][DSV4_ENGRAM_MAX_COLS]; /* first row of each column */
};

/* One sequence's history: the compressed ids (or DEAD) of the last max_ngram - 1 positions,
 * newest first; DEAD before the sequence start (a look-back past it reads the pad). */
struct dsv4_engram_seq {
    int32_t hist[DSV4_ENGRAM_MAX_NGRAM - 1];
};

/* Validates p and computes multipliers, primes and offsets into h. DSV4_EINVAL (err says which
 * field) when a field is out of range or a layer's table has fewer rows than its primes sum
 * to; DSV4_EUNSUPPORTED past the MAX limits above. */
int dsv4_engram_hash_init(struct dsv4_engram_hash *h, const struct dsv4_engram_params *p,
                          struct dsv4_err *err);

/* A fresh sequence (position 0 next). */
void dsv4_engram_seq_reset(struct dsv4_engram_seq *s);

/* The next n positions of a sequence: ids[i] a compressed id in [0, compressed_vocab) or
 * DSV4_ENGRAM_DEAD; writes out[(i * n_layers + layer) * n_cols + column] and advances s.
 * DSV4_ERANGE (s unchanged, out undefined) when an id is out of range. */
int dsv4_engram_chunk(const struct dsv4_engram_hash *h, struct dsv4_engram_seq *s,
                      const int32_t *ids, int n, int64_t *out, struct dsv4_err *err);

/* A whole sequence from position 0: dsv4_engram_chunk on a fresh state. */
int dsv4_engram_sequence(const struct dsv4_engram_hash *h, const int32_t *ids, int n,
                         int64_t *out, struct dsv4_err *err);

#endif /* DSV4_ENGRAM_HASH_H */
