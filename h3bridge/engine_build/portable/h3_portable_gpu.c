/* h3_gpu.h over host memory: h3bridge's portable backend for upstream h3.c (ours).
 *
 * Storage is real: tensors are host buffers of upstream's dtypes and sizes; loads map the
 * safetensors payload (MAP_PRIVATE, as upstream itself maps transformer weights on M5), so a
 * fixture's sparse multi-GiB shards cost nothing until touched; streams re-point a tensor at
 * the file's bytes. Reads and writes copy exactly.
 *
 * Compute is cheap on purpose. Element-wise kernels (casts, copies, SiLU, adds, clip, the
 * Euler update, the embedding gather) compute their reference result. Every other kernel
 * (projections, norms, attention, convolutions, quantisation, ...) fills the first
 * PB_FILL_LIMIT elements of each output with a deterministic pattern in [-0.25, 0.25] that
 * depends on the kernel and on the first bytes of its inputs (so seeds and prompts still
 * change the result) and leaves the rest as it was: no NaN or infinity can appear, shapes
 * are upstream's, and the work per kernel is bounded whatever the model's dimensions.
 * Upstream reads back only finite-ness-insensitive values (velocities, pixels, PCM, RoPE
 * frequencies from the checkpoint, AdaLN tables), so its control flow takes a Mac's path.
 */
#define _GNU_SOURCE
#include "h3_gpu.h"
#include "h3_portable.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PB_FILL_LIMIT ((size_t)4096)
#define PB_MMAP_THRESHOLD ((size_t)1 << 20)
#define PB_GIB (1024.0 * 1024.0 * 1024.0)

struct h3_gpu {
    int is_m5;
    int tensor_ops;
    int tensor_ops_mode;
    int recording;          /* between h3_gpu_begin and h3_gpu_submit */
    char error[512];
    char label[128];
    h3_gpu_stats stats;
    h3_gpu_stats mark_stats;
    double start_wall;
    double mark_wall;
    double command_start_wall;
};

struct h3_gpu_tensor {
    h3_gpu *owner;
    h3_gpu_dtype dtype;
    size_t elements;
    size_t bytes;
    unsigned char *data;    /* the live bytes: own storage or a file view */
    void *storage;          /* own storage */
    size_t storage_bytes;
    int storage_mapped;     /* storage came from mmap (else calloc) */
    void *view;             /* a private file mapping that data points into */
    size_t view_bytes;
};

static double pb_now(void) {
    struct timespec now;
    if (clock_gettime(CLOCK_MONOTONIC, &now) != 0) return 0.0;
    return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

static void pb_set_error(h3_gpu *gpu, const char *format, ...) {
    if (!gpu) return;
    va_list arguments;
    va_start(arguments, format);
    vsnprintf(gpu->error, sizeof(gpu->error), format, arguments);
    va_end(arguments);
}

static int pb_profile_enabled(void) {
    const char *value = getenv("H3_PROFILE");
    return value && *value && strcmp(value, "0");
}

static uint64_t pb_delta(uint64_t value, uint64_t start) {
    return value >= start ? value - start : 0;
}

/* The same line upstream's Metal context prints (h3 profile: label phase wall= ...). */
static void pb_profile_emit(h3_gpu *gpu, const char *phase, h3_gpu_stats start, double wall_start) {
    if (!pb_profile_enabled()) return;
    h3_gpu_stats value = gpu->stats;
    fprintf(stderr,
        "h3 profile: %-24s %-14s wall=%8.3fs encode=%7.3fs "
        "wait=%8.3fs root-gpu=%7.3fs "
        "peak=%7.3fGiB alloc=%7.3fGiB submissions=%llu "
        "direct=%llu linear=%llu conv=%llu attention=%llu\n",
        gpu->label[0] ? gpu->label : "Metal context", phase, pb_now() - wall_start,
        value.command_encode_seconds - start.command_encode_seconds,
        value.command_wait_seconds - start.command_wait_seconds,
        value.gpu_seconds - start.gpu_seconds,
        (double)value.peak_live_bytes / PB_GIB,
        (double)pb_delta(value.allocated_bytes, start.allocated_bytes) / PB_GIB,
        (unsigned long long)pb_delta(value.submissions, start.submissions),
        (unsigned long long)pb_delta(value.direct_dispatches, start.direct_dispatches),
        (unsigned long long)pb_delta(value.mps_linear_dispatches, start.mps_linear_dispatches),
        (unsigned long long)pb_delta(value.mps_conv_dispatches, start.mps_conv_dispatches),
        (unsigned long long)pb_delta(value.mps_sdpa_dispatches, start.mps_sdpa_dispatches));
}

h3_gpu *h3_gpu_create(const char *shader_source_path, char *error, size_t error_size) {
    if (error && error_size) error[0] = '\0';
    /* Upstream compiles its shaders from this file at run time and fails without it; the
     * portable backend needs no shader, but keeps the requirement so that the working
     * directory matters here exactly as it does on a Mac. */
    const char *source_path = shader_source_path ? shader_source_path : "h3_shaders.metal";
    FILE *source = fopen(source_path, "rb");
    if (!source) {
        if (error && error_size)
            snprintf(error, error_size,
                     "cannot compile %s: The file \xe2\x80\x9c%s\xe2\x80\x9d couldn\xe2\x80\x99t be opened "
                     "because there is no such file.", source_path, strrchr(source_path, '/') ?
                     strrchr(source_path, '/') + 1 : source_path);
        return NULL;
    }
    fclose(source);
    h3_gpu *gpu = calloc(1, sizeof(*gpu));
    if (!gpu) {
        if (error && error_size) snprintf(error, error_size, "cannot initialize Metal");
        return NULL;
    }
    gpu->is_m5 = h3_portable_device_is_m5();
    /* Upstream enables TensorOps (its int8 and NAX paths) when the device is an M5 and the
     * shaders compile with them; H3_NAX=0 turns them off, H3_NAX picks the mode. */
    const char *nax = getenv("H3_NAX");
    gpu->tensor_ops = gpu->is_m5 && (!nax || !*nax || strcmp(nax, "0") != 0);
    if (gpu->tensor_ops) {
        const char *mode = nax && *nax ? nax : "qkv-attn";
        gpu->tensor_ops_mode = !strcmp(mode, "attn") ? 2 : !strcmp(mode, "qkv-attn") ? 3 :
                               !strcmp(mode, "qkv") ? 4 : !strcmp(mode, "mlp") ? 5 : 1;
    }
    snprintf(gpu->label, sizeof(gpu->label), "Metal context");
    gpu->start_wall = pb_now();
    gpu->mark_wall = gpu->start_wall;
    return gpu;
}

void h3_gpu_free(h3_gpu *gpu) {
    if (!gpu) return;
    pb_profile_emit(gpu, "total", (h3_gpu_stats){0}, gpu->start_wall);
    free(gpu);
}

int h3_gpu_is_m5(const h3_gpu *gpu) { return gpu ? gpu->is_m5 : 0; }
int h3_gpu_has_nax_mlp(const h3_gpu *gpu) { return gpu ? gpu->tensor_ops && gpu->tensor_ops_mode == 5 : 0; }
int h3_gpu_has_int8_mlp(const h3_gpu *gpu) { return gpu ? gpu->tensor_ops : 0; }

static void pb_account(h3_gpu *gpu, size_t bytes) {
    gpu->stats.allocated_bytes += bytes;
    gpu->stats.live_bytes += bytes;
    if (gpu->stats.live_bytes > gpu->stats.peak_live_bytes)
        gpu->stats.peak_live_bytes = gpu->stats.live_bytes;
    gpu->stats.tensor_allocations++;
}

static size_t pb_item_size(h3_gpu_dtype dtype) {
    switch (dtype) {
    case H3_GPU_F32: case H3_GPU_U32: return 4;
    case H3_GPU_BF16: return 2;
    case H3_GPU_I8: return 1;
    }
    return 1;
}

static h3_gpu_tensor *pb_tensor_new(h3_gpu *gpu, const void *values, size_t elements, h3_gpu_dtype dtype) {
    size_t item = pb_item_size(dtype);
    if (!gpu || elements > SIZE_MAX / item) return NULL;
    size_t bytes = elements * item;
    h3_gpu_tensor *tensor = calloc(1, sizeof(*tensor));
    if (!tensor) {
        pb_set_error(gpu, "cannot allocate %zu-byte Metal buffer", bytes);
        return NULL;
    }
    size_t storage_bytes = bytes ? bytes : 1;
    if (storage_bytes >= PB_MMAP_THRESHOLD) {
        /* Anonymous pages: zero, and resident only once written. */
        void *storage = mmap(NULL, storage_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS
                             | MAP_NORESERVE, -1, 0);
        if (storage == MAP_FAILED) {
            free(tensor);
            pb_set_error(gpu, "cannot allocate %zu-byte Metal buffer", bytes);
            return NULL;
        }
        tensor->storage = storage;
        tensor->storage_mapped = 1;
    } else {
        tensor->storage = calloc(1, storage_bytes);
        if (!tensor->storage) {
            free(tensor);
            pb_set_error(gpu, "cannot allocate %zu-byte Metal buffer", bytes);
            return NULL;
        }
    }
    tensor->storage_bytes = storage_bytes;
    tensor->owner = gpu;
    tensor->dtype = dtype;
    tensor->elements = elements;
    tensor->bytes = bytes;
    tensor->data = tensor->storage;
    if (values && bytes) memcpy(tensor->data, values, bytes);
    pb_account(gpu, bytes);
    return tensor;
}

h3_gpu_tensor *h3_gpu_tensor_new_f32(h3_gpu *gpu, size_t elements) { return pb_tensor_new(gpu, NULL, elements, H3_GPU_F32); }
h3_gpu_tensor *h3_gpu_tensor_new_bf16(h3_gpu *gpu, size_t elements) { return pb_tensor_new(gpu, NULL, elements, H3_GPU_BF16); }
h3_gpu_tensor *h3_gpu_tensor_new_i8(h3_gpu *gpu, size_t elements) { return pb_tensor_new(gpu, NULL, elements, H3_GPU_I8); }
h3_gpu_tensor *h3_gpu_tensor_from_f32(h3_gpu *gpu, const float *values, size_t elements) {
    return pb_tensor_new(gpu, values, elements, H3_GPU_F32);
}
h3_gpu_tensor *h3_gpu_tensor_from_bf16(h3_gpu *gpu, const uint16_t *values, size_t elements) {
    return pb_tensor_new(gpu, values, elements, H3_GPU_BF16);
}
h3_gpu_tensor *h3_gpu_tensor_from_u32(h3_gpu *gpu, const uint32_t *values, size_t elements) {
    return pb_tensor_new(gpu, values, elements, H3_GPU_U32);
}

static void pb_drop_view(h3_gpu_tensor *tensor) {
    if (tensor->view) munmap(tensor->view, tensor->view_bytes);
    tensor->view = NULL;
    tensor->view_bytes = 0;
    tensor->data = tensor->storage;
}

/* Point `tensor` at `bytes` bytes of `path` from `file_offset` (a private mapping: writes stay
 * in this process). The file must hold them all, as upstream's pread loop requires. */
static int pb_map_file(h3_gpu_tensor *tensor, const char *path, uint64_t file_offset, size_t bytes,
                       const char *label, char *message, size_t message_size) {
    int descriptor = open(path, O_RDONLY | O_CLOEXEC);
    if (descriptor < 0) {
        snprintf(message, message_size, "cannot open %s: %s", path, strerror(errno));
        return 0;
    }
    struct stat status;
    if (fstat(descriptor, &status) != 0) {
        snprintf(message, message_size, "cannot read %s payload from %s: %s", label, path, strerror(errno));
        close(descriptor);
        return 0;
    }
    if ((uint64_t)status.st_size < file_offset || (uint64_t)status.st_size - file_offset < bytes) {
        snprintf(message, message_size, "cannot read %s payload from %s: unexpected end of file", label, path);
        close(descriptor);
        return 0;
    }
    if (!bytes) {
        close(descriptor);
        pb_drop_view(tensor);
        return 1;
    }
    size_t page = (size_t)getpagesize();
    uint64_t aligned = file_offset - file_offset % page;
    size_t delta = (size_t)(file_offset - aligned);
    size_t map_bytes = bytes + delta;
    void *mapping = mmap(NULL, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE, descriptor, (off_t)aligned);
    int map_error = errno;
    close(descriptor);
    if (mapping == MAP_FAILED) {
        snprintf(message, message_size, "cannot map %s payload from %s: %s", label, path, strerror(map_error));
        return 0;
    }
    pb_drop_view(tensor);
    tensor->view = mapping;
    tensor->view_bytes = map_bytes;
    tensor->data = (unsigned char *)mapping + delta;
    return 1;
}

static h3_gpu_tensor *pb_tensor_load(h3_gpu *gpu, const char *path, uint64_t file_offset, size_t elements,
                                     h3_gpu_dtype dtype, const char *label) {
    size_t item = pb_item_size(dtype);
    if (!gpu || !path || !*path || file_offset > INT64_MAX || elements > SIZE_MAX / item) return NULL;
    size_t bytes = elements * item;
    if ((uint64_t)bytes > (uint64_t)INT64_MAX - file_offset) return NULL;
    h3_gpu_tensor *tensor = calloc(1, sizeof(*tensor));
    if (!tensor) return NULL;
    tensor->owner = gpu;
    tensor->dtype = dtype;
    tensor->elements = elements;
    tensor->bytes = bytes;
    if (!pb_map_file(tensor, path, file_offset, bytes, label, gpu->error, sizeof(gpu->error))) {
        free(tensor);
        return NULL;
    }
    if (!tensor->data) {       /* an empty payload: one byte of own storage, like a 1-byte buffer */
        tensor->storage = calloc(1, 1);
        tensor->storage_bytes = 1;
        tensor->data = tensor->storage;
    }
    pb_account(gpu, bytes);
    return tensor;
}

h3_gpu_tensor *h3_gpu_tensor_load_bf16(h3_gpu *gpu, const char *path, uint64_t file_offset, size_t elements) {
    return pb_tensor_load(gpu, path, file_offset, elements, H3_GPU_BF16, "BF16");
}

h3_gpu_tensor *h3_gpu_tensor_load_f32(h3_gpu *gpu, const char *path, uint64_t file_offset, size_t elements) {
    return pb_tensor_load(gpu, path, file_offset, elements, H3_GPU_F32, "F32");
}

int h3_gpu_tensor_read_file_bf16(h3_gpu_tensor *tensor, const char *path, uint64_t file_offset,
                                 size_t elements, char *error, size_t error_size) {
    char message[512] = "";
    if (!tensor || !path || tensor->dtype != H3_GPU_BF16 || elements > tensor->elements) {
        if (error && error_size) snprintf(error, error_size, "invalid BF16 file read");
        return 0;
    }
    if (!pb_map_file(tensor, path, file_offset, elements * 2, "BF16", message, sizeof(message))) {
        if (error && error_size) snprintf(error, error_size, "%s", message);
        return 0;
    }
    if (!tensor->view && !tensor->data) tensor->data = tensor->storage;
    /* A view shorter than the tensor would leave its tail unreadable: copy instead. */
    if (tensor->view && elements < tensor->elements) {
        unsigned char *source = tensor->data;
        memcpy(tensor->storage, source, elements * 2);
        pb_drop_view(tensor);
    }
    return 1;
}

int h3_gpu_tensor_stream_file_bf16(h3_gpu_tensor *tensor, const char *path, uint64_t file_offset,
                                   size_t elements, char *error, size_t error_size) {
    return h3_gpu_tensor_read_file_bf16(tensor, path, file_offset, elements, error, error_size);
}

void h3_gpu_tensor_free(h3_gpu_tensor *tensor) {
    if (!tensor) return;
    if (tensor->owner) {
        tensor->owner->stats.live_bytes -= tensor->owner->stats.live_bytes >= tensor->bytes ? tensor->bytes :
                                           tensor->owner->stats.live_bytes;
    }
    if (tensor->view) munmap(tensor->view, tensor->view_bytes);
    if (tensor->storage) {
        if (tensor->storage_mapped) munmap(tensor->storage, tensor->storage_bytes);
        else free(tensor->storage);
    }
    free(tensor);
}

size_t h3_gpu_tensor_elements(const h3_gpu_tensor *tensor) { return tensor ? tensor->elements : 0; }
h3_gpu_dtype h3_gpu_tensor_dtype(const h3_gpu_tensor *tensor) { return tensor ? tensor->dtype : H3_GPU_F32; }

static int pb_copy_out(const h3_gpu_tensor *tensor, h3_gpu_dtype dtype, size_t offset, void *values, size_t elements) {
    if (!tensor || !values || tensor->dtype != dtype || offset > tensor->elements ||
        elements > tensor->elements - offset) return 0;
    size_t item = pb_item_size(dtype);
    memcpy(values, tensor->data + offset * item, elements * item);
    return 1;
}

static int pb_copy_in(h3_gpu_tensor *tensor, h3_gpu_dtype dtype, size_t offset, const void *values, size_t elements) {
    if (!tensor || !values || tensor->dtype != dtype || offset > tensor->elements ||
        elements > tensor->elements - offset) return 0;
    size_t item = pb_item_size(dtype);
    memcpy(tensor->data + offset * item, values, elements * item);
    return 1;
}

int h3_gpu_tensor_read_f32(const h3_gpu_tensor *tensor, float *values, size_t elements) {
    return pb_copy_out(tensor, H3_GPU_F32, 0, values, elements);
}
int h3_gpu_tensor_read_f32_range(const h3_gpu_tensor *tensor, size_t source_offset, float *values, size_t elements) {
    return pb_copy_out(tensor, H3_GPU_F32, source_offset, values, elements);
}
int h3_gpu_tensor_read_bf16(const h3_gpu_tensor *tensor, uint16_t *values, size_t elements) {
    return pb_copy_out(tensor, H3_GPU_BF16, 0, values, elements);
}
int h3_gpu_tensor_write_f32(h3_gpu_tensor *tensor, const float *values, size_t elements) {
    return pb_copy_in(tensor, H3_GPU_F32, 0, values, elements);
}
int h3_gpu_tensor_write_f32_range(h3_gpu_tensor *tensor, size_t destination_offset, const float *values,
                                  size_t elements) {
    return pb_copy_in(tensor, H3_GPU_F32, destination_offset, values, elements);
}
int h3_gpu_tensor_write_bf16(h3_gpu_tensor *tensor, const uint16_t *values, size_t elements) {
    return pb_copy_in(tensor, H3_GPU_BF16, 0, values, elements);
}
int h3_gpu_tensor_write_bf16_range(h3_gpu_tensor *tensor, size_t destination_offset, const uint16_t *values,
                                   size_t elements) {
    return pb_copy_in(tensor, H3_GPU_BF16, destination_offset, values, elements);
}

/* Command buffers: work runs at encode time, so begin/continue/submit only keep upstream's
 * protocol (one chain at a time) and its counters, and report an injected GPU fault. */
int h3_gpu_begin(h3_gpu *gpu) {
    if (!gpu || gpu->recording) return 0;
    gpu->error[0] = '\0';
    gpu->recording = 1;
    gpu->command_start_wall = pb_now();
    return 1;
}

int h3_gpu_continue(h3_gpu *gpu) {
    if (!gpu || !gpu->recording) return 0;
    double now = pb_now();
    gpu->stats.submissions++;
    gpu->stats.command_encode_seconds += now - gpu->command_start_wall;
    gpu->command_start_wall = now;
    return 1;
}

int h3_gpu_submit(h3_gpu *gpu) {
    if (!gpu || !gpu->recording) return 0;
    gpu->recording = 0;
    double now = pb_now();
    gpu->stats.submissions++;
    gpu->stats.command_encode_seconds += now - gpu->command_start_wall;
    const char *failure = h3_portable_pending_gpu_failure();
    if (failure) {
        pb_set_error(gpu, "%s", failure);
        h3_portable_clear_gpu_failure();
        return 0;
    }
    return 1;
}

const char *h3_gpu_error(const h3_gpu *gpu) {
    return gpu && gpu->error[0] ? gpu->error : "unknown Metal error";
}

int h3_gpu_get_stats(const h3_gpu *gpu, h3_gpu_stats *stats) {
    if (!gpu || !stats) return 0;
    *stats = gpu->stats;
    return 1;
}

void h3_gpu_profile_set_label(h3_gpu *gpu, const char *label) {
    if (!gpu || !label || !*label) return;
    snprintf(gpu->label, sizeof(gpu->label), "%s", label);
}

void h3_gpu_profile_mark(h3_gpu *gpu, const char *phase) {
    if (!gpu || !phase || !*phase || !pb_profile_enabled()) return;
    pb_profile_emit(gpu, phase, gpu->mark_stats, gpu->mark_wall);
    gpu->mark_stats = gpu->stats;
    gpu->mark_wall = pb_now();
}

/* ---- kernels ---------------------------------------------------------------------------- */

static int pb_require_command(h3_gpu *gpu) {
    if (!gpu) return 0;
    if (!gpu->recording) {
        pb_set_error(gpu, "h3_gpu_begin() was not called");
        return 0;
    }
    gpu->stats.direct_dispatches++;
    return 1;
}

static int pb_require(h3_gpu *gpu, const h3_gpu_tensor *tensor, size_t elements, const char *label) {
    if (!tensor || tensor->elements < elements) {
        pb_set_error(gpu, "%s tensor is absent or too small", label);
        return 0;
    }
    return 1;
}

static float pb_bf16_to_f32(uint16_t value) {
    uint32_t bits = (uint32_t)value << 16;
    float result;
    memcpy(&result, &bits, sizeof(result));
    return result;
}

static uint16_t pb_f32_to_bf16(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof(bits));
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u);   /* keep NaN a NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u);   /* round to nearest even */
    return (uint16_t)(bits >> 16);
}

/* Finite in, finite out: a checkpoint's zero-filled (sparse) or odd bytes never turn into
 * NaN or infinity through the portable kernels. */
static float pb_finite(float value) {
    if (!isfinite(value)) return 0.0f;
    if (value > 65504.0f) return 65504.0f;
    if (value < -65504.0f) return -65504.0f;
    return value;
}

static float pb_get(const h3_gpu_tensor *tensor, size_t index) {
    switch (tensor->dtype) {
    case H3_GPU_F32: { float value; memcpy(&value, tensor->data + index * 4, 4); return pb_finite(value); }
    case H3_GPU_BF16: { uint16_t value; memcpy(&value, tensor->data + index * 2, 2); return pb_finite(pb_bf16_to_f32(value)); }
    case H3_GPU_I8: return (float)(int8_t)tensor->data[index];
    case H3_GPU_U32: { uint32_t value; memcpy(&value, tensor->data + index * 4, 4); return (float)value; }
    }
    return 0.0f;
}

static void pb_set(h3_gpu_tensor *tensor, size_t index, float value) {
    value = pb_finite(value);
    switch (tensor->dtype) {
    case H3_GPU_F32: memcpy(tensor->data + index * 4, &value, 4); break;
    case H3_GPU_BF16: { uint16_t half = pb_f32_to_bf16(value); memcpy(tensor->data + index * 2, &half, 2); break; }
    case H3_GPU_I8: tensor->data[index] = (unsigned char)(int8_t)lrintf(fmaxf(-127.0f, fminf(127.0f, value * 127.0f))); break;
    case H3_GPU_U32: { uint32_t word = (uint32_t)fabsf(value * 1000.0f); memcpy(tensor->data + index * 4, &word, 4); break; }
    }
}

static uint32_t pb_hash(uint32_t hash, const void *bytes, size_t count) {
    const unsigned char *cursor = bytes;
    for (size_t index = 0; index < count; index++) {
        hash ^= cursor[index];
        hash *= 16777619u;
    }
    return hash;
}

/* The deterministic stand-in for a kernel that the portable backend does not compute. */
static int pb_fill_kernel(h3_gpu *gpu, const char *name, const h3_gpu_tensor *const *inputs,
                          h3_gpu_tensor *const *outputs) {
    if (!pb_require_command(gpu)) return 0;
    uint32_t hash = pb_hash(2166136261u, name, strlen(name));
    for (size_t index = 0; inputs[index]; index++) {
        const h3_gpu_tensor *input = inputs[index];
        size_t sample = input->bytes < 64 ? input->bytes : 64;
        hash = pb_hash(hash, input->data, sample);
    }
    for (size_t index = 0; outputs[index]; index++) {
        h3_gpu_tensor *output = outputs[index];
        size_t count = output->elements < PB_FILL_LIMIT ? output->elements : PB_FILL_LIMIT;
        uint32_t seed = hash + (uint32_t)index * 0x9e3779b9u;
        for (size_t element = 0; element < count; element++) {
            uint32_t mixed = ((uint32_t)element * 2654435761u) ^ seed;
            mixed ^= mixed >> 15;
            mixed *= 2246822519u;
            mixed ^= mixed >> 13;
            float value = ((float)(mixed & 0xffffu) / 65535.0f - 0.5f) * 0.5f;
            pb_set(output, element, value);
        }
    }
    return 1;
}

/* ---- element-wise kernels with their reference results ----------------------------------- */

static float pb_silu(float x) { return x / (1.0f + expf(-x)); }

#define PB_UNARY(NAME, OUT_CHECK, EXPR)                                                         \
    if (!pb_require_command(gpu) || !pb_require(gpu, input, elements, "input") ||              \
        !pb_require(gpu, output, elements, "output")) return 0;                                \
    (void)(OUT_CHECK);                                                                         \
    for (size_t i = 0; i < elements; i++) { float x = pb_get(input, i); pb_set(output, i, (EXPR)); } \
    return 1;

int h3_gpu_silu_f32(h3_gpu *gpu, h3_gpu_tensor *output, const h3_gpu_tensor *input, uint32_t elements) {
    PB_UNARY(silu_f32, 0, pb_silu(x))
}
int h3_gpu_silu_bf16(h3_gpu *gpu, h3_gpu_tensor *output, const h3_gpu_tensor *input, uint32_t elements) {
    PB_UNARY(silu_bf16, 0, pb_silu(x))
}
int h3_gpu_cast_f32_to_bf16(h3_gpu *gpu, h3_gpu_tensor *output, const h3_gpu_tensor *input, uint32_t elements) {
    PB_UNARY(cast, 0, x)
}
int h3_gpu_cast_bf16_to_f32(h3_gpu *gpu, h3_gpu_tensor *output, const h3_gpu_tensor *input, uint32_t elements) {
    PB_UNARY(cast, 0, x)
}
int h3_gpu_clip_f32(h3_gpu *gpu, h3_gpu_tensor *output, const h3_gpu_tensor *input, uint32_t elements,
                    float minimum, float maximum) {
    PB_UNARY(clip, 0, fminf(fmaxf(x, minimum), maximum))
}

static int pb_copy(h3_gpu *gpu, h3_gpu_dtype dtype, h3_gpu_tensor *destination, size_t destination_offset,
                   const h3_gpu_tensor *source, size_t source_offset, size_t elements) {
    if (!pb_require_command(gpu)) return 0;
    if (!destination || !source || destination->dtype != dtype || source->dtype != dtype ||
        destination_offset > destination->elements || elements > destination->elements - destination_offset ||
        source_offset > source->elements || elements > source->elements - source_offset) {
        pb_set_error(gpu, "copy range is outside its tensors");
        return 0;
    }
    size_t item = pb_item_size(dtype);
    memmove(destination->data + destination_offset * item, source->data + source_offset * item, elements * item);
    gpu->stats.blit_copies++;
    return 1;
}

int h3_gpu_copy_bf16(h3_gpu *gpu, h3_gpu_tensor *destination, size_t destination_offset,
                     const h3_gpu_tensor *source, size_t source_offset, size_t elements) {
    return pb_copy(gpu, H3_GPU_BF16, destination, destination_offset, source, source_offset, elements);
}
int h3_gpu_copy_f32(h3_gpu *gpu, h3_gpu_tensor *destination, size_t destination_offset,
                    const h3_gpu_tensor *source, size_t source_offset, size_t elements) {
    return pb_copy(gpu, H3_GPU_F32, destination, destination_offset, source, source_offset, elements);
}

#define PB_BINARY(EXPR)                                                                         \
    if (!pb_require_command(gpu) || !pb_require(gpu, left, elements, "left") ||                \
        !pb_require(gpu, right, elements, "right") || !pb_require(gpu, output, elements, "output")) return 0; \
    for (size_t i = 0; i < elements; i++) {                                                    \
        float a = pb_get(left, i), b = pb_get(right, i);                                       \
        pb_set(output, i, (EXPR));                                                             \
    }                                                                                          \
    return 1;

int h3_gpu_add_scaled_f32(h3_gpu *gpu, h3_gpu_tensor *output, const h3_gpu_tensor *left,
                          const h3_gpu_tensor *right, float left_scale, float right_scale, uint32_t elements) {
    PB_BINARY(a * left_scale + b * right_scale)
}
int h3_gpu_add_bf16(h3_gpu *gpu, h3_gpu_tensor *output, const h3_gpu_tensor *left, const h3_gpu_tensor *right,
                    uint32_t elements) {
    PB_BINARY(a + b)
}
int h3_gpu_sub_bf16(h3_gpu *gpu, h3_gpu_tensor *output, const h3_gpu_tensor *left, const h3_gpu_tensor *right,
                    uint32_t elements) {
    PB_BINARY(a - b)
}

int h3_gpu_geglu_f32(h3_gpu *gpu, h3_gpu_tensor *output, const h3_gpu_tensor *gate,
                     const h3_gpu_tensor *linear, uint32_t elements) {
    const h3_gpu_tensor *left = gate, *right = linear;
    PB_BINARY(0.5f * a * (1.0f + erff(a / sqrtf(2.0f))) * b)
}
int h3_gpu_silu_mul_bf16(h3_gpu *gpu, h3_gpu_tensor *output, const h3_gpu_tensor *gate,
                         const h3_gpu_tensor *up, uint32_t elements) {
    const h3_gpu_tensor *left = gate, *right = up;
    PB_BINARY(pb_silu(a) * b)
}

int h3_gpu_euler_bf16(h3_gpu *gpu, h3_gpu_tensor *sample, size_t sample_offset, const h3_gpu_tensor *last,
                      const h3_gpu_tensor *previous, uint32_t elements, float delta, float ratio) {
    if (!pb_require_command(gpu) || !pb_require(gpu, last, elements, "velocity") ||
        !pb_require(gpu, previous, elements, "previous velocity") || !sample ||
        sample_offset > sample->elements || elements > sample->elements - sample_offset) {
        if (gpu && !gpu->error[0]) pb_set_error(gpu, "sample tensor is absent or too small");
        return 0;
    }
    for (size_t i = 0; i < elements; i++) {
        float v = pb_get(last, i), p = pb_get(previous, i);
        pb_set(sample, sample_offset + i, pb_get(sample, sample_offset + i) + delta * (v + ratio * (v - p)));
    }
    return 1;
}

int h3_gpu_embedding_bf16(h3_gpu *gpu, h3_gpu_tensor *output, const h3_gpu_tensor *weight,
                          const h3_gpu_tensor *token_ids, uint32_t tokens, uint32_t vocab_size, uint32_t width) {
    if (!pb_require_command(gpu) || !pb_require(gpu, token_ids, tokens, "token") ||
        !pb_require(gpu, weight, (size_t)vocab_size * width, "embedding") ||
        !pb_require(gpu, output, (size_t)tokens * width, "output")) return 0;
    for (uint32_t token = 0; token < tokens; token++) {
        uint32_t id;
        memcpy(&id, token_ids->data + (size_t)token * 4, 4);
        if (id >= vocab_size) {
            pb_set_error(gpu, "token ID %u is outside the %u-entry vocabulary", id, vocab_size);
            return 0;
        }
        for (uint32_t column = 0; column < width; column++)
            pb_set(output, (size_t)token * width + column, pb_get(weight, (size_t)id * width + column));
    }
    return 1;
}

/* ---- every other kernel: deterministic fills -------------------------------------------- */

#include "h3_portable_fills.inc"
