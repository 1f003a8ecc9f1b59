// llama_peer: stock llama.cpp's logits and greedy tokens through its public C API, the peer
// kvstream is checked against (tests/peers/peers.py). Built against the library of the pinned
// llama-cpp-python sdist's vendored tree (tests/peers/build-llama.sh), never linked into kvstream.
//
//   llama_peer logits MODEL --tokens 1,2,3 --at 1,2,3 --ctk f16 --ctv f16 --out L.npy
//       feeds the tokens in batches of --batch and saves the logits after each position of --at
//       (1-based counts of tokens fed) as float32 [len(at)][n_vocab]
//   llama_peer load MODEL
//       loads the file's metadata, vocabulary and tensor table as llama.cpp checks them, without
//       its weights (no_alloc); prints the architecture and the tensor count
//   llama_peer greedy MODEL --prompt TEXT -n 32
//       prints the prompt's token ids, then per generated token its id and the top-2 margin
//   llama_peer mtp MODEL --tokens 1,2,3 --out L.npy [--zero-entry 1]
//       the MTP head's logits of the last entry (the trunk's state after the second-to-last
//       token with the last token), which predict the token after the next; entry k (token k at
//       position k with the trunk's state after token k - 1) for k = 1.., or from k = 0 with a
//       zero state, as llama.cpp's speculative loop starts, with --zero-entry 1
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "llama.h"
#include "llama-ext.h"  // the staging API of the MTP context (nextn embeddings)

namespace {

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "llama_peer: %s\n", what.c_str());
  std::exit(2);
}

std::vector<int32_t> int_list(const std::string& s) {
  std::vector<int32_t> v;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    v.push_back(static_cast<int32_t>(std::stol(s.substr(i, j - i))));
    i = j + 1;
  }
  return v;
}

std::vector<int32_t> read_tokens(const std::string& arg) {
  if (arg.empty() || arg[0] != '@') return int_list(arg);
  FILE* f = std::fopen(arg.c_str() + 1, "rb");
  if (!f) die("cannot open " + arg.substr(1));
  std::string s;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  std::fclose(f);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return int_list(s);
}

ggml_type kv_type(const std::string& s) {
  if (s == "f16") return GGML_TYPE_F16;
  if (s == "q8_0") return GGML_TYPE_Q8_0;
  if (s == "q4_0") return GGML_TYPE_Q4_0;
  if (s == "f32") return GGML_TYPE_F32;
  die("unknown KV type " + s);
}

void write_npy(const std::string& path, const std::vector<float>& v, int64_t rows, int64_t cols) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" +
                       std::to_string(rows) + ", " + std::to_string(cols) + "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) die("cannot write " + path);
  const uint16_t len = static_cast<uint16_t>(header.size());
  std::fwrite("\x93NUMPY\x01\x00", 1, 8, f);
  std::fwrite(&len, 2, 1, f);
  std::fwrite(header.data(), 1, header.size(), f);
  std::fwrite(v.data(), sizeof(float), v.size(), f);
  if (std::fclose(f) != 0) die("cannot write " + path);
}

struct Args {
  std::string mode, model, tokens, at, out, prompt, ctk = "f16", ctv = "f16";
  int32_t n_predict = 32, threads = 2, batch = 512, ctx = 0, zero_entry = 0;
};

Args parse(int argc, char** argv) {
  if (argc < 3) die("usage: llama_peer logits|greedy|mtp MODEL [options] (see the source)");
  Args a;
  a.mode = argv[1];
  a.model = argv[2];
  for (int i = 3; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) die("missing value for " + k);
    const std::string v = argv[++i];
    if (k == "--tokens") a.tokens = v;
    else if (k == "--at") a.at = v;
    else if (k == "--out") a.out = v;
    else if (k == "--prompt") a.prompt = v;
    else if (k == "--ctk") a.ctk = v;
    else if (k == "--ctv") a.ctv = v;
    else if (k == "-n") a.n_predict = std::atoi(v.c_str());
    else if (k == "-t") a.threads = std::atoi(v.c_str());
    else if (k == "--batch") a.batch = std::atoi(v.c_str());
    else if (k == "-c") a.ctx = std::atoi(v.c_str());
    else if (k == "--zero-entry") a.zero_entry = std::atoi(v.c_str());
    else die("unknown option " + k);
  }
  return a;
}

struct Session {
  llama_model* model = nullptr;
  llama_context* ctx = nullptr;
  const llama_vocab* vocab = nullptr;
  int32_t n_vocab = 0;
  ~Session() {
    if (ctx) llama_free(ctx);
    if (model) llama_model_free(model);
  }
};

// KVS_PEER_DUMP=NAME,NAME: prints those intermediate tensors (llama.cpp's graph names, e.g.
// attn_norm-0) as they are computed, for finding where two engines part.
bool dump_tensor(ggml_tensor* t, bool ask, void*) {
  static const std::string want = [] {
    const char* e = std::getenv("KVS_PEER_DUMP");
    return e ? "," + std::string(e) + "," : std::string();
  }();
  if (want.empty() || want.find("," + std::string(t->name) + ",") == std::string::npos) return !ask ? true : false;
  if (ask) return true;
  if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) return true;
  const float* d = static_cast<const float*>(t->data);
  std::fprintf(stderr, "dump %s [%lld %lld %lld %lld]", t->name, static_cast<long long>(t->ne[0]),
               static_cast<long long>(t->ne[1]), static_cast<long long>(t->ne[2]),
               static_cast<long long>(t->ne[3]));
  for (int64_t i = 0; i < std::min<int64_t>(ggml_nelements(t), 8); ++i)
    std::fprintf(stderr, " %.6g", static_cast<double>(d[i]));
  double ss = 0;
  for (int64_t i = 0; i < ggml_nelements(t); ++i) ss += static_cast<double>(d[i]) * d[i];
  std::fprintf(stderr, " | norm %.6g\n", std::sqrt(ss));
  return true;
}

void open(Session& s, const Args& a, int32_t n_ctx, bool mtp) {
  llama_model_params mp = llama_model_default_params();
  mp.progress_callback = [](float, void*) { return true; };
  mp.n_gpu_layers = 0;
  mp.load_mtp = mtp;
  s.model = llama_model_load_from_file(a.model.c_str(), mp);
  if (!s.model) die("llama.cpp could not load " + a.model);
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(n_ctx);
  cp.n_batch = cp.n_ubatch = static_cast<uint32_t>(a.batch);
  cp.n_seq_max = 1;
  cp.n_threads = cp.n_threads_batch = a.threads;
  cp.type_k = kv_type(a.ctk);
  cp.type_v = kv_type(a.ctv);
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;  // quantized V needs it
  cp.embeddings = mtp;
  cp.cb_eval = dump_tensor;
  s.ctx = llama_init_from_model(s.model, cp);
  if (!s.ctx) die("llama.cpp could not make a context for " + a.model);
  s.vocab = llama_model_get_vocab(s.model);
  s.n_vocab = llama_vocab_n_tokens(s.vocab);
}

// Feeds tokens from position `pos`, in batches; keep(i) says whose logits to return.
template <class Keep, class Use>
void feed(Session& s, const std::vector<int32_t>& tok, int32_t batch, Keep keep, Use use) {
  llama_batch b = llama_batch_init(batch, 0, 1);
  for (size_t i0 = 0; i0 < tok.size(); i0 += static_cast<size_t>(batch)) {
    const size_t n = std::min(tok.size() - i0, static_cast<size_t>(batch));
    b.n_tokens = static_cast<int32_t>(n);
    for (size_t j = 0; j < n; ++j) {
      b.token[j] = tok[i0 + j];
      b.pos[j] = static_cast<llama_pos>(i0 + j);
      b.n_seq_id[j] = 1;
      b.seq_id[j][0] = 0;
      b.logits[j] = keep(i0 + j) ? 1 : 0;
    }
    if (llama_decode(s.ctx, b) != 0) die("llama_decode failed");
    for (size_t j = 0; j < n; ++j)
      if (keep(i0 + j)) use(i0 + j, llama_get_logits_ith(s.ctx, static_cast<int32_t>(j)));
  }
  llama_batch_free(b);
}

int logits(const Args& a) {
  const std::vector<int32_t> tok = read_tokens(a.tokens);
  std::vector<int32_t> at = a.at.empty() ? std::vector<int32_t>{static_cast<int32_t>(tok.size())}
                                         : int_list(a.at);
  for (int32_t n : at)
    if (n < 1 || n > static_cast<int32_t>(tok.size())) die("--at " + std::to_string(n) + " is outside the tokens");
  Session s;
  open(s, a, a.ctx > 0 ? a.ctx : static_cast<int32_t>(tok.size()) + 16, false);
  std::vector<float> out(at.size() * static_cast<size_t>(s.n_vocab));
  auto row_of = [&](size_t i) -> int {
    for (size_t r = 0; r < at.size(); ++r)
      if (static_cast<size_t>(at[r]) == i + 1) return static_cast<int>(r);
    return -1;
  };
  feed(
      s, tok, a.batch, [&](size_t i) { return row_of(i) >= 0; },
      [&](size_t i, const float* l) {
        std::memcpy(out.data() + static_cast<size_t>(row_of(i)) * static_cast<size_t>(s.n_vocab), l,
                    static_cast<size_t>(s.n_vocab) * sizeof(float));
      });
  write_npy(a.out, out, static_cast<int64_t>(at.size()), s.n_vocab);
  return 0;
}

// The best token and its lead over the second.
std::pair<int32_t, float> top2(const float* l, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i)
    if (l[i] > l[best]) best = i;
  float second = -INFINITY;
  for (int32_t i = 0; i < n; ++i)
    if (i != best && l[i] > second) second = l[i];
  return {best, l[best] - second};
}

int greedy(const Args& a) {
  Session s;
  open(s, a, a.ctx > 0 ? a.ctx : 4096, false);
  std::vector<int32_t> tok(a.prompt.size() + 16);
  const int32_t n = llama_tokenize(s.vocab, a.prompt.data(), static_cast<int32_t>(a.prompt.size()),
                                   tok.data(), static_cast<int32_t>(tok.size()), true, true);
  if (n < 0) die("llama_tokenize failed");
  tok.resize(static_cast<size_t>(n));
  std::printf("prompt");
  for (int32_t t : tok) std::printf(" %d", t);
  std::printf("\n");
  std::pair<int32_t, float> next{};
  feed(
      s, tok, a.batch, [&](size_t i) { return i + 1 == tok.size(); },
      [&](size_t, const float* l) { next = top2(l, s.n_vocab); });
  for (int32_t k = 0; k < a.n_predict; ++k) {
    std::printf("token %d %.6f\n", next.first, static_cast<double>(next.second));
    if (llama_vocab_is_eog(s.vocab, next.first)) break;
    const std::vector<int32_t> one{next.first};
    llama_batch b = llama_batch_get_one(const_cast<int32_t*>(one.data()), 1);
    if (llama_decode(s.ctx, b) != 0) die("llama_decode failed");
    next = top2(llama_get_logits_ith(s.ctx, -1), s.n_vocab);
  }
  return 0;
}

int load(const Args& a) {
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  mp.no_alloc = true;
  mp.load_mode = LLAMA_LOAD_MODE_NONE;  // no_alloc maps nothing
  mp.lazy_mode = LLAMA_LAZY_MODE_OFF;
  mp.load_mtp = true;
  mp.progress_callback = [](float, void*) { return true; };
  llama_model* m = llama_model_load_from_file(a.model.c_str(), mp);
  if (!m) die("llama.cpp could not load " + a.model);
  char desc[256];
  llama_model_desc(m, desc, sizeof desc);
  std::printf("loaded %s: %s, %d layers (%d MTP), vocab %d\n", a.model.c_str(), desc,
              llama_model_n_layer(m), llama_model_n_layer_nextn(m),
              llama_vocab_n_tokens(llama_model_get_vocab(m)));
  llama_model_free(m);
  return 0;
}

int mtp(const Args& a) {
  const std::vector<int32_t> tok = read_tokens(a.tokens);
  const int32_t N = static_cast<int32_t>(tok.size());
  if (N < 2) die("mtp needs at least 2 tokens");
  Session s;
  open(s, a, N + 16, true);
  if (llama_model_n_layer_nextn(s.model) < 1) die(a.model + " has no MTP block");
  llama_set_embeddings_nextn(s.ctx, true, false);
  const int32_t d = llama_model_n_embd(s.model);
  std::vector<float> h(static_cast<size_t>(N) * static_cast<size_t>(d));
  feed(
      s, tok, a.batch, [](size_t) { return true; },
      [&](size_t i, const float*) {
        const float* row = llama_get_embeddings_nextn_ith(s.ctx, static_cast<int32_t>(i % static_cast<size_t>(a.batch)));
        if (!row) die("llama.cpp gave no nextn embedding");
        std::memcpy(h.data() + i * static_cast<size_t>(d), row, static_cast<size_t>(d) * sizeof(float));
      });
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(N + 16);
  cp.n_batch = cp.n_ubatch = static_cast<uint32_t>(std::max(N, 1));
  cp.n_seq_max = 1;
  cp.n_threads = cp.n_threads_batch = a.threads;
  cp.type_k = kv_type(a.ctk);
  cp.type_v = kv_type(a.ctv);
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
  cp.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
  cp.ctx_other = s.ctx;
  llama_context* dft = llama_init_from_model(s.model, cp);
  if (!dft) die("llama.cpp could not make an MTP context for " + a.model);
  llama_set_embeddings_nextn(dft, true, true);
  llama_batch_ext* b = llama_batch_ext_init(dft);
  const std::vector<float> zero(static_cast<size_t>(d), 0.0f);
  for (int32_t k = a.zero_entry ? 0 : 1; k < N; ++k) {
    const int32_t idx = llama_batch_ext_add_token(b, 0, tok[static_cast<size_t>(k)]);
    if (idx < 0) die("llama_batch_ext_add_token failed");
    const llama_pos pos[4] = {k, 0, 0, 0};
    llama_batch_ext_set_pos(b, idx, pos);
    const float* row = k == 0 ? zero.data() : h.data() + static_cast<size_t>(k - 1) * static_cast<size_t>(d);
    if (!llama_batch_ext_set_embd_token(b, idx, {row, 1, static_cast<size_t>(d)})) die("set_embd_token failed");
    if (k == N - 1) llama_batch_ext_set_output_logits(b, idx, true);
  }
  if (llama_process(dft, LLAMA_PROCESS_TYPE_DECODE, b) != 0) die("llama_process (MTP) failed");
  std::vector<float> out(llama_get_logits_ith(dft, -1), llama_get_logits_ith(dft, -1) + s.n_vocab);
  write_npy(a.out, out, 1, s.n_vocab);
  llama_batch_ext_free(b);
  llama_free(dft);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  llama_log_set([](ggml_log_level level, const char* text, void*) {
    if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
  }, nullptr);
  llama_backend_init();
  int rc = 2;
  if (a.mode == "logits") rc = logits(a);
  else if (a.mode == "greedy") rc = greedy(a);
  else if (a.mode == "mtp") rc = mtp(a);
  else if (a.mode == "load") rc = load(a);
  else die("unknown mode " + a.mode);
  llama_backend_free();
  return rc;
}
