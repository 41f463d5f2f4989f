// latent fidelity [--model DIR] [--baseline RULE …] [--candidate RULE …] [--quantize RULE …] [--max-quant-error E]
//                [--allow-lossy] [--prompts FILE] [--chat] [--max-tokens N] [--mtp-drafts K] [--json]
//                [--plot FILE.png]
// Compares two precision plans of one checkpoint layer by layer (src/fidelity). Without --candidate: the founding
// comparison, *.kv_b_proj=mxfp4 against the checkpoint as stored. With an MTP layer in the checkpoint, also each
// plan's MTP draft acceptance per draft position (K positions, default 3).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>

#include "cli/commands.h"
#include "cli/model_flags.h"
#include "core/error.h"
#include "fidelity/fidelity.h"
#include "fidelity/png_plot.h"
#include "format/hf_config.h"
#include "jinja/chat_template.h"
#include "loader/precision_plan.h"
#include "model/generate.h"
#include "tokenizer/tokenizer.h"

namespace latent::cli {

namespace {

struct Prompts {
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::string> labels;
};

const char* kDefaultPrompts[] = {
    "What is the capital of France?",
    "Explain in one sentence why the sky is blue.",
    "List three prime numbers and add them up.",
    "Translate 'good morning' into German and Spanish.",
};

// Lines of FILE: "ids: 1 2 3" (token ids) or text (tokenized with the model's tokenizer.json; with `chat`, first
// rendered as one user message through the model's chat template with the generation prompt, as a server request
// would be). Blank lines and lines starting with '#' are skipped. Without a file: built-in text prompts when the
// model has a tokenizer, else four random 24-token prompts (seed 0).
Prompts load_prompts(const std::string& file, const std::string& model_dir, const ModelConfig& cfg, bool chat) {
  Prompts p;
  std::optional<ChatTemplate> tmpl;
  if (chat) tmpl = ChatTemplate::load(model_dir);
  std::unique_ptr<Tokenizer> tok;
  const std::string tj = model_dir + "/tokenizer.json";
  auto tokenizer = [&]() -> Tokenizer& {
    if (!tok) {
      if (!std::filesystem::exists(tj))
        fail("{}: a text prompt needs a tokenizer, and the model has no tokenizer.json (use 'ids: …' lines)", file);
      tok = std::make_unique<Tokenizer>(Tokenizer::from_file(tj));
    }
    return *tok;
  };
  auto add_text = [&](const std::string& text) {
    if (tmpl) {
      const nlohmann::json msgs = nlohmann::json::array({{{"role", "user"}, {"content", text}}});
      p.ids.push_back(tokenizer().encode(tmpl->render(msgs, nullptr, true), false));
    } else {
      p.ids.push_back(tokenizer().encode(text, true));
    }
    p.labels.push_back(text);
  };
  if (!file.empty()) {
    std::ifstream in(file);
    if (!in) fail("{}: cannot open the prompts file", file);
    std::string line;
    int64_t n = 0;
    while (std::getline(in, line)) {
      ++n;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty() || line[0] == '#') continue;
      if (line.rfind("ids:", 0) == 0) {
        try {
          p.ids.push_back(parse_token_ids(line.substr(4)));
        } catch (const Error& e) {
          fail("{}:{}: {}", file, n, e.what());
        }
        p.labels.push_back(line);
      } else {
        add_text(line);
      }
    }
    if (p.ids.empty()) fail("{}: no prompts in the file", file);
    return p;
  }
  if (std::filesystem::exists(tj)) {
    for (const char* t : kDefaultPrompts) add_text(t);
    return p;
  }
  std::mt19937 rng(0);
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> ids;
    for (int t = 0; t < 24; ++t) ids.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(cfg.vocab_size)));
    p.ids.push_back(ids);
    p.labels.push_back(fmt::format("random ids #{} (seed 0)", i));
  }
  return p;
}

// A side's rules: PATTERN=FORMAT (repeatable), or the single word "none" for the checkpoint as stored.
std::vector<QuantizeRule> parse_rules(const std::vector<std::string>& v, const char* flag) {
  std::vector<QuantizeRule> r;
  for (const auto& s : v) {
    if (s == "none") {
      if (v.size() != 1) fail("{} none (the checkpoint as stored) cannot be combined with other rules", flag);
      return r;
    }
    r.push_back(QuantizeRule::parse(s));
  }
  return r;
}

// The founding experiment (docs/fidelity.md): GLM-5's bf16 kv_b_proj re-quantized to MXFP4.
constexpr const char* kFoundingCandidate = "*.kv_b_proj=mxfp4";

std::string model_name(const std::string& dir) {
  std::filesystem::path p(dir);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();
  const std::string n = p.filename().string();
  return n.empty() ? dir : n;
}

// "x.png" -> "x.json", anything else -> "<path>.json".
std::string sidecar_path(const std::string& png) {
  const std::string ext = ".png";
  if (png.size() > ext.size() && png.compare(png.size() - ext.size(), ext.size(), ext) == 0)
    return png.substr(0, png.size() - ext.size()) + ".json";
  return png + ".json";
}

}  // namespace

void register_fidelity(CLI::App& app) {
  struct Opts {
    ModelFlags model;
    std::string prompts, plot, plot_scale = "linear";
    std::vector<std::string> baseline, candidate;
    std::string baseline_activations, candidate_activations;
    int64_t max_tokens = 32;
    int64_t mtp_drafts = -1;  // -1: the default (3 when the checkpoint has an MTP layer, else 0)
    bool json = false, chat = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("fidelity", "Compare two precision plans of a model layer by layer");
  o->model.add_to(cmd);
  cmd->add_option("--baseline", o->baseline,
                  "Rule PATTERN=FORMAT of the baseline plan (repeatable; default and 'none': as stored)");
  cmd->add_option("--candidate", o->candidate,
                  std::string("Rule PATTERN=FORMAT of the candidate plan (repeatable; 'none': as stored; default: the "
                              "founding comparison ") +
                      kFoundingCandidate + ")");
  cmd->add_option("--baseline-activations", o->baseline_activations,
                  "Activations of the baseline plan: fp32 (default), bf16, or declared (the linears whose checkpoint "
                  "declares dynamic FP8 activations quantize their input as declared; fp32 elsewhere)");
  cmd->add_option("--candidate-activations", o->candidate_activations,
                  "Activations of the candidate plan: fp32 (default), bf16 or declared (see --baseline-activations); "
                  "with declared and no --candidate the candidate is the checkpoint as stored");
  cmd->add_option("--prompts", o->prompts, "File: one prompt per line, text or 'ids: 1 2 3'");
  cmd->add_flag("--chat", o->chat, "Render each text prompt as a user message through the chat template");
  cmd->add_option("--max-tokens", o->max_tokens, "Greedy continuation length (default 32)");
  cmd->add_option("--mtp-drafts", o->mtp_drafts,
                  "Draft positions of the MTP acceptance, measured when the checkpoint has an MTP layer (default 3; "
                  "0 = off)");
  cmd->add_flag("--json", o->json, "Print every number as JSON (the comparison line goes to stderr)");
  cmd->add_option("--plot", o->plot, "Write a per-layer error chart (PNG) and its data beside it (F.json)");
  cmd->add_option("--plot-scale", o->plot_scale, "y axis of the chart: linear (default) or symlog");
  cmd->footer(
      "--quantize, --max-quant-error and --allow-lossy mean what they mean for every command that loads weights: "
      "--quantize transforms are applied at load (here to both plans) and refused above --max-quant-error unless "
      "--allow-lossy. --baseline / --candidate rules are what is compared; they are measured on purpose, so the guard "
      "does not refuse them, and the report flags the tensors over --max-quant-error.");
  cmd->callback([o]() {
    const std::string dir = o->model.model_dir();
    if (o->max_tokens < 0) fail("--max-tokens must be >= 0");
    const YScale y_scale = parse_y_scale(o->plot_scale);
    const PlanOptions shared = o->model.plan_options();
    FidelityOptions fo;
    fo.shared = shared.quantize;
    fo.max_quant_error = shared.max_quant_error;
    fo.allow_lossy = shared.allow_lossy;
    fo.baseline = parse_rules(o->baseline, "--baseline");
    for (const auto* a : {&o->baseline_activations, &o->candidate_activations})
      if (!a->empty() && *a != "fp32" && *a != "bf16" && *a != "declared")
        fail("--{}-activations must be fp32, bf16 or declared (got '{}')",
             a == &o->baseline_activations ? "baseline" : "candidate", *a);
    fo.baseline_activations = o->baseline_activations;
    fo.candidate_activations = o->candidate_activations;
    const bool founding = o->candidate.empty() && o->candidate_activations.empty() && o->baseline_activations.empty();
    fo.candidate = founding ? std::vector<QuantizeRule>{QuantizeRule::parse(kFoundingCandidate)}
                            : parse_rules(o->candidate, "--candidate");
    fo.max_tokens = o->max_tokens;
    fo.threads = o->model.threads;
    fo.backend = o->model.backend_name();

    // The first line says what is compared, before the (possibly long) run.
    auto with_act = [](std::string t, const std::string& a) {
      return a.empty() || a == "fp32" ? t : t + " with --activations " + a;
    };
    const std::string base_txt = with_act(rules_text(fo.baseline), fo.baseline_activations),
                      cand_txt = with_act(rules_text(fo.candidate), fo.candidate_activations);
    std::string line = founding ? fmt::format(
                                      "fidelity: the founding comparison (no --candidate given): candidate {} "
                                      "(bf16 kv_b_proj re-quantized to MXFP4, the transform latent was "
                                      "started over) against baseline {}",
                                      cand_txt, base_txt)
                                : fmt::format("fidelity: candidate {} against baseline {}", cand_txt, base_txt);
    if (!fo.shared.empty()) line += fmt::format(", both with --quantize {}", rules_text(fo.shared));
    if (base_txt == cand_txt)
      line += "; the two plans are the same, so every difference must be 0 (a determinism check)";
    if (founding) line += "; --candidate RULE measures another plan";
    std::fprintf(o->json ? stderr : stdout, "%s\n", line.c_str());
    std::fflush(o->json ? stderr : stdout);

    const ModelConfig cfg = load_model_config(dir);
    if (o->mtp_drafts < -1 || o->mtp_drafts > 16) fail("--mtp-drafts must be in [0, 16] (got {})", o->mtp_drafts);
    if (o->mtp_drafts > 0 && cfg.num_nextn_predict_layers < 1)
      fail("--mtp-drafts {}: the checkpoint has no MTP layer (config.json num_nextn_predict_layers {})", o->mtp_drafts,
           cfg.num_nextn_predict_layers);
    fo.mtp_drafts = cfg.num_nextn_predict_layers < 1 ? 0 : o->mtp_drafts < 0 ? 3 : o->mtp_drafts;
    Prompts pr = load_prompts(o->prompts, dir, cfg, o->chat);
    fo.stop_ids = cfg.eos_token_ids;
    const FidelityReport rep = run_fidelity(dir, pr.ids, pr.labels, fo);
    if (o->json) {
      nlohmann::json j = fidelity_json(rep);
      j["comparison"] = {{"line", line},
                         {"founding_default", founding},
                         {"baseline", base_txt},
                         {"candidate", cand_txt},
                         {"quantize", rules_text(fo.shared)}};
      std::printf("%s\n", j.dump(1).c_str());
    } else {
      std::printf("\n%s", fidelity_table(rep).c_str());
    }
    if (!o->plot.empty()) {
      std::vector<ChartSeries> s;
      std::vector<ChartBand> bands;
      const size_t n = rep.prompts.size();
      if (n <= 8) {
        for (const auto& p : rep.prompts) s.push_back({p.label, p.layer_rel_error, false});
        if (n > 1) s.push_back({fmt::format("mean over the {} prompts", n), rep.mean_layer_rel_error, true});
      } else {  // too many lines to tell apart: the spread and the mean
        ChartBand b{fmt::format("min..max over the {} prompts", n), rep.mean_layer_rel_error, rep.mean_layer_rel_error};
        for (const auto& p : rep.prompts)
          for (size_t l = 0; l < p.layer_rel_error.size() && l < b.lo.size(); ++l) {
            b.lo[l] = std::min(b.lo[l], p.layer_rel_error[l]);
            b.hi[l] = std::max(b.hi[l], p.layer_rel_error[l]);
          }
        bands.push_back(std::move(b));
        s.push_back({fmt::format("mean over the {} prompts", n), rep.mean_layer_rel_error, true});
      }
      ChartOptions co;
      co.title = fmt::format("{} ({}): residual-stream error per layer", model_name(dir), arch_name(cfg.arch));
      co.subtitle = fmt::format(
          "candidate: {}   vs   baseline: {}{}", cand_txt, base_txt,
          fo.shared.empty() ? std::string() : fmt::format("   (both with --quantize {})", rules_text(fo.shared)));
      co.x_label = "residual stream after: emb = the embeddings, 1..L-1 = decoder layer, final = the final norm";
      co.y_label = "relative error ||h_candidate - h_baseline|| / ||h_baseline||";
      co.y_scale = y_scale;
      const size_t L1 = rep.mean_layer_rel_error.size();
      for (size_t l = 0; l < L1; ++l)
        co.x_tick_labels.push_back(l == 0 ? "emb" : l + 1 == L1 ? "final" : std::to_string(l));
      const ChartLayout layout = write_line_chart_png(o->plot, s, co, bands);
      nlohmann::json dump = chart_layout_json(layout);
      dump["model"] = rep.model_dir;
      dump["baseline"] = base_txt;
      dump["candidate"] = cand_txt;
      dump["quantize"] = rules_text(fo.shared);
      const std::string side = sidecar_path(o->plot);
      std::ofstream out(side);
      out << dump.dump(1) << "\n";
      if (!out) fail("{}: cannot write the chart data", side);
      std::fprintf(stderr, "latent: wrote %s and %s\n", o->plot.c_str(), side.c_str());
    }
  });
}

}  // namespace latent::cli
