// Stop strings over a stream of text pieces (docs/api.md §stop): output is cut just before the earliest
// occurrence of any stop string (matched across piece boundaries), and a streaming client never sees a partial
// stop string: text that could still begin a match is held back until it cannot, and flushed at the end.
#pragma once
#include <string>
#include <vector>

namespace latent {

class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops);
  struct Out {
    std::string emit;      // text safe to send now
    bool stopped = false;  // a stop string matched: `emit` ends just before it; ignore further input
  };
  Out feed(const std::string& piece);
  std::string finish();  // held-back text at the end of generation (empty after a stop)
  bool stopped() const { return stopped_; }
  const std::string& held() const { return pending_; }

 private:
  std::vector<std::string> stops_;
  size_t max_len_ = 0;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace latent
