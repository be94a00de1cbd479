#include "runner/data_parallel_runner.h"

namespace beamline {
namespace {

class ReplicaRunner : public ModelRunner {
 public:
  ReplicaRunner(std::shared_ptr<BeamModelRunner> runner, int32_t replica)
      : runner_(std::move(runner)), replica_(replica) {}

  int32_t vocab_size() const override { return runner_->vocab_size(); }
  const KvCacheLayout& kv_layout() const override { return runner_->kv_layout(); }
  int32_t sliding_window() const override { return runner_->sliding_window(); }
  int64_t max_position_embeddings() const override { return runner_->max_position_embeddings(); }
  int64_t kv_bytes_per_block() const override { return runner_->kv_bytes_per_block(); }
  std::unique_ptr<ModelStep> launch(const ForwardBatch& batch) override {
    return runner_->launch_replica(replica_, batch);
  }
  void idle() override { runner_->replica_idle(replica_); }
  bool replays_decode_graphs() const override { return runner_->replays_decode_graphs(); }
  // The replicas' model is one: new weights through any replica's runner reach all of them.
  void load_weights_from_disk(const std::filesystem::path& dir) override { runner_->load_weights_from_disk(dir); }
  void update_weights(std::span<const HostTensor> tensors) override { runner_->update_weights(tensors); }

 private:
  std::shared_ptr<BeamModelRunner> runner_;
  int32_t replica_;
};

}  // namespace

std::vector<std::unique_ptr<ModelRunner>> data_parallel_runners(const std::shared_ptr<BeamModelRunner>& runner) {
  std::vector<std::unique_ptr<ModelRunner>> runners;
  for (int32_t r = 0; r < runner->data_parallel_size(); ++r) runners.push_back(std::make_unique<ReplicaRunner>(runner, r));
  return runners;
}

}  // namespace beamline
