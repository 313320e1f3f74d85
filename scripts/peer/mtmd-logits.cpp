// The peer's logits for a prompt holding one image, teacher-forced over a continuation, through
// libmtmd's and libllama's public APIs. Built by scripts/build-peer.sh (target `mtmd-logits`)
// against the peer's own libraries; the vision tests compare edgelm's logits with these.
//
//   mtmd-logits MODEL MMPROJ IMAGE PROMPT_FILE CONT_FILE OUT [KV_TYPE [THREADS]]
//
// PROMPT_FILE is UTF-8 text with mtmd's default marker (<__media__>) once where the image goes;
// CONT_FILE holds the continuation's token ids, whitespace-separated. KV_TYPE (f16, q8_0 or
// f32; default f16) is the KV cache's type. OUT gets little-endian f32 rows of n_vocab logits,
// one per continuation token: row i is the distribution that predicts continuation token i
// (row 0 comes from the prompt's last position). Prints one line:
//   prompt N image M rows R vocab V ids T1,T2,...
// where ids lists the prompt's positions in order, text tokens as ids, image positions as -1.
// Flash attention is on for every KV_TYPE, and with it llama.cpp casts an f32 cache to f16
// before attention: f32 gives f16's logits, bit for bit.
#include "llama.h"
#include "mtmd.h"
#include "mtmd-helper.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

[[noreturn]] static void fail(const std::string & msg) {
    fprintf(stderr, "mtmd-logits: %s\n", msg.c_str());
    exit(1);
}

static std::string slurp(const char * path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) {
        fail(std::string("cannot read ") + path);
    }
    std::ostringstream s;
    s << f.rdbuf();
    return s.str();
}

int main(int argc, char ** argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: %s MODEL MMPROJ IMAGE PROMPT_FILE CONT_FILE OUT [KV_TYPE [THREADS]]\n",
            argv[0]);
        return 2;
    }
    const std::string kv = argc > 7 ? argv[7] : "f16";
    const int threads = argc > 8 ? atoi(argv[8]) : 2;
    ggml_type kv_type;
    if (kv == "f16") {
        kv_type = GGML_TYPE_F16;
    } else if (kv == "q8_0") {
        kv_type = GGML_TYPE_Q8_0;
    } else if (kv == "f32") {
        kv_type = GGML_TYPE_F32;
    } else {
        fail("KV_TYPE must be f16, q8_0 or f32, not " + kv);
    }
    if (threads < 1) {
        fail("THREADS must be a positive integer");
    }
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    mtmd_helper_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    // A failed GGML_ASSERT would print a backtrace (and may fire on several threads at once):
    // one line and exit 1 instead, like every other failure here.
    ggml_set_abort_callback([](const char * msg) {
        static std::mutex once;
        once.lock();
        fprintf(stderr, "mtmd-logits: ggml: %.*s\n", (int) strcspn(msg, "\n"), msg);
        fflush(stderr);
        _exit(1);
    });
    llama_backend_init();

    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fail(std::string("cannot load ") + argv[1]);
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    mtmd_context_params cp = mtmd_context_params_default();
    cp.use_gpu = false;
    cp.n_threads = threads;
    cp.print_timings = false;
    cp.warmup = false;
    mtmd_context * mctx = mtmd_init_from_file(argv[2], model, cp);
    if (!mctx) {
        fail(std::string("cannot load ") + argv[2]);
    }
    mtmd_helper_bitmap_wrapper bw = mtmd_helper_bitmap_init_from_file(mctx, argv[3], false,
        mtmd_helper_init_opt_default());
    if (!bw.bitmap) {
        fail(std::string("cannot read ") + argv[3]);
    }

    const std::string prompt = slurp(argv[4]);
    mtmd_input_text text = {prompt.c_str(), prompt.size(), true, true};
    const mtmd_bitmap * bitmaps[] = {bw.bitmap};
    mtmd_input_chunks * chunks = mtmd_input_chunks_init();
    if (mtmd_tokenize(mctx, chunks, &text, bitmaps, 1) != 0) {
        fail("mtmd_tokenize failed (is the marker in the prompt exactly once?)");
    }
    std::string ids;
    size_t n_prompt = 0, n_image = 0;
    for (size_t i = 0; i < mtmd_input_chunks_size(chunks); i++) {
        const mtmd_input_chunk * c = mtmd_input_chunks_get(chunks, i);
        if (mtmd_input_chunk_get_type(c) == MTMD_INPUT_CHUNK_TYPE_TEXT) {
            size_t n = 0;
            const llama_token * t = mtmd_input_chunk_get_tokens_text(c, &n);
            for (size_t j = 0; j < n; j++, n_prompt++) {
                ids += (n_prompt ? "," : "") + std::to_string(t[j]);
            }
        } else {
            const size_t n = mtmd_input_chunk_get_n_tokens(c);
            for (size_t j = 0; j < n; j++, n_prompt++) {
                ids += n_prompt ? ",-1" : "-1";
            }
            n_image += n;
        }
    }

    std::vector<llama_token> cont;
    std::istringstream cs(slurp(argv[5]));
    for (long long t; cs >> t;) {
        if (t < 0 || t >= n_vocab) {
            fail("continuation token " + std::to_string(t) + " is outside the vocabulary");
        }
        cont.push_back((llama_token) t);
    }
    if (!cs.eof()) {
        fail(std::string("CONT_FILE holds something other than integers: ") + argv[5]);
    }
    const int n_batch = 512;
    if (cont.empty() || cont.size() > (size_t) n_batch) {
        fail("the continuation must hold 1 to " + std::to_string(n_batch) + " tokens");
    }

    llama_context_params lp = llama_context_default_params();
    lp.n_ctx = 4096;
    lp.n_batch = n_batch;
    lp.n_ubatch = n_batch;
    lp.n_threads = threads;
    lp.n_threads_batch = threads;
    lp.type_k = kv_type;
    lp.type_v = kv_type;
    // A quantized V cache needs flash attention; it is on for every type so that only the
    // cache's type differs between runs.
    lp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    lp.offload_kqv = false;
    lp.op_offload = false;
    if ((size_t) mtmd_helper_get_n_pos(chunks) + cont.size() > lp.n_ctx) {
        fail("prompt and continuation exceed n_ctx " + std::to_string(lp.n_ctx));
    }
    llama_context * lctx = llama_init_from_model(model, lp);
    if (!lctx) {
        fail("cannot create the llama context");
    }

    llama_pos n_past = 0;
    if (mtmd_helper_eval_chunks(mctx, lctx, chunks, 0, 0, n_batch, true, &n_past) != 0) {
        fail("mtmd_helper_eval_chunks failed");
    }
    std::vector<float> rows(cont.size() * (size_t) n_vocab);
    const float * last = llama_get_logits_ith(lctx, -1);
    if (!last) {
        fail("no logits after the prompt (does it end with the image?)");
    }
    memcpy(rows.data(), last, sizeof(float) * n_vocab);

    llama_batch batch = llama_batch_init((int32_t) cont.size(), 0, 1);
    for (size_t i = 0; i < cont.size(); i++) {
        batch.token[i] = cont[i];
        batch.pos[i] = n_past + (llama_pos) i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
    }
    batch.n_tokens = (int32_t) cont.size();
    if (llama_decode(lctx, batch) != 0) {
        fail("llama_decode of the continuation failed");
    }
    for (size_t i = 0; i + 1 < cont.size(); i++) {
        const float * l = llama_get_logits_ith(lctx, (int32_t) i);
        if (!l) {
            fail("no logits for continuation token " + std::to_string(i));
        }
        memcpy(rows.data() + (i + 1) * n_vocab, l, sizeof(float) * n_vocab);
    }

    FILE * out = fopen(argv[6], "wb");
    if (!out || fwrite(rows.data(), sizeof(float), rows.size(), out) != rows.size() || fclose(out)) {
        fail(std::string("cannot write ") + argv[6]);
    }
    printf("prompt %zu image %zu rows %zu vocab %d ids %s\n", n_prompt, n_image, cont.size(),
        n_vocab, ids.c_str());
    llama_batch_free(batch);
    llama_free(lctx);
    mtmd_input_chunks_free(chunks);
    mtmd_bitmap_free(bw.bitmap);
    mtmd_free(mctx);
    llama_model_free(model);
    return 0;
}
