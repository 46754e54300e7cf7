/*
 * vk.h - the Vulkan backend's state, shared by its files (vk_device.c: instance and device;
 * vk_mem.c: the address table; vk_cmd.c: command buffer and transfers; vk_pipe.c: the
 * pipelines; vk_ops.c: the op table; vk_backend.c: the kind). Nothing outside
 * src/backend/vulkan/ includes it: the model reaches the backend through
 * struct dsv4_backend_kind alone (vulkan.h).
 *
 * Memory is addressed, never dereferenced (docs/BACKENDS.md): alloc hands out addresses of a
 * host range reserved without access (a host read faults), one block per allocation, and the
 * block table maps any address inside a block to its VkBuffer and an offset.
 *
 * Submission: one command buffer, one fence, at most one submission in flight. Whatever
 * records waits for the previous submission first (so the command buffer, the descriptor
 * sets, the staging and metadata buffers are free to reuse) and starts with a global
 * barrier, which orders it after every earlier submission on the queue. One mutex guards it
 * all: contexts on several threads serialise here.
 */
#ifndef DSV4_VK_H
#define DSV4_VK_H

#include <pthread.h>
#include <vulkan/vulkan.h>

#include "backend/backend.h"

enum { VKB_MAX_DEVICES = 16, VKB_MAX_BINDINGS = 4 };

/* The shaders this build embeds (vk_shaders.c, generated from shaders/ by tools/spv_embed.sh). */
struct dsv4_vk_spirv {
    const char     *name; /* the file's name without .comp: "scale" */
    const uint32_t *code;
    size_t          bytes;
};
extern const struct dsv4_vk_spirv dsv4_vk_shaders[]; /* ends with name NULL */

/* One physical device as `dsv4 ops` lists it. */
struct vk_dev_info {
    char     name[VK_MAX_PHYSICAL_DEVICE_NAME_SIZE];
    VkPhysicalDeviceType type;
    uint32_t api;
    uint32_t max_sb_range, max_wg_invocations, subgroup;
    bool     fp64;
    VkDeviceSize local_heap;
};

/* One allocation: a range of the reserved addresses and the device buffer behind it. */
struct vk_block {
    size_t         off, len; /* in the reserved range; len a page multiple */
    VkBuffer       buf;
    VkDeviceMemory mem;
};

/* A pipeline per shader, made at its first dispatch. */
enum vk_pipe_id { VKB_PIPE_SCALE, VKB_PIPE_ADD_STREAMS, VKB_PIPE_EMBED, VKB_PIPE_RMSNORM, VKB_PIPE_COUNT };

struct vk_pipe {
    VkDescriptorSetLayout dsl;
    VkPipelineLayout      layout;
    VkPipeline            pipe;
    VkDescriptorSet       set;
};

/* A host-visible buffer mapped for the backend's life (staging, host metadata). */
struct vk_hostbuf {
    VkBuffer       buf;
    VkDeviceMemory mem;
    void          *map;
    VkDeviceSize   bytes;
};

struct dsv4_vk {
    pthread_mutex_t mu;
    const struct dsv4_logger *lg;
    VkInstance       inst;
    int              n_dev, chosen;
    struct vk_dev_info dev_info[VKB_MAX_DEVICES];
    VkPhysicalDevice phys;
    VkDevice         dev;
    uint32_t         qfam;
    VkQueue          queue;
    VkCommandPool    pool;
    VkCommandBuffer  cmd;
    VkFence          fence;
    bool             pending;   /* a submission has not been waited for */
    bool             recording;
    VkDescriptorPool dpool;
    struct vk_pipe   pipes[VKB_PIPE_COUNT];
    VkPhysicalDeviceMemoryProperties memprops;
    VkDeviceSize     sb_align;  /* minStorageBufferOffsetAlignment */
    struct vk_hostbuf staging;  /* upload and download pass through it */
    struct vk_hostbuf meta;     /* host metadata an op reads (token ids) */
    /* the address table */
    uint8_t         *base;      /* the reserved range (PROT_NONE) */
    size_t           reserve, page, used;
    struct vk_block *blocks;    /* sorted by off */
    int              n_blocks, cap_blocks;
    char             fault[160]; /* the first error an op or transfer met (they return nothing) */
};

/* vk_device.c */
int  dsv4_vk_open_device(struct dsv4_vk *v, int want, struct dsv4_err *err);
void dsv4_vk_close_device(struct dsv4_vk *v);
void dsv4_vk_devices_text(const struct dsv4_vk *v, char *buf, size_t cap);
const char *dsv4_vk_type_name(VkPhysicalDeviceType t);

/* vk_mem.c */
int   dsv4_vk_mem_init(struct dsv4_vk *v, struct dsv4_err *err);
void  dsv4_vk_mem_fini(struct dsv4_vk *v);
void *dsv4_vk_alloc(void *impl, size_t bytes, enum dsv4_mem_kind kind);
void  dsv4_vk_free(void *impl, void *p, size_t bytes);
/* The block holding address p, and p's offset in its buffer; NULL when p is not ours. Call
 * under v->mu. */
const struct vk_block *dsv4_vk_resolve(struct dsv4_vk *v, const void *p, VkDeviceSize *off);
int   dsv4_vk_memory(void *impl, size_t *avail, size_t *total);
int   dsv4_vk_hostbuf(struct dsv4_vk *v, struct vk_hostbuf *h, VkDeviceSize bytes, VkBufferUsageFlags usage);
void  dsv4_vk_hostbuf_free(struct dsv4_vk *v, struct vk_hostbuf *h);
int   dsv4_vk_find_memtype(const struct dsv4_vk *v, uint32_t bits, VkMemoryPropertyFlags want);

/* vk_cmd.c: under v->mu */
bool dsv4_vk_begin(struct dsv4_vk *v);
void dsv4_vk_submit(struct dsv4_vk *v);
void dsv4_vk_wait(struct dsv4_vk *v);
void dsv4_vk_fault(struct dsv4_vk *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void dsv4_vk_upload(void *impl, void *dst, const void *src, size_t bytes);
void dsv4_vk_download(void *impl, void *dst, const void *src, size_t bytes);
void dsv4_vk_copy(void *impl, void *dst, const void *src, size_t bytes);
void dsv4_vk_sync(void *impl);

/* vk_pipe.c: one dispatch of pipeline id over groups x 1 x 1 workgroups, with the buffers
 * bound in order (binding i: buffer bufs[i] from offset offs[i], which the caller aligned to
 * sb_align) and push constants pc; under v->mu, after dsv4_vk_begin. */
struct vk_bind {
    VkBuffer     buf;
    VkDeviceSize off;
};
bool dsv4_vk_dispatch(struct dsv4_vk *v, enum vk_pipe_id id, const struct vk_bind *b, int n_bind, const void *pc,
                      uint32_t pc_bytes, uint32_t groups);
void dsv4_vk_pipes_free(struct dsv4_vk *v);
const char *dsv4_vk_pipe_shader(enum vk_pipe_id id);

/* vk_ops.c */
extern const struct dsv4_backend_ops dsv4_vk_ops;

#endif /* DSV4_VK_H */
