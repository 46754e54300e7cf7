/* inspect_v41.h - `dsv4 inspect --config` for a DeepSeek-V4.1 config (inspect_v41.c). */
#ifndef DSV4_INSPECT_V41_H
#define DSV4_INSPECT_V41_H

#include <jansson.h>
#include <stdbool.h>

#include "model/model.h"

/* Prints the model, its layers' kinds and its sizes (text, or JSON with as_json), with the
 * memory for ctx positions of seqs sequences. */
void inspect_v41_config(const char *path, const struct dsv4_config *c, long long ctx, long long seqs, bool as_json);

#endif
