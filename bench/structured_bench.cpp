// Token-mask time of the structured-output matcher (src/structured) on a ~150K-token byte-level vocabulary.
//
// Vocabulary: the byte strings of the tokenizer fixtures in tests/data/tokenizer (GLM-5, DeepSeek-V3, Kimi-K2
// subsets) and of the bundled demo model, plus all 256 single bytes, plus synthetic entries until 150,000 ids:
// English-like words (with and without a leading space, capitalized), numbers, punctuation / JSON / code runs,
// whitespace runs and CJK strings, in the proportions of a GPT-style vocabulary. Each schema is decoded along a
// realistic path: a valid output text is tokenized greedily (longest match) with the vocabulary, and at every step
// the mask is computed (and checked to allow the next token) before the token is accepted. "cold" is the first
// generation after emptying the vocabulary's per-node cache (a new server's first request), "warm" a second
// generation with a new matcher and the cache as the first left it (a later request with the same schema, or a
// different schema that shares its string / number rules). One core, one thread; per-token times are the thread's
// CPU time (CLOCK_THREAD_CPUTIME_ID), compile and build times wall-clock.
//
// Usage: structured_bench [--vocab N] [--reps R]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "structured/compilers.h"
#include "structured/constraint.h"
#include "structured/matcher.h"
#include "tokenizer/tokenizer.h"

using namespace latent;
using namespace latent::structured;
using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

namespace {

double us_since(Clock::time_point t0) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); }

// CPU time of this thread (µs): on a shared, loaded machine wall-clock per-token figures mostly measure preemption.
double thread_cpu_us() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

std::vector<std::string> build_vocab(size_t target) {
  std::set<std::string> seen;
  std::vector<std::string> v;
  auto add = [&](const std::string& s) {
    if (!s.empty() && v.size() < target && seen.insert(s).second) v.push_back(s);
  };
  for (int b = 0; b < 256; ++b) add(std::string(1, static_cast<char>(b)));
  const std::string root = LATENT_SOURCE_DIR;
  for (const char* dir : {"tests/data/tokenizer/glm5", "tests/data/tokenizer/deepseek_v3",
                          "tests/data/tokenizer/kimi_k2", "models/latent-demo"}) {
    const std::string p = root + "/" + dir;
    if (!std::filesystem::exists(p + "/tokenizer.json")) continue;
    try {
      const Tokenizer t = Tokenizer::from_file(p);
      for (size_t id = 0; id < t.id_limit(); ++id)
        if (!t.is_special(static_cast<TokenId>(id))) add(std::string(t.token_bytes(static_cast<TokenId>(id))));
    } catch (const std::exception& e) {
      fmt::print(stderr, "skipping {}: {}\n", p, e.what());
    }
  }
  const size_t from_files = v.size();
  std::mt19937 rng(12345);
  const char* onsets[] = {"",  "b", "c", "d",  "f",  "g",  "h",  "j",  "k",  "l",  "m",  "n",  "p",  "r",  "s",
                          "t", "v", "w", "st", "tr", "pl", "ch", "sh", "th", "gr", "br", "cl", "sp", "qu", "wh"};
  const char* nuclei[] = {"a", "e", "i", "o", "u", "ea", "ou", "io", "ai", "ee", "oo", "y"};
  const char* codas[] = {"",   "",   "n", "s", "t",  "r",  "l",  "d",   "ng",   "nt",
                         "st", "ck", "m", "x", "ll", "rs", "ed", "ing", "tion", "er"};
  const char* punct[] = {"\",", "\":", "{\"", "\"}", "\"]",  "],",   "},",   "\":\"", "\",\"", "()", "();",
                         "->",  "::",  "==",  "!=",  "<=",   ">=",   "&&",   "||",    "//",    "/*", "*/",
                         "...", ".\n", ",\n", ";\n", "\n\n", "\"\n", "\":[", "\":{",  "}}",    "]]", "[\"",
                         "('",  "')",  "\")", "=\"", "%s",   "\\n",  "\\\"", "$(",    "#{"};
  std::uniform_int_distribution<int> kind(0, 99);
  while (v.size() < target) {
    const int k = kind(rng);
    std::string s;
    if (k < 72) {  // words
      const int syl = 1 + static_cast<int>(rng() % 3);
      for (int i = 0; i < syl; ++i) s += std::string(onsets[rng() % 30]) + nuclei[rng() % 12] + codas[rng() % 20];
      if (rng() % 3 == 0) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
      if (rng() % 10 < 6) s = " " + s;
    } else if (k < 78) {  // numbers
      s = std::to_string(rng() % (rng() % 2 ? 1000 : 100000));
      if (rng() % 3 == 0) s = " " + s;
    } else if (k < 86) {  // punctuation / code
      s = punct[rng() % (sizeof(punct) / sizeof(punct[0]))];
      if (rng() % 2) s += punct[rng() % (sizeof(punct) / sizeof(punct[0]))];
      if (rng() % 4 == 0) s = " " + s;
    } else if (k < 90) {  // whitespace runs and indentation
      s = std::string(1 + rng() % 16, ' ');
      if (rng() % 2) s = "\n" + s;
    } else {  // CJK: 1-3 characters
      const int n = 1 + static_cast<int>(rng() % 3);
      for (int i = 0; i < n; ++i) {
        const uint32_t cp = 0x4E00 + static_cast<uint32_t>(rng() % 0x5000);
        s += static_cast<char>(0xE0 | (cp >> 12));
        s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        s += static_cast<char>(0x80 | (cp & 0x3F));
      }
    }
    add(s);
  }
  fmt::print("vocabulary: {} ids ({} from the tokenizer fixtures and single bytes, {} synthetic) + 1 stop id\n",
             v.size(), from_files, v.size() - from_files);
  return v;
}

// Greedy longest-match tokenization.
std::vector<int32_t> tokenize(const std::string& text, const std::unordered_map<std::string, int32_t>& ids) {
  std::vector<int32_t> out;
  size_t i = 0;
  while (i < text.size()) {
    size_t best = 0;
    int32_t id = -1;
    for (size_t len = std::min<size_t>(24, text.size() - i); len > 0; --len) {
      auto it = ids.find(text.substr(i, len));
      if (it != ids.end()) {
        best = len;
        id = it->second;
        break;
      }
    }
    out.push_back(id);
    i += best;
  }
  return out;
}

struct Stats {
  double mean = 0, p50 = 0, p99 = 0, max = 0;
};

Stats stats(std::vector<double> t) {
  Stats s;
  if (t.empty()) return s;
  std::sort(t.begin(), t.end());
  for (double x : t) s.mean += x;
  s.mean /= static_cast<double>(t.size());
  s.p50 = t[t.size() / 2];
  s.p99 = t[std::min(t.size() - 1, t.size() * 99 / 100)];
  s.max = t.back();
  return s;
}

// One generation along `tokens`; returns the per-token mask times (µs).
std::vector<double> run(const std::shared_ptr<const CompiledGrammar>& cg, const std::vector<int32_t>& tokens,
                        int32_t stop, size_t* full_walks = nullptr) {
  Matcher m(cg);
  std::vector<uint64_t> mask(cg->vocab->mask_words());
  std::vector<double> t;
  std::vector<int32_t> seq = tokens;
  seq.push_back(stop);
  for (int32_t id : seq) {
    const double t0 = thread_cpu_us();
    m.fill_mask(mask.data());
    t.push_back(thread_cpu_us() - t0);
    if (!((mask[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1u)) {
      fmt::print(stderr, "the mask refused token {} ('{}')\n", id, cg->vocab->bytes(id));
      std::exit(1);
    }
    if (!m.accept_token(id)) std::exit(1);
    if (m.is_complete()) break;
  }
  if (full_walks) *full_walks += m.full_walks();
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  size_t target = 150000;
  int reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--vocab")
      target = std::stoul(argv[i + 1]);
    else if (a == "--reps")
      reps = std::stoi(argv[i + 1]);
  }
  auto t0 = Clock::now();
  std::vector<std::string> words = build_vocab(target);
  std::unordered_map<std::string, int32_t> ids;
  for (size_t i = 0; i < words.size(); ++i) ids.emplace(words[i], static_cast<int32_t>(i));
  const int32_t stop = static_cast<int32_t>(words.size());
  words.push_back("");
  auto vocab = std::make_shared<TokenVocab>(words, std::vector<int32_t>{stop});
  fmt::print("vocabulary + trie build: {:.0f} ms, {} trie nodes\n\n", us_since(t0) / 1000, vocab->trie_nodes());

  const ojson person = ojson::parse(R"({"type":"object","properties":{
      "name":{"type":"string"},"age":{"type":"integer"},"email":{"type":"string"},
      "tags":{"type":"array","items":{"type":"string"},"maxItems":5},
      "address":{"type":"object","properties":{"street":{"type":"string"},"city":{"type":"string"},
        "zip":{"type":"string","pattern":"^[0-9]{5}$"}},"required":["street","city","zip"],"additionalProperties":false},
      "verified":{"type":"boolean"}},
      "required":["name","age","email","tags","address","verified"],"additionalProperties":false})");
  const std::string person_text =
      R"({"name": "Marie Curie", "age": 66, "email": "marie.curie@example.org", "tags": ["physics", "chemistry", "radioactivity"], "address": {"street": "11 rue Pierre et Marie Curie", "city": "Paris", "zip": "75005"}, "verified": true})";
  const ojson tools =
      ojson::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
      "properties":{"city":{"type":"string"},"unit":{"type":"string","enum":["celsius","fahrenheit"]},"days":{"type":"integer"}},
      "required":["city"]}}}])");
  struct Case {
    std::string name;
    std::shared_ptr<const Grammar> g;
    std::string text;
  };
  std::vector<Case> cases;
  auto timed = [&](const std::string& name, auto make, std::string text) {
    const auto c0 = Clock::now();
    auto g = make();
    fmt::print("compile {:<34} {:8.0f} µs, {:5} NFA nodes\n", name, us_since(c0), g->nodes.size());
    cases.push_back({name, g, std::move(text)});
  };
  timed(
      "json_schema person (strict)", [&] { return json_schema_grammar(person); }, person_text);
  timed(
      "json_object", [&] { return json_object_grammar(); },
      R"({"answer": "The capital of Japan is Tokyo.", "confidence": 0.97, "sources": ["atlas", "encyclopedia"]})");
  timed(
      "glm tool call get_weather", [&] { return tool_call_grammar(ToolSyntax::Glm, tools, "", true); },
      "<tool_call>get_weather<arg_key>city</arg_key><arg_value>San Francisco</arg_value><arg_key>unit</arg_key>"
      "<arg_value>celsius</arg_value></tool_call>");
  timed(
      "regex phone \\(\\d{3}\\) \\d{3}-\\d{4}", [&] { return regex_grammar("\\(\\d{3}\\) \\d{3}-\\d{4}"); },
      "(415) 555-0123");
  timed(
      "choice (4 options)",
      [&] {
        return choice_grammar({"positive", "negative", "neutral", "mixed"});
      },
      "negative");
  timed(
      "regex free text [^\\n]{0,200}\\n", [&] { return regex_grammar("[^\\n]{0,200}\\n"); },
      "The quick brown fox jumps over the lazy dog, and then it runs away into the forest.\n");
  fmt::print("\n{:<34} {:>6} {:>10} {:>10} {:>10} {:>10} {:>10} {:>6}\n", "case", "tokens", "cold mean", "warm mean",
             "warm p50", "warm p99", "warm max", "walks");
  for (const auto& c : cases) {
    const auto toks = tokenize(c.text, ids);
    std::vector<double> cold, warm;
    size_t walks = 0;
    for (int r = 0; r < reps; ++r) {
      auto cg = std::make_shared<CompiledGrammar>();
      cg->grammar = c.g;
      cg->vocab = vocab;
      vocab->cache().clear();
      auto a = run(cg, toks, stop);
      cold.insert(cold.end(), a.begin(), a.end());
      auto b = run(cg, toks, stop, &walks);
      warm.insert(warm.end(), b.begin(), b.end());
    }
    const Stats sc = stats(cold), sw = stats(warm);
    fmt::print("{:<34} {:>6} {:>8.1f}µs {:>8.1f}µs {:>8.1f}µs {:>8.1f}µs {:>8.1f}µs {:>6.1f}\n", c.name,
               toks.size() + 1, sc.mean, sw.mean, sw.p50, sw.p99, sw.max, static_cast<double>(walks) / reps);
  }
  // A new schema whose string / number rules an earlier request already computed.
  {
    double sum = 0;
    size_t n = 0;
    for (int r = 0; r < reps; ++r) {
      vocab->cache().clear();
      auto first = std::make_shared<CompiledGrammar>();
      first->grammar = cases[1].g;  // json_object
      first->vocab = vocab;
      run(first, tokenize(cases[1].text, ids), stop);
      auto cg = std::make_shared<CompiledGrammar>();
      cg->grammar = cases[0].g;  // the person schema, never seen
      cg->vocab = vocab;
      for (double t : run(cg, tokenize(cases[0].text, ids), stop)) sum += t, ++n;
    }
    fmt::print("\nfirst request with the person schema after one json_object request: {:.1f} µs per token\n",
               sum / static_cast<double>(n));
  }
  // Applying a mask to a row of logits (GrammarConstraint::mask = fill_mask + writing -inf).
  {
    auto cg = std::make_shared<CompiledGrammar>();
    cg->grammar = cases[0].g;
    cg->vocab = vocab;
    GrammarConstraint k(cg, -1);
    std::vector<float> logits(vocab->size(), 0.5f);
    k.mask(logits);
    const int n = 200;
    double tot = 0;
    for (int i = 0; i < n; ++i) {
      std::fill(logits.begin(), logits.end(), 0.5f);
      const double a0 = thread_cpu_us();
      k.mask(logits);
      tot += thread_cpu_us() - a0;
    }
    fmt::print("\nGrammarConstraint::mask on {} logits (a cached state: copy the mask, write -inf): {:.1f} µs\n",
               logits.size(), tot / n);
  }
  return 0;
}
