/*
 * vk_backend.c - `vulkan`: the Vulkan compute backend's struct dsv4_backend_kind (issue 37,
 * in progress; docs/BACKENDS.md "The Vulkan backend" says what runs and what does not yet).
 *
 * Options: device=N (the device `dsv4 ops --backend vulkan` lists as N; by default the first
 * discrete or integrated GPU, else device 0) and tiles=0|1 (accepted, as every backend must:
 * nothing is repacked) and weight_chunk=BYTES (the largest piece of a weight, normally
 * maxMemoryAllocationSize: a test lowers it to split small weights). It has no levels, so
 * level= is refused. Its memory is device memory behind addresses the host cannot read
 * (vk_mem.c); prepare_weights uploads the weights in their release formats (vk_weights.c),
 * and engine open refuses the backend while ops are missing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/vulkan/vk.h"
#include "backend/vulkan/vulkan.h"

enum { VKB_STAGING_BYTES = 8 << 20, VKB_META_BYTES = 4 << 20 };

struct vk_opts {
    int    device;       /* -1: the default */
    size_t weight_chunk; /* 0: maxMemoryAllocationSize */
};

static int take_opt(const char *key, const char *val, void *ud)
{
    struct vk_opts *o = ud;
    if (!strcmp(key, "tiles")) {
        /* nothing to repack: both mean the same here */
        return strcmp(val, "0") && strcmp(val, "1") ? DSV4_EINVAL : DSV4_OK;
    }
    if (!strcmp(key, "device")) {
        char *end;
        long  n = strtol(val, &end, 10);
        if (!*val || *end || n < 0 || n >= VKB_MAX_DEVICES) return DSV4_EINVAL;
        o->device = (int)n;
        return DSV4_OK;
    }
    if (!strcmp(key, "weight_chunk")) {
        /* a test's: the split of weights larger than one allocation, on small ones */
        char *end;
        unsigned long long n = strtoull(val, &end, 10);
        if (!*val || *end || n < 4096) return DSV4_EINVAL;
        o->weight_chunk = (size_t)n;
        return DSV4_OK;
    }
    return DSV4_EUNSUPPORTED;
}

/* The options, with an error that names the key (dsv4_backend_opts_each passes our status). */
static int parse_opts(const char *opts, struct vk_opts *o, struct dsv4_err *err)
{
    o->device       = -1;
    o->weight_chunk = 0;
    int rc = dsv4_backend_opts_each(opts, "vulkan", err, take_opt, o);
    if (rc == DSV4_EUNSUPPORTED)
        return dsv4_err_set(err, DSV4_EINVAL,
                            "backend 'vulkan' takes the options device=N, tiles=0|1 and weight_chunk=BYTES "
                            "(it has no levels): '%s'", opts);
    if (rc)
        return dsv4_err_set(err, DSV4_EINVAL,
                            "backend 'vulkan': bad option in '%s' (device=N, tiles=0|1, weight_chunk=BYTES >= 4096)",
                            opts);
    return DSV4_OK;
}

static void vk_destroy(void *impl)
{
    struct dsv4_vk *v = impl;
    if (!v) return;
    if (v->dev) {
        dsv4_vk_weights_free(v);
        vkDeviceWaitIdle(v->dev);
        dsv4_vk_mem_fini(v);
        dsv4_vk_hostbuf_free(v, &v->staging);
        for (int i = 0; i < v->n_meta; i++) dsv4_vk_hostbuf_free(v, &v->meta[i]);
        dsv4_vk_stamps_free(v);
        dsv4_vk_step_free(v);
    }
    dsv4_vk_close_device(v);
    pthread_mutex_destroy(&v->mu);
    free(v);
}

static int vk_create(void **impl, const struct dsv4_backend_params *p, struct dsv4_err *err)
{
    *impl = NULL;
    struct vk_opts o;
    int            rc = parse_opts(p->opts, &o, err);
    if (rc) return rc;
    struct dsv4_vk *v = calloc(1, sizeof(*v));
    if (!v) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    pthread_mutex_init(&v->mu, NULL);
    v->lg = p->lg;
    rc    = dsv4_vk_open_device(v, o.device, err);
    if (!rc) {
        size_t max      = (size_t)v->dev_info[v->chosen].max_alloc;
        v->weight_chunk = o.weight_chunk && o.weight_chunk < max ? o.weight_chunk : max;
    }
    if (!rc) rc = dsv4_vk_mem_init(v, err);
    if (!rc && (dsv4_vk_hostbuf(v, &v->staging, VKB_STAGING_BYTES,
                                VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT) ||
                dsv4_vk_hostbuf(v, &v->meta[0], VKB_META_BYTES, VK_BUFFER_USAGE_STORAGE_BUFFER_BIT)))
        rc = dsv4_err_set(err, DSV4_ENOMEM, "vulkan: no host-visible memory for the staging buffers");
    if (!rc) v->n_meta = 1;
    if (!rc && p->profile) rc = dsv4_vk_stamps_init(v, err);
    if (rc) {
        vk_destroy(v);
        return rc;
    }
    *impl = v;
    return DSV4_OK;
}

static const struct dsv4_backend_ops *vk_ops_of(void *impl)
{
    (void)impl;
    return &dsv4_vk_ops;
}

static void vk_describe(void *impl, char *buf, size_t cap)
{
    const struct dsv4_vk     *v = impl;
    const struct vk_dev_info *d = &v->dev_info[v->chosen];
    snprintf(buf, cap, "vulkan device %d: %s (%s), Vulkan %u.%u.%u", v->chosen, d->name, dsv4_vk_type_name(d->type),
             VK_API_VERSION_MAJOR(d->api), VK_API_VERSION_MINOR(d->api), VK_API_VERSION_PATCH(d->api));
}

static void vk_settings(void *impl, struct dsv4_backend_settings *s)
{
    (void)impl;
    *s = (struct dsv4_backend_settings){ .level = "", .n_threads = 1 };
}

static int vk_prepare_weights(void *impl, struct dsv4_weight_set *ws, const struct dsv4_backend_params *p,
                              struct dsv4_err *err)
{
    (void)p;
    return dsv4_vk_prepare_weights(impl, ws, err);
}

/* Also where a step plan is made: the backend's own step buffers are sized for it now, so
 * that no step of the plan allocates (the indexer's scores: every row against a whole
 * context's keys, capped as vk_op_idx.c caps them). */
static size_t vk_scratch_floats(void *impl, const struct dsv4_plan_dims *dims)
{
    dsv4_vk_step_reserve(impl, dims);
    return dsv4_vk_linear_scratch(dims);
}

static int vk_describe_op(void *impl, enum dsv4_op op, char *buf, size_t cap)
{
    (void)impl;
    const char *s = dsv4_op_entry(&dsv4_vk_ops, op) ? dsv4_vk_op_shader(op) : NULL;
    if (s && op == DSV4_OP_STEP_BEGIN) snprintf(buf, cap, "an upload of the step descriptor (no shader)");
    else if (s) snprintf(buf, cap, "compute shader %s.comp", s);
    else snprintf(buf, cap, "missing (no shader yet: issue 37)");
    return 0;
}

static int vk_error(void *impl, struct dsv4_err *err)
{
    struct dsv4_vk *v = impl;
    pthread_mutex_lock(&v->mu);
    int rc = v->fault[0] ? dsv4_err_set(err, DSV4_EIO, "vulkan: %s", v->fault) : DSV4_OK;
    pthread_mutex_unlock(&v->mu);
    return rc;
}

static void vk_devices(void *impl, char *buf, size_t cap)
{
    dsv4_vk_devices_text(impl, buf, cap);
}

const struct dsv4_backend_kind dsv4_backend_vulkan = {
    .name = "vulkan", .host_visible = false,
    .create = vk_create, .destroy = vk_destroy, .ops = vk_ops_of, .describe = vk_describe, .settings = vk_settings,
    .prepare_weights = vk_prepare_weights, .scratch_floats = vk_scratch_floats,
    .alloc = dsv4_vk_alloc, .free = dsv4_vk_free, .upload = dsv4_vk_upload, .download = dsv4_vk_download,
    .copy = dsv4_vk_copy, .sync = dsv4_vk_sync, .memory = dsv4_vk_memory, .error = vk_error,
    .describe_op = vk_describe_op, .devices = vk_devices,
    .read_bandwidth = dsv4_vk_read_bandwidth, .peaks = dsv4_vk_peaks, .device_profile = dsv4_vk_device_profile,
};
