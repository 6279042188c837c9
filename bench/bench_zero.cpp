// Model-state memory, communication and step time of data parallel against ZeRO stages 1, 2 and
// 3 (Zero<Gloo, 1|2|3>) with AdamW in fp32. Each rank counts the bytes its tensors hold between
// steps — parameters (stage 3: its slices), gradients (distinct storages behind the model's and
// the optimizer's .grad), optimizer state — its peak RSS (which also holds the reducer's bucket
// buffers and stage 3's gathered units), and the communication time per step, all of it and
// the part the training thread waited for; with --save-model, what save_model (shards of 100 MB)
// adds to the rank's resident memory at its peak, and what gathering the whole model
// (get_state_dict, as stage 3's save_model did before it streamed) adds; it prints one JSON line.
//   bench_zero --nproc W --backend ddp|zero1|zero2|zero3 [--params-millions 100] [--steps 4]
//              [--save-model DIR] [--phases 1] [--retain-freed-memory 0|1] [--bias 0|1]
//              [--prefetch-units 0|1] [--buckets-in-flight N] [--huge-pages 0|1] [--build-units 0|1]
//              [--reduce-scatter all-to-all|c10d]
// --huge-pages: AcceleratorOptions::huge_pages (default 1; THP_MEM_ALLOC_ENABLE, when set, wins);
// the JSON's "huge_pages" says what LibTorch did.
// --bias 0: layers without biases (as in most large transformers), so each weight is a bucket
// of its own and the sharded stages send its gradient without copying it into a bucket.
// --phases 1: in the last step, what forward, backward and the optimizer step each add to the
// resident memory at their peak, the peak of the earlier steps, and before them the resident
// memory with the model built, the peak while it was built, and the peak of prepare.
// --build-units 1 (zero3): each layer passed through Accelerator::shard_unit as it is built, so
// no rank holds the whole model.
// --reduce-scatter c10d: Gloo's reduce-scatter as c10d makes it (an all-reduce of a copy) instead
// of an all-to-all (ProcessGroupOptions::reduce_scatter_all_to_all = false).
// bench/zero.sh runs the variants in rotation and writes the table in bench/README.md.
#include <accelerate/accelerate.hpp>
#include <accelerate/distributed/sharded.hpp>

#include <torch/torch.h>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

struct Args {
  std::string backend = "ddp";
  double params_millions = 100;
  int steps = 4;
  std::string save_model;  // a folder: measure save_model's memory
  bool phases = false;
  std::optional<bool> retain_freed_memory;  // AcceleratorOptions::retain_freed_memory (unset: the backend's)
  bool bias = true;
  bool prefetch_units = true;         // DdpOptions::prefetch_units
  std::size_t buckets_in_flight = 2;  // DdpOptions::sharded_buckets_in_flight
  bool huge_pages = true;             // AcceleratorOptions::huge_pages
  bool build_units = false;           // zero3: Accelerator::shard_unit on each layer as built
  bool reduce_scatter_all_to_all = true;  // ProcessGroupOptions::reduce_scatter_all_to_all
};

// A line of /proc/self/status ("VmRSS:", "VmHWM:") in bytes.
std::int64_t status_bytes(const std::string& key) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size())) * 1024;
  return -1;
}

// Starts the resident-memory high-water mark (VmHWM) again from the current resident memory
// (Linux: "5" to /proc/self/clear_refs). Resets getrusage's maxrss too: read that before.
void reset_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }

// What running `fn` added to resident memory at its peak (the high-water mark is reset first).
template <class Fn>
std::int64_t peak_added_by(Fn&& fn) {
  reset_peak();
  const auto before = status_bytes("VmRSS:");
  fn();
  return status_bytes("VmHWM:") - before;
}

// Square layers whose parameters add up to about the requested count.
constexpr int64_t kLayers = 10;
int64_t layer_width(double millions) {
  return static_cast<int64_t>(std::sqrt(millions * 1e6 / static_cast<double>(kLayers)));
}

// Ten width x width Linears with ReLUs between; `cut` sees each Linear as it is built.
template <class Cut>
torch::nn::Sequential make_model(double millions, bool bias, Cut cut) {
  const int64_t width = layer_width(millions);
  torch::nn::Sequential net;
  for (int64_t i = 0; i < kLayers; ++i) {
    net->push_back(cut(torch::nn::Linear(torch::nn::LinearOptions(width, width).bias(bias))));
    if (i + 1 < kLayers) net->push_back(torch::nn::ReLU());
  }
  return net;
}

std::uint64_t bytes_of(const at::Tensor& t) { return static_cast<std::uint64_t>(t.numel()) * t.element_size(); }

// Bytes of the distinct storages behind `tensors` (views of one buffer count once).
std::uint64_t storage_bytes(const std::vector<at::Tensor>& tensors) {
  std::set<const void*> seen;
  std::uint64_t total = 0;
  for (const auto& t : tensors)
    if (t.defined() && seen.insert(t.storage().data()).second) total += t.storage().nbytes();
  return total;
}

template <class Backend>
int run(const Args& a) {
  accelerate::Accelerator<Backend> acc{{.seed = 1,
                                        .retain_freed_memory = a.retain_freed_memory,
                                        .huge_pages = a.huge_pages,
                                        .process_group = {.timeout = std::chrono::minutes(10),
                                                          .reduce_scatter_all_to_all = a.reduce_scatter_all_to_all},
                                        .ddp = {.prefetch_units = a.prefetch_units,
                                                .sharded_buckets_in_flight = a.buckets_in_flight}}};
  auto net = make_model(a.params_millions, a.bias, [&](torch::nn::Linear layer) {
    if constexpr (requires { acc.shard_unit(layer); })
      if (a.build_units) return acc.shard_unit(layer);
    return layer;
  });
  const int64_t width = layer_width(a.params_millions);
  const std::uint64_t params = static_cast<std::uint64_t>(kLayers * (width * width + (a.bias ? width : 0))) * 4;  // the whole model's
  torch::optim::AdamW adamw(net->parameters(), torch::optim::AdamWOptions(1e-4));
  nlohmann::json phases = nlohmann::json::object();
  std::int64_t peak_seen = 0;  // --phases resets the high-water mark: the peak before each reset
  if (a.phases) {
    phases["resident_built_bytes"] = status_bytes("VmRSS:");  // LibTorch and the model as built
    phases["build_peak_bytes"] = status_bytes("VmHWM:");      // LibTorch's start, the Accelerator, the build
    reset_peak();
  }
  auto [model, opt] = acc.prepare(net, adamw);
  if (a.phases) {  // prepare's own peak; the high-water mark starts again for the steps
    peak_seen = status_bytes("VmHWM:");
    phases["prepare_peak_bytes"] = peak_seen;
    reset_peak();
  }
  std::uint64_t held = params;  // what this rank keeps between steps: stage 3, its slices
  if constexpr (requires { Backend::stage; }) {
    if (Backend::stage == 3) {
      std::vector<at::Tensor> slices;
      for (const auto& group : opt.param_groups())
        for (const auto& slice : group.params()) slices.push_back(slice);
      held = storage_bytes(slices);
    }
  }

  std::uint64_t grads = 0, state = 0, comm_bytes = 0;
  std::vector<double> step_ms;
  accelerate::CommStats before = acc.stats();
  std::int64_t phase_start = 0;
  auto phase = [&](const char* name) {  // ends a phase of the measured step, starts the next
    const auto peak = status_bytes("VmHWM:");
    peak_seen = std::max(peak_seen, peak);
    if (name != nullptr) phases[name] = peak - phase_start;
    reset_peak();
    phase_start = status_bytes("VmRSS:");
  };
  for (int step = 0; step < a.steps; ++step) {
    const auto x = torch::randn({8, width}), y = torch::randn({8, width});
    const bool measured = a.phases && step == a.steps - 1;
    if (measured) {
      phases["peak_earlier_steps_bytes"] = status_bytes("VmHWM:");
      phase(nullptr);
      phases["resident_between_steps_bytes"] = phase_start;
    }
    const auto start = std::chrono::steady_clock::now();
    auto output = model(x);
    if (measured) phase("forward_added_bytes");
    acc.backward(torch::mse_loss(output, y));
    if (measured) phase("backward_added_bytes");
    if (step == a.steps - 1) {
      std::vector<at::Tensor> all;
      for (const auto& p : net->parameters()) all.push_back(p.grad());
      for (const auto& group : opt.param_groups())
        for (const auto& slice : group.params()) all.push_back(slice.grad());
      grads = storage_bytes(all);
    }
    opt.step();
    if (measured) phase("step_added_bytes");
    opt.zero_grad();
    step_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    if (step == 0) before = acc.stats();  // per-step traffic from the second step on
  }
  for (const auto& group : opt.param_groups())
    for (const auto& slice : group.params()) {
      const auto found = adamw.state().find(slice.unsafeGetTensorImpl());
      if (found == adamw.state().end()) continue;
      const auto& s = static_cast<const torch::optim::AdamWParamState&>(*found->second);
      state += bytes_of(s.exp_avg()) + bytes_of(s.exp_avg_sq());
    }
  const auto after = acc.stats();
  const auto comm_time = after.time - before.time;
  comm_bytes = (after.allreduce.bytes - before.allreduce.bytes) + (after.reduce_scatter.bytes - before.reduce_scatter.bytes) +
               (after.allgather.bytes - before.allgather.bytes) + (after.broadcast.bytes - before.broadcast.bytes);
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  std::sort(step_ms.begin() + 1, step_ms.end());
  nlohmann::json line = {{"backend", a.backend},
                         {"world_size", acc.num_processes()},
                         {"rank", acc.process_index()},
                         {"huge_pages", accelerate::compat::cpu_huge_pages().value_or(false)},
                         {"parameters", params / 4},
                         {"param_bytes", held},
                         {"grad_bytes", grads},
                         {"optimizer_bytes", state},
                         {"comm_bytes_per_step", comm_bytes / static_cast<std::uint64_t>(std::max(1, a.steps - 1))},
                         {"median_step_ms", step_ms[1 + (step_ms.size() - 1) / 2]},
                         {"comm_ms_per_step", 1e3 * comm_time.busy_seconds / std::max(1, a.steps - 1)},
                         {"exposed_comm_ms_per_step", 1e3 * comm_time.exposed_seconds / std::max(1, a.steps - 1)},
                         {"peak_rss_bytes", std::max<std::uint64_t>(static_cast<std::uint64_t>(usage.ru_maxrss) * 1024,
                                                                     static_cast<std::uint64_t>(peak_seen))}};
  line["bias"] = a.bias;
  line["build_units"] = a.build_units;
  line["prefetch_units"] = a.prefetch_units;
  line["buckets_in_flight"] = a.buckets_in_flight;
  line["reduce_scatter"] = a.reduce_scatter_all_to_all ? "all-to-all" : "c10d";
  if (const auto* reducer = model.model_sync().reducer()) line["adopted_gradients"] = reducer->adopted_gradients();
  if (a.phases) line["phases"] = phases;
  if (!a.save_model.empty()) {
    line["save_model_added_bytes"] =
        peak_added_by([&] { acc.save_model(model, a.save_model, {.max_shard_size = std::string("100MB")}); });
    line["gather_whole_added_bytes"] = peak_added_by([&] { (void)acc.get_state_dict(model); });
  }
  std::cout << line.dump() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return accelerate::launch(argc, argv, [](int argc, char** argv) {
    Args a;
    for (int i = 1; i + 1 < argc; i += 2) {
      if (std::strcmp(argv[i], "--backend") == 0) a.backend = argv[i + 1];
      else if (std::strcmp(argv[i], "--params-millions") == 0) a.params_millions = std::stod(argv[i + 1]);
      else if (std::strcmp(argv[i], "--steps") == 0) a.steps = std::stoi(argv[i + 1]);
      else if (std::strcmp(argv[i], "--save-model") == 0) a.save_model = argv[i + 1];
      else if (std::strcmp(argv[i], "--phases") == 0) a.phases = std::string(argv[i + 1]) == "1";
      else if (std::strcmp(argv[i], "--retain-freed-memory") == 0) a.retain_freed_memory = std::string(argv[i + 1]) == "1";
      else if (std::strcmp(argv[i], "--bias") == 0) a.bias = std::string(argv[i + 1]) == "1";
      else if (std::strcmp(argv[i], "--prefetch-units") == 0) a.prefetch_units = std::string(argv[i + 1]) == "1";
      else if (std::strcmp(argv[i], "--buckets-in-flight") == 0) a.buckets_in_flight = std::stoul(argv[i + 1]);
      else if (std::strcmp(argv[i], "--huge-pages") == 0) a.huge_pages = std::string(argv[i + 1]) == "1";
      else if (std::strcmp(argv[i], "--build-units") == 0) a.build_units = std::string(argv[i + 1]) == "1";
      else if (std::strcmp(argv[i], "--reduce-scatter") == 0) a.reduce_scatter_all_to_all = std::string(argv[i + 1]) != "c10d";
    }
    if (a.backend == "zero1") return run<accelerate::Zero<accelerate::Gloo, 1>>(a);
    if (a.backend == "zero2") return run<accelerate::Zero<accelerate::Gloo, 2>>(a);
    if (a.backend == "zero3") return run<accelerate::Zero<accelerate::Gloo, 3>>(a);
    return run<accelerate::Gloo>(a);
  });
}
