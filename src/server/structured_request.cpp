// Constrained-decoding request fields (docs/api.md §structured-output; vLLM's guided_* and structured_outputs):
// shape checks only. The grammar itself is compiled by the service (server/service.cpp), which answers 400 for a
// schema, regex or grammar it cannot compile.
#include <fmt/format.h>

#include "server/json_fields.h"
#include "server/request_common.h"

namespace latent::server::detail {

using namespace fields;

namespace {

using Kind = StructuredSpec::Kind;

// guided_json / structured_outputs.json: a schema object (or boolean), or a string holding one.
ojson schema_value(const ojson& v, const std::string& p) {
  if (v.is_object() || v.is_boolean()) return v;
  if (v.is_string()) {
    try {
      ojson s = ojson::parse(v.get<std::string>());
      if (s.is_object() || s.is_boolean()) return s;
    } catch (const nlohmann::json::exception&) {
    }
    invalid_value(p, fmt::format("'{}' is not a JSON Schema (a JSON object, or a string holding one).", p));
  }
  invalid_type(p, "a JSON Schema object");
}

std::vector<std::string> choice_list(const ojson& v, const std::string& p) {
  if (!v.is_array()) invalid_type(p, "an array of strings");
  if (v.empty()) invalid_value(p, fmt::format("'{}' must not be empty.", p));
  std::vector<std::string> out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string()) invalid_type(index(p, i), "a string");
    out.push_back(v[i].get<std::string>());
  }
  return out;
}

std::string nonempty_string(const ojson& v, const std::string& p) {
  if (!v.is_string()) invalid_type(p, "a string");
  if (v.get<std::string>().empty()) invalid_value(p, fmt::format("'{}' must not be empty.", p));
  return v.get<std::string>();
}

}  // namespace

void parse_structured(const ojson& b, StructuredSpec& s) {
  std::vector<StructuredSpec> found;
  if (const ojson* rf = get(b, "response_format")) {
    if (!rf->is_object()) invalid_type("response_format", "an object");
    auto t = opt_string(*rf, "type", "response_format.type");
    if (!t) missing_param("response_format.type");
    if (*t != "text" && *t != "json_object" && *t != "json_schema")
      invalid_value("response_format.type",
                    fmt::format("Invalid 'response_format.type' '{}'; expected text, json_object or json_schema.", *t));
    if (*t == "json_object") {
      StructuredSpec x;
      x.kind = Kind::JsonObject;
      x.param = "response_format";
      found.push_back(std::move(x));
    } else if (*t == "json_schema") {
      const ojson* js = get(*rf, "json_schema");
      if (!js) missing_param("response_format.json_schema");
      if (!js->is_object()) invalid_type("response_format.json_schema", "an object");
      if (auto n = opt_string(*js, "name", "response_format.json_schema.name")) {
        if (n->empty() || n->size() > 64)
          invalid_value("response_format.json_schema.name",
                        "'response_format.json_schema.name' must have 1 to 64 characters.");
      }
      opt_bool(*js, "strict", "response_format.json_schema.strict");
      opt_string(*js, "description", "response_format.json_schema.description");
      StructuredSpec x;
      x.param = "response_format.json_schema.schema";
      if (const ojson* sc = get(*js, "schema")) {
        if (!sc->is_object() && !sc->is_boolean()) invalid_type(x.param, "a JSON Schema object");
        x.kind = Kind::JsonSchema;
        x.schema = *sc;
      } else {
        x.kind = Kind::JsonObject;  // no schema: any JSON object
      }
      found.push_back(std::move(x));
    }
  }
  auto add = [&](Kind k, const std::string& p, const ojson& v) {
    StructuredSpec x;
    x.kind = k;
    x.param = p;
    switch (k) {
      case Kind::JsonSchema: x.schema = schema_value(v, p); break;
      case Kind::Regex:
      case Kind::Grammar: x.text = nonempty_string(v, p); break;
      case Kind::Choice: x.choices = choice_list(v, p); break;
      case Kind::JsonObject:
        if (!v.is_boolean()) invalid_type(p, "a boolean");
        if (!v.get<bool>()) return;
        break;
      case Kind::None: break;
    }
    found.push_back(std::move(x));
  };
  if (const ojson* v = get(b, "guided_json")) add(Kind::JsonSchema, "guided_json", *v);
  if (const ojson* v = get(b, "guided_regex")) add(Kind::Regex, "guided_regex", *v);
  if (const ojson* v = get(b, "guided_choice")) add(Kind::Choice, "guided_choice", *v);
  if (const ojson* v = get(b, "guided_grammar")) add(Kind::Grammar, "guided_grammar", *v);
  if (const ojson* so = get(b, "structured_outputs")) {
    if (!so->is_object()) invalid_type("structured_outputs", "an object");
    const size_t before = found.size();
    for (auto it = so->begin(); it != so->end(); ++it) {
      if (it->is_null()) continue;
      const std::string p = "structured_outputs." + it.key();
      if (it.key() == "json")
        add(Kind::JsonSchema, p, *it);
      else if (it.key() == "regex")
        add(Kind::Regex, p, *it);
      else if (it.key() == "choice")
        add(Kind::Choice, p, *it);
      else if (it.key() == "grammar")
        add(Kind::Grammar, p, *it);
      else if (it.key() == "json_object")
        add(Kind::JsonObject, p, *it);
      else
        unsupported(p, fmt::format("'{}' is not supported; use json, regex, choice, grammar or json_object.", p));
    }
    if (found.size() - before > 1)
      invalid_value("structured_outputs", "'structured_outputs' must set exactly one of json, regex, choice, grammar.");
  }
  if (found.size() > 1)
    invalid_value(found[1].param, fmt::format("'{}' and '{}' cannot be combined: give one output constraint.",
                                              found[0].param, found[1].param));
  if (!found.empty()) s = std::move(found[0]);
}

}  // namespace latent::server::detail
