/* Vulkan instance, physical device enumeration/selection and logical device. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gpu/gpu_internal.h"

int vks_vk_error(VkResult r, const char *what) {
    if (r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY)
        return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory (VkResult %d)", what, (int)r);
    return vks_set_error(VKS_ERR_GPU, "%s failed (VkResult %d)", what, (int)r);
}

const char *vks_vendor_name(vks_vendor v) {
    static const char *names[] = {"other", "NVIDIA", "AMD", "Intel", "Mesa CPU"};
    return (unsigned)v < 5 ? names[v] : "other";
}

const char *vks_device_type_name(vks_device_type t) {
    static const char *names[] = {"other", "integrated", "discrete", "virtual", "cpu"};
    return (unsigned)t < 5 ? names[t] : "other";
}

static vks_vendor vendor_from_props(const VkPhysicalDeviceProperties *p) {
    if (p->deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU) return VKS_VENDOR_MESA_CPU;
    switch (p->vendorID) {
    case 0x10DE: return VKS_VENDOR_NVIDIA;
    case 0x1002: case 0x1022: return VKS_VENDOR_AMD;
    case 0x8086: return VKS_VENDOR_INTEL;
    default: return VKS_VENDOR_OTHER;
    }
}

static vks_device_type type_from_props(VkPhysicalDeviceType t) {
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return VKS_DEVTYPE_INTEGRATED;
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return VKS_DEVTYPE_DISCRETE;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return VKS_DEVTYPE_VIRTUAL;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return VKS_DEVTYPE_CPU;
    default: return VKS_DEVTYPE_OTHER;
    }
}

static uint64_t device_local_bytes(VkPhysicalDevice pd) {
    VkPhysicalDeviceMemoryProperties mp;
    vkGetPhysicalDeviceMemoryProperties(pd, &mp);
    uint64_t best = 0;
    for (uint32_t i = 0; i < mp.memoryHeapCount; i++)
        if ((mp.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) && mp.memoryHeaps[i].size > best)
            best = mp.memoryHeaps[i].size;
    return best;
}

static int compute_queue_family(VkPhysicalDevice pd, uint32_t *family, uint32_t *ts_bits) {
    uint32_t n = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, NULL);
    VkQueueFamilyProperties q[32];
    if (n > 32) n = 32;
    vkGetPhysicalDeviceQueueFamilyProperties(pd, &n, q);
    for (uint32_t i = 0; i < n; i++) {
        if (q[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
            *family = i;
            *ts_bits = q[i].timestampValidBits;
            return 0;
        }
    }
    return -1;
}

static bool has_extension(VkPhysicalDevice pd, const char *name) {
    uint32_t n = 0;
    if (vkEnumerateDeviceExtensionProperties(pd, NULL, &n, NULL) != VK_SUCCESS || n == 0 || n > 4096) return false;
    VkExtensionProperties *e = malloc(n * sizeof *e);
    bool found = false;
    if (e && vkEnumerateDeviceExtensionProperties(pd, NULL, &n, e) == VK_SUCCESS)
        for (uint32_t i = 0; i < n && !found; i++) found = strcmp(e[i].extensionName, name) == 0;
    free(e);
    return found;
}

/* The required subgroup size: the reported default (what the kernels are sized
 * for), where the device lets compute pipelines require it; else 0. */
static void describe_subgroup_control(const VkPhysicalDeviceSubgroupSizeControlFeaturesEXT *f,
                                      const VkPhysicalDeviceSubgroupSizeControlPropertiesEXT *p,
                                      vks_device_info *info) {
    info->subgroup_min = p->minSubgroupSize;
    info->subgroup_max = p->maxSubgroupSize;
    info->max_workgroup_subgroups = p->maxComputeWorkgroupSubgroups;
    uint32_t s = info->subgroup_size;
    bool pow2 = s && (s & (s - 1)) == 0;
    if (f->subgroupSizeControl && (p->requiredSubgroupSizeStages & VK_SHADER_STAGE_COMPUTE_BIT) && pow2 &&
        s >= p->minSubgroupSize && s <= p->maxSubgroupSize) {
        info->subgroup_required = s;
        info->full_subgroups = f->computeFullSubgroups;
    }
}

static void describe_device(VkPhysicalDevice pd, int index, vks_device_info *info) {
    bool sg_control = has_extension(pd, VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME);
    VkPhysicalDeviceSubgroupSizeControlFeaturesEXT fsc = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES_EXT};
    VkPhysicalDeviceSubgroupSizeControlPropertiesEXT psc = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES_EXT};
    VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
                                            .pNext = sg_control ? &fsc : NULL};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f12};
    VkPhysicalDeviceSubgroupProperties sg = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES,
                                             .pNext = sg_control ? &psc : NULL};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &sg};
    vkGetPhysicalDeviceProperties2(pd, &p2);
    const VkPhysicalDeviceProperties *p = &p2.properties;
    bool v12 = p->apiVersion >= VK_API_VERSION_1_2;
    if (v12) vkGetPhysicalDeviceFeatures2(pd, &f2);
    memset(info, 0, sizeof *info);
    info->index = index;
    snprintf(info->name, sizeof info->name, "%s", p->deviceName);
    info->vendor = vendor_from_props(p);
    info->type = type_from_props(p->deviceType);
    info->device_local_bytes = device_local_bytes(pd);
    info->fp16_arith = v12 && f12.shaderFloat16;
    info->int8_arith = v12 && f12.shaderInt8;
    info->subgroup_size = sg.subgroupSize ? sg.subgroupSize : 1;
    info->subgroup_arith = (sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                           (sg.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT);
    info->subgroup_ballot = (sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                            (sg.supportedOperations & VK_SUBGROUP_FEATURE_BALLOT_BIT);
    info->subgroup_shuffle = (sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                             (sg.supportedOperations & VK_SUBGROUP_FEATURE_SHUFFLE_BIT);
    if (sg_control && v12) describe_subgroup_control(&fsc, &psc, info);
    info->max_shared_bytes = p->limits.maxComputeSharedMemorySize;
    info->max_storage_range = p->limits.maxStorageBufferRange;
    info->max_workgroup_count_x = p->limits.maxComputeWorkGroupCount[0];
    info->max_workgroup_size_x = p->limits.maxComputeWorkGroupSize[0];
    info->min_storage_align = (uint32_t)p->limits.minStorageBufferOffsetAlignment;
    info->api_version = p->apiVersion;
    info->timestamp_period_ns = p->limits.timestampPeriod;
    uint32_t fam, ts_bits = 0;
    info->timestamps = compute_queue_family(pd, &fam, &ts_bits) == 0 && ts_bits > 0 &&
                       p->limits.timestampComputeAndGraphics;
}

static int create_instance(bool validation, VkInstance *out) {
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO, .pApplicationName = "vkswarm",
                             .apiVersion = VK_API_VERSION_1_2};
    const char *layers[] = {"VK_LAYER_KHRONOS_validation"};
    const char *exts[] = {VK_EXT_DEBUG_UTILS_EXTENSION_NAME, VK_EXT_VALIDATION_FEATURES_EXTENSION_NAME};
    /* synchronization validation too (VKSWARM_VALIDATION_SYNC=0: off): the
     * recorder puts barriers only between commands that depend on each other
     * (cmd.c order_accesses) */
    VkValidationFeatureEnableEXT enables[] = {VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT};
    VkValidationFeaturesEXT features = {.sType = VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT,
                                        .enabledValidationFeatureCount = 1, .pEnabledValidationFeatures = enables};
    VkInstanceCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app};
    if (validation) {
        const char *sync = getenv("VKSWARM_VALIDATION_SYNC"); /* "0": without synchronization validation */
        if (!sync || strcmp(sync, "0")) ci.pNext = &features;
        ci.enabledLayerCount = 1;
        ci.ppEnabledLayerNames = layers;
        ci.enabledExtensionCount = 2;
        ci.ppEnabledExtensionNames = exts;
    }
    VkResult r = vkCreateInstance(&ci, NULL, out);
    if (r == VK_ERROR_LAYER_NOT_PRESENT)
        return vks_set_error(VKS_ERR_GPU, "Vulkan validation layer requested but not installed "
                                          "(package vulkan-validationlayers)");
    if (r == VK_ERROR_INCOMPATIBLE_DRIVER)
        return vks_set_error(VKS_ERR_GPU, "no Vulkan driver found (install mesa-vulkan-drivers or a GPU driver)");
    return r == VK_SUCCESS ? VKS_OK : vks_vk_error(r, "vkCreateInstance");
}

static int enumerate(VkInstance inst, VkPhysicalDevice *pds, uint32_t *n) {
    VkResult r = vkEnumeratePhysicalDevices(inst, n, pds);
    if (r != VK_SUCCESS && r != VK_INCOMPLETE) return vks_vk_error(r, "vkEnumeratePhysicalDevices");
    return VKS_OK;
}

int vks_gpu_list(vks_device_info *out, int max, int *count) {
    if (!count || max < 0 || (max > 0 && !out)) return vks_set_error(VKS_ERR_ARG, "vks_gpu_list: bad arguments");
    VkInstance inst;
    int rc = create_instance(false, &inst);
    if (rc) return rc;
    VkPhysicalDevice pds[16];
    uint32_t n = 16;
    rc = enumerate(inst, pds, &n);
    if (rc == VKS_OK) {
        for (uint32_t i = 0; i < n && (int)i < max; i++) describe_device(pds[i], (int)i, &out[i]);
        *count = (int)n;
    }
    vkDestroyInstance(inst, NULL);
    return rc;
}

int vks_gpu_default_index(const vks_device_info *devs, int n) {
    static const vks_device_type order[] = {VKS_DEVTYPE_DISCRETE, VKS_DEVTYPE_INTEGRATED,
                                            VKS_DEVTYPE_VIRTUAL, VKS_DEVTYPE_CPU, VKS_DEVTYPE_OTHER};
    for (int o = 0; o < 5; o++) {
        int best = -1;
        for (int i = 0; i < n; i++) {
            if (devs[i].type != order[o] || devs[i].api_version < VK_API_VERSION_1_2) continue;
            if (best < 0 || devs[i].device_local_bytes > devs[best].device_local_bytes) best = i;
        }
        if (best >= 0) return best;
    }
    return n > 0 ? 0 : -1;
}

static VkBool32 VKAPI_PTR on_validation_message(VkDebugUtilsMessageSeverityFlagBitsEXT sev,
                                                VkDebugUtilsMessageTypeFlagsEXT type,
                                                const VkDebugUtilsMessengerCallbackDataEXT *data,
                                                void *user) {
    (void)type;
    vks_gpu *g = user;
    if (sev >= VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) {
        g->validation_messages++;
        fprintf(stderr, "vkswarm: validation: %s\n", data->pMessage ? data->pMessage : "(no text)");
    }
    return VK_FALSE;
}

static int create_messenger(vks_gpu *g) {
    PFN_vkCreateDebugUtilsMessengerEXT create = (PFN_vkCreateDebugUtilsMessengerEXT)vkGetInstanceProcAddr(
        g->instance, "vkCreateDebugUtilsMessengerEXT");
    if (!create) return vks_set_error(VKS_ERR_GPU, "VK_EXT_debug_utils not available");
    VkDebugUtilsMessengerCreateInfoEXT ci = {
        .sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT,
        .messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT |
                           VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT,
        .messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                       VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                       VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT,
        .pfnUserCallback = on_validation_message,
        .pUserData = g};
    VkResult r = create(g->instance, &ci, NULL, &g->messenger);
    return r == VK_SUCCESS ? VKS_OK : vks_vk_error(r, "vkCreateDebugUtilsMessengerEXT");
}

static int pick_device_index(const vks_gpu_options *opt, const vks_device_info *infos, int n) {
    int idx = opt->device_index;
    const char *env = getenv("VKSWARM_DEVICE");
    if (idx < 0 && env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (*end || v < 0 || v > 64) return vks_set_error(VKS_ERR_ARG, "VKSWARM_DEVICE=%s: not a device index", env);
        idx = (int)v;
    }
    if (idx < 0) idx = vks_gpu_default_index(infos, n);
    if (idx < 0 || idx >= n)
        return vks_set_error(VKS_ERR_ARG, "device %d does not exist (%d Vulkan device(s); see `vkswarm devices`)", idx, n);
    if (infos[idx].api_version < VK_API_VERSION_1_2)
        return vks_set_error(VKS_ERR_GPU, "device %d (%s) supports only Vulkan %u.%u; 1.2 is needed", idx,
                             infos[idx].name, VK_API_VERSION_MAJOR(infos[idx].api_version),
                             VK_API_VERSION_MINOR(infos[idx].api_version));
    return idx;
}

static int create_logical_device(vks_gpu *g) {
    uint32_t ts_bits;
    if (compute_queue_family(g->phys, &g->queue_family, &ts_bits))
        return vks_set_error(VKS_ERR_GPU, "device %s has no compute queue", g->info.name);
    float prio = 1.0f;
    VkDeviceQueueCreateInfo qci = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                   .queueFamilyIndex = g->queue_family, .queueCount = 1,
                                   .pQueuePriorities = &prio};
    /* Half types in shaders (the *_h kernel variants' half tiles) need the feature
     * enabled, not just present. */
    /* Subgroup size control: the extension and its features, where pipelines
     * will require the size (describe_subgroup_control). */
    VkPhysicalDeviceSubgroupSizeControlFeaturesEXT fsc = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES_EXT,
        .subgroupSizeControl = VK_TRUE, .computeFullSubgroups = g->info.full_subgroups ? VK_TRUE : VK_FALSE};
    bool sg_control = g->info.subgroup_required != 0;
    VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
                                            .pNext = sg_control ? &fsc : NULL,
                                            .shaderFloat16 = g->info.fp16_arith ? VK_TRUE : VK_FALSE};
    const char *exts[] = {VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME};
    VkDeviceCreateInfo dci = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .pNext = &f12,
                              .queueCreateInfoCount = 1, .pQueueCreateInfos = &qci,
                              .enabledExtensionCount = sg_control ? 1 : 0, .ppEnabledExtensionNames = exts};
    VkResult r = vkCreateDevice(g->phys, &dci, NULL, &g->dev);
    if (r != VK_SUCCESS) return vks_vk_error(r, "vkCreateDevice");
    vkGetDeviceQueue(g->dev, g->queue_family, 0, &g->queue);
    VkCommandPoolCreateInfo pci = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                   .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                   .queueFamilyIndex = g->queue_family};
    r = vkCreateCommandPool(g->dev, &pci, NULL, &g->pool);
    if (r != VK_SUCCESS) return vks_vk_error(r, "vkCreateCommandPool");
    VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    r = vkCreateFence(g->dev, &fci, NULL, &g->fence);
    if (r != VK_SUCCESS) return vks_vk_error(r, "vkCreateFence");
    return VKS_OK;
}

/* VKSWARM_DEVICE_MEMORY=N[K|M|G] caps the device memory our accounting
 * offers (vks_gpu_free_bytes): a smaller device for tests and plans, or a
 * share of a GPU used by others. */
static int cap_heap(vks_gpu *g) {
    const char *env = getenv("VKSWARM_DEVICE_MEMORY");
    if (!env || !*env) return VKS_OK;
    char *end = NULL;
    errno = 0;
    unsigned long long n = strtoull(env, &end, 10);
    int shift = *end == 'K' ? 10 : *end == 'M' ? 20 : *end == 'G' ? 30 : 0;
    if (shift) end++;
    if (errno || end == env || *end || env[0] == '-' || n > (UINT64_MAX >> shift))
        return vks_set_error(VKS_ERR_ARG, "VKSWARM_DEVICE_MEMORY '%.40s' is not a byte count (N, NK, NM or NG)", env);
    uint64_t cap = (uint64_t)n << shift;
    if (cap < g->heap_bytes) g->heap_bytes = cap;
    return VKS_OK;
}

static int choose_memory_types(vks_gpu *g) {
    VkPhysicalDeviceMemoryProperties mp;
    vkGetPhysicalDeviceMemoryProperties(g->phys, &mp);
    int rc = vks_gpu_find_memory(g, ~0u, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, &g->device_mem_type);
    if (rc) rc = vks_gpu_find_memory(g, ~0u, 0, &g->device_mem_type);
    if (rc) return rc;
    /* staging: cached where offered (the host reads results back from it) */
    VkMemoryPropertyFlags host = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    rc = vks_gpu_find_memory(g, ~0u, host | VK_MEMORY_PROPERTY_HOST_CACHED_BIT, &g->host_mem_type);
    if (rc) rc = vks_gpu_find_memory(g, ~0u, host, &g->host_mem_type);
    if (rc) return rc;
    g->heap_bytes = mp.memoryHeaps[mp.memoryTypes[g->device_mem_type].heapIndex].size;
    return cap_heap(g);
}

int vks_gpu_find_memory(const vks_gpu *g, uint32_t type_bits, VkMemoryPropertyFlags want, uint32_t *out) {
    VkPhysicalDeviceMemoryProperties mp;
    vkGetPhysicalDeviceMemoryProperties(g->phys, &mp);
    for (uint32_t i = 0; i < mp.memoryTypeCount; i++) {
        if ((type_bits & (1u << i)) && (mp.memoryTypes[i].propertyFlags & want) == want) {
            *out = i;
            return VKS_OK;
        }
    }
    return vks_set_error(VKS_ERR_GPU, "no Vulkan memory type with flags 0x%x", (unsigned)want);
}

static int create_query_pool(vks_gpu *g) {
    if (!g->profile) return VKS_OK;
    if (!g->info.timestamps) {
        fprintf(stderr, "vkswarm: --profile: device has no compute timestamps; profile disabled\n");
        g->profile = false;
        return VKS_OK;
    }
    VkQueryPoolCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                                .queryType = VK_QUERY_TYPE_TIMESTAMP, .queryCount = VKS_MAX_TIMESTAMPS};
    VkResult r = vkCreateQueryPool(g->dev, &ci, NULL, &g->query_pool);
    return r == VK_SUCCESS ? VKS_OK : vks_vk_error(r, "vkCreateQueryPool");
}

int vks_gpu_create(const vks_gpu_options *opt, vks_gpu **out) {
    if (!opt || !out) return vks_set_error(VKS_ERR_ARG, "vks_gpu_create: NULL argument");
    *out = NULL;
    vks_gpu *g = calloc(1, sizeof *g);
    if (!g) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    g->profile = opt->profile;
    int rc = create_instance(opt->validation, &g->instance);
    if (rc) { free(g); return rc; }
    if (opt->validation && (rc = create_messenger(g))) goto fail;
    VkPhysicalDevice pds[16];
    uint32_t n = 16;
    if ((rc = enumerate(g->instance, pds, &n))) goto fail;
    vks_device_info infos[16];
    for (uint32_t i = 0; i < n; i++) describe_device(pds[i], (int)i, &infos[i]);
    int idx = pick_device_index(opt, infos, (int)n);
    if (idx < 0) { rc = idx; goto fail; }
    g->phys = pds[idx];
    g->info = infos[idx];
    if ((rc = create_logical_device(g)) || (rc = choose_memory_types(g)) || (rc = create_query_pool(g)))
        goto fail;
    *out = g;
    return VKS_OK;
fail:
    vks_gpu_destroy(g);
    return rc;
}

void vks_gpu_destroy(vks_gpu *g) {
    if (!g) return;
    if (g->dev) {
        vkDeviceWaitIdle(g->dev);
        vks_kernel_cache_destroy(g);
        if (g->staging.buf) {
            vkDestroyBuffer(g->dev, g->staging.buf, NULL);
            vkFreeMemory(g->dev, g->staging.mem, NULL);
        }
        if (g->query_pool) vkDestroyQueryPool(g->dev, g->query_pool, NULL);
        if (g->fence) vkDestroyFence(g->dev, g->fence, NULL);
        if (g->pool) vkDestroyCommandPool(g->dev, g->pool, NULL);
        vkDestroyDevice(g->dev, NULL);
    }
    if (g->messenger) {
        PFN_vkDestroyDebugUtilsMessengerEXT destroy = (PFN_vkDestroyDebugUtilsMessengerEXT)vkGetInstanceProcAddr(
            g->instance, "vkDestroyDebugUtilsMessengerEXT");
        if (destroy) destroy(g->instance, g->messenger, NULL);
    }
    if (g->instance) vkDestroyInstance(g->instance, NULL);
    free(g);
}

const vks_device_info *vks_gpu_info(const vks_gpu *g) { return g ? &g->info : NULL; }
int vks_gpu_validation_messages(const vks_gpu *g) { return g ? g->validation_messages : 0; }
uint64_t vks_gpu_free_bytes(const vks_gpu *g) {
    return g && g->heap_bytes > g->allocated_bytes ? g->heap_bytes - g->allocated_bytes : 0;
}
uint64_t vks_gpu_peak_bytes(const vks_gpu *g) { return g ? g->peak_bytes : 0; }
void vks_gpu_reset_peak(vks_gpu *g) {
    if (g) g->peak_bytes = g->allocated_bytes;
}
