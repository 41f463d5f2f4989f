#include "model/mtp_probe.h"

#include <cstring>
#include <numeric>

#include "core/error.h"

namespace latent {

MtpAlong mtp_drafts_along(Model& m, std::span<const int32_t> tokens, int64_t first, int64_t k, bool want_logits) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (m.mtp_layers() < 1) fail("mtp drafts: the model has no MTP layer loaded");
  if (n < 1) fail("mtp drafts: the token sequence is empty");
  if (first < 0 || first >= n) fail("mtp drafts: first slot {} outside [0, {})", first, n);
  if (k < 1) fail("mtp drafts: k must be >= 1 (got {})", k);
  const ModelConfig& cfg = m.config();
  const int64_t V = cfg.vocab_size, bt = 16;
  // Slots 0 .. n-1 and the drafts' scratch slots up to n - 1 + k - 1.
  const int64_t n_blocks = (n + k + bt - 1) / bt + 1;
  PagedKvCache cache(cfg, m.backend(), n_blocks, bt, m.cache_dtype(), 1);
  std::vector<int32_t> blocks(static_cast<size_t>(n_blocks));
  std::iota(blocks.begin(), blocks.end(), 0);

  StepSequence s;
  s.start = 0;
  s.n_tokens = n;
  s.blocks = blocks;
  s.logits = LogitRows::None;
  m.step(Step{tokens, std::span<const StepSequence>(&s, 1)}, cache, nullptr);

  MtpAlong out;
  out.first = first;
  out.n = n;
  out.k = k;
  out.drafts.resize(static_cast<size_t>((n - first) * k));
  if (want_logits) out.logits.resize(static_cast<size_t>((n - first) * V));
  std::vector<float> lg(want_logits ? static_cast<size_t>(k * V) : 0);
  for (int64_t q = first; q < n; ++q) {
    MtpSequence ms;
    if (q == first) {  // slots 0 .. first in one pass (slot 0 pairs with a zero vector)
      ms.start = 0;
      ms.n_slots = first + 1;
      ms.tokens = tokens.subspan(0, static_cast<size_t>(first + 1));
      ms.hidden_row = -1;
      ms.zero_first = true;
      ms.decode = first == 0;
    } else {  // slot q: (hidden row q - 1 of the prefill, t_q)
      ms.start = q;
      ms.n_slots = 1;
      ms.tokens = tokens.subspan(static_cast<size_t>(q), 1);
      ms.hidden_row = q - 1;
      ms.decode = true;
    }
    ms.blocks = blocks;
    ms.n_draft = static_cast<int32_t>(k);
    const size_t row = static_cast<size_t>(q - first);
    m.mtp_draft(std::span<const MtpSequence>(&ms, 1), cache, out.drafts.data() + row * static_cast<size_t>(k), nullptr,
                want_logits ? lg.data() : nullptr);
    if (want_logits)
      std::memcpy(out.logits.data() + row * static_cast<size_t>(V), lg.data(), sizeof(float) * static_cast<size_t>(V));
  }
  return out;
}

}  // namespace latent
