#include "runner/step_message.h"

#include <cstdint>
#include <cstring>

#include "util/error.h"

namespace beamline {
namespace {

constexpr int32_t kStep = 1, kStop = 2, kWeights = 3;

class Reader {
 public:
  explicit Reader(std::span<const std::byte> bytes) : bytes_(bytes) {}
  int32_t next() {
    require(at_ + sizeof(int32_t) <= bytes_.size(), "step message: truncated at byte {} of {}", at_, bytes_.size());
    int32_t value = 0;
    std::memcpy(&value, bytes_.data() + at_, sizeof value);
    at_ += sizeof value;
    return value;
  }
  std::vector<int32_t> list() {
    const int32_t count = next();
    require(count >= 0 && static_cast<std::size_t>(count) * sizeof(int32_t) <= bytes_.size() - at_,
            "step message: a list of {} words at byte {} overruns the {} bytes", count, at_, bytes_.size());
    std::vector<int32_t> values(static_cast<std::size_t>(count));
    std::memcpy(values.data(), bytes_.data() + at_, values.size() * sizeof(int32_t));
    at_ += values.size() * sizeof(int32_t);
    return values;
  }
  std::string text() {
    const int32_t length = next();
    require(length >= 0 && static_cast<std::size_t>(length) <= bytes_.size() - at_,
            "step message: a string of {} bytes at byte {} overruns the {} bytes", length, at_, bytes_.size());
    std::string value(reinterpret_cast<const char*>(bytes_.data() + at_), static_cast<std::size_t>(length));
    at_ += (static_cast<std::size_t>(length) + 3) / 4 * 4;
    require(at_ <= bytes_.size(), "step message: a string's padding overruns the {} bytes", bytes_.size());
    return value;
  }
  bool done() const { return at_ == bytes_.size(); }

 private:
  std::span<const std::byte> bytes_;
  std::size_t at_ = 0;
};

ForwardBatch read_batch(Reader& reader) {
  ForwardBatch batch;
  batch.tokens = reader.list();
  const int32_t sequences = reader.next();
  require(sequences >= 0, "step message: {} sequences", sequences);
  for (int32_t s = 0; s < sequences; ++s) {
    SequenceSlice sequence;
    sequence.token_begin = reader.next();
    sequence.token_end = reader.next();
    sequence.context_begin = reader.next();
    const int32_t groups = reader.next();
    require(groups >= 0, "step message: sequence {} has {} block tables", s, groups);
    for (int32_t g = 0; g < groups; ++g) sequence.block_tables.push_back(reader.list());
    batch.sequences.push_back(std::move(sequence));
  }
  batch.logit_rows = reader.list();
  batch.capture_routed_experts = reader.next() != 0;
  const int32_t deferred = reader.next();
  require(deferred >= 0, "step message: {} deferred tokens", deferred);
  for (int32_t d = 0; d < deferred; ++d) {
    const int32_t row = reader.next();
    batch.deferred_tokens.push_back({row, reader.next()});
  }
  return batch;
}

}  // namespace

std::vector<std::byte> encode_step_message(const ReplicaBatches* plan) {
  std::vector<int32_t> words{plan == nullptr ? kStop : kStep};
  auto list = [&](const std::vector<int32_t>& values) {
    words.push_back(static_cast<int32_t>(values.size()));
    words.insert(words.end(), values.begin(), values.end());
  };
  auto batch_words = [&](const ForwardBatch& batch) {
    list(batch.tokens);
    words.push_back(static_cast<int32_t>(batch.sequences.size()));
    for (const SequenceSlice& sequence : batch.sequences) {
      words.insert(words.end(), {sequence.token_begin, sequence.token_end, sequence.context_begin,
                                 static_cast<int32_t>(sequence.block_tables.size())});
      for (const std::vector<int32_t>& table : sequence.block_tables) list(table);
    }
    list(batch.logit_rows);
    words.push_back(batch.capture_routed_experts ? 1 : 0);
    words.push_back(static_cast<int32_t>(batch.deferred_tokens.size()));
    for (const DeferredToken& deferred : batch.deferred_tokens) words.insert(words.end(), {deferred.row, deferred.source});
  };
  if (plan != nullptr) {
    words.push_back(static_cast<int32_t>(plan->size()));
    for (const std::optional<ForwardBatch>& batch : *plan) {
      words.push_back(batch.has_value() ? 1 : 0);
      if (batch) batch_words(*batch);
    }
  }
  std::vector<std::byte> bytes(words.size() * sizeof(int32_t));
  std::memcpy(bytes.data(), words.data(), bytes.size());
  return bytes;
}

std::vector<std::byte> encode_weight_update_message(const WeightUpdateOrder& order) {
  std::vector<int32_t> words{kWeights};
  auto text = [&](const std::string& value) {
    words.push_back(static_cast<int32_t>(value.size()));
    const std::size_t at = words.size();
    words.resize(at + (value.size() + 3) / 4, 0);
    std::memcpy(words.data() + at, value.data(), value.size());
  };
  text(order.directory);
  words.push_back(static_cast<int32_t>(order.tensors.size()));
  for (const TensorView& tensor : order.tensors) {
    text(tensor.name);
    words.push_back(static_cast<int32_t>(tensor.dtype));
    words.push_back(static_cast<int32_t>(tensor.shape.size()));
    for (int64_t extent : tensor.shape) {
      require(extent >= 0 && extent <= INT32_MAX, "weight update: tensor \"{}\" has extent {}", tensor.name, extent);
      words.push_back(static_cast<int32_t>(extent));
    }
  }
  std::vector<std::byte> bytes(words.size() * sizeof(int32_t));
  std::memcpy(bytes.data(), words.data(), bytes.size());
  return bytes;
}

StepMessage decode_step_message(std::span<const std::byte> bytes) {
  Reader reader(bytes);
  StepMessage message;
  const int32_t kind = reader.next();
  require(kind == kStep || kind == kStop || kind == kWeights, "step message: unknown kind {}", kind);
  if (kind == kStop) {
    require(reader.done(), "step message: bytes left after the stop");
    return message;
  }
  if (kind == kWeights) {
    message.kind = StepMessage::Kind::Weights;
    message.weights.directory = reader.text();
    const int32_t tensors = reader.next();
    require(tensors >= 0, "step message: {} tensors", tensors);
    for (int32_t t = 0; t < tensors; ++t) {
      TensorView tensor;
      tensor.name = reader.text();
      const int32_t dtype = reader.next();
      require(dtype >= 0 && dtype <= static_cast<int32_t>(DType::I64), "step message: tensor \"{}\" has dtype {}",
              tensor.name, dtype);
      tensor.dtype = static_cast<DType>(dtype);
      const std::vector<int32_t> shape = reader.list();
      tensor.shape.assign(shape.begin(), shape.end());
      tensor.nbytes = static_cast<std::size_t>(tensor.numel()) * dtype_size(tensor.dtype);
      message.weights.tensors.push_back(std::move(tensor));
    }
    require(reader.done(), "step message: bytes left after the weight update");
    return message;
  }
  message.kind = StepMessage::Kind::Step;
  const int32_t replicas = reader.next();
  require(replicas >= 1, "step message: {} data-parallel replicas", replicas);
  for (int32_t r = 0; r < replicas; ++r) {
    const int32_t present = reader.next();
    require(present == 0 || present == 1, "step message: replica {} has presence word {}", r, present);
    message.plan.push_back(present == 1 ? std::optional<ForwardBatch>(read_batch(reader)) : std::nullopt);
  }
  require(reader.done(), "step message: bytes left after the plan");
  return message;
}

}  // namespace beamline
