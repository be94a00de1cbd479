"""The trainer's end of beamline's weight sync over TCP (backend "tcp"), Python stdlib only.

The wire protocol is src/weight_sync/weight_update_group.h's: the trainer is rank 0 and listens; each server rank
connects when asked by /init_weights_update_group (or /init_weight_update_communicator) and says hello; for every
/update_weights_from_distributed (or /update_weights) the trainer writes the announced tensors, in order, to every
server's connection. Usage:

    trainer = Trainer()                                   # listens on 127.0.0.1, a free port
    init_group(base, trainer, group_name="g")             # POST /init_weights_update_group + accept the server
    status, reply = update_weights(base, trainer, [("model.norm.weight", "bfloat16", [64], raw_bytes), ...],
                                   group_name="g", weight_version="step-1")
"""
import json
import socket
import struct
import threading
import urllib.error
import urllib.request

MAGIC = b"BLWS"
PROTOCOL_VERSION = 1


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


class Trainer:
    """Rank 0 of a weight update group: a listening socket and one connection per server rank that joined."""

    def __init__(self, host="127.0.0.1", port=0):
        self.host = host
        self.listener = socket.create_server((host, port))
        self.port = self.listener.getsockname()[1]
        self.servers = []

    def accept(self, timeout=60, refuse=None):
        """Accepts one server rank; answers its hello (with `refuse`, a refusal carrying that message)."""
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
        if refuse is not None:
            conn.sendall(MAGIC + struct.pack("<I", 1) + _string(refuse))
            conn.close()
            return hello
        conn.sendall(MAGIC + struct.pack("<I", 0) + _string(""))
        self.servers.append(conn)
        return hello

    def send_tensor(self, name, data):
        """One tensor frame to every server: name, byte count, bytes."""
        for conn in self.servers:
            conn.sendall(_string(name) + struct.pack("<Q", len(data)))
            conn.sendall(data)

    def close_servers(self):
        for conn in self.servers:
            conn.close()
        self.servers = []

    def close(self):
        self.close_servers()
        self.listener.close()


def in_thread(call):
    """Runs call() in a thread (the HTTP request waits for the trainer's side); returns a function giving its result."""
    result = {}

    def run():
        result["value"] = call()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join():
        thread.join()
        return result["value"]

    return join


def init_group(base, trainer, group_name="weight_update_group", rank_offset=1, world_size=2, backend="tcp",
               accept=True):
    """POST /init_weights_update_group while accepting the server's connection: (status, JSON answer)."""
    body = {"master_address": trainer.host, "master_port": trainer.port, "rank_offset": rank_offset,
            "world_size": world_size, "group_name": group_name, "backend": backend}
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
    """POST /update_weights_from_distributed (or `path`) announcing `tensors` ((name, dtype, shape, bytes) each) while
    sending them; `send(trainer, tensors)` replaces the sending (to send something else). `one_tensor`: the announcement
    as `name`, `dtype`, `shape` of the only tensor (SkyRL's remote engine) rather than lists. (status, JSON answer)."""
    if one_tensor:
        (name, dtype, shape, _), = tensors
        body = {"name": name, "dtype": dtype, "shape": list(shape), **fields}
    else:
        body = {"names": [t[0] for t in tensors], "dtypes": [t[1] for t in tensors],
                "shapes": [list(t[2]) for t in tensors], **fields}
    answer = in_thread(lambda: post(base, path, body))
    if send is None:
        for name, _, _, data in tensors:
            trainer.send_tensor(name, data)
    else:
        send(trainer, tensors)
    return answer()
