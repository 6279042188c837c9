// Must not compile: a Backend policy whose engine lacks reduce_scatter (and so does not model
// BackendEngine). Twin of backend_engine_ok.cpp.
#include <accelerate/accelerator.hpp>

struct MyBackend {
  static constexpr std::string_view name = "MyBackend";
  static constexpr std::string_view distributed_type = "NO";
  static constexpr bool is_distributed = false;
  static constexpr bool requires_cuda = false;
};

struct MyEngine : accelerate::distributed::LocalEngine {
  using LocalEngine::LocalEngine;
  void reduce_scatter() = delete;  // hides LocalEngine's
};

template <>
struct accelerate::detail::backend_engine<MyBackend> {
  using type = MyEngine;
};

accelerate::Accelerator<MyBackend> acc;
