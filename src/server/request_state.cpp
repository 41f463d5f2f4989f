#include "server/request_state.h"

#include <utility>

namespace latent::server {

RequestState::RequestState(std::vector<OutputConfig> choices) {
  outputs_.reserve(choices.size());
  for (auto& c : choices) outputs_.emplace_back(std::move(c));
  unreported_.assign(outputs_.size(), 0);
}

void RequestState::notify() {
  std::function<void()> f;
  {
    std::lock_guard lk(mu_);
    f = notify_;
  }
  if (f) f();
}

void RequestState::set_notify(std::function<void()> f) {
  std::lock_guard lk(mu_);
  notify_ = std::move(f);
}

void RequestState::on_scheduled() {
  {
    std::lock_guard lk(mu_);
    scheduled_ = true;
    cv_.notify_all();
  }
  notify();
}

bool RequestState::on_token(int choice, const SampleResult& s, bool stop_token) {
  ChoiceDelta d;
  // outputs_ is touched only by the scheduler thread until all choices finished.
  const bool stop = outputs_.at(static_cast<size_t>(choice)).push(s, stop_token, d);
  generated_.fetch_add(1);
  int64_t& unreported = unreported_[static_cast<size_t>(choice)];
  ++unreported;
  bool news = false;
  {
    std::lock_guard lk(mu_);
    if (!first_token_) first_token_ = Clock::now();
    if (d.has_output() || !d.logprobs.empty()) {
      StreamEvent e;
      e.kind = StreamEvent::Kind::Delta;
      e.choice = choice;
      e.delta = std::move(d);
      e.tokens = std::exchange(unreported, 0);
      events_.push_back(std::move(e));
      cv_.notify_all();
      news = true;
    }
  }
  if (news) notify();
  return stop;
}

void RequestState::on_prompt_logprobs(int first_choice, int n, std::vector<SampleResult> entries) {
  bool news = false;
  for (int c = first_choice; c < first_choice + n && c < static_cast<int>(outputs_.size()); ++c) {
    ChoiceDelta d;
    outputs_.at(static_cast<size_t>(c)).echo(entries, d);
    if (!d.has_output() && d.logprobs.empty()) continue;
    std::lock_guard lk(mu_);
    StreamEvent e;
    e.kind = StreamEvent::Kind::Delta;
    e.choice = c;
    e.delta = std::move(d);
    events_.push_back(std::move(e));
    cv_.notify_all();
    news = true;
  }
  if (news) notify();
}

void RequestState::on_finish(int choice, FinishReason reason) {
  ChoiceDelta d;
  const std::string why = outputs_.at(static_cast<size_t>(choice)).finish(reason, d);
  int64_t& unreported = unreported_.at(static_cast<size_t>(choice));
  {
    std::lock_guard lk(mu_);
    if (d.has_output() || !d.logprobs.empty()) {
      StreamEvent e;
      e.kind = StreamEvent::Kind::Delta;
      e.choice = choice;
      e.delta = std::move(d);
      e.tokens = std::exchange(unreported, 0);
      events_.push_back(std::move(e));
    }
    StreamEvent f;
    f.kind = StreamEvent::Kind::Finish;
    f.choice = choice;
    f.finish_reason = why;
    f.tokens = std::exchange(unreported, 0);
    events_.push_back(std::move(f));
    ++finished_;
    cv_.notify_all();
  }
  notify();
}

void RequestState::on_abort(AbortReason reason, const std::string& message) {
  {
    std::lock_guard lk(mu_);
    StreamEvent e;
    e.kind = StreamEvent::Kind::Abort;
    e.abort = reason;
    e.message = message;
    abort_ = e;
    events_.push_back(std::move(e));
    cv_.notify_all();
  }
  notify();
}

void RequestState::take(std::vector<StreamEvent>& out) {
  std::lock_guard lk(mu_);
  while (!events_.empty()) {
    out.push_back(std::move(events_.front()));
    events_.pop_front();
  }
}

size_t RequestState::backlog() const {
  std::lock_guard lk(mu_);
  return events_.size();
}

std::optional<Clock::time_point> RequestState::first_token_time() const {
  std::lock_guard lk(mu_);
  return first_token_;
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
