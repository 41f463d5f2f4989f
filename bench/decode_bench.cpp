// decode_bench: decode throughput of a model directory against this machine's memory bandwidth.
//
//   decode_bench --model DIR [--model DIR2 ...] [--threads 1,2] [--backends cpu,ref] [--prefill 32]
//                [--decode 64] [--ref-decode 4] [--mb 512] [--profile]
//
// First measures the streaming read bandwidth for each thread count (sum over a buffer >> caches), then per model,
// backend and thread count: a prefill of --prefill random tokens, then --decode greedy single-token steps through
// the latent cache. Reports decode tokens/s, the weight bytes actually read per token (every weight an op
// streams: dense + attention (kv_b included) + router + the routed experts selected + shared experts + embedding
// row + lm_head; counted by a pass-through Backend wrapper), the achieved GB/s and its ratio to the measured
// bandwidth at the same thread count. KV-cache bytes are reported separately (not in GB/s).
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "read_bandwidth.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/generate.h"
#include "model/model.h"

namespace {

using namespace latent;
using bench::now_s;

// ---------------------------------------------------------------------------------------------------------------
// Counting pass-through backend
// ---------------------------------------------------------------------------------------------------------------
uint64_t scale_bytes(const QuantWeight& w, int64_t rows) {
  switch (w.format) {
    case WeightFormat::MXFP4: return static_cast<uint64_t>(rows * (w.cols / 32));
    case WeightFormat::FP8_E4M3_BLOCK:
      return static_cast<uint64_t>(((rows + w.block_rows - 1) / w.block_rows) * w.scale_cols() * 4);
    case WeightFormat::FP8_E4M3_CHANNEL: return static_cast<uint64_t>(rows * 4);
    case WeightFormat::FP8_E4M3_TENSOR: return 4;
    default: return 0;
  }
}
uint64_t weight_bytes(const QuantWeight& w, int64_t rows) {
  return static_cast<uint64_t>(rows * w.row_bytes()) + scale_bytes(w, rows);
}

enum Op { kMatmul, kGrouped, kEmbed, kNorm, kRope, kElem, kAttn, kIndexer, kRouter, kScatter, kOps };
const char* kOpNames[kOps] = {"matmul", "grouped_matmul", "embedding", "norms", "rope", "elementwise",
                              "mla_attention", "indexer+topk", "router", "scatter_add"};

class CountingBackend final : public Backend {
 public:
  explicit CountingBackend(Backend& b, bool profile) : b_(b), profile_(profile) {}
  const char* name() const override { return b_.name(); }
  int num_threads() const override { return b_.num_threads(); }

  uint64_t weight_bytes_read = 0, kv_bytes_read = 0;
  std::array<double, kOps> op_time{};
  std::array<uint64_t, kOps> op_calls{};
  void reset() {
    weight_bytes_read = kv_bytes_read = 0;
    op_time.fill(0.0);
    op_calls.fill(0);
  }

  void matmul(const QuantWeight& w, const float* x, int64_t M, float* y) override {
    weight_bytes_read += weight_bytes(w, w.rows);
    T t(this, kMatmul);
    b_.matmul(w, x, M, y);
  }
  void grouped_matmul(const QuantWeight* const* w, int64_t n_groups, const int64_t* offsets, const float* x,
                      float* y) override {
    for (int64_t g = 0; g < n_groups; ++g)
      if (offsets[g + 1] > offsets[g]) weight_bytes_read += weight_bytes(*w[g], w[g]->rows);
    T t(this, kGrouped);
    b_.grouped_matmul(w, n_groups, offsets, x, y);
  }
  void embedding(const QuantWeight& table, const int32_t* ids, int64_t M, float* out) override {
    weight_bytes_read += static_cast<uint64_t>(M * table.row_bytes());
    T t(this, kEmbed);
    b_.embedding(table, ids, M, out);
  }
  void rms_norm(const float* x, const float* w, int64_t M, int64_t D, float eps, float* y, bool bf16) override {
    T t(this, kNorm);
    b_.rms_norm(x, w, M, D, eps, y, bf16);
  }
  void layer_norm(const float* x, const float* w, const float* b, int64_t M, int64_t D, float eps, float* y,
                  bool bf16) override {
    T t(this, kNorm);
    b_.layer_norm(x, w, b, M, D, eps, y, bf16);
  }
  void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t token_stride, int64_t head_stride,
            const int64_t* pos, const RopeParams& p, bool bf16) override {
    T t(this, kRope);
    b_.rope(x, n_tokens, n_heads, token_stride, head_stride, pos, p, bf16);
  }
  void silu_mul(const float* gate, const float* up, int64_t n, float* out, bool bf16) override {
    T t(this, kElem);
    b_.silu_mul(gate, up, n, out, bf16);
  }
  void add(float* y, const float* x, int64_t n, bool bf16) override {
    T t(this, kElem);
    b_.add(y, x, n, bf16);
  }
  void round_bf16(float* x, int64_t n) override {
    T t(this, kElem);
    b_.round_bf16(x, n);
  }
  void mla_attention_naive(const MlaDims& d, const float* q, const float* kvb, const float* k_pe, int64_t S,
                           int64_t T_, const int64_t* q_pos, const KeySelection& sel, float scale, float* o,
                           bool bf16) override {
    kv_bytes_read += static_cast<uint64_t>(T_ * (d.n_heads * (d.nope + d.v) + d.rope) * 4);
    T t(this, kAttn);
    b_.mla_attention_naive(d, q, kvb, k_pe, S, T_, q_pos, sel, scale, o, bf16);
  }
  void mla_attention_absorbed(const MlaDims& d, const float* q, const QuantWeight& kv_b, const float* c,
                              const float* k_pe, int64_t S, int64_t T_, const int64_t* q_pos,
                              const KeySelection& sel, float scale, float* o, bool bf16) override {
    weight_bytes_read += weight_bytes(kv_b, kv_b.rows);
    kv_bytes_read += static_cast<uint64_t>(T_ * (d.latent + d.rope) * 4);
    T t(this, kAttn);
    b_.mla_attention_absorbed(d, q, kv_b, c, k_pe, S, T_, q_pos, sel, scale, o, bf16);
  }
  void indexer_scores(const float* q, const float* w, const float* k, int64_t S, int64_t T_, int64_t n_heads,
                      int64_t head_dim, float scale, const int64_t* q_pos, float* scores) override {
    kv_bytes_read += static_cast<uint64_t>(T_ * head_dim * 4);
    T t(this, kIndexer);
    b_.indexer_scores(q, w, k, S, T_, n_heads, head_dim, scale, q_pos, scores);
  }
  void topk_select(const float* scores, int64_t S, int64_t T_, int64_t k, const int64_t* q_pos, int32_t* sel,
                   int32_t* count) override {
    T t(this, kIndexer);
    b_.topk_select(scores, S, T_, k, q_pos, sel, count);
  }
  void router(const float* logits, const float* bias, int64_t M, const RouterParams& p, int32_t* ids,
              float* weights) override {
    T t(this, kRouter);
    b_.router(logits, bias, M, p, ids, weights);
  }
  void scatter_add_weighted(const float* x, const int32_t* token, const float* weight, int64_t n, int64_t D,
                            float* y, bool bf16) override {
    T t(this, kScatter);
    b_.scatter_add_weighted(x, token, weight, n, D, y, bf16);
  }

 private:
  struct T {  // per-op wall-clock timer (only with --profile)
    CountingBackend* c;
    Op op;
    double t0;
    T(CountingBackend* cb, Op o) : c(cb), op(o), t0(cb->profile_ ? now_s() : 0.0) {}
    ~T() {
      if (!c->profile_) return;
      c->op_time[op] += now_s() - t0;
      ++c->op_calls[op];
    }
  };
  Backend& b_;
  bool profile_;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> v;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    if (j > i) v.push_back(s.substr(i, j - i));
    i = j + 1;
  }
  return v;
}

struct Result {
  double prefill_tps = 0, decode_tps = 0, weight_mb_per_tok = 0, kv_mb_per_tok = 0, gbs = 0;
};

Result run(Model& model, CountingBackend& cb, const ModelConfig& cfg, int64_t n_prefill, int64_t n_decode,
           bool profile) {
  std::mt19937 g(7);
  std::vector<int32_t> prompt(static_cast<size_t>(n_prefill));
  for (int32_t& t : prompt) t = static_cast<int32_t>(g() % static_cast<uint32_t>(cfg.vocab_size));
  KvCache cache(cfg);
  std::vector<float> logits(static_cast<size_t>(cfg.vocab_size));
  Result r;
  double t0 = now_s();
  model.forward(prompt, cache, logits.data(), /*all_rows=*/false);
  r.prefill_tps = static_cast<double>(n_prefill) / (now_s() - t0);
  int32_t next = argmax(logits.data(), cfg.vocab_size);
  // One untimed step (first-touch of buffers), then the timed steps.
  model.forward(std::span<const int32_t>(&next, 1), cache, logits.data(), false);
  next = argmax(logits.data(), cfg.vocab_size);
  cb.reset();
  t0 = now_s();
  for (int64_t i = 0; i < n_decode; ++i) {
    model.forward(std::span<const int32_t>(&next, 1), cache, logits.data(), false);
    next = argmax(logits.data(), cfg.vocab_size);
  }
  const double dt = now_s() - t0;
  r.decode_tps = static_cast<double>(n_decode) / dt;
  r.weight_mb_per_tok = static_cast<double>(cb.weight_bytes_read) / static_cast<double>(n_decode) / 1e6;
  r.kv_mb_per_tok = static_cast<double>(cb.kv_bytes_read) / static_cast<double>(n_decode) / 1e6;
  r.gbs = static_cast<double>(cb.weight_bytes_read) / dt / 1e9;
  if (profile) {
    std::printf("    decode time by op (ms/token):");
    double tot = 0;
    for (int o = 0; o < kOps; ++o) tot += cb.op_time[static_cast<size_t>(o)];
    for (int o = 0; o < kOps; ++o)
      if (cb.op_calls[static_cast<size_t>(o)])
        std::printf(" %s %.3f (%llu calls)", kOpNames[o], cb.op_time[static_cast<size_t>(o)] * 1e3 / n_decode,
                    static_cast<unsigned long long>(cb.op_calls[static_cast<size_t>(o)] / n_decode));
    std::printf("; ops %.3f of %.3f ms\n", tot * 1e3 / n_decode, dt * 1e3 / n_decode);
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> models;
  std::vector<int> threads = {1, 2};
  std::vector<std::string> backends = {"cpu", "ref"};
  int64_t n_prefill = 32, n_decode = 64, n_ref_decode = 4;
  size_t mb = 512;
  bool profile = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--model")
      models.push_back(next());
    else if (a == "--threads") {
      threads.clear();
      for (const auto& s : split(next())) threads.push_back(std::atoi(s.c_str()));
    } else if (a == "--backends")
      backends = split(next());
    else if (a == "--prefill")
      n_prefill = std::atoll(next().c_str());
    else if (a == "--decode")
      n_decode = std::atoll(next().c_str());
    else if (a == "--ref-decode")
      n_ref_decode = std::atoll(next().c_str());
    else if (a == "--mb")
      mb = static_cast<size_t>(std::atol(next().c_str()));
    else if (a == "--profile")
      profile = true;
    else {
      std::fprintf(stderr,
                   "usage: decode_bench --model DIR [--model DIR ...] [--threads 1,2] [--backends cpu,ref]\n"
                   "                    [--prefill N] [--decode N] [--ref-decode N] [--mb N] [--profile]\n");
      return 2;
    }
  }
  if (models.empty()) {
    std::fprintf(stderr, "decode_bench: --model DIR is required (see bench/README.md to make the bench models)\n");
    return 2;
  }
  std::printf("cpu backend ISA: %s\n", cpu_isa_name(cpu_isa_default()));
  std::map<int, double> bw;
  for (int t : threads) {
    bw[t] = bench::read_bandwidth_mb(mb, t, 3);
    std::printf("streaming read bandwidth, %d thread%s: %.2f GB/s\n", t, t == 1 ? "" : "s", bw[t]);
  }
  std::printf("\n%-22s %-4s %3s %10s %10s %9s %8s %8s %7s\n", "model", "be", "thr", "prefill/s", "decode/s",
              "wMB/tok", "kvMB/tok", "GB/s", "%bw");
  try {
    for (const std::string& dir : models) {
      ModelFiles f = open_model_files(dir);
      std::string short_name = dir;
      while (!short_name.empty() && short_name.back() == '/') short_name.pop_back();
      if (auto p = short_name.rfind('/'); p != std::string::npos) short_name = short_name.substr(p + 1);
      for (const std::string& bname : backends) {
        for (int t : threads) {
          std::unique_ptr<Backend> be = make_backend(bname, t);
          CountingBackend cb(*be, profile);
          Model model(*f.cfg, *f.plan, cb);
          const int64_t nd = bname == "ref" ? n_ref_decode : n_decode;
          const Result r = run(model, cb, *f.cfg, n_prefill, nd, profile);
          std::printf("%-22s %-4s %3d %10.1f %10.2f %9.2f %8.3f %8.2f %6.1f%%\n", short_name.c_str(), bname.c_str(),
                      t, r.prefill_tps, r.decode_tps, r.weight_mb_per_tok, r.kv_mb_per_tok, r.gbs,
                      100.0 * r.gbs / bw[t]);
          std::fflush(stdout);
        }
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "decode_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
