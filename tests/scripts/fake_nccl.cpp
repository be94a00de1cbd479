// A stand-in for libnccl.so.2 for tests/scripts/weight_sync_trainer_check.py: the functions the trainer's ctypes
// wrapper (tools/reference/trainer_nccl.py) calls, defined against the toolkit's nccl.h (so the compiler holds them to
// NCCL's own prototypes), recording what each call received for the test to read back through fake_nccl_*. No GPU, no
// communication. A broadcast of kFailingCount bytes fails, as NCCL does on a bad argument.
#include <nccl.h>

#include <cstring>

namespace {

constexpr size_t kFailingCount = 13;

struct Recorded {
  int init_ranks = -1;
  int init_rank = -1;
  char init_id[NCCL_UNIQUE_ID_BYTES] = {};
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  int datatype = -1;
  int root = -1;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int destroyed = 0;
  int aborted = 0;
  ncclResult_t async_error = ncclSuccess;
};

Recorded recorded;
int communicator;  // its address is the handle given out

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  *version = 21903;
  return ncclSuccess;
}

// Every byte differs and one is NUL, so that a wrapper cutting the id at a NUL or reordering it is caught.
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; ++i) id->internal[i] = static_cast<char>(i == 5 ? 0 : 200 - i);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  recorded.init_ranks = nranks;
  recorded.init_rank = rank;
  std::memcpy(recorded.init_id, commId.internal, NCCL_UNIQUE_ID_BYTES);
  *comm = reinterpret_cast<ncclComm_t>(&communicator);
  return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  recorded.send = sendbuff;
  recorded.recv = recvbuff;
  recorded.count = count;
  recorded.datatype = datatype;
  recorded.root = root;
  recorded.comm = comm;
  recorded.stream = stream;
  return count == kFailingCount ? ncclInvalidArgument : ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t* asyncError) {
  *asyncError = recorded.async_error;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  recorded.destroyed += comm == reinterpret_cast<ncclComm_t>(&communicator);
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  recorded.aborted += comm == reinterpret_cast<ncclComm_t>(&communicator);
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  return result == ncclInvalidArgument ? "invalid argument (fake)" : "some error (fake)";
}

// Read back by the test.
void fake_nccl_last_init(int* nranks, int* rank, char* id) {
  *nranks = recorded.init_ranks;
  *rank = recorded.init_rank;
  std::memcpy(id, recorded.init_id, NCCL_UNIQUE_ID_BYTES);
}

void fake_nccl_last_broadcast(const void** send, void** recv, size_t* count, int* datatype, int* root, void** comm,
                              void** stream) {
  *send = recorded.send;
  *recv = recorded.recv;
  *count = recorded.count;
  *datatype = recorded.datatype;
  *root = recorded.root;
  *comm = recorded.comm;
  *stream = recorded.stream;
}

void fake_nccl_ends(int* destroyed, int* aborted) {
  *destroyed = recorded.destroyed;
  *aborted = recorded.aborted;
}

void* fake_nccl_communicator() { return &communicator; }

void fake_nccl_set_async_error(int error) { recorded.async_error = static_cast<ncclResult_t>(error); }

}  // extern "C"
