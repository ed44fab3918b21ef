/* h3_metal.h for the portable backend: the device upstream would find, configured by the same
 * environment variables h3-sim reads (h3bridge/sim/device.py), with the same defaults
 * (a 128 GiB Apple M5 Max):
 *   H3_SIM_DEVICE_NAME, H3_SIM_DEVICE_ARCHITECTURE, H3_SIM_PHYSICAL_MEMORY,
 *   H3_SIM_RECOMMENDED_WORKING_SET, H3_SIM_MAX_BUFFER_LENGTH (bytes, or a number with G/GB/GiB),
 *   H3_SIM_GPU_FAMILY, H3_SIM_METAL4, H3_SIM_UNIFIED_MEMORY (1/0),
 *   H3_SIM_NO_METAL=1 (no device: "no Metal device available").
 * A malformed value is reported by the probe, naming the variable, rather than guessed at. */
#include "h3_metal.h"
#include "h3_portable.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define PB_DEFAULT_NAME "Apple M5 Max"
#define PB_GIB UINT64_C(1073741824)

static int pb_flag(const char *name, int fallback) {
    const char *value = getenv(name);
    if (!value || !*value) return fallback;
    while (isspace((unsigned char)*value)) value++;
    return !(strncmp(value, "0", 1) == 0 || strncasecmp(value, "no", 2) == 0 ||
             strncasecmp(value, "false", 5) == 0 || strncasecmp(value, "off", 3) == 0);
}

/* bytes, or a number of GiB with a G/GB/GiB suffix (h3bridge/sim/device.py parse_bytes) */
static int pb_bytes(const char *name, uint64_t fallback, uint64_t *value, char *error, size_t error_size) {
    const char *text = getenv(name);
    if (!text || !*text) {
        *value = fallback;
        return 1;
    }
    char *end = NULL;
    double number = strtod(text, &end);
    while (end && isspace((unsigned char)*end)) end++;
    int gib = end && (!strcmp(end, "G") || !strcmp(end, "GB") || !strcmp(end, "GiB") || !strcmp(end, "g"));
    if (end == text || number < 0 || (end && *end && !gib)) {
        if (error && error_size)
            snprintf(error, error_size, "%s must be a byte count or a number of GiB like 128G, not '%s'",
                     name, text);
        return 0;
    }
    *value = gib ? (uint64_t)(number * (double)PB_GIB) : (uint64_t)number;
    return 1;
}

static const char *pb_device_name(void) {
    const char *name = getenv("H3_SIM_DEVICE_NAME");
    return name && *name ? name : PB_DEFAULT_NAME;
}

int h3_portable_device_is_m5(void) { return strstr(pb_device_name(), "M5") != NULL; }
int h3_portable_device_metal4(void) { return pb_flag("H3_SIM_METAL4", 1); }

int h3_metal_probe(h3_device_info *info, char *error, size_t error_size) {
    if (!info) return 0;
    memset(info, 0, sizeof(*info));
    if (pb_flag("H3_SIM_NO_METAL", 0)) {
        if (error && error_size) snprintf(error, error_size, "no Metal device available");
        return 0;
    }
    const char *architecture = getenv("H3_SIM_DEVICE_ARCHITECTURE");
    snprintf(info->name, sizeof(info->name), "%s", pb_device_name());
    snprintf(info->architecture, sizeof(info->architecture), "%s",
             architecture && *architecture ? architecture : "applegpu_g17s");
    uint64_t physical = 0;
    if (!pb_bytes("H3_SIM_PHYSICAL_MEMORY", 128 * PB_GIB, &physical, error, error_size) ||
        !pb_bytes("H3_SIM_RECOMMENDED_WORKING_SET", physical / 4 * 3, &info->recommended_working_set,
                  error, error_size) ||
        !pb_bytes("H3_SIM_MAX_BUFFER_LENGTH", physical / 2, &info->max_buffer_length, error, error_size))
        return 0;
    info->physical_memory = physical;
    const char *family = getenv("H3_SIM_GPU_FAMILY");
    char *end = NULL;
    long family_value = family && *family ? strtol(family, &end, 10) : 10;
    if (family && *family && (!end || *end)) {
        if (error && error_size)
            snprintf(error, error_size, "H3_SIM_GPU_FAMILY must be an integer, not '%s'", family);
        return 0;
    }
    info->apple_gpu_family = (int)family_value;
    info->metal4 = h3_portable_device_metal4();
    info->unified_memory = pb_flag("H3_SIM_UNIFIED_MEMORY", 1);
    return 1;
}
