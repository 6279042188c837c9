// The Tracker concept (experiment logging) and AnyTracker, which holds any tracker so the
// Accelerator can keep built-in and user trackers side by side.
//
// Customization point: a type with the members below is a Tracker; give it to
// Accelerator::add_tracker.
#pragma once

#include <concepts>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

namespace accelerate {

/// Scalar metrics of one logging call, by name.
using Metrics = std::map<std::string, double>;

/// An experiment tracker:
///   - `name()`: its name ("jsonl", "csv", "tensorboard", ...);
///   - `start(project, config)`: begins a run and records its hyperparameters;
///   - `log(values, step)`: records scalar metrics at a step;
///   - `finish()`: flushes and closes.
template <class T>
concept Tracker = requires(T& t, const std::string& project, const nlohmann::json& config, const Metrics& values,
                           std::int64_t step) {
  { t.name() } -> std::convertible_to<std::string>;
  t.start(project, config);
  t.log(values, step);
  t.finish();
};

/// Any Tracker, type-erased (logging is off the hot path).
class AnyTracker {
 public:
  template <Tracker T>
  AnyTracker(T tracker) : self_(std::make_unique<Model<T>>(std::move(tracker))) {}

  std::string name() const { return self_->name(); }
  void start(const std::string& project, const nlohmann::json& config) { self_->start(project, config); }
  void log(const Metrics& values, std::int64_t step) { self_->log(values, step); }
  void finish() { self_->finish(); }

 private:
  struct Concept {
    virtual ~Concept() = default;
    virtual std::string name() const = 0;
    virtual void start(const std::string&, const nlohmann::json&) = 0;
    virtual void log(const Metrics&, std::int64_t) = 0;
    virtual void finish() = 0;
  };
  template <class T>
  struct Model final : Concept {
    explicit Model(T t) : tracker(std::move(t)) {}
    std::string name() const override { return tracker.name(); }
    void start(const std::string& p, const nlohmann::json& c) override { tracker.start(p, c); }
    void log(const Metrics& v, std::int64_t s) override { tracker.log(v, s); }
    void finish() override { tracker.finish(); }
    mutable T tracker;
  };
  std::unique_ptr<Concept> self_;
};

}  // namespace accelerate
