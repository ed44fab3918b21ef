/* Shared state of h3bridge's portable backend for upstream h3.c (ours, not upstream's).
 *
 * The backend provides what upstream implements in Objective-C over Metal and Foundation
 * (h3_gpu.h, h3_metal.h, h3_tokenizer.h) as plain C over host memory, so that upstream's
 * unmodified C files link and run on Linux. See h3_portable_gpu.c for what the kernels compute.
 */
#ifndef H3_PORTABLE_H
#define H3_PORTABLE_H

#include <stddef.h>

/* Fault injection (h3_portable_fault.c), the same variables h3-sim reads
 * (h3bridge/sim/engine.py): H3_SIM_CRASH_PHASE, H3_SIM_HANG_PHASE, H3_SIM_HANG_NOTICE,
 * H3_SIM_FAIL_PHASE, H3_SIM_FAIL_MESSAGE. A fail fault arms a pending GPU error that the
 * next command buffer reports, as a Metal failure would. */
const char *h3_portable_pending_gpu_failure(void);
void h3_portable_clear_gpu_failure(void);

/* The configured device (h3_portable_metal.c): H3_SIM_DEVICE_NAME and friends. */
int h3_portable_device_is_m5(void);
int h3_portable_device_metal4(void);

#endif
