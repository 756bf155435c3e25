/* vks_gpu.h: the Vulkan compute runtime. The only module that calls Vulkan;
 * this header exposes no Vulkan types. */
#ifndef VKS_GPU_H
#define VKS_GPU_H
#include "vks_common.h"

typedef enum { VKS_VENDOR_OTHER, VKS_VENDOR_NVIDIA, VKS_VENDOR_AMD, VKS_VENDOR_INTEL,
               VKS_VENDOR_MESA_CPU } vks_vendor;
typedef enum { VKS_DEVTYPE_OTHER, VKS_DEVTYPE_INTEGRATED, VKS_DEVTYPE_DISCRETE,
               VKS_DEVTYPE_VIRTUAL, VKS_DEVTYPE_CPU } vks_device_type;

typedef struct {
    int index;
    char name[256];
    vks_vendor vendor;
    vks_device_type type;
    uint64_t device_local_bytes;
    bool fp16_arith;      /* shaderFloat16 */
    bool int8_arith;      /* shaderInt8 */
    bool subgroup_arith;  /* subgroup arithmetic ops in compute */
    bool subgroup_ballot; /* subgroup ballot ops (subgroupBroadcast) in compute */
    bool subgroup_shuffle; /* subgroupShuffle in compute */
    uint32_t subgroup_size;         /* the size kernels are sized for (reported default) */
    /* Subgroup size control (VK_EXT_subgroup_size_control, core in 1.3): when
     * subgroup_required is nonzero every pipeline is created with it as the
     * required subgroup size (= subgroup_size), so a kernel sized for N lanes
     * runs N-wide; 0: not offered for compute, sizes as the driver picks. */
    uint32_t subgroup_min, subgroup_max; /* 0 without the extension */
    uint32_t subgroup_required;
    bool full_subgroups;            /* computeFullSubgroups (used with subgroup_required) */
    uint32_t max_workgroup_subgroups; /* maxComputeWorkgroupSubgroups (0: unknown) */
    uint32_t max_shared_bytes;
    uint64_t max_storage_range;     /* maxStorageBufferRange */
    uint32_t max_workgroup_count_x;
    uint32_t max_workgroup_size_x;
    uint32_t min_storage_align;     /* minStorageBufferOffsetAlignment */
    uint32_t api_version;
    float timestamp_period_ns;
    bool timestamps;
} vks_device_info;

const char *vks_vendor_name(vks_vendor v);
const char *vks_device_type_name(vks_device_type t);

typedef struct vks_gpu vks_gpu;
typedef struct vks_buffer vks_buffer;
typedef struct vks_cmd vks_cmd;

/* Lists physical devices. *count gets the total; at most max are written. */
int vks_gpu_list(vks_device_info *out, int max, int *count);
/* Index chosen by default: discrete with most memory, else integrated, else CPU. */
int vks_gpu_default_index(const vks_device_info *devs, int n);

typedef struct {
    int device_index;   /* -1: VKSWARM_DEVICE env or the default rule */
    bool validation;    /* enable VK_LAYER_KHRONOS_validation + message counter */
    bool profile;       /* timestamp queries per dispatch */
} vks_gpu_options;

int vks_gpu_create(const vks_gpu_options *opt, vks_gpu **out);
void vks_gpu_destroy(vks_gpu *g);
const vks_device_info *vks_gpu_info(const vks_gpu *g);
/* Number of validation messages of severity warning or error seen so far
 * (they are also printed to stderr). */
int vks_gpu_validation_messages(const vks_gpu *g);
/* Device-local bytes still free by our own accounting (heap size - allocated). */
uint64_t vks_gpu_free_bytes(const vks_gpu *g);
/* The most device-local bytes our buffers (vks_buffer_create, 16-byte rounded)
 * held at once since the device was created or since vks_gpu_reset_peak, which
 * sets the peak to what is held now. Staging memory is not counted. */
uint64_t vks_gpu_peak_bytes(const vks_gpu *g);
void vks_gpu_reset_peak(vks_gpu *g);

/* Device-local storage buffer. bytes must be <= max_storage_range. */
int vks_buffer_create(vks_gpu *g, size_t bytes, vks_buffer **out);
void vks_buffer_destroy(vks_buffer *b);
size_t vks_buffer_size(const vks_buffer *b);
/* Copies through a staging buffer; blocking. */
int vks_buffer_upload(vks_buffer *b, size_t offset, const void *src, size_t bytes);
int vks_buffer_download(vks_buffer *b, size_t offset, void *dst, size_t bytes);
/* Fills with a 32-bit pattern (e.g. NaN poison 0x7fc00000); blocking. */
int vks_buffer_fill(vks_buffer *b, uint32_t pattern);

/* Kernels are SPIR-V modules embedded at build time, looked up by name
 * (e.g. "matmul_f16"). Specialization constants: id 0 = local_size_x, then
 * ids 1.. as given. */
typedef struct vks_kernel vks_kernel;
int vks_kernel_get(vks_gpu *g, const char *name, const uint32_t *spec, int n_spec,
                   int n_bindings, uint32_t push_bytes, vks_kernel **out);
/* The required subgroup size the kernel's pipeline was created with (0: none,
 * the driver chooses); *full: also with full subgroups. */
uint32_t vks_kernel_subgroup_required(const vks_kernel *k, bool *full);

typedef struct {
    vks_buffer *buf;
    size_t offset;   /* must be a multiple of min_storage_align */
    size_t range;    /* 0 = to the end of the buffer */
} vks_binding;

/* One command buffer; many dispatches; submitted once. */
int vks_cmd_begin(vks_gpu *g, vks_cmd **out);
/* Records a dispatch. label names the op for --profile. */
int vks_cmd_dispatch(vks_cmd *c, vks_kernel *k, const vks_binding *b, int n_bindings,
                     const void *push, uint32_t push_bytes, uint32_t gx, uint32_t gy,
                     uint32_t gz, const char *label);
/* Full compute->compute memory barrier (write-after-read and read-after-write). */
void vks_cmd_barrier(vks_cmd *c);
/* Records a buffer-to-buffer copy (transfer), barriers included. */
int vks_cmd_copy(vks_cmd *c, vks_buffer *src, size_t src_off, vks_buffer *dst, size_t dst_off,
                 size_t bytes);
/* Submits and waits; frees the command buffer. */
int vks_cmd_submit(vks_cmd *c);

/* Host-visible memory (cached where the device offers it, as the host reads
 * results back from it), mapped for its whole life. A recording copies
 * between it and device buffers; the host writes inputs before the submit
 * and reads outputs after it. */
typedef struct vks_host_buffer vks_host_buffer;
int vks_host_buffer_create(vks_gpu *g, size_t bytes, vks_host_buffer **out);
void vks_host_buffer_destroy(vks_host_buffer *h);
void *vks_host_buffer_map(vks_host_buffer *h);
size_t vks_host_buffer_size(const vks_host_buffer *h);
/* Records host -> device and device -> host copies, with the barriers that
 * order them against the recording's dispatches (and the host's read after
 * the submit). */
int vks_cmd_upload(vks_cmd *c, vks_host_buffer *src, size_t src_off, vks_buffer *dst, size_t dst_off, size_t bytes);
int vks_cmd_download(vks_cmd *c, vks_buffer *src, size_t src_off, vks_host_buffer *dst, size_t dst_off, size_t bytes);

/* A recording kept for replay: begun with vks_cmd_begin_reusable, recorded
 * as any other (its descriptor sets stay with it: no limit on dispatches, no
 * intermediate submit), then run any number of times with vks_cmd_run
 * (submit and wait) and freed with vks_cmd_discard. The buffers it binds must
 * live as long as it does. */
int vks_cmd_begin_reusable(vks_gpu *g, vks_cmd **out);
int vks_cmd_run(vks_cmd *c);
/* Frees a command buffer without submitting (after a recording error). */
void vks_cmd_discard(vks_cmd *c);

/* What a recording holds so far (vks_cmd_counts). */
typedef struct {
    uint64_t dispatches, barriers, descriptor_writes;
} vks_cmd_counts;
void vks_cmd_counts_get(const vks_cmd *c, vks_cmd_counts *out);

/* What the runtime did since the device was opened; counts are exact.
 * dispatches/barriers: executed (a replayed recording counts again);
 * descriptor_writes: descriptors written by the host; submits: queue
 * submissions (each waited for); wait_s: host time blocked on the device;
 * kernel_ms: timestamped kernel time (profiling only). */
typedef struct {
    uint64_t dispatches, barriers, descriptor_writes, submits;
    double wait_s, kernel_ms;
} vks_gpu_counters;
void vks_gpu_counters_get(const vks_gpu *g, vks_gpu_counters *out);

/* Profiling: per-label accumulated GPU time since the last reset. */
typedef struct { char label[48]; double ms; uint64_t calls; } vks_profile_entry;
int vks_gpu_profile(const vks_gpu *g, vks_profile_entry *out, int max);
void vks_gpu_profile_reset(vks_gpu *g);
#endif
