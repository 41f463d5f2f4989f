// The check that MTP draft passes in graphs equal eager ones, shared by the CPU test (tests/model/test_graphs.cpp,
// graphs through RecordingBackend) and the CUDA test (tests/cuda/test_cuda_mtp.cpp, CUDA graphs): two models of one
// checkpoint with its MTP layer, `mg` with graphs on and `me` with them off, run the same steps over caches of their
// own — batches of n sequences (1, 3, 5, 8, 20) of different lengths, a prefill, the draft layer's prompt slots,
// then 4 verify steps of T = 2, 3, 4 tokens per sequence, each followed by a draft step of 3 drafts as if all drafts
// were accepted — every sequence filling T slots (steps 0, 1: a graphed first pass) —, as if each sequence accepted
// another number (step 2: an eager first pass when n > 1), and with one sequence that only fills its slots (step 3:
// an eager first pass); the later passes (one slot per sequence) always graphed. The verify logits, the draft ids and
// logits and the draft layer's pool rows (latent and indexer keys) must be equal bit for bit, and the graphed passes
// exactly those the eligibility rule names.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "model/model.h"
#include "model_test_util.h"

namespace latent::testing {

struct DraftGraphStats {
  int64_t shapes = 0, draft_calls = 0, graphed_expected = 0;
  int64_t one_slot_kernels = 0;  // kernels of the later-pass graph (one slot) of one sequence, read at batch 1
};

inline int32_t argmax_of(const float* r, int64_t V) { return static_cast<int32_t>(std::max_element(r, r + V) - r); }

// The first pass of a draft step is graphed when every sequence fills the same slots, drafts and decodes; each later
// pass (one slot per sequence still drafting) is.
inline int64_t graphed_passes(const std::vector<MtpSequence>& ms) {
  int64_t max_draft = 0;
  bool first = true;
  for (const MtpSequence& q : ms) {
    first = first && q.n_slots == ms.front().n_slots && q.n_draft > 0 && q.decode && q.start >= 1;
    max_draft = std::max<int64_t>(max_draft, q.n_draft);
  }
  return (first ? 1 : 0) + std::max<int64_t>(max_draft - 1, 0);
}

inline DraftGraphStats check_draft_graphs(Model& mg, Model& me, const std::string& what) {
  Backend& bg = mg.backend();
  Backend& be = me.backend();
  const ModelConfig& cfg = mg.config();
  const int64_t V = cfg.vocab_size, bt = 16, per_seq = 4, L = cfg.num_hidden_layers, k = 3;
  for (Model* m : {&mg, &me}) m->reserve(128, 32, per_seq * bt, per_seq);
  DraftGraphStats st;
  const int64_t graphed0 = mg.draft_graph_captures() + mg.draft_graph_replays();
  for (int64_t n : {1, 3, 5, 8, 20}) {
    for (int64_t T : {2, 3, 4}) {
      const std::string at = what + ", batch " + std::to_string(n) + ", T " + std::to_string(T);
      PagedKvCache cg(cfg, bg, 24 * per_seq, bt, mg.cache_dtype(), 1),
          ce(cfg, be, 24 * per_seq, bt, me.cache_dtype(), 1);
      std::vector<std::vector<int32_t>> blocks(static_cast<size_t>(n)), slot_toks(static_cast<size_t>(n));
      std::vector<int32_t> tokens;
      std::vector<StepSequence> seqs(static_cast<size_t>(n));
      std::vector<int64_t> written(static_cast<size_t>(n), 0);  // draft-layer slots written per sequence
      for (int64_t s = 0; s < n; ++s) {
        for (int64_t j = 0; j < per_seq; ++j) blocks[s].push_back(static_cast<int32_t>((n - 1 - s) * per_seq + j));
        const int64_t len = 3 + (s * 5) % 17;
        for (int64_t t = 0; t < len; ++t) tokens.push_back(static_cast<int32_t>((s * 131 + t * 17 + 7) % V));
        seqs[s].start = 0;
        seqs[s].n_tokens = len;
        seqs[s].blocks = blocks[s];
        seqs[s].logits = LogitRows::Last;
      }
      std::vector<float> lg(static_cast<size_t>(n * T * V)), le(lg.size());
      mg.step(Step{tokens, seqs}, cg, lg.data());
      me.step(Step{tokens, seqs}, ce, le.data());
      EXPECT_EQ(0, std::memcmp(lg.data(), le.data(), static_cast<size_t>(n * V) * sizeof(float))) << at << ": prefill";
      std::vector<int32_t> last(static_cast<size_t>(n));
      for (int64_t s = 0; s < n; ++s) last[s] = argmax_of(le.data() + s * V, V);
      auto draft_both = [&](const std::vector<MtpSequence>& ms, const std::string& step) {
        int64_t nd = 0;
        for (const MtpSequence& q : ms) nd += q.n_draft;
        std::vector<int32_t> dg(static_cast<size_t>(std::max<int64_t>(nd, 1)), -1), de(dg.size(), -1);
        std::vector<float> lgd(dg.size() * static_cast<size_t>(V), 0.0f), led(lgd.size(), 0.0f);
        mg.mtp_draft(ms, cg, dg.data(), nullptr, lgd.data());
        me.mtp_draft(ms, ce, de.data(), nullptr, led.data());
        EXPECT_EQ(dg, de) << at << ", " << step << ": draft ids";
        EXPECT_EQ(0, std::memcmp(lgd.data(), led.data(), lgd.size() * sizeof(float)))
            << at << ", " << step << ": draft logits";
        for (int64_t s = 0; s < n; ++s) {
          const MtpSequence& q = ms[static_cast<size_t>(s)];
          written[s] = std::max(written[s], q.start + q.n_slots + std::max<int64_t>(q.n_draft - 1, 0));
          for (const KvPool* pg : {&cg.latent(L), &cg.index(L)}) {
            const KvPool& pe = pg == &cg.latent(L) ? ce.latent(L) : ce.index(L);
            EXPECT_EQ(pool_rows(bg, *pg, blocks[s], written[s]), pool_rows(be, pe, blocks[s], written[s]))
                << at << ", " << step << ": the draft layer's " << (pg == &cg.latent(L) ? "latent" : "index key")
                << " rows of sequence " << s;
          }
        }
        st.graphed_expected += graphed_passes(ms);
        ++st.draft_calls;
      };
      {  // the prompt's draft-layer slots (prompt rows: eager)
        std::vector<MtpSequence> ms(static_cast<size_t>(n));
        int64_t off = 0;
        for (int64_t s = 0; s < n; ++s) {
          const int64_t len = seqs[s].n_tokens;
          slot_toks[s].assign(tokens.begin() + off, tokens.begin() + off + len);
          slot_toks[s].push_back(last[s]);
          MtpSequence& q = ms[static_cast<size_t>(s)];
          q.start = 0;
          q.n_slots = len + 1;
          q.tokens = slot_toks[s];
          q.hidden_row = off - 1;
          q.zero_first = true;
          q.blocks = blocks[s];
          q.n_draft = 1;
          q.decode = false;
          off += len;
        }
        draft_both(ms, "the prompt's slots");
      }
      std::vector<int64_t> next(static_cast<size_t>(n));  // the next verify's first position
      for (int64_t s = 0; s < n; ++s) next[s] = seqs[s].n_tokens;
      for (int64_t step = 0; step < 4; ++step) {
        tokens.clear();
        for (int64_t s = 0; s < n; ++s) {
          seqs[s].start = next[s];
          seqs[s].n_tokens = T;
          seqs[s].decode = true;
          seqs[s].logits = LogitRows::All;
          tokens.push_back(last[s]);
          for (int64_t j = 1; j < T; ++j) tokens.push_back(static_cast<int32_t>((s * 29 + step * 7 + j * 3) % V));
        }
        mg.step(Step{tokens, seqs}, cg, lg.data());
        me.step(Step{tokens, seqs}, ce, le.data());
        EXPECT_EQ(0, std::memcmp(lg.data(), le.data(), lg.size() * sizeof(float))) << at << ", verify " << step;
        // As the scheduler goes on after a verify of positions p .. p + T - 1 whose first n_slots - 1 drafts were
        // accepted: the draft layer's slots p + 1 .. p + n_slots get the verify's tokens 1 .. n_slots - 1 and the
        // token sampled after them, which the next verify (at p + n_slots) starts with.
        std::vector<MtpSequence> ms(static_cast<size_t>(n));
        for (int64_t s = 0; s < n; ++s) {
          const int64_t slots = step == 2 ? 1 + (s + step) % T : T;
          last[s] = argmax_of(le.data() + (s * T + slots - 1) * V, V);
          next[s] = seqs[s].start + slots;
          slot_toks[s].assign(tokens.begin() + s * T + 1, tokens.begin() + s * T + slots);
          slot_toks[s].push_back(last[s]);
          MtpSequence& q = ms[static_cast<size_t>(s)];
          q.start = seqs[s].start + 1;
          q.n_slots = slots;
          q.tokens = slot_toks[s];
          q.hidden_row = s * T;
          q.blocks = blocks[s];
          q.n_draft = step == 3 && n > 1 && s == n - 1 ? 0 : static_cast<int32_t>(k);
        }
        draft_both(ms, "the draft step after verify " + std::to_string(step));
      }
      EXPECT_GT(mg.draft_graph_kernels(graph_seqs_for(n, T), T), 0) << at << ": no first-pass draft graph";
      if (n == 1) st.one_slot_kernels = std::max(st.one_slot_kernels, mg.draft_graph_kernels(1, 1));
      ++st.shapes;
    }
  }
  EXPECT_GT(st.graphed_expected, 0) << what;
  EXPECT_GT(st.one_slot_kernels, 0) << what << ": no later-pass draft graph at batch 1";
  EXPECT_EQ(mg.draft_graph_captures() + mg.draft_graph_replays() - graphed0, st.graphed_expected)
      << what << ": the draft passes run from graphs";
  EXPECT_GT(mg.draft_graph_replays(), 0) << what;
  EXPECT_EQ(me.draft_graph_captures() + me.draft_graph_replays(), 0) << what;
  EXPECT_EQ(mg.draft_passes(), me.draft_passes()) << what;
  return st;
}

}  // namespace latent::testing
