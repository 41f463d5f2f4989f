// Typed accessors for request JSON (docs/api.md §transport): null means absent; integer fields accept only JSON
// integers; number fields any JSON number but booleans. Failures throw ApiError with the field's JSON path.
#pragma once
#include <fmt/format.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "server/api_error.h"
#include "server/request_schema.h"

namespace latent::server::fields {

// Pointer to the value of `key` when present and not null.
inline const ojson* get(const ojson& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

inline std::string path(const std::string& base, const char* key) { return base.empty() ? key : base + "." + key; }
inline std::string index(const std::string& base, size_t i) { return base + "[" + std::to_string(i) + "]"; }

inline std::optional<bool> opt_bool(const ojson& obj, const char* key, const std::string& param) {
  const ojson* v = get(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) invalid_type(param, "a boolean");
  return v->get<bool>();
}

// JSON integer in int64 range (an unsigned above INT64_MAX is out of range -> invalid_value).
inline int64_t as_int(const ojson& v, const std::string& param) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      invalid_value(param, "'" + param + "' is out of range.");
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  invalid_type(param, "an integer");
}

inline std::optional<int64_t> opt_int(const ojson& obj, const char* key, const std::string& param) {
  const ojson* v = get(obj, key);
  if (!v) return std::nullopt;
  return as_int(*v, param);
}

inline std::optional<double> opt_number(const ojson& obj, const char* key, const std::string& param) {
  const ojson* v = get(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) invalid_type(param, "a number");
  return v->get<double>();
}

inline std::optional<std::string> opt_string(const ojson& obj, const char* key, const std::string& param) {
  const ojson* v = get(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) invalid_type(param, "a string");
  return v->get<std::string>();
}

inline void range(double v, double lo, double hi, const std::string& param, bool lo_open = false) {
  if (v < lo || v > hi || (lo_open && v == lo))
    invalid_value(param, fmt::format("'{}' must be {} {} and <= {} (got {}).", param, lo_open ? ">" : ">=", lo, hi, v));
}

}  // namespace latent::server::fields
