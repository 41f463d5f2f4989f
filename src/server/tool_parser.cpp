#include "server/tool_parser.h"

#include "core/log.h"

namespace latent::server {

using ojson = nlohmann::ordered_json;

const char* tool_format_name(ToolFormat f) {
  switch (f) {
    case ToolFormat::None: return "none";
    case ToolFormat::Glm47: return "glm47";
    case ToolFormat::DeepSeek: return "deepseek";
  }
  return "?";
}

size_t partial_suffix(std::string_view text, std::string_view marker) {
  const size_t lim = std::min(text.size(), marker.size() - 1);
  for (size_t len = lim; len > 0; --len)
    if (text.compare(text.size() - len, len, marker.substr(0, len)) == 0) return len;
  return 0;
}

std::string py_json_dumps(const ojson& v) {
  if (v.is_object()) {
    std::string s = "{";
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first) s += ", ";
      first = false;
      s += ojson(it.key()).dump(-1, ' ', false, ojson::error_handler_t::replace);
      s += ": ";
      s += py_json_dumps(*it);
    }
    return s + "}";
  }
  if (v.is_array()) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) s += ", ";
      s += py_json_dumps(v[i]);
    }
    return s + "]";
  }
  return v.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

namespace {

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}

// Block parser: text outside open...close is content; a complete block becomes calls (or raw text if malformed).
class MarkupParser : public ToolParser {
 public:
  MarkupParser(std::string open, std::string close) : open_(std::move(open)), close_(std::move(close)) {}

  void feed(std::string_view text, Out& out) override {
    buf_.append(text);
    while (true) {
      if (!in_block_) {
        const size_t p = buf_.find(open_);
        if (p == std::string::npos) {
          const size_t hold = partial_suffix(buf_, open_);
          out.content.append(buf_, 0, buf_.size() - hold);
          buf_.erase(0, buf_.size() - hold);
          return;
        }
        out.content.append(buf_, 0, p);
        buf_.erase(0, p + open_.size());
        in_block_ = true;
      } else {
        const size_t p = buf_.find(close_);
        if (p == std::string::npos) return;
        const std::string body = buf_.substr(0, p);
        std::vector<ToolCall> calls;
        if (parse_block(body, calls)) {
          for (auto& c : calls) out.calls.push_back(std::move(c));
        } else {
          log::debug("tool parser: malformed {} block kept as text", open_);
          out.content += open_ + body + close_;
        }
        buf_.erase(0, p + close_.size());
        in_block_ = false;
      }
    }
  }

  void finish(Out& out) override {
    if (in_block_) out.content += open_;
    out.content += buf_;
    buf_.clear();
    in_block_ = false;
  }

 protected:
  virtual bool parse_block(std::string_view body, std::vector<ToolCall>& calls) = 0;

 private:
  std::string open_, close_;
  std::string buf_;
  bool in_block_ = false;
};

class GlmParser : public MarkupParser {
 public:
  explicit GlmParser(const ojson& tools) : MarkupParser("<tool_call>", "</tool_call>"), tools_(tools) {}

 protected:
  bool parse_block(std::string_view body, std::vector<ToolCall>& calls) override {
    static constexpr std::string_view kK = "<arg_key>", kKe = "</arg_key>", kV = "<arg_value>", kVe = "</arg_value>";
    const size_t k = body.find(kK);
    const std::string_view name = trim(body.substr(0, k));
    if (name.empty() || name.find('<') != std::string_view::npos || name.find('\n') != std::string_view::npos)
      return false;
    ojson args = ojson::object();
    size_t pos = k == std::string_view::npos ? body.size() : k;
    while (true) {
      while (pos < body.size() && is_ws(body[pos])) ++pos;
      if (pos >= body.size()) break;
      if (body.compare(pos, kK.size(), kK) != 0) return false;
      pos += kK.size();
      const size_t ke = body.find(kKe, pos);
      if (ke == std::string_view::npos) return false;
      const std::string key(trim(body.substr(pos, ke - pos)));
      pos = ke + kKe.size();
      while (pos < body.size() && is_ws(body[pos])) ++pos;
      if (body.compare(pos, kV.size(), kV) != 0) return false;
      pos += kV.size();
      const size_t ve = body.find(kVe, pos);
      if (ve == std::string_view::npos) return false;
      const std::string value(body.substr(pos, ve - pos));
      pos = ve + kVe.size();
      args[key] = typed_value(std::string(name), key, value);
    }
    if (tools_.is_array() && !known_tool(name))
      log::warn("model called tool '{}', which is not in the request's tools", name);
    calls.push_back({std::string(name), py_json_dumps(args)});
    return true;
  }

 private:
  const ojson* schema_type(const std::string& tool, const std::string& key) const {
    if (!tools_.is_array()) return nullptr;
    for (const auto& t : tools_) {
      const auto& f = t["function"];
      if (!f.is_object() || f.value("name", "") != tool) continue;
      auto p = f.find("parameters");
      if (p == f.end() || !p->is_object()) return nullptr;
      auto props = p->find("properties");
      if (props == p->end() || !props->is_object()) return nullptr;
      auto prop = props->find(key);
      if (prop == props->end() || !prop->is_object()) return nullptr;
      auto ty = prop->find("type");
      return ty == prop->end() ? nullptr : &*ty;
    }
    return nullptr;
  }
  bool known_tool(std::string_view name) const {
    if (!tools_.is_array()) return false;
    for (const auto& t : tools_)
      if (t["function"].value("name", "") == name) return true;
    return false;
  }
  ojson typed_value(const std::string& tool, const std::string& key, const std::string& v) const {
    if (const ojson* ty = schema_type(tool, key)) {
      bool is_string = ty->is_string() && *ty == "string";
      if (ty->is_array()) {
        bool only_string = false, other = false;
        for (const auto& e : *ty) {
          if (e == "string")
            only_string = true;
          else if (e != "null")
            other = true;
        }
        is_string = only_string && !other;
      }
      if (is_string) return v;
    }
    try {
      return ojson::parse(v);
    } catch (const nlohmann::json::exception&) {
      return v;
    }
  }
  ojson tools_;
};

class DeepSeekParser : public MarkupParser {
 public:
  DeepSeekParser() : MarkupParser("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>") {}

 protected:
  bool parse_block(std::string_view body, std::vector<ToolCall>& calls) override {
    static constexpr std::string_view kB = "<｜tool▁call▁begin｜>", kE = "<｜tool▁call▁end｜>", kS = "<｜tool▁sep｜>";
    size_t pos = 0;
    std::vector<ToolCall> found;
    while (true) {
      while (pos < body.size() && is_ws(body[pos])) ++pos;
      if (pos >= body.size()) break;
      if (body.compare(pos, kB.size(), kB) != 0) return false;
      pos += kB.size();
      const size_t e = body.find(kE, pos);
      if (e == std::string_view::npos) return false;
      const std::string_view call = body.substr(pos, e - pos);
      pos = e + kE.size();
      const size_t s = call.find(kS);
      if (s == std::string_view::npos) return false;
      std::string_view a = trim(call.substr(0, s)), b = call.substr(s + kS.size());
      std::string_view name, args;
      const size_t fence = b.find("```json");
      if (a == "function" && fence != std::string_view::npos) {  // V3 / R1
        name = trim(b.substr(0, fence));
        std::string_view rest = b.substr(fence + 7);
        const size_t close = rest.rfind("```");
        if (close == std::string_view::npos) return false;
        args = trim(rest.substr(0, close));
      } else {  // V3.1
        name = a;
        args = trim(b);
      }
      if (name.empty()) return false;
      ojson parsed;
      try {
        parsed = args.empty() ? ojson::object() : ojson::parse(args);
      } catch (const nlohmann::json::exception&) {
        return false;
      }
      if (!parsed.is_object()) return false;
      found.push_back({std::string(name), py_json_dumps(parsed)});
    }
    if (found.empty()) return false;
    for (auto& c : found) calls.push_back(std::move(c));
    return true;
  }
};

class NoParser : public ToolParser {
 public:
  void feed(std::string_view text, Out& out) override { out.content.append(text); }
  void finish(Out&) override {}
};

}  // namespace

std::unique_ptr<ToolParser> make_tool_parser(ToolFormat f, const ojson& tools) {
  switch (f) {
    case ToolFormat::Glm47: return std::make_unique<GlmParser>(tools);
    case ToolFormat::DeepSeek: return std::make_unique<DeepSeekParser>();
    case ToolFormat::None: break;
  }
  return std::make_unique<NoParser>();
}

}  // namespace latent::server
