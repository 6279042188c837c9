// Must compile: tensor collectives on tensors, object collectives on other values. Twin of
// collective_leaf_fail.cpp.
#include <accelerate/accelerate.hpp>

void collect(accelerate::Accelerator<accelerate::Gloo>& acc, const at::Tensor& t) {
  auto total = acc.reduce(std::vector<at::Tensor>{t});
  auto all = acc.gather(std::map<std::string, at::Tensor>{{"t", t}});
  auto numbers = acc.gather_object(std::vector<double>{1.0, 2.0});
  auto name = acc.broadcast_object(std::string("rank"));
}
