/*
 * engram_map.h - the Engram compressed token map read from a file: engram_token_map.json in a
 * checkpoint directory, a JSON array whose element i is the compressed id of token id i (what
 * the official inference/engram.py build_compressed_token_map computes from tokenizer.json;
 * docs/ENGRAM.md). Computing the map from the tokenizer is not done here.
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

#endif /* DSV4_ENGRAM_MAP_H */
