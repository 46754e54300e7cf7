/*
 * vk_mem.c - the Vulkan backend's memory as addresses (docs/BACKENDS.md, "Backend memory is
 * addressed, never dereferenced"): a range of host address space reserved with no access
 * (PROT_NONE, nothing committed), so that a host read or write of an address alloc handed
 * out faults; one block of it per allocation, backed by its own VkBuffer and VkDeviceMemory;
 * a table of the blocks sorted by address, so that any address inside one resolves to
 * (buffer, offset) by binary search.
 *
 * Each buffer also has a device address (shaders reach it through GL_EXT_buffer_reference).
 * One buffer per allocation is the simplest thing that is right; sub-allocating large
 * buffers (fewer vkAllocateMemory calls, which some drivers cap at 4096) is later work.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/vulkan/vk.h"

/* Address space reserved at create: no memory is committed, so it only bounds what alloc
 * can hand out; halved where the system refuses that much (ulimit -v, sanitizers). */
#define VKB_RESERVE ((size_t)256 << 30)

int dsv4_vk_mem_init(struct dsv4_vk *v, struct dsv4_err *err)
{
    v->page = (size_t)sysconf(_SC_PAGESIZE);
    for (size_t r = VKB_RESERVE; r >= ((size_t)1 << 30); r /= 2) {
        void *p = mmap(NULL, r, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) continue;
        v->base    = p;
        v->reserve = r;
        return DSV4_OK;
    }
    return dsv4_err_set(err, DSV4_ENOMEM, "vulkan: cannot reserve address space for the device's buffers");
}

static void block_release(struct dsv4_vk *v, struct vk_block *b)
{
    vkDestroyBuffer(v->dev, b->buf, NULL);
    vkFreeMemory(v->dev, b->mem, NULL);
}

void dsv4_vk_mem_fini(struct dsv4_vk *v)
{
    for (int i = 0; i < v->n_blocks; i++) block_release(v, &v->blocks[i]);
    free(v->blocks);
    v->blocks   = NULL;
    v->n_blocks = 0;
    if (v->base) munmap(v->base, v->reserve);
    v->base = NULL;
}

int dsv4_vk_find_memtype(const struct dsv4_vk *v, uint32_t bits, VkMemoryPropertyFlags want)
{
    for (uint32_t i = 0; i < v->memprops.memoryTypeCount; i++)
        if ((bits & (1u << i)) && (v->memprops.memoryTypes[i].propertyFlags & want) == want) return (int)i;
    return -1;
}

/* A buffer of `bytes` on memory with the wanted properties (device-local preferred where
 * `local`); false when the device refuses. */
static bool make_buffer(struct dsv4_vk *v, VkDeviceSize bytes, VkBufferUsageFlags usage, bool host, VkBuffer *buf,
                        VkDeviceMemory *mem)
{
    usage |= VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT;
    VkBufferCreateInfo bci = { .sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .size = bytes, .usage = usage,
                               .sharingMode = VK_SHARING_MODE_EXCLUSIVE };
    if (vkCreateBuffer(v->dev, &bci, NULL, buf) != VK_SUCCESS) return false;
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(v->dev, *buf, &req);
    VkMemoryPropertyFlags want = host ? VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
                                      : VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
    int type = dsv4_vk_find_memtype(v, req.memoryTypeBits, want);
    if (type < 0 && !host) type = dsv4_vk_find_memtype(v, req.memoryTypeBits, 0);
    VkMemoryAllocateFlagsInfo fi  = { .sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO,
                                      .flags = VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT };
    VkMemoryAllocateInfo      mai = { .sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .pNext = &fi,
                                      .allocationSize = req.size, .memoryTypeIndex = (uint32_t)type };
    if (type < 0 || vkAllocateMemory(v->dev, &mai, NULL, mem) != VK_SUCCESS) {
        vkDestroyBuffer(v->dev, *buf, NULL);
        return false;
    }
    if (vkBindBufferMemory(v->dev, *buf, *mem, 0) != VK_SUCCESS) {
        vkDestroyBuffer(v->dev, *buf, NULL);
        vkFreeMemory(v->dev, *mem, NULL);
        return false;
    }
    return true;
}

static VkDeviceAddress address_of(struct dsv4_vk *v, VkBuffer buf)
{
    VkBufferDeviceAddressInfo ai = { .sType = VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO, .buffer = buf };
    return vkGetBufferDeviceAddress(v->dev, &ai);
}

int dsv4_vk_hostbuf(struct dsv4_vk *v, struct vk_hostbuf *h, VkDeviceSize bytes, VkBufferUsageFlags usage)
{
    if (!make_buffer(v, bytes, usage, true, &h->buf, &h->mem)) return DSV4_ENOMEM;
    if (vkMapMemory(v->dev, h->mem, 0, VK_WHOLE_SIZE, 0, &h->map) != VK_SUCCESS) {
        vkDestroyBuffer(v->dev, h->buf, NULL);
        vkFreeMemory(v->dev, h->mem, NULL);
        return DSV4_ENOMEM;
    }
    h->bytes = bytes;
    h->used  = 0;
    h->dva   = address_of(v, h->buf);
    return DSV4_OK;
}

void dsv4_vk_hostbuf_free(struct dsv4_vk *v, struct vk_hostbuf *h)
{
    if (!h->buf) return;
    vkUnmapMemory(v->dev, h->mem);
    vkDestroyBuffer(v->dev, h->buf, NULL);
    vkFreeMemory(v->dev, h->mem, NULL);
    memset(h, 0, sizeof(*h));
}

/* Where a block of len bytes fits: the first gap between blocks (the table is sorted), else
 * after the last; sets *at to its index in the table. (size_t)-1 when the range is full. */
static size_t find_gap(const struct dsv4_vk *v, size_t len, int *at)
{
    size_t prev_end = 0;
    for (int i = 0; i < v->n_blocks; i++) {
        if (v->blocks[i].off - prev_end >= len) {
            *at = i;
            return prev_end;
        }
        prev_end = v->blocks[i].off + v->blocks[i].len;
    }
    *at = v->n_blocks;
    return v->reserve - prev_end >= len ? prev_end : (size_t)-1;
}

static bool insert_block(struct dsv4_vk *v, int at, struct vk_block b)
{
    if (v->n_blocks == v->cap_blocks) {
        int              nc = v->cap_blocks ? 2 * v->cap_blocks : 64;
        struct vk_block *nb = realloc(v->blocks, sizeof(*nb) * (size_t)nc);
        if (!nb) return false;
        v->blocks     = nb;
        v->cap_blocks = nc;
    }
    memmove(&v->blocks[at + 1], &v->blocks[at], sizeof(*v->blocks) * (size_t)(v->n_blocks - at));
    v->blocks[at] = b;
    v->n_blocks++;
    return true;
}

/* Zero-fills a new buffer on the queue (alloc's contract: zero-filled), recorded before
 * whatever uses it next. */
static bool zero_fill(struct dsv4_vk *v, VkBuffer buf)
{
    if (!dsv4_vk_record(v)) return false;
    vkCmdFillBuffer(v->cmd, buf, 0, VK_WHOLE_SIZE, 0);
    dsv4_vk_barrier(v);
    return true;
}

void *dsv4_vk_alloc(void *impl, size_t bytes, enum dsv4_mem_kind kind)
{
    (void)kind;
    struct dsv4_vk *v   = impl;
    size_t          len = (bytes + v->page - 1) / v->page * v->page;
    if (!len) len = v->page;
    /* one block is one device allocation; larger tensors are split by whoever allocates them */
    if (len > v->dev_info[v->chosen].max_alloc) return NULL;
    pthread_mutex_lock(&v->mu);
    int    at;
    size_t off = find_gap(v, len, &at);
    struct vk_block b = { .off = off, .len = len };
    VkBufferUsageFlags usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                               VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    bool ok = off != (size_t)-1 && make_buffer(v, len, usage, false, &b.buf, &b.mem);
    if (ok) b.dva = address_of(v, b.buf);
    if (ok && (!zero_fill(v, b.buf) || !insert_block(v, at, b))) {
        dsv4_vk_finish(v);
        block_release(v, &b);
        ok = false;
    }
    if (ok) v->used += len;
    pthread_mutex_unlock(&v->mu);
    return ok ? v->base + off : NULL;
}

/* The index of the block holding address p, or -1. */
static int block_of(const struct dsv4_vk *v, const void *p)
{
    const uint8_t *a = p;
    if (!p || a < v->base || a >= v->base + v->reserve) return -1;
    size_t off = (size_t)(a - v->base);
    int    lo = 0, hi = v->n_blocks - 1;
    while (lo <= hi) {
        int                    mid = (lo + hi) / 2;
        const struct vk_block *b   = &v->blocks[mid];
        if (off < b->off) hi = mid - 1;
        else if (off >= b->off + b->len) lo = mid + 1;
        else return mid;
    }
    return -1;
}

const struct vk_block *dsv4_vk_resolve(struct dsv4_vk *v, const void *p, VkDeviceSize *off)
{
    int i = block_of(v, p);
    if (i < 0) return NULL;
    *off = (VkDeviceSize)((const uint8_t *)p - v->base) - v->blocks[i].off;
    return &v->blocks[i];
}

void dsv4_vk_free(void *impl, void *p, size_t bytes)
{
    (void)bytes;
    struct dsv4_vk *v = impl;
    if (!p) return;
    pthread_mutex_lock(&v->mu);
    int i = block_of(v, p);
    if (i < 0 || (uint8_t *)p != v->base + v->blocks[i].off) {
        dsv4_vk_fault(v, "free of %p, which is not the start of one of its buffers", p);
    } else {
        dsv4_vk_finish(v); /* what is recorded or in flight may still use it */
        block_release(v, &v->blocks[i]);
        v->used -= v->blocks[i].len;
        memmove(&v->blocks[i], &v->blocks[i + 1], sizeof(*v->blocks) * (size_t)(v->n_blocks - i - 1));
        v->n_blocks--;
    }
    pthread_mutex_unlock(&v->mu);
}

/* The device-local heap: in all, and less what this backend has allocated (without
 * VK_EXT_memory_budget, other users of the device are not seen). */
int dsv4_vk_memory(void *impl, size_t *avail, size_t *total)
{
    struct dsv4_vk *v    = impl;
    size_t          heap = (size_t)v->dev_info[v->chosen].local_heap;
    if (!heap) return DSV4_EUNSUPPORTED;
    pthread_mutex_lock(&v->mu);
    *total = heap;
    *avail = v->used < heap ? heap - v->used : 0;
    pthread_mutex_unlock(&v->mu);
    return DSV4_OK;
}
