#include "server/rollout_control.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <system_error>

#include "engine/engine_core.h"
#include "server/request_fields.h"

namespace beamline::server {

namespace {

// A parameter from the query string, else from the body (a string there as in the query).
std::optional<std::string> parameter(const ControlRequest& request, const std::string& key) {
  if (const auto found = request.query.find(key); found != request.query.end()) return found->second;
  const Json* value = find_field(request.body, key);
  if (value == nullptr) return std::nullopt;
  if (value->is_string()) return value->get<std::string>();
  if (value->is_boolean()) return value->get<bool>() ? "true" : "false";
  if (value->is_number_integer()) return std::to_string(value->get<int64_t>());
  throw invalid_request(key, fmt::format("{}: expected a string, boolean or integer, got {}", key, value->type_name()));
}

std::optional<bool> bool_parameter(const ControlRequest& request, const std::string& key) {
  const std::optional<std::string> text = parameter(request, key);
  if (!text) return std::nullopt;
  if (*text == "true" || *text == "True" || *text == "1") return true;
  if (*text == "false" || *text == "False" || *text == "0") return false;
  throw invalid_request(key, fmt::format("{}: expected true or false, got '{}'", key, *text));
}

// SkyRL's vLLM-side payloads name some fields otherwise than SGLang's (`master_addr` for `master_address`): `alias`
// when the request carries it and not `key`, else `key` (so that a message names the field the client sent).
std::string key_used(const ControlRequest& request, const std::string& key, const std::string& alias) {
  const auto carries = [&](const std::string& name) {
    return request.query.contains(name) || find_field(request.body, name) != nullptr;
  };
  return !carries(key) && carries(alias) ? alias : key;
}

const std::set<std::string> kSleepTags = {"weights", "kv_cache"};

}  // namespace

RolloutControl::RolloutControl(ServingContext& context, std::optional<std::filesystem::path> weight_update_dir,
                               double weight_sync_timeout_seconds)
    : context_(context), weight_sync_timeout_seconds_(weight_sync_timeout_seconds) {
  if (weight_update_dir) {
    std::error_code error;
    weight_update_dir_ = std::filesystem::canonical(*weight_update_dir, error);
    require(!error && std::filesystem::is_directory(*weight_update_dir_),
            "--weight-update-dir {}: not a directory", weight_update_dir->string());
  }
}

Json RolloutControl::pause(const ControlRequest& request) {
  // vLLM's `mode`; its older `wait_for_inflight_requests` (true: wait, false: abort) when no mode is given.
  PauseMode mode = PauseMode::Abort;
  if (const std::optional<std::string> name = parameter(request, "mode")) {
    if (*name == "abort") {
      mode = PauseMode::Abort;
    } else if (*name == "wait") {
      mode = PauseMode::Wait;
    } else if (*name == "keep") {
      mode = PauseMode::Keep;
    } else {
      throw invalid_request("mode", fmt::format("mode: '{}' is not one of abort, wait, keep", *name));
    }
  } else if (bool_parameter(request, "wait_for_inflight_requests").value_or(false)) {
    mode = PauseMode::Wait;
  }
  const bool clear_cache = bool_parameter(request, "clear_cache").value_or(true);
  std::lock_guard lock(mutex_);
  context_.engine.pause(mode);
  if (clear_cache) context_.engine.reset_prefix_cache();
  return Json{{"status", "paused"}};
}

Json RolloutControl::resume() {
  std::lock_guard lock(mutex_);
  if (!asleep_.empty()) {
    throw invalid_request("", "the engine is asleep: /wake_up first (it resumes generation once everything is awake)");
  }
  context_.engine.resume();
  return Json{{"status", "resumed"}};
}

Json RolloutControl::is_paused() const { return Json{{"is_paused", context_.engine.paused()}}; }

Json RolloutControl::sleep(const ControlRequest& request) {
  const std::optional<std::string> level_text = parameter(request, "level");
  const std::string level = level_text.value_or("1");
  if (level != "1" && level != "2") throw invalid_request("level", fmt::format("level: expected 1 or 2, got '{}'", level));
  std::lock_guard lock(mutex_);
  // Requests in flight are kept and continue after /wake_up; the KV cache's contents are dropped (vLLM: level 1
  // and 2 both discard it), so nothing cached is reused and the sequences in flight are computed again.
  context_.engine.pause(PauseMode::Keep);
  bool released = true;  // by every engine's runner (data parallelism: one engine per replica)
  context_.engine.run_between_steps([&](EngineCore& core, ModelRunner& runner) {
    core.reset_prefix_cache();
    const bool here = runner.sleep(std::stoi(level));
    if (here) core.preempt_all();
    released = released && here;
  });
  context_.engine.reset_prefix_cache();
  asleep_ = kSleepTags;
  sleeping_ = true;
  return Json{{"status", "sleeping"}, {"level", std::stoi(level)}, {"device_memory_released", released}};
}

Json RolloutControl::wake_up(const ControlRequest& request) {
  std::set<std::string> tags = kSleepTags;
  if (const auto query = request.query.find("tags"); query != request.query.end()) {
    tags = {query->second};
  } else if (const Json* body_tags = find_field(request.body, "tags"); body_tags != nullptr && body_tags->is_array()) {
    // vLLM reads `tags` from the query only; a list in the body is taken too (a non-list there is ignored, as vLLM
    // ignores the body, since SkyRL sends {"tags": 1} by default).
    tags.clear();
    for (const Json& tag : *body_tags) {
      if (!tag.is_string()) throw invalid_request("tags", "tags: expected a list of strings");
      tags.insert(tag.get<std::string>());
    }
  }
  for (const std::string& tag : tags) {
    if (!kSleepTags.contains(tag)) throw invalid_request("tags", fmt::format("tags: '{}' is not weights or kv_cache", tag));
  }
  std::lock_guard lock(mutex_);
  const bool was_asleep = !asleep_.empty();
  const std::set<std::string> before = asleep_;
  for (const std::string& tag : tags) asleep_.erase(tag);
  if (was_asleep && asleep_.empty()) {
    // The device state is made again once everything is awake (an update while asleep went to the host copy).
    try {
      context_.engine.run_between_steps([](EngineCore&, ModelRunner& runner) { runner.wake_up(); });
    } catch (const Error& failed) {
      asleep_ = before;
      throw invalid_request("tags", fmt::format("wake_up: {} (still asleep)", failed.what()));
    }
    sleeping_ = false;
    context_.engine.resume();
  }
  return Json{{"status", asleep_.empty() ? "awake" : "sleeping"}};
}

Json RolloutControl::is_sleeping() const { return Json{{"is_sleeping", sleeping_.load()}}; }

Json RolloutControl::reset_prefix_cache() {
  std::lock_guard lock(mutex_);
  context_.engine.reset_prefix_cache();
  return Json{{"success", true}};
}

std::filesystem::path RolloutControl::checked_model_path(const ControlRequest& request) const {
  if (!weight_update_dir_) {
    throw invalid_request("model_path", "model_path: loading weights from disk is off; start the server with "
                                        "--weight-update-dir DIR to allow directories under DIR");
  }
  const std::optional<std::string> text = parameter(request, "model_path");
  if (!text || text->empty()) throw invalid_request("model_path", "model_path: missing (a safetensors directory)");
  std::error_code error;
  const std::filesystem::path path = std::filesystem::canonical(*text, error);
  if (error || !std::filesystem::is_directory(path)) {
    throw invalid_request("model_path", fmt::format("model_path: {} is not a directory", *text));
  }
  // Compared after resolving links and "..", so neither leads out of the allowed directory.
  const auto [dir_end, path_end] = std::mismatch(weight_update_dir_->begin(), weight_update_dir_->end(), path.begin(),
                                                 path.end());
  if (dir_end != weight_update_dir_->end()) {
    throw invalid_request("model_path", fmt::format("model_path: {} is outside --weight-update-dir {}", *text,
                                                    weight_update_dir_->string()));
  }
  return path;
}

Json RolloutControl::update_weights_from_disk(const ControlRequest& request) {
  const std::filesystem::path path = checked_model_path(request);
  if (const std::optional<std::string> format = parameter(request, "load_format");
      format && *format != "auto" && *format != "safetensors") {
    throw invalid_request("load_format", fmt::format("load_format: '{}' is not auto or safetensors", *format));
  }
  Json answer = apply_weight_update(
      request, "model_path", /*flush_cache=*/true, /*wait_for_in_flight=*/false,
      [&](ModelRunner& runner) { runner.load_weights_from_disk(path); }, fmt::format("loaded {}", path.string()));
  answer["num_paused_requests"] = 0;
  return answer;
}

Json RolloutControl::apply_weight_update(const ControlRequest& request, const std::string& param, bool flush_cache,
                                         bool wait_for_in_flight, const std::function<void(ModelRunner&)>& load,
                                         const std::string& message) {
  const std::optional<std::string> version = parameter(request, "weight_version");
  const bool abort_all = bool_parameter(request, "abort_all_requests").value_or(false);
  std::lock_guard lock(mutex_);
  // Paused by the trainer, the update goes in at once (requests kept by pause?mode=keep continue with the new weights
  // on /resume); otherwise requests in flight are aborted or waited for, and those that come meanwhile are held.
  const bool pause = !context_.engine.paused() && (abort_all || wait_for_in_flight);
  if (pause) context_.engine.pause(abort_all ? PauseMode::Abort : PauseMode::Wait);
  try {
    // Between two steps (of every engine: data-parallel replicas switch together): no step runs with a mix of old and
    // new weights. The cached KV was computed with the old ones.
    context_.engine.run_on_model(load, [&](EngineCore& core) {
      if (flush_cache) core.reset_prefix_cache();
    });
    if (flush_cache) context_.engine.reset_prefix_cache();  // the data-parallel router's memory of the caches too
  } catch (const Error& failed) {
    if (pause) context_.engine.resume();
    throw invalid_request(param, fmt::format("{}: {} (the served weights are unchanged)", request.endpoint,
                                             failed.what()));
  }
  if (pause) context_.engine.resume();
  ++updates_;
  context_.engine.set_weight_version(version.value_or(std::to_string(updates_)));
  return Json{{"success", true}, {"message", message}, {kWeightVersionField, context_.engine.weight_version()}};
}

namespace {

constexpr const char* kDefaultGroupName = "weight_update_group";  // SGLang's default

int32_t int32_parameter(const ControlRequest& request, const std::string& key, int64_t low, int64_t high) {
  const std::optional<std::string> text = parameter(request, key);
  if (!text) throw invalid_request(key, fmt::format("{}: missing", key));
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text->data(), text->data() + text->size(), value);
  if (error != std::errc() || end != text->data() + text->size() || value < low || value > high) {
    throw invalid_request(key, fmt::format("{}: expected an integer in [{}, {}], got '{}'", key, low, high, *text));
  }
  return static_cast<int32_t>(value);
}

// torch's dtype names as SGLang's and SkyRL's clients send them ("bfloat16" or "torch.bfloat16"). Those the model never
// takes are read too, so that the update's bytes can be received and the tensor refused by name. `param` is the
// request's field, `field` the entry of it ("dtypes[2]").
DType torch_dtype(const std::string& text, const std::string& param, const std::string& field) {
  const std::string_view name = std::string_view(text).starts_with("torch.") ? std::string_view(text).substr(6) : text;
  static const std::map<std::string_view, DType> kDtypes = {
      {"bfloat16", DType::BF16}, {"float16", DType::F16}, {"half", DType::F16},    {"float32", DType::F32},
      {"float", DType::F32},     {"int32", DType::I32},   {"int64", DType::I64},   {"uint8", DType::U8},
      {"float8_e4m3fn", DType::F8_E4M3}};
  if (const auto found = kDtypes.find(name); found != kDtypes.end()) return found->second;
  throw invalid_request(param, fmt::format("{}: '{}' is not bfloat16, float16, float32, int32, int64, uint8 or "
                                           "float8_e4m3fn", field, text));
}

const Json& list_field(const Json& body, const std::string& key) {
  const Json* value = find_field(body, key);
  if (value == nullptr || !value->is_array()) {
    throw invalid_request(key, fmt::format("{}: expected a list, got {}", key, value ? value->type_name() : "nothing"));
  }
  return *value;
}

// The fields that announce an update's tensors: lists (SGLang's, and SkyRL's vLLM server since it batches), or one
// tensor's (SkyRL's remote engine, to SGLang and to vLLM alike, sends one tensor a call).
struct AnnouncementKeys {
  std::string name, dtype, shape;
};
const AnnouncementKeys kListKeys = {"names", "dtypes", "shapes"};
const AnnouncementKeys kOneTensorKeys = {"name", "dtype", "shape"};

// One announced tensor; `at` is its index in the lists ("[2]"), empty for the one-tensor fields.
TensorSpec announced_tensor(const Json& name, const Json& dtype, const Json& shape, const AnnouncementKeys& keys,
                            const std::string& at) {
  if (!name.is_string()) throw invalid_request(keys.name, keys.name + at + ": expected a string");
  if (!dtype.is_string()) throw invalid_request(keys.dtype, keys.dtype + at + ": expected a string");
  if (!shape.is_array()) throw invalid_request(keys.shape, keys.shape + at + ": expected a list of integers");
  TensorSpec spec;
  spec.name = name.get<std::string>();
  spec.dtype = torch_dtype(dtype.get<std::string>(), keys.dtype, keys.dtype + at);
  // Bounded, so that the byte count is well defined (the tensor is then received whole before it is judged).
  constexpr int64_t kMaxElements = int64_t{1} << 40;
  int64_t numel = 1;
  for (const Json& d : shape) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > kMaxElements) {
      throw invalid_request(keys.shape, fmt::format("{}{}: {} is not a dimension", keys.shape, at, d.dump()));
    }
    const int64_t dim = d.get<int64_t>();
    spec.shape.push_back(dim);
    numel = dim != 0 && numel > kMaxElements / dim ? kMaxElements + 1 : numel * dim;
  }
  if (numel > kMaxElements) {
    throw invalid_request(keys.shape, fmt::format("{}{}: more than 2^40 elements", keys.shape, at));
  }
  return spec;
}

// The tensors an update announces, in the order they are sent, and the field that names them (for refusals).
struct Announcement {
  std::vector<TensorSpec> specs;
  std::string names_key;
};

Announcement announced_tensors(const Json& body) {
  // SkyRL's packed buckets (several tensors in one broadcast, unpacked by `sizes`) are another wire format.
  if (const Json* sizes = find_field(body, "sizes"); sizes != nullptr && !sizes->is_null()) {
    throw invalid_request("sizes", "sizes: packed buckets (several tensors in one transfer) are not taken; leave "
                                   "sizes null and send each tensor on its own");
  }
  const Json* one_name = find_field(body, "name");
  if (one_name != nullptr && find_field(body, "names") != nullptr) {
    throw invalid_request("name", "name: give either names, dtypes, shapes (lists) or name, dtype, shape (one "
                                  "tensor), not both");
  }
  if (one_name != nullptr) {
    const Json* dtype = find_field(body, "dtype");
    const Json* shape = find_field(body, "shape");
    if (dtype == nullptr) throw invalid_request("dtype", "dtype: missing (the tensor's torch dtype)");
    if (shape == nullptr) throw invalid_request("shape", "shape: missing (the tensor's shape)");
    return {{announced_tensor(*one_name, *dtype, *shape, kOneTensorKeys, "")}, kOneTensorKeys.name};
  }
  const Json& names = list_field(body, "names");
  const Json& dtypes = list_field(body, "dtypes");
  const Json& shapes = list_field(body, "shapes");
  if (names.empty()) throw invalid_request("names", "names: no tensors");
  if (dtypes.size() != names.size() || shapes.size() != names.size()) {
    throw invalid_request("names", fmt::format("names, dtypes, shapes: {}, {} and {} entries (one each per tensor)",
                                               names.size(), dtypes.size(), shapes.size()));
  }
  Announcement announcement{{}, kListKeys.name};
  for (std::size_t i = 0; i < names.size(); ++i) {
    announcement.specs.push_back(announced_tensor(names[i], dtypes[i], shapes[i], kListKeys, fmt::format("[{}]", i)));
  }
  return announcement;
}

// The group a call is for: its group_name; without one, the only group there is (SkyRL names its group when it makes
// it, not in the calls that follow), or among several the one of SGLang's default name.
template <typename Groups>
std::string group_of(const ControlRequest& request, const Groups& groups) {
  if (std::optional<std::string> name = parameter(request, "group_name")) return *name;
  if (groups.size() == 1) return groups.begin()->first;
  if (groups.contains(kDefaultGroupName)) return kDefaultGroupName;
  if (groups.empty()) {
    throw invalid_request("group_name", "group_name: there is no weight update group (make one with "
                                        "/init_weights_update_group or /init_weight_update_communicator; a failed "
                                        "transfer closes its group)");
  }
  std::string names;
  for (const auto& [name, group] : groups) names += fmt::format("{}'{}'", names.empty() ? "" : ", ", name);
  throw invalid_request("group_name", fmt::format("group_name: missing, and there are {} weight update groups ({}): "
                                                  "name one", groups.size(), names));
}

}  // namespace

Json RolloutControl::init_weights_update_group(const ControlRequest& request) {
  WeightGroupOptions options;
  const std::string address_key = key_used(request, "master_address", "master_addr");
  options.master_address = parameter(request, address_key).value_or("");
  if (options.master_address.empty()) throw invalid_request(address_key, address_key + ": missing");
  options.master_port = int32_parameter(request, "master_port", 1, 65535);
  options.rank_offset = int32_parameter(request, "rank_offset", 1, INT32_MAX - 1);
  options.world_size = int32_parameter(request, "world_size", 2, INT32_MAX);
  options.group_name = parameter(request, "group_name").value_or(kDefaultGroupName);
  options.backend = parameter(request, "backend").value_or("nccl");  // SGLang's default
  options.timeout_seconds = weight_sync_timeout_seconds_;
  if (options.rank_offset >= options.world_size) {
    throw invalid_request("rank_offset", fmt::format("rank_offset: {} is not a rank of a world of {} (the trainer is "
                                                     "rank 0)", options.rank_offset, options.world_size));
  }
  // SkyRL's dtype of every tensor it will send: checked here; each update names its tensors' dtypes again.
  if (const std::optional<std::string> dtype = parameter(request, "model_dtype_str")) {
    torch_dtype(*dtype, "model_dtype_str", "model_dtype_str");
  }
  const std::string override_key = key_used(request, "override_existing", "override_existing_receiver");
  const bool replace = bool_parameter(request, override_key).value_or(false);
  std::lock_guard lock(groups_mutex_);
  if (groups_.contains(options.group_name)) {
    if (!replace) {
      throw invalid_request("group_name", fmt::format("group_name: '{}' exists; /destroy_weights_update_group first "
                                                      "(or {} true)", options.group_name, override_key));
    }
    groups_.erase(options.group_name);  // its connection closes: the trainer sees the old group gone
    spdlog::info("weight update group '{}' replaced ({} true)", options.group_name, override_key);
  }
  try {
    groups_[options.group_name] = WeightUpdateGroup::join(options);
  } catch (const Error& failed) {
    throw invalid_request(address_key, fmt::format("{}: {}", request.endpoint, failed.what()));
  }
  return Json{{"success", true},
              {"message", fmt::format("joined weight update group '{}' as rank {} of {} ({})", options.group_name,
                                      options.rank_offset, options.world_size, options.backend)}};
}

Json RolloutControl::update_weights_from_distributed(const ControlRequest& request) {
  const bool flush_cache = bool_parameter(request, "flush_cache").value_or(true);
  if (const std::optional<std::string> format = parameter(request, "load_format"); format && *format != "auto") {
    throw invalid_request("load_format", fmt::format("load_format: '{}' is not supported (only tensor by tensor)", *format));
  }
  std::vector<HostTensor> received;
  std::string group_name;
  std::string names_key = kListKeys.name;
  {
    std::lock_guard lock(groups_mutex_);
    group_name = group_of(request, groups_);
    const auto group = groups_.find(group_name);
    if (group == groups_.end()) {
      throw invalid_request("group_name", fmt::format("group_name: no weight update group '{}' "
                                                      "(/init_weights_update_group or /init_weight_update_communicator "
                                                      "first)", group_name));
    }
    // The trainer is sending already. A failure here leaves the group out of step with it, so the group is closed,
    // which the trainer sees as a closed connection rather than a hang.
    try {
      const Announcement announcement = announced_tensors(request.body);
      names_key = announcement.names_key;
      received = group->second->receive(announcement.specs);
    } catch (const std::exception& failed) {  // bad_alloc too: a tensor larger than the host can stage
      groups_.erase(group);
      const ApiError* api_error = dynamic_cast<const ApiError*>(&failed);
      throw invalid_request(api_error ? api_error->param().value_or("group_name") : "group_name",
                            fmt::format("{}: {} (group '{}' closed; the served weights are unchanged)",
                                        request.endpoint, failed.what(), group_name));
    }
  }
  // Every tensor has arrived: checked against the model and applied together, or not at all (the group stays open).
  // As SGLang, no request in flight straddles two weight versions unless the trainer paused generation itself.
  return apply_weight_update(
      request, names_key, flush_cache, /*wait_for_in_flight=*/true,
      [&](ModelRunner& runner) { runner.update_weights(received); },
      fmt::format("updated {} tensor(s) from weight update group '{}'", received.size(), group_name));
}

Json RolloutControl::destroy_weights_update_group(const ControlRequest& request) {
  std::lock_guard lock(groups_mutex_);
  const std::string group_name = group_of(request, groups_);
  if (groups_.erase(group_name) == 0) {
    throw invalid_request("group_name", fmt::format("group_name: no weight update group '{}'", group_name));
  }
  spdlog::info("destroyed weight update group '{}'", group_name);
  return Json{{"success", true}, {"message", fmt::format("destroyed weight update group '{}'", group_name)}};
}

}  // namespace beamline::server
