// JSON Schema -> grammar (compilers.h).
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <set>

#include "structured/compilers.h"

namespace latent::structured {

using ojson = nlohmann::ordered_json;

namespace {

[[noreturn]] void invalid(const std::string& where, const std::string& what) {
  throw GrammarError(fmt::format("invalid JSON Schema at {}: {}", where, what));
}

const std::set<std::string>& handled_keywords() {
  static const std::set<std::string> k = {"type",      "properties", "required",    "additionalProperties",
                                          "items",     "minItems",   "maxItems",    "enum",
                                          "const",     "anyOf",      "oneOf",       "allOf",
                                          "$ref",      "$defs",      "definitions", "pattern",
                                          "minLength", "maxLength"};
  return k;
}

const std::set<std::string>& annotation_keywords() {
  static const std::set<std::string> k = {"title",    "description", "default",  "examples",
                                          "$schema",  "$id",         "$comment", "deprecated",
                                          "readOnly", "writeOnly",   "strict",   "discriminator"};
  return k;
}

int64_t count(const ojson& s, const char* key, const std::string& where) {
  auto it = s.find(key);
  if (it == s.end()) return -1;
  if (!it->is_number_integer() || it->get<int64_t>() < 0)
    invalid(where, fmt::format("'{}' must be a non-negative integer", key));
  if (it->get<int64_t>() > 10000)
    throw GrammarError(fmt::format("'{}' = {} at {} is too large (at most 10000)", key, it->get<int64_t>(), where),
                       key);
  return it->get<int64_t>();
}

std::string compact(const ojson& v) { return v.dump(-1, ' ', false, ojson::error_handler_t::strict); }

}  // namespace

JsonSchemaCompiler::JsonSchemaCompiler(GrammarBuilder& b, const ojson& root, std::string prefix)
    : b_(b), root_(root), prefix_(std::move(prefix)) {}

int32_t JsonSchemaCompiler::new_rule(const std::string& kind) {
  return b_.declare(fmt::format("{}{}{}", prefix_, kind, rule_counter_++));
}

ExprId JsonSchemaCompiler::ws() { return b_.opt(b_.byte(' ')); }

ExprId JsonSchemaCompiler::json_char() {
  ByteSet plain = ByteSet::range(0x20, 0x7F);
  plain = plain & ~ByteSet::of('"') & ~ByteSet::of('\\');
  ByteSet esc;
  for (char c : {'"', '\\', '/', 'b', 'f', 'n', 'r', 't'}) esc.set(static_cast<uint8_t>(c));
  ByteSet hexd = ByteSet::range('0', '9') | ByteSet::range('a', 'f') | ByteSet::range('A', 'F');
  ExprId escape =
      b_.seq({b_.byte('\\'), b_.alt({b_.bytes(esc), b_.seq({b_.byte('u'), b_.repeat(b_.bytes(hexd), 4, 4)})})});
  return b_.alt({b_.bytes(plain), b_.any_non_ascii(), escape});
}

ExprId JsonSchemaCompiler::any_value() {
  if (any_rule_ >= 0) return b_.ref(any_rule_);
  any_rule_ = new_rule("json_value");
  object_any_rule_ = new_rule("json_object");
  array_any_rule_ = new_rule("json_array");
  const ExprId str = typed("string", ojson::object(), "#"), num = typed("number", ojson::object(), "#");
  b_.define(any_rule_, b_.alt({b_.ref(object_any_rule_), b_.ref(array_any_rule_), str, num, b_.literal("true"),
                               b_.literal("false"), b_.literal("null")}));
  const ExprId kv = b_.seq({str, ws(), b_.byte(':'), ws(), b_.ref(any_rule_)});
  const ExprId sep = b_.seq({ws(), b_.byte(','), ws()});
  b_.define(object_any_rule_,
            b_.seq({b_.byte('{'), ws(), b_.opt(b_.seq({kv, b_.star(b_.seq({sep, kv}))})), ws(), b_.byte('}')}));
  const ExprId v = b_.ref(any_rule_);
  b_.define(array_any_rule_,
            b_.seq({b_.byte('['), ws(), b_.opt(b_.seq({v, b_.star(b_.seq({sep, v}))})), ws(), b_.byte(']')}));
  return b_.ref(any_rule_);
}

ExprId JsonSchemaCompiler::resolve_ref(const std::string& ref, const std::string& where) {
  for (auto& [r, id] : refs_)
    if (r == ref) return b_.ref(id);
  if (ref.empty() || ref[0] != '#')
    throw GrammarError(
        fmt::format("$ref '{}' at {}: only references into the same schema ('#...') are supported", ref, where),
        "$ref");
  const ojson* target = &root_;
  if (ref.size() > 1) {
    if (ref[1] != '/') invalid(where, fmt::format("$ref '{}' is not a JSON pointer", ref));
    size_t pos = 2;
    while (pos <= ref.size()) {
      size_t next = ref.find('/', pos);
      if (next == std::string::npos) next = ref.size();
      std::string tok = ref.substr(pos, next - pos);
      std::string dec;
      for (size_t k = 0; k < tok.size(); ++k) {
        if (tok[k] == '~' && k + 1 < tok.size() && (tok[k + 1] == '0' || tok[k + 1] == '1')) {
          dec += tok[k + 1] == '0' ? '~' : '/';
          ++k;
        } else {
          dec += tok[k];
        }
      }
      if (target->is_object() && target->contains(dec)) {
        target = &(*target)[dec];
      } else if (target->is_array() && !dec.empty() && dec.find_first_not_of("0123456789") == std::string::npos &&
                 std::stoul(dec) < target->size()) {
        target = &(*target)[std::stoul(dec)];
      } else {
        invalid(where, fmt::format("$ref '{}' does not resolve", ref));
      }
      pos = next + 1;
    }
  }
  const int32_t r = new_rule("ref");
  refs_.emplace_back(ref, r);
  b_.define(r, value(*target, ref));
  return b_.ref(r);
}

ExprId JsonSchemaCompiler::value(const ojson& s, const std::string& where) {
  if (s.is_boolean()) {
    if (s.get<bool>()) return any_value();
    throw GrammarError(fmt::format("the schema at {} is 'false' and allows no value", where));
  }
  if (!s.is_object()) invalid(where, "a schema must be an object or a boolean");
  if (++depth_ > 64) throw GrammarError(fmt::format("the schema at {} is nested too deeply", where));
  struct Guard {
    int& d;
    ~Guard() { --d; }
  } guard{depth_};
  for (auto it = s.begin(); it != s.end(); ++it)
    if (!handled_keywords().count(it.key()) && !annotation_keywords().count(it.key()))
      throw GrammarError(fmt::format("unsupported JSON Schema keyword '{}' at {}", it.key(), where), it.key());
  if (auto it = s.find("$ref"); it != s.end()) {
    if (!it->is_string()) invalid(where, "'$ref' must be a string");
    return resolve_ref(it->get<std::string>(), where);
  }
  if (auto it = s.find("const"); it != s.end()) return b_.literal(compact(*it));
  if (auto it = s.find("enum"); it != s.end()) {
    if (!it->is_array() || it->empty()) invalid(where, "'enum' must be a non-empty array");
    std::vector<ExprId> alts;
    for (const auto& v : *it) alts.push_back(b_.literal(compact(v)));
    return b_.alt(std::move(alts));
  }
  for (const char* k : {"anyOf", "oneOf"})
    if (auto it = s.find(k); it != s.end()) {
      if (!it->is_array() || it->empty()) invalid(where, fmt::format("'{}' must be a non-empty array", k));
      std::vector<ExprId> alts;
      for (size_t i = 0; i < it->size(); ++i) alts.push_back(value((*it)[i], fmt::format("{}/{}/{}", where, k, i)));
      return b_.alt(std::move(alts));
    }
  if (auto it = s.find("allOf"); it != s.end()) {
    if (!it->is_array() || it->empty()) invalid(where, "'allOf' must be a non-empty array");
    if (it->size() != 1)
      throw GrammarError(fmt::format("'allOf' with more than one schema at {} is not supported", where), "allOf");
    return value((*it)[0], where + "/allOf/0");
  }
  if (auto it = s.find("type"); it != s.end()) {
    static const std::set<std::string> kTypes = {"object", "array", "string", "number", "integer", "boolean", "null"};
    auto check = [&](const ojson& t) {
      if (!t.is_string() || !kTypes.count(t.get<std::string>()))
        invalid(where,
                fmt::format("'type' {} is not one of object, array, string, number, integer, boolean, null", t.dump()));
      return t.get<std::string>();
    };
    if (it->is_array()) {
      if (it->empty()) invalid(where, "'type' must not be an empty array");
      std::vector<ExprId> alts;
      for (const auto& t : *it) alts.push_back(typed(check(t), s, where));
      return b_.alt(std::move(alts));
    }
    return typed(check(*it), s, where);
  }
  for (const char* k : {"properties", "required", "additionalProperties"})
    if (s.contains(k)) return typed("object", s, where);
  for (const char* k : {"items", "minItems", "maxItems"})
    if (s.contains(k)) return typed("array", s, where);
  for (const char* k : {"pattern", "minLength", "maxLength"})
    if (s.contains(k)) return typed("string", s, where);
  return any_value();
}

ExprId JsonSchemaCompiler::typed(const std::string& t, const ojson& s, const std::string& where) {
  if (t == "object") return object(s, where);
  if (t == "array") return array(s, where);
  if (t == "string") return string(s, where);
  if (t == "boolean") return b_.alt({b_.literal("true"), b_.literal("false")});
  if (t == "null") return b_.literal("null");
  ByteSet d19 = ByteSet::range('1', '9'), d09 = ByteSet::range('0', '9');
  const ExprId int_part =
      b_.seq({b_.opt(b_.byte('-')), b_.alt({b_.byte('0'), b_.seq({b_.bytes(d19), b_.repeat(b_.bytes(d09), 0, 15)})})});
  if (t == "integer") {
    if (integer_rule_ < 0) {
      integer_rule_ = new_rule("json_integer");
      b_.define(integer_rule_, int_part);
    }
    return b_.ref(integer_rule_);
  }
  if (number_rule_ < 0) {
    number_rule_ = new_rule("json_number");
    ByteSet e = ByteSet::of('e') | ByteSet::of('E'), pm = ByteSet::of('+') | ByteSet::of('-');
    b_.define(number_rule_,
              b_.seq({int_part, b_.opt(b_.seq({b_.byte('.'), b_.repeat(b_.bytes(d09), 1, 16)})),
                      b_.opt(b_.seq({b_.bytes(e), b_.opt(b_.bytes(pm)), b_.repeat(b_.bytes(d09), 1, 2)}))}));
  }
  return b_.ref(number_rule_);
}

ExprId JsonSchemaCompiler::string(const ojson& s, const std::string& where) {
  const int64_t lo = count(s, "minLength", where), hi = count(s, "maxLength", where);
  if (lo >= 0 && hi >= 0 && hi < lo) invalid(where, "'maxLength' is less than 'minLength'");
  if (auto it = s.find("pattern"); it != s.end()) {
    if (!it->is_string()) invalid(where, "'pattern' must be a string");
    if (lo >= 0 || hi >= 0)
      throw GrammarError(fmt::format("'pattern' together with 'minLength' / 'maxLength' at {} is not supported", where),
                         "pattern");
    ExprId body;
    try {
      body = regex_expr(b_, it->get<std::string>(), /*json_string_body=*/true);
    } catch (const GrammarError& e) {
      invalid(where, fmt::format("'pattern': {}", e.what()));
    }
    return b_.seq({b_.byte('"'), body, b_.byte('"')});
  }
  if (lo < 0 && hi < 0) {
    if (string_rule_ < 0) {
      string_rule_ = new_rule("json_string");
      b_.define(string_rule_, b_.seq({b_.byte('"'), b_.star(json_char()), b_.byte('"')}));
    }
    return b_.ref(string_rule_);
  }
  const int32_t r = new_rule("string");
  b_.define(r, b_.seq({b_.byte('"'),
                       b_.repeat(json_char(), static_cast<int32_t>(std::max<int64_t>(lo, 0)),
                                 hi < 0 ? kUnbounded : static_cast<int32_t>(hi)),
                       b_.byte('"')}));
  return b_.ref(r);
}

ExprId JsonSchemaCompiler::raw_string(const ojson& s, const std::string& where) {
  if (s.is_object()) {
    if (auto it = s.find("enum"); it != s.end() && it->is_array() && !it->empty()) {
      std::vector<ExprId> alts;
      for (const auto& v : *it) alts.push_back(b_.literal(v.is_string() ? v.get<std::string>() : compact(v)));
      return b_.alt(std::move(alts));
    }
    if (auto it = s.find("const"); it != s.end())
      return b_.literal(it->is_string() ? it->get<std::string>() : compact(*it));
    if (auto it = s.find("pattern"); it != s.end() && it->is_string()) {
      try {
        return regex_expr(b_, it->get<std::string>(), false);
      } catch (const GrammarError& e) {
        invalid(where, fmt::format("'pattern': {}", e.what()));
      }
    }
  }
  const int64_t lo = s.is_object() ? count(s, "minLength", where) : -1,
                hi = s.is_object() ? count(s, "maxLength", where) : -1;
  ByteSet ascii = ByteSet::range(0x20, 0x7F) & ~ByteSet::of('<');
  ascii.set('\n');
  ascii.set('\t');
  const ExprId ch = b_.alt({b_.bytes(ascii), b_.any_non_ascii()});
  return b_.repeat(ch, static_cast<int32_t>(std::max<int64_t>(lo, 0)), hi < 0 ? kUnbounded : static_cast<int32_t>(hi));
}

ExprId JsonSchemaCompiler::object(const ojson& s, const std::string& where) {
  const ojson* props = nullptr;
  if (auto it = s.find("properties"); it != s.end()) {
    if (!it->is_object()) invalid(where, "'properties' must be an object");
    props = &*it;
  }
  std::vector<std::string> required;
  if (auto it = s.find("required"); it != s.end()) {
    if (!it->is_array()) invalid(where, "'required' must be an array of strings");
    for (const auto& r : *it) {
      if (!r.is_string()) invalid(where, "'required' must be an array of strings");
      required.push_back(r.get<std::string>());
    }
  }
  const ojson* extra = nullptr;  // schema of further properties; null = none allowed
  static const ojson kTrue = true;
  if (auto it = s.find("additionalProperties"); it != s.end()) {
    if (it->is_boolean())
      extra = it->get<bool>() ? &kTrue : nullptr;
    else if (it->is_object())
      extra = &*it;
    else
      invalid(where, "'additionalProperties' must be a boolean or a schema");
  }
  if (!props && required.empty() && (!s.contains("additionalProperties") || (extra && extra->is_boolean()))) {
    any_value();
    return b_.ref(object_any_rule_);
  }
  struct Prop {
    std::string name;
    const ojson* schema;
    bool required;
  };
  std::vector<Prop> list;
  if (props)
    for (auto it = props->begin(); it != props->end(); ++it) {
      const bool req = std::find(required.begin(), required.end(), it.key()) != required.end();
      list.push_back({it.key(), &*it, req});
    }
  for (const auto& r : required)
    if (!props || !props->contains(r)) list.push_back({r, &kTrue, true});
  std::vector<ExprId> kv;
  for (const auto& p : list)
    kv.push_back(b_.seq({b_.literal(compact(ojson(p.name))), ws(), b_.byte(':'), ws(),
                         value(*p.schema, where + "/properties/" + p.name)}));
  const ExprId sep_id = b_.seq({ws(), b_.byte(','), ws()});
  auto sep = [&] { return sep_id; };
  // Further properties after the listed ones.
  auto tail = [&](bool first) -> ExprId {
    if (!extra) return b_.empty();
    const ExprId ev = b_.seq({typed("string", ojson::object(), where), ws(), b_.byte(':'), ws(),
                              value(*extra, where + "/additionalProperties")});
    const int32_t r = new_rule("extra");
    b_.define(r, ev);
    const ExprId more = b_.star(b_.seq({sep(), b_.ref(r)}));
    return first ? b_.opt(b_.seq({b_.ref(r), more})) : more;
  };
  bool any_optional = false;
  for (const auto& p : list) any_optional = any_optional || !p.required;
  ExprId body;
  if (!any_optional) {
    std::vector<ExprId> parts;
    for (size_t i = 0; i < kv.size(); ++i) {
      if (i) parts.push_back(sep());
      parts.push_back(kv[i]);
    }
    parts.push_back(tail(kv.empty()));
    body = b_.seq(std::move(parts));
  } else {
    // E(i, first): properties i.. where `first` says whether none has been written yet.
    const size_t k = list.size();
    std::vector<std::array<int32_t, 2>> rules(k + 1);
    const int id = rule_counter_++;
    for (size_t i = 0; i <= k; ++i)
      for (int f = 0; f < 2; ++f)
        rules[i][static_cast<size_t>(f)] = b_.declare(fmt::format("{}obj{}_{}_{}", prefix_, id, i, f));
    for (size_t i = k + 1; i-- > 0;)
      for (int f = 0; f < 2; ++f) {
        const int32_t r = rules[i][static_cast<size_t>(f)];
        if (i == k) {
          b_.define(r, tail(f == 1));
          continue;
        }
        const ExprId with = b_.seq({f == 1 ? b_.empty() : sep(), kv[i], b_.ref(rules[i + 1][0])});
        if (list[i].required)
          b_.define(r, with);
        else
          b_.define(r, b_.alt({with, b_.ref(rules[i + 1][static_cast<size_t>(f)])}));
      }
    body = b_.ref(rules[0][1]);
  }
  return b_.seq({b_.byte('{'), ws(), body, ws(), b_.byte('}')});
}

ExprId JsonSchemaCompiler::array(const ojson& s, const std::string& where) {
  const int64_t lo = count(s, "minItems", where), hi = count(s, "maxItems", where);
  if (lo >= 0 && hi >= 0 && hi < lo) invalid(where, "'maxItems' is less than 'minItems'");
  ExprId item;
  if (auto it = s.find("items"); it != s.end()) {
    if (it->is_array())
      throw GrammarError(fmt::format("'items' as an array (tuple validation) at {} is not supported", where), "items");
    const int32_t r = new_rule("item");
    b_.define(r, value(*it, where + "/items"));
    item = b_.ref(r);
  } else {
    item = any_value();
  }
  const int64_t mn = std::max<int64_t>(lo, 0);
  if (hi == 0) return b_.seq({b_.byte('['), ws(), b_.byte(']')});
  const ExprId more =
      b_.repeat(b_.seq({b_.seq({ws(), b_.byte(','), ws()}), item}), static_cast<int32_t>(std::max<int64_t>(mn, 1) - 1),
                hi < 0 ? kUnbounded : static_cast<int32_t>(hi - 1));
  ExprId body = b_.seq({item, more});
  if (mn == 0) body = b_.opt(body);
  return b_.seq({b_.byte('['), ws(), body, ws(), b_.byte(']')});
}

std::shared_ptr<const Grammar> json_schema_grammar(const ojson& schema) {
  GrammarBuilder b;
  JsonSchemaCompiler c(b, schema);
  const int32_t root = b.declare("root");
  const ExprId v = c.value(schema, "#");
  b.define(root, b.seq({c.ws(), v}));
  return compile(b, root);
}

std::shared_ptr<const Grammar> json_object_grammar() {
  GrammarBuilder b;
  JsonSchemaCompiler c(b, ojson::object());
  const int32_t root = b.declare("root");
  const ExprId v = c.value(ojson{{"type", "object"}}, "#");
  b.define(root, b.seq({c.ws(), v}));
  return compile(b, root);
}

}  // namespace latent::structured
