#include "fidelity/fidelity.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "backend/backend.h"
#include "core/error.h"
#include "loader/quant_config.h"
#include "model/generate.h"
#include "model/model.h"
#include "model/mtp_probe.h"

namespace latent {

double relative_error(const float* ref, const float* x, size_t n) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(x[i]) - static_cast<double>(ref[i]);
    num += d * d;
    den += static_cast<double>(ref[i]) * static_cast<double>(ref[i]);
  }
  if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
  return std::sqrt(num / den);
}

double kl_divergence(const float* lp, const float* lq, int64_t n) {
  auto lse = [n](const float* l) {
    double mx = -INFINITY;
    for (int64_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(l[i]));
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(l[i]) - mx);
    return mx + std::log(s);
  };
  const double zp = lse(lp), zq = lse(lq);
  double kl = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double logp = static_cast<double>(lp[i]) - zp;
    const double logq = static_cast<double>(lq[i]) - zq;
    const double p = std::exp(logp);
    if (p > 0.0) kl += p * (logp - logq);
  }
  return std::max(0.0, kl);
}

void MtpAcceptance::add(const MtpAcceptance& o) {
  if (proposed.size() < o.proposed.size()) {
    proposed.resize(o.proposed.size(), 0);
    accepted.resize(o.accepted.size(), 0);
  }
  for (size_t j = 0; j < o.proposed.size(); ++j) {
    proposed[j] += o.proposed[j];
    accepted[j] += o.accepted[j];
  }
}

MtpAcceptance mtp_acceptance(const std::vector<int32_t>& cont, const std::vector<int32_t>& drafts, int64_t k) {
  const int64_t n = static_cast<int64_t>(cont.size());
  if (k < 1 || static_cast<int64_t>(drafts.size()) != n * k)
    fail("mtp acceptance: {} drafts for {} positions x {}", drafts.size(), n, k);
  MtpAcceptance a;
  a.proposed.assign(static_cast<size_t>(k), 0);
  a.accepted.assign(static_cast<size_t>(k), 0);
  for (int64_t q = 0; q < n; ++q) {
    bool ok = true;
    for (int64_t j = 1; j <= k && q + j < n; ++j) {
      ok = ok && drafts[static_cast<size_t>(q * k + j - 1)] == cont[static_cast<size_t>(q + j)];
      ++a.proposed[static_cast<size_t>(j - 1)];
      a.accepted[static_cast<size_t>(j - 1)] += ok ? 1 : 0;
    }
  }
  return a;
}

namespace {

// Index of the rule that decides entry e (the last matching one, as apply_quantize_rules does), -1 when none.
int winning_rule(const std::vector<QuantizeRule>& rules, const std::string& module, const std::string& name) {
  int w = -1;
  for (size_t i = 0; i < rules.size(); ++i)
    if (glob_match(rules[i].pattern, module) || glob_match(rules[i].pattern, name)) w = static_cast<int>(i);
  return w;
}

struct LinearName {
  std::string module, name;
};

std::vector<LinearName> linear_names(const std::string& dir, int64_t mtp_layers) {
  std::vector<LinearName> v;
  PlanOptions po;
  po.mtp_layers = mtp_layers;
  const ModelFiles f = open_model_files(dir, po);
  for (const auto& e : f.plan->entries())
    if (e.is_linear && !e.skipped) v.push_back({e.module, e.name});
  return v;
}

struct Side {
  ModelFiles files;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::vector<TensorError> transforms;
};

// One plan: the shared rules, then the side's own (which win where both match). A shared rule that every one of
// its Linear weights overrides is dropped for this side (it has no effect here, and the loader would call it a
// pattern that matches nothing). The guard applies to the tensors a shared rule decides.
Side open_side(const std::string& dir, const std::vector<LinearName>& stored, const std::vector<QuantizeRule>& side,
               const char* side_flag, const FidelityOptions& opt, const std::string& activations, std::string& act_text,
               int64_t& declared_linears) {
  if (!activations.empty() && activations != "fp32" && activations != "bf16" && activations != "declared")
    fail("{}-activations must be fp32, bf16 or declared (got '{}')", side_flag, activations);
  PlanOptions po;
  size_t n_shared = 0;
  for (size_t i = 0; i < opt.shared.size(); ++i) {
    std::vector<QuantizeRule> probe(opt.shared.begin() + static_cast<std::ptrdiff_t>(i), opt.shared.end());
    probe.insert(probe.end(), side.begin(), side.end());
    bool matches = false, decides = false;
    for (const LinearName& e : stored) {
      const int w = winning_rule(probe, e.module, e.name);
      matches = matches || glob_match(opt.shared[i].pattern, e.module) || glob_match(opt.shared[i].pattern, e.name);
      decides = decides || w == 0;
    }
    if (decides || !matches) po.quantize.push_back(opt.shared[i]), ++n_shared;
  }
  po.quantize.insert(po.quantize.end(), side.begin(), side.end());
  po.max_quant_error = opt.max_quant_error;
  po.allow_lossy = true;  // the guard below applies to the shared rules only
  po.mtp_layers = opt.mtp_drafts > 0 ? 1 : 0;
  Side s;
  s.files = open_model_files(dir, po);
  std::vector<std::string> offenders;
  for (const auto& e : s.files.plan->entries()) {
    if (e.transform == "none") continue;
    const bool over = !(e.rel_error <= opt.max_quant_error);
    const int w = winning_rule(po.quantize, e.module, e.name);
    std::string how = e.transform;  // the loader names every rule --quantize: say which flag it came from here
    const size_t at = how.find("(--quantize ");
    if (w >= 0 && static_cast<size_t>(w) >= n_shared && at != std::string::npos)
      how.replace(at + 1, std::string("--quantize").size(), side_flag);
    s.transforms.push_back({e.name, how, e.rel_error, over});
    if (over && w >= 0 && static_cast<size_t>(w) < n_shared)
      offenders.push_back(fmt::format("{} rel_error {:.4f}", e.name, e.rel_error));
  }
  if (!offenders.empty() && !opt.allow_lossy) {
    std::string list;
    for (size_t i = 0; i < offenders.size(); ++i) list += (i ? ", " : "") + offenders[i];
    fail(
        "refusing lossy transform: {} tensor(s) exceed --max-quant-error {}: {} (pass --allow-lossy to accept; "
        "in fidelity, --quantize applies to both plans: to measure a transform, pass it as --candidate)",
        offenders.size(), opt.max_quant_error, list);
  }
  s.backend = make_backend(opt.backend, opt.threads);
  ModelOptions mo;
  mo.mtp_layers = po.mtp_layers;
  mo.bf16_activations = activations == "bf16";
  declared_linears = 0;
  if (activations == "declared")
    for (const PlanEntry& e : s.files.plan->entries()) declared_linears += e.weight.act_fp8 ? 1 : 0;
  mo.act_fp8_declared = declared_linears > 0;
  act_text = mo.act_fp8_declared
                 ? fmt::format("declared (fp8 dynamic activations on {} linears, fp32 elsewhere)", declared_linears)
             : activations == "declared"
                 ? "declared (" + s.files.plan->activation_scheme() + ": nothing to quantize; fp32)"
                 : (mo.bf16_activations ? "bf16" : "fp32");
  s.model = std::make_unique<Model>(*s.files.cfg, *s.files.plan, *s.backend, mo);
  return s;
}

}  // namespace

FidelityReport run_fidelity(const std::string& model_dir, const std::vector<std::vector<int32_t>>& prompts,
                            const std::vector<std::string>& labels, const FidelityOptions& opt) {
  if (prompts.empty()) fail("fidelity: no prompts");
  std::vector<LinearName> stored;  // the Linear weights' names, to resolve overlapping rules (only with --quantize)
  if (opt.mtp_drafts < 0 || opt.mtp_drafts > 16)
    fail("fidelity: MTP draft positions must be in [0, 16] (got {})", opt.mtp_drafts);
  if (!opt.shared.empty()) stored = linear_names(model_dir, opt.mtp_drafts > 0 ? 1 : 0);
  std::string base_act, cand_act;
  int64_t base_n = 0, cand_n = 0;
  Side base = open_side(model_dir, stored, opt.baseline, "--baseline", opt, opt.baseline_activations, base_act, base_n);
  Side cand =
      open_side(model_dir, stored, opt.candidate, "--candidate", opt, opt.candidate_activations, cand_act, cand_n);
  const ModelConfig& cfg = *base.files.cfg;
  const int64_t V = cfg.vocab_size;

  FidelityReport rep;
  rep.model_dir = model_dir;
  rep.max_quant_error = opt.max_quant_error;
  rep.baseline_activations = base_act;
  rep.candidate_activations = cand_act;
  rep.baseline_declared_linears = base_n;
  rep.candidate_declared_linears = cand_n;
  rep.baseline_transforms = base.transforms;
  rep.candidate_transforms = cand.transforms;
  rep.mean_layer_rel_error.assign(static_cast<size_t>(cfg.num_hidden_layers + 1), 0.0);
  rep.mtp_drafts = opt.mtp_drafts;
  // One plan's drafts along prompt + its own greedy continuation, from the continuation's first token on.
  auto mtp_along = [&](Model& m, const std::vector<int32_t>& prompt, const std::vector<int32_t>& cont) {
    std::vector<int32_t> seq = prompt;
    seq.insert(seq.end(), cont.begin(), cont.end());
    const int64_t k = opt.mtp_drafts;
    if (cont.size() < 2) return mtp_acceptance(cont, std::vector<int32_t>(cont.size() * static_cast<size_t>(k)), k);
    const MtpAlong a = mtp_drafts_along(m, seq, static_cast<int64_t>(prompt.size()), k, false);
    return mtp_acceptance(cont, a.drafts, k);
  };

  for (size_t pi = 0; pi < prompts.size(); ++pi) {
    const auto& ids = prompts[pi];
    if (ids.empty()) fail("fidelity: prompt {} is empty", pi);
    for (int32_t t : ids)
      if (t < 0 || t >= V) fail("fidelity: prompt {}: token id {} outside [0, {})", pi, t, V);
    PromptFidelity pf;
    pf.label = pi < labels.size() ? labels[pi] : fmt::format("prompt {}", pi);
    pf.prompt = ids;
    const int64_t T = static_cast<int64_t>(ids.size());
    std::vector<float> lb(static_cast<size_t>(T * V)), lc(static_cast<size_t>(T * V));
    std::vector<float> hb, hc;
    {
      KvCache cb(cfg, 64, base.model->mtp_layers()), cc(cfg, 64, cand.model->mtp_layers());
      base.model->forward(ids, cb, lb.data(), true, &hb);
      cand.model->forward(ids, cc, lc.data(), true, &hc);
    }
    const int64_t L1 = cfg.num_hidden_layers + 1;
    const size_t per_layer = static_cast<size_t>(T * cfg.hidden_size);
    for (int64_t l = 0; l < L1; ++l) {
      double e = relative_error(hb.data() + static_cast<size_t>(l) * per_layer,
                                hc.data() + static_cast<size_t>(l) * per_layer, per_layer);
      pf.layer_rel_error.push_back(e);
      rep.mean_layer_rel_error[static_cast<size_t>(l)] += e / static_cast<double>(prompts.size());
    }
    int64_t agree = 0;
    double kl_sum = 0.0;
    for (int64_t t = 0; t < T; ++t) {
      const float* pb = lb.data() + t * V;
      const float* pc = lc.data() + t * V;
      const double kl = kl_divergence(pb, pc, V);
      kl_sum += kl;
      pf.kl_max = std::max(pf.kl_max, kl);
      agree += argmax(pb, V) == argmax(pc, V);
    }
    pf.kl_mean = kl_sum / static_cast<double>(T);
    pf.top1_agreement = static_cast<double>(agree) / static_cast<double>(T);

    GenerateOptions g;
    g.max_new_tokens = opt.max_tokens;
    g.temperature = 0.0;
    g.stop_ids = opt.stop_ids;
    if (opt.max_tokens > 0) {
      pf.greedy_baseline = generate(*base.model, ids, g);
      pf.greedy_candidate = generate(*cand.model, ids, g);
    }
    const size_t n = std::min(pf.greedy_baseline.size(), pf.greedy_candidate.size());
    for (size_t i = 0; i < n; ++i)
      if (pf.greedy_baseline[i] != pf.greedy_candidate[i]) {
        pf.diverge_step = static_cast<int64_t>(i);
        break;
      }
    if (pf.diverge_step < 0 && pf.greedy_baseline.size() != pf.greedy_candidate.size())
      pf.diverge_step = static_cast<int64_t>(n);
    pf.loop_baseline = find_longest_loop(pf.greedy_baseline);
    pf.loop_candidate = find_longest_loop(pf.greedy_candidate);
    if (opt.mtp_drafts > 0) {
      pf.mtp_baseline = mtp_along(*base.model, ids, pf.greedy_baseline);
      pf.mtp_candidate = mtp_along(*cand.model, ids, pf.greedy_candidate);
      rep.mtp_baseline.add(pf.mtp_baseline);
      rep.mtp_candidate.add(pf.mtp_candidate);
    }
    rep.prompts.push_back(std::move(pf));
  }
  return rep;
}

namespace {

std::string loop_str(const std::optional<LoopInfo>& l) {
  if (!l) return "no";
  return fmt::format("yes (period {}, span {} from {})", l->period, l->span, l->start);
}

std::string short_label(const std::string& s) {
  std::string r;
  for (char c : s) r += (c == '\n' || c == '\r' || c == '\t') ? ' ' : c;
  return r.size() > 48 ? r.substr(0, 45) + "..." : r;
}

}  // namespace

std::string fidelity_table(const FidelityReport& r) {
  std::string out = fmt::format("model  {}\n", r.model_dir);
  auto list = [&](const char* what, const std::vector<TensorError>& v) {
    if (v.empty()) {
      out += fmt::format("{}  as stored (no transform)\n", what);
      return;
    }
    const auto over = std::count_if(v.begin(), v.end(), [](const TensorError& t) { return t.over_budget; });
    out += fmt::format("{}  {} transformed tensor(s){}:\n", what, v.size(),
                       over ? fmt::format(", {} over --max-quant-error {} (serve would refuse them without "
                                          "--allow-lossy)",
                                          over, r.max_quant_error)
                            : std::string());
    for (const auto& t : v)
      out += fmt::format("    {:<56} rel_error {:.4f}{}  {}\n", t.name, t.rel_error, t.over_budget ? " (over)" : "",
                         t.transform);
  };
  list("baseline ", r.baseline_transforms);
  list("candidate", r.candidate_transforms);
  out += fmt::format("activations  baseline: {}   candidate: {}\n", r.baseline_activations, r.candidate_activations);
  out += "\nper-layer relative error of the residual stream (mean over prompts)\n";
  for (size_t l = 0; l < r.mean_layer_rel_error.size(); ++l) {
    const char* what = l == 0 ? "embeddings" : (l + 1 == r.mean_layer_rel_error.size() ? "final norm" : "");
    out += fmt::format("  {:>3}  {:.3e}  {}\n", l, r.mean_layer_rel_error[l], what);
  }
  out += fmt::format("\n{:<50} {:>9} {:>9} {:>7} {:>8}  {:<12} {}\n", "prompt", "KL mean", "KL max", "top-1", "diverge",
                     "loop (base)", "loop (candidate)");
  for (const auto& p : r.prompts) {
    out += fmt::format("{:<50} {:>9.3e} {:>9.3e} {:>6.1f}% {:>8}  {:<12} {}\n", short_label(p.label), p.kl_mean,
                       p.kl_max, 100.0 * p.top1_agreement,
                       p.diverge_step < 0 ? std::string("never") : std::to_string(p.diverge_step),
                       p.loop_baseline ? "yes" : "no", loop_str(p.loop_candidate));
  }
  if (r.mtp_drafts > 0) {
    out += fmt::format(
        "\nMTP draft acceptance (greedy; the drafts at every position of each plan's own greedy "
        "continuation; position j counts when drafts 1..j all match)\n");
    out += fmt::format("  {:<9} {:>22} {:>22} {:>12}\n", "position", "baseline", "candidate", "difference");
    for (size_t j = 0; j < static_cast<size_t>(r.mtp_drafts); ++j) {
      auto cell = [j](const MtpAcceptance& a) {
        return fmt::format("{:.1f}% ({}/{})", 100.0 * a.rate(j), a.accepted[j], a.proposed[j]);
      };
      out += fmt::format("  {:<9} {:>22} {:>22} {:>+9.1f} pp\n", j + 1, cell(r.mtp_baseline), cell(r.mtp_candidate),
                         100.0 * (r.mtp_candidate.rate(j) - r.mtp_baseline.rate(j)));
    }
  }
  return out;
}

std::string rules_text(const std::vector<QuantizeRule>& rules) {
  if (rules.empty()) return "as stored";
  std::string s;
  for (const auto& q : rules)
    s += fmt::format("{}{}={}", s.empty() ? "" : ", ", q.pattern, weight_format_name(q.format));
  return s;
}

nlohmann::json fidelity_json(const FidelityReport& r) {
  auto terr = [](const std::vector<TensorError>& v) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& t : v)
      a.push_back({{"name", t.name},
                   {"transform", t.transform},
                   {"rel_error", t.rel_error},
                   {"over_max_quant_error", t.over_budget}});
    return a;
  };
  auto loop = [](const std::optional<LoopInfo>& l) -> nlohmann::json {
    if (!l) return nullptr;
    return {{"period", l->period}, {"span", l->span}, {"start", l->start}};
  };
  auto mtp = [](const MtpAcceptance& a) -> nlohmann::json {
    if (a.proposed.empty()) return nullptr;
    nlohmann::json rates = nlohmann::json::array();
    for (size_t i = 0; i < a.proposed.size(); ++i)
      rates.push_back(a.proposed[i] ? nlohmann::json(a.rate(i)) : nlohmann::json(nullptr));
    return {{"proposed", a.proposed}, {"accepted", a.accepted}, {"acceptance", rates}};
  };
  nlohmann::json j;
  j["model"] = r.model_dir;
  j["max_quant_error"] = r.max_quant_error;
  j["baseline_transforms"] = terr(r.baseline_transforms);
  j["candidate_transforms"] = terr(r.candidate_transforms);
  j["mean_layer_rel_error"] = r.mean_layer_rel_error;
  j["prompts"] = nlohmann::json::array();
  for (const auto& p : r.prompts) {
    j["prompts"].push_back(
        {{"label", p.label},
         {"prompt_tokens", p.prompt},
         {"layer_rel_error", p.layer_rel_error},
         {"kl_mean", p.kl_mean},
         {"kl_max", p.kl_max},
         {"top1_agreement", p.top1_agreement},
         {"greedy_baseline", p.greedy_baseline},
         {"greedy_candidate", p.greedy_candidate},
         {"diverge_step", p.diverge_step < 0 ? nlohmann::json(nullptr) : nlohmann::json(p.diverge_step)},
         {"loop_baseline", loop(p.loop_baseline)},
         {"loop_candidate", loop(p.loop_candidate)},
         {"mtp_baseline", mtp(p.mtp_baseline)},
         {"mtp_candidate", mtp(p.mtp_candidate)}});
  }
  if (r.mtp_drafts > 0) {
    nlohmann::json diff = nlohmann::json::array();
    for (size_t i = 0; i < static_cast<size_t>(r.mtp_drafts); ++i)
      diff.push_back(r.mtp_candidate.rate(i) - r.mtp_baseline.rate(i));
    j["mtp"] = {{"draft_positions", r.mtp_drafts},
                {"definition",
                 "greedy; at every position of each plan's own greedy continuation the MTP layer drafts k tokens "
                 "(recursively); draft j is proposed while its target token is in the continuation and accepted "
                 "when drafts 1..j all equal the continuation"},
                {"baseline", mtp(r.mtp_baseline)},
                {"candidate", mtp(r.mtp_candidate)},
                {"difference", diff}};
  } else {
    j["mtp"] = nullptr;
  }
  j["activations"] = {{"baseline", r.baseline_activations},
                      {"candidate", r.candidate_activations},
                      {"baseline_declared_linears", r.baseline_declared_linears},
                      {"candidate_declared_linears", r.candidate_declared_linears}};
  return j;
}

}  // namespace latent
