/* Private structures of the Vulkan runtime (src/gpu only). */
#ifndef VKS_GPU_INTERNAL_H
#define VKS_GPU_INTERNAL_H
#include <vulkan/vulkan.h>
#include "vkswarm/vks_gpu.h"

#define VKS_MAX_BINDINGS 9 /* grpo_loss (gspo); every desktop driver allows >= 200 storage buffers per stage (lavapipe, Intel, AMD, NVIDIA) */
#define VKS_MAX_SPEC 8
#define VKS_MAX_PROFILE_LABELS 64
#define VKS_MAX_TIMESTAMPS 8192
#define VKS_SETS_PER_POOL 256
#define VKS_MAX_PENDING 64 /* accesses tracked between barriers; more: a barrier */
#define VKS_MAX_POOLS 64 /* per command buffer: a one-shot vks_cmd submits and goes on after 64 x 256 dispatches */

struct vks_kernel {
    struct vks_kernel *next;       /* cache list */
    char name[48];
    uint32_t spec[VKS_MAX_SPEC];
    int n_spec, n_bindings;
    uint32_t push_bytes;
    uint32_t written; /* bit i: binding i may be written (not `readonly` in the shader) */
    uint32_t subgroup_required; /* created with this required subgroup size (0: none) */
    bool full_subgroups;        /* ... and VK_PIPELINE_SHADER_STAGE_CREATE_REQUIRE_FULL_SUBGROUPS_BIT */
    VkShaderModule module;
    VkDescriptorSetLayout set_layout;
    VkPipelineLayout layout;
    VkPipeline pipeline;
};

struct vks_buffer {
    vks_gpu *gpu;
    VkBuffer buf;
    VkDeviceMemory mem;
    size_t size;
};

typedef struct { VkBuffer buf; VkDeviceMemory mem; void *map; size_t size; } vks_staging;

struct vks_host_buffer {
    vks_gpu *gpu;
    vks_staging s;
};

struct vks_gpu {
    VkInstance instance;
    VkDebugUtilsMessengerEXT messenger;
    VkPhysicalDevice phys;
    VkDevice dev;
    VkQueue queue;
    uint32_t queue_family;
    VkCommandPool pool;
    VkFence fence;
    vks_device_info info;
    uint32_t device_mem_type, host_mem_type;
    uint64_t heap_bytes, allocated_bytes;
    uint64_t peak_bytes; /* the most allocated_bytes has been since creation or vks_gpu_reset_peak */
    int validation_messages;
    struct vks_kernel *kernels;
    vks_staging staging;
    bool profile;
    VkQueryPool query_pool;
    vks_profile_entry profile_entries[VKS_MAX_PROFILE_LABELS];
    int n_profile_entries;
    vks_gpu_counters counters;
};

struct vks_cmd {
    vks_gpu *gpu;
    VkCommandBuffer cb;
    bool reusable, ended; /* reusable: kept for vks_cmd_run; ended: recording closed */
    /* buffer ranges accessed since the last barrier: a command that writes
     * what they read, or touches what they write, waits behind a barrier */
    struct { VkBuffer buf; size_t lo, hi; bool written; } pending[VKS_MAX_PENDING];
    int n_pending;
    bool after_flush; /* the next command waits for the submitted part (a barrier) */
    bool host_reads;      /* a download since the last host barrier */
    VkDescriptorPool *pools;
    int n_pools, cap_pools, sets_in_pool;
    int n_dispatches;
    vks_cmd_counts counts;   /* recorded so far */
    vks_cmd_counts unsubmitted; /* recorded since the last submit */
    uint32_t n_queries;
    const char *labels[VKS_MAX_TIMESTAMPS / 2];
};

int vks_vk_error(VkResult r, const char *what);
int vks_gpu_find_memory(const vks_gpu *g, uint32_t type_bits, VkMemoryPropertyFlags want,
                        uint32_t *out);
/* One-shot command buffer for transfers: begin/end+submit+wait. */
int vks_gpu_oneshot_begin(vks_gpu *g, VkCommandBuffer *out);
int vks_gpu_oneshot_end(vks_gpu *g, VkCommandBuffer cb);
/* Submits a closed command buffer and waits for it (the buffer is kept). */
int vks_gpu_submit_wait(vks_gpu *g, VkCommandBuffer cb);
int vks_gpu_alloc_staging(vks_gpu *g, size_t bytes, VkBufferUsageFlags usage, vks_staging *out);
void vks_gpu_free_staging(vks_gpu *g, vks_staging *s);
void vks_kernel_cache_destroy(vks_gpu *g);
#endif
