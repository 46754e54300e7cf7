/* inspect_v41.h - `dsv4 inspect --config` and `-m` for DeepSeek-V4.1 (inspect_v41.c). */
#ifndef DSV4_INSPECT_V41_H
#define DSV4_INSPECT_V41_H

#include <jansson.h>
#include <stdbool.h>

#include "model/model.h"

/* Prints the model, its layers' kinds and its sizes (text, or JSON with as_json), with the
 * memory for ctx positions of seqs sequences. */
void inspect_v41_config(const char *path, const struct dsv4_config *c, long long ctx, long long seqs, bool as_json);

/* `dsv4 inspect -m DIR` on a bound V4.1 checkpoint: the model section of the report, as text
 * or as fields of o (the caller prints the problems). has_dspark: every DSpark stage bound;
 * n_vision: the vision tower's tensors (bind report).
 * False when its Engram token map is wrong, or there is neither engram_token_map.json nor
 * tokenizer.json to take it from (the message printed / in o). */
bool inspect_v41_checkpoint_text(const char *dir, const struct dsv4_config *c, const struct dsv4_checkpoint *ck,
                                 bool has_dspark, int n_vision, long long ctx, long long seqs);
bool inspect_v41_checkpoint_json(json_t *o, const char *dir, const struct dsv4_config *c, bool has_dspark,
                                 long long ctx, long long seqs);
/* The bytes of the checkpoint's tensors, and in *engram those of its Engram tables. */
uint64_t inspect_v41_bytes(const struct dsv4_checkpoint *ck, uint64_t *engram);

#endif
