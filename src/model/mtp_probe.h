// Teacher-forced MTP drafts along a token sequence, for measuring the MTP layer outside the scheduler (latent
// fidelity's acceptance rates, latent logits --mtp-out against tools/mtp_reference.py). The main model runs the
// whole sequence in one prefill step (its head-input rows stay for the draft step); the MTP layer then writes its
// slots 0 .. first in one pass and every later slot one by one, and after each slot q >= first makes k recursive
// greedy drafts (Model::mtp_draft, as speculative decoding does): draft j after slot q proposes t_{q+j}.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "model/model.h"

namespace latent {

struct MtpAlong {
  int64_t first = 0, n = 0, k = 0;
  std::vector<int32_t> drafts;  // [n - first, k]: row q - first holds the k drafts after slot q
  std::vector<float> logits;    // [n - first, V] with want_logits: the MTP head's logits of slot q (draft 1's)
};

// m must be built with ModelOptions::mtp_layers = 1. tokens: t_0 .. t_{n-1} (n >= 1); 0 <= first < n; k >= 1.
// Throws Error on bad arguments or token ids.
MtpAlong mtp_drafts_along(Model& m, std::span<const int32_t> tokens, int64_t first, int64_t k, bool want_logits);

}  // namespace latent
