#include "model/lora_table.h"

#include <algorithm>

#include "util/error.h"

namespace beamline {

LoraTableStore::LoraTableStore(Backend& backend, int32_t slots, int64_t experts, int64_t in, int64_t out)
    : backend_(backend),
      experts_(experts),
      entries_(static_cast<std::size_t>(slots * experts * 3), 0),
      slot_a_(static_cast<std::size_t>(slots)),
      slot_b_(static_cast<std::size_t>(slots)) {
  require(slots >= 1 && experts >= 1 && in >= 1 && out >= 1, "lora: a table of {} slots x {} experts, {} -> {}", slots,
          experts, in, out);
  table_.in = in;
  table_.out = out;
  table_.max_rank = 1;
  table_.entries = backend_.upload(entries_.data(), DType::I64, {slots * experts, 3});
}

void LoraTableStore::load(int32_t slot, std::span<const LoraModule* const> modules) {
  require(slot >= 0 && static_cast<std::size_t>(slot) < slot_a_.size() &&
              static_cast<int64_t>(modules.size()) == experts_,
          "lora: slot {} with {} modules, for a table of {} slots x {} experts", slot, modules.size(), slot_a_.size(),
          experts_);
  const int64_t in = table_.in, out = table_.out;
  int64_t rows = 0;
  for (std::size_t e = 0; e < modules.size(); ++e) {
    const LoraModule* module = modules[e];
    if (module == nullptr) continue;
    require(module->in == in && module->out == out && module->rank >= 1 &&
                static_cast<int64_t>(module->a.size()) == module->rank * in &&
                static_cast<int64_t>(module->b.size()) == out * module->rank,
            "lora: layer {} expert {} {}: rank {}, [{}, {}] with {} / {} values, where the model has [{}, {}]",
            module->layer, e, lora_projection_name(module->projection), module->rank, module->out, module->in,
            module->a.size(), module->b.size(), out, in);
    rows += module->rank;
  }
  // The slot's matrices back to back: expert e's A at row `first` of a, its B at b + first * out.
  std::vector<float> a(static_cast<std::size_t>(rows * in)), b(static_cast<std::size_t>(rows * out));
  std::vector<int64_t> first(modules.size(), 0);
  int64_t next = 0;
  for (std::size_t e = 0; e < modules.size(); ++e) {
    if (modules[e] == nullptr) continue;
    first[e] = next;
    std::copy(modules[e]->a.begin(), modules[e]->a.end(), a.begin() + next * in);
    std::copy(modules[e]->b.begin(), modules[e]->b.end(), b.begin() + next * out);
    next += modules[e]->rank;
  }
  const auto s = static_cast<std::size_t>(slot);
  slot_a_[s] = rows > 0 ? backend_.upload(a.data(), DType::F32, {rows, in}) : Tensor();
  slot_b_[s] = rows > 0 ? backend_.upload(b.data(), DType::F32, {rows, out}) : Tensor();
  for (std::size_t e = 0; e < modules.size(); ++e) {
    int64_t* entry = entries_.data() + (slot * experts_ + static_cast<int64_t>(e)) * 3;
    const LoraModule* module = modules[e];
    entry[0] = module == nullptr ? 0 : reinterpret_cast<int64_t>(slot_a_[s].data<float>() + first[e] * in);
    entry[1] = module == nullptr ? 0 : reinterpret_cast<int64_t>(slot_b_[s].data<float>() + first[e] * out);
    entry[2] = module == nullptr ? 0 : module->rank;
  }
  int64_t max_rank = 1;
  for (std::size_t i = 2; i < entries_.size(); i += 3) max_rank = std::max(max_rank, entries_[i]);
  table_.max_rank = max_rank;
  backend_.copy_to(table_.entries, entries_.data());
}

int64_t LoraTableStore::bytes() const {
  int64_t total = 0;
  for (std::size_t s = 0; s < slot_a_.size(); ++s)
    if (slot_a_[s].defined()) total += static_cast<int64_t>(slot_a_[s].nbytes() + slot_b_[s].nbytes());
  return total;
}

}  // namespace beamline
