// bench_optimizer: one optimizer step on a model of 150 parameter tensors (75 Linear layers of
// 256 x 256 and their biases: 4.9 M parameters), by how the step is computed, side by side in
// rounds so that every variant sees the same machine state:
//   torch_adamw        torch::optim::AdamW: about eight kernels per parameter
//   fused_adamw        accelerate::FusedAdamW: one fused kernel per device and dtype
//   fused_adamw_bf16   FusedAdamW with its moments kept in bf16 (computed in fp32, 16 M at a time)
//   torch_adamw_fp16   GradScaler unscale pass, then torch::optim::AdamW (Fp16's step before)
//   fused_adamw_fp16   GradScaler inf/NaN check, the scale divided inside FusedAdamW's kernel
// Prints one JSON line per variant and round, then a table: median milliseconds per step, the
// speed-up over torch::optim per round (median, min-max) and the bytes of the moments.
//
//   bench_optimizer [--rounds R] [--steps N]
#include <accelerate/accelerate.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace {

constexpr int kLayers = 75;
constexpr int64_t kWidth = 256;

std::vector<at::Tensor> make_parameters() {
  torch::manual_seed(0);
  std::vector<at::Tensor> params;
  for (int l = 0; l < kLayers; ++l) {
    params.push_back((torch::randn({kWidth, kWidth}) * 0.02).requires_grad_());
    params.push_back(torch::zeros({kWidth}).requires_grad_());
  }
  for (auto& p : params) p.mutable_grad() = torch::randn_like(p) * 1e-3;
  return params;
}

int64_t state_bytes(torch::optim::Optimizer& optimizer) {
  int64_t bytes = 0;
  for (const auto& [key, state] : optimizer.state()) {
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*state);
    bytes += s.exp_avg().nbytes() + s.exp_avg_sq().nbytes();
  }
  return bytes;
}

struct Variant {
  std::string name;
  std::vector<at::Tensor> params;
  std::vector<at::Tensor> clean_grads;  // what an fp16 step's scaled gradients are made from
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::function<void()> step;
  std::vector<double> ms;
};

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5, steps = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--rounds") rounds = std::stoi(argv[i + 1]);
    else if (flag == "--steps") steps = std::stoi(argv[i + 1]);
  }
  const auto options = torch::optim::AdamWOptions(1e-4).weight_decay(0.1);
  const accelerate::GradScaler scaler({.init_scale = 1024.0}, at::kCPU);
  std::vector<std::unique_ptr<Variant>> variants;
  const auto add = [&](std::string name, auto make, auto step) {
    auto v = std::make_unique<Variant>();
    v->name = std::move(name);
    v->params = make_parameters();
    for (const auto& p : v->params) v->clean_grads.push_back(p.grad().clone());
    v->optimizer = make(v->params);
    Variant* raw = v.get();
    v->step = [raw, step] { step(*raw); };
    variants.push_back(std::move(v));
  };
  const auto plain = [](Variant& v) { v.optimizer->step(); };
  add("torch_adamw", [&](auto& p) { return std::make_unique<torch::optim::AdamW>(p, options); }, plain);
  add("fused_adamw", [&](auto& p) { return std::make_unique<accelerate::FusedAdamW>(p, options); }, plain);
  add("fused_adamw_bf16",
      [&](auto& p) { return std::make_unique<accelerate::FusedAdamW>(p, options, accelerate::FusedAdamOptions{.moments_dtype = at::kBFloat16}); },
      plain);
  // Fp16: before each step (untimed) the gradients are set to the clean ones times the scale,
  // as a scaled backward leaves them.
  add("torch_adamw_fp16", [&](auto& p) { return std::make_unique<torch::optim::AdamW>(p, options); },
      [&scaler](Variant& v) {
        accelerate::OptimizerAmpState amp;
        scaler.unscale_(v.params, amp);
        if (amp.found_inf.item<float>() == 0) v.optimizer->step();
      });
  add("fused_adamw_fp16", [&](auto& p) { return std::make_unique<accelerate::FusedAdamW>(p, options); },
      [&scaler](Variant& v) {
        accelerate::OptimizerAmpState amp;
        scaler.check_(v.params, amp);
        if (amp.found_inf.item<float>() == 0) {
          static_cast<accelerate::FusedAdamW&>(*v.optimizer).unscale_in_next_step(scaler.scale_tensor());
          v.optimizer->step();
        }
      });
  for (auto& v : variants) v->step();  // warm-up, and the moments exist
  for (int r = 0; r < rounds; ++r)
    for (auto& v : variants) {
      const bool fp16 = v->name.ends_with("_fp16");
      double total = 0;
      for (int s = 0; s < steps; ++s) {
        if (fp16) {
          torch::NoGradGuard no_grad;
          for (std::size_t i = 0; i < v->params.size(); ++i)
            v->params[i].mutable_grad().copy_(v->clean_grads[i]).mul_(1024.0);
        }
        const auto start = std::chrono::steady_clock::now();
        v->step();
        total += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      }
      v->ms.push_back(total / steps);
      std::cout << R"({"variant": ")" << v->name << R"(", "round": )" << r << R"(, "ms_per_step": )" << v->ms.back()
                << "}\n";
    }
  const auto median = [](std::vector<double> xs) {
    std::sort(xs.begin(), xs.end());
    return xs[xs.size() / 2];
  };
  // Speed-ups are taken round by round against the same round's torch::optim step (the fp16
  // variants against torch_adamw_fp16), then summarised as median (min-max).
  std::cout << "\n| variant | ms per step (median) | speed-up, median (min-max) | moment bytes |\n|---|---|---|---|\n";
  for (auto& v : variants) {
    const Variant& base = *variants[v->name.ends_with("_fp16") ? 3 : 0];
    std::vector<double> ratios;
    for (int r = 0; r < rounds; ++r) ratios.push_back(base.ms[r] / v->ms[r]);
    std::printf("| %s | %.3f | %.2f (%.2f-%.2f) | %lld |\n", v->name.c_str(), median(v->ms), median(ratios),
                *std::min_element(ratios.begin(), ratios.end()), *std::max_element(ratios.begin(), ratios.end()),
                static_cast<long long>(state_bytes(*v->optimizer)));
  }
  std::cout << "(" << kLayers * 2 << " tensors, " << at::get_num_threads() << " intra-op threads)\n";
  return 0;
}
