// Padded token batches whose micro-batches hold different numbers of tokens, and the two
// gradients a token-weighted loss is told apart by: the mean over every token of a window,
// and the mean of per-micro-batch means. Made from fixed seeds, so every process of a job and
// the test that checks it make the same data.
#pragma once

#include <cstdint>

#include <torch/torch.h>

namespace accelerate::testing {

inline constexpr std::int64_t kTokenPad = -100, kTokenVocab = 5, kTokenWidth = 8, kTokenSeq = 6, kTokenSeqs = 2;

struct TokenBatch {
  torch::Tensor x;       // [kTokenSeqs, kTokenSeq, kTokenWidth]
  torch::Tensor labels;  // [kTokenSeqs, kTokenSeq], kTokenPad after each sequence's length
};

/// Micro-batch `micro` of rank `rank`: sequences of 1 to kTokenSeq tokens, so that the
/// micro-batches of a window hold from 2 to 12 tokens.
inline TokenBatch token_batch(int micro, int rank) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1000 + 97 * micro + 13 * rank);
  TokenBatch batch{torch::randn({kTokenSeqs, kTokenSeq, kTokenWidth}, generator),
                   torch::randint(kTokenVocab, {kTokenSeqs, kTokenSeq}, generator)};
  for (std::int64_t s = 0; s < kTokenSeqs; ++s) {
    const std::int64_t length = micro % 2 == 0 ? 1 + (rank + s) % 2 : kTokenSeq - (rank + s) % 2;
    batch.labels[s].slice(0, length).fill_(kTokenPad);
  }
  return batch;
}

/// The summed cross-entropy of a micro-batch's real tokens, and their number.
inline torch::Tensor token_loss_sum(const torch::Tensor& logits, const TokenBatch& batch) {
  namespace F = torch::nn::functional;
  return F::cross_entropy(logits.flatten(0, 1), batch.labels.flatten(),
                          F::CrossEntropyFuncOptions().reduction(torch::kSum).ignore_index(kTokenPad));
}
inline std::int64_t token_count(const TokenBatch& batch) { return batch.labels.ne(kTokenPad).sum().item<std::int64_t>(); }

/// The model the token tests train: one linear layer over each token, from seed 5.
inline torch::nn::Linear token_head() {
  torch::manual_seed(5);
  return torch::nn::Linear(kTokenWidth, kTokenVocab);
}

/// The gradient of one window of `micro_steps` micro-batches on each of `world` ranks, as one
/// batch of all their tokens would give it (`token_mean`), or as the mean of each
/// micro-batch's mean (what dividing each micro-step's mean loss by the window gives).
inline torch::Tensor window_gradient(int micro_steps, int world, bool token_mean) {
  torch::nn::Linear head = token_head();
  std::int64_t tokens = 0;
  for (int m = 0; m < micro_steps; ++m)
    for (int r = 0; r < world; ++r) tokens += token_count(token_batch(m, r));
  for (int m = 0; m < micro_steps; ++m)
    for (int r = 0; r < world; ++r) {
      const TokenBatch batch = token_batch(m, r);
      const torch::Tensor sum = token_loss_sum(head(batch.x), batch);
      (token_mean ? sum / static_cast<double>(tokens)
                  : sum / static_cast<double>(token_count(batch)) / static_cast<double>(micro_steps * world))
          .backward();
    }
  std::vector<torch::Tensor> parts;
  for (const auto& p : head->parameters()) parts.push_back(p.grad().reshape(-1));
  return torch::cat(parts);
}

}  // namespace accelerate::testing
