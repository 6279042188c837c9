// Must not compile: std::deque has no checkpoint encoding, and the error names the member.
// Twin of hana_member_ok.cpp.
#include <accelerate/accelerator.hpp>
#include <accelerate/checkpoint/reflect.hpp>

#include <deque>
#include <vector>

struct History {
  std::deque<float> history;
};
BOOST_HANA_ADAPT_STRUCT(History, history);

void f(accelerate::Accelerator<>& acc, History& state) { acc.register_for_checkpointing(state); }
