/* LD_PRELOAD shim for record_fit_params.py: the devices' reported memory. llama.cpp's --fit
 * reads each device's free memory through ggml_backend_dev_memory (exported by libggml-base,
 * called through the PLT, so a preloaded definition replaces it). $FIT_MEM is a list
 * `NAME=BYTES;...`: a device whose name is NAME (the CPU: "CPU") or or description contains
 * it (an RPC device: its endpoint, "127.0.0.1:PORT", is its description) reports BYTES free and total; others are asked. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-backend.h"

void ggml_backend_dev_memory(ggml_backend_dev_t device, size_t *free, size_t *total) {
    static __typeof__(ggml_backend_dev_memory) *real = NULL;
    if (!real) {
        real = (__typeof__(ggml_backend_dev_memory) *) dlsym(RTLD_NEXT, "ggml_backend_dev_memory");
    }
    const char *name = ggml_backend_dev_name(device);
    const char *desc = ggml_backend_dev_description(device);
    const char *spec = getenv("FIT_MEM");
    for (const char *p = spec; p && *p;) {
        const char *eq = strchr(p, '='), *end = strchr(p, ';');
        if (!eq) break;
        if (!end) end = p + strlen(p);
        char key[256] = {0};
        size_t len = (size_t)(eq - p) < sizeof key - 1 ? (size_t)(eq - p) : sizeof key - 1;
        memcpy(key, p, len);
        int hit = strcmp(key, "CPU") == 0 ? strcmp(name, "CPU") == 0 : (strstr(name, key) || (desc && strstr(desc, key)));
        if (hit) {
            *free = *total = strtoull(eq + 1, NULL, 10);
            return;
        }
        p = *end ? end + 1 : end;
    }
    real(device, free, total);
}
