// tokenizer.json "decoder": ByteLevel, ByteFallback, Fuse, Replace, Strip, Sequence (HF decode_chain semantics:
// each step maps the list of token strings to a new list; the results are concatenated). Without a decoder,
// tokens are joined with spaces, as HF does.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace latent {

class DecoderStep {
 public:
  virtual ~DecoderStep() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

class Decoder {
 public:
  static Decoder from_json(const nlohmann::json& j, const std::string& file);

  // Decodes token strings to text (valid UTF-8).
  std::string decode(std::vector<std::string> tokens) const;

  // True when the decoder is exactly ByteLevel: each token then contributes fixed bytes (its ByteLevel bytes, or
  // its own UTF-8 when a character is outside the map) and the text is the lossy UTF-8 of their concatenation.
  bool pure_byte_level() const { return pure_byte_level_; }
  bool present() const { return !steps_.empty(); }

 private:
  std::vector<std::shared_ptr<const DecoderStep>> steps_;
  bool pure_byte_level_ = false;
};

}  // namespace latent
