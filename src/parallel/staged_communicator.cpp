#include "parallel/staged_communicator.h"

#include <algorithm>
#include <vector>

namespace beamline {
namespace {

class StagedCommunicator final : public Communicator {
 public:
  StagedCommunicator(std::unique_ptr<Communicator> host, Backend& backend)
      : host_(std::move(host)), backend_(backend) {}

  int32_t rank() const override { return host_->rank(); }
  int32_t size() const override { return host_->size(); }
  const std::string& name() const override { return host_->name(); }

  void all_reduce_sum(Tensor& tensor) override {
    Tensor staged = to_host(tensor, first_);
    host_->all_reduce_sum(staged);
    back(tensor, first_);
  }
  void all_gather(const Tensor& in, Tensor& out) override {
    Tensor staged_out = room_for(out, second_);
    host_->all_gather(to_host(in, first_), staged_out);
    back(out, second_);
  }
  void all_gather_columns(const Tensor& in, Tensor& out) override {
    Tensor staged_out = room_for(out, second_);
    host_->all_gather_columns(to_host(in, first_), staged_out);
    back(out, second_);
  }
  void reduce_scatter_sum(const Tensor& in, Tensor& out) override {
    Tensor staged_out = room_for(out, second_);
    host_->reduce_scatter_sum(to_host(in, first_), staged_out);
    back(out, second_);
  }
  void all_to_all(const Tensor& in, std::span<const int64_t> send_counts, Tensor& out,
                  std::span<const int64_t> recv_counts) override {
    Tensor staged_out = room_for(out, second_);
    host_->all_to_all(to_host(in, first_), send_counts, staged_out, recv_counts);
    back(out, second_);
  }
  void broadcast(Tensor& tensor, int32_t root) override {
    Tensor staged = to_host(tensor, first_);
    host_->broadcast(staged, root);
    back(tensor, first_);
  }
  void send(const Tensor& tensor, int32_t peer) override { host_->send(to_host(tensor, first_), peer); }
  void recv(Tensor& tensor, int32_t peer) override {
    Tensor staged = room_for(tensor, first_);
    host_->recv(staged, peer);
    back(tensor, first_);
  }
  void barrier() override { host_->barrier(); }
  void broadcast_bytes(std::vector<std::byte>& bytes, int32_t root, bool wait_forever) override {
    host_->broadcast_bytes(bytes, root, wait_forever);
  }
  int64_t all_reduce_max(int64_t value) override { return host_->all_reduce_max(value); }

 private:
  // A host tensor of `like`'s dtype and shape over `buffer` (at least one byte, so that it is defined).
  static Tensor room_for(const Tensor& like, std::vector<std::byte>& buffer) {
    buffer.resize(std::max<std::size_t>(like.nbytes(), 1));
    return Tensor(Device::Cpu, like.dtype(), like.shape(), buffer.data(), nullptr);
  }
  Tensor to_host(const Tensor& tensor, std::vector<std::byte>& buffer) {
    Tensor staged = room_for(tensor, buffer);
    backend_.download(tensor, buffer.data());
    return staged;
  }
  void back(Tensor& tensor, const std::vector<std::byte>& buffer) { backend_.copy_to(tensor, buffer.data()); }

  std::unique_ptr<Communicator> host_;
  Backend& backend_;
  std::vector<std::byte> first_, second_;  // the staged input (or in-place tensor) and output
};

}  // namespace

std::unique_ptr<Communicator> make_staged_communicator(std::unique_ptr<Communicator> host, Backend& backend) {
  return std::make_unique<StagedCommunicator>(std::move(host), backend);
}

}  // namespace beamline
