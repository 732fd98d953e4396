/* LD_PRELOAD shim: records llama.cpp's exact buffer sizes and its scheduled graphs.
 *
 * llama.cpp logs its buffers rounded to MiB; the conformance figures need bytes. libllama calls
 * these ggml functions through the PLT, so a preloaded definition sees every call, forwards it
 * to the real one (dlsym RTLD_NEXT) and writes one line to the file named by $SHIM_LOG.
 * A per-thread depth counter keeps only the outermost call, so a buffer allocated inside
 * ggml_backend_alloc_ctx_tensors_from_buft (or by the scheduler's own allocator) is not counted
 * twice. Lines are tab separated (tensor names contain spaces):
 *   M  <text>                                   phase marker written by the recorder
 *   B  <function> <buffer-type name> <bytes>    model / KV / output buffers (a recurrent
 *      state's: alloc_ctx_tensors_rs)
 *   S  <backend name> <bytes>                   ggml_backend_sched_get_buffer_size
 *   G  begin <reserve|compute> <n_nodes> <n_splits>, then N/L lines, then G end
 *   N  <index> <name> <op> <type> <ne0,ne1,ne2,ne3> <nb0,..> <backend> <flags> <view_src>
 *      <view_offs> <op_params,...> <srcs as built> <srcs after the split: the input copies>
 *      (src names joined by '|', an empty name where a src is absent) <alloc size: what the
 *      node's backend's buffer type allocates for it; empty for views>
 *   L  <name> <op> <type> <ne> <nb> <backend> <flags> <view_src> <buffer name>: the graph's
 *      leaves in its order first, then any other non-node src
 * Compiled by record.py at record time against the headers the llama-cpp-python wheel installs.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"

static FILE *shim_out(void) {
    static FILE *out = NULL;
    if (!out) {
        const char *path = getenv("SHIM_LOG");
        out = path ? fopen(path, "a") : stderr;
        if (!out) {
            out = stderr;
        }
    }
    return out;
}

static __thread int depth = 0;

#define REAL(name) \
    static __typeof__(name) *real = NULL; \
    if (!real) { real = (__typeof__(name) *) dlsym(RTLD_NEXT, #name); }

void shim_mark(const char *text) {
    fprintf(shim_out(), "M\t%s\n", text);
    fflush(shim_out());
}

static void log_buffer(const char *fn, ggml_backend_buffer_t buf) {
    if (depth == 0 && buf) {
        fprintf(shim_out(), "B\t%s\t%s\t%zu\n", fn, ggml_backend_buffer_name(buf),
                ggml_backend_buffer_get_size(buf));
        fflush(shim_out());
    }
}

ggml_backend_buffer_t ggml_backend_alloc_ctx_tensors_from_buft(struct ggml_context *ctx,
                                                               ggml_backend_buffer_type_t buft) {
    REAL(ggml_backend_alloc_ctx_tensors_from_buft);
    depth++;
    ggml_backend_buffer_t buf = real(ctx, buft);
    depth--;
    /* a recurrent state's buffer (llama_memory_recurrent: cache_r_l<il> / cache_s_l<il>) is told
       apart from a KV cache's by its first tensor's name */
    struct ggml_tensor *first = ggml_get_first_tensor(ctx);
    int rs = first && (strncmp(ggml_get_name(first), "cache_r_l", 9) == 0 ||
                       strncmp(ggml_get_name(first), "cache_s_l", 9) == 0);
    log_buffer(rs ? "alloc_ctx_tensors_rs" : "alloc_ctx_tensors", buf);
    return buf;
}

ggml_backend_buffer_t ggml_backend_dev_buffer_from_host_ptr(ggml_backend_dev_t dev, void *ptr,
                                                            size_t size, size_t max_tensor_size) {
    REAL(ggml_backend_dev_buffer_from_host_ptr);
    depth++;
    ggml_backend_buffer_t buf = real(dev, ptr, size, max_tensor_size);
    depth--;
    log_buffer("buffer_from_host_ptr", buf);
    return buf;
}

ggml_backend_buffer_t ggml_backend_buft_alloc_buffer(ggml_backend_buffer_type_t buft, size_t size) {
    REAL(ggml_backend_buft_alloc_buffer);
    depth++;
    ggml_backend_buffer_t buf = real(buft, size);
    depth--;
    log_buffer("buft_alloc_buffer", buf);
    return buf;
}

size_t ggml_backend_sched_get_buffer_size(ggml_backend_sched_t sched, ggml_backend_t backend) {
    REAL(ggml_backend_sched_get_buffer_size);
    size_t size = real(sched, backend);
    if (depth == 0) {
        fprintf(shim_out(), "S\t%s\t%zu\n", ggml_backend_name(backend), size);
        fflush(shim_out());
    }
    return size;
}

static const char *backend_of(ggml_backend_sched_t sched, struct ggml_tensor *t) {
    ggml_backend_t b = ggml_backend_sched_get_tensor_backend(sched, t);
    return b ? ggml_backend_name(b) : "";
}

static void put_dims(FILE *out, struct ggml_tensor *t) {
    fprintf(out, "\t%lld,%lld,%lld,%lld", (long long) t->ne[0], (long long) t->ne[1],
            (long long) t->ne[2], (long long) t->ne[3]);
    fprintf(out, "\t%zu,%zu,%zu,%zu", t->nb[0], t->nb[1], t->nb[2], t->nb[3]);
}

static int by_address(const void *a, const void *b) {
    const void *x = *(const void *const *) a, *y = *(const void *const *) b;
    return (x > y) - (x < y);
}

/* The scheduler rewrites each node's srcs to its split-input copies and forgets every
 * assignment when it resets, so the graph is remembered when it is split (with the srcs as the
 * model built them) and written out just before the reset, or after the compute. */
static struct ggml_cgraph *pending = NULL;
static struct ggml_tensor **pending_srcs = NULL;
static const char *pending_kind = "compute";  /* "reserve" while in ggml_backend_sched_reserve */

static void put_srcs(FILE *out, struct ggml_tensor **src) {
    int n_src = GGML_MAX_SRC;
    while (n_src > 0 && !src[n_src - 1]) {
        n_src--;
    }
    fputc('\t', out);
    for (int j = 0; j < n_src; j++) {  /* positions matter: an absent src is an empty field */
        fprintf(out, "%s%s", j ? "|" : "", src[j] ? src[j]->name : "");
    }
}

/* The leading fields of ggml's struct ggml_cgraph (ggml-impl.h, not installed): the public API
 * has no way to list leaves, and an input leaf no node reads (inp_embd) still takes memory.
 * Used only when it agrees with the public accessors. */
struct cgraph_prefix {
    int size;
    int n_nodes;
    int n_leafs;
    struct ggml_tensor **nodes;
    struct ggml_tensor **grads;
    struct ggml_tensor **grad_accs;
    struct ggml_tensor **leafs;
};

static void put_leaf(FILE *out, ggml_backend_sched_t sched, struct ggml_tensor *s) {
    ggml_backend_buffer_t buf = s->view_src ? s->view_src->buffer : s->buffer;
    fprintf(out, "L\t%s\t%s\t%s", s->name, ggml_op_desc(s), ggml_type_name(s->type));
    put_dims(out, s);
    fprintf(out, "\t%s\t%d\t%s\t%s\n", backend_of(sched, s), s->flags,
            s->view_src ? s->view_src->name : "", buf ? ggml_backend_buffer_name(buf) : "");
}

/* What the node's backend's buffer type allocates for it (ggml_backend_buft_get_alloc_size):
 * ggml-cuda asks more than ggml_nbytes for FLASH_ATTN_EXT (f16 copies of K and V) and pads
 * quantized rows. Empty for views (they take no memory of their own) and unassigned nodes. */
static void put_alloc(FILE *out, ggml_backend_sched_t sched, struct ggml_tensor *t) {
    ggml_backend_t b = ggml_backend_sched_get_tensor_backend(sched, t);
    fputc('\t', out);
    if (b && !t->view_src) {
        fprintf(out, "%zu", ggml_backend_buft_get_alloc_size(ggml_backend_get_default_buffer_type(b), t));
    }
}

static void dump_pending(ggml_backend_sched_t sched) {
    FILE *out = shim_out();
    struct ggml_cgraph *graph = pending;
    int n = ggml_graph_n_nodes(graph);
    fprintf(out, "G\tbegin\t%s\t%d\t%d\n", pending_kind, n, ggml_backend_sched_get_n_splits(sched));
    struct ggml_tensor **nodes = malloc(sizeof(*nodes) * (n > 0 ? n : 1));
    for (int i = 0; i < n; i++) {
        nodes[i] = ggml_graph_node(graph, i);
    }
    qsort(nodes, n, sizeof(*nodes), by_address);
    size_t cap = 1024, n_seen = 0;
    struct ggml_tensor **seen = malloc(sizeof(*seen) * cap);
    const struct cgraph_prefix *layout = (const struct cgraph_prefix *) graph;
    if (layout->n_nodes == n && (n == 0 || layout->nodes[0] == ggml_graph_node(graph, 0)) &&
        layout->n_leafs >= 0 && layout->n_leafs <= layout->size) {
        for (int k = 0; k < layout->n_leafs; k++) {   /* in the graph's leaf order */
            if (n_seen == cap) {
                cap *= 2;
                seen = realloc(seen, sizeof(*seen) * cap);
            }
            seen[n_seen++] = layout->leafs[k];
            put_leaf(out, sched, layout->leafs[k]);
        }
    }
    for (int i = 0; i < n; i++) {
        struct ggml_tensor *t = ggml_graph_node(graph, i);
        struct ggml_tensor **src = pending_srcs + (size_t) i * GGML_MAX_SRC;
        for (int j = 0; j < GGML_MAX_SRC; j++) {
            struct ggml_tensor *s = src[j];
            if (!s || bsearch(&s, nodes, n, sizeof(*nodes), by_address)) {
                continue;
            }
            int known = 0;
            for (size_t k = 0; k < n_seen && !known; k++) {
                known = seen[k] == s;
            }
            if (known) {
                continue;
            }
            if (n_seen == cap) {
                cap *= 2;
                seen = realloc(seen, sizeof(*seen) * cap);
            }
            seen[n_seen++] = s;
            put_leaf(out, sched, s);
        }
        fprintf(out, "N\t%d\t%s\t%s\t%s", i, t->name, ggml_op_desc(t), ggml_type_name(t->type));
        put_dims(out, t);
        fprintf(out, "\t%s\t%d\t%s\t%zu\t", backend_of(sched, t), t->flags,
                t->view_src ? t->view_src->name : "", t->view_offs);
        int last = GGML_MAX_OP_PARAMS / (int) sizeof(int32_t) - 1;
        while (last >= 0 && t->op_params[last] == 0) {
            last--;
        }
        for (int k = 0; k <= last; k++) {
            fprintf(out, k ? ",%d" : "%d", t->op_params[k]);
        }
        put_srcs(out, src);     /* as the model built them */
        put_srcs(out, t->src);  /* as the scheduler rewired them to split-input copies */
        put_alloc(out, sched, t);
        fputc('\n', out);
    }
    fprintf(out, "G\tend\n");
    fflush(out);
    free(seen);
    free(nodes);
    free(pending_srcs);
    pending_srcs = NULL;
    pending = NULL;
}

void ggml_backend_sched_split_graph(ggml_backend_sched_t sched, struct ggml_cgraph *graph) {
    REAL(ggml_backend_sched_split_graph);
    {
        int n = ggml_graph_n_nodes(graph);
        free(pending_srcs);
        pending_srcs = malloc(sizeof(*pending_srcs) * GGML_MAX_SRC * (size_t) (n > 0 ? n : 1));
        for (int i = 0; i < n; i++) {
            memcpy(pending_srcs + (size_t) i * GGML_MAX_SRC, ggml_graph_node(graph, i)->src,
                   sizeof(*pending_srcs) * GGML_MAX_SRC);
        }
        pending = graph;
    }
    real(sched, graph);
}

void ggml_backend_sched_reset(ggml_backend_sched_t sched) {
    REAL(ggml_backend_sched_reset);
    if (pending && depth > 0) {
        dump_pending(sched);
    }
    real(sched);
}

bool ggml_backend_sched_reserve(ggml_backend_sched_t sched, struct ggml_cgraph *graph) {
    REAL(ggml_backend_sched_reserve);
    pending_kind = "reserve";
    depth++;
    bool ok = real(sched, graph);
    depth--;
    pending_kind = "compute";
    return ok;
}

enum ggml_status ggml_backend_sched_graph_compute_async(ggml_backend_sched_t sched,
                                                        struct ggml_cgraph *graph) {
    REAL(ggml_backend_sched_graph_compute_async);
    depth++;
    enum ggml_status status = real(sched, graph);
    depth--;
    if (pending) {
        dump_pending(sched);
    }
    return status;
}
