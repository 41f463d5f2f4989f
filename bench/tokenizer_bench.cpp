// tokenizer_bench: single-thread encode / decode throughput of latent::Tokenizer on English text.
//
//   tokenizer_bench [--model DIR] [--file F] [--mb N] [--chunk BYTES]
//
// Text: --file (repeated up to N MB), else the GPL-3 licence text from /usr/share/common-licenses when present
// (real English prose), plus a synthetic Zipf-distributed English text with many distinct words (a cache-unfriendly
// case). Reports MB/s of encode (whole text and in request-sized chunks) and of decode, per second of thread CPU
// time (one core). A program, not a test.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace {

// Thread CPU time: the machine may be shared, and wall time would then measure the other load.
struct Clock {
  using time_point = double;
  static double now() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
};

double seconds_since(double t0) { return Clock::now() - t0; }

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return {};
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string repeat_to(const std::string& s, size_t bytes) {
  std::string out;
  out.reserve(bytes + s.size());
  while (out.size() < bytes) out += s;
  return out;
}

// English-like text: Zipf over a vocabulary of generated words plus common words, punctuation, numbers, newlines.
std::string synthetic_english(size_t bytes) {
  static const char* kCommon[] = {
      "the",   "of",   "and",   "to",      "a",      "in",     "is",        "that",   "for",      "it",        "as",
      "was",   "with", "be",    "by",      "on",     "not",    "he",        "I",      "this",     "are",       "or",
      "his",   "from", "at",    "which",   "but",    "have",   "an",        "had",    "they",     "you",       "were",
      "their", "one",  "all",   "we",      "can",    "her",    "has",       "there",  "been",     "if",        "more",
      "when",  "will", "would", "who",     "so",     "no",     "model",     "token",  "language", "inference", "memory",
      "don't", "it's", "we'll", "they're", "system", "engine", "attention", "expert", "layer"};
  std::mt19937_64 rng(42);
  std::vector<std::string> words(kCommon, kCommon + sizeof(kCommon) / sizeof(kCommon[0]));
  const char* syll[] = {"ka",  "ter", "min", "lo",   "pra", "sen", "tion", "al", "ing", "ed",  "ous", "re",
                        "con", "de",  "vi",  "ment", "ly",  "str", "ph",   "ex", "un",  "ble", "qu",  "est"};
  for (int i = 0; i < 50000; ++i) {
    std::string w;
    const int n = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < n; ++k) w += syll[rng() % (sizeof(syll) / sizeof(syll[0]))];
    if (rng() % 10 == 0) w[0] = static_cast<char>(w[0] - 32);
    words.push_back(w);
  }
  std::vector<double> weights(words.size());
  for (size_t i = 0; i < words.size(); ++i) weights[i] = 1.0 / static_cast<double>(i + 1);
  std::discrete_distribution<size_t> pick(weights.begin(), weights.end());
  std::string out;
  out.reserve(bytes + 64);
  int in_sentence = 0;
  while (out.size() < bytes) {
    out += words[pick(rng)];
    ++in_sentence;
    const auto r = rng() % 100;
    if (r < 3) out += std::to_string(rng() % 100000);
    if (in_sentence > 8 && r < 12) {
      out += (r % 3 == 0) ? ". " : (r % 3 == 1) ? ", " : "! ";
      if (r < 5) out += "\n\n";
      in_sentence = 0;
    } else {
      out += ' ';
    }
  }
  return out;
}

void run(const latent::Tokenizer& tok, const std::string& name, const std::string& text, size_t chunk) {
  const double mb = static_cast<double>(text.size()) / 1e6;
  // Cold pass (empty word cache), then a warm pass.
  auto t0 = Clock::now();
  auto ids = tok.encode(text, false);
  const double cold = seconds_since(t0);
  t0 = Clock::now();
  ids = tok.encode(text, false);
  const double warm = seconds_since(t0);
  // Request-sized chunks (cut at spaces).
  t0 = Clock::now();
  size_t n_chunk_ids = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = std::min(text.size(), pos + chunk);
    while (end < text.size() && text[end] != ' ') ++end;
    n_chunk_ids += tok.encode(std::string_view(text).substr(pos, end - pos), false).size();
    pos = end;
  }
  const double chunked = seconds_since(t0);
  t0 = Clock::now();
  const std::string back = tok.decode(ids, false);
  const double dec = seconds_since(t0);
  t0 = Clock::now();
  latent::IncrementalDetokenizer detok(tok);
  size_t streamed = 0;
  for (auto id : ids) streamed += detok.push(id).size();
  streamed += detok.finish().size();
  const double stream = seconds_since(t0);
  std::printf("%-18s %7.1f MB  %8zu ids (%.2f bytes/id)\n", name.c_str(), mb, ids.size(),
              static_cast<double>(text.size()) / static_cast<double>(ids.size()));
  std::printf("  encode cold     %8.1f MB/s\n", mb / cold);
  std::printf("  encode warm     %8.1f MB/s\n", mb / warm);
  std::printf("  encode %5zu B  %8.1f MB/s  (%zu ids)\n", chunk, mb / chunked, n_chunk_ids);
  std::printf("  decode          %8.1f MB/s  %s\n", mb / dec,
              back == text ? "(round trip exact)" : "(round trip DIFFERS)");
  std::printf("  stream decode   %8.1f MB/s  %s\n", mb / stream, streamed == back.size() ? "" : "(length differs)");
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = std::string(LATENT_SOURCE_DIR) + "/tests/data/tokenizer/glm5";
  std::string file;
  double target_mb = 16;
  size_t chunk = 4096;
  for (int i = 1; i < argc; ++i) {
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "missing value for %s\n", argv[i]);
        std::exit(2);
      }
      return argv[++i];
    };
    if (!std::strcmp(argv[i], "--model"))
      model = next();
    else if (!std::strcmp(argv[i], "--file"))
      file = next();
    else if (!std::strcmp(argv[i], "--mb"))
      target_mb = std::stod(next());
    else if (!std::strcmp(argv[i], "--chunk"))
      chunk = std::stoul(next());
    else {
      std::fprintf(stderr, "usage: tokenizer_bench [--model DIR] [--file F] [--mb N] [--chunk BYTES]\n");
      return 2;
    }
  }
  try {
    auto t0 = Clock::now();
    const latent::Tokenizer tok = latent::Tokenizer::from_file(model);
    std::printf("tokenizer %s: %zu tokens, loaded in %.0f ms\n", tok.source().c_str(), tok.vocab_size(),
                seconds_since(t0) * 1e3);
    const size_t bytes = static_cast<size_t>(target_mb * 1e6);
    if (!file.empty()) {
      const std::string s = read_all(file);
      if (s.empty()) latent::fail("cannot read {}", file);
      run(tok, file, repeat_to(s, bytes), chunk);
    } else {
      const std::string gpl = read_all("/usr/share/common-licenses/GPL-3");
      if (!gpl.empty()) run(tok, "GPL-3 (repeated)", repeat_to(gpl, bytes), chunk);
      run(tok, "synthetic Zipf", synthetic_english(bytes), chunk);
    }
  } catch (const latent::Error& e) {
    std::fprintf(stderr, "tokenizer_bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
