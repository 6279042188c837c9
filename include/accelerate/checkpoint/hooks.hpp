// StateHooks: functions save_state and load_state call with the checkpoint's folder, so a user
// can keep a file of their own in it (Accelerate's register_save_state_pre_hook and
// register_load_state_pre_hook). Light: no LibTorch include.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <utility>

namespace accelerate::checkpoint {

/// The hooks of one accelerator. Each runs on every process, in registration order.
/// Example (what Accelerator::register_save_state_pre_hook does):
///   auto handle = hooks.add_save([](const std::filesystem::path& dir) { write_extra(dir / "extra.json"); });
///   handle.remove();
class StateHooks {
 public:
  using Hook = std::function<void(const std::filesystem::path& dir)>;
  using Table = std::map<std::uint64_t, Hook>;

  /// Returned by add_save/add_load: remove() unregisters the hook (once; later calls, or calls
  /// after the accelerator is gone, do nothing).
  class Handle {
   public:
    Handle() = default;
    void remove() {
      if (auto table = table_.lock()) table->erase(id_);
      table_.reset();
    }

   private:
    friend class StateHooks;
    Handle(std::weak_ptr<Table> table, std::uint64_t id) : table_(std::move(table)), id_(id) {}
    std::weak_ptr<Table> table_;
    std::uint64_t id_ = 0;
  };

  Handle add_save(Hook hook) { return add(save_, std::move(hook)); }
  Handle add_load(Hook hook) { return add(load_, std::move(hook)); }

  /// Calls the save hooks with the folder being written (still staged: what they write there
  /// is published with the rest, atomically, and checksummed in the manifest).
  void run_save(const std::filesystem::path& dir) const { run(save_, dir); }
  /// Calls the load hooks with the checkpoint's folder, once its files are verified and before
  /// any object is restored.
  void run_load(const std::filesystem::path& dir) const { run(load_, dir); }

 private:
  Handle add(const std::shared_ptr<Table>& table, Hook hook) {
    const std::uint64_t id = next_id_++;
    table->emplace(id, std::move(hook));
    return Handle(table, id);
  }
  static void run(const std::shared_ptr<Table>& table, const std::filesystem::path& dir) {
    const Table copy = *table;  // a hook may remove itself
    for (const auto& [id, hook] : copy) hook(dir);
  }

  std::shared_ptr<Table> save_ = std::make_shared<Table>();
  std::shared_ptr<Table> load_ = std::make_shared<Table>();
  std::uint64_t next_id_ = 0;
};

}  // namespace accelerate::checkpoint
