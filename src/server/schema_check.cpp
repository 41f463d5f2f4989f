// JSON Schema well-formedness (schema_check.h).
#include "server/schema_check.h"

#include <fmt/format.h>

#include <cmath>
#include <set>
#include <string_view>

namespace latent::server {

namespace {

using ojson = nlohmann::ordered_json;

// The first problem ends the walk.
struct Problem {
  std::string what;
};

std::string pointer_token(std::string_view key) {
  std::string out;
  for (char c : key) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}

std::string child(const std::string& at, std::string_view key) { return at + "/" + pointer_token(key); }
std::string item(const std::string& at, size_t i) { return at + "/" + std::to_string(i); }

const char* kind(const ojson& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

[[noreturn]] void bad(const std::string& at, const std::string& what) {
  throw Problem{fmt::format("at {}: {}", at, what)};
}

[[noreturn]] void wrong(const std::string& at, const std::string& key, const char* expected, const ojson& v) {
  bad(at, fmt::format("'{}' must be {} (got {})", key, expected, kind(v)));
}

// JSON Schema counts a number with a zero fractional part (2.0) as an integer.
bool non_negative_integer(const ojson& v) {
  if (v.is_number_unsigned()) return true;
  if (v.is_number_integer()) return v.get<int64_t>() >= 0;
  if (v.is_number_float()) {
    const double d = v.get<double>();
    return std::isfinite(d) && d >= 0 && std::floor(d) == d;
  }
  return false;
}

const std::set<std::string, std::less<>>& type_names() {
  static const std::set<std::string, std::less<>> k = {"array",  "boolean", "integer", "null",
                                                       "number", "object",  "string"};
  return k;
}

// Follows a local JSON pointer ("#", "#/a/b~1c/0"); nullptr when it does not resolve.
const ojson* resolve(const ojson& root, std::string_view ref) {
  const ojson* t = &root;
  if (ref == "#") return t;
  size_t pos = 2;  // past "#/"
  while (pos <= ref.size()) {
    size_t next = ref.find('/', pos);
    if (next == std::string_view::npos) next = ref.size();
    std::string tok;
    for (size_t k = pos; k < next; ++k) {
      if (ref[k] == '~' && k + 1 < next && (ref[k + 1] == '0' || ref[k + 1] == '1')) {
        tok += ref[k + 1] == '0' ? '~' : '/';
        ++k;
      } else {
        tok += ref[k];
      }
    }
    if (t->is_object()) {
      auto it = t->find(tok);
      if (it == t->end()) return nullptr;
      t = &*it;
    } else if (t->is_array() && !tok.empty() && tok.find_first_not_of("0123456789") == std::string::npos &&
               tok.size() < 10 && std::stoul(tok) < t->size()) {
      t = &(*t)[std::stoul(tok)];
    } else {
      return nullptr;
    }
    pos = next + 1;
  }
  return t;
}

class Checker {
 public:
  explicit Checker(const ojson& root) : root_(root) {}

  void schema(const ojson& s, const std::string& at) {
    if (s.is_boolean()) return;
    if (!s.is_object()) bad(at, fmt::format("a schema must be an object or a boolean (got {})", kind(s)));
    if (++depth_ > 128) bad(at, "the schema is nested more than 128 levels deep");
    for (auto it = s.begin(); it != s.end(); ++it) keyword(it.key(), it.value(), at);
    --depth_;
  }

 private:
  void schema_map(const std::string& key, const ojson& v, const std::string& at) {
    if (!v.is_object()) wrong(at, key, "an object whose values are schemas", v);
    const std::string here = child(at, key);
    for (auto it = v.begin(); it != v.end(); ++it) schema(it.value(), child(here, it.key()));
  }

  void schema_list(const std::string& key, const ojson& v, const std::string& at) {
    if (!v.is_array() || v.empty()) wrong(at, key, "a non-empty array of schemas", v);
    const std::string here = child(at, key);
    for (size_t i = 0; i < v.size(); ++i) schema(v[i], item(here, i));
  }

  void string_list(const std::string& key, const ojson& v, const std::string& at) {
    if (!v.is_array()) wrong(at, key, "an array of strings", v);
    std::set<std::string> seen;
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_string())
        bad(at, fmt::format("'{}' must be an array of strings (item {} is {})", key, i, kind(v[i])));
      if (!seen.insert(v[i].get<std::string>()).second)
        bad(at, fmt::format("'{}' lists '{}' twice", key, v[i].get<std::string>()));
    }
  }

  void type(const ojson& v, const std::string& at) {
    auto one = [&](const ojson& t) {
      if (!t.is_string()) wrong(at, "type", "a type name or an array of type names", t);
      if (!type_names().count(t.get<std::string>()))
        bad(at, fmt::format("'{}' is not a JSON Schema type (expected one of array, boolean, integer, null, number, "
                            "object, string)",
                            t.get<std::string>()));
    };
    if (!v.is_array()) return one(v);
    if (v.empty()) bad(at, "'type' must not be an empty array");
    std::set<std::string> seen;
    for (const ojson& t : v) {
      one(t);
      if (!seen.insert(t.get<std::string>()).second)
        bad(at, fmt::format("'type' lists '{}' twice", t.get<std::string>()));
    }
  }

  void keyword(const std::string& k, const ojson& v, const std::string& at) {
    if (k == "type") return type(v, at);
    if (k == "properties" || k == "patternProperties" || k == "$defs" || k == "definitions" || k == "dependentSchemas")
      return schema_map(k, v, at);
    if (k == "additionalProperties" || k == "additionalItems" || k == "contains" || k == "propertyNames" ||
        k == "not" || k == "if" || k == "then" || k == "else" || k == "unevaluatedProperties" ||
        k == "unevaluatedItems")
      return schema(v, child(at, k));
    if (k == "items") {  // a schema; an array of schemas is draft-07 tuple validation
      if (v.is_array()) {
        const std::string here = child(at, k);
        for (size_t i = 0; i < v.size(); ++i) schema(v[i], item(here, i));
        return;
      }
      return schema(v, child(at, k));
    }
    if (k == "prefixItems" || k == "allOf" || k == "anyOf" || k == "oneOf") return schema_list(k, v, at);
    if (k == "required") return string_list(k, v, at);
    if (k == "enum") {
      if (!v.is_array()) wrong(at, k, "an array", v);
      return;
    }
    if (k == "minLength" || k == "maxLength" || k == "minItems" || k == "maxItems" || k == "minProperties" ||
        k == "maxProperties" || k == "minContains" || k == "maxContains") {
      if (!non_negative_integer(v)) wrong(at, k, "a non-negative integer", v);
      return;
    }
    if (k == "minimum" || k == "maximum") {
      if (!v.is_number()) wrong(at, k, "a number", v);
      return;
    }
    if (k == "exclusiveMinimum" || k == "exclusiveMaximum") {  // a number; a boolean in draft-04
      if (!v.is_number() && !v.is_boolean()) wrong(at, k, "a number", v);
      return;
    }
    if (k == "multipleOf") {
      if (!v.is_number() || !(v.get<double>() > 0)) wrong(at, k, "a number greater than 0", v);
      return;
    }
    if (k == "uniqueItems" || k == "readOnly" || k == "writeOnly" || k == "deprecated") {
      if (!v.is_boolean()) wrong(at, k, "a boolean", v);
      return;
    }
    if (k == "pattern" || k == "format" || k == "title" || k == "description" || k == "$comment" ||
        k == "contentEncoding" || k == "contentMediaType" || k == "$id" || k == "$schema" || k == "$anchor" ||
        k == "$dynamicRef" || k == "$dynamicAnchor") {
      if (!v.is_string()) wrong(at, k, "a string", v);
      return;
    }
    if (k == "examples") {
      if (!v.is_array()) wrong(at, k, "an array", v);
      return;
    }
    if (k == "$ref") {
      if (!v.is_string()) wrong(at, k, "a string", v);
      const std::string& ref = v.get_ref<const std::string&>();
      if ((ref == "#" || ref.rfind("#/", 0) == 0) && !resolve(root_, ref))
        bad(at, fmt::format("'$ref' '{}' does not resolve inside the schema", ref));
      return;
    }
    if (k == "dependentRequired") {
      if (!v.is_object()) wrong(at, k, "an object whose values are arrays of strings", v);
      const std::string here = child(at, k);
      for (auto it = v.begin(); it != v.end(); ++it) string_list(it.key(), it.value(), here);
      return;
    }
    if (k == "dependencies") {  // draft-07: each value an array of property names or a schema
      if (!v.is_object()) wrong(at, k, "an object", v);
      const std::string here = child(at, k);
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (it.value().is_array())
          string_list(it.key(), it.value(), here);
        else
          schema(it.value(), child(here, it.key()));
      }
      return;
    }
    // const, default and unknown keywords: any value.
  }

  const ojson& root_;
  int depth_ = 0;
};

}  // namespace

std::string json_schema_problem(const nlohmann::ordered_json& schema) {
  try {
    Checker(schema).schema(schema, "#");
  } catch (const Problem& p) {
    return p.what;
  }
  return {};
}

}  // namespace latent::server
