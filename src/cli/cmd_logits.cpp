// latent logits --model DIR --tokens IDS [--decode-from K] --out FILE.npy [--hidden FILE.npy] [--mtp-out FILE.npy]
//               [--activations fp32|bf16] [--threads N] [--backend ref|cpu] [--attention auto|naive|absorbed]
//               [--no-indexer]
// Logits of every position as float32 [T, vocab] .npy. Without --decode-from: one prefill. With it: prefill of the
// first K tokens, then one-token decode steps through the latent cache (weight-absorbed MLA).
// --mtp-out: the checkpoint's MTP layer's logits of slots 0..T-1 (slot q pairs the head-input hidden state of
// position q-1 with token q and predicts token q+1; model/mtp_probe.h), float32 [T, vocab], as
// tools/mtp_reference.py mtp_slots computes them from the --hidden rows.
#include <cstdio>
#include <memory>

#include "backend/backend.h"
#include "cli/commands.h"
#include "cli/model_flags.h"
#include "core/error.h"
#include "core/npy.h"
#include "model/generate.h"
#include "model/model.h"
#include "model/mtp_probe.h"

namespace latent::cli {

namespace {
AttentionForm parse_form(const std::string& s) {
  if (s == "auto") return AttentionForm::Auto;
  if (s == "naive") return AttentionForm::Naive;
  if (s == "absorbed") return AttentionForm::Absorbed;
  fail("--attention must be auto, naive or absorbed (got '{}')", s);
}
}  // namespace

void register_logits(CLI::App& app) {
  struct Opts {
    ModelFlags model;
    std::string tokens, out, hidden, mtp_out, activations, backend = "cpu", attention = "auto";
    int64_t decode_from = -1;
    bool no_indexer = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("logits", "Logits of every position (float32 [T, vocab] .npy)");
  o->model.add_to(cmd);
  cmd->add_option("--tokens", o->tokens, "Token ids, e.g. \"1 2 3\"")->required();
  cmd->add_option("--out", o->out, "Output .npy file (float32 [T, vocab])")->required();
  cmd->add_option("--decode-from", o->decode_from,
                  "Prefill the first K tokens, then decode the rest one token at a time through the cache");
  cmd->add_option("--hidden", o->hidden, "Also write per-layer hidden states float32 [L+1, T, D] .npy");
  cmd->add_option("--mtp-out", o->mtp_out,
                  "Also write the MTP layer's logits of every slot float32 [T, V] .npy (slot q predicts token q+1)");
  cmd->add_option(
      "--activations", o->activations,
      "fp32 or bf16 (round activations as HF bf16 runs do; default: bf16 on --device cuda, fp32 on cpu), or "
      "declared (FP8 activations where the checkpoint declares them, the default elsewhere)");
  cmd->add_option("--backend", o->backend, "ref (scalar oracle) or cpu (default)");
  cmd->add_option("--attention", o->attention,
                  "MLA form: auto (default: naive prefill, absorbed decode), naive, "
                  "absorbed");
  cmd->add_flag("--no-indexer", o->no_indexer, "Disable the DSA indexer (dense causal attention)");
  cmd->callback([o]() {
    const bool bf16 = o->model.bf16_activations(o->activations);
    const std::vector<int32_t> ids = parse_token_ids(o->tokens);
    if (ids.empty()) fail("--tokens: no token ids given");
    const int64_t T = static_cast<int64_t>(ids.size());
    if (o->decode_from != -1 && (o->decode_from < 1 || o->decode_from > T))
      fail("--decode-from {} must be in [1, {}] (the number of tokens)", o->decode_from, T);
    const bool want_mtp = !o->mtp_out.empty();
    PlanOptions po = o->model.plan_options();
    if (want_mtp) po.mtp_layers = 1;
    ModelFiles mf = open_model_files(o->model.model_dir(), po);
    if (want_mtp && mf.cfg->num_nextn_predict_layers < 1)
      fail("--mtp-out: the checkpoint has no MTP layer (config.json num_nextn_predict_layers {})",
           mf.cfg->num_nextn_predict_layers);
    for (const auto& w : mf.plan->warnings()) std::fprintf(stderr, "latent: warning: %s\n", w.c_str());
    auto be = make_backend(o->model.backend_name(o->backend), o->model.threads);
    ModelOptions mo;
    mo.bf16_activations = bf16;
    mo.act_fp8_declared = o->model.act_fp8_declared(o->activations, *mf.plan);
    mo.disable_indexer = o->no_indexer;
    mo.attention = parse_form(o->attention);
    mo.mtp_layers = want_mtp ? 1 : 0;
    Model model(*mf.cfg, *mf.plan, *be, mo);
    const int64_t V = mf.cfg->vocab_size, D = mf.cfg->hidden_size, L = mf.cfg->num_hidden_layers;
    const bool want_hidden = !o->hidden.empty();

    std::vector<float> logits(static_cast<size_t>(T * V));
    std::vector<float> hidden_all;
    if (want_hidden) hidden_all.assign(static_cast<size_t>((L + 1) * T * D), 0.0f);
    KvCache cache(*mf.cfg, 64, model.mtp_layers());
    const int64_t K = o->decode_from == -1 ? T : o->decode_from;
    std::vector<float> hid;
    // Copies the [L+1, n, D] hidden states of tokens t0..t0+n-1 into [L+1, T, D].
    auto place_hidden = [&](int64_t t0, int64_t n) {
      for (int64_t l = 0; l <= L; ++l)
        std::copy(hid.begin() + (l * n) * D, hid.begin() + (l * n + n) * D, hidden_all.begin() + (l * T + t0) * D);
    };
    model.forward(std::span<const int32_t>(ids.data(), static_cast<size_t>(K)), cache, logits.data(), true,
                  want_hidden ? &hid : nullptr);
    if (want_hidden) place_hidden(0, K);
    for (int64_t t = K; t < T; ++t) {
      model.forward(std::span<const int32_t>(ids.data() + t, 1), cache, logits.data() + t * V, true,
                    want_hidden ? &hid : nullptr);
      if (want_hidden) place_hidden(t, 1);
    }
    const int64_t shape[2] = {T, V};
    write_npy_f32(o->out, logits.data(), shape);
    if (want_hidden) {
      const int64_t hshape[3] = {L + 1, T, D};
      write_npy_f32(o->hidden, hidden_all.data(), hshape);
    }
    if (want_mtp) {
      const MtpAlong a = mtp_drafts_along(model, ids, 0, 1, true);
      write_npy_f32(o->mtp_out, a.logits.data(), shape);
    }
  });
}

}  // namespace latent::cli
