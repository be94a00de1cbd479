#pragma once
// The communicators of one rank: its tensor-parallel group, its pipeline (the same tensor-parallel rank of every
// stage), its data-parallel group, and with --enable-expert-parallel its expert group (every data x tensor rank of
// its stage), plus the whole world over host memory for step plans. On CUDA the tensor groups use NCCL, on the CPU
// MPI; a tensor-parallel group also has its fused all-reduce + norm (parallel/fused_all_reduce_norm.h).
#include <memory>

#include "backend/backend.h"
#include "parallel/communicator.h"
#include "parallel/fused_all_reduce_norm.h"
#include "parallel/mpi_world.h"
#include "parallel/parallel_config.h"

namespace beamline {

struct ParallelGroups {
  ParallelConfig config;
  RankCoordinates at;
  int32_t world_rank = 0;
  std::unique_ptr<Communicator> world;                       // host values only
  std::unique_ptr<Communicator> tensor, pipeline, data;      // ranks ordered by coordinate
  std::unique_ptr<Communicator> expert;                      // null without --enable-expert-parallel
  // The sandwich norms' all-reduce (null at --tensor-parallel-size 1). Declared last: it goes before the groups.
  std::unique_ptr<FusedAllReduceNorm> fused_norm;

  int32_t expert_rank() const { return at.data * config.tensor + at.tensor; }
  bool first_stage() const { return at.pipeline == 0; }
  bool last_stage() const { return at.pipeline == config.pipeline - 1; }
};

// Collective over the world, whose size must be config.world_size() (an Error naming the flags otherwise).
std::unique_ptr<ParallelGroups> make_parallel_groups(MpiWorld& world, const ParallelConfig& config, Backend& backend);

}  // namespace beamline
