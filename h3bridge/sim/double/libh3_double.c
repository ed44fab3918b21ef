/* h3bridge's test double of libh3: the h3.h ABI (h3_double.h) over h3-sim's engine.
 *
 * Every one of h3.h's functions is exported with upstream's contract (NULL context / NULL
 * result on failure, h3_last_error(NULL) after a failed h3_load_dir, one error buffer of 512
 * bytes per context, device/model info owned by the context, h3_result freed with
 * h3_result_free). What a call *does* - the model layout and tokenizer checks, h3_generate's
 * validation order and messages, the phases and totals, cancellation, previews, frames, the
 * MP4 through FFmpeg, the caches, the fault variables - is h3-sim's engine
 * (h3bridge/sim/engine.py), reached through h3bridge/sim/double_host.py. That way the double
 * and the h3-sim command line share one implementation of upstream's rules, and give
 * byte-identical frames and identical audio for the same request, as upstream's h3 CLI and
 * libh3 do (main.c is a thin layer over h3_generate).
 *
 * The engine is Python, so the double runs inside a Python process (the library engine's
 * worker loads it with ctypes); it takes the GIL around each call, since ctypes.CDLL releases
 * it before calling in. Python symbols are resolved from the host process at load time.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "h3_double.h"

#define H3_ERROR_SIZE 512   /* char error[512], h3.c h3_set_error */

struct h3_ctx {
    PyObject *sim;          /* h3bridge.sim.engine.SimContext */
    char error[H3_ERROR_SIZE];
    h3_device_info device;
    h3_model_info model;
};

static char global_error[H3_ERROR_SIZE];
static const char host_module[] = "h3bridge.sim.double_host";

static void set_error(h3_ctx *ctx, const char *text) {
    snprintf(ctx ? ctx->error : global_error, H3_ERROR_SIZE, "%s", text);
}

static unsigned long long address(const void *pointer) {
    return (unsigned long long)(uintptr_t)pointer;
}

/* Print and clear the pending Python exception. PyErr_Print would exit the process on a
 * SystemExit, which a library call must never do: that one is only cleared. */
static void log_python_error(void) {
    if (PyErr_ExceptionMatches(PyExc_SystemExit)) PyErr_Clear();
    else PyErr_Print();
}

/* A Python exception that escaped the host module is a bug in the double, not an engine
 * message: say so, and print the traceback to stderr for whoever reads the log. */
static void set_python_error(h3_ctx *ctx, const char *function) {
    PyObject *type = NULL, *value = NULL, *traceback = NULL;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    PyObject *text = value ? PyObject_Str(value) : NULL;
    const char *utf8 = text ? PyUnicode_AsUTF8(text) : NULL;
    char message[H3_ERROR_SIZE];
    snprintf(message, sizeof(message), "libh3 double: %s failed inside Python: %s", function,
             utf8 ? utf8 : "unknown error");
    Py_XDECREF(text);
    PyErr_Restore(type, value, traceback);
    log_python_error();
    set_error(ctx, message);
}

static PyObject *host(void) {
    return PyImport_ImportModule(host_module);
}

/* The host functions that can fail return None, or the error text as bytes; generate returns
 * a 1-tuple of bytes for a success that leaves text in h3_last_error (h3.c sets it for a cancel
 * asked for during "FFmpeg", then writes the clip and returns the result all the same). */
static int accept_status(h3_ctx *ctx, PyObject *status, const char *function) {
    if (!status) {
        set_python_error(ctx, function);
        return 0;
    }
    int ok = status == Py_None;
    if (PyTuple_Check(status) && PyTuple_GET_SIZE(status) == 1 && PyBytes_Check(PyTuple_GET_ITEM(status, 0))) {
        set_error(ctx, PyBytes_AS_STRING(PyTuple_GET_ITEM(status, 0)));
        ok = 1;
    } else if (!ok) {
        if (PyBytes_Check(status)) set_error(ctx, PyBytes_AS_STRING(status));
        else set_error(ctx, "libh3 double: the Python host returned an unexpected status");
    }
    Py_DECREF(status);
    return ok;
}

/* Void functions cannot report a failure to their C caller; log it instead. */
static void call_void(const char *function, const char *format, PyObject *sim, long long value) {
    PyObject *module = host();
    PyObject *answer = module ? PyObject_CallMethod(module, function, format, sim, value) : NULL;
    if (!answer) log_python_error();
    Py_XDECREF(answer);
    Py_XDECREF(module);
}

h3_ctx *h3_load_dir(const char *model_dir) {
    global_error[0] = '\0';
    if (!Py_IsInitialized()) {
        set_error(NULL, "the libh3 double runs h3-sim's engine and needs a Python process: "
                        "load it with ctypes from Python");
        return NULL;
    }
    PyGILState_STATE gil = PyGILState_Ensure();
    h3_ctx *ctx = calloc(1, sizeof(*ctx));
    if (!ctx) {
        set_error(NULL, "out of memory creating H3 context");
        PyGILState_Release(gil);
        return NULL;
    }
    PyObject *module = host();
    PyObject *answer = module ? PyObject_CallMethod(module, "load_dir", "yKK", model_dir,
                                                    address(&ctx->device),
                                                    address(&ctx->model)) : NULL;
    Py_XDECREF(module);
    PyObject *sim = NULL, *status = NULL;
    if (answer && !PyArg_ParseTuple(answer, "OO", &sim, &status)) sim = NULL;
    if (!answer || PyErr_Occurred()) {
        set_python_error(NULL, "h3_load_dir");
        sim = NULL;
    } else if (sim == Py_None) {
        Py_INCREF(status);
        accept_status(NULL, status, "h3_load_dir");
        sim = NULL;
    }
    if (sim) {
        Py_INCREF(sim);
        ctx->sim = sim;
    }
    Py_XDECREF(answer);
    PyGILState_Release(gil);
    if (!ctx->sim) {
        free(ctx);
        return NULL;
    }
    return ctx;
}

void h3_free(h3_ctx *ctx) {
    if (!ctx) return;
    PyGILState_STATE gil = PyGILState_Ensure();
    call_void("free", "OL", ctx->sim, 0);
    Py_XDECREF(ctx->sim);
    PyGILState_Release(gil);
    free(ctx);
}

const char *h3_last_error(const h3_ctx *ctx) {
    return ctx ? ctx->error : global_error;
}

const h3_device_info *h3_device(const h3_ctx *ctx) {
    return ctx ? &ctx->device : NULL;
}

const h3_model_info *h3_model(const h3_ctx *ctx) {
    return ctx ? &ctx->model : NULL;
}

void h3_cache_set_enabled(h3_ctx *ctx, int enabled) {
    if (!ctx) return;
    PyGILState_STATE gil = PyGILState_Ensure();
    call_void("cache_set_enabled", "OL", ctx->sim, enabled);
    PyGILState_Release(gil);
}

void h3_cache_clear(h3_ctx *ctx) {
    if (!ctx) return;
    PyGILState_STATE gil = PyGILState_Ensure();
    call_void("cache_clear", "OL", ctx->sim, 0);
    PyGILState_Release(gil);
}

void h3_cache_get_info(const h3_ctx *ctx, h3_cache_info *info) {
    if (!info) return;
    memset(info, 0, sizeof(*info));
    if (!ctx) return;
    PyGILState_STATE gil = PyGILState_Ensure();
    call_void("cache_get_info", "OL", ctx->sim, (long long)address(info));
    PyGILState_Release(gil);
}

h3_result *h3_generate(h3_ctx *ctx, const char *prompt, const h3_params *params) {
    if (!ctx) return NULL;
    ctx->error[0] = '\0';
    h3_result *result = calloc(1, sizeof(*result));
    if (!result) {
        set_error(ctx, "out of memory allocating result");
        return NULL;
    }
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject *module = host();
    /* The prompt goes over as bytes: the engine sees exactly the C string, invalid UTF-8
     * included, as h3-sim sees argv. */
    PyObject *status = module ? PyObject_CallMethod(module, "generate", "OyKK", ctx->sim, prompt,
                                                    address(params), address(result)) : NULL;
    Py_XDECREF(module);
    int ok = accept_status(ctx, status, "h3_generate");
    PyGILState_Release(gil);
    if (!ok) {
        free(result);
        return NULL;
    }
    return result;
}

void h3_result_free(h3_result *result) {
    free(result);
}
