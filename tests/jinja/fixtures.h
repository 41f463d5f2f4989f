// Helpers shared by the jinja tests: fixture loading, the fixed clock of tools/gen_jinja_fixtures.py, diffs.
#pragma once
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "jinja/error.h"
#include "jinja/interpreter.h"

namespace latent::jinja::testing {

inline std::string data_path(const std::string& rel) {
  return std::string(LATENT_SOURCE_DIR) + "/tests/data/jinja/" + rel;
}

inline std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline std::vector<nlohmann::ordered_json> read_jsonl(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<nlohmann::ordered_json> out;
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) out.push_back(nlohmann::ordered_json::parse(line));
  return out;
}

// FIXED_NOW of the generator: 2025-03-14 15:09:26 (a Friday).
inline std::tm fixed_now() {
  std::tm tm{};
  tm.tm_year = 2025 - 1900;
  tm.tm_mon = 2;
  tm.tm_mday = 14;
  tm.tm_hour = 15;
  tm.tm_min = 9;
  tm.tm_sec = 26;
  const std::time_t t = timegm(&tm);
  std::tm out{};
  gmtime_r(&t, &out);
  return out;
}

inline RenderOptions fixed_clock_options() {
  RenderOptions o;
  o.now = fixed_now;
  return o;
}

// Where two strings first differ, with some context, for failure messages.
inline std::string first_diff(const std::string& want, const std::string& got) {
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  auto ctx = [&](const std::string& s) {
    const size_t b = i > 40 ? i - 40 : 0;
    return nlohmann::json(s.substr(b, 100)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  };
  std::ostringstream os;
  os << "first difference at byte " << i << " (want " << want.size() << " bytes, got " << got.size()
     << ")\n  want: " << ctx(want) << "\n  got:  " << ctx(got);
  return os.str();
}

// Does our error kind correspond to the Python exception jinja2 raised?
inline bool kind_matches(const std::string& py, ErrorKind k) {
  if (py == "TemplateSyntaxError" || py == "TemplateAssertionError" || py == "SyntaxError")
    return k == ErrorKind::Syntax;
  if (py == "UndefinedError") return k == ErrorKind::Undefined;
  if (py == "SecurityError") return k == ErrorKind::Security;
  if (py == "TemplateRuntimeError") return k == ErrorKind::Runtime;
  if (py == "TemplateError") return k == ErrorKind::Raised;
  if (py == "RecursionError") return k == ErrorKind::Limit;
  if (py == "OverflowError") return true;
  return k == ErrorKind::Type;  // TypeError, ValueError, ZeroDivisionError, KeyError, ...
}

}  // namespace latent::jinja::testing
