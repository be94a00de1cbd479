// Run under mpirun (tests/parallel/CMakeLists.txt): weight updates and routing replay of a distributed model
// (docs/rl.md), on the CPU backend, through BeamModelRunner as the server drives it (rank 0 launches, the others
// follow). A random MoE model A is served sharded with the given layout, then:
//   - an update whose tensor has the wrong shape is refused naming it, and A's logits stay, bit for bit;
//   - checkpoint B's tensors, received in two buckets as from a trainer, give the logits and routed experts of a
//     fresh distributed runner started on B, bit for bit (the same shard code slices the same bytes);
//   - B from disk (/update_weights_from_disk) gives them too;
//   - those logits are one process's on B within float32 summation (max |difference| <= 1e-5 x max |logit|: the
//     tensor-parallel partial sums are added in another order), and the routed experts equal one process's capture
//     at every token and MoE layer.
// With --quantization fp8|mxfp8|nvfp4 A is quantized at load and B's BF16 tensors on arrival: the sync then equals a
// fresh runner on B quantized at load, bit for bit. With --dp M the sequence runs on every data-parallel replica in
// turn (launch_replica, as each replica's engine drives it): one update reaches them all, and each replica's logits
// and routed experts are checked as above.
//   weight_sync_check --tp N --pp N --dp M [--ep] [--quantization fp8]
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_loader.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/presets.h"
#include "checkpoint/quantize_tensors.h"
#include "checkpoint/safetensors.h"
#include "engine/engine_config.h"
#include "mpi_check.h"
#include "parallel/mpi_world.h"
#include "runner/beam_model_runner.h"
#include "runner/kv_cache.h"
#include "util/error.h"

namespace beamline {
namespace {

constexpr double kTolerance = 1e-5;

struct Options {
  ParallelConfig parallel;
  std::string quantization;
};

Options parse(int argc, char** argv) {
  Options options;
  options.parallel = parse_check_args(argc, argv, 60, [&](const std::string& flag, const auto& value) {
    if (flag != "--quantization") return false;
    options.quantization = value();
    return true;
  });
  return options;
}

// The logits of every position and the routed experts of every row, of one sequence fed as a prefill, two decode
// steps and a chunk.
struct Outputs {
  std::vector<float> logits;
  std::vector<int16_t> routed;
};

// `launch` starts a step of `runner` (or of one of its data-parallel replicas).
Outputs run_sequence(const ModelRunner& runner,
                     const std::function<std::unique_ptr<ModelStep>(const ForwardBatch&)>& launch) {
  std::vector<int32_t> tokens;
  uint32_t state = 12345u;
  for (int i = 0; i < 14; ++i) {
    state = state * 1664525u + 1013904223u;
    tokens.push_back(static_cast<int32_t>((state >> 8) % static_cast<uint32_t>(runner.vocab_size())));
  }
  SingleSequenceBlocks blocks(runner.kv_layout(), runner.sliding_window());
  Outputs outputs;
  for (int32_t at = 0; at < static_cast<int32_t>(tokens.size());) {
    const int32_t count = at == 0 ? 7 : (at < 9 ? 1 : static_cast<int32_t>(tokens.size()) - at);
    ForwardBatch batch;
    batch.tokens.assign(tokens.begin() + at, tokens.begin() + at + count);
    batch.sequences.push_back(SequenceSlice{0, count, at, blocks.prepare(at, at + count)});
    std::vector<RowSampling> rows;
    std::vector<int32_t> logit_rows;
    for (int32_t r = 0; r < count; ++r) {
      batch.logit_rows.push_back(r);
      logit_rows.push_back(r);
      RowSampling row;
      row.settings.logit_row = r;
      row.settings.greedy = true;
      rows.push_back(std::move(row));
    }
    batch.capture_routed_experts = true;
    std::unique_ptr<ModelStep> step = launch(batch);
    step->sample(std::move(rows));
    (void)step->tokens();
    const std::vector<float> logits = step->raw_logits(logit_rows);
    outputs.logits.insert(outputs.logits.end(), logits.begin(), logits.end());
    const RoutedExperts routed = step->routed_experts();
    require(routed.ids.size() == static_cast<std::size_t>(count) * routed.row_width() && !routed.ids.empty(),
            "{} routed expert ids for {} rows", routed.ids.size(), count);
    outputs.routed.insert(outputs.routed.end(), routed.ids.begin(), routed.ids.end());
    at += count;
  }
  return outputs;
}

// The sequence on one process, or on each data-parallel replica in turn (their outputs one after the other).
Outputs run_sequence(BeamModelRunner& runner) {
  if (runner.data_parallel_size() == 1)
    return run_sequence(runner, [&](const ForwardBatch& batch) { return runner.launch(batch); });
  Outputs all;
  for (int32_t replica = 0; replica < runner.data_parallel_size(); ++replica) {
    const Outputs one =
        run_sequence(runner, [&](const ForwardBatch& batch) { return runner.launch_replica(replica, batch); });
    runner.replica_idle(replica);  // the next replica's steps do not wait for this one's
    all.logits.insert(all.logits.end(), one.logits.begin(), one.logits.end());
    all.routed.insert(all.routed.end(), one.routed.begin(), one.routed.end());
  }
  return all;
}

// A checkpoint's tensors as a trainer sends them: bytes of their own.
std::vector<HostTensor> trainer_tensors(const std::filesystem::path& dir) {
  const std::shared_ptr<const SafetensorsArchive> archive = SafetensorsArchive::open(dir);
  std::vector<HostTensor> tensors;
  for (const std::string& name : archive->tensor_names()) {
    const TensorView& view = archive->at(name);
    auto bytes = std::make_shared<std::vector<std::byte>>(view.data, view.data + view.nbytes);
    tensors.push_back({TensorView{view.name, view.dtype, view.shape, bytes->data(), bytes->size()}, std::move(bytes)});
  }
  return tensors;
}

class Check {
 public:
  Check(const Options& options, MpiWorld& world, std::filesystem::path dir)
      : options_(options), world_(world), dir_(std::move(dir)) {
    config_.kv_cache_memory_bytes = int64_t{1} << 20;
    config_.max_num_seqs = 4;
    config_.enable_return_routed_experts = true;
  }

  BeamWeights weights(const char* name) const {
    BeamWeights weights = load_checkpoint(dir_ / name);
    if (options_.quantization.empty()) return weights;
    return quantize_weights(std::move(weights),
                            quantization_config_for(parse_quantization_flag(options_.quantization), {"lm_head"}));
  }

  // Every rank builds the distributed runner on `weights`; rank 0 runs `drive` on it, the others follow until it stops.
  template <typename Drive>
  void distributed(const BeamWeights& weights, Drive drive) {
    BeamModelRunner runner(weights, "cpu", config_, world_, options_.parallel);
    if (world_.rank() == 0) {
      drive(runner);
    } else {
      runner.follow();
    }
  }

  int run() {
    Outputs served_a, after_refusal, synced, fresh, from_disk;
    std::string refusal;
    const std::vector<HostTensor> next = world_.rank() == 0 ? trainer_tensors(dir_ / "b") : std::vector<HostTensor>{};
    distributed(weights("a"), [&](BeamModelRunner& runner) {
      served_a = run_sequence(runner);
      std::vector<HostTensor> bad{next.front()};
      bad.front().view.shape.push_back(1);  // one extent too many
      try {
        runner.update_weights(bad);
      } catch (const Error& error) {
        refusal = error.what();
      }
      after_refusal = run_sequence(runner);
      const std::size_t half = next.size() / 2;
      runner.update_weights(std::span(next).first(half));
      runner.update_weights(std::span(next).subspan(half));
      synced = run_sequence(runner);
    });
    distributed(weights("b"), [&](BeamModelRunner& runner) { fresh = run_sequence(runner); });
    distributed(weights("a"), [&](BeamModelRunner& runner) {
      runner.load_weights_from_disk(dir_ / "b");
      from_disk = run_sequence(runner);
    });
    if (world_.rank() != 0) return 0;

    BeamModelRunner one_process(weights("b"), "cpu", config_);
    Outputs whole;
    for (int32_t replica = 0; replica < options_.parallel.data; ++replica) {  // what every replica must give
      const Outputs one = run_sequence(one_process);
      whole.logits.insert(whole.logits.end(), one.logits.begin(), one.logits.end());
      whole.routed.insert(whole.routed.end(), one.routed.begin(), one.routed.end());
    }

    int failures = 0;
    const auto expect = [&](bool ok, const std::string& what) {
      spdlog::info("{}: {}", ok ? "pass" : "FAIL", what);
      failures += ok ? 0 : 1;
    };
    const auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    };
    expect(refusal.find("tensor \"" + next.front().view.name + "\": expected shape") != std::string::npos,
           "a tensor of the wrong shape is refused naming it: " + refusal);
    expect(same_bits(after_refusal.logits, served_a.logits), "after the refusal the old weights serve, bit for bit");
    expect(!same_bits(synced.logits, served_a.logits), "the update changed the logits");
    expect(same_bits(synced.logits, fresh.logits), "after the sync: the logits of a fresh distributed runner, bit for bit");
    expect(synced.routed == fresh.routed, "after the sync: the routed experts of a fresh distributed runner");
    expect(same_bits(from_disk.logits, fresh.logits), "from disk: the logits of a fresh distributed runner, bit for bit");
    const LogitsDifference difference = logits_difference(synced.logits, whole.logits, "after the sync");
    expect(difference.within(kTolerance),
           fmt::format("one process's logits within float32 summation: max |difference| {:.3g} = {:.3g} of max |logit|",
                       difference.worst, difference.relative()));
    std::size_t differing = 0;
    for (std::size_t i = 0; i < std::min(whole.routed.size(), synced.routed.size()); ++i)
      differing += whole.routed[i] != synced.routed[i] ? 1 : 0;
    expect(whole.routed.size() == synced.routed.size() && differing == 0,
           fmt::format("one process's routed experts: {} ids, {} differ", whole.routed.size(), differing));
    return failures == 0 ? 0 : 1;
  }

 private:
  const Options& options_;
  MpiWorld& world_;
  std::filesystem::path dir_;
  EngineConfig config_;
};

int check(int argc, char** argv) {
  const Options options = parse(argc, argv);
  MpiWorld world(options.parallel.timeout_seconds);
  // Rank 0 writes both checkpoints; every rank maps them.
  std::unique_ptr<Communicator> everyone = world.split("test", 0, world.rank());
  const std::filesystem::path dir = shared_scratch_path(*everyone, "beamline-weight-sync");
  const ModelConfig config = preset_config("tiny");
  if (world.rank() == 0) {
    write_random_checkpoint(config, dir / "a", 11);
    write_random_checkpoint(config, dir / "b", 12);
  }
  everyone->barrier();
  int result = 1;
  try {
    result = Check(options, world, dir).run();
  } catch (...) {
    if (world.rank() == 0) std::filesystem::remove_all(dir);
    throw;
  }
  everyone->barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
  return result;
}

}  // namespace
}  // namespace beamline

int main(int argc, char** argv) { return beamline::run_check(beamline::check, argc, argv); }
