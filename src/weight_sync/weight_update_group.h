#pragma once
// The server's end of a trainer's weight-update group (SGLang's /init_weights_update_group,
// /update_weights_from_distributed, /destroy_weights_update_group, or SkyRL's vLLM names for them; docs/rl.md). The
// trainer is rank 0 and the root of every broadcast; the server joins as rank `rank_offset` of `world_size` by
// connecting to the trainer's master_address:master_port. Protocol version 1, every integer little-endian, strings as
// u32 length + bytes:
//
//   server -> trainer   "BLWS" u32 version  i32 rank  i32 world_size  string group_name  string backend
//   trainer -> server   "BLWS" u32 status (0: accepted)  string message (why not, when refused)
//                       backend "nccl" and accepted: the 128-byte ncclUniqueId (the trainer, rank 0, made it)
//
// Then, for each /update_weights_from_distributed, the tensors in the order of its `names`:
//   backend "tcp":  trainer -> server   string name  u64 byte count  the bytes (row-major, in the call's dtype)
//   backend "nccl": ncclBroadcast from rank 0 of the byte count, over the communicator the id made (ncclUint8)
// The server closes the connection when the group is destroyed, and when a transfer failed (the group is then gone:
// the trainer makes it again). A trainer serving several servers writes each tensor to each
// connection (tcp) or broadcasts once (nccl).
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/tensor_view.h"

namespace beamline {

struct WeightGroupOptions {
  std::string master_address;  // where the trainer listens
  int32_t master_port = 0;
  int32_t rank_offset = 1;     // this server's rank in the group
  int32_t world_size = 2;      // the trainer and every server rank
  std::string group_name;
  std::string backend = "tcp"; // "tcp" (any server) or "nccl" (a CUDA build)
  double timeout_seconds = 600;  // the longest wait without progress (--distributed-timeout-seconds)
};

// A tensor the trainer announces: its checkpoint name, dtype and shape.
struct TensorSpec {
  std::string name;
  DType dtype = DType::BF16;
  std::vector<int64_t> shape;
};

class WeightUpdateGroup {
 public:
  virtual ~WeightUpdateGroup() = default;
  // Joins the trainer's group (the handshake above). Throws Error naming the trainer's address on a refusal, a
  // timeout or an unknown backend.
  static std::unique_ptr<WeightUpdateGroup> join(const WeightGroupOptions& options);

  // Receives one update's tensors, in `specs`' order, into host memory of their own; nothing is applied here.
  // Throws Error naming the tensor and the trainer when the transfer fails; the group is then out of step with the
  // trainer, and the caller should destroy it.
  std::vector<HostTensor> receive(std::span<const TensorSpec> specs);
  const WeightGroupOptions& options() const { return options_; }

 protected:
  explicit WeightUpdateGroup(WeightGroupOptions options) : options_(std::move(options)) {}
  // Fills `bytes` (the spec's byte count) with the tensor as the transport carries it; `what` names it in messages.
  virtual void receive_tensor(const TensorSpec& spec, std::span<std::byte> bytes, const std::string& what) = 0;

 private:
  WeightGroupOptions options_;
};

}  // namespace beamline
