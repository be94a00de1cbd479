#include "parallel/fused_all_reduce_norm.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "util/error.h"

namespace beamline {

FusedAllReduceMode fused_all_reduce_mode() {
  const char* value = std::getenv("BEAMLINE_FUSED_ALLREDUCE_NORM");
  const std::string_view mode = value != nullptr ? value : "";
  if (mode == "auto") return FusedAllReduceMode::Auto;
  if (mode == "always") return FusedAllReduceMode::Always;
  if (mode.empty() || mode == "never") return FusedAllReduceMode::Never;
  fail("BEAMLINE_FUSED_ALLREDUCE_NORM={}: expected auto, always or never", mode);
}

FusedAllReduceNorm::FusedAllReduceNorm(Communicator& group, Backend& backend) : group_(group) {
  std::string why_not;  // this rank's reason for the unfused path
  std::unique_ptr<PeerAllReduce> peers;
  try {
    peers = make_peer_all_reduce(backend);
  } catch (const std::exception& error) {
    why_not = error.what();
  }
  if (peers == nullptr && why_not.empty()) return;  // no peer memory on this backend (every rank's alike): unfused
  const FusedAllReduceMode mode = fused_all_reduce_mode();
  const auto mode_value = static_cast<int64_t>(mode);
  require(group.all_reduce_max(mode_value) == group.all_reduce_min(mode_value),
          "BEAMLINE_FUSED_ALLREDUCE_NORM differs between the ranks of the {}: set it alike for every rank", group.name());
  const bool leader = group.rank() == 0;
  if (mode == FusedAllReduceMode::Never) {
    if (leader) spdlog::info("{}: all-reduce, then the separate norm (BEAMLINE_FUSED_ALLREDUCE_NORM=never)", group.name());
    return;
  }
  if (group.size() > kMaxAllReduceRanks) {
    if (leader) spdlog::info("{}: all-reduce, then the separate norm (the fused kernel sums at most {} ranks)",
                             group.name(), kMaxAllReduceRanks);
    return;
  }
  // Every rank's handle to every rank (an empty one from a rank that has none: its peers then fail to connect).
  std::vector<std::vector<std::byte>> handles(static_cast<std::size_t>(group.size()));
  for (int32_t root = 0; root < group.size(); ++root) {
    std::vector<std::byte>& bytes = handles[static_cast<std::size_t>(root)];
    if (root == group.rank() && peers != nullptr) {
      try {
        bytes = peers->handle();
      } catch (const std::exception& error) {
        why_not = error.what();
      }
    }
    group.broadcast_bytes(bytes, root);
  }
  if (why_not.empty()) {
    try {
      peers->connect(handles, group.rank());
    } catch (const std::exception& error) {
      why_not = error.what();
    }
  }
  const int64_t failed = group.all_reduce_max(why_not.empty() ? -1 : group.rank());
  if (failed >= 0) {
    if (!why_not.empty()) spdlog::warn("{}: no fused all-reduce + norm: {}", group.name(), why_not);
    if (leader)
      spdlog::warn("{}: all-reduce, then the separate norm: rank {} (at least) could not share its memory", group.name(),
                   failed);
    return;
  }
  peers_ = std::move(peers);
  mode_ = mode;
  if (leader)
    spdlog::info("{}: all-reduce fused into the sandwich norms over peer memory up to {} rows ({}; "
                 "BEAMLINE_FUSED_ALLREDUCE_NORM={})",
                 group.name(), peers_->max_rows(),
                 mode == FusedAllReduceMode::Always ? "whenever the kernel can"
                                                    : fmt::format("messages up to {} bytes", kFusedAllReduceMaxBytes),
                 mode == FusedAllReduceMode::Always ? "always" : "auto");
}

FusedAllReduceNorm::~FusedAllReduceNorm() {
  if (peers_ != nullptr && group_.rank() == 0)
    spdlog::info("{}: fused all-reduce + norm: {} launches, {} rows", group_.name(), calls_, rows_);
}

bool FusedAllReduceNorm::fused(int64_t rows, int64_t hidden) const {
  if (peers_ == nullptr || rows < 1 || rows > peers_->max_rows() || hidden > peers_->max_hidden()) return false;
  return mode_ == FusedAllReduceMode::Always || rows * hidden * int64_t{sizeof(float)} <= kFusedAllReduceMaxBytes;
}

Tensor FusedAllReduceNorm::partial(int64_t rows, int64_t hidden) {
  require(fused(rows, hidden), "{}: no fused all-reduce for [{}, {}]", group_.name(), rows, hidden);
  return peers_->partial(rows, hidden);
}

void FusedAllReduceNorm::add_rms_norm(Tensor& residual, const Tensor& weight, float eps, float scale,
                                      const Tensor& next_weight, Tensor& out) {
  require(residual.rank() == 2 && fused(residual.dim(0), residual.dim(1)), "{}: no fused all-reduce for residual {}",
          group_.name(), describe(residual));
  peers_->add_rms_norm(residual, weight, eps, scale, next_weight, out);
  ++calls_;
  rows_ += residual.dim(0);
}

}  // namespace beamline
