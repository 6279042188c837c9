// A GPT-style language model trained with accelerate-cpp: a decoder-only transformer written
// with LibTorch modules, a byte-level tokenizer, and a text corpus from Debian's `fortunes`
// package. The training loop is written once; the flags choose the Backend (one process, data
// parallel, ZeRO 1-3 with each block a unit), the precision, accumulation and activation
// checkpointing. The last line printed is one JSON object describing the run.
// docs/gpt.md walks through it.
#include <accelerate/accelerate.hpp>
#include <accelerate/checkpoint/safetensors.hpp>  // --dump: the batches a parity check replays
#include <accelerate/distributed/sharded.hpp>     // Zero<Gloo, N> (--zero N)

#include <sys/resource.h>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "flag_values.hpp"

namespace {

// --- the model -----------------------------------------------------------------------------

struct GptConfig {
  int64_t vocab_size = 256;  // bytes
  int64_t block_size = 128;  // tokens of context
  int64_t layers = 4;
  int64_t heads = 4;
  int64_t embd = 128;
  double dropout = 0.0;
};

/// Multi-head causal self-attention through ATen's fused scaled_dot_product_attention.
struct CausalSelfAttentionImpl : torch::nn::Module {
  explicit CausalSelfAttentionImpl(const GptConfig& c)
      : qkv(register_module("qkv", torch::nn::Linear(c.embd, 3 * c.embd))),
        proj(register_module("proj", torch::nn::Linear(c.embd, c.embd))),
        heads(c.heads),
        dropout(c.dropout) {}

  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
    auto split = qkv(x).split(C, 2);
    auto to_heads = [&](const torch::Tensor& t) { return t.view({B, T, heads, C / heads}).transpose(1, 2); };
    auto y = at::scaled_dot_product_attention(to_heads(split[0]), to_heads(split[1]), to_heads(split[2]),
                                              /*attn_mask=*/{}, is_training() ? dropout : 0.0, /*is_causal=*/true);
    y = proj(y.transpose(1, 2).contiguous().view({B, T, C}));
    return torch::dropout(y, dropout, is_training());
  }

  torch::nn::Linear qkv, proj;
  int64_t heads;
  double dropout;
};
TORCH_MODULE(CausalSelfAttention);

/// A pre-LayerNorm transformer block: attention, then a 4x MLP, each added to the residual.
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(const GptConfig& c)
      : ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.embd})))),
        attn(register_module("attn", CausalSelfAttention(c))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.embd})))),
        fc(register_module("fc", torch::nn::Linear(c.embd, 4 * c.embd))),
        proj(register_module("proj", torch::nn::Linear(4 * c.embd, c.embd))),
        dropout(c.dropout) {}

  torch::Tensor forward(torch::Tensor x) {
    x = x + attn(ln1(x));
    return x + torch::dropout(proj(torch::gelu(fc(ln2(x)))), dropout, is_training());
  }

  torch::nn::LayerNorm ln1;
  CausalSelfAttention attn;
  torch::nn::LayerNorm ln2;
  torch::nn::Linear fc, proj;
  double dropout;
};
TORCH_MODULE(Block);

/// Token and position embeddings, `layers` blocks, a final LayerNorm and an output head tied
/// to the token embedding (logits = h · wteᵀ), as GPT-2.
struct GptImpl : torch::nn::Module {
  explicit GptImpl(const GptConfig& c)
      : config(c),
        wte(register_module("wte", torch::nn::Embedding(c.vocab_size, c.embd))),
        wpe(register_module("wpe", torch::nn::Embedding(c.block_size, c.embd))),
        blocks(register_module("blocks", torch::nn::ModuleList())),
        ln_f(register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.embd})))) {
    for (int64_t i = 0; i < c.layers; ++i) {
      layers.emplace_back(c);
      blocks->push_back(layers.back());
    }
    // GPT-2's initialisation: N(0, 0.02), zero biases, the residual projections scaled down
    // by sqrt(2 * layers) so the residual stream's variance does not grow with depth.
    torch::NoGradGuard no_grad;
    for (auto& item : named_parameters()) {
      const std::string& name = item.key();
      auto& p = item.value();
      if (name.ends_with(".bias")) p.zero_();
      else if (name.find("ln") != std::string::npos) p.fill_(1.0);
      else if (name.ends_with("proj.weight")) p.normal_(0.0, 0.02 / std::sqrt(2.0 * static_cast<double>(c.layers)));
      else p.normal_(0.0, 0.02);
    }
  }

  /// Logits [B, T, vocab] of token ids [B, T]. Each block runs as a ZeRO-3 unit when the
  /// model is prepared by Zero<_, 3> with the blocks listed as units (a plain call otherwise),
  /// and recomputed in backward when `checkpoint_activations`.
  torch::Tensor forward(const torch::Tensor& idx) {
    const int64_t T = idx.size(1);
    auto x = torch::dropout(wte(idx) + wpe(torch::arange(T, idx.options())), config.dropout, is_training());
    for (auto& block : layers)
      x = checkpoint_activations && is_training() ? accelerate::activation_checkpoint(block, x)
                                                  : accelerate::unit_forward(block, x);
    return torch::linear(ln_f(x), wte->weight);
  }

  GptConfig config;
  torch::nn::Embedding wte, wpe;
  torch::nn::ModuleList blocks;
  std::vector<Block> layers;
  torch::nn::LayerNorm ln_f;
  bool checkpoint_activations = false;
};
TORCH_MODULE(Gpt);

/// The blocks' names in named_modules(), in forward order: the ZeRO-3 units.
std::vector<std::string> unit_names(const GptConfig& c) {
  std::vector<std::string> names;
  for (int64_t i = 0; i < c.layers; ++i) names.push_back("blocks." + std::to_string(i));
  return names;
}

// --- the data --------------------------------------------------------------------------------

/// The text of `path`: a file, or every regular file of a directory in name order (fortune's
/// index files and links left out). Fortune files separate entries by lines of "%", which
/// become blank lines.
std::string read_corpus(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  if (fs::is_directory(path)) {
    for (const auto& entry : fs::directory_iterator(path))
      if (entry.is_regular_file() && !entry.is_symlink() && entry.path().extension() != ".dat")
        files.push_back(entry.path());
    std::sort(files.begin(), files.end());
  } else if (fs::is_regular_file(path)) {
    files.push_back(path);
  }
  ACCELERATE_CHECK(!files.empty(), "gpt: no text at ", path.string(),
                   " (install Debian's `fortunes` package, or pass --data FILE|DIR)");
  std::string text;
  for (const auto& file : files) {
    std::ifstream in(file, std::ios::binary);
    for (std::string line; std::getline(in, line);) text += line == "%" ? "\n" : line + "\n";
  }
  return text;
}

/// The corpus as bytes, cut into a training part (the first 90 %) and a held-out part.
struct Corpus {
  torch::Tensor train, validation;  // int64 token ids

  Corpus(const std::filesystem::path& path, int64_t block_size) {
    const std::string text = read_corpus(path);
    auto bytes = torch::from_blob(const_cast<char*>(text.data()), {static_cast<int64_t>(text.size())}, torch::kUInt8)
                     .to(torch::kLong);
    const int64_t cut = bytes.size(0) * 9 / 10;
    train = bytes.narrow(0, 0, cut);
    validation = bytes.narrow(0, cut, bytes.size(0) - cut);
    ACCELERATE_CHECK(validation.size(0) > 2 * block_size, "gpt: the corpus ", path.string(), " has ", bytes.size(0),
                     " bytes; --block-size ", block_size, " needs more than ", 20 * block_size);
  }

  /// Consecutive windows of `block_size` tokens and, as targets, the same windows one token on.
  static accelerate::data::TensorDataset windows(const torch::Tensor& tokens, int64_t block_size) {
    const int64_t n = (tokens.size(0) - 1) / block_size;
    return {tokens.narrow(0, 0, n * block_size).view({n, block_size}),
            tokens.narrow(0, 1, n * block_size).view({n, block_size})};
  }

  /// The cross-entropy of the held-out targets under the training bytes' frequencies (add-one
  /// smoothed): what a model that ignores context reaches.
  double unigram_loss(int64_t block_size) const {
    auto counts = torch::bincount(train, {}, 256).to(torch::kDouble) + 1.0;
    auto log_p = (counts / counts.sum()).log();
    auto targets = windows(validation, block_size).targets().flatten();
    return -log_p.index_select(0, targets).mean().item<double>();
  }
};

// --- flags -------------------------------------------------------------------------------------

struct Args {
  std::string data = "/usr/share/games/fortunes";
  GptConfig model;
  std::size_t batch_size = 16;
  int64_t steps = 300;  // optimizer steps of the whole run
  int64_t warmup = -1;  // steps of linear warm-up (-1: a tenth of --steps)
  double lr = 2e-3;
  double min_lr_ratio = 0.1;
  double weight_decay = 0.1;
  double clip_norm = 1.0;  // 0: no clipping (the norm is still measured)
  std::uint64_t seed = 1337;
  int zero_stage = 0;
  bool checkpoint_activations = false;
  std::size_t workers = 0;
  std::optional<bool> retain_freed_memory;  // unset: the Backend's choice (kept, except under ZeRO)
  std::string project_dir;  // checkpoints here; the final model in <dir>/model
  bool resume = false;
  bool allow_world_size_change = false;  // --resume on another number of ranks (state re-cut, epoch re-dealt)
  int64_t save_every = 0;  // save_state every N optimizer steps (0: at the end only)
  std::vector<std::string> log_with;
  bool progress = true;
  int64_t log_every = 0;  // print "step N loss X" every N optimizer steps (0: never)
  std::size_t eval_batches = 0;  // 0: the whole held-out split
  std::string prompt = "The ";
  int64_t sample_tokens = 200;
  std::string dump;  // one process: initial weights, batches, losses and the model, for a parity check
  accelerate::RunConfig run;
};

[[noreturn]] void usage(const std::string& problem) {
  std::cerr << "gpt: " << problem << "\n"
            << "usage: gpt [--nproc N] [--steps N] [--batch-size N] [--lr X] [--warmup N] [--min-lr-ratio X]\n"
            << "           [--weight-decay X] [--clip-norm X] [--accum K] [--precision fp32|bf16] [--zero 1|2|3]\n"
            << "           [--checkpoint-activations] [--layers N] [--heads N] [--embd N] [--block-size N]\n"
            << "           [--dropout X] [--data FILE|DIR] [--workers N] [--seed N] [--freed-memory keep|return]\n"
            << "           [--project-dir DIR [--resume [--allow-world-size-change]] [--save-every N]] [--log-with jsonl,csv,tensorboard|all]\n"
            << "           [--eval-batches N] [--prompt TEXT] [--sample-tokens N] [--log-every N] [--no-progress]\n"
            << "           [--dump DIR]   (one process: what tests/baseline/gpt_parity.py replays)\n";
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  a.run.with_environment();
  a.run.num_processes = accelerate::distributed::detect_environment().world_size;
  examples::for_each_flag(argc, argv, usage, [&](const std::string& flag, auto& value) {
    if (flag == "--steps") a.steps = examples::whole_number<int64_t>(flag, value(), usage);
    else if (flag == "--batch-size") a.batch_size = examples::whole_number<std::size_t>(flag, value(), usage);
    else if (flag == "--lr") a.lr = examples::real_number(flag, value(), usage);
    else if (flag == "--warmup") a.warmup = examples::whole_number<int64_t>(flag, value(), usage);
    else if (flag == "--min-lr-ratio") a.min_lr_ratio = examples::real_number(flag, value(), usage);
    else if (flag == "--weight-decay") a.weight_decay = examples::real_number(flag, value(), usage);
    else if (flag == "--clip-norm") a.clip_norm = examples::real_number(flag, value(), usage);
    else if (flag == "--accum") a.run.gradient_accumulation_steps = examples::whole_number<std::size_t>(flag, value(), usage);
    else if (flag == "--zero") a.zero_stage = examples::whole_number<int>(flag, value(), usage);
    else if (flag == "--checkpoint-activations") a.checkpoint_activations = true;
    else if (flag == "--layers") a.model.layers = examples::whole_number<int64_t>(flag, value(), usage);
    else if (flag == "--heads") a.model.heads = examples::whole_number<int64_t>(flag, value(), usage);
    else if (flag == "--embd") a.model.embd = examples::whole_number<int64_t>(flag, value(), usage);
    else if (flag == "--block-size") a.model.block_size = examples::whole_number<int64_t>(flag, value(), usage);
    else if (flag == "--dropout") a.model.dropout = examples::real_number(flag, value(), usage);
    else if (flag == "--data") a.data = value();
    else if (flag == "--workers") a.workers = examples::whole_number<std::size_t>(flag, value(), usage);
    else if (flag == "--freed-memory") {
      const std::string v = value();
      if (v != "keep" && v != "return") usage("--freed-memory must be keep or return");
      a.retain_freed_memory = v == "keep";
    }
    else if (flag == "--seed") a.seed = examples::whole_number<std::uint64_t>(flag, value(), usage);
    else if (flag == "--project-dir") a.project_dir = value();
    else if (flag == "--resume") a.resume = true;
    else if (flag == "--allow-world-size-change") a.allow_world_size_change = true;
    else if (flag == "--save-every") a.save_every = examples::whole_number<int64_t>(flag, value(), usage);
    else if (flag == "--eval-batches") a.eval_batches = examples::whole_number<std::size_t>(flag, value(), usage);
    else if (flag == "--prompt") a.prompt = value();
    else if (flag == "--sample-tokens") a.sample_tokens = examples::whole_number<int64_t>(flag, value(), usage);
    else if (flag == "--log-every") a.log_every = examples::whole_number<int64_t>(flag, value(), usage);
    else if (flag == "--no-progress") a.progress = false;
    else if (flag == "--dump") a.dump = value();
    else if (flag == "--log-with") {
      std::stringstream list(value());
      for (std::string name; std::getline(list, name, ',');) a.log_with.push_back(name);
    } else if (flag == "--precision") {
      const std::string p = value();
      if (p != "fp32" && p != "bf16") usage("--precision must be fp32 or bf16");
      a.run.mixed_precision = p == "fp32" ? "no" : p;
    } else usage("unknown flag " + flag);
  });
  if (a.steps < 1 || a.batch_size < 1 || !(a.lr > 0) || a.run.gradient_accumulation_steps < 1)
    usage("--steps, --batch-size, --lr and --accum must be positive");
  if (a.model.layers < 1 || a.model.heads < 1 || a.model.embd % a.model.heads != 0 || a.model.block_size < 2)
    usage("--layers and --heads must be positive, --embd a multiple of --heads, --block-size at least 2");
  if (!(a.model.dropout >= 0 && a.model.dropout < 1)) usage("--dropout must be in [0, 1)");
  if (a.clip_norm < 0 || a.weight_decay < 0 || a.min_lr_ratio < 0 || a.min_lr_ratio > 1)
    usage("--clip-norm and --weight-decay must not be negative, --min-lr-ratio in [0, 1]");
  if (a.zero_stage > 3) usage("--zero must be 1, 2 or 3 (0: data parallel)");
  if (a.resume && a.project_dir.empty()) usage("--resume needs --project-dir");
  if (a.prompt.empty()) usage("--prompt must not be empty");
  if (a.warmup < 0) a.warmup = a.steps / 10;
  return a;
}

// Counters that survive a resume: saved with the training state through Boost.Hana.
struct Progress {
  std::int64_t micro_steps = 0;
  std::int64_t optimizer_steps = 0;
  std::int64_t tokens = 0;  // trained on, every rank together
  double last_step_loss = 0.0;  // the mean loss of the last optimizer step's micro-steps (rank 0)
};

}  // namespace

BOOST_HANA_ADAPT_STRUCT(Progress, micro_steps, optimizer_steps, tokens, last_step_loss);

namespace {

int64_t peak_resident_mb() {
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024;
}

/// `prompt` followed by `count` generated bytes, each the argmax (greedy) or drawn from the
/// softmax at temperature 0.8 with `generator` (on the CPU, so a seed gives the same text on any
/// device). Every rank runs it: under ZeRO-3 each forward gathers.
template <class Model>
std::string generate(Model& model, const std::string& prompt, int64_t count, int64_t block_size,
                     const c10::Device& device, std::optional<at::Generator> generator) {
  torch::NoGradGuard no_grad;
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  for (auto& id : ids) id = static_cast<unsigned char>(id);
  for (int64_t i = 0; i < count; ++i) {
    const auto n = std::min<int64_t>(static_cast<int64_t>(ids.size()), block_size);
    const auto context = torch::tensor(std::vector<int64_t>(ids.end() - n, ids.end())).unsqueeze(0).to(device);
    const auto logits = model(context).select(1, -1).squeeze(0).to(torch::kFloat).cpu();
    ids.push_back(generator ? torch::multinomial(torch::softmax(logits / 0.8, -1), 1, false, *generator).template item<int64_t>()
                            : logits.argmax().template item<int64_t>());
  }
  std::string text;
  for (const auto id : ids) text += static_cast<char>(id);
  return text;
}

template <class Acc>
int train(const Args& args) {
  const auto start = std::chrono::steady_clock::now();
  accelerate::PreemptionGuard preemption;  // SIGTERM/SIGUSR1: save the state at the next step, exit 0
  accelerate::AcceleratorOptions options{.seed = args.seed, .retain_freed_memory = args.retain_freed_memory};
  options.tracking.log_with = args.log_with;
  options.accumulation.num_steps = args.run.gradient_accumulation_steps;
  // --clip-norm 0: the norm is only measured; a bound of the largest float never scales.
  options.clip.max_norm = args.clip_norm > 0 ? args.clip_norm : std::numeric_limits<float>::max();
  if (!args.project_dir.empty())
    options.project = {.project_dir = args.project_dir, .automatic_checkpoint_naming = true, .total_limit = 2};
  options.ddp.shard_units = unit_names(args.model);  // Zero<_, 3>: each block gathered on its own
  Acc acc{options};
  Gpt net(args.model);  // after the accelerator: initialised from its seed
  net->checkpoint_activations = args.checkpoint_activations;
  ACCELERATE_CHECK(args.dump.empty() || acc.num_processes() == 1, "gpt: --dump records one process's run");

  const Corpus corpus(args.data, args.model.block_size);
  const auto train_set = Corpus::windows(corpus.train, args.model.block_size);
  const auto validation_set = Corpus::windows(corpus.validation, args.model.block_size);

  const std::filesystem::path dump = args.dump;
  if (!dump.empty()) {
    std::filesystem::create_directories(dump);
    std::map<std::string, at::Tensor> initial;
    for (const auto& item : net->named_parameters()) initial.emplace(item.key(), item.value().detach().clone());
    accelerate::checkpoint::save_safetensors(dump / "initial.safetensors", initial);
  }

  int64_t parameters = 0;
  for (const auto& p : net->parameters()) parameters += p.numel();
  // Weight decay on the matrices (embeddings included), none on biases and LayerNorm gains.
  std::vector<torch::Tensor> decayed, undecayed;
  for (const auto& p : net->parameters()) (p.dim() >= 2 ? decayed : undecayed).push_back(p);
  const auto group_options = [&](double decay) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(args.lr).betas({0.9, 0.95}).weight_decay(decay));
  };
  accelerate::FusedAdamW adamw({torch::optim::OptimizerParamGroup(decayed, group_options(args.weight_decay)),
                                torch::optim::OptimizerParamGroup(undecayed, group_options(0.0))},
                               torch::optim::AdamWOptions(args.lr).betas({0.9, 0.95}));
  // A prepared scheduler steps num_processes times per optimizer step (as Accelerate's does).
  const int64_t world = acc.num_processes();
  accelerate::WarmupCosineLR schedule(adamw, {.warmup_steps = args.warmup * world,
                                              .total_steps = args.steps * world,
                                              .min_lr_ratio = args.min_lr_ratio});
  auto [model, optimizer, train_loader, validation_loader, scheduler] = acc.prepare(
      net, adamw,
      accelerate::DataLoader(train_set, {.batch_size = args.batch_size, .shuffle = true, .num_workers = args.workers}),
      accelerate::DataLoader(validation_set, {.batch_size = args.batch_size, .num_workers = args.workers}),
      schedule);
  Progress progress;
  acc.register_for_checkpointing(progress);
  // On another number of ranks the Backend may differ too (one process runs SingleProcess).
  if (args.resume)
    acc.print("resuming from", acc.load_state(std::nullopt, {.allow_configuration_change = args.allow_world_size_change,
                                                            .allow_world_size_change = args.allow_world_size_change})
                                   .string());
  const auto& c = args.model;
  acc.init_trackers("gpt", {{"layers", c.layers}, {"heads", c.heads}, {"embd", c.embd}, {"block_size", c.block_size},
                            {"parameters", parameters}, {"batch_size", args.batch_size}, {"steps", args.steps},
                            {"lr", args.lr}, {"seed", args.seed}, {"precision", std::string(acc.mixed_precision())},
                            {"accum", acc.gradient_accumulation_steps()}, {"world_size", world},
                            {"zero", args.zero_stage}, {"checkpoint_activations", args.checkpoint_activations}});

  nlohmann::json losses = nlohmann::json::array(), rates = nlohmann::json::array();
  std::map<std::string, at::Tensor> batches;
  const auto loop_start = std::chrono::steady_clock::now();
  const int64_t tokens_before = progress.tokens;
  bool preempted = false;
  double window_loss = 0.0;
  int64_t window_micro_steps = 0;
  {
    accelerate::ProgressBar bar(static_cast<std::size_t>(args.steps - progress.optimizer_steps),
                                {.enabled = acc.is_main_process() && args.progress, .description = "train"});
    model->train();
    while (progress.optimizer_steps < args.steps && !preempted) {
      for (auto& [x, y] : train_loader) {
        auto step = acc.accumulate(model);
        auto logits = model(x);
        auto loss = torch::cross_entropy_loss(logits.flatten(0, 1).to(torch::kFloat), y.flatten());
        acc.backward(loss);
        if (!dump.empty()) {
          const auto index = std::to_string(progress.micro_steps);
          batches.emplace("x." + index, x.cpu().clone());
          batches.emplace("y." + index, y.cpu().clone());
          rates.push_back(optimizer.param_groups()[0].options().get_lr());
          losses.push_back(loss.template item<double>());
        }
        optimizer.step();
        scheduler.step();
        optimizer.zero_grad();
        ++progress.micro_steps;
        progress.tokens += x.numel() * world;
        window_loss += loss.template item<double>();
        ++window_micro_steps;
        if (!step.sync_gradients()) continue;
        ++progress.optimizer_steps;
        progress.last_step_loss = window_loss / static_cast<double>(window_micro_steps);
        window_loss = 0.0;
        window_micro_steps = 0;
        bar.update(progress.last_step_loss);
        if (args.log_every > 0 && progress.optimizer_steps % args.log_every == 0) {
          acc.print("step", progress.optimizer_steps, "loss", progress.last_step_loss);
          acc.log({{"train/loss", progress.last_step_loss},
                   {"train/lr", optimizer.param_groups()[0].options().get_lr()},
                   {"train/grad_norm", acc.last_grad_norm()}},
                  progress.optimizer_steps);
        }
        if (!args.project_dir.empty() && args.save_every > 0 && progress.optimizer_steps % args.save_every == 0)
          acc.save_state();
        if (acc.check_trigger()) {  // a preemption signal on any rank: every rank stops here
          if (!args.project_dir.empty()) acc.save_state();
          preempted = true;
          break;
        }
        if (progress.optimizer_steps >= args.steps) break;
      }
    }
  }
  const double train_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - loop_start).count();
  if (preempted) {
    acc.print("gpt: stopped by signal at step", progress.optimizer_steps,
              args.project_dir.empty() ? "" : "; state saved, continue with --resume");
    acc.end_training();
    return 0;
  }
  if (!args.project_dir.empty()) {
    acc.save_state();
    acc.save_model(model, std::filesystem::path(args.project_dir) / "model");
  }

  // The held-out loss: every window once, whatever the number of ranks.
  model->eval();
  double validation_loss = 0.0;
  {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> per_window;
    std::size_t seen = 0;
    for (auto& [x, y] : validation_loader) {
      if (args.eval_batches > 0 && seen++ == args.eval_batches) break;
      auto logits = model(x).to(torch::kFloat);
      auto loss = torch::cross_entropy_loss(logits.flatten(0, 1), y.flatten(), {}, at::Reduction::None);
      per_window.push_back(acc.gather_for_metrics(loss.view({x.size(0), -1}).mean(1)).cpu());
    }
    validation_loss = torch::cat(per_window).to(torch::kDouble).mean().item<double>();
  }
  const std::string greedy = generate(model, args.prompt, args.sample_tokens, c.block_size, acc.device(), std::nullopt);
  const std::string sample = generate(model, args.prompt, args.sample_tokens, c.block_size, acc.device(),
                                      at::make_generator<at::CPUGeneratorImpl>(args.seed));
  if (!dump.empty()) {
    accelerate::checkpoint::save_safetensors(dump / "batches.safetensors", batches);
    acc.save_model(model, dump / "model");
    nlohmann::json run = {{"layers", c.layers}, {"heads", c.heads}, {"embd", c.embd}, {"block_size", c.block_size},
                          {"vocab_size", c.vocab_size}, {"lr", args.lr}, {"warmup", args.warmup},
                          {"steps", args.steps}, {"min_lr_ratio", args.min_lr_ratio},
                          {"weight_decay", args.weight_decay}, {"clip_norm", args.clip_norm},
                          {"accum", acc.gradient_accumulation_steps()}, {"losses", losses}, {"lrs", rates},
                          {"prompt", std::vector<unsigned char>(args.prompt.begin(), args.prompt.end())},
                          {"greedy", std::vector<unsigned char>(greedy.begin(), greedy.end())}};
    std::ofstream(dump / "run.json") << run.dump(1) << "\n";
  }
  const int64_t trained_tokens = progress.tokens - tokens_before;
  const auto peak = acc.reduce(torch::tensor(peak_resident_mb()), accelerate::Reduction::max).template item<int64_t>();
  const double unigram = corpus.unigram_loss(c.block_size);
  acc.log({{"validation/loss", validation_loss}}, progress.optimizer_steps);
  acc.end_training();
  if (acc.is_main_process()) {
    nlohmann::json report = {
        {"world_size", world},
        {"backend", std::string(Acc::backend_policy::name)},
        {"precision", std::string(acc.mixed_precision())},
        {"zero", args.zero_stage},
        {"accum", acc.gradient_accumulation_steps()},
        {"checkpoint_activations", args.checkpoint_activations},
        {"parameters", parameters},
        {"micro_steps", progress.micro_steps},
        {"optimizer_steps", progress.optimizer_steps},
        {"tokens", progress.tokens},
        {"train_loss", progress.last_step_loss},
        {"validation_loss", validation_loss},
        {"unigram_loss", unigram},
        {"tokens_per_second", static_cast<double>(trained_tokens) / train_seconds},
        {"train_seconds", train_seconds},
        {"peak_memory_mb", peak},  // the largest resident set among the ranks
        {"greedy", greedy},
        {"sample", sample},
        {"seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()},
    };
    // Generated bytes need not be UTF-8: invalid ones print as U+FFFD.
    std::cout << report.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
  }
  return 0;
}

// One Accelerator per Backend and precision; accumulation and clipping are run-time options
// of AccumulateDynamic and ClipNorm<>, so the flags need ten compiled combinations, not forty.
template <class Backend, class Precision>
using Trainer = accelerate::Accelerator<Backend, Precision, accelerate::AccumulateDynamic, accelerate::ClipNorm<>>;

template <class Backend>
int train_with_precision(const Args& args) {
  if (args.run.mixed_precision == "bf16") return train<Trainer<Backend, accelerate::Bf16>>(args);
  return train<Trainer<Backend, accelerate::Fp32>>(args);
}

int run(const Args& args) {
  // One process runs every --zero stage as SingleProcess: there is nothing to shard.
  if (args.run.num_processes <= 1) return train_with_precision<accelerate::SingleProcess>(args);
  switch (args.zero_stage) {
    case 1: return train_with_precision<accelerate::Zero<accelerate::Gloo, 1>>(args);
    case 2: return train_with_precision<accelerate::Zero<accelerate::Gloo, 2>>(args);
    case 3: return train_with_precision<accelerate::Zero<accelerate::Gloo, 3>>(args);
    default: return train_with_precision<accelerate::Gloo>(args);
  }
}

}  // namespace

int main(int argc, char** argv) {
  return accelerate::launch(argc, argv, [](int argc, char** argv) {
    try {
      return run(parse(argc, argv));
    } catch (const accelerate::Error& e) {
      std::cerr << "gpt: " << e.what() << "\n";
      return 1;
    }
  });
}
