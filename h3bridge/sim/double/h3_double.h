/* The public API of libh3 (antirez/h3.c h3.h at 8974cc0), declared again for h3bridge's test
 * double from h3.h's list of types, fields and functions. Layout must match h3.h exactly:
 * tests/test_libh3_abi.py compiles this header and checks every struct's size and field
 * offsets against h3bridge/libh3.py, the ctypes mirror the library engine uses. */
#ifndef H3_DOUBLE_H
#define H3_DOUBLE_H

#include <stddef.h>
#include <stdint.h>

#define H3_VERSION "0.1.0-dev"
#define H3_DEFAULT_WIDTH 864
#define H3_DEFAULT_HEIGHT 480
#define H3_DEFAULT_FRAMES 56
#define H3_DEFAULT_STEPS 20
#define H3_DEFAULT_DIT_LAYERS 50
#define H3_MIN_DIT_LAYERS 35

typedef struct h3_ctx h3_ctx;
typedef struct h3_result h3_result;

typedef struct {
    size_t embedding_entries;
    size_t embedding_bytes;
    int prepared_dit;
    int video_decoder;
} h3_cache_info;

typedef enum {
    H3_REFERENCE_IMAGE = 1,
    H3_REFERENCE_VIDEO = 2,
    H3_REFERENCE_AUDIO = 3,
    H3_REFERENCE_VIDEO_AUDIO = 4
} h3_reference_kind;

typedef struct {
    h3_reference_kind kind;
    const char *path;
    const char *audio_path;
    int include_embedded_audio;
} h3_reference;

typedef enum {
    H3_REFERENCE_IMAGE_MATCH = 0,
    H3_REFERENCE_IMAGE_MAX = 1
} h3_reference_image_size;

typedef struct {
    int width, height, stride;
    const uint8_t *rgb;
    int frame_index, frame_count;
    int denoise_step, denoise_steps;   /* >= 0 only for a denoising preview */
} h3_frame;

typedef int (*h3_frame_callback)(const h3_frame *frame, void *opaque);
typedef int (*h3_progress_callback)(const char *phase, int completed, int total, void *opaque);

typedef struct {
    int width, height, frames, steps;
    uint64_t seed;
    const char *output_path;
    const char *first_frame;
    const char *last_frame;
    const h3_reference *references;
    size_t reference_count;
    h3_reference_image_size reference_image_size;
    int denoise_reuse;
    int dit_layers;
    int core_reuse;
    int token_reduction;
    int use_int8_row_fc2;
    int use_reference_rope;
    int ssd_streaming;
    int render_width, render_height;
    int use_slower_bf16_mlp;
    int use_slower_bf16_qkv;
    int use_slower_bf16_attention_output;
    int use_slower_row_major_attention_output;
    int use_slower_unfused_int8_inputs;
    int use_slower_unfused_qkv_rope;
    int use_slower_scalar_qkv_rms;
    int use_slower_uncached_int8_scales;
    int use_slower_dynamic_fc1_k;
    int use_slower_grouped_quantizer;
    int preview_denoise;
    h3_frame_callback on_frame;
    h3_progress_callback on_progress;
    void *callback_opaque;
} h3_params;

/* Positional, in field order: the four sizes, seed 42, no paths or references, match sizing,
 * denoise reuse 1, all 50 DiT layers, core reuse 1, every switch off, no callbacks. */
#define H3_PARAMS_DEFAULT { \
    H3_DEFAULT_WIDTH, H3_DEFAULT_HEIGHT, H3_DEFAULT_FRAMES, H3_DEFAULT_STEPS, \
    UINT64_C(42), NULL, NULL, NULL, NULL, 0, H3_REFERENCE_IMAGE_MATCH, \
    1, H3_DEFAULT_DIT_LAYERS, 1, \
    0, 0, 0, 0, 0, 0, \
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, \
    0, NULL, NULL, NULL \
}

typedef struct {
    char name[128];
    char architecture[128];
    uint64_t physical_memory;
    uint64_t recommended_working_set;
    uint64_t max_buffer_length;
    int apple_gpu_family;
    int metal4;
    int unified_memory;
} h3_device_info;

typedef struct {
    uint64_t bytes;
    uint64_t tensor_bytes;
    size_t files;
    size_t tensors;
} h3_component_info;

typedef struct {
    h3_component_info text_encoder;
    h3_component_info fl2va_transformer;
    h3_component_info ref2va_transformer;
    h3_component_info video_vae;
    h3_component_info audio_vae;
} h3_model_info;

struct h3_result {
    int width, height, frames, fps, sample_rate;
    uint64_t seed;
};

h3_ctx *h3_load_dir(const char *model_dir);
void h3_free(h3_ctx *ctx);
const char *h3_last_error(const h3_ctx *ctx);
const h3_device_info *h3_device(const h3_ctx *ctx);
const h3_model_info *h3_model(const h3_ctx *ctx);
void h3_cache_set_enabled(h3_ctx *ctx, int enabled);
void h3_cache_clear(h3_ctx *ctx);
void h3_cache_get_info(const h3_ctx *ctx, h3_cache_info *info);
h3_result *h3_generate(h3_ctx *ctx, const char *prompt, const h3_params *params);
void h3_result_free(h3_result *result);

#endif
