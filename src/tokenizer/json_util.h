// Small strict accessors for tokenizer.json: every failure is a latent::Error naming the file and the field.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"

namespace latent {

inline const nlohmann::json& json_field(const nlohmann::json& j, const char* key, const char* what,
                                        const std::string& file) {
  if (!j.is_object()) fail("{}: {} is not a JSON object", file, what);
  auto it = j.find(key);
  if (it == j.end()) fail("{}: {} has no \"{}\"", file, what, key);
  return *it;
}

// The "type" string of a component object (normalizer, pre_tokenizer, model, decoder, post_processor).
inline std::string json_type_field(const nlohmann::json& j, const char* what, const std::string& file) {
  if (!j.is_object()) fail("{}: {} is not a JSON object", file, what);
  auto it = j.find("type");
  if (it == j.end() || !it->is_string()) fail("{}: {} has no \"type\" string", file, what);
  return it->get<std::string>();
}

inline std::string json_string(const nlohmann::json& j, const char* key, const char* what, const std::string& file) {
  const auto& v = json_field(j, key, what, file);
  if (!v.is_string()) fail("{}: {}: \"{}\" is not a string", file, what, key);
  return v.get<std::string>();
}

// Optional string: empty when absent or null.
inline std::string json_opt_string(const nlohmann::json& j, const char* key, const char* what,
                                   const std::string& file) {
  if (!j.is_object()) fail("{}: {} is not a JSON object", file, what);
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return {};
  if (!it->is_string()) fail("{}: {}: \"{}\" is not a string", file, what, key);
  return it->get<std::string>();
}

inline bool json_bool(const nlohmann::json& j, const char* key, bool dflt, const char* what, const std::string& file) {
  if (!j.is_object()) fail("{}: {} is not a JSON object", file, what);
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_boolean()) fail("{}: {}: \"{}\" is not a boolean", file, what, key);
  return it->get<bool>();
}

}  // namespace latent
