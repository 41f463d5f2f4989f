// Is this a well-formed JSON Schema? The shape of every keyword the JSON Schema drafts define (2020-12, with the
// draft-07 and draft-04 forms still in use: `items` as an array, `definitions`, `dependencies`, boolean
// exclusiveMinimum / exclusiveMaximum), checked recursively through every subschema, and local `$ref`s
// ("#/...") that must resolve. Unknown keywords are allowed, as the drafts say. This is validation of the
// schema, not compilation: a valid keyword that constrained decoding does not implement (`minimum`, `format`)
// passes here (the grammar compiler in src/structured reports those when it has to enforce the schema).
//
// Used for every tool's `parameters` whatever tool_choice is (a malformed schema is a 400, as the OpenAI API
// answers), so a typo such as {"type": "objekt"} is caught before the model is asked to call the tool.
#pragma once
#include <nlohmann/json.hpp>

#include <string>

namespace latent::server {

// The first problem found, as "at #/properties/x/type: 'objekt' is not a JSON Schema type (...)"; "" when the
// schema is well formed.
std::string json_schema_problem(const nlohmann::ordered_json& schema);

}  // namespace latent::server
