// latent fidelity --model DIR [--baseline RULE …] --candidate RULE … [--prompts FILE] [--chat] [--max-tokens N]
//                [--json] [--plot FILE.png]
// Compares two precision plans of one checkpoint layer by layer (src/fidelity).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>

#include "cli/commands.h"
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

std::vector<QuantizeRule> parse_rules(const std::vector<std::string>& v) {
  std::vector<QuantizeRule> r;
  for (const auto& s : v) r.push_back(QuantizeRule::parse(s));
  return r;
}

}  // namespace

void register_fidelity(CLI::App& app) {
  struct Opts {
    std::string model, prompts, plot;
    std::vector<std::string> baseline, candidate;
    int64_t max_tokens = 32;
    int threads = 0;
    bool json = false, chat = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("fidelity", "Compare two precision plans of a model layer by layer");
  cmd->add_option("--model", o->model, "Hugging Face model directory (default: the bundled model)");
  cmd->add_option("--baseline", o->baseline, "Quantize rule PATTERN=FORMAT of the baseline (repeatable; none = as stored)");
  cmd->add_option("--candidate", o->candidate, "Quantize rule PATTERN=FORMAT of the candidate (repeatable; none = as stored)");
  cmd->add_option("--quantize", o->candidate, "Alias of --candidate");
  cmd->add_option("--prompts", o->prompts, "File: one prompt per line, text or 'ids: 1 2 3'");
  cmd->add_flag("--chat", o->chat, "Render each text prompt as a user message through the chat template");
  cmd->add_option("--max-tokens", o->max_tokens, "Greedy continuation length (default 32)");
  cmd->add_option("--threads", o->threads, "Worker threads (0 = all cores)");
  cmd->add_flag("--json", o->json, "Print every number as JSON");
  cmd->add_option("--plot", o->plot, "Write a per-layer error chart (PNG)");
  cmd->callback([o]() {
    const std::string dir = resolve_model_dir(o->model);
    if (o->max_tokens < 0) fail("--max-tokens must be >= 0");
    const ModelConfig cfg = load_model_config(dir);
    Prompts pr = load_prompts(o->prompts, dir, cfg, o->chat);
    FidelityOptions fo;
    fo.baseline = parse_rules(o->baseline);
    fo.candidate = parse_rules(o->candidate);
    fo.max_tokens = o->max_tokens;
    fo.threads = o->threads;
    fo.stop_ids = cfg.eos_token_ids;
    const FidelityReport rep = run_fidelity(dir, pr.ids, pr.labels, fo);
    if (o->json) std::printf("%s\n", fidelity_json(rep).dump(1).c_str());
    else std::printf("%s", fidelity_table(rep).c_str());
    if (!o->plot.empty()) {
      std::vector<ChartSeries> s;
      for (const auto& p : rep.prompts) s.push_back({p.label, p.layer_rel_error});
      if (rep.prompts.size() > 1) s.push_back({"mean", rep.mean_layer_rel_error});
      ChartOptions co;
      co.title = "residual stream relative error, candidate vs baseline";
      co.x_label = "layer (0 = embeddings, last = final norm)";
      co.y_label = "rel. error";
      write_line_chart_png(o->plot, s, co);
      std::fprintf(stderr, "latent: wrote %s\n", o->plot.c_str());
    }
  });
}

}  // namespace latent::cli
