// Bodies of shard_manifest.hpp's functions (see detail/linkage.hpp).
#pragma once

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include <torch/csrc/autograd/grad_mode.h>

#include <accelerate/checkpoint/module_state.hpp>
#include <accelerate/checkpoint/shard_manifest.hpp>
#include <accelerate/detail/check.hpp>

namespace accelerate::checkpoint {

ACCELERATE_INLINE nlohmann::json shard_manifest(int stage, int world_size, int rank, const std::vector<ShardRecord>& pieces) {
  nlohmann::json manifest = {{"stage", stage}, {"world_size", world_size}, {"rank", rank}};
  nlohmann::json listed = nlohmann::json::array();
  for (const auto& piece : pieces) {
    nlohmann::json one = {{"parameter", piece.parameter}, {"shape", piece.shape}, {"offset", piece.offset},
                          {"numel", piece.numel}};
    if (!piece.model.empty()) one["model"] = piece.model;
    if (piece.index) one["index"] = *piece.index;
    listed.push_back(std::move(one));
  }
  manifest["pieces"] = std::move(listed);
  return manifest;
}

ACCELERATE_INLINE void check_optimizer_manifest(const nlohmann::json& expected, const StateDict& saved) {
  ACCELERATE_CHECK(saved.values.contains("shards"), "sharded optimizer state: the saved state has no "
                   "\"shards\" manifest (saved by a data-parallel run?); it cannot be loaded into ",
                   "Zero stage ", expected.at("stage").dump());
  const auto& found = saved.values.at("shards");
  for (const char* key : {"stage", "world_size", "rank"})
    ACCELERATE_CHECK(found.contains(key) && found.at(key) == expected.at(key),
                     "sharded optimizer state: saved with ", key, " ", found.value(key, nlohmann::json()).dump(),
                     ", this run has ", expected.at(key).dump(), " (a sharded optimizer resumes on the same "
                     "stage; another number of processes needs LoadStateOptions::allow_world_size_change)");
  const auto& mine = expected.at("pieces");
  const auto& theirs = found.value("pieces", nlohmann::json::array());
  ACCELERATE_CHECK(theirs.size() == mine.size(), "sharded optimizer state: ", theirs.size(),
                   " slices saved, this rank holds ", mine.size(), " (another model or bucket size?)");
  for (std::size_t i = 0; i < mine.size(); ++i)
    ACCELERATE_CHECK(theirs[i] == mine[i], "sharded optimizer state: slice ", i, " was saved as ",
                     theirs[i].dump(), ", this rank holds ", mine[i].dump());
}

ACCELERATE_INLINE bool cut_otherwise(const nlohmann::json& mine, const StateDict& saved) {
  if (!saved.values.contains("shards")) return false;  // not sharded: the check names it
  const auto& found = saved.values.at("shards");
  return found.value("world_size", nlohmann::json()) == mine.at("world_size") &&
         (found.value("stage", nlohmann::json()) != mine.at("stage") ||
          found.value("pieces", nlohmann::json()) != mine.at("pieces"));
}

ACCELERATE_INLINE StateDict resharded_optimizer_state(const nlohmann::json& mine,
                                                      const torch::optim::Optimizer& optimizer,
                                                      const std::vector<StateDict>& saved) {
  struct Source {
    const StateDict* state;
    std::string index;
    int64_t offset, numel;
    std::vector<int64_t> shape;
  };
  std::map<std::pair<std::string, std::string>, std::vector<Source>> sources;  // (model, parameter)
  for (std::size_t r = 0; r < saved.size(); ++r) {
    const auto& values = saved[r].values;
    ACCELERATE_CHECK(values.contains("shards") && values.contains("state") && values.contains("param_groups"),
                     "sharded optimizer state of saved rank ", r, ": no \"shards\" manifest, state or param_groups "
                     "(saved by a data-parallel run?)");
    ACCELERATE_CHECK(values.value("type", "") == saved[0].values.value("type", ""), "sharded optimizer state: saved "
                     "rank ", r, " holds ", values.value("type", ""), " state, rank 0 ", saved[0].values.value("type", ""));
    for (const auto& piece : values.at("shards").at("pieces")) {
      ACCELERATE_CHECK(piece.contains("index"), "sharded optimizer state of saved rank ", r, ": its slices do not "
                       "record their state index (saved by an older version), so it cannot be re-cut");
      sources[{piece.at("model").get<std::string>(), piece.at("parameter").get<std::string>()}].push_back(
          {&saved[r], std::to_string(piece.at("index").get<int64_t>()), piece.at("offset").get<int64_t>(),
           piece.at("numel").get<int64_t>(), piece.at("shape").get<std::vector<int64_t>>()});
    }
  }
  std::vector<at::Tensor> params;  // this optimizer's, in state order
  for (const auto& group : optimizer.param_groups())
    for (const auto& p : group.params()) params.push_back(p);

  StateDict out;
  out.values["type"] = saved[0].values.value("type", "");
  out.values["shards"] = mine;
  auto groups = saved[0].values.at("param_groups");
  ACCELERATE_CHECK(groups.is_array() && groups.size() == optimizer.param_groups().size(), "sharded optimizer state: ",
                   groups.size(), " param groups saved, the optimizer has ", optimizer.param_groups().size());
  int64_t index = 0;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    nlohmann::json indices = nlohmann::json::array();
    for (std::size_t i = 0; i < optimizer.param_groups()[g].params().size(); ++i) indices.push_back(index++);
    groups[g]["params"] = indices;
  }
  out.values["param_groups"] = groups;
  nlohmann::json states = nlohmann::json::object();
  for (const auto& piece : mine.at("pieces")) {
    const auto model = piece.at("model").get<std::string>(), parameter = piece.at("parameter").get<std::string>();
    const auto shape = piece.at("shape").get<std::vector<int64_t>>();
    const auto begin = piece.at("offset").get<int64_t>(), numel = piece.at("numel").get<int64_t>(),
               my_index = piece.at("index").get<int64_t>();
    const auto found = sources.find({model, parameter});
    ACCELERATE_CHECK(found != sources.end(), "sharded optimizer state: no saved rank holds a slice of ", model,
                     ".", parameter);
    std::vector<const Source*> overlapping;
    for (const auto& source : found->second) {
      ACCELERATE_CHECK(source.shape == shape, "sharded optimizer state: ", model, ".", parameter, " was saved with "
                       "shape ", nlohmann::json(source.shape).dump(), ", this model's is ", nlohmann::json(shape).dump());
      if (source.offset < begin + numel && begin < source.offset + source.numel) overlapping.push_back(&source);
    }
    const auto stepped = [](const Source* s) { return s->state->values.at("state").contains(s->index); };
    const auto with_state = std::count_if(overlapping.begin(), overlapping.end(), stepped);
    if (with_state == 0) continue;  // never stepped
    ACCELERATE_CHECK(with_state == static_cast<std::ptrdiff_t>(overlapping.size()), "sharded optimizer state: ",
                     "some saved slices of ", model, ".", parameter, " have optimizer state and some do not");
    const std::string key = std::to_string(my_index);
    states[key] = overlapping.front()->state->values.at("state").at(overlapping.front()->index);
    ACCELERATE_CHECK(my_index >= 0 && my_index < static_cast<int64_t>(params.size()), "sharded optimizer state: ",
                     "state index ", my_index, " is outside the optimizer's ", params.size(), " parameters");
    std::map<std::string, std::vector<SavedSlice>> fields;  // state name -> the saved slices of it
    for (const Source* source : overlapping) {
      const std::string prefix = "state." + source->index + ".";
      for (const auto& [name, tensor] : source->state->tensors) {
        if (!name.starts_with(prefix)) continue;
        ACCELERATE_CHECK(tensor.numel() == source->numel, "sharded optimizer state: ", name, " has ",
                         tensor.numel(), " elements, its slice of ", model, ".", parameter, " ", source->numel);
        fields[name.substr(prefix.size())].push_back({source->offset, source->numel, tensor});
      }
    }
    for (const auto& [field, slices] : fields)
      out.tensors["state." + key + "." + field] =
          assembled_slice(begin, numel, slices, "sharded optimizer state: " + model + "." + parameter + " (" + field + ")")
              .reshape(params[static_cast<std::size_t>(my_index)].sizes());
  }
  out.values["state"] = states;
  return out;
}

ACCELERATE_INLINE StateDict resharded_model_state(const nlohmann::json& mine, const std::vector<StateDict>& saved) {
  StateDict out;
  out.values["shards"] = mine;
  std::set<std::string> sharded;
  for (const auto& piece : mine.at("pieces")) sharded.insert(piece.at("parameter").get<std::string>());
  for (std::size_t r = 0; r < saved.size(); ++r)
    ACCELERATE_CHECK(saved[r].values.contains("shards"), "sharded model state of saved rank ", r,
                     ": no \"shards\" manifest");
  for (const auto& [name, tensor] : saved.front().tensors) {
    bool is_slice = sharded.count(name) > 0;
    for (const auto& piece : saved.front().values.at("shards").at("pieces"))
      is_slice = is_slice || piece.at("parameter") == name;
    if (!is_slice) out.tensors[name] = tensor;
  }
  for (const auto& piece : mine.at("pieces")) {
    const auto name = piece.at("parameter").get<std::string>();
    std::vector<SavedSlice> slices;
    for (std::size_t r = 0; r < saved.size(); ++r)
      for (const auto& theirs : saved[r].values.at("shards").at("pieces")) {
        if (theirs.at("parameter") != name) continue;
        const int64_t length = theirs.at("numel").get<int64_t>();
        const auto it = saved[r].tensors.find(name);
        ACCELERATE_CHECK(it != saved[r].tensors.end() && it->second.numel() == length, "sharded model state of "
                         "saved rank ", r, ": the slice of ", name, " is missing or has another length");
        slices.push_back({theirs.at("offset").get<int64_t>(), length, it->second});
      }
    out.tensors[name] = assembled_slice(piece.at("offset").get<int64_t>(), piece.at("numel").get<int64_t>(), slices,
                                        "sharded model state: " + name);
  }
  return out;
}

ACCELERATE_INLINE Entry whole_sharded_model_entry(const torch::nn::Module& module, int stage) {
  nlohmann::json pieces = nlohmann::json::array();
  auto sharded = std::make_shared<std::set<std::string>>();
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    const auto sizes = item.value().sizes();
    pieces.push_back({{"parameter", item.key()}, {"shape", std::vector<int64_t>(sizes.begin(), sizes.end())},
                      {"offset", 0}, {"numel", item.value().numel()}});
    sharded->insert(item.key());
  }
  const nlohmann::json manifest = {{"stage", stage}, {"world_size", 1}, {"rank", 0}, {"pieces", std::move(pieces)}};
  const torch::nn::Module* target = &module;
  Entry entry{Entry::Kind::model, EntryOwner::every_rank};
  entry.save = [target, manifest] {
    StateDict state;
    for (const auto& [name, tensor] : named_tensors(*target)) state.tensors[name] = tensor;
    state.values["shards"] = manifest;
    return state;
  };
  auto check = [target, manifest, sharded](const StateDict& saved) {
    ACCELERATE_CHECK(saved.values.contains("shards") && saved.values.at("shards") == manifest,
                     "sharded model state: saved with the slices ",
                     saved.values.contains("shards") ? saved.values.at("shards").dump() : std::string("(none)"),
                     ", this process holds ", manifest.dump(), " (another model?)");
    for (const auto& [name, tensor] : named_tensors(*target)) {
      const auto it = saved.tensors.find(name);
      // A re-cut parameter comes flattened; buffers and frozen parameters keep their shape.
      ACCELERATE_CHECK(it != saved.tensors.end() && (sharded->count(name) ? it->second.numel() == tensor.numel()
                                                                          : it->second.sizes() == tensor.sizes()),
                       "sharded model state: ", name, " is missing or has another shape");
    }
  };
  entry.check = check;
  entry.load = [target, check](const StateDict& saved) {
    check(saved);
    torch::NoGradGuard no_grad;
    for (auto& [name, tensor] : named_tensors(*target))
      tensor.copy_(saved.tensors.at(name).reshape(tensor.sizes()));
  };
  entry.reshard = [manifest](const std::vector<StateDict>& saved) { return resharded_model_state(manifest, saved); };
  entry.laid_out_otherwise = [manifest](const StateDict& saved) { return cut_otherwise(manifest, saved); };
  return entry;
}

ACCELERATE_INLINE at::Tensor assembled_slice(int64_t begin, int64_t numel, const std::vector<SavedSlice>& slices,
                                             const std::string& what) {
  at::Tensor out;
  int64_t covered = 0;
  for (const auto& slice : slices) {
    const int64_t from = std::max(begin, slice.offset), to = std::min(begin + numel, slice.offset + slice.numel);
    if (from >= to) continue;
    if (!out.defined()) out = at::zeros({numel}, slice.tensor.options());
    out.narrow(0, from - begin, to - from).copy_(slice.tensor.reshape(-1).narrow(0, from - slice.offset, to - from));
    covered += to - from;
  }
  ACCELERATE_CHECK(covered == numel, what, ": the saved slices cover ", covered, " of the ", numel, " elements [",
                   begin, ", ", begin + numel, ")");
  return out;
}

}  // namespace accelerate::checkpoint
