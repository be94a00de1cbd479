#include "parallel_options.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "parallel/mpi_world.h"
#include "util/error.h"

namespace beamline::cli {

void add_parallel_options(CLI::App& command, ParallelConfig& config) {
  command.add_option("--tensor-parallel-size", config.tensor,
                     "ranks that split each layer (attention heads, MLP columns, vocabulary); one GPU each")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command.add_option("--pipeline-parallel-size", config.pipeline, "pipeline stages, each a range of layers")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command.add_option("--data-parallel-size", config.data,
                     "model replicas, each with its own engine (scheduler, KV cache) behind one endpoint; with "
                     "--enable-expert-parallel they share the experts")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command.add_option("--data-parallel-routing", config.data_parallel_routing,
                     "where a new request goes among data-parallel engines: prefix-aware (the engine that took the "
                     "longest prefix of its prompt, unless it is well above the least loaded; needs prefix caching) "
                     "or least-loaded (fewest unfinished requests, vLLM's rule)")
      ->check(CLI::IsMember({"prefix-aware", "least-loaded"}))
      ->capture_default_str();
  command.add_flag("--enable-expert-parallel", config.expert,
                   "spread whole experts over the data x tensor ranks instead of splitting every expert");
  command.add_option("--distributed-timeout-seconds", config.timeout_seconds,
                     "longest wait for another rank in one collective before the run stops with an error (also a "
                     "weight update group's wait for its trainer, docs/rl.md)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

void relaunch_under_mpirun_unless_launched(const ParallelConfig& config) {
  if (config.world_size() == 1 || launched_by_mpi()) return;
  std::ifstream file("/proc/self/cmdline", std::ios::binary);
  const std::string cmdline((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  std::vector<std::string> original;
  for (std::size_t at = 0; at < cmdline.size();) {
    const std::size_t end = cmdline.find('\0', at);
    original.push_back(cmdline.substr(at, end - at));
    at = end == std::string::npos ? cmdline.size() : end + 1;
  }
  char exe[4096];
  const ssize_t length = readlink("/proc/self/exe", exe, sizeof exe - 1);
  require(length > 0 && !original.empty(), "cannot read this process's command line to start its ranks");
  exe[length] = '\0';
  // One node: every rank here, not bound to cores (each rank runs its own threads), as many ranks as asked even when
  // they outnumber the cores.
  std::vector<std::string> args{"mpirun", "-np", std::to_string(config.world_size()), "--bind-to", "none",
                                "--oversubscribe"};
  if (geteuid() == 0) args.push_back("--allow-run-as-root");
  args.push_back(exe);
  args.insert(args.end(), original.begin() + 1, original.end());
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  spdlog::info("starting {} ranks: mpirun -np {} {} ...", config.world_size(), config.world_size(), exe);
  execvp("mpirun", argv.data());
  fail("could not start mpirun for {} ranks ({}): install Open MPI (openmpi-bin) or start the ranks with mpirun yourself",
       config.world_size(), std::strerror(errno));
}

void prefix_logs_with_rank(int32_t rank) {
  spdlog::set_pattern(fmt::format("[%Y-%m-%d %H:%M:%S.%e] [rank {}] [%^%l%$] %v", rank));
}

}  // namespace beamline::cli
