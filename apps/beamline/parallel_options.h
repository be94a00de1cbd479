#pragma once
// The distributed-run flags (vLLM's names; docs/parallel.md) and how a command becomes its ranks: under mpirun as
// it is, or, started alone with more than one rank asked for, by running itself again under mpirun on this node.
#include <CLI/CLI.hpp>

#include "parallel/parallel_config.h"

namespace beamline::cli {

void add_parallel_options(CLI::App& command, ParallelConfig& config);

// Replaces this process with `mpirun -np world_size` of the same command line (one node, one rank per GPU), unless it
// already runs under MPI. Returns only when it does.
void relaunch_under_mpirun_unless_launched(const ParallelConfig& config);

// Every log line of this process says its rank: "[rank 1]".
void prefix_logs_with_rank(int32_t rank);

}  // namespace beamline::cli
