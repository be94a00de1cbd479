"""The trainer's end of beamline's weight sync, backend "tcp" (Python stdlib only) or "nccl" (PyTorch with CUDA:
trainer_nccl.py).

The wire protocol is src/weight_sync/weight_update_group.h's: the trainer is rank 0 and listens; each server rank
connects when asked by /init_weights_update_group (or /init_weight_update_communicator) and says hello; the trainer
answers, with nccl followed by the group's 128-byte ncclUniqueId, and once the last server rank has it joins the NCCL
group as rank 0. For every /update_weights_from_distributed (or /update_weights) the trainer then sends the announced
tensors in order: tcp, a frame on every server's connection; nccl, one ncclBroadcast per tensor. Usage, the same calls
for both backends:

    trainer = Trainer()                                   # listens on 127.0.0.1, a free port; or
    trainer = Trainer(backend="nccl", device="cuda:1")    # the same, rank 0 of an NCCL group on cuda:1
    init_group(base, trainer, group_name="g", backend=trainer.backend)  # POST /init_weights_update_group + accept
    status, reply = update_weights(base, trainer, [("model.norm.weight", "bfloat16", [64], data), ...],
                                   group_name="g", weight_version="step-1")   # data: bytes or a torch tensor
    trainer.close()                                       # after (nccl: while) the servers destroy the group
"""
import json
import math
import socket
import struct
import threading
import urllib.error
import urllib.request

MAGIC = b"BLWS"
PROTOCOL_VERSION = 1
BACKENDS = ("tcp", "nccl")
# Bytes per element of the torch dtypes a trainer may announce (the server takes bfloat16, float16 and float32).
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "float64": 8, "double": 8,
               "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1,
               "float8_e5m2": 1}


def post(base, path, body, timeout=300):
    """(status, JSON answer) of a POST; `body` None sends none (as SkyRL's destroy call)."""
    data = b"" if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read().decode())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read().decode())


def _read_exact(conn, count):
    data = b""
    while len(data) < count:
        chunk = conn.recv(count - len(data))
        if not chunk:
            raise ConnectionError(f"the server closed the connection after {len(data)} of {count} bytes")
        data += chunk
    return data


def _string(value):
    encoded = value.encode()
    return struct.pack("<I", len(encoded)) + encoded


def byte_count(data):
    """Bytes of a tensor's data: `data` bytes or a torch tensor."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return len(data)
    return data.numel() * data.element_size()


def tensor_bytes(data):
    """`data` as bytes (a torch tensor's, row-major in its own dtype)."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return data
    import torch
    return data.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes()


def check_frames(tensors):
    """Refuses, naming the tensor, a (name, dtype, shape, data) whose data is not the size its dtype and shape
    announce: the server would refuse it after the bytes came (tcp), or the broadcast's counts would differ (nccl)."""
    for name, dtype, shape, data in tensors:
        size = DTYPE_BYTES.get(dtype.removeprefix("torch."))
        if size is None:
            raise ValueError(f"tensor \"{name}\": dtype '{dtype}' is not a torch dtype this trainer knows "
                             f"({', '.join(DTYPE_BYTES)})")
        expected = math.prod(shape) * size
        if byte_count(data) != expected:
            raise ValueError(f"tensor \"{name}\": {byte_count(data)} bytes where {dtype} {list(shape)} takes "
                             f"{expected}")


class Trainer:
    """Rank 0 of a weight update group: a listening socket, one connection per server rank that joined and, with
    backend "nccl", an NCCL group on `device` (trainer_nccl.NcclRoot, or `nccl`: an object with its methods) that
    the servers join once they all have its id. `timeout` bounds every NCCL wait."""

    def __init__(self, host="127.0.0.1", port=0, backend="tcp", device="cuda", timeout=600, nccl=None):
        if backend not in BACKENDS:
            raise ValueError(f"backend: '{backend}' is not tcp or nccl")
        self.backend = backend
        self.nccl = None
        if backend == "nccl":
            if nccl is None:
                from trainer_nccl import NcclRoot
                nccl = NcclRoot(device, timeout)
            self.nccl = nccl
        self.host = host
        self.listener = socket.create_server((host, port))
        self.port = self.listener.getsockname()[1]
        self.servers = []
        self.world_size = None

    def accept(self, timeout=60, refuse=None):
        """Accepts one server rank; answers its hello (a refusal carrying `refuse`, or why this trainer cannot take
        it). With nccl the answer carries the group's id, and the last server rank's completes the group."""
        self.listener.settimeout(timeout)
        conn, _ = self.listener.accept()
        conn.settimeout(timeout)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        magic = _read_exact(conn, 4)
        assert magic == MAGIC, magic
        version, rank, world_size = struct.unpack("<IiI", _read_exact(conn, 12))
        hello = {"version": version, "rank": rank, "world_size": world_size}
        for key in ("group_name", "backend"):
            (length,) = struct.unpack("<I", _read_exact(conn, 4))
            hello[key] = _read_exact(conn, length).decode()
        why = refuse if refuse is not None else self.refusal(hello)
        if why is not None:
            conn.sendall(MAGIC + struct.pack("<I", 1) + _string(why))
            conn.close()
            return hello
        conn.sendall(MAGIC + struct.pack("<I", 0) + _string(""))
        self.servers.append(conn)
        self.world_size = world_size
        if self.nccl is not None:
            conn.sendall(self.nccl.unique_id())
            if len(self.servers) == world_size - 1:
                self.nccl.join(world_size)
        return hello

    def refusal(self, hello):
        """Why this trainer cannot take a server's hello, or None."""
        if hello["version"] != PROTOCOL_VERSION:
            return f"protocol version {hello['version']}: this trainer speaks version {PROTOCOL_VERSION}"
        if hello["backend"] != self.backend:
            return f"backend '{hello['backend']}': this trainer's group is '{self.backend}'"
        if self.nccl is not None and self.world_size is not None and hello["world_size"] != self.world_size:
            return f"world_size {hello['world_size']}: the servers that joined before said {self.world_size}"
        if self.nccl is not None and self.nccl.world_size is not None:
            return f"this trainer's NCCL group of {self.nccl.world_size} ranks is complete"
        return None

    def send_tensor(self, name, data):
        """One tensor to every server (`data`: bytes or a torch tensor): tcp, a frame on each connection (name, byte
        count, bytes); nccl, one ncclBroadcast of its bytes, waited for."""
        if self.nccl is not None:
            self.nccl.broadcast(name, data)
            return
        data = tensor_bytes(data)
        for conn in self.servers:
            conn.sendall(_string(name) + struct.pack("<Q", len(data)))
            conn.sendall(data)

    def close_servers(self, abort=False):
        """Closes the connections and (nccl) destroys the group, which the servers must destroy meanwhile; `abort`:
        the servers are gone (a failure), so the group is aborted instead."""
        for conn in self.servers:
            conn.close()
        self.servers = []
        self.world_size = None
        if self.nccl is not None:
            self.nccl.close(abort)

    def close(self, abort=False):
        self.close_servers(abort)
        self.listener.close()


def in_thread(call):
    """Runs call() in a thread (the HTTP request waits for the trainer's side); returns join(timeout=None,
    what="the call"), which gives its result or raises what it raised, and raises TimeoutError naming `what` when it
    is not done within `timeout` seconds (the thread is left running: a blocking call cannot be interrupted)."""
    result = {}

    def run():
        try:
            result["value"] = call()
        except BaseException as error:  # handed to join()
            result["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join(timeout=None, what="the call"):
        thread.join(timeout)
        if thread.is_alive():
            raise TimeoutError(f"{what}: not done after {timeout:g} s")
        if "error" in result:
            raise result["error"]
        return result["value"]

    return join


def init_group(base, trainer, group_name="weight_update_group", rank_offset=1, world_size=2, backend=None,
               accept=True):
    """POST /init_weights_update_group (`backend`: the trainer's unless given) while accepting the server's
    connection: (status, JSON answer)."""
    body = {"master_address": trainer.host, "master_port": trainer.port, "rank_offset": rank_offset,
            "world_size": world_size, "group_name": group_name, "backend": backend or trainer.backend}
    return join_group(base, trainer, "/init_weights_update_group", body, accept)


def join_group(base, trainer, path, body, accept=True):
    """POST `body` to `path` (an init endpoint) while accepting the server's connection: (status, JSON answer)."""
    answer = in_thread(lambda: post(base, path, body))
    if accept:
        hello = trainer.accept()
        expected = {"version": PROTOCOL_VERSION, "rank": body["rank_offset"], "world_size": body["world_size"],
                    "group_name": body["group_name"], "backend": body["backend"]}
        assert hello == expected, hello
    return answer()


def update_weights(base, trainer, tensors, send=None, path="/update_weights_from_distributed", one_tensor=False,
                   **fields):
    """POST /update_weights_from_distributed (or `path`) announcing `tensors` ((name, dtype, shape, data) each, data
    bytes or a torch tensor, checked against its dtype and shape first) while sending them; `send(trainer, tensors)`
    replaces the sending (to send something else, unchecked). `one_tensor`: the announcement
    as `name`, `dtype`, `shape` of the only tensor (SkyRL's remote engine) rather than lists. (status, JSON answer)."""
    if one_tensor:
        (name, dtype, shape, _), = tensors
        body = {"name": name, "dtype": dtype, "shape": list(shape), **fields}
    else:
        body = {"names": [t[0] for t in tensors], "dtypes": [t[1] for t in tensors],
                "shapes": [list(t[2]) for t in tensors], **fields}
    if send is None:
        check_frames(tensors)
    answer = in_thread(lambda: post(base, path, body))
    if send is None:
        for name, _, _, data in tensors:
            trainer.send_tensor(name, data)
    else:
        send(trainer, tensors)
    return answer()
