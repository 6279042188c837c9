// Work that must run when the current backward pass ends, and must be known not to have run
// when an exception ended that pass instead: the gradient reducer closes its round there, the
// stage-3 unit store releases what backward left gathered.
#pragma once

#include <atomic>
#include <memory>
#include <utility>

#include <torch/csrc/autograd/engine.h>

namespace accelerate::distributed {

/// Queues `(owner->*finish)()` to run when the backward pass now running ends, on its thread,
/// before backward() returns (autograd's queue_callback). Autograd destroys the callbacks of a
/// backward that an exception ends without running them: then `owner->*abandoned` is raised,
/// so the owner's next use can clean up what that pass left. Nothing runs once `owner` is gone.
/// Call it from inside backward (a gradient hook).
template <class Owner>
void at_end_of_backward(std::weak_ptr<Owner> owner, void (Owner::*finish)(), std::atomic<bool> Owner::*abandoned) {
  // Owned by the callback: destroyed unrun, it raises the flag.
  struct Pending {
    Pending(std::weak_ptr<Owner> held, std::atomic<bool> Owner::*flag) : owner(std::move(held)), abandoned(flag) {}
    Pending(const Pending&) = delete;
    Pending& operator=(const Pending&) = delete;
    ~Pending() {
      if (ran) return;
      if (auto held = owner.lock()) ((*held).*abandoned).store(true);
    }
    std::weak_ptr<Owner> owner;
    std::atomic<bool> Owner::*abandoned;
    bool ran = false;
  };
  auto pending = std::make_shared<Pending>(std::move(owner), abandoned);
  torch::autograd::Engine::get_default_engine().queue_callback([pending, finish] {
    pending->ran = true;
    if (auto held = pending->owner.lock()) ((*held).*finish)();
  });
}

}  // namespace accelerate::distributed
