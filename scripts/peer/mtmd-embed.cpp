// The peer's image embeddings, through libmtmd's public API: what llama.cpp's projector hands
// its text model for one image. Built by scripts/build-peer.sh (target `mtmd-embed`) against
// the peer's own libraries; used by the vision tests and `scripts/compare-vision.sh`.
//
//   mtmd-embed MODEL MMPROJ IMAGE OUT [THREADS [ROUNDS]]
//
// Writes OUT as little-endian f32: every image chunk's rows (n_embd values each), in prompt
// order (a tiled image is several chunks: its tiles and overview). Prints one line:
//   tokens N embd E encode_ms M1,M2,... layout L
// where N counts the image rows, each M is one round's encode time of all the image's chunks
// (the image preprocessed once, encoded ROUNDS times), and L is the prompt as mtmd lays it
// out, comma-separated: text token ids, and [R] for an image chunk of R rows.
#include "llama.h"
#include "mtmd.h"
#include "mtmd-helper.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static std::string ids(const mtmd_input_chunk * chunk) {
    size_t n = 0;
    const llama_token * t = mtmd_input_chunk_get_tokens_text(chunk, &n);
    std::string out;
    for (size_t i = 0; i < n; i++) {
        out += (i ? "," : "") + std::to_string(t[i]);
    }
    return out;
}

int main(int argc, char ** argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL MMPROJ IMAGE OUT [THREADS [ROUNDS]]\n", argv[0]);
        return 2;
    }
    const int threads = argc > 5 ? atoi(argv[5]) : 2;
    const int rounds = argc > 6 ? atoi(argv[6]) : 1;
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    mtmd_helper_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "mtmd-embed: cannot load %s\n", argv[1]);
        return 1;
    }
    mtmd_context_params cp = mtmd_context_params_default();
    cp.use_gpu = false;
    cp.n_threads = threads;
    cp.print_timings = false;
    cp.warmup = false;
    mtmd_context * ctx = mtmd_init_from_file(argv[2], model, cp);
    if (!ctx) {
        fprintf(stderr, "mtmd-embed: cannot load %s\n", argv[2]);
        return 1;
    }
    mtmd_helper_bitmap_wrapper bw = mtmd_helper_bitmap_init_from_file(ctx, argv[3], false,
        mtmd_helper_init_opt_default());
    if (!bw.bitmap) {
        fprintf(stderr, "mtmd-embed: cannot read %s\n", argv[3]);
        return 1;
    }
    mtmd_input_chunks * chunks = mtmd_input_chunks_init();
    mtmd_input_text text = {mtmd_default_marker(), strlen(mtmd_default_marker()), false, true};
    const mtmd_bitmap * bitmaps[] = {bw.bitmap};
    if (mtmd_tokenize(ctx, chunks, &text, bitmaps, 1) != 0) {
        fprintf(stderr, "mtmd-embed: mtmd_tokenize failed\n");
        return 1;
    }
    std::string layout;
    std::vector<const mtmd_input_chunk *> images;
    for (size_t i = 0; i < mtmd_input_chunks_size(chunks); i++) {
        const mtmd_input_chunk * c = mtmd_input_chunks_get(chunks, i);
        std::string piece;
        if (mtmd_input_chunk_get_type(c) == MTMD_INPUT_CHUNK_TYPE_IMAGE) {
            images.push_back(c);
            piece = "[" + std::to_string(mtmd_input_chunk_get_n_tokens(c)) + "]";
        } else {
            piece = ids(c);
        }
        if (!piece.empty()) {
            layout += (layout.empty() ? "" : ",") + piece;
        }
    }
    if (images.empty()) {
        fprintf(stderr, "mtmd-embed: no image chunk\n");
        return 1;
    }
    const int n_embd = llama_model_n_embd_inp(model);
    std::string times;
    std::vector<float> rows;
    for (int r = 0; r < rounds; r++) {
        double ms = 0;
        rows.clear();
        for (const mtmd_input_chunk * image : images) {
            auto t0 = std::chrono::steady_clock::now();
            if (mtmd_encode_chunk(ctx, image) != 0) {
                fprintf(stderr, "mtmd-embed: mtmd_encode_chunk failed\n");
                return 1;
            }
            ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            const float * embd = mtmd_get_output_embd(ctx);
            rows.insert(rows.end(), embd, embd + mtmd_input_chunk_get_n_tokens(image) * n_embd);
        }
        times += (r ? "," : "") + std::to_string(ms);
    }
    const size_t n_tokens = rows.size() / n_embd;
    FILE * out = fopen(argv[4], "wb");
    if (!out || fwrite(rows.data(), sizeof(float), rows.size(), out) != rows.size()) {
        fprintf(stderr, "mtmd-embed: cannot write %s\n", argv[4]);
        return 1;
    }
    fclose(out);
    printf("tokens %zu embd %d encode_ms %s layout %s\n", n_tokens, n_embd, times.c_str(),
        layout.c_str());
    return 0;
}
