#include "runtime/stop_strings.h"

#include <algorithm>

namespace latent {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  stops_.erase(std::remove_if(stops_.begin(), stops_.end(), [](const std::string& s) { return s.empty(); }),
               stops_.end());
  for (const auto& s : stops_) max_len_ = std::max(max_len_, s.size());
}

StopStringMatcher::Out StopStringMatcher::feed(const std::string& piece) {
  Out out;
  if (stopped_) {
    out.stopped = true;
    return out;
  }
  pending_ += piece;
  if (stops_.empty()) {
    out.emit.swap(pending_);
    return out;
  }
  size_t best = std::string::npos;
  for (const auto& s : stops_) best = std::min(best, pending_.find(s));
  if (best != std::string::npos) {
    out.emit = pending_.substr(0, best);
    out.stopped = stopped_ = true;
    pending_.clear();
    return out;
  }
  // Longest suffix of pending_ that is a proper prefix of some stop string: hold it back.
  size_t hold = 0;
  const size_t lim = std::min(pending_.size(), max_len_ - 1);
  for (size_t len = lim; len > 0 && hold == 0; --len) {
    const char* suf = pending_.data() + pending_.size() - len;
    for (const auto& s : stops_)
      if (s.size() > len && s.compare(0, len, suf, len) == 0) {
        hold = len;
        break;
      }
  }
  out.emit = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopStringMatcher::finish() {
  std::string r;
  r.swap(pending_);
  return r;
}

}  // namespace latent
