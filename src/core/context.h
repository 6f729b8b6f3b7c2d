// One opened device context: the owner of the async event queue. Everything a context creates
// reaches the shared process-wide HCA through it.
#pragma once

#include <infiniband/verbs.h>

#include <memory>

#include "core/event_queue.h"

namespace softrdma::core {

class Hca;

class Context {
 public:
  explicit Context(std::shared_ptr<Hca> hca) : hca_(std::move(hca)) {}
  Hca& hca() const { return *hca_; }
  const std::shared_ptr<Hca>& hca_ptr() const { return hca_; }
  EventQueue<ibv_async_event>& async_events() { return async_; }
  void RaiseAsync(const ibv_async_event& e) { async_.Push(e); }

 private:
  std::shared_ptr<Hca> hca_;
  EventQueue<ibv_async_event> async_;
};

}  // namespace softrdma::core
