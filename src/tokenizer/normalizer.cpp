#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "tokenizer/json_util.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace latent {

namespace {

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> c) : children_(std::move(c)) {}
  void normalize(std::string& s) const override {
    for (const auto& c : children_) c->normalize(s);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> children_;
};

class UnicodeNormalizer final : public Normalizer {
 public:
  UnicodeNormalizer(int options, std::string name) : options_(options), name_(std::move(name)) {}
  void normalize(std::string& s) const override {
    if (s.empty()) return;
    // ASCII is invariant under every normalization form.
    bool ascii = true;
    for (char c : s)
      if (static_cast<unsigned char>(c) >= 0x80) {
        ascii = false;
        break;
      }
    if (ascii) return;
    utf8proc_uint8_t* dst = nullptr;
    const utf8proc_ssize_t n =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()), &dst,
                     static_cast<utf8proc_option_t>(options_));
    if (n < 0) fail("{} normalization failed: {}", name_, utf8proc_errmsg(n));
    s.assign(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
    std::free(dst);
  }

 private:
  int options_;
  std::string name_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  void normalize(std::string& s) const override {
    std::string out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
      uint32_t cp = 0;
      i += unicode::decode_valid(s, i, cp);
      unicode::append_lowercase(out, cp);
    }
    s.swap(out);
  }
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string p) : prepend_(std::move(p)) {}
  void normalize(std::string& s) const override {
    if (!s.empty()) s.insert(0, prepend_);
  }

 private:
  std::string prepend_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(std::string literal, std::unique_ptr<Regex> re, std::string content)
      : literal_(std::move(literal)), re_(std::move(re)), content_(std::move(content)) {}
  void normalize(std::string& s) const override {
    std::vector<std::pair<size_t, size_t>> m;
    if (re_) {
      re_->find_all(s, m);
    } else if (!literal_.empty()) {
      size_t pos = 0;
      while ((pos = s.find(literal_, pos)) != std::string::npos) {
        m.emplace_back(pos, pos + literal_.size());
        pos += literal_.size();
      }
    }
    if (m.empty()) return;
    std::string out;
    size_t prev = 0;
    for (auto [b, e] : m) {
      out.append(s, prev, b - prev);
      out += content_;
      prev = e;
    }
    out.append(s, prev, std::string::npos);
    s.swap(out);
  }

 private:
  std::string literal_;
  std::unique_ptr<Regex> re_;
  std::string content_;
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& s) const override {
    size_t b = 0, e = s.size();
    if (left_) {
      while (b < e) {
        uint32_t cp = 0;
        const size_t n = unicode::decode_valid(s, b, cp);
        if (!unicode::is_whitespace(cp)) break;
        b += n;
      }
    }
    if (right_) {
      while (e > b) {
        size_t k = e - 1;
        while (k > b && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
        uint32_t cp = 0;
        unicode::decode_valid(s, k, cp);
        if (!unicode::is_whitespace(cp)) break;
        e = k;
      }
    }
    s = s.substr(b, e - b);
  }

 private:
  bool left_, right_;
};

class StripAccentsNormalizer final : public Normalizer {
 public:
  void normalize(std::string& s) const override {
    std::string out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
      uint32_t cp = 0;
      const size_t n = unicode::decode_valid(s, i, cp);
      if (!unicode::is_combining_mark(cp)) out.append(s, i, n);
      i += n;
    }
    s.swap(out);
  }
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const std::string& file) {
  if (j.is_null()) return nullptr;
  const std::string type = json_type_field(j, "normalizer", file);
  if (type == "Sequence") {
    const auto& arr = json_field(j, "normalizers", "normalizer Sequence", file);
    if (!arr.is_array()) fail("{}: normalizer Sequence: \"normalizers\" is not an array", file);
    std::vector<std::unique_ptr<Normalizer>> children;
    for (const auto& c : arr)
      if (auto n = make_normalizer(c, file)) children.push_back(std::move(n));
    if (children.empty()) return nullptr;
    if (children.size() == 1) return std::move(children[0]);
    return std::make_unique<SequenceNormalizer>(std::move(children));
  }
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_COMPOSE, "NFC");
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE, "NFD");
  if (type == "NFKC")
    return std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT, "NFKC");
  if (type == "NFKD")
    return std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, "NFKD");
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(json_string(j, "prepend", "Prepend", file));
  if (type == "Strip")
    return std::make_unique<StripNormalizer>(json_bool(j, "strip_left", true, "Strip", file),
                                             json_bool(j, "strip_right", true, "Strip", file));
  if (type == "Replace") {
    const auto& pat = json_field(j, "pattern", "normalizer Replace", file);
    const std::string content = json_string(j, "content", "normalizer Replace", file);
    if (pat.is_object() && pat.contains("String") && pat["String"].is_string())
      return std::make_unique<ReplaceNormalizer>(pat["String"].get<std::string>(), nullptr, content);
    if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string())
      return std::make_unique<ReplaceNormalizer>("", std::make_unique<Regex>(pat["Regex"].get<std::string>()), content);
    fail("{}: normalizer Replace: \"pattern\" must be {{\"String\": ...}} or {{\"Regex\": ...}}", file);
  }
  static const char* kKnownUnsupported[] = {"BertNormalizer", "Precompiled", "Nmt", "ByteLevel"};
  for (const char* k : kKnownUnsupported)
    if (type == k) fail("{}: normalizer type '{}' is not supported", file, type);
  fail("{}: unknown normalizer type '{}'", file, type);
}

}  // namespace latent
