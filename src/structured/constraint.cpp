#include "structured/constraint.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "structured/compilers.h"

namespace latent::structured {

using ojson = nlohmann::ordered_json;

GrammarConstraint::GrammarConstraint(std::shared_ptr<const CompiledGrammar> g, int32_t start_after)
    : m_(std::move(g)), start_after_(start_after), active_(start_after < 0), words_(m_.vocab().mask_words()) {}

bool GrammarConstraint::fill_words() {
  if (!active_) return false;
  m_.fill_mask(words_.data());
  bool any = false;
  for (size_t w = 0; w < words_.size(); ++w) any = any || words_[w] != 0;
  if (!any)  // nothing can continue (cannot happen for a matcher that accepted its tokens): let the choice end
    for (int32_t id : m_.vocab().stop_ids())
      if (id >= 0 && static_cast<size_t>(id) < m_.vocab().size())
        words_[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
  return true;
}

bool GrammarConstraint::allowed_bits(std::span<uint32_t> words, int64_t vocab) {
  if (!fill_words()) return false;
  // Ids past the matcher's vocabulary stay 0 (mask() sets them to -inf).
  const size_t V = std::min(static_cast<size_t>(vocab), m_.vocab().size());
  for (size_t w = 0; w * 32 < V; ++w) {
    uint32_t bits = static_cast<uint32_t>(words_[w >> 1] >> (32 * (w & 1)));
    const size_t end = w * 32 + 32;
    if (end > V) bits &= (1u << (V - w * 32)) - 1u;
    words[w] = bits;
  }
  return true;
}

void GrammarConstraint::mask(std::span<float> logits) {
  if (!fill_words()) return;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const size_t V = std::min(logits.size(), m_.vocab().size());
  for (size_t w = 0; w * 64 < V; ++w) {
    const uint64_t bits = words_[w];
    if (bits == ~uint64_t{0}) continue;
    const size_t end = std::min(V, w * 64 + 64);
    if (bits == 0) {
      std::fill(logits.begin() + static_cast<std::ptrdiff_t>(w * 64), logits.begin() + static_cast<std::ptrdiff_t>(end),
                kNegInf);
      continue;
    }
    for (size_t i = w * 64; i < end; ++i)
      if (!((bits >> (i & 63)) & 1u)) logits[i] = kNegInf;
  }
  for (size_t i = V; i < logits.size(); ++i) logits[i] = kNegInf;
}

void GrammarConstraint::accept(int32_t token) {
  if (!active_) {
    if (token == start_after_) active_ = true;
    return;
  }
  m_.accept_token(token);
}

bool GrammarConstraint::finished() const { return active_ && m_.is_complete(); }

LogitConstraintFactory constraint_factory(std::shared_ptr<const CompiledGrammar> g, int32_t start_after) {
  return [g = std::move(g), start_after](int) -> std::unique_ptr<LogitConstraint> {
    return std::make_unique<GrammarConstraint>(g, start_after);
  };
}

namespace {

// The GLM parser's rule (server/tool_parser.cpp): a property whose type is "string" (or only "string" besides
// "null") keeps its raw text; anything else is read as JSON.
bool glm_raw_string(const ojson& prop) {
  if (!prop.is_object()) return false;
  auto ty = prop.find("type");
  if (ty == prop.end()) return false;
  if (ty->is_string()) return *ty == "string";
  if (!ty->is_array()) return false;
  bool str = false, other = false;
  for (const auto& e : *ty) {
    if (e == "string")
      str = true;
    else if (e != "null")
      other = true;
  }
  return str && !other;
}

}  // namespace

std::shared_ptr<const Grammar> tool_call_grammar(ToolSyntax syntax, const ojson& tools, const std::string& only,
                                                 bool parallel) {
  if (!tools.is_array() || tools.empty()) throw GrammarError("no tools to call");
  GrammarBuilder b;
  const int32_t root = b.declare("root");
  std::vector<ExprId> calls;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& f = tools[i]["function"];
    const std::string name = f.value("name", "");
    if (!only.empty() && name != only) continue;
    const std::string where = fmt::format("tools[{}].function.parameters", i);
    static const ojson kEmpty = ojson::object();
    const ojson& params = f.contains("parameters") && f["parameters"].is_object() ? f["parameters"] : kEmpty;
    JsonSchemaCompiler c(b, params, fmt::format("t{}_", i));
    ExprId args;
    try {
      if (syntax == ToolSyntax::Glm) {
        if (params.contains("type") && params["type"] != "object")
          throw GrammarError(fmt::format("the parameters of tool '{}' must be an object schema", name));
        for (auto it = params.begin(); it != params.end(); ++it) {
          static const std::vector<std::string> kOk = {"type",    "properties",  "required", "additionalProperties",
                                                       "title",   "description", "$defs",    "definitions",
                                                       "$schema", "strict"};
          if (std::find(kOk.begin(), kOk.end(), it.key()) == kOk.end())
            throw GrammarError(fmt::format("unsupported JSON Schema keyword '{}' at {}", it.key(), where), it.key());
        }
        std::vector<std::string> required;
        if (auto r = params.find("required"); r != params.end() && r->is_array())
          for (const auto& x : *r)
            if (x.is_string()) required.push_back(x.get<std::string>());
        std::vector<ExprId> parts;
        if (auto p = params.find("properties"); p != params.end() && p->is_object()) {
          for (auto it = p->begin(); it != p->end(); ++it) {
            const std::string pw = where + "/properties/" + it.key();
            const ExprId v = glm_raw_string(*it) ? c.raw_string(*it, pw) : c.value(*it, pw);
            const ExprId kv =
                b.seq({b.opt(b.byte('\n')), b.literal("<arg_key>"), b.literal(it.key()), b.literal("</arg_key>"),
                       b.opt(b.byte('\n')), b.literal("<arg_value>"), v, b.literal("</arg_value>")});
            const bool req = std::find(required.begin(), required.end(), it.key()) != required.end();
            parts.push_back(req ? kv : b.opt(kv));
          }
        }
        args = b.seq(std::move(parts));
      } else {
        args = c.value(params.empty() ? ojson{{"type", "object"}} : params, where);
      }
    } catch (const GrammarError& e) {
      throw GrammarError(fmt::format("tool '{}': {}", name, e.what()), e.keyword());
    }
    switch (syntax) {
      case ToolSyntax::Glm:
        calls.push_back(
            b.seq({b.literal("<tool_call>"), b.literal(name), args, b.opt(b.byte('\n')), b.literal("</tool_call>")}));
        break;
      case ToolSyntax::DeepSeekV3:
        calls.push_back(b.seq({b.literal("<｜tool▁call▁begin｜>function<｜tool▁sep｜>"), b.literal(name),
                               b.literal("\n```json\n"), args, b.literal("\n```<｜tool▁call▁end｜>")}));
        break;
      case ToolSyntax::DeepSeekV31:
        calls.push_back(b.seq({b.literal("<｜tool▁call▁begin｜>"), b.literal(name), b.literal("<｜tool▁sep｜>"), args,
                               b.literal("<｜tool▁call▁end｜>")}));
        break;
    }
  }
  if (calls.empty()) throw GrammarError(fmt::format("tool '{}' is not in 'tools'", only));
  const int32_t call = b.declare("call");
  b.define(call, b.alt(std::move(calls)));
  const ExprId sep = syntax == ToolSyntax::Glm ? b.opt(b.byte('\n')) : b.byte('\n');
  const ExprId list = parallel ? b.seq({b.ref(call), b.star(b.seq({sep, b.ref(call)}))}) : b.ref(call);
  if (syntax == ToolSyntax::Glm)
    b.define(root, list);
  else
    b.define(root, b.seq({b.literal("<｜tool▁calls▁begin｜>"), list, b.literal("<｜tool▁calls▁end｜>")}));
  return compile(b, root);
}

}  // namespace latent::structured
