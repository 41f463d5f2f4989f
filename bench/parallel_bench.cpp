// Tensor / expert parallelism (issue 18): decode through ParallelModel (one thread per rank; NCCL on GPUs, the
// in-process communicator on the CPU) at 1..N ranks. For each layout and batch it prints decode tokens/s and the
// step time, the time of one all-reduce of the step's [batch, hidden] activations measured alone on the layout's
// communicator, the collectives per layer the layout issues, their estimated share of the step, and the scaling
// against one rank at the same batch.
//
//   parallel_bench <model dir> [--device cpu|cuda] [--ranks 1,2,4,8] [--batch 1,64] [--expert-parallel]
//                  [--steps N] [--threads T] [--activations fp32|bf16]
//
// On the GPU machine: NCCL_NVLS_ENABLE=0 parallel_bench <GLM-5-shape dir> --device cuda --ranks 1,2,4,8.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "bench_decode.h"
#include "core/error.h"
#include "model/model.h"
#include "model/parallel_model.h"
#include "model/shard.h"

namespace latent {
namespace {

struct Args {
  std::string dir, device = "cpu", activations;
  std::vector<int> ranks = {1, 2};
  std::vector<int64_t> batches = {1, 64};
  bool expert = false;
  int64_t steps = 32;
  int threads = 0;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <class T>
std::vector<T> parse_list(const std::string& flag, const std::string& v) {
  std::vector<T> out;
  std::stringstream ss(v);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long long x = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || x < 1) fail("{}: '{}' is not a list of positive integers", flag, v);
    out.push_back(static_cast<T>(x));
  }
  if (out.empty()) fail("{}: empty list", flag);
  return out;
}

Args parse(int argc, char** argv) {
  Args a;
  if (argc < 2)
    fail(
        "usage: parallel_bench <model dir> [--device cpu|cuda] [--ranks 1,2,...] [--batch 1,64,...] "
        "[--expert-parallel] [--steps N] [--threads T] [--activations fp32|bf16]");
  a.dir = argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string f = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) fail("{} needs a value", f);
      return argv[++i];
    };
    if (f == "--device")
      a.device = val();
    else if (f == "--ranks")
      a.ranks = parse_list<int>(f, val());
    else if (f == "--batch")
      a.batches = parse_list<int64_t>(f, val());
    else if (f == "--expert-parallel")
      a.expert = true;
    else if (f == "--steps")
      a.steps = parse_list<int64_t>(f, val()).front();
    else if (f == "--threads")
      a.threads = parse_list<int>(f, val()).front();
    else if (f == "--activations")
      a.activations = val();
    else
      fail("unknown argument '{}'", f);
  }
  if (a.device != "cpu" && a.device != "cuda") fail("--device must be cpu or cuda (got '{}')", a.device);
  if (!a.activations.empty() && a.activations != "fp32" && a.activations != "bf16")
    fail("--activations must be fp32 or bf16 (got '{}')", a.activations);
  return a;
}

struct Result {
  double step_s = 0, allreduce_s = 0;
};

// Decode `batch` sequences (32-token prompts, then `steps` timed greedy steps after 2 warm-up steps) on every rank;
// then one all-reduce of [batch, hidden] fp32 on the same communicator, 50 times, timed alone.
Result bench_layout(ParallelModel& pm, int64_t batch, int64_t steps) {
  const ModelConfig& c = pm.config();
  const int64_t D = c.hidden_size, bt = 64, prompt = 32, warm = 2;
  bench::DecodeBatch db(c.vocab_size, batch, prompt, prompt + warm + steps + 1, bt);
  pm.reserve(std::max<int64_t>(batch * prompt, 256), batch, db.blocks_per_seq * bt, db.blocks_per_seq);
  auto caches = pm.make_caches(db.pool_blocks(), bt);
  std::vector<PagedKvCache*> cp;
  for (auto& p : caches) cp.push_back(p.get());
  pm.step(db.prefill(), cp, db.logits.data());
  auto decode = [&] { pm.step(db.next(), cp, db.logits.data()); };
  for (int64_t i = 0; i < warm; ++i) decode();
  Result r;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) decode();
  r.step_s = seconds_since(t0) / static_cast<double>(steps);
  pm.run([&](int k) { caches[static_cast<size_t>(k)].reset(); });  // each rank frees its own pool (its GPU)

  std::vector<double> per_rank(static_cast<size_t>(pm.ranks()));
  pm.run([&](int k) {
    Backend& be = pm.backend(k);
    Communicator& comm = pm.comm(k);
    float* buf = static_cast<float*>(be.alloc(sizeof(float) * static_cast<size_t>(batch * D), "all-reduce bench"));
    be.fill(Tensor(buf, DType::F32, batch, D), 1.0f / static_cast<float>(pm.ranks()));
    for (int i = 0; i < 5; ++i) comm.all_reduce_sum(buf, batch * D);
    be.sync();
    comm.barrier();
    const int reps = 50;
    const auto t1 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) comm.all_reduce_sum(buf, batch * D);
    be.sync();
    per_rank[static_cast<size_t>(k)] = seconds_since(t1) / reps;
    be.dealloc(buf);
  });
  for (double t : per_rank) r.allreduce_s = std::max(r.allreduce_s, t);
  return r;
}

// Collectives of [tokens, hidden] per layer the layout issues (model.cpp): tensor parallel — after o_proj and after
// the MLP / MoE (routed + shared in one); expert parallel only — after the routed experts of MoE layers.
double allreduces_per_step(const ModelConfig& c, const ParallelConfig& pc) {
  if (!pc.active()) return 0;
  double n = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const bool moe = c.n_routed_experts > 0 && c.layer_is_moe[static_cast<size_t>(l)];
    if (pc.tensor)
      n += 2;
    else if (pc.expert && moe)
      n += 1;
  }
  if (pc.tensor) n += 1;  // the vocab-parallel embedding (the logits all-gather is not counted)
  return n;
}

}  // namespace
}  // namespace latent

int main(int argc, char** argv) {
  using namespace latent;
  try {
    const Args a = parse(argc, argv);
    ModelFiles files = open_model_files(a.dir);
    const ModelConfig& c = *files.cfg;
    ModelOptions mo;
    mo.bf16_activations = a.activations.empty() ? a.device == "cuda" : a.activations == "bf16";
    std::printf("parallel_bench %s on %s, %s activations, %lld layers, hidden %lld, %lld routed experts\n",
                a.dir.c_str(), a.device.c_str(), mo.bf16_activations ? "bf16" : "fp32",
                static_cast<long long>(c.num_hidden_layers), static_cast<long long>(c.hidden_size),
                static_cast<long long>(c.n_routed_experts));
    std::map<int64_t, double> one_rank;  // batch -> tokens/s at 1 rank
    for (int W : a.ranks) {
      std::vector<ParallelConfig> layouts;
      if (W == 1) {
        layouts.push_back(parallel_config(1, false));
      } else {
        layouts.push_back(parallel_config(W, false));
        if (a.expert && c.n_routed_experts > 0) layouts.push_back(parallel_config(W, true));
      }
      for (const ParallelConfig& pc : layouts) {
        const auto t0 = std::chrono::steady_clock::now();
        ParallelModel pm(c, *files.plan, a.device, a.threads, pc, mo);
        std::printf("%s: loaded in %.1f s\n", pc.describe().c_str(), seconds_since(t0));
        for (int64_t b : a.batches) {
          const Result r = bench_layout(pm, b, a.steps);
          const double tps = static_cast<double>(b) / r.step_s;
          if (W == 1) one_rank[b] = tps;
          const double n_ar = allreduces_per_step(c, pc);
          const double comm = n_ar * r.allreduce_s;
          std::printf("  batch %4lld: step %9.1f us, %9.1f tokens/s", static_cast<long long>(b), r.step_s * 1e6, tps);
          if (one_rank.count(b)) std::printf(", %.2fx one rank", tps / one_rank[b]);
          std::printf("; all-reduce of [%lld, %lld] fp32 alone %.1f us", static_cast<long long>(b),
                      static_cast<long long>(c.hidden_size), r.allreduce_s * 1e6);
          if (n_ar > 0)
            std::printf(", %.0f per step (%.1f per layer) = %.1f us, ~%.0f %% of the step", n_ar,
                        n_ar / static_cast<double>(c.num_hidden_layers), comm * 1e6, 100.0 * comm / r.step_s);
          std::printf("\n");
        }
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "parallel_bench: %s\n", e.what());
    return 1;
  }
}
