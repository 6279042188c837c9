// Compiles: every member of the registered struct has a checkpoint encoding. Twin of
// hana_member_fail.cpp.
#include <accelerate/accelerator.hpp>
#include <accelerate/checkpoint/reflect.hpp>

#include <deque>
#include <vector>

struct History {
  std::vector<float> history;
};
BOOST_HANA_ADAPT_STRUCT(History, history);

void f(accelerate::Accelerator<>& acc, History& state) { acc.register_for_checkpointing(state); }
