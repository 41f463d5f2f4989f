// The check that MTP draft passes in graphs equal eager ones, shared by the CPU test (tests/model/test_graphs.cpp,
// graphs through RecordingBackend) and the CUDA test (tests/cuda/test_cuda_mtp.cpp, CUDA graphs): two models of one
// checkpoint with its MTP layer, `mg` with graphs on and `me` with them off, run the same steps over caches of their
// own — batches of n sequences (1, 3, 5, 8, 20) of different lengths, a prefill, the draft layer's prompt slots,
// then 7 verify steps of T = 2, 3, 4 tokens per sequence, each followed by a draft step of k drafts as if all drafts
// were accepted — every sequence filling T slots (steps 0, 1: a graphed first pass, padded to the graph's bucket)
// —, as if each sequence accepted another number (step 2: a ragged first pass when n > 1, graphed at its exact
// shape), with one sequence that only fills its slots (step 3: an eager first pass), and with one sequence drafting
// one token fewer (step 4: a graphed first pass, but not one graph for the step), and step 2's slot counts in
// reverse order (step 5: as many tokens in another layout, replaying step 2's graphs), and T and 1 slots alternating
// (step 6: ragged again, mostly another token count). The later passes (one slot per sequence) are always
// graph-eligible. With
// ModelOptions::draft_step_graph (mg's choice), a draft step whose sequences all draft the same k >= 2 tokens and
// whose first pass is graph-eligible runs as one graph with one download of its ids. The verify logits, the draft
// ids and logits and the draft layer's pool rows (latent and indexer keys) must be equal bit for bit; per draft
// step, the graphs run (captured or replayed), the steps run as one graph and the downloads of draft ids must be
// exactly those the eligibility rules name.
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
  int64_t shapes = 0, draft_calls = 0;
  int64_t graph_runs = 0;      // draft graphs run (captured or replayed): a graph per pass, or one per step
  int64_t graphed_passes = 0;  // passes that ran in those graphs
  int64_t one_graph_steps = 0, id_downloads = 0;
  int64_t one_slot_kernels = 0;    // kernels of the later-pass graph (one slot) of one sequence, read at batch 1
  int64_t step_graph_kernels = 0;  // kernels of the largest one-graph draft step of one sequence, read at batch 1
};

inline int32_t argmax_of(const float* r, int64_t V) { return static_cast<int32_t>(std::max_element(r, r + V) - r); }

// The first pass of a draft step is graph-eligible when every sequence drafts and decodes (filling the same
// number of slots or not).
inline bool first_pass_graphed(const std::vector<MtpSequence>& ms) {
  bool first = true;
  for (const MtpSequence& q : ms) first = first && q.n_draft > 0 && q.decode && q.start >= 1;
  return first;
}

inline int64_t max_draft_of(const std::vector<MtpSequence>& ms) {
  int64_t max_draft = 0;
  for (const MtpSequence& q : ms) max_draft = std::max<int64_t>(max_draft, q.n_draft);
  return max_draft;
}

// A draft step runs as one graph when the model asks for it, every sequence drafts the same k >= 2 tokens and its
// first pass is graph-eligible (the later passes always are here: within the reserved limits).
inline bool one_graph_step(const Model& m, const std::vector<MtpSequence>& ms) {
  if (!m.options().graphs || !m.options().draft_step_graph || !first_pass_graphed(ms)) return false;
  for (const MtpSequence& q : ms)
    if (q.n_draft != ms.front().n_draft) return false;
  return ms.front().n_draft >= 2;
}

// On the per-pass route: the passes in graphs (an eligible first pass, every later one).
inline int64_t graphed_passes(const std::vector<MtpSequence>& ms) {
  return (first_pass_graphed(ms) ? 1 : 0) + std::max<int64_t>(max_draft_of(ms) - 1, 0);
}

inline DraftGraphStats check_draft_graphs(Model& mg, Model& me, const std::string& what, int64_t k = 3) {
  Backend& bg = mg.backend();
  Backend& be = me.backend();
  const ModelConfig& cfg = mg.config();
  const int64_t V = cfg.vocab_size, bt = 16, per_seq = 4, L = cfg.num_hidden_layers;
  for (Model* m : {&mg, &me}) m->reserve(128, 32, per_seq * bt, per_seq);
  DraftGraphStats st;
  const int64_t graphed0 = mg.draft_graph_captures() + mg.draft_graph_replays();
  const int64_t one_graph0 = mg.draft_step_graphs(), downloads0 = mg.draft_id_downloads();
  const bool one_graph_on = mg.options().draft_step_graph && k >= 2;
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
        const int64_t runs0 = mg.draft_graph_captures() + mg.draft_graph_replays(), steps0 = mg.draft_step_graphs();
        const int64_t dl0 = mg.draft_id_downloads(), dle0 = me.draft_id_downloads();
        mg.mtp_draft(ms, cg, dg.data(), nullptr, lgd.data());
        me.mtp_draft(ms, ce, de.data(), nullptr, led.data());
        // The graphs this step ran and the downloads of its ids: one graph and one download as one graph; else a
        // graph per eligible pass and a download per pass that drafts.
        const bool one = one_graph_step(mg, ms);
        const int64_t runs = one ? 1 : graphed_passes(ms), downloads = one ? 1 : max_draft_of(ms);
        EXPECT_EQ(mg.draft_graph_captures() + mg.draft_graph_replays() - runs0, runs) << at << ", " << step;
        EXPECT_EQ(mg.draft_step_graphs() - steps0, one ? 1 : 0) << at << ", " << step;
        EXPECT_EQ(mg.draft_id_downloads() - dl0, downloads) << at << ", " << step << ": downloads of draft ids";
        EXPECT_EQ(me.draft_id_downloads() - dle0, max_draft_of(ms)) << at << ", " << step << ": eager downloads";
        st.graph_runs += runs;
        st.graphed_passes += one ? max_draft_of(ms) : graphed_passes(ms);
        st.one_graph_steps += one ? 1 : 0;
        st.id_downloads += downloads;
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
      const int64_t verify_caps0 = mg.graph_captures(), verify_replays0 = mg.graph_replays();
      const int64_t steps = 7;
      for (int64_t step = 0; step < steps; ++step) {
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
          // (step 5: step 2's slot counts in reverse order — another layout of as many tokens: its graphs replay;
          // step 6: T and 1 alternating — mostly another number of tokens: graphs of their own)
          int64_t slots = T;
          if (step == 2) slots = 1 + (s + 2) % T;
          if (step == 5) slots = 1 + (n - 1 - s + 2) % T;
          if (step == 6) slots = s % 2 == 0 ? T : 1;
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
          q.n_draft = static_cast<int32_t>(k);
          if (n > 1 && s == n - 1 && step == 3) q.n_draft = 0;
          if (n > 1 && s == n - 1 && step == 4) q.n_draft = static_cast<int32_t>(k - 1);
        }
        const int64_t caps0 = mg.draft_graph_captures();
        draft_both(ms, "the draft step after verify " + std::to_string(step));
        if (step == 5 && n > 1) {
          EXPECT_EQ(mg.draft_graph_captures() - caps0, 0) << at << ": a ragged layout of step 2's shape replays";
        }
      }
      // The draft steps between the verify steps leave the verify graphs alone: one capture (two on DSA models:
      // with and without the selection) at most, replays after.
      const int64_t verify_caps = mg.graph_captures() - verify_caps0;
      EXPECT_LE(verify_caps, cfg.has_indexer() ? 2 : 1) << at << ": verify graphs captured";
      EXPECT_EQ(mg.graph_replays() - verify_replays0 + verify_caps, steps) << at << ": verify steps from graphs";
      if (one_graph_on) {
        EXPECT_GT(mg.draft_step_graph_kernels(graph_seqs_for(n, T), T, k), 0) << at << ": no one-graph draft step";
      } else {
        EXPECT_GT(mg.draft_graph_kernels(graph_seqs_for(n, T), T), 0) << at << ": no first-pass draft graph";
      }
      if (n == 1) {
        st.one_slot_kernels = std::max(st.one_slot_kernels, mg.draft_graph_kernels(1, 1));
        st.step_graph_kernels = std::max(st.step_graph_kernels, mg.draft_step_graph_kernels(1, T, k));
      }
      ++st.shapes;
    }
  }
  EXPECT_GT(st.graph_runs, 0) << what;
  if (one_graph_on) {
    EXPECT_GT(st.step_graph_kernels, 0) << what << ": no one-graph draft step at batch 1";
  } else if (k >= 2) {
    EXPECT_GT(st.one_slot_kernels, 0) << what << ": no later-pass draft graph at batch 1";
  }
  EXPECT_EQ(mg.draft_graph_captures() + mg.draft_graph_replays() - graphed0, st.graph_runs)
      << what << ": the draft graphs run";
  EXPECT_EQ(mg.draft_step_graphs() - one_graph0, st.one_graph_steps) << what;
  EXPECT_EQ(mg.draft_id_downloads() - downloads0, st.id_downloads) << what;
  if (one_graph_on) {
    EXPECT_GT(st.one_graph_steps, 0) << what;
  }
  EXPECT_GT(mg.draft_graph_replays(), 0) << what;
  EXPECT_EQ(me.draft_graph_captures() + me.draft_graph_replays() + me.draft_step_graphs(), 0) << what;
  EXPECT_EQ(mg.draft_passes(), me.draft_passes()) << what;
  return st;
}

}  // namespace latent::testing
