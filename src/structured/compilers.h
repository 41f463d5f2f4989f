// Front ends that build grammars (grammar.h):
//  - regex: ECMAScript-style patterns as JSON Schema `pattern` and vLLM `guided_regex` use them (literals, escapes
//    \d \w \s \D \W \S \n \t \xHH \uHHHH, classes with ranges and negation, `.`, groups (?: ) (?<name> ), `|`,
//    * + ? {n} {n,} {n,m} with lazy / possessive suffixes ignored, ^ at the start and $ at the end). The whole
//    string must match (the pattern is anchored at both ends). Lookaround, backreferences and \b are rejected.
//  - JSON Schema (OpenAI strict-mode subset plus what vLLM accepts): type (one or a list) object / array / string /
//    number / integer / boolean / null, properties, required, additionalProperties (false or absent: no other
//    properties; true or a schema: further properties allowed), items, minItems / maxItems, enum, const, anyOf
//    (oneOf is treated as anyOf), a one-element allOf, $ref to "#", "#/$defs/..." or "#/definitions/...",
//    pattern, minLength / maxLength. Annotations (title, description, default, examples, $schema, $id, $comment,
//    deprecated, readOnly, writeOnly, strict, discriminator) are ignored; any other keyword is a GrammarError
//    naming it. Properties come out in schema order; between tokens at most one space is allowed (compact JSON
//    or Python's json.dumps layout), so that a model cannot pad the output with whitespace.
//  - choice: exactly one of the given strings.
//  - GBNF (llama.cpp grammar syntax): `name ::= alternatives`, "literals", [classes], [^negated], `.`, ( groups ),
//    * + ? {m} {m,} {m,n}, comments `#`; the start rule is `root`.
#pragma once
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "structured/grammar.h"

namespace latent::structured {

// Adds an expression for the regex. json_string_body: the pattern constrains the decoded value of a JSON string,
// so the expression matches its JSON-escaped form (quotes, backslashes and control characters escaped).
ExprId regex_expr(GrammarBuilder& b, std::string_view pattern, bool json_string_body = false);

std::shared_ptr<const Grammar> regex_grammar(std::string_view pattern);
std::shared_ptr<const Grammar> choice_grammar(const std::vector<std::string>& choices);
std::shared_ptr<const Grammar> gbnf_grammar(std::string_view text);
// Any JSON object (response_format json_object).
std::shared_ptr<const Grammar> json_object_grammar();
std::shared_ptr<const Grammar> json_schema_grammar(const nlohmann::ordered_json& schema);

// The JSON Schema compiler as a building block (tool-call grammars reuse it).
class JsonSchemaCompiler {
 public:
  // prefix: for the names of the rules it adds (several compilers may share one builder).
  JsonSchemaCompiler(GrammarBuilder& b, const nlohmann::ordered_json& root_schema, std::string prefix = "");
  // Expression for one JSON value valid under `schema` (a sub-schema of the root); `where` names it in errors.
  ExprId value(const nlohmann::ordered_json& schema, const std::string& where);
  // Expression for the text of a string value without the quotes, as GLM's raw <arg_value> carries it (no '<').
  ExprId raw_string(const nlohmann::ordered_json& schema, const std::string& where);
  ExprId ws();
  ExprId any_value();

 private:
  ExprId object(const nlohmann::ordered_json& s, const std::string& where);
  ExprId array(const nlohmann::ordered_json& s, const std::string& where);
  ExprId string(const nlohmann::ordered_json& s, const std::string& where);
  ExprId typed(const std::string& type, const nlohmann::ordered_json& s, const std::string& where);
  ExprId json_char();
  ExprId resolve_ref(const std::string& ref, const std::string& where);
  int32_t new_rule(const std::string& kind);

  GrammarBuilder& b_;
  const nlohmann::ordered_json& root_;
  std::string prefix_;
  int32_t any_rule_ = -1, string_rule_ = -1, number_rule_ = -1, integer_rule_ = -1, object_any_rule_ = -1,
          array_any_rule_ = -1;
  std::vector<std::pair<std::string, int32_t>> refs_;
  int rule_counter_ = 0;
  int depth_ = 0;
};

}  // namespace latent::structured
