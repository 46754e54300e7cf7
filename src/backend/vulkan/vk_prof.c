/*
 * vk_prof.c - the device's timing of the ops under --profile: the host-side profiler
 * (src/backend/prof.c) only sees an op being recorded, so the backend writes a GPU timestamp
 * after every dispatch and transfer of a command buffer, labelled with its shader ("upload",
 * "download", "copy" for transfers), and when the submission has finished attributes to each
 * label the time since the timestamp before it. Commands of one command buffer run one after
 * the other (a barrier follows each: vk_cmd.c), so the gaps are their durations. At exit,
 * device_profile prints GPU time per shader, with the share of the total.
 *
 * A command buffer holds at most VKB_STAMPS timestamps; later commands in it go untimed and are
 * counted as such. A queue without timestamps (timestampValidBits 0) is reported, not timed.
 */
#include <stdlib.h>
#include <string.h>

#include "backend/vulkan/vk.h"

enum { VKB_STAMPS = 4096, VKB_LABELS = 96 };

struct vk_label {
    const char *name;
    uint64_t    calls;
    double      ns;
};

struct vk_stamps {
    VkQueryPool     pool;
    double          ns_per_tick;
    uint64_t        mask;            /* timestampValidBits */
    int             n;               /* timestamps written in the open command buffer (0: the opening one) */
    const char     *label[VKB_STAMPS];
    uint64_t        t[VKB_STAMPS];   /* read back here: nothing is allocated while decoding */
    struct vk_label lab[VKB_LABELS];
    int             n_lab;
    uint64_t        untimed;
    bool            unsupported;
};

int dsv4_vk_stamps_init(struct dsv4_vk *v, struct dsv4_err *err)
{
    struct vk_stamps *s = calloc(1, sizeof(*s));
    if (!s) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    v->stamps = s;
    VkQueueFamilyProperties q[32];
    uint32_t                nq = 32;
    vkGetPhysicalDeviceQueueFamilyProperties(v->phys, &nq, q);
    VkPhysicalDeviceProperties p;
    vkGetPhysicalDeviceProperties(v->phys, &p);
    uint32_t bits = v->qfam < nq ? q[v->qfam].timestampValidBits : 0;
    if (!bits || !p.limits.timestampComputeAndGraphics) {
        s->unsupported = true;
        return DSV4_OK;
    }
    s->mask        = bits >= 64 ? UINT64_MAX : (((uint64_t)1 << bits) - 1);
    s->ns_per_tick = p.limits.timestampPeriod;
    VkQueryPoolCreateInfo qi = { .sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO, .queryType = VK_QUERY_TYPE_TIMESTAMP,
                                 .queryCount = VKB_STAMPS };
    if (vkCreateQueryPool(v->dev, &qi, NULL, &s->pool) != VK_SUCCESS)
        return dsv4_err_set(err, DSV4_ENOMEM, "vulkan: cannot create a timestamp query pool");
    return DSV4_OK;
}

void dsv4_vk_stamps_free(struct dsv4_vk *v)
{
    if (!v->stamps) return;
    if (v->stamps->pool) vkDestroyQueryPool(v->dev, v->stamps->pool, NULL);
    free(v->stamps);
    v->stamps = NULL;
}

void dsv4_vk_stamp_open(struct dsv4_vk *v)
{
    struct vk_stamps *s = v->stamps;
    if (!s || !s->pool) return;
    vkCmdResetQueryPool(v->cmd, s->pool, 0, VKB_STAMPS);
    vkCmdWriteTimestamp(v->cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, s->pool, 0);
    s->label[0] = NULL;
    s->n        = 1;
}

void dsv4_vk_stamp(struct dsv4_vk *v, const char *label)
{
    struct vk_stamps *s = v->stamps;
    if (!s || !s->pool || !s->n) return;
    if (s->n == VKB_STAMPS) {
        s->untimed++;
        return;
    }
    vkCmdWriteTimestamp(v->cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, s->pool, (uint32_t)s->n);
    s->label[s->n++] = label;
}

static struct vk_label *label_of(struct vk_stamps *s, const char *name)
{
    for (int i = 0; i < s->n_lab; i++)
        if (!strcmp(s->lab[i].name, name)) return &s->lab[i];
    if (s->n_lab == VKB_LABELS) return NULL;
    s->lab[s->n_lab] = (struct vk_label){ .name = name };
    return &s->lab[s->n_lab++];
}

void dsv4_vk_stamps_collect(struct dsv4_vk *v)
{
    struct vk_stamps *s = v->stamps;
    if (!s || !s->pool || s->n < 2) {
        if (s) s->n = 0;
        return;
    }
    uint64_t *t = s->t;
    if (vkGetQueryPoolResults(v->dev, s->pool, 0, (uint32_t)s->n, sizeof(uint64_t) * (size_t)s->n, t,
                                   sizeof(uint64_t), VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT) == VK_SUCCESS) {
        for (int i = 1; i < s->n; i++) {
            struct vk_label *l = label_of(s, s->label[i]);
            if (!l) continue;
            l->calls++;
            l->ns += (double)((t[i] - t[i - 1]) & s->mask) * s->ns_per_tick;
        }
    }
    s->n = 0;
}

void dsv4_vk_device_profile(void *impl, FILE *f)
{
    struct dsv4_vk   *v = impl;
    struct vk_stamps *s = v->stamps;
    if (!s) return;
    if (s->unsupported) {
        fprintf(f, "vulkan: the device's compute queue has no timestamps: no GPU times\n");
        return;
    }
    double total = 0;
    for (int i = 0; i < s->n_lab; i++) total += s->lab[i].ns;
    fprintf(f, "vulkan GPU time (timestamps after each command):\n  %-16s %10s %12s %8s\n", "shader", "commands",
            "GPU ms", "share");
    for (int i = 0; i < s->n_lab; i++)
        fprintf(f, "  %-16s %10llu %12.2f %7.1f%%\n", s->lab[i].name, (unsigned long long)s->lab[i].calls,
                s->lab[i].ns / 1e6, total > 0 ? 100.0 * s->lab[i].ns / total : 0.0);
    if (s->untimed) fprintf(f, "  (%llu commands untimed: more than %d in one command buffer)\n",
                            (unsigned long long)s->untimed, VKB_STAMPS - 1);
}
