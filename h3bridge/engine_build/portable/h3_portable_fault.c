/* Fault injection for the portable build, with h3-sim's variables and meaning
 * (h3bridge/sim/engine.py _Progress.emit):
 *   H3_SIM_CRASH_PHASE  <phase>[:<done>]  report that progress, then die with SIGSEGV
 *   H3_SIM_HANG_PHASE   <phase>[:<done>]  report that progress, then never progress again
 *   H3_SIM_HANG_NOTICE  a file created (holding the pid) once a hang has fired
 *   H3_SIM_FAIL_PHASE   <phase>[:<done>]  report that progress, then the next command buffer
 *                       fails with H3_SIM_FAIL_MESSAGE (upstream then reports it with its own
 *                       prefix, as it would a Metal failure on a Mac)
 * Without :<done> a fault fires at the phase's first report.
 *
 * Upstream's progress is the on_progress callback of h3_generate's parameters (the CLI's
 * progress lines are its own callback). The build compiles upstream's h3.c with
 * -Dh3_generate=h3_portable_upstream_generate, so this h3_generate runs first: when a fault
 * is configured it passes upstream a copy of the parameters whose callback reports to the
 * caller's and then applies the fault. Without one it calls upstream with the caller's own. */
#define _GNU_SOURCE
#include "h3.h"
#include "h3_portable.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PB_DEFAULT_FAIL_MESSAGE "Metal command buffer failed: Internal Error (0000000e:Internal Error)"

h3_result *h3_portable_upstream_generate(h3_ctx *ctx, const char *prompt, const h3_params *params);

typedef struct {
    char phase[128];
    int has_done;
    int done;
    int set;
} pb_fault;

typedef struct {
    h3_progress_callback on_progress;
    h3_frame_callback on_frame;
    void *opaque;
} pb_caller;

static char pb_pending_failure[512];
static int pb_failure_armed;

const char *h3_portable_pending_gpu_failure(void) { return pb_failure_armed ? pb_pending_failure : NULL; }
void h3_portable_clear_gpu_failure(void) { pb_failure_armed = 0; }

static pb_fault pb_parse(const char *variable) {
    pb_fault fault;
    memset(&fault, 0, sizeof(fault));
    const char *text = getenv(variable);
    if (!text || !*text) return fault;
    fault.set = 1;
    snprintf(fault.phase, sizeof(fault.phase), "%s", text);
    char *colon = strrchr(fault.phase, ':');
    if (colon && colon[1]) {
        char *end = NULL;
        long value = strtol(colon + 1, &end, 10);
        if (end && !*end) {
            fault.has_done = 1;
            fault.done = (int)value;
            *colon = '\0';
        }
    }
    return fault;
}

static int pb_matches(const pb_fault *fault, const char *phase, int done) {
    return fault->set && phase && !strcmp(fault->phase, phase) && (!fault->has_done || fault->done == done);
}

static int pb_frame(const h3_frame *frame, void *opaque) {
    const pb_caller *caller = opaque;
    return caller->on_frame(frame, caller->opaque);
}

static int pb_progress(const char *phase, int completed, int total, void *opaque) {
    const pb_caller *caller = opaque;
    int cancel = caller->on_progress ? caller->on_progress(phase, completed, total, caller->opaque) : 0;
    pb_fault crash = pb_parse("H3_SIM_CRASH_PHASE");
    pb_fault hang = pb_parse("H3_SIM_HANG_PHASE");
    pb_fault fail = pb_parse("H3_SIM_FAIL_PHASE");
    if (pb_matches(&crash, phase, completed)) {
        fflush(stderr);
        signal(SIGSEGV, SIG_DFL);
        raise(SIGSEGV);
        for (;;) pause();
    }
    if (pb_matches(&hang, phase, completed)) {
        fflush(stderr);
        const char *notice = getenv("H3_SIM_HANG_NOTICE");
        if (notice && *notice) {
            char temporary[4096];
            snprintf(temporary, sizeof(temporary), "%s.%d.tmp", notice, (int)getpid());
            FILE *file = fopen(temporary, "w");
            if (file) {
                fprintf(file, "%d\n", (int)getpid());
                fclose(file);
                rename(temporary, notice);
            }
        }
        for (;;) pause();
    }
    if (pb_matches(&fail, phase, completed)) {
        const char *message = getenv("H3_SIM_FAIL_MESSAGE");
        snprintf(pb_pending_failure, sizeof(pb_pending_failure), "%s",
                 message && *message ? message : PB_DEFAULT_FAIL_MESSAGE);
        pb_failure_armed = 1;
    }
    return cancel;
}

h3_result *h3_generate(h3_ctx *ctx, const char *prompt, const h3_params *params) {
    const char *names[] = {"H3_SIM_CRASH_PHASE", "H3_SIM_HANG_PHASE", "H3_SIM_FAIL_PHASE"};
    int faulty = 0;
    for (size_t index = 0; index < sizeof(names) / sizeof(names[0]); index++) {
        const char *value = getenv(names[index]);
        if (value && *value) faulty = 1;
    }
    pb_failure_armed = 0;
    if (!faulty || !params) return h3_portable_upstream_generate(ctx, prompt, params);
    pb_caller caller = {params->on_progress, params->on_frame, params->callback_opaque};
    h3_params wrapped = *params;
    wrapped.on_progress = pb_progress;
    /* Both callbacks share callback_opaque: frames go through a trampoline too. */
    wrapped.on_frame = params->on_frame ? pb_frame : NULL;
    wrapped.callback_opaque = &caller;
    return h3_portable_upstream_generate(ctx, prompt, &wrapped);
}
