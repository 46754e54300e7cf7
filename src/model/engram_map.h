/*
 * engram_map.h - the Engram compressed token map: token id -> compressed id (docs/ENGRAM.md,
 * "The token map"). Read from engram_token_map.json in a checkpoint directory (a JSON array
 * whose element i is the compressed id of token id i; engram_map.c) or computed from the
 * tokenizer as the official inference/engram.py build_compressed_token_map does
 * (engram_map_tok.c). The file wins when both are there.
 */
#ifndef DSV4_ENGRAM_MAP_H
#define DSV4_ENGRAM_MAP_H

#include <stdint.h>

#include "dsv4.h"

/* Parses the map from text (path only names it in messages). n_vocab: the number of token ids
 * it must cover, the tokenizer's own count (len(tokenizer) in engram.py: below the config's
 * vocab_size, which is padded; 0: any length; the caller refuses token ids >= *n rather than
 * indexing past the map); compressed_vocab: the config's engram_compressed_vocab_size,
 * which the ids must fill as build_compressed_token_map assigns them (each below it, the
 * largest one compressed_vocab - 1). On success *map (malloc'd; the caller frees it) and *n.
 * DSV4_EFORMAT with the reason (not JSON, not an array, an element that is not an integer, a
 * negative or too large id, the wrong length or largest id) and nothing allocated. */
int dsv4_engram_map_parse(const char *text, const char *path, int64_t n_vocab,
                          int64_t compressed_vocab, int32_t **map, int64_t *n,
                          struct dsv4_err *err);

/* The same from a file; DSV4_EIO when it cannot be read. */
int dsv4_engram_map_load(const char *path, int64_t n_vocab, int64_t compressed_vocab,
                         int32_t **map, int64_t *n, struct dsv4_err *err);

/* Where a map came from. */
enum dsv4_engram_map_source {
    DSV4_ENGRAM_MAP_SOURCE_FILE,      /* engram_token_map.json */
    DSV4_ENGRAM_MAP_SOURCE_TOKENIZER, /* computed from tokenizer.json */
};

const char *dsv4_engram_map_source_name(enum dsv4_engram_map_source source);

/* Computes the map from a loaded tokenizer (engram_map_tok.c): one compressed id per token id
 * 0 .. n-1, in order of first appearance. compressed_vocab: the config's
 * engram_compressed_vocab_size, which the number of distinct ids must equal (0: any). On success
 * *map (malloc'd; the caller frees it) and *n. DSV4_EUNSUPPORTED for a tokenizer whose ids have
 * gaps (len(tokenizer) is then not the id range), DSV4_EFORMAT for a count that differs from
 * compressed_vocab, DSV4_ENOMEM; nothing allocated on error. */
int dsv4_engram_map_from_tokenizer(const dsv4_tokenizer *tok, int64_t compressed_vocab, int32_t **map,
                                   int64_t *n, struct dsv4_err *err);

/* The map of a checkpoint directory: its engram_token_map.json when present (checked as
 * dsv4_engram_map_load does), else computed from its tokenizer.json; DSV4_EIO naming both when
 * the directory has neither. n_vocab as in dsv4_engram_map_parse (0: any). *source says which. */
int dsv4_engram_map_open(const char *dir, int64_t n_vocab, int64_t compressed_vocab, int32_t **map,
                         int64_t *n, enum dsv4_engram_map_source *source, struct dsv4_err *err);

#endif /* DSV4_ENGRAM_MAP_H */
