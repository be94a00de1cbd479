#pragma once
// How a model is spread over processes, with vLLM's flags and meanings (docs/parallel.md): --tensor-parallel-size,
// --pipeline-parallel-size, --data-parallel-size, --enable-expert-parallel, and --distributed-timeout-seconds.
// World ranks are ordered data-parallel rank, then pipeline stage, then tensor-parallel rank (the fastest), so that
// one tensor-parallel group sits on consecutive ranks (one node's GPUs).
#include <cstdint>
#include <string>

namespace beamline {

struct ParallelConfig {
  int32_t tensor = 1;            // --tensor-parallel-size
  int32_t pipeline = 1;          // --pipeline-parallel-size
  int32_t data = 1;              // --data-parallel-size
  bool expert = false;           // --enable-expert-parallel: experts over data x tensor ranks, not split inside
  double timeout_seconds = 600;  // --distributed-timeout-seconds: the longest wait for a peer in one collective
  // With pipeline parallelism: a step's sequences split into this many micro-batches that follow each other through
  // the stages, so that the stages work at once (0: one per stage; 1: off). No vLLM flag: vLLM overlaps whole
  // scheduler batches instead.
  int32_t pipeline_micro_batches = 0;
  // --data-parallel-routing: which engine a new request goes to (engine/prefix_router.h). No vLLM flag: vLLM's
  // internal balancer is least-loaded; prefix-aware routing is what its external routers (llm-d, the production
  // stack) add.
  std::string data_parallel_routing = "prefix-aware";

  int32_t world_size() const { return tensor * pipeline * data; }
  int32_t micro_batches() const { return pipeline_micro_batches > 0 ? pipeline_micro_batches : pipeline; }
  // Sizes must be >= 1 and the timeout positive; throws naming the flag.
  void validate() const;
};

// Where one world rank sits.
struct RankCoordinates {
  int32_t data = 0, pipeline = 0, tensor = 0;
};

RankCoordinates rank_coordinates(const ParallelConfig& config, int32_t world_rank);

}  // namespace beamline
