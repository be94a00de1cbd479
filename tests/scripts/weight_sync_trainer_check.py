#!/usr/bin/env python3
"""The trainer's side of beamline's weight sync without a GPU (tools/reference/weight_sync_trainer.py and
trainer_nccl.py; the server's side is CTest weight_sync_tcp, the NCCL path on two GPUs bench/gpu_rollout.sh):

  - frames whose bytes do not match their dtype and shape are refused before anything is posted, naming the tensor;
  - the handshake as a server sees it (a socket playing the server): tcp answers, refusals of another backend or
    protocol version, tcp frames of bytes and of torch tensors; with nccl, the answer followed by the 128-byte id,
    the group joined once the last server rank has it, a world_size that differs and a server too many refused,
    every tensor broadcast, the group closed with the connections (through a stand-in for the NCCL rank);
  - trainer_nccl.NcclLibrary's ctypes calls against --fake-nccl (tests/scripts/fake_nccl.cpp, built on nccl.h's
    prototypes): the id passed by value intact, the broadcast's arguments, failures named; NcclRoot's joining,
    broadcasting, aborting and closing against it, PyTorch's CUDA calls stood in for (with PyTorch); and the real
    libnccl.so.2 when one loads;
  - backend nccl refused with a clear message where PyTorch has no CUDA.

  python3 tests/scripts/weight_sync_trainer_check.py [--fake-nccl build/tests/scripts/libfake_nccl.so]
"""
import argparse
import contextlib
import ctypes
import os
import socket
import struct
import sys
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "reference"))
import trainer_nccl  # noqa: E402
from weight_sync_trainer import (MAGIC, PROTOCOL_VERSION, Trainer, check_frames, in_thread,  # noqa: E402
                                 update_weights)

try:
    import torch
except ImportError:
    torch = None


def raises(call, kind, fragment):
    """Runs call(), which must raise `kind` with `fragment` in its message; returns the message."""
    try:
        call()
    except kind as error:
        assert fragment in str(error), f"{kind.__name__} {str(error)!r} does not say {fragment!r}"
        return str(error)
    raise AssertionError(f"expected {kind.__name__} saying {fragment!r}")


# ---------------------------------------------------------------- a socket playing a server rank

def read_exact(conn, count):
    data = b""
    while len(data) < count:
        chunk = conn.recv(count - len(data))
        assert chunk, f"the trainer closed the connection after {len(data)} of {count} bytes"
        data += chunk
    return data


def string(value):
    return struct.pack("<I", len(value.encode())) + value.encode()


def hello(trainer, rank=1, world_size=2, backend="tcp", version=PROTOCOL_VERSION):
    """Connects to the trainer and says hello as a server rank (while the trainer accepts in a thread): (connection,
    status, message)."""
    accepted = in_thread(trainer.accept)
    conn = socket.create_connection((trainer.host, trainer.port), timeout=10)
    conn.sendall(MAGIC + struct.pack("<IiI", version, rank, world_size) + string("g") + string(backend))
    assert read_exact(conn, 4) == MAGIC
    (status,) = struct.unpack("<I", read_exact(conn, 4))
    (length,) = struct.unpack("<I", read_exact(conn, 4))
    message = read_exact(conn, length).decode()
    return conn, status, message, accepted


def read_frame(conn):
    (length,) = struct.unpack("<I", read_exact(conn, 4))
    name = read_exact(conn, length).decode()
    (count,) = struct.unpack("<Q", read_exact(conn, 8))
    return name, read_exact(conn, count)


class StandInRoot:
    """What Trainer asks of trainer_nccl.NcclRoot, recorded."""

    def __init__(self):
        self.calls = []
        self.world_size = None
        self.id = bytes(range(128))

    def unique_id(self):
        return self.id

    def join(self, world_size):
        self.calls.append(("join", world_size))
        self.world_size = world_size

    def broadcast(self, name, data):
        self.calls.append(("broadcast", name, bytes(data)))

    def close(self, abort=False):
        self.calls.append(("abort" if abort else "close",))
        self.world_size = None


# ---------------------------------------------------------------- the checks

def check_frames_refused():
    check_frames([("a", "bfloat16", [2, 3], bytes(12)), ("b", "torch.float32", [4], bytes(16))])
    raises(lambda: check_frames([("a", "bfloat16", [2, 3], bytes(12)), ("b", "float32", [4], bytes(15))]),
           ValueError, 'tensor "b": 15 bytes where float32 [4] takes 16')
    raises(lambda: check_frames([("c", "complex64", [1], bytes(8))]), ValueError,
           "tensor \"c\": dtype 'complex64' is not a torch dtype this trainer knows")
    # Refused before anything is posted: nothing listens at this address.
    raises(lambda: update_weights("http://127.0.0.1:1", None, [("d", "float16", [3], bytes(4))]), ValueError,
           'tensor "d": 4 bytes where float16 [3] takes 6')
    if torch is not None:
        check_frames([("e", "bfloat16", [5, 2], torch.zeros(5, 2, dtype=torch.bfloat16))])
        raises(lambda: check_frames([("e", "bfloat16", [5, 2], torch.zeros(5, 2))]), ValueError,
               'tensor "e": 40 bytes where bfloat16 [5, 2] takes 20')
    print("frames whose bytes differ from their dtype and shape are refused before anything is posted")


def refused(trainer, message, **fields):
    """A hello (`fields` as hello()'s) that the trainer must refuse with `message`."""
    conn, status, got, accepted = hello(trainer, **fields)
    assert (status, got) == (1, message), (status, got)
    conn.close()
    accepted()


def joined(trainer, id_bytes=None, **fields):
    """A hello the trainer must accept (followed by `id_bytes`, the group's ncclUniqueId, with nccl): the
    connection, and the hello as the trainer read it."""
    conn, status, message, accepted = hello(trainer, **fields)
    assert (status, message) == (0, ""), (status, message)
    if id_bytes is not None:
        assert read_exact(conn, len(id_bytes)) == id_bytes
    return conn, accepted()


def check_tcp_handshake():
    trainer = Trainer()
    try:
        refused(trainer, "backend 'nccl': this trainer's group is 'tcp'", backend="nccl")
        refused(trainer, f"protocol version 2: this trainer speaks version {PROTOCOL_VERSION}", version=2)
        conn, seen = joined(trainer)
        assert seen == {"version": 1, "rank": 1, "world_size": 2, "group_name": "g", "backend": "tcp"}, seen
        trainer.send_tensor("x", b"\x01\x02\x03")
        assert read_frame(conn) == ("x", b"\x01\x02\x03")
        if torch is not None:
            tensor = torch.tensor([[1.5, -2.0], [3.25, 0.0]], dtype=torch.bfloat16)
            trainer.send_tensor("y", tensor.t())  # not contiguous: sent row-major
            expected = struct.pack("<4H", *[struct.unpack("<I", struct.pack("<f", v))[0] >> 16
                                            for v in (1.5, 3.25, -2.0, 0.0)])
            assert read_frame(conn) == ("y", expected)
        conn.close()
    finally:
        trainer.close()
    print("tcp: the hello answered, another backend or protocol version refused naming it, frames of bytes"
          + (" and of torch tensors" if torch is not None else " (torch tensors: no PyTorch here)"))


def check_nccl_handshake():
    root = StandInRoot()
    trainer = Trainer(backend="nccl", nccl=root)
    try:
        refused(trainer, "backend 'tcp': this trainer's group is 'nccl'", world_size=3, backend="tcp")
        first, _ = joined(trainer, root.id, rank=1, world_size=3, backend="nccl")
        assert root.calls == [], "the group was joined before its last server rank had the id"
        refused(trainer, "world_size 4: the servers that joined before said 3", rank=2, world_size=4, backend="nccl")
        second, _ = joined(trainer, root.id, rank=2, world_size=3, backend="nccl")
        assert root.calls == [("join", 3)], root.calls
        refused(trainer, "this trainer's NCCL group of 3 ranks is complete", rank=3, world_size=3, backend="nccl")
        trainer.send_tensor("w", b"abc")
        assert root.calls[-1] == ("broadcast", "w", b"abc"), root.calls
        first.settimeout(0.2)
        raises(lambda: first.recv(1), socket.timeout, "timed out")  # nothing travels on the connections
        trainer.close_servers()
        assert root.calls[-1] == ("close",) and first.recv(1) == second.recv(1) == b"", root.calls
        trainer.close_servers(abort=True)  # after a failure: the servers are gone
        assert root.calls[-1] == ("abort",), root.calls
    finally:
        trainer.close()
    raises(lambda: Trainer(backend="gloo"), ValueError, "backend: 'gloo' is not tcp or nccl")
    print("nccl: the answer carries the 128-byte id, the group is joined once the last server rank has it, another "
          "world_size or a server too many refused, tensors broadcast, the group closed with the connections")


def check_fake_library(path):
    library = trainer_nccl.NcclLibrary(path)
    fake = ctypes.CDLL(path)
    assert library.path == path and library.version() == 21903, library.version()
    assert trainer_nccl.version_string(library.version()) == "2.19.3"
    assert trainer_nccl.version_string(2708) == "2.7.8" and trainer_nccl.version_string(22809) == "2.28.9"
    unique_id = library.unique_id()
    assert unique_id == bytes(0 if i == 5 else 200 - i for i in range(128)), unique_id

    comm = library.init_rank(3, unique_id, 0, "joining")
    ranks, rank, received = ctypes.c_int(), ctypes.c_int(), ctypes.create_string_buffer(128)
    fake.fake_nccl_last_init(ctypes.byref(ranks), ctypes.byref(rank), received)
    assert (ranks.value, rank.value, received.raw) == (3, 0, unique_id), (ranks.value, rank.value, received.raw)
    fake.fake_nccl_communicator.restype = ctypes.c_void_p
    assert comm == fake.fake_nccl_communicator()
    raises(lambda: library.init_rank(3, unique_id[:127], 0, "joining"), ValueError,
           "joining: an ncclUniqueId has 128 bytes, not 127")
    raises(lambda: library.init_rank(2, unique_id, 2, "joining"), ValueError,
           "joining: rank 2 is not a rank of a world of 2")

    library.broadcast(comm, 0x7F0000001000, 1 << 33, 0xABC0, "broadcasting \"x\"")
    send, recv, comm_seen, stream = (ctypes.c_void_p() for _ in range(4))
    count, datatype, root = ctypes.c_size_t(), ctypes.c_int(), ctypes.c_int()
    fake.fake_nccl_last_broadcast(*(ctypes.byref(v) for v in (send, recv, count, datatype, root, comm_seen, stream)))
    seen = (send.value, recv.value, count.value, datatype.value, root.value, comm_seen.value, stream.value)
    assert seen == (0x7F0000001000, 0x7F0000001000, 1 << 33, trainer_nccl.NCCL_UINT8, 0, comm, 0xABC0), seen
    raises(lambda: library.broadcast(comm, 0x1000, 13, 0, "broadcasting \"y\""), trainer_nccl.NcclError,
           "broadcasting \"y\": ncclBroadcast failed: invalid argument (fake) (ncclResult_t 4)")
    raises(lambda: library.broadcast(comm, 0, 8, 0, "broadcasting \"z\""), ValueError,
           "broadcasting \"z\": 8 bytes at address 0x0")

    assert library.async_error(comm) == 0
    fake.fake_nccl_set_async_error(6)
    assert library.async_error(comm) == 6
    library.destroy(comm, "closing")
    library.abort(comm, "aborting")
    destroyed, aborted = ctypes.c_int(), ctypes.c_int()
    fake.fake_nccl_ends(ctypes.byref(destroyed), ctypes.byref(aborted))
    assert (destroyed.value, aborted.value) == (1, 1), (destroyed.value, aborted.value)

    raises(lambda: trainer_nccl.NcclLibrary("/nonexistent/libnccl.so.2"), trainer_nccl.NcclError,
           "libnccl.so.2 could not be loaded; tried /nonexistent/libnccl.so.2 (")
    raises(lambda: trainer_nccl.NcclLibrary("libc.so.6"), trainer_nccl.NcclError, "libc.so.6 has no ncclGetVersion")
    print(f"ctypes against {os.path.basename(path)} (nccl.h's prototypes): the id by value intact, the broadcast's "
          f"pointer, 8 GiB count, ncclUint8, root 0 and stream as given, failures named")


def check_root(path):
    """NcclRoot's own logic (trainer_nccl.py) against the stand-in library, with PyTorch's CUDA calls replaced by
    stand-ins (a stream whose handle is 0x5EED, events done on every third query): the join, a broadcast of a tensor
    and of bytes, a group whose peer failed and one that stops receiving (both aborted, naming the tensor), the close,
    and the devices it refuses."""
    fake = ctypes.CDLL(path)
    fake.fake_nccl_set_async_error(0)
    queries = {"count": 0, "done": True}

    class Event:
        def record(self, stream):
            assert stream.cuda_stream == 0x5EED

        def query(self):
            queries["count"] += 1
            return queries["done"] and queries["count"] % 3 == 0

    stream = type("Stream", (), {"cuda_stream": 0x5EED})()
    stand_ins = {"is_available": lambda: True, "device_count": lambda: 2, "current_device": lambda: 0,
                 "init": lambda: None, "set_device": lambda device: None, "current_stream": lambda device=None: stream,
                 "device": lambda device: contextlib.nullcontext(), "Event": Event}
    with mock.patch.multiple(torch.cuda, **stand_ins):
        raises(lambda: trainer_nccl.NcclRoot("cuda:2", library=trainer_nccl.NcclLibrary(path)), ValueError,
               "device: cuda:2 is not among the 2 CUDA devices PyTorch sees")
        raises(lambda: trainer_nccl.NcclRoot("cpu", library=trainer_nccl.NcclLibrary(path)), ValueError,
               "device: 'cpu' is not a CUDA device")
        root = trainer_nccl.NcclRoot("cuda:1", timeout=0.5, library=trainer_nccl.NcclLibrary(path))
        assert root.describe() == f"rank 0 on cuda:1, NCCL 2.19.3 ({path})", root.describe()
        root.device = torch.device("cpu")  # the tensors stay on the CPU: the stand-in library never reads them
        raises(lambda: root.broadcast("x", b"ab"), trainer_nccl.NcclError,
               'broadcasting "x" from cpu: the NCCL group is not made')
        root.join(2)
        sent = torch.arange(6, dtype=torch.bfloat16)
        pointers = []
        for data, count in ((sent, 12), (b"abcdefgh", 8)):
            root.broadcast("x", data)
            pointer, count_seen, stream_seen = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_void_p()
            fake.fake_nccl_last_broadcast(ctypes.byref(pointer), ctypes.byref(ctypes.c_void_p()),
                                          ctypes.byref(count_seen), ctypes.byref(ctypes.c_int()),
                                          ctypes.byref(ctypes.c_int()), ctypes.byref(ctypes.c_void_p()),
                                          ctypes.byref(stream_seen))
            assert (count_seen.value, stream_seen.value) == (count, 0x5EED), (count_seen.value, stream_seen.value)
            pointers.append(pointer.value)
        # The tensor is broadcast in place from its own memory; bytes from a tensor made of them.
        assert pointers[0] == sent.data_ptr() and pointers[1] not in (None, sent.data_ptr()), pointers
        fake.fake_nccl_set_async_error(6)
        queries["done"] = False
        raises(lambda: root.broadcast("y", sent), trainer_nccl.NcclError,
               'broadcasting "y" from cpu: some error (fake); the group is aborted')
        assert root.comm is None
        fake.fake_nccl_set_async_error(0)
        root.join(2)
        raises(lambda: root.broadcast("z", sent), trainer_nccl.NcclError,
               'broadcasting "z" from cpu: not done after 0.5 s (a server rank stopped receiving); the group is '
               'aborted')
        root.join(2)
        root.close()
        assert root.comm is None and root.world_size is None
    destroyed, aborted = ctypes.c_int(), ctypes.c_int()
    fake.fake_nccl_ends(ctypes.byref(destroyed), ctypes.byref(aborted))
    assert (destroyed.value, aborted.value) == (2, 3), (destroyed.value, aborted.value)
    print("NcclRoot (PyTorch's CUDA calls stood in for): join, broadcasts of a tensor and of bytes on the current "
          "stream, a failed peer and a stalled broadcast abort the group naming the tensor, close destroys it")


def check_real_library():
    try:
        library = trainer_nccl.NcclLibrary()
    except trainer_nccl.NcclError as error:
        print(f"the real libnccl.so.2: not here ({str(error)[:160]}), not checked")
        return
    assert len(library.unique_id()) == 128
    print(f"the real libnccl.so.2: NCCL {trainer_nccl.version_string(library.version())} from {library.path}, "
          f"ncclGetUniqueId gives 128 bytes")


def check_needs_cuda():
    if torch is not None and torch.cuda.is_available():
        print("this PyTorch sees CUDA: the refusal without it is not checked")
        return
    fragment = "torch.cuda.is_available() is False" if torch is not None else "PyTorch is not installed"
    message = raises(lambda: Trainer(backend="nccl"), RuntimeError, fragment)
    assert message.startswith("backend nccl: ") and message.endswith("use backend tcp"), message
    print(f"backend nccl refused here: {message}")


def check_in_thread():
    raises(lambda: in_thread(lambda: 1 / 0)(), ZeroDivisionError, "division")
    raises(lambda: in_thread(lambda: __import__("time").sleep(5))(timeout=0.05, what="a slow call"), TimeoutError,
           "a slow call: not done after 0.05 s")
    assert in_thread(lambda: 7)(timeout=5) == 7


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fake-nccl", help="tests/scripts/fake_nccl.cpp built (CUDA builds); else not checked")
    args = parser.parse_args()
    check_in_thread()
    check_frames_refused()
    check_tcp_handshake()
    check_nccl_handshake()
    if args.fake_nccl:
        check_fake_library(os.path.abspath(args.fake_nccl))
        if torch is not None:
            check_root(os.path.abspath(args.fake_nccl))
        else:
            print("NcclRoot: no PyTorch here, not checked")
    else:
        print("the ctypes calls: no --fake-nccl (a build without CUDA has no nccl.h), not checked")
    check_real_library()
    check_needs_cuda()
    print("weight sync trainer: ok")


if __name__ == "__main__":
    main()
