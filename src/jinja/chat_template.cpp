#include "jinja/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace latent {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

const char* tool_argument_style_name(ToolArgumentStyle s) {
  switch (s) {
    case ToolArgumentStyle::AsGiven: return "as-given";
    case ToolArgumentStyle::Object: return "object";
    case ToolArgumentStyle::String: return "string";
  }
  return "?";
}

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) fail("{}: cannot open", p.string());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Special-token strings as transformers' special_tokens_map exposes them to templates.
ojson special_tokens_from(const ojson& cfg) {
  ojson out = ojson::object();
  static const char* kNames[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                 "pad_token", "cls_token", "mask_token"};
  auto text = [](const ojson& v) -> std::optional<std::string> {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
    return std::nullopt;
  };
  for (const char* n : kNames) {
    if (!cfg.contains(n)) continue;
    if (auto s = text(cfg[n])) out[n] = *s;
  }
  if (cfg.contains("additional_special_tokens") && cfg["additional_special_tokens"].is_array()) {
    ojson list = ojson::array();
    for (auto& t : cfg["additional_special_tokens"])
      if (auto s = text(t)) list.push_back(*s);
    out["additional_special_tokens"] = list;
  }
  return out;
}

constexpr const char* kNeedle = "probe-value-7f3e";

ojson probe_messages(bool object_args) {
  ojson args = ojson::object();
  args["argument_needle"] = kNeedle;
  ojson call = ojson::object();
  call["id"] = "call_probe";
  call["type"] = "function";
  call["function"] = ojson::object();
  call["function"]["name"] = "probe_tool";
  call["function"]["arguments"] = object_args ? args : ojson(args.dump());
  ojson msgs = ojson::array();
  msgs.push_back({{"role", "user"}, {"content", "probe"}});
  ojson asst = ojson::object();
  asst["role"] = "assistant";
  asst["content"] = "";
  asst["tool_calls"] = ojson::array({call});
  msgs.push_back(asst);
  return msgs;
}

}  // namespace

ChatTemplate ChatTemplate::load(const std::string& model_dir) {
  const fs::path dir(model_dir);
  ChatTemplate ct;
  const fs::path cfg_path = dir / "tokenizer_config.json";
  ojson cfg = ojson::object();
  if (fs::exists(cfg_path)) {
    try {
      cfg = ojson::parse(read_file(cfg_path));
    } catch (const nlohmann::json::exception& e) {
      fail("{}: invalid JSON: {}", cfg_path.string(), e.what());
    }
    if (!cfg.is_object()) fail("{}: expected a JSON object", cfg_path.string());
    ct.special_ = special_tokens_from(cfg);
  }
  const fs::path jinja_path = dir / "chat_template.jinja";
  if (fs::exists(jinja_path)) {
    ct.source_ = read_file(jinja_path);
    ct.tmpl_ = std::make_shared<jinja::Template>(ct.source_, jinja_path.string());
    ct.init(jinja_path.string());
    return ct;
  }
  if (cfg.contains("chat_template") && !cfg["chat_template"].is_null()) {
    const ojson& t = cfg["chat_template"];
    const std::string origin = cfg_path.string() + " chat_template";
    if (t.is_string()) {
      ct.source_ = t.get<std::string>();
      ct.tmpl_ = std::make_shared<jinja::Template>(ct.source_, origin);
    } else if (t.is_array()) {
      for (auto& e : t) {
        if (!e.is_object() || !e.contains("name") || !e.contains("template") || !e["template"].is_string()) {
          fail("{}: chat_template list entries must be {{\"name\", \"template\"}}", cfg_path.string());
        }
        const std::string name = e["name"].is_string() ? e["name"].get<std::string>() : "";
        if (name == "default") {
          ct.source_ = e["template"].get<std::string>();
          ct.tmpl_ = std::make_shared<jinja::Template>(ct.source_, origin + "[default]");
        } else if (name == "tool_use") {
          ct.tool_use_ = std::make_shared<jinja::Template>(e["template"].get<std::string>(), origin + "[tool_use]");
        }
      }
      if (!ct.tmpl_) fail("{}: chat_template list has no \"default\" template", cfg_path.string());
    } else {
      fail("{}: chat_template must be a string or a list of {{name, template}}", cfg_path.string());
    }
    ct.init(origin);
    return ct;
  }
  fail("{}: model has no chat template (no chat_template.jinja and no chat_template in tokenizer_config.json)",
       model_dir);
}

ChatTemplate ChatTemplate::from_string(const std::string& source, const ojson& special_tokens,
                                       const std::string& origin) {
  ChatTemplate ct;
  ct.source_ = source;
  if (special_tokens.is_object()) ct.special_ = special_tokens;
  ct.tmpl_ = std::make_shared<jinja::Template>(source, origin);
  ct.init(origin);
  return ct;
}

void ChatTemplate::init(const std::string& origin) {
  origin_ = origin;
  // Probe which shape of tool-call arguments the template renders (see ToolArgumentStyle).
  ChatRenderOptions opt;
  opt.normalize_tool_arguments = false;
  opt.render.limits.max_steps = 100000;
  opt.render.now = [] {
    std::tm tm{};
    tm.tm_year = 124;
    tm.tm_mday = 1;
    return tm;
  };
  auto try_render = [&](bool object_args) -> std::optional<std::string> {
    try {
      return render(probe_messages(object_args), ojson(), false, ojson::object(), opt);
    } catch (const Error&) {
      return std::nullopt;
    }
  };
  const auto a = try_render(true);
  const auto b = try_render(false);
  const std::string pyrepr = std::string("{'argument_needle': '") + kNeedle + "'}";
  const bool obj_ok = a && a->find(kNeedle) != std::string::npos && a->find(pyrepr) == std::string::npos;
  const bool str_ok = b && b->find(kNeedle) != std::string::npos;
  style_ = obj_ok ? ToolArgumentStyle::Object : str_ok ? ToolArgumentStyle::String : ToolArgumentStyle::AsGiven;
}

const jinja::Template& ChatTemplate::pick(bool has_tools) const {
  if (has_tools && tool_use_) return *tool_use_;
  return *tmpl_;
}

std::string ChatTemplate::render(const ojson& messages_in, const ojson& tools, bool add_generation_prompt,
                                 const ojson& kwargs, const ChatRenderOptions& opt) const {
  if (!messages_in.is_array()) fail("chat template: messages must be a JSON array");
  if (!tools.is_null() && !tools.is_array()) fail("chat template: tools must be a JSON array or null");
  if (!kwargs.is_null() && !kwargs.is_object()) fail("chat template: template kwargs must be a JSON object");

  const ojson* messages = &messages_in;
  ojson normalized;
  auto needs_conversion = [&] {
    for (auto& m : messages_in) {
      if (!m.is_object() || !m.contains("tool_calls") || !m["tool_calls"].is_array()) continue;
      for (auto& tc : m["tool_calls"]) {
        if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object()) continue;
        const auto& fn = tc["function"];
        if (!fn.contains("arguments")) continue;
        if (fn["arguments"].is_string() == (style_ == ToolArgumentStyle::Object)) return true;
      }
    }
    return false;
  };
  if (opt.normalize_tool_arguments && style_ != ToolArgumentStyle::AsGiven && needs_conversion()) {
    normalized = messages_in;
    for (auto& m : normalized) {
      if (!m.is_object() || !m.contains("tool_calls") || !m["tool_calls"].is_array()) continue;
      for (auto& tc : m["tool_calls"]) {
        if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object()) continue;
        auto& fn = tc["function"];
        if (!fn.contains("arguments")) continue;
        auto& args = fn["arguments"];
        if (style_ == ToolArgumentStyle::Object && args.is_string()) {
          try {
            ojson parsed = ojson::parse(args.get<std::string>());
            if (parsed.is_object()) args = std::move(parsed);
          } catch (const nlohmann::json::exception&) {
            // not JSON: leave the string; the template decides (GLM raises)
          }
        } else if (style_ == ToolArgumentStyle::String && !args.is_string()) {
          args = jinja::to_json(jinja::from_json(args));
        }
      }
    }
    messages = &normalized;
  }

  jinja::DictData ctx;
  for (auto it = special_.begin(); it != special_.end(); ++it) ctx.set(it.key(), jinja::from_json(it.value()));
  if (kwargs.is_object()) {
    for (auto it = kwargs.begin(); it != kwargs.end(); ++it) {
      const std::string& k = it.key();
      if (k == "messages" || k == "tools" || k == "documents" || k == "add_generation_prompt")
        fail("chat template: template kwarg '{}' is reserved", k);
      ctx.set(k, jinja::from_json(it.value()));
    }
  }
  ctx.set("messages", jinja::from_json(*messages));
  ctx.set("tools", tools.is_null() ? jinja::Value::none() : jinja::from_json(tools));
  ctx.set("documents", jinja::Value::none());
  ctx.set("add_generation_prompt", jinja::Value(add_generation_prompt));
  return pick(!tools.is_null()).render(jinja::Value::dict(std::move(ctx)), opt.render);
}

std::string ChatTemplate::render(const nlohmann::json& messages, const nlohmann::json& tools,
                                 bool add_generation_prompt, const nlohmann::json& kwargs,
                                 const ChatRenderOptions& opt) const {
  auto conv = [](const nlohmann::json& j) { return j.is_null() ? ojson() : ojson::parse(j.dump()); };
  return render(conv(messages), conv(tools), add_generation_prompt, conv(kwargs), opt);
}

}  // namespace latent
