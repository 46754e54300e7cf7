/*
 * test_engram.h - what the two files of the engram test group share: test_engram_hash.c
 * (indices, generator, map file; the group's table) and test_engram_map.c (the map computed
 * from a tokenizer).
 */
#ifndef DSV4_TEST_ENGRAM_H
#define DSV4_TEST_ENGRAM_H

#include <jansson.h>

#include "test.h"

/* A fixture written by a tools/ref script (regen: the command that rewrites it); NULL, with a
 * failed check naming both, when it cannot be read. */
json_t *test_engram_fixture(struct test_ctx *t, const char *path, const char *regen);

void test_engram_map_tokenizer(struct test_ctx *t);
void test_engram_map_open(struct test_ctx *t);
void test_engram_map_bad_tokenizer(struct test_ctx *t);
void test_engram_map_deepseek_v3(struct test_ctx *t);
void test_engram_map_hf_tokenizers(struct test_ctx *t);

#endif /* DSV4_TEST_ENGRAM_H */
