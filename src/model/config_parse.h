/*
 * config_parse.h - the field readers config.c validates a config.json with, shared with the
 * DeepSeek-V4.1 part (config_v41.c). Each failure names the field; the first one is kept.
 */
#ifndef DSV4_CONFIG_PARSE_H
#define DSV4_CONFIG_PARSE_H

#include <jansson.h>

#include "model/model.h"

struct cfg_parse {
    json_t          *root; /* the model's fields: the file (V4) or its text_config (V4.1) */
    json_t          *top;  /* the file itself (V4: the same object) */
    const char      *what;
    struct dsv4_err *err;
    int              rc;   /* the first failure's code */
};

/* Records "WHAT: field "FIELD" WHY" unless a failure is recorded already; returns 0. */
int         dsv4_cfg_bad(struct cfg_parse *p, const char *field, const char *why);
/* obj's integer field within [lo, hi]; def when absent and not required (0 after a failure). */
int         dsv4_cfg_int(struct cfg_parse *p, json_t *obj, const char *field, bool required, int def, int lo, int hi);
double      dsv4_cfg_double(struct cfg_parse *p, json_t *obj, const char *field, bool required, double def,
                            double lo, double hi);
const char *dsv4_cfg_str(struct cfg_parse *p, json_t *obj, const char *field, bool required);
void        dsv4_cfg_require(struct cfg_parse *p, bool ok, const char *field, const char *why);

/* config_v41.c: the text_config fields only V4.1 has, and the checks of its shapes. */
void dsv4_cfg_v41_parse(struct cfg_parse *p, struct dsv4_config *c);
void dsv4_cfg_v41_check_shapes(struct cfg_parse *p, const struct dsv4_config *c);

#endif
