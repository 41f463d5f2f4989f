#include "server/request_state.h"

namespace latent::server {

RequestState::RequestState(std::vector<OutputConfig> choices) {
  outputs_.reserve(choices.size());
  for (auto& c : choices) outputs_.emplace_back(std::move(c));
}

void RequestState::on_scheduled() {
  std::lock_guard lk(mu_);
  scheduled_ = true;
  cv_.notify_all();
}

bool RequestState::on_token(int choice, const SampleResult& s, bool stop_token) {
  ChoiceDelta d;
  // outputs_ is touched only by the scheduler thread until all choices finished.
  const bool stop = outputs_.at(static_cast<size_t>(choice)).push(s, stop_token, d);
  if (d.has_output() || !d.logprobs.empty()) {
    std::lock_guard lk(mu_);
    StreamEvent e;
    e.kind = StreamEvent::Kind::Delta;
    e.choice = choice;
    e.delta = std::move(d);
    events_.push_back(std::move(e));
    cv_.notify_all();
  }
  return stop;
}

void RequestState::on_finish(int choice, FinishReason reason) {
  ChoiceDelta d;
  const std::string why = outputs_.at(static_cast<size_t>(choice)).finish(reason, d);
  std::lock_guard lk(mu_);
  if (d.has_output() || !d.logprobs.empty()) {
    StreamEvent e;
    e.kind = StreamEvent::Kind::Delta;
    e.choice = choice;
    e.delta = std::move(d);
    events_.push_back(std::move(e));
  }
  StreamEvent f;
  f.kind = StreamEvent::Kind::Finish;
  f.choice = choice;
  f.finish_reason = why;
  events_.push_back(std::move(f));
  ++finished_;
  cv_.notify_all();
}

void RequestState::on_abort(AbortReason reason, const std::string& message) {
  std::lock_guard lk(mu_);
  StreamEvent e;
  e.kind = StreamEvent::Kind::Abort;
  e.abort = reason;
  e.message = message;
  abort_ = e;
  events_.push_back(std::move(e));
  cv_.notify_all();
}

bool RequestState::wait(std::vector<StreamEvent>& out, std::chrono::milliseconds timeout, bool wait_scheduled) {
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return !events_.empty() || (wait_scheduled && scheduled_); });
  const bool any = !events_.empty() || (wait_scheduled && scheduled_);
  while (!events_.empty()) {
    out.push_back(std::move(events_.front()));
    events_.pop_front();
  }
  return any;
}

bool RequestState::scheduled() const {
  std::lock_guard lk(mu_);
  return scheduled_;
}

bool RequestState::all_finished() const {
  std::lock_guard lk(mu_);
  return finished_ >= static_cast<int>(outputs_.size());
}

std::optional<StreamEvent> RequestState::abort_event() const {
  std::lock_guard lk(mu_);
  return abort_;
}

}  // namespace latent::server
