// tokenizer.json "normalizer": null, Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, Strip,
// StripAccents. Any other type is an Error naming the type and the file.
#pragma once
#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace latent {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites s (valid UTF-8) in place.
  virtual void normalize(std::string& s) const = 0;
};

// nullptr for JSON null and for a Sequence with no children (identity, as DeepSeek ships it).
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const std::string& file);

}  // namespace latent
