// Shared by the tokenizer tests: the committed test tokenizers and their JSONL fixtures, each loaded once per
// process (JSON parsing dominates the run time of a Debug + ASan build).
#pragma once
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace latent::test {

inline std::string tokenizer_dir(const std::string& name) {
  return std::string(LATENT_SOURCE_DIR) + "/tests/data/tokenizer/" + name;
}

inline const Tokenizer& fixture_tokenizer(const std::string& name) {
  static std::map<std::string, Tokenizer> cache;
  auto it = cache.find(name);
  if (it == cache.end()) it = cache.emplace(name, Tokenizer::from_file(tokenizer_dir(name))).first;
  return it->second;
}

// Lines of tests/data/tokenizer/<name>/<file> (the first one is the {"meta": ...} header).
inline const std::vector<nlohmann::json>& fixture_lines(const std::string& name, const std::string& file) {
  static std::map<std::pair<std::string, std::string>, std::vector<nlohmann::json>> cache;
  auto key = std::make_pair(name, file);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  std::vector<nlohmann::json> out;
  std::ifstream f(tokenizer_dir(name) + "/" + file);
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return cache.emplace(key, std::move(out)).first->second;
}

}  // namespace latent::test
