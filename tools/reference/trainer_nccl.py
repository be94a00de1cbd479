"""The trainer's NCCL rank for beamline's weight sync (backend "nccl", docs/rl.md): libnccl.so.2 through ctypes, so
nothing beyond PyTorch is needed (its CUDA wheels ship the library). The trainer is rank 0 and the root of every
broadcast; weight_sync_trainer.Trainer(backend="nccl") drives it:

    root = NcclRoot("cuda:1", timeout=600)   # refuses without PyTorch, without CUDA or a device it does not see
    root.unique_id()                         # the 128-byte ncclUniqueId every server gets in the trainer's answer
    root.join(world_size)                    # ncclCommInitRank(world_size, id, 0), once every server has the id
    root.broadcast(name, tensor)             # ncclBroadcast of the tensor's bytes (ncclUint8) from rank 0, waited for
    root.close()                             # ncclCommDestroy, while the servers destroy theirs (a collective);
                                             # close(abort=True): ncclCommAbort, when they are gone

NcclLibrary is the C API alone (no PyTorch): it loads the library, declares each function's C types as nccl.h has
them, and turns a failed call into NcclError naming the call and what it was for.
"""
import ctypes
import glob
import importlib.util
import os
import time

from weight_sync_trainer import in_thread

UNIQUE_ID_BYTES = 128    # NCCL_UNIQUE_ID_BYTES
NCCL_UINT8 = 1           # ncclDataType_t
ROOT_RANK = 0            # the trainer


class UniqueId(ctypes.Structure):
    """ncclUniqueId: passed by value to ncclCommInitRank."""
    _fields_ = [("internal", ctypes.c_ubyte * UNIQUE_ID_BYTES)]


class NcclError(RuntimeError):
    """A call into NCCL failed, or did not finish in time."""


def loaded_nccl():
    """The path of the libnccl this process has mapped already (PyTorch's, once torch is imported), or None."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and os.path.basename(fields[5].strip()).startswith("libnccl.so"):
                    return fields[5].strip()
    except OSError:
        pass
    return None


def library_candidates():
    """Where libnccl.so.2 may be, in the order tried: the one already mapped (PyTorch's), the dynamic loader's search
    (LD_LIBRARY_PATH, ld.so.cache), the nvidia-* wheels' lib folders, torch/lib."""
    candidates = [path for path in (loaded_nccl(),) if path] + ["libnccl.so.2"]
    for package in ("nvidia", "torch"):
        spec = importlib.util.find_spec(package)
        for root in (spec.submodule_search_locations or []) if spec else []:
            pattern = ("*", "lib") if package == "nvidia" else ("lib",)
            candidates += sorted(glob.glob(os.path.join(root, *pattern, "libnccl.so.2")))
    return candidates


def version_string(code):
    """NCCL's version code as major.minor.patch (NCCL_VERSION: codes below 2.9 have one digit fewer)."""
    major, rest = (code // 10000, code % 10000) if code >= 10000 else (code // 1000, code % 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


class NcclLibrary:
    """libnccl.so.2's functions that a broadcasting root needs, with nccl.h's C types."""

    def __init__(self, path=None):
        tried = []
        for candidate in [path] if path else library_candidates():
            try:
                self.lib = ctypes.CDLL(candidate)
            except OSError as error:
                tried.append(f"{candidate} ({error})")
                continue
            self.path = candidate if os.sep in candidate else (loaded_nccl() or candidate)
            break
        else:
            raise NcclError(f"libnccl.so.2 could not be loaded; tried {'; '.join(tried)} (PyTorch's CUDA wheels ship "
                            f"it in site-packages/nvidia/nccl/lib)")
        c = ctypes
        self._declare("ncclGetVersion", [c.POINTER(c.c_int)])
        self._declare("ncclGetUniqueId", [c.POINTER(UniqueId)])
        self._declare("ncclCommInitRank", [c.POINTER(c.c_void_p), c.c_int, UniqueId, c.c_int])
        self._declare("ncclBroadcast", [c.c_void_p, c.c_void_p, c.c_size_t, c.c_int, c.c_int, c.c_void_p, c.c_void_p])
        self._declare("ncclCommGetAsyncError", [c.c_void_p, c.POINTER(c.c_int)])
        self._declare("ncclCommDestroy", [c.c_void_p])
        self._declare("ncclCommAbort", [c.c_void_p])
        self._declare("ncclGetErrorString", [c.c_int], c.c_char_p)

    def _declare(self, name, argtypes, restype=ctypes.c_int):
        try:
            function = getattr(self.lib, name)
        except AttributeError:
            raise NcclError(f"{self.path} has no {name}") from None
        function.argtypes, function.restype = argtypes, restype

    def check(self, result, call, what):
        if result != 0:
            raise NcclError(f"{what}: {call} failed: {self.lib.ncclGetErrorString(result).decode()} (ncclResult_t "
                            f"{result})")

    def version(self):
        code = ctypes.c_int()
        self.check(self.lib.ncclGetVersion(ctypes.byref(code)), "ncclGetVersion", self.path)
        return code.value

    def unique_id(self):
        """A new ncclUniqueId (128 bytes): rank 0 makes it, every rank joins with it."""
        made = UniqueId()
        self.check(self.lib.ncclGetUniqueId(ctypes.byref(made)), "ncclGetUniqueId", "making the group's id")
        return bytes(made.internal)

    def init_rank(self, world_size, unique_id, rank, what):
        """ncclCommInitRank: blocks until every rank of the world has joined; the communicator's handle."""
        if len(unique_id) != UNIQUE_ID_BYTES:
            raise ValueError(f"{what}: an ncclUniqueId has {UNIQUE_ID_BYTES} bytes, not {len(unique_id)}")
        if not 0 <= rank < world_size:
            raise ValueError(f"{what}: rank {rank} is not a rank of a world of {world_size}")
        comm = ctypes.c_void_p()
        self.check(self.lib.ncclCommInitRank(ctypes.byref(comm), world_size, UniqueId.from_buffer_copy(unique_id),
                                             rank), "ncclCommInitRank", what)
        return comm.value

    def broadcast(self, comm, pointer, byte_count, stream, what):
        """ncclBroadcast in place of `byte_count` bytes at device address `pointer` from rank 0, on `stream`."""
        if byte_count < 0 or (byte_count and not pointer):
            raise ValueError(f"{what}: {byte_count} bytes at address {pointer:#x}")
        self.check(self.lib.ncclBroadcast(pointer, pointer, byte_count, NCCL_UINT8, ROOT_RANK, comm, stream),
                   "ncclBroadcast", what)

    def async_error(self, comm):
        """The communicator's asynchronous error (0: none), e.g. a peer that went away."""
        result = ctypes.c_int()
        self.check(self.lib.ncclCommGetAsyncError(comm, ctypes.byref(result)), "ncclCommGetAsyncError",
                   "polling the group")
        return result.value

    def error_string(self, result):
        return self.lib.ncclGetErrorString(result).decode()

    def destroy(self, comm, what):
        self.check(self.lib.ncclCommDestroy(comm), "ncclCommDestroy", what)

    def abort(self, comm, what):
        self.check(self.lib.ncclCommAbort(comm), "ncclCommAbort", what)


def cuda_torch():
    """PyTorch, when it can broadcast from a CUDA device; else RuntimeError saying what is missing."""
    try:
        import torch
    except ImportError as error:
        raise RuntimeError(f"backend nccl: the trainer broadcasts PyTorch CUDA tensors, and PyTorch is not installed "
                           f"({error}); use backend tcp") from None
    if not torch.cuda.is_available():
        raise RuntimeError(f"backend nccl: the trainer broadcasts from a CUDA device, and this PyTorch "
                           f"({torch.__version__}) sees none (torch.cuda.is_available() is False); use backend tcp")
    return torch


class NcclRoot:
    """Rank 0 of one NCCL group on one CUDA device of this process. Every wait is bounded by `timeout` seconds: a
    blocking NCCL call runs in a thread of its own, a broadcast is polled (with the group's asynchronous error) and the
    group aborted when it is not done in time."""

    def __init__(self, device="cuda", timeout=600, library=None):
        self.torch = torch = cuda_torch()
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"device: '{device}' is not a CUDA device; the trainer's NCCL rank broadcasts from one")
        count = torch.cuda.device_count()
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if device.index >= count:
            raise ValueError(f"device: {device} is not among the {count} CUDA devices PyTorch sees")
        torch.cuda.init()
        self.device, self.timeout = device, timeout
        self.library = library or NcclLibrary()
        self.comm = None
        self._unique_id = None
        self.world_size = None

    def describe(self):
        return f"rank 0 on {self.device}, NCCL {version_string(self.library.version())} ({self.library.path})"

    def unique_id(self):
        """The id of the group being made (a new one after close())."""
        if self._unique_id is None:
            self._unique_id = self.library.unique_id()
        return self._unique_id

    def join(self, world_size):
        """ncclCommInitRank(world_size, id, 0): returns once every server rank has joined, within the timeout."""
        what = f"the trainer joining its NCCL group of {world_size} ranks as rank 0 on {self.device}"
        unique_id = self.unique_id()

        def init():
            self.torch.cuda.set_device(self.device)  # the calling thread's device is the communicator's
            return self.library.init_rank(world_size, unique_id, ROOT_RANK, what)
        try:
            self.comm = in_thread(init)(timeout=self.timeout, what=what)
        except TimeoutError as error:
            raise NcclError(f"{error} (a server rank never joined; the call is left waiting)") from None
        self.world_size = world_size

    def broadcast(self, name, data):
        """Broadcasts `data` (a torch tensor, copied to this device when elsewhere, or bytes) and waits for it."""
        torch = self.torch
        what = f"broadcasting \"{name}\" from {self.device}"
        if self.comm is None:
            raise NcclError(f"{what}: the NCCL group is not made (no server joined, or it was closed)")
        if isinstance(data, (bytes, bytearray, memoryview)):
            data = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        tensor = data.detach().to(self.device).contiguous()
        stream = torch.cuda.current_stream(self.device)
        with torch.cuda.device(self.device):
            self.library.broadcast(self.comm, tensor.data_ptr(), tensor.numel() * tensor.element_size(),
                                   stream.cuda_stream, what)
            done = torch.cuda.Event()
            done.record(stream)
        self._wait(done, what)

    def _wait(self, done, what):
        deadline = time.monotonic() + self.timeout
        while not done.query():
            error = self.library.async_error(self.comm)
            if error:
                self.abort()
                raise NcclError(f"{what}: {self.library.error_string(error)}; the group is aborted")
            if time.monotonic() > deadline:
                self.abort()
                raise NcclError(f"{what}: not done after {self.timeout:g} s (a server rank stopped receiving); the "
                                f"group is aborted")
            time.sleep(1e-4)

    def abort(self):
        self.close(abort=True)

    def close(self, abort=False):
        """Destroys the group, which the servers must destroy meanwhile (within a node it is a collective); `abort`:
        ncclCommAbort instead, for a group whose servers are gone or stopped receiving."""
        comm, self.comm, self._unique_id, self.world_size = self.comm, None, None, None
        if comm is None:
            return
        end, call = (self.library.abort, "ncclCommAbort") if abort else (self.library.destroy, "ncclCommDestroy")
        in_thread(lambda: end(comm, "closing the trainer's NCCL group"))(timeout=self.timeout, what=call)
