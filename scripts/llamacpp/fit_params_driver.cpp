// llama.cpp's own --fit (common_fit_params, common/fit.cpp) run on a model, as
// tools/fit-params/fit-params.cpp runs it, with the options given as key=value arguments.
//
// Building tools/fit-params needs all of libcommon (arg.cpp, chat, http...); this driver needs
// only fit.cpp and log.cpp from the vendored source, linked against llama-cpp-python's
// libllama/libggml (the same vendored llama.cpp), so record_fit_params.py builds it in a minute.
// The params are set as common_model_params_to_llama / common_context_params_to_llama set them
// from the command line; margins are bytes (llama.cpp's --fit-target is MiB * 2^20).
// Output: one line `-c N -ngl N [-ts A,B] [-ot "PAT=BUFT,..."]`, as llama-fit-params prints it,
// or, when the fit fails, `REFUSED` (its message is on stderr: "failed to fit params ...: MSG").
#include "fit.h"
#include "log.h"
#include "llama.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml-rpc.h"

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

// log.cpp asks common.cpp whether to colour its lines; this driver never does
bool tty_can_use_colors() { return false; }

static std::vector<std::string> split(const std::string & s, char sep) {
    std::vector<std::string> out;
    size_t start = 0;
    while (start <= s.size()) {
        size_t end = s.find(sep, start);
        if (end == std::string::npos) end = s.size();
        if (end > start) out.push_back(s.substr(start, end - start));
        start = end + 1;
    }
    return out;
}

static ggml_type kv_type(const std::string & name) {
    const ggml_type types[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0,
                               GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_IQ4_NL, GGML_TYPE_Q5_0,
                               GGML_TYPE_Q5_1};
    for (ggml_type t : types) {
        if (name == ggml_type_name(t)) return t;
    }
    fprintf(stderr, "unknown kv type %s\n", name.c_str());
    exit(2);
}

int main(int argc, char ** argv) {
    std::string model;
    llama_model_params mparams = llama_model_default_params();
    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = 0;                    // common_params: n_ctx 0 (the training context)
    cparams.n_batch = 2048;
    cparams.n_ubatch = 512;
    cparams.n_seq_max = 1;
    cparams.swa_full = false;             // common_params: swa_full false (llama's own default: true)
    float tensor_split[128] = {0};
    std::vector<size_t> margins(128, size_t(1) << 30);
    uint32_t fit_ctx = 4096;
    std::vector<std::string> patterns;    // user -ot (to the CPU)
    std::vector<llama_model_tensor_buft_override> tbo(llama_max_tensor_buft_overrides() + 1);

    for (int i = 1; i < argc; i++) {
        std::string arg = argv[i];
        size_t eq = arg.find('=');
        std::string key = arg.substr(0, eq), val = eq == std::string::npos ? "" : arg.substr(eq + 1);
        if (key == "model") model = val;
        else if (key == "rpc") {
            for (const auto & ep : split(val, ',')) {
                ggml_backend_register(ggml_backend_rpc_add_server(ep.c_str()));
            }
        }
        else if (key == "ctx") cparams.n_ctx = std::stoul(val);
        else if (key == "ubatch") cparams.n_ubatch = std::stoul(val);
        else if (key == "parallel") cparams.n_seq_max = std::stoul(val);
        else if (key == "kv_unified") cparams.kv_unified = val == "1";
        else if (key == "swa_full") cparams.swa_full = val == "1";
        else if (key == "flash_attn") cparams.flash_attn_type = val == "on" ? LLAMA_FLASH_ATTN_TYPE_ENABLED
                                          : val == "off" ? LLAMA_FLASH_ATTN_TYPE_DISABLED : LLAMA_FLASH_ATTN_TYPE_AUTO;
        else if (key == "type_k") cparams.type_k = kv_type(val);
        else if (key == "type_v") cparams.type_v = kv_type(val);
        else if (key == "no_kv_offload") cparams.offload_kqv = val != "1";
        else if (key == "ngl") mparams.n_gpu_layers = std::stoi(val);
        else if (key == "split_mode") mparams.split_mode = val == "row" ? LLAMA_SPLIT_MODE_ROW
                                          : val == "tensor" ? LLAMA_SPLIT_MODE_TENSOR
                                          : val == "none" ? LLAMA_SPLIT_MODE_NONE : LLAMA_SPLIT_MODE_LAYER;
        else if (key == "ts") {
            auto parts = split(val, ',');
            for (size_t j = 0; j < parts.size(); j++) tensor_split[j] = std::stof(parts[j]);
        }
        else if (key == "margins") {
            auto parts = split(val, ',');
            for (size_t j = 0; j < margins.size(); j++) {
                margins[j] = std::stoull(parts[parts.size() == 1 ? 0 : std::min(j, parts.size() - 1)]);
            }
        }
        else if (key == "fit_ctx") fit_ctx = std::stoul(val);
        else if (key == "ot") patterns.push_back(val);
        else { fprintf(stderr, "unknown argument %s\n", arg.c_str()); return 2; }
    }
    size_t n = 0;
    for (const auto & p : patterns) tbo[n++] = {p.c_str(), ggml_backend_cpu_buffer_type()};
    tbo[n] = {nullptr, nullptr};
    // common_model_params_to_llama: tensor_split always points at params.tensor_split; the
    // overrides only when some were given
    mparams.tensor_split = tensor_split;
    mparams.tensor_buft_overrides = patterns.empty() ? nullptr : tbo.data();

    llama_backend_init();
    common_log_set_verbosity_thold(LOG_LEVEL_DEBUG);
    const common_params_fit_status status = common_fit_params(model.c_str(), &mparams, &cparams,
        tensor_split, tbo.data(), margins.data(), fit_ctx, nullptr, GGML_LOG_LEVEL_ERROR);
    common_log_flush(common_log_main());
    if (status != COMMON_PARAMS_FIT_STATUS_SUCCESS) {
        printf("REFUSED %d\n", int(status));
        return 0;
    }
    printf("-c %" PRIu32 " -ngl %" PRIi32, cparams.n_ctx, mparams.n_gpu_layers);
    size_t nd = llama_max_devices();
    while (nd > 1 && mparams.tensor_split[nd - 1] == 0.0f) nd--;
    if (nd > 1) {
        for (size_t id = 0; id < nd; id++) {
            printf("%s%" PRIu32, id == 0 ? " -ts " : ",", uint32_t(mparams.tensor_split[id]));
        }
    }
    bool any = false;
    for (size_t i = 0; mparams.tensor_buft_overrides && mparams.tensor_buft_overrides[i].pattern; i++) {
        printf("%s%s=%s", i == 0 ? " -ot \"" : ",", mparams.tensor_buft_overrides[i].pattern,
               ggml_backend_buft_name(mparams.tensor_buft_overrides[i].buft));
        any = true;
    }
    printf("%s\n", any ? "\"" : "");
    return 0;
}
