/*
 * vk_device.c - the Vulkan instance, the list of physical devices with the limits `dsv4 ops`
 * prints, the choice of one (option device=N; by default the first discrete or integrated
 * GPU, else the first device, such as Mesa's lavapipe) and the logical device with one
 * compute queue, its command buffer, fence and descriptor pool.
 *
 * The ops that follow the reference in double need shaderFloat64, and tables of pointers
 * (a layer's experts) need buffer device addresses and 64-bit integers (Vulkan 1.2): a device
 * without them is refused at create with the reason, not run with other numerics.
 */
#include <stdio.h>
#include <string.h>

#include "backend/vulkan/vk.h"

const char *dsv4_vk_type_name(VkPhysicalDeviceType t)
{
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated GPU";
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete GPU";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual GPU";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "CPU";
    default: return "other";
    }
}

static void read_info(VkPhysicalDevice pd, struct vk_dev_info *d)
{
    VkPhysicalDeviceMaintenance3Properties m3 = { .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES };
    VkPhysicalDeviceSubgroupProperties sg = { .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES,
                                              .pNext = &m3 };
    VkPhysicalDeviceProperties2        p2 = { .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &sg };
    vkGetPhysicalDeviceProperties2(pd, &p2);
    const VkPhysicalDeviceProperties *p = &p2.properties;
    memcpy(d->name, p->deviceName, sizeof(d->name));
    d->name[sizeof(d->name) - 1] = '\0';
    d->type               = p->deviceType;
    d->api                = p->apiVersion;
    d->max_sb_range       = p->limits.maxStorageBufferRange;
    d->max_wg_invocations = p->limits.maxComputeWorkGroupInvocations;
    d->subgroup           = sg.subgroupSize;
    d->max_alloc          = m3.maxMemoryAllocationSize;
    VkPhysicalDeviceVulkan12Features f12 = { .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES };
    VkPhysicalDeviceFeatures2        f2  = { .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f12 };
    if (VK_API_VERSION_MINOR(p->apiVersion) >= 2 || VK_API_VERSION_MAJOR(p->apiVersion) > 1)
        vkGetPhysicalDeviceFeatures2(pd, &f2);
    else
        vkGetPhysicalDeviceFeatures(pd, &f2.features);
    d->fp64  = f2.features.shaderFloat64;
    d->int64 = f2.features.shaderInt64;
    d->bda   = f12.bufferDeviceAddress;
    VkPhysicalDeviceMemoryProperties m;
    vkGetPhysicalDeviceMemoryProperties(pd, &m);
    d->local_heap = 0;
    for (uint32_t i = 0; i < m.memoryHeapCount; i++)
        if ((m.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) && m.memoryHeaps[i].size > d->local_heap)
            d->local_heap = m.memoryHeaps[i].size;
}

static int make_instance(struct dsv4_vk *v, VkPhysicalDevice *pds, struct dsv4_err *err)
{
    VkApplicationInfo    app = { .sType = VK_STRUCTURE_TYPE_APPLICATION_INFO, .pApplicationName = "dsv4",
                                 .apiVersion = VK_API_VERSION_1_2 };
    VkInstanceCreateInfo ci  = { .sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app };
    VkResult             r   = vkCreateInstance(&ci, NULL, &v->inst);
    if (r != VK_SUCCESS) {
        v->inst = VK_NULL_HANDLE;
        return dsv4_err_set(err, DSV4_EUNSUPPORTED,
                            "vulkan: no Vulkan driver (vkCreateInstance: %d); install one, e.g. "
                            "tools/install_deps.sh test (mesa-vulkan-drivers: lavapipe)", (int)r);
    }
    uint32_t n = VKB_MAX_DEVICES;
    r          = vkEnumeratePhysicalDevices(v->inst, &n, pds);
    if ((r != VK_SUCCESS && r != VK_INCOMPLETE) || n == 0)
        return dsv4_err_set(err, DSV4_EUNSUPPORTED,
                            "vulkan: no Vulkan device; install one, e.g. tools/install_deps.sh test "
                            "(mesa-vulkan-drivers: lavapipe)");
    v->n_dev = (int)n;
    for (int i = 0; i < v->n_dev; i++) read_info(pds[i], &v->dev_info[i]);
    return DSV4_OK;
}

/* The device asked for, else the first GPU, else device 0. */
static int choose(const struct dsv4_vk *v, int want, struct dsv4_err *err)
{
    if (want >= 0) {
        if (want >= v->n_dev)
            return dsv4_err_set(err, DSV4_EINVAL, "vulkan: device=%d, but there %s %d device%s (0 .. %d)", want,
                                v->n_dev == 1 ? "is" : "are", v->n_dev, v->n_dev == 1 ? "" : "s", v->n_dev - 1);
        return want;
    }
    for (int i = 0; i < v->n_dev; i++)
        if (v->dev_info[i].type == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU ||
            v->dev_info[i].type == VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU)
            return i;
    return 0;
}

static int find_compute_queue(VkPhysicalDevice pd, uint32_t *fam)
{
    VkQueueFamilyProperties q[32];
    uint32_t                n = 32;
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, q);
    for (uint32_t i = 0; i < n; i++)
        if (q[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
            *fam = i;
            return 0;
        }
    return -1;
}

int dsv4_vk_pool_add(struct dsv4_vk *v)
{
    if (v->n_pools == VKB_MAX_POOLS) return DSV4_ENOMEM;
    VkDescriptorPoolSize       ps  = { VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, VKB_MAX_SETS * VKB_MAX_BINDINGS };
    VkDescriptorPoolCreateInfo dpi = { .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, .maxSets = VKB_MAX_SETS,
                                       .poolSizeCount = 1, .pPoolSizes = &ps };
    if (vkCreateDescriptorPool(v->dev, &dpi, NULL, &v->dpools[v->n_pools]) != VK_SUCCESS) return DSV4_ENOMEM;
    v->n_pools++;
    return DSV4_OK;
}

/* The logical device, its queue, command buffer, fence and descriptor pool. */
static int make_device(struct dsv4_vk *v, struct dsv4_err *err)
{
    float                   prio = 1.0f;
    VkDeviceQueueCreateInfo qci  = { .sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, .queueFamilyIndex = v->qfam,
                                     .queueCount = 1, .pQueuePriorities = &prio };
    VkPhysicalDeviceVulkan12Features f12 = { .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
                                             .bufferDeviceAddress = VK_TRUE };
    VkPhysicalDeviceFeatures2 f2 = { .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f12,
                                     .features = { .shaderFloat64 = VK_TRUE, .shaderInt64 = VK_TRUE } };
    VkDeviceCreateInfo        dci = { .sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .pNext = &f2,
                                      .queueCreateInfoCount = 1, .pQueueCreateInfos = &qci };
    VkResult                 r    = vkCreateDevice(v->phys, &dci, NULL, &v->dev);
    if (r != VK_SUCCESS) {
        v->dev = VK_NULL_HANDLE;
        return dsv4_err_set(err, DSV4_EUNSUPPORTED, "vulkan: cannot create the device (vkCreateDevice: %d)", (int)r);
    }
    vkGetDeviceQueue(v->dev, v->qfam, 0, &v->queue);
    VkCommandPoolCreateInfo pci = { .sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                    .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                    .queueFamilyIndex = v->qfam };
    VkFenceCreateInfo       fci = { .sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO };
    if (vkCreateCommandPool(v->dev, &pci, NULL, &v->pool) != VK_SUCCESS ||
        vkCreateFence(v->dev, &fci, NULL, &v->fence) != VK_SUCCESS || dsv4_vk_pool_add(v))
        return dsv4_err_set(err, DSV4_ENOMEM, "vulkan: cannot create the command pool, fence or descriptor pool");
    VkCommandBufferAllocateInfo ai = { .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = v->pool,
                                       .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1 };
    if (vkAllocateCommandBuffers(v->dev, &ai, &v->cmd) != VK_SUCCESS)
        return dsv4_err_set(err, DSV4_ENOMEM, "vulkan: cannot allocate a command buffer");
    return DSV4_OK;
}

int dsv4_vk_open_device(struct dsv4_vk *v, int want, struct dsv4_err *err)
{
    VkPhysicalDevice pds[VKB_MAX_DEVICES];
    int              rc = make_instance(v, pds, err);
    if (rc) return rc;
    int i = choose(v, want, err);
    if (i < 0) return i;
    v->chosen                      = i;
    v->phys                        = pds[i];
    const struct vk_dev_info *info = &v->dev_info[i];
    if (!info->fp64)
        return dsv4_err_set(err, DSV4_EUNSUPPORTED,
                            "vulkan: device %d (%s) lacks shaderFloat64, which the ops need to round as the "
                            "reference does (docs/BACKENDS.md)", i, info->name);
    if (!info->bda || !info->int64 || (VK_API_VERSION_MAJOR(info->api) == 1 && VK_API_VERSION_MINOR(info->api) < 2))
        return dsv4_err_set(err, DSV4_EUNSUPPORTED,
                            "vulkan: device %d (%s) lacks Vulkan 1.2 with bufferDeviceAddress and shaderInt64, "
                            "which the ops' tables of pointers need (docs/BACKENDS.md)", i, info->name);
    if (find_compute_queue(v->phys, &v->qfam))
        return dsv4_err_set(err, DSV4_EUNSUPPORTED, "vulkan: device %d (%s) has no compute queue", i, info->name);
    VkPhysicalDeviceProperties p;
    vkGetPhysicalDeviceProperties(v->phys, &p);
    v->sb_align = p.limits.minStorageBufferOffsetAlignment ? p.limits.minStorageBufferOffsetAlignment : 1;
    /* a GPU wants wide workgroups; a CPU device (lavapipe) runs 8 invocations at a time and pays
     * a switch per further 8 at every barrier: a projection 3x slower at 64 than at 8 */
    v->lin_nt = info->type == VK_PHYSICAL_DEVICE_TYPE_CPU ? 8 : 64;
    vkGetPhysicalDeviceMemoryProperties(v->phys, &v->memprops);
    return make_device(v, err);
}

void dsv4_vk_close_device(struct dsv4_vk *v)
{
    if (v->dev) {
        vkDeviceWaitIdle(v->dev);
        dsv4_vk_pipes_free(v);
        for (int i = 0; i < v->n_pools; i++) vkDestroyDescriptorPool(v->dev, v->dpools[i], NULL);
        v->n_pools = 0;
        if (v->fence) vkDestroyFence(v->dev, v->fence, NULL);
        if (v->pool) vkDestroyCommandPool(v->dev, v->pool, NULL);
        vkDestroyDevice(v->dev, NULL);
    }
    if (v->inst) vkDestroyInstance(v->inst, NULL);
    v->dev  = VK_NULL_HANDLE;
    v->inst = VK_NULL_HANDLE;
}

/* One line per device, the chosen one marked: what `dsv4 ops --backend vulkan` prints. */
void dsv4_vk_devices_text(const struct dsv4_vk *v, char *buf, size_t cap)
{
    size_t at = 0;
    if (cap) buf[0] = '\0';
    for (int i = 0; i < v->n_dev && at < cap; i++) {
        const struct vk_dev_info *d = &v->dev_info[i];
        int n = snprintf(buf + at, cap - at,
                         "%s device %d: %s (%s), Vulkan %u.%u.%u, maxStorageBufferRange %u, "
                         "maxMemoryAllocationSize %.2f GB, maxComputeWorkGroupInvocations %u, subgroup %u, "
                         "shaderFloat64 %s, bufferDeviceAddress %s, device-local heap %.2f GB\n",
                         i == v->chosen ? "*" : " ", i, d->name, dsv4_vk_type_name(d->type), VK_API_VERSION_MAJOR(d->api),
                         VK_API_VERSION_MINOR(d->api), VK_API_VERSION_PATCH(d->api), d->max_sb_range,
                         (double)d->max_alloc / 1e9, d->max_wg_invocations, d->subgroup, d->fp64 ? "yes" : "no",
                         d->bda ? "yes" : "no", (double)d->local_heap / 1e9);
        if (n < 0) break;
        at += (size_t)n;
    }
}
