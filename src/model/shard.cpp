#include "model/shard.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace latent {

std::string ParallelConfig::describe() const {
  if (ranks <= 1) return "1 rank";
  std::string s;
  if (tensor) s = fmt::format("tensor parallel {}", ranks);
  if (expert) s += tensor ? " + expert parallel" : fmt::format("expert parallel {} (attention replicated)", ranks);
  return s;
}

ParallelConfig parallel_config(int tp, bool ep, int ep_size) {
  if (tp < 1) fail("--tensor-parallel-size must be >= 1 (got {})", tp);
  if (ep_size < 0) fail("--expert-parallel-size must be >= 1 (got {})", ep_size);
  ParallelConfig pc;
  if (ep_size > 0) {
    if (tp > 1)
      fail(
          "--expert-parallel-size {} and --tensor-parallel-size {} exclude each other (use "
          "--tensor-parallel-size N --expert-parallel for experts over the tensor-parallel ranks)",
          ep_size, tp);
    pc.ranks = ep_size;
    pc.expert = ep_size > 1;
    return pc;
  }
  if (ep && tp < 2) fail("--expert-parallel spreads the experts over the --tensor-parallel-size ranks: give N >= 2");
  pc.ranks = tp;
  pc.tensor = tp > 1;
  pc.expert = ep && tp > 1;
  return pc;
}

namespace {

// [r·n/W, (r+1)·n/W) with n % W == 0 checked.
void even_split(int64_t n, int W, int r, const char* what, const char* flag, int64_t& x0, int64_t& x) {
  if (n % W != 0) fail("{} {} is not divisible by {} {}", what, n, flag, W);
  x = n / W;
  x0 = x * r;
}

std::string fmt_name(const QuantWeight& w) { return weight_format_label(w); }

}  // namespace

ShardDims shard_dims(const ModelConfig& cfg, const ParallelConfig& pc, int rank, const ModelWeights& w) {
  ShardDims d;
  const int W = std::max(1, pc.ranks);
  d.heads = cfg.num_attention_heads;
  d.inter = cfg.intermediate_size;
  d.shared_inter = cfg.moe_intermediate_size * cfg.n_shared_experts;
  d.moe_inter = cfg.moe_intermediate_size;
  d.expert1 = cfg.n_routed_experts;
  d.vocab1 = cfg.vocab_size;
  d.vocab_chunk = cfg.vocab_size;
  if (W == 1) return d;
  if (rank < 0 || rank >= W) fail("rank {} outside [0, {})", rank, W);
  const char* tpf = "--tensor-parallel-size";
  const bool any_dense = std::find(cfg.layer_is_moe.begin(), cfg.layer_is_moe.end(), false) != cfg.layer_is_moe.end();
  const bool any_moe = std::find(cfg.layer_is_moe.begin(), cfg.layer_is_moe.end(), true) != cfg.layer_is_moe.end();
  if (pc.tensor) {
    even_split(cfg.num_attention_heads, W, rank, "num_attention_heads", tpf, d.head0, d.heads);
    if (any_dense) even_split(cfg.intermediate_size, W, rank, "intermediate_size", tpf, d.inter0, d.inter);
    if (any_moe && cfg.n_shared_experts > 0)
      even_split(d.shared_inter, W, rank,
                 "the shared experts' intermediate size (moe_intermediate_size x "
                 "n_shared_experts)",
                 tpf, d.shared0, d.shared_inter);
    if (any_moe && !pc.expert)
      even_split(cfg.moe_intermediate_size, W, rank, "moe_intermediate_size", tpf, d.moe0, d.moe_inter);
    // Vocab slices: whole row blocks of a block-quantized lm_head (the embedding is a plain float table).
    int64_t align = 1;
    if (w.lm_head.format == WeightFormat::FP8_E4M3_BLOCK) align = w.lm_head.block_rows;
    const int64_t V = cfg.vocab_size, blocks = (V + align - 1) / align;
    d.vocab_chunk = (blocks + W - 1) / W * align;
    d.vocab0 = std::min(V, d.vocab_chunk * rank);
    d.vocab1 = std::min(V, d.vocab0 + d.vocab_chunk);
    d.vocab_split = true;
  }
  if (pc.expert && any_moe) {
    const char* f = pc.tensor ? "--tensor-parallel-size (with --expert-parallel)" : "--expert-parallel-size";
    int64_t e = 0;
    even_split(cfg.n_routed_experts, W, rank, "n_routed_experts", f, d.expert0, e);
    d.expert1 = d.expert0 + e;
  }
  return d;
}

QuantWeight slice_rows(const QuantWeight& w, int64_t r0, int64_t r1, const std::string& name) {
  if (r0 < 0 || r1 > w.rows || r0 > r1) fail("tensor '{}': rows [{}, {}) outside [0, {})", name, r0, r1, w.rows);
  if (w.format == WeightFormat::FP8_E4M3_BLOCK) {
    const int64_t br = w.block_rows;
    auto cut = [&](int64_t r) { return r % br != 0 && r != w.rows; };
    if (cut(r0) || cut(r1))
      fail(
          "tensor '{}' ({} [{}, {}]): the shard rows [{}, {}) cut a {}x{} scale block (a shard must start and end "
          "on a multiple of {} rows); choose a parallel size whose split falls on block boundaries",
          name, fmt_name(w), w.rows, w.cols, r0, r1, br, w.block_cols, br);
  }
  if (w.mx_tile_major && (r0 % 16 != 0 || r1 % 16 != 0))
    fail(
        "tensor '{}': rows [{}, {}) cut a 16-row tile of its tile-major MXFP4 codes (a slice must start and end on a "
        "multiple of 16 rows)",
        name, r0, r1);
  QuantWeight s = w;
  s.rows = r1 - r0;
  if (!w.data) return s;
  s.data = static_cast<const uint8_t*>(w.data) + r0 * w.row_bytes();
  switch (w.format) {
    case WeightFormat::FP8_E4M3_BLOCK:
      s.scale = static_cast<const float*>(w.scale) + (r0 / w.block_rows) * w.scale_cols();
      break;
    case WeightFormat::FP8_E4M3_CHANNEL: s.scale = static_cast<const float*>(w.scale) + r0; break;
    case WeightFormat::MXFP4: s.scale = static_cast<const uint8_t*>(w.scale) + r0 * w.scale_cols(); break;
    default: break;  // plain floats; per-tensor FP8 keeps its one scale
  }
  return s;
}

QuantWeight slice_cols(const QuantWeight& w, int64_t c0, int64_t c1, const std::string& name, ShardStorage* storage) {
  if (c0 < 0 || c1 > w.cols || c0 > c1) fail("tensor '{}': columns [{}, {}) outside [0, {})", name, c0, c1, w.cols);
  if (w.format == WeightFormat::FP8_E4M3_BLOCK) {
    const int64_t bc = w.block_cols;
    auto cut = [&](int64_t c) { return c % bc != 0 && c != w.cols; };
    if (cut(c0) || cut(c1))
      fail(
          "tensor '{}' ({} [{}, {}]): the shard columns [{}, {}) cut a {}x{} scale block (a shard must start and "
          "end on a multiple of {} input columns); choose a parallel size whose split falls on block boundaries",
          name, fmt_name(w), w.rows, w.cols, c0, c1, w.block_rows, bc, bc);
  }
  if (w.format == WeightFormat::MXFP4 && (c0 % 32 != 0 || c1 % 32 != 0))
    fail(
        "tensor '{}' (mxfp4 [{}, {}]): the shard columns [{}, {}) cut a 32-element MXFP4 scale block along the "
        "input dimension; choose a parallel size whose split falls on multiples of 32 (or --expert-parallel for "
        "the routed experts)",
        name, w.rows, w.cols, c0, c1);
  QuantWeight s = w;
  s.cols = c1 - c0;
  if (!storage || !w.data) {
    s.data = nullptr;
    s.scale = nullptr;
    return s;
  }
  // Codes: bytes [b0, b1) of every row.
  const int64_t rb = w.row_bytes(), nrb = s.row_bytes();
  const int64_t b0 = w.format == WeightFormat::MXFP4 ? c0 / 2 : c0 * (rb / std::max<int64_t>(w.cols, 1));
  auto own = [&](int64_t bytes) {
    storage->blocks.push_back(std::make_unique<uint8_t[]>(static_cast<size_t>(std::max<int64_t>(bytes, 1))));
    storage->bytes += bytes;
    return storage->blocks.back().get();
  };
  uint8_t* codes = own(w.rows * nrb);
  const uint8_t* src = static_cast<const uint8_t*>(w.data);
  for (int64_t r = 0; r < w.rows; ++r) std::memcpy(codes + r * nrb, src + r * rb + b0, static_cast<size_t>(nrb));
  s.data = codes;
  // Scales: the columns of the scale tensor that cover [c0, c1).
  if (w.format == WeightFormat::FP8_E4M3_BLOCK || w.format == WeightFormat::MXFP4) {
    const int64_t per = w.format == WeightFormat::MXFP4 ? 32 : w.block_cols;
    const int64_t esz = w.format == WeightFormat::MXFP4 ? 1 : 4;
    const int64_t srows = w.format == WeightFormat::MXFP4 ? w.rows : (w.rows + w.block_rows - 1) / w.block_rows;
    const int64_t sc = w.scale_cols(), nsc = s.scale_cols(), s0 = c0 / per;
    uint8_t* sd = own(srows * nsc * esz);
    const uint8_t* ss = static_cast<const uint8_t*>(w.scale);
    for (int64_t r = 0; r < srows; ++r)
      std::memcpy(sd + r * nsc * esz, ss + (r * sc + s0) * esz, static_cast<size_t>(nsc * esz));
    s.scale = sd;
  }
  return s;
}

void shard_weights(const ModelConfig& cfg, const ParallelConfig& pc, int rank, const ShardDims& sd, ModelWeights& w,
                   ShardStorage* storage, std::vector<ShardRecord>* log) {
  const int W = std::max(1, pc.ranks);
  auto rec = [&](const std::string& name, const QuantWeight& q, const std::string& how) {
    if (log) log->push_back({name, how, q.rows, q.cols});
  };
  auto range = [](const char* what, int64_t a, int64_t b, int64_t n) {
    return fmt::format("{} {}..{} of {}", what, a, b, n);
  };
  auto rows = [&](QuantWeight& q, int64_t r0, int64_t r1, const std::string& name, const std::string& how) {
    q = slice_rows(q, r0, r1, name);
    rec(name, q, how);
  };
  auto cols = [&](QuantWeight& q, int64_t c0, int64_t c1, const std::string& name, const std::string& how) {
    q = slice_cols(q, c0, c1, name, storage);
    rec(name, q, how);
  };
  auto repl = [&](const QuantWeight& q, const std::string& name) { rec(name, q, "replicated"); };
  const bool tp = pc.tensor && W > 1;

  // Embedding (vocab-parallel): the local rows plus one zero row, owned.
  const std::string emb = "model.embed_tokens.weight";
  QuantWeight full_embed = w.embed;
  const bool tied = w.lm_head.data == w.embed.data;
  if (tp) {
    QuantWeight e = slice_rows(w.embed, sd.vocab0, sd.vocab1, emb);
    e.rows += 1;  // the zero row that tokens of other ranks read
    if (storage && w.embed.data) {
      const int64_t rb = e.row_bytes();
      auto buf = std::make_unique<uint8_t[]>(static_cast<size_t>(e.rows * rb));
      std::memcpy(buf.get(), e.data, static_cast<size_t>((e.rows - 1) * rb));
      std::memset(buf.get() + (e.rows - 1) * rb, 0, static_cast<size_t>(rb));
      e.data = buf.get();
      storage->bytes += e.rows * rb;
      storage->blocks.push_back(std::move(buf));
    } else {
      e.data = nullptr;
    }
    w.embed = e;
    rec(emb, e, range("vocab rows", sd.vocab0, sd.vocab1, cfg.vocab_size) + " + a zero row");
  } else {
    repl(w.embed, emb);
  }
  const std::string head = tied ? emb + " (tied lm_head)" : "lm_head.weight";
  if (tp) {
    QuantWeight lm = tied ? full_embed : w.lm_head;
    rows(lm, sd.vocab0, sd.vocab1, head, range("vocab rows", sd.vocab0, sd.vocab1, cfg.vocab_size));
    w.lm_head = lm;
  } else {
    repl(w.lm_head, head);
  }

  const int64_t dn = cfg.qk_nope_head_dim, dr = cfg.qk_rope_head_dim, dv = cfg.v_head_dim, H = cfg.num_attention_heads;
  auto mlp = [&](MlpWeights& m, const std::string& p, int64_t i0, int64_t i, int64_t full, bool split) {
    if (!split) {
      repl(m.gate, p + "gate_proj.weight");
      repl(m.up, p + "up_proj.weight");
      repl(m.down, p + "down_proj.weight");
      return;
    }
    const std::string how = range("rows", i0, i0 + i, full);
    rows(m.gate, i0, i0 + i, p + "gate_proj.weight", how);
    rows(m.up, i0, i0 + i, p + "up_proj.weight", how);
    cols(m.down, i0, i0 + i, p + "down_proj.weight", range("columns", i0, i0 + i, full));
  };
  for (size_t l = 0; l < w.layers.size(); ++l) {
    LayerWeights& lw = w.layers[l];
    const std::string p = fmt::format("model.layers.{}.", l), a = p + "self_attn.";
    AttentionWeights& at = lw.attn;
    repl(at.q_a, a + "q_a_proj.weight");
    repl(at.kv_a, a + "kv_a_proj_with_mqa.weight");
    if (tp) {
      const int64_t h0 = sd.head0, h1 = sd.head0 + sd.heads;
      const std::string heads = fmt::format("heads {}..{} of {}", h0, h1, H);
      rows(at.q_b, h0 * (dn + dr), h1 * (dn + dr), a + "q_b_proj.weight", "rows of " + heads);
      rows(at.kv_b, h0 * (dn + dv), h1 * (dn + dv), a + "kv_b_proj.weight", "rows of " + heads);
      cols(at.o, h0 * dv, h1 * dv, a + "o_proj.weight", "columns of " + heads);
    } else {
      repl(at.q_b, a + "q_b_proj.weight");
      repl(at.kv_b, a + "kv_b_proj.weight");
      repl(at.o, a + "o_proj.weight");
    }
    if (lw.indexer.present) {
      const std::string ip = a + "indexer.";
      repl(lw.indexer.wq_b, ip + "wq_b.weight");
      repl(lw.indexer.wk, ip + "wk.weight");
      repl(lw.indexer.weights_proj, ip + "weights_proj.weight");
    }
    const std::string m = p + "mlp.";
    if (!lw.is_moe) {
      mlp(lw.dense, m, sd.inter0, sd.inter, cfg.intermediate_size, tp);
      continue;
    }
    repl(lw.moe.router, m + "gate.weight");
    for (int64_t e = 0; e < static_cast<int64_t>(lw.moe.experts.size()); ++e) {
      MlpWeights& x = lw.moe.experts[static_cast<size_t>(e)];
      const std::string ep = fmt::format("{}experts.{}.", m, e);
      if (pc.expert) {
        const bool mine = e >= sd.expert0 && e < sd.expert1;
        for (auto [q, n] :
             {std::pair{&x.gate, "gate_proj"}, std::pair{&x.up, "up_proj"}, std::pair{&x.down, "down_proj"}}) {
          if (!mine) {
            *q = QuantWeight{};  // not read, not uploaded on this rank
            if (log) log->push_back({ep + n + ".weight", "on another rank", 0, 0});
          } else {
            rec(ep + n + ".weight", *q, fmt::format("expert {} of {} (rank {})", e, cfg.n_routed_experts, rank));
          }
        }
      } else {
        mlp(x, ep, sd.moe0, sd.moe_inter, cfg.moe_intermediate_size, tp);
      }
    }
    if (lw.moe.has_shared)
      mlp(lw.moe.shared, m + "shared_experts.", sd.shared0, sd.shared_inter,
          cfg.moe_intermediate_size * cfg.n_shared_experts, tp);
  }
}

namespace {

struct ShardTable {
  std::vector<std::string> names, placement;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> shapes;  // [tensor][rank], {-1,-1}: not on the rank
};

ShardTable sharding_table(const ModelConfig& cfg, const PrecisionPlan& plan, const ParallelConfig& pc) {
  ShardTable t;
  const int W = std::max(1, pc.ranks);
  for (int r = 0; r < W; ++r) {
    ModelWeights w = resolve_weights(cfg, plan);
    const ShardDims sd = shard_dims(cfg, pc, r, w);
    std::vector<ShardRecord> log;
    shard_weights(cfg, pc, r, sd, w, nullptr, &log);
    if (r == 0) {
      t.shapes.assign(log.size(), std::vector<std::pair<int64_t, int64_t>>(static_cast<size_t>(W), {-1, -1}));
      for (const ShardRecord& x : log) {
        t.names.push_back(x.tensor);
        t.placement.push_back(x.how);
      }
    }
    for (size_t i = 0; i < log.size() && i < t.names.size(); ++i) {
      if (log[i].how == "on another rank") continue;
      t.shapes[i][static_cast<size_t>(r)] = {log[i].rows, log[i].cols};
      if (r > 0 && t.placement[i] == "on another rank") t.placement[i] = log[i].how;  // the owner's expert line
    }
  }
  return t;
}

}  // namespace

std::string format_sharding_text(const ModelConfig& cfg, const PrecisionPlan& plan, const ParallelConfig& pc) {
  const ShardTable t = sharding_table(cfg, plan, pc);
  size_t wn = 6;
  for (const auto& n : t.names) wn = std::max(wn, n.size());
  std::string s = fmt::format(
      "\nsharding: {} (one thread per rank; placement as on rank 0; the latent KV cache and the DSA indexer are "
      "replicated on every rank)\n",
      pc.describe());
  s += fmt::format("{:<{}}  {}\n", "tensor", wn, "placement per rank (rank shape)");
  for (size_t i = 0; i < t.names.size(); ++i) {
    std::string shapes;
    for (size_t r = 0; r < t.shapes[i].size(); ++r) {
      const auto [rows, cols] = t.shapes[i][r];
      shapes += rows < 0 ? fmt::format(" r{}:-", r) : fmt::format(" r{}:[{}, {}]", r, rows, cols);
    }
    s += fmt::format("{:<{}}  {}  {}\n", t.names[i], wn, t.placement[i], shapes);
  }
  return s;
}

std::string format_sharding_json(const ModelConfig& cfg, const PrecisionPlan& plan, const ParallelConfig& pc) {
  const ShardTable t = sharding_table(cfg, plan, pc);
  std::string s = "[";
  for (size_t i = 0; i < t.names.size(); ++i) {
    std::string ranks;
    for (size_t r = 0; r < t.shapes[i].size(); ++r) {
      const auto [rows, cols] = t.shapes[i][r];
      ranks += (r ? ", " : "") + (rows < 0 ? std::string("null") : fmt::format("[{}, {}]", rows, cols));
    }
    s += fmt::format("{}\n {{\"tensor\": \"{}\", \"placement\": \"{}\", \"ranks\": [{}]}}", i ? "," : "", t.names[i],
                     t.placement[i], ranks);
  }
  return s + "\n]";
}

}  // namespace latent
