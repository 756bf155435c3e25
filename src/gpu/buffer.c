/* Device-local storage buffers and staged host transfers. */
#include <stdlib.h>
#include <string.h>
#include "gpu/gpu_internal.h"

#define STAGING_BYTES ((size_t)32 << 20)

static int alloc_bound_buffer(vks_gpu *g, size_t bytes, VkBufferUsageFlags usage, uint32_t mem_type,
                              VkBuffer *buf, VkDeviceMemory *mem) {
    VkBufferCreateInfo bci = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .size = bytes, .usage = usage,
                              .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    VkResult r = vkCreateBuffer(g->dev, &bci, NULL, buf);
    if (r != VK_SUCCESS) return vks_vk_error(r, "vkCreateBuffer");
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(g->dev, *buf, &req);
    if (!(req.memoryTypeBits & (1u << mem_type))) {
        vkDestroyBuffer(g->dev, *buf, NULL);
        return vks_set_error(VKS_ERR_GPU, "buffer cannot live in the chosen memory type");
    }
    VkMemoryAllocateInfo mai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .allocationSize = req.size,
                                .memoryTypeIndex = mem_type};
    r = vkAllocateMemory(g->dev, &mai, NULL, mem);
    if (r != VK_SUCCESS) {
        vkDestroyBuffer(g->dev, *buf, NULL);
        if (r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY)
            return vks_set_error(VKS_ERR_NOMEM, "device memory exhausted allocating %zu bytes (%llu bytes free)",
                                 bytes, (unsigned long long)vks_gpu_free_bytes(g));
        return vks_vk_error(r, "vkAllocateMemory");
    }
    vkBindBufferMemory(g->dev, *buf, *mem, 0);
    return VKS_OK;
}

int vks_buffer_create(vks_gpu *g, size_t bytes, vks_buffer **out) {
    if (!g || !out || bytes == 0) return vks_set_error(VKS_ERR_ARG, "vks_buffer_create: bad arguments");
    if (bytes > g->info.max_storage_range)
        return vks_set_error(VKS_ERR_ARG, "buffer of %zu bytes exceeds the device's storage range (%llu)", bytes,
                             (unsigned long long)g->info.max_storage_range);
    vks_buffer *b = calloc(1, sizeof *b);
    if (!b) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    size_t rounded = (bytes + 15) & ~(size_t)15; /* whole uvec4 loads never run off the end */
    int rc = alloc_bound_buffer(g, rounded,
                                VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                    VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                                g->device_mem_type, &b->buf, &b->mem);
    if (rc) { free(b); return rc; }
    b->gpu = g;
    b->size = bytes;
    g->allocated_bytes += rounded;
    if (g->allocated_bytes > g->peak_bytes) g->peak_bytes = g->allocated_bytes;
    *out = b;
    return VKS_OK;
}

void vks_buffer_destroy(vks_buffer *b) {
    if (!b) return;
    vks_gpu *g = b->gpu;
    vkDestroyBuffer(g->dev, b->buf, NULL);
    vkFreeMemory(g->dev, b->mem, NULL);
    size_t rounded = (b->size + 15) & ~(size_t)15;
    g->allocated_bytes -= rounded < g->allocated_bytes ? rounded : g->allocated_bytes;
    free(b);
}

size_t vks_buffer_size(const vks_buffer *b) { return b ? b->size : 0; }

int vks_gpu_alloc_staging(vks_gpu *g, size_t bytes, VkBufferUsageFlags usage, vks_staging *out) {
    *out = (vks_staging){0};
    int rc = alloc_bound_buffer(g, bytes, usage, g->host_mem_type, &out->buf, &out->mem);
    if (rc) return rc;
    VkResult r = vkMapMemory(g->dev, out->mem, 0, bytes, 0, &out->map);
    if (r != VK_SUCCESS) {
        vks_gpu_free_staging(g, out);
        return vks_vk_error(r, "vkMapMemory");
    }
    out->size = bytes;
    return VKS_OK;
}

void vks_gpu_free_staging(vks_gpu *g, vks_staging *s) {
    if (s->buf) vkDestroyBuffer(g->dev, s->buf, NULL);
    if (s->mem) vkFreeMemory(g->dev, s->mem, NULL); /* unmaps */
    *s = (vks_staging){0};
}

static int ensure_staging(vks_gpu *g) {
    if (g->staging.buf) return VKS_OK;
    return vks_gpu_alloc_staging(g, STAGING_BYTES, VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                                 &g->staging);
}

int vks_host_buffer_create(vks_gpu *g, size_t bytes, vks_host_buffer **out) {
    if (!g || !out || bytes == 0) return vks_set_error(VKS_ERR_ARG, "vks_host_buffer_create: bad arguments");
    *out = NULL;
    vks_host_buffer *h = calloc(1, sizeof *h);
    if (!h) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    h->gpu = g;
    int rc = vks_gpu_alloc_staging(g, bytes, VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT, &h->s);
    if (rc) { free(h); return rc; }
    *out = h;
    return VKS_OK;
}

void vks_host_buffer_destroy(vks_host_buffer *h) {
    if (!h) return;
    vks_gpu_free_staging(h->gpu, &h->s);
    free(h);
}

void *vks_host_buffer_map(vks_host_buffer *h) { return h ? h->s.map : NULL; }
size_t vks_host_buffer_size(const vks_host_buffer *h) { return h ? h->s.size : 0; }

int vks_gpu_oneshot_begin(vks_gpu *g, VkCommandBuffer *out) {
    VkCommandBufferAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                      .commandPool = g->pool, .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                      .commandBufferCount = 1};
    VkResult r = vkAllocateCommandBuffers(g->dev, &ai, out);
    if (r != VK_SUCCESS) return vks_vk_error(r, "vkAllocateCommandBuffers");
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                   .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    vkBeginCommandBuffer(*out, &bi);
    return VKS_OK;
}

int vks_gpu_oneshot_end(vks_gpu *g, VkCommandBuffer cb) {
    vkEndCommandBuffer(cb);
    int rc = vks_gpu_submit_wait(g, cb);
    vkFreeCommandBuffers(g->dev, g->pool, 1, &cb);
    return rc;
}

int vks_gpu_submit_wait(vks_gpu *g, VkCommandBuffer cb) {
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &cb};
    VkResult r = vkQueueSubmit(g->queue, 1, &si, g->fence);
    g->counters.submits++;
    double t0 = vks_seconds_now();
    if (r == VK_SUCCESS) r = vkWaitForFences(g->dev, 1, &g->fence, VK_TRUE, UINT64_MAX);
    g->counters.wait_s += vks_seconds_now() - t0;
    vkResetFences(g->dev, 1, &g->fence);
    return r == VK_SUCCESS ? VKS_OK : vks_vk_error(r, "vkQueueSubmit/vkWaitForFences");
}

static int check_range(const vks_buffer *b, size_t offset, size_t bytes, const void *ptr) {
    size_t end;
    if (!b || (!ptr && bytes) || !vks_add_size(offset, bytes, &end) || end > b->size)
        return vks_set_error(VKS_ERR_ARG, "buffer transfer out of range (offset %zu, %zu bytes, buffer %zu)",
                             offset, bytes, b ? b->size : 0);
    return VKS_OK;
}

/* Transfers in staging-sized chunks; to_device selects the direction. */
static int staged_copy(vks_buffer *b, size_t offset, void *host, size_t bytes, bool to_device) {
    vks_gpu *g = b->gpu;
    int rc = ensure_staging(g);
    for (size_t done = 0; rc == VKS_OK && done < bytes;) {
        size_t n = bytes - done < g->staging.size ? bytes - done : g->staging.size;
        if (to_device) memcpy(g->staging.map, (char *)host + done, n);
        VkCommandBuffer cb;
        if ((rc = vks_gpu_oneshot_begin(g, &cb))) break;
        VkBufferCopy region = {.srcOffset = to_device ? 0 : offset + done,
                               .dstOffset = to_device ? offset + done : 0, .size = n};
        if (to_device) vkCmdCopyBuffer(cb, g->staging.buf, b->buf, 1, &region);
        else vkCmdCopyBuffer(cb, b->buf, g->staging.buf, 1, &region);
        if ((rc = vks_gpu_oneshot_end(g, cb))) break;
        if (!to_device) memcpy((char *)host + done, g->staging.map, n);
        done += n;
    }
    return rc;
}

int vks_buffer_upload(vks_buffer *b, size_t offset, const void *src, size_t bytes) {
    int rc = check_range(b, offset, bytes, src);
    return rc ? rc : staged_copy(b, offset, (void *)src, bytes, true);
}

int vks_buffer_download(vks_buffer *b, size_t offset, void *dst, size_t bytes) {
    int rc = check_range(b, offset, bytes, dst);
    return rc ? rc : staged_copy(b, offset, dst, bytes, false);
}

int vks_buffer_fill(vks_buffer *b, uint32_t pattern) {
    if (!b) return vks_set_error(VKS_ERR_ARG, "vks_buffer_fill: NULL buffer");
    VkCommandBuffer cb;
    int rc = vks_gpu_oneshot_begin(b->gpu, &cb);
    if (rc) return rc;
    vkCmdFillBuffer(cb, b->buf, 0, VK_WHOLE_SIZE, pattern);
    return vks_gpu_oneshot_end(b->gpu, cb);
}
