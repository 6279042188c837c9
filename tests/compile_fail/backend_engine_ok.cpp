// Compiles: a Backend policy of one's own whose engine models BackendEngine (here it reuses the
// one-process engine). Twin of backend_engine_fail.cpp.
#include <accelerate/accelerator.hpp>

struct MyBackend {
  static constexpr std::string_view name = "MyBackend";
  static constexpr std::string_view distributed_type = "NO";
  static constexpr bool is_distributed = false;
  static constexpr bool requires_cuda = false;
};

struct MyEngine : accelerate::distributed::LocalEngine {
  using LocalEngine::LocalEngine;
};

template <>
struct accelerate::detail::backend_engine<MyBackend> {
  using type = MyEngine;
};

accelerate::Accelerator<MyBackend> acc;
