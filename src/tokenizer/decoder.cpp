#include "tokenizer/decoder.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/json_util.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace latent {

namespace {

class ByteLevelDecoder final : public DecoderStep {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const auto& t : tokens) {
      if (auto raw = byte_level::decode(t))
        bytes += *raw;
      else
        bytes += t;
    }
    tokens.assign(1, unicode::utf8_lossy(bytes));
  }
};

// Runs of <0xNN> tokens become their bytes; an invalid run becomes one U+FFFD per byte.
class ByteFallbackDecoder final : public DecoderStep {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (unicode::is_valid_utf8(pending)) {
        out.push_back(pending);
      } else {
        std::string r;
        for (size_t i = 0; i < pending.size(); ++i) r += "\xEF\xBF\xBD";
        out.push_back(r);
      }
      pending.clear();
    };
    for (auto& t : tokens) {
      int byte = -1;
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
        auto hex = [](char c) {
          return c >= '0' && c <= '9'   ? c - '0'
                 : c >= 'A' && c <= 'F' ? c - 'A' + 10
                 : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                        : -1;
        };
        const int h = hex(t[3]), l = hex(t[4]);
        if (h >= 0 && l >= 0) byte = h * 16 + l;
      }
      if (byte >= 0) {
        pending.push_back(static_cast<char>(byte));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens.swap(out);
  }
};

class FuseDecoder final : public DecoderStep {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, all);
  }
};

class ReplaceDecoder final : public DecoderStep {
 public:
  ReplaceDecoder(std::string literal, std::unique_ptr<Regex> re, std::string content)
      : literal_(std::move(literal)), re_(std::move(re)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::pair<size_t, size_t>> m;
    for (auto& t : tokens) {
      m.clear();
      if (re_) {
        re_->find_all(t, m);
      } else if (!literal_.empty()) {
        size_t pos = 0;
        while ((pos = t.find(literal_, pos)) != std::string::npos) {
          m.emplace_back(pos, pos + literal_.size());
          pos += literal_.size();
        }
      }
      if (m.empty()) continue;
      std::string r;
      size_t prev = 0;
      for (auto [b, e] : m) {
        r.append(t, prev, b - prev);
        r += content_;
        prev = e;
      }
      r.append(t, prev, std::string::npos);
      t.swap(r);
    }
  }

 private:
  std::string literal_;
  std::unique_ptr<Regex> re_;
  std::string content_;
};

// Per token: drop up to `start` leading and `stop` trailing occurrences of one character.
class StripDecoder final : public DecoderStep {
 public:
  StripDecoder(uint32_t cp, size_t start, size_t stop) : cp_(cp), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      std::vector<std::pair<size_t, uint32_t>> chars;  // (byte offset, code point)
      size_t i = 0;
      while (i < t.size()) {
        uint32_t cp = 0;
        const size_t n = unicode::decode_valid(t, i, cp);
        chars.emplace_back(i, cp);
        i += n;
      }
      size_t a = 0;
      while (a < start_ && a < chars.size() && chars[a].second == cp_) ++a;
      size_t b = chars.size();
      size_t cut = 0;
      while (cut < stop_ && b > a && chars[b - 1].second == cp_) {
        --b;
        ++cut;
      }
      const size_t from = a < chars.size() ? chars[a].first : t.size();
      const size_t to = b < chars.size() ? chars[b].first : t.size();
      t = t.substr(from, to > from ? to - from : 0);
    }
  }

 private:
  uint32_t cp_;
  size_t start_, stop_;
};

size_t json_size(const nlohmann::json& j, const char* key, const char* what, const std::string& file) {
  const auto& v = json_field(j, key, what, file);
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
    fail("{}: {}: \"{}\" is not a non-negative integer", file, what, key);
  return v.get<size_t>();
}

void build(const nlohmann::json& j, const std::string& file, std::vector<std::shared_ptr<const DecoderStep>>& steps) {
  if (j.is_null()) return;
  const std::string type = json_type_field(j, "decoder", file);
  if (type == "Sequence") {
    const auto& arr = json_field(j, "decoders", "decoder Sequence", file);
    if (!arr.is_array()) fail("{}: decoder Sequence: \"decoders\" is not an array", file);
    for (const auto& c : arr) build(c, file, steps);
    return;
  }
  if (type == "ByteLevel") {
    steps.push_back(std::make_shared<ByteLevelDecoder>());
    return;
  }
  if (type == "ByteFallback") {
    steps.push_back(std::make_shared<ByteFallbackDecoder>());
    return;
  }
  if (type == "Fuse") {
    steps.push_back(std::make_shared<FuseDecoder>());
    return;
  }
  if (type == "Replace") {
    const auto& pat = json_field(j, "pattern", "decoder Replace", file);
    const std::string content = json_string(j, "content", "decoder Replace", file);
    if (pat.is_object() && pat.contains("String") && pat["String"].is_string()) {
      steps.push_back(std::make_shared<ReplaceDecoder>(pat["String"].get<std::string>(), nullptr, content));
      return;
    }
    if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
      steps.push_back(
          std::make_shared<ReplaceDecoder>("", std::make_unique<Regex>(pat["Regex"].get<std::string>()), content));
      return;
    }
    fail("{}: decoder Replace: \"pattern\" must be {{\"String\": ...}} or {{\"Regex\": ...}}", file);
  }
  if (type == "Strip") {
    const std::string c = json_string(j, "content", "decoder Strip", file);
    uint32_t cp = 0;
    if (c.empty() || !unicode::is_valid_utf8(c) || unicode::decode_valid(c, 0, cp) != c.size())
      fail("{}: decoder Strip: \"content\" must be one character", file);
    steps.push_back(std::make_shared<StripDecoder>(cp, json_size(j, "start", "decoder Strip", file),
                                                   json_size(j, "stop", "decoder Strip", file)));
    return;
  }
  static const char* kKnownUnsupported[] = {"Metaspace", "WordPiece", "BPEDecoder", "CTC"};
  for (const char* k : kKnownUnsupported)
    if (type == k) fail("{}: decoder type '{}' is not supported", file, type);
  fail("{}: unknown decoder type '{}'", file, type);
}

}  // namespace

Decoder Decoder::from_json(const nlohmann::json& j, const std::string& file) {
  Decoder d;
  build(j, file, d.steps_);
  d.pure_byte_level_ = d.steps_.size() == 1 && dynamic_cast<const ByteLevelDecoder*>(d.steps_[0].get()) != nullptr;
  return d;
}

std::string Decoder::decode(std::vector<std::string> tokens) const {
  if (steps_.empty()) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out += ' ';
      out += tokens[i];
    }
    return out;
  }
  for (const auto& s : steps_) s->decode_chain(tokens);
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

}  // namespace latent
