#include "server/control/rendezvous_service.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace rollpack {

RendezvousService::RendezvousService(RendezvousOptions options) : options_(options) {
  reaper_ = std::thread([this] { Reap(); });
}

RendezvousService::~RendezvousService() {
  std::vector<Waiter> left;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    left.swap(waiters_);
  }
  reaper_.join();
  for (Waiter& w : left) {
    w.reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "rendezvous shutting down"));
  }
}

void RendezvousService::ExpireLocked(absl::Time now) {
  while (!order_.empty()) {
    auto it = entries_.find(order_.front());
    if (it == entries_.end()) {  // replaced or already gone
      order_.pop_front();
      continue;
    }
    if (it->second.expires > now && entries_.size() <= options_.max_keys) break;
    entries_.erase(it);
    order_.pop_front();
  }
}

grpc::ServerUnaryReactor* RendezvousService::ExchangeId(grpc::CallbackServerContext* context,
                                                        const v1::ExchangeIdRequest* request,
                                                        v1::ExchangeIdResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (auth_ != nullptr) {
    if (grpc::Status s = auth_->Check(*context, "/rollpack.v1.Rendezvous/ExchangeId"); !s.ok()) {
      reactor->Finish(s);
      return reactor;
    }
  }
  const std::string& key = request->key();
  if (key.empty() || key.size() > options_.max_key_bytes) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 absl::StrCat("key must have 1 to ", options_.max_key_bytes,
                                              " bytes, got ", key.size())));
    return reactor;
  }
  if (request->wait_ms() < 0) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "wait_ms must be >= 0"));
    return reactor;
  }
  const absl::Time now = absl::Now();
  std::vector<Waiter> ready;
  {
    absl::MutexLock lock(&mu_);
    ExpireLocked(now);
    if (request->post()) {
      if (request->value().size() > options_.max_value_bytes) {
        reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                     absl::StrCat("value has ", request->value().size(),
                                                  " bytes, more than ", options_.max_value_bytes)));
        return reactor;
      }
      auto it = entries_.find(key);
      if (it != entries_.end()) {
        order_.erase(std::find(order_.begin(), order_.end(), key));
      }
      entries_[key] = Entry{request->value(), now + options_.ttl};
      order_.push_back(key);
      ExpireLocked(now);
      response->set_value(request->value());
      // Waiters of this key complete now.
      auto keep = std::partition(waiters_.begin(), waiters_.end(),
                                 [&](const Waiter& w) { return w.key != key; });
      ready.assign(std::make_move_iterator(keep), std::make_move_iterator(waiters_.end()));
      waiters_.erase(keep, waiters_.end());
    } else {
      auto it = entries_.find(key);
      if (it != entries_.end()) {
        response->set_value(it->second.value);
      } else {
        absl::Duration wait = request->wait_ms() == 0 ? options_.default_wait
                                                      : absl::Milliseconds(request->wait_ms());
        wait = std::min(wait, options_.max_wait);
        absl::Time deadline = now + wait;
        const absl::Time call_deadline = absl::FromChrono(context->deadline());
        if (call_deadline < deadline) deadline = call_deadline;
        waiters_.push_back(Waiter{context, reactor, response, key, deadline});
        return reactor;
      }
    }
  }
  for (Waiter& w : ready) {
    w.response->set_value(request->value());
    w.reactor->Finish(grpc::Status::OK);
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

void RendezvousService::Reap() {
  while (true) {
    std::vector<std::pair<Waiter, grpc::Status>> done;
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(20))) return;
      const absl::Time now = absl::Now();
      auto keep = std::partition(waiters_.begin(), waiters_.end(), [&](const Waiter& w) {
        return !(w.context->IsCancelled() || now >= w.deadline);
      });
      for (auto it = keep; it != waiters_.end(); ++it) {
        grpc::Status status =
            it->context->IsCancelled()
                ? grpc::Status(grpc::StatusCode::CANCELLED, "cancelled while waiting")
                : grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                               absl::StrCat("no value was posted under \"", it->key,
                                            "\" in time"));
        done.emplace_back(std::move(*it), std::move(status));
      }
      waiters_.erase(keep, waiters_.end());
    }
    for (auto& [w, status] : done) w.reactor->Finish(status);
  }
}

}  // namespace rollpack
