#include "weight_sync/weight_update_group.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <array>
#include <cstring>

#include "backend/registry.h"
#include "util/error.h"
#include "weight_sync/tcp_stream.h"

#if BEAMLINE_HAVE_NCCL
#include "parallel/nccl/nccl_communicator.h"
#endif

namespace beamline {
namespace {

constexpr std::array<char, 4> kMagic = {'B', 'L', 'W', 'S'};
constexpr uint32_t kProtocolVersion = 1;
constexpr uint32_t kMaxStringBytes = 4096;
constexpr std::size_t kNcclUniqueIdBytes = 128;

std::size_t spec_bytes(const TensorSpec& spec) {
  int64_t numel = 1;
  for (const int64_t d : spec.shape) numel *= d;
  return static_cast<std::size_t>(numel) * dtype_size(spec.dtype);
}

// Sends the hello and reads the trainer's answer (the handshake of weight_update_group.h).
void handshake(TcpStream& stream, const WeightGroupOptions& options) {
  const std::string what = fmt::format("joining weight update group '{}'", options.group_name);
  stream.write(std::as_bytes(std::span(kMagic)), what);
  stream.write_u32(kProtocolVersion, what);
  stream.write_u32(static_cast<uint32_t>(options.rank_offset), what);
  stream.write_u32(static_cast<uint32_t>(options.world_size), what);
  stream.write_string(options.group_name, what);
  stream.write_string(options.backend, what);
  std::array<char, 4> magic{};
  stream.read(std::as_writable_bytes(std::span(magic)), what);
  require(magic == kMagic, "{}: {} does not speak beamline's weight-sync protocol (it answered no \"BLWS\")", what,
          stream.peer());
  const uint32_t status = stream.read_u32(what);
  const std::string message = stream.read_string(what, kMaxStringBytes);
  require(status == 0, "{}: {} refused: {}", what, stream.peer(), message.empty() ? "(no reason given)" : message);
}

// backend "tcp": every tensor as a frame on the rendezvous connection.
class TcpWeightGroup final : public WeightUpdateGroup {
 public:
  TcpWeightGroup(WeightGroupOptions options, TcpStream stream)
      : WeightUpdateGroup(std::move(options)), stream_(std::move(stream)) {}

 private:
  void receive_tensor(const TensorSpec& spec, std::span<std::byte> bytes, const std::string& what) override {
    const std::string name = stream_.read_string(what, kMaxStringBytes);
    require(name == spec.name, "{}: {} sent \"{}\" where the update lists \"{}\" (tensors must come in the order of "
            "`names`)", what, stream_.peer(), name, spec.name);
    const uint64_t count = stream_.read_u64(what);
    require(count == bytes.size(), "{}: {} sent {} bytes where {} {} takes {}", what, stream_.peer(), count,
            dtype_name(spec.dtype), shape_string(spec.shape), bytes.size());
    stream_.read(bytes, what);
  }

  TcpStream stream_;
};

#if BEAMLINE_HAVE_NCCL
// backend "nccl": the rendezvous connection handed over the ncclUniqueId; tensors come by ncclBroadcast into a device
// buffer of a backend of the group's own (the engine's belongs to the engine thread), then to host memory.
class NcclWeightGroup final : public WeightUpdateGroup {
 public:
  NcclWeightGroup(WeightGroupOptions options, TcpStream stream, std::span<const std::byte> unique_id)
      : WeightUpdateGroup(std::move(options)), stream_(std::move(stream)), backend_(create_backend("cuda")) {
    const WeightGroupOptions& o = this->options();
    communicator_ = make_nccl_communicator(
        unique_id, o.rank_offset, o.world_size,
        fmt::format("weight update group '{}' (trainer at {}:{})", o.group_name, o.master_address, o.master_port),
        *backend_, o.timeout_seconds);
  }

 private:
  void receive_tensor(const TensorSpec&, std::span<std::byte> bytes, const std::string& what) override {
    try {
      Tensor staging = backend_->alloc(DType::U8, {static_cast<int64_t>(bytes.size())});
      communicator_->broadcast(staging, 0);
      backend_->download(staging, bytes.data());
    } catch (const Error& error) {
      fail("{}: {}", what, error.what());
    }
  }

  TcpStream stream_;  // kept open: its closing tells the trainer the group is gone
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Communicator> communicator_;
};
#endif

}  // namespace

std::unique_ptr<WeightUpdateGroup> WeightUpdateGroup::join(const WeightGroupOptions& options) {
  require(options.backend == "tcp" || options.backend == "nccl", "backend: '{}' is not tcp or nccl", options.backend);
#if !BEAMLINE_HAVE_NCCL
  require(options.backend != "nccl", "backend: this build has no CUDA, so no NCCL; use backend tcp");
#endif
  require(options.world_size >= 2 && options.rank_offset >= 1 && options.rank_offset < options.world_size,
          "rank_offset: {} is not a server rank of a world of {} (the trainer is rank 0)", options.rank_offset,
          options.world_size);
  const std::string peer = fmt::format("the trainer (rank 0) at {}:{}", options.master_address, options.master_port);
  TcpStream stream = TcpStream::connect(options.master_address, options.master_port, options.timeout_seconds, peer);
  handshake(stream, options);
  spdlog::info("joined weight update group '{}' as rank {} of {} ({}, trainer at {}:{})", options.group_name,
               options.rank_offset, options.world_size, options.backend, options.master_address, options.master_port);
  if (options.backend == "tcp") return std::make_unique<TcpWeightGroup>(options, std::move(stream));
#if BEAMLINE_HAVE_NCCL
  std::array<std::byte, kNcclUniqueIdBytes> unique_id{};
  stream.read(unique_id, fmt::format("joining weight update group '{}': the ncclUniqueId", options.group_name));
  return std::make_unique<NcclWeightGroup>(options, std::move(stream), unique_id);
#else
  fail("backend: this build has no NCCL");
#endif
}

std::vector<HostTensor> WeightUpdateGroup::receive(std::span<const TensorSpec> specs) {
  std::vector<HostTensor> received;
  received.reserve(specs.size());
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const TensorSpec& spec = specs[i];
    const std::string what = fmt::format("weight update group '{}': tensor {} of {} (\"{}\")", options_.group_name,
                                         i + 1, specs.size(), spec.name);
    auto bytes = std::make_shared<std::vector<std::byte>>(spec_bytes(spec));
    receive_tensor(spec, *bytes, what);
    received.push_back({TensorView{spec.name, spec.dtype, spec.shape, bytes->data(), bytes->size()}, std::move(bytes)});
  }
  return received;
}

}  // namespace beamline
