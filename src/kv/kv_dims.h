/*
 * kv_dims.h - the model widths the attention state is laid out by: all that src/kv reads of
 * a model. The model layer fills it from the validated config (model/model.h: cfg.kv, set by
 * dsv4_config_parse), so the KV layer depends on no model header but the leaf description of
 * each layer's kind (model/layer_kind.h).
 */
#ifndef DSV4_KV_DIMS_H
#define DSV4_KV_DIMS_H

#include "backend/backend.h" /* DSV4_MAX_LAYERS */
#include "model/layer_kind.h"

struct dsv4_kv_dims {
    int n_layer;                 /* layers of the main stack */
    int n_mtp;                   /* draft layers after them: V4 its MTP block (0 or 1), V4.1 its DSpark stages */
    int window;                  /* sliding window: raw rows a ring keeps (plus the draft rows) */
    int d_model;                 /* hidden width: the MTP streams are [hc, d_model] */
    int hc;                      /* hyper-connection streams */
    int d_head;                  /* KV row width */
    int d_rope;                  /* rope dims at the end of a KV row */
    int d_idx_head;              /* indexer key width (layers with an indexer) */
    struct dsv4_layer_kind kind[DSV4_MAX_LAYERS]; /* each layer's kind (cfg.kind), n_layer + n_mtp used */
};

#endif
