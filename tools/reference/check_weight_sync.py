#!/usr/bin/env python3
"""Weight sync from a trainer over TCP (/init_weights_update_group, /update_weights_from_distributed,
/destroy_weights_update_group; docs/rl.md), as SkyRL or verl drive SGLang, with this script as the trainer (rank 0);
then SkyRL's remote-engine calls exactly as it makes them to an SGLang server and to its vLLM server
(/init_weight_update_communicator, /update_weights).

  python3 tools/reference/check_weight_sync.py [--beamline build/apps/beamline/beamline] [--device cpu]
          [--extra-args "--tensor-parallel-size 2"]

Serves a random tiny model (seed 1) and, beside it, a fresh server on a second one (seed 2). Checks that bad updates
(unknown tensor, wrong shape or dtype, malformed announcements, a trainer that stops sending, one that dies
mid-tensor, an unknown group) are refused with a message naming the cause, leave the served weights as they were
(same greedy tokens and logprobs) and the server serving, during a stalled transfer too; then sends the second checkpoint's tensors in two buckets
and checks that the greedy answers (token ids and logprobs, exactly) equal the fresh server's, twice (with
data-parallel replicas under least-loaded routing the prompts then go to the other replica), and that the first
checkpoint from disk (/update_weights_from_disk) brings back the first answers. Then, for each of SkyRL's two remote
engine backends (sglang, vllm), its payloads: the group made under SkyRL's name, one tensor a call with no group_name,
bad calls refused naming the field with the old answers kept, the second checkpoint tensor by tensor giving the fresh
server's answers, and the group destroyed by a call with no body. With a parallel layout in --extra-args both servers
are distributed, and rank 0 forwards each update to the other ranks (and replicas).
"""
import json
import os
import re
import shlex
import socket
import struct
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from beamline_server import Server, check_parser, make_tiny_model  # noqa: E402
from safetensors_io import load_checkpoint_tensors  # noqa: E402
from weight_sync_trainer import Trainer, in_thread, init_group, join_group, post, update_weights  # noqa: E402

TORCH_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}
TIMEOUT_SECONDS = 10  # the servers' --distributed-timeout-seconds: a greedy answer must fit in it on a loaded CI machine


def checkpoint_tensors(directory):
    """(name, torch dtype, shape, bytes) of every tensor of a checkpoint, in file order."""
    return [(name, TORCH_DTYPES[t.dtype], list(t.array.shape), t.array.tobytes())
            for name, t in load_checkpoint_tensors(directory).items()]


def greedy(server):
    """Token ids and logprobs of three temperature-0 completions."""
    answers = []
    for prompt in ([1, 2, 3, 4, 5], [100, 7, 300], [42] * 9):
        status, reply = post(server.base, "/v1/completions",
                             {"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0, "logprobs": 2,
                              "ignore_eos": True, "return_token_ids": True})
        assert status == 200, reply
        choice = reply["choices"][0]
        answers.append((choice["token_ids"], choice["logprobs"]["token_logprobs"], choice["logprobs"]["top_logprobs"]))
    return answers


def stream_token_ids(stream, first_only=False):
    """The token ids of an SSE completion stream: of its first chunk that has any, or of all the chunks left."""
    ids = []
    for line in stream:
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for choice in json.loads(line[len("data: "):]).get("choices", []):
            ids += choice.get("token_ids") or []
        if first_only and ids:
            break
    return ids


def expect_error(status, reply, param, pattern, what):
    assert status == 400, f"{what}: expected a 400, got {status} {reply}"
    error = reply["error"]
    assert error["param"] == param, f"{what}: param {error['param']!r}, expected {param!r} ({error['message']})"
    assert re.search(pattern, error["message"]), f"{what}: {error['message']!r} does not match {pattern!r}"
    print(f"  refused as expected ({what}): {error['message']}")


# SkyRL's remote engine (skyrl_train/inference_engines/remote_inference_engine.py): the endpoints it calls on each
# backend's server.
SKYRL_ENDPOINTS = {
    "sglang": {"init": "/init_weights_update_group", "update": "/update_weights_from_distributed",
               "reset": "/flush_cache"},
    "vllm": {"init": "/init_weight_update_communicator", "update": "/update_weights", "reset": "/reset_prefix_cache"},
}


def skyrl_init_body(trainer, engine_backend, **changes):
    """What SkyRL posts to make the group: SGLang's fields, or to its vLLM server its whole BroadcastInitInfo."""
    if engine_backend == "sglang":
        body = {"master_address": trainer.host, "master_port": trainer.port, "rank_offset": 1, "world_size": 2,
                "group_name": "skyrl", "backend": "tcp"}
    else:
        body = {"override_existing_receiver": True, "master_addr": trainer.host, "master_port": trainer.port,
                "rank_offset": 1, "world_size": 2, "group_name": "skyrl", "backend": "tcp",
                "model_dtype_str": "torch.bfloat16"}
    return {key: value for key, value in {**body, **changes}.items() if value is not None}


def check_skyrl(server, trainer, engine_backend, models, before, expected, new_tensors, greedy_of):
    """SkyRL's weight-sync calls to an `engine_backend` server; the served weights are the first checkpoint's before
    and after."""
    print(f"SkyRL's remote engine, engine_backend {engine_backend}:")
    base = server.base
    endpoints = SKYRL_ENDPOINTS[engine_backend]
    norm = next(t for t in new_tensors if t[0].endswith("input_layernorm.weight"))

    def unchanged(what):
        assert greedy_of(server) == before, f"{engine_backend}: the served weights changed after {what}"

    def update(tensors, form="one", send=None):
        # SkyRL sends one tensor a call, as name/dtype/shape; its vLLM server's newer payload is the request's lists
        # (and sizes, null unless packed).
        fields = {} if form == "one" else {"sizes": None}
        return update_weights(base, trainer, tensors, send=send, path=endpoints["update"], one_tensor=form == "one",
                              **fields)

    def join(**changes):
        trainer.close_servers()
        return join_group(base, trainer, endpoints["init"], skyrl_init_body(trainer, engine_backend, **changes))

    if engine_backend == "sglang":
        # Among several groups, a call that names none is refused, naming them.
        for name in ("a", "b"):
            assert init_group(base, trainer, group_name=name)[0] == 200
        status, reply = update([norm], send=lambda trainer, tensors: None)
        expect_error(status, reply, "group_name", r"missing, and there are 2 weight update groups \('a', 'b'\)",
                     "two groups, none named")
        for name in ("a", "b"):
            assert post(base, "/destroy_weights_update_group", {"group_name": name})[0] == 200
    status, reply = join()
    assert status == 200 and reply["success"], reply
    lora = ("model.layers.0.self_attn.q_proj.lora_A.weight", "bfloat16", [4, 64], bytes(512))
    status, reply = update([lora])
    expect_error(status, reply, "name", r"lora_A.weight\" is not a tensor of this model", "unknown tensor (one)")
    unchanged("an unknown tensor")
    status, reply = update([(norm[0], norm[1], [norm[2][0] + 1], norm[3] + norm[3][:2])])
    expect_error(status, reply, "name", r"expected shape \[64\], got \[65\]", "wrong shape (one)")
    unchanged("a wrong shape")
    if engine_backend == "vllm":
        status, reply = update([norm, (norm[0] + "x", *norm[1:])], form="lists")
        expect_error(status, reply, "names", r"weightx\" is not a tensor of this model", "a later unknown (lists)")
        unchanged("an update whose second tensor is unknown")
        # Joining again: refused unless SkyRL asks to override the group, then the old connection is closed.
        status, reply = post(base, endpoints["init"], skyrl_init_body(trainer, engine_backend,
                                                                       override_existing_receiver=False))
        expect_error(status, reply, "group_name", r"'skyrl' exists.*override_existing_receiver true", "group exists")
        for changes, param, pattern in [
                ({"master_addr": None}, "master_address", r"master_address: missing"),
                ({"model_dtype_str": "torch.float64"}, "model_dtype_str", r"model_dtype_str: 'torch.float64' is not"),
                ({"master_port": 0}, "master_port", r"master_port: expected an integer in \[1, 65535\]")]:
            status, reply = post(base, endpoints["init"], skyrl_init_body(trainer, engine_backend, **changes))
            expect_error(status, reply, param, pattern, f"init with {changes}")
        assert join()[0] == 200
        # A packed bucket (SkyRL's `sizes`) is another wire format: refused, and the group closed as for any
        # announcement the server cannot read (the trainer is sending already).
        status, reply = update_weights(base, trainer, [norm], send=lambda trainer, tensors: None,
                                       path=endpoints["update"], sizes=[len(norm[3])])
        expect_error(status, reply, "sizes", r"sizes: packed buckets", "a packed bucket")
        unchanged("a packed bucket")
        status, reply = update([norm], send=lambda trainer, tensors: None)
        expect_error(status, reply, "group_name", r"there is no weight update group", "group closed after a bad call")
        assert join()[0] == 200
    status, reply = update([(norm[0], "float64", norm[2], b"")], send=lambda trainer, tensors: None)
    expect_error(status, reply, "dtype", r"dtype: 'float64' is not", "unknown dtype (one)")
    unchanged("an unreadable announcement")
    assert join()[0] == 200

    # The second checkpoint as SkyRL sends it, one tensor a call (to vLLM every other call in the list form), then
    # the prefix cache reset: the fresh server's answers.
    started = time.time()
    for i, tensor in enumerate(new_tensors):
        status, reply = update([tensor], form="lists" if engine_backend == "vllm" and i % 2 else "one")
        assert status == 200 and reply["success"], reply
    seconds = time.time() - started
    status, reply = post(base, endpoints["reset"], None)
    assert status == 200, reply
    for _ in range(2):  # with data-parallel replicas (least-loaded routing) each prompt reaches both
        after = greedy_of(server)
        assert after == expected, f"{engine_backend}: after SkyRL's sync:\n{after}\nexpected:\n{expected}"
    print(f"  {len(new_tensors)} calls of one tensor each ({seconds:.1f} s): greedy answers equal a fresh server's")

    status, reply = post(base, "/update_weights_from_disk", {"model_path": models[1]})
    assert status == 200 and reply["success"], reply
    unchanged("the first checkpoint from disk")
    # SkyRL's teardown names no group.
    status, reply = post(base, "/destroy_weights_update_group", None)
    assert status == 200 and reply["success"] and "'skyrl'" in reply["message"], reply
    status, reply = post(base, "/destroy_weights_update_group", None)
    expect_error(status, reply, "group_name", r"there is no weight update group", "destroyed twice")
    trainer.close_servers()


def main():
    parser = check_parser(__doc__)
    parser.add_argument("--extra-args", default="", help="more `beamline serve` flags (a parallel layout)")
    args = parser.parse_args()
    extra = ["--served-model-name", "tiny", "--distributed-timeout-seconds", str(TIMEOUT_SECONDS)] \
        + shlex.split(args.extra_args)
    with tempfile.TemporaryDirectory() as scratch:
        models = {}
        for seed in (1, 2):
            models[seed] = os.path.join(scratch, f"step{seed}")
            make_tiny_model(args.beamline, models[seed], seed)
        new_tensors = checkpoint_tensors(models[2])
        norm = next(t for t in new_tensors if t[0].endswith("input_layernorm.weight"))
        router = next(t for t in new_tensors if t[0].endswith("mlp.gate.weight"))

        fresh = Server(args.beamline, models[2], args.device, extra)
        try:
            expected = greedy(fresh)
        finally:
            fresh.stop()
        server = Server(args.beamline, models[1], args.device, extra + ["--weight-update-dir", scratch])
        trainer = Trainer()
        try:
            before = greedy(server)
            assert before != expected, "the two random checkpoints answer alike; the check would prove nothing"
            base = server.base

            def unchanged(what):
                assert greedy(server) == before, f"the served weights changed after {what}"

            # Joining: refusals and mistakes name their cause.
            status, reply = init_group(base, trainer, group_name="g", backend="gloo", accept=False)
            expect_error(status, reply, "master_address", r"backend: 'gloo' is not tcp or nccl", "unknown backend")
            status, reply = init_group(base, trainer, group_name="g", rank_offset=2, world_size=2, accept=False)
            expect_error(status, reply, "rank_offset", r"rank_offset: 2 is not a rank of a world of 2", "rank_offset")
            body = {"master_address": trainer.host, "master_port": trainer.port, "rank_offset": 1, "world_size": 2,
                    "group_name": "g", "backend": "tcp"}
            pending = in_thread(lambda: post(base, "/init_weights_update_group", body))
            trainer.accept(refuse="this trainer expects 4 servers")
            expect_error(*pending(), "master_address", r"refused: this trainer expects 4 servers", "trainer refuses")
            with socket.socket() as unused:
                unused.bind(("127.0.0.1", 0))
                closed_port = unused.getsockname()[1]
            started = time.time()
            status, reply = post(base, "/init_weights_update_group", {**body, "master_port": closed_port})
            expect_error(status, reply, "master_address", rf"trainer \(rank 0\) at 127.0.0.1:{closed_port}: cannot "
                         rf"connect within {TIMEOUT_SECONDS} s .*: connection refused", "nobody listens")
            assert time.time() - started < TIMEOUT_SECONDS + 5

            status, reply = init_group(base, trainer, group_name="g")
            assert status == 200 and reply["success"], reply
            status, reply = init_group(base, trainer, group_name="g", accept=False)
            expect_error(status, reply, "group_name", r"'g' exists", "group exists")

            # Updates whose every byte arrives but which the model refuses: the group stays open.
            bad_shape = (norm[0], norm[1], [norm[2][0] + 1], norm[3] + norm[3][:2])

            def send_first(trainer, tensors):
                trainer.send_tensor(tensors[0][0], tensors[0][3])
            refused = [
                ([("model.layers.0.self_attn.q_proj.lora_A.weight", "bfloat16", [4, 64], bytes(512))],
                 r'"model.layers.0.self_attn.q_proj.lora_A.weight" is not a tensor of this model', "unknown tensor"),
                ([norm, (norm[0] + "x", *norm[1:])], r"weightx\" is not a tensor of this model", "a later unknown"),
                ([bad_shape], r"input_layernorm.weight\": expected shape \[64\], got \[65\]", "wrong shape"),
                ([(norm[0], "int32", norm[2], bytes(4 * norm[2][0]))], r"dtype I32 is not allowed here", "wrong dtype"),
                ([norm, norm], r"is sent twice", "a tensor twice"),
            ]
            for tensors, pattern, what in refused:
                status, reply = update_weights(base, trainer, tensors, group_name="g")
                expect_error(status, reply, "names", pattern, what)
                unchanged(what)

            status, reply = update_weights(base, trainer, [norm], group_name="nope")
            expect_error(status, reply, "group_name", r"no weight update group 'nope'", "unknown group")

            # An announcement the server cannot read: the group is closed, which the trainer sees.
            status, reply = update_weights(base, trainer, [(norm[0], "float64", norm[2], b"")], group_name="g",
                                           send=lambda trainer, tensors: None)
            expect_error(status, reply, "dtypes", r"dtypes\[0\]: 'float64' is not", "unknown dtype")
            unchanged("an unreadable announcement")
            status, reply = update_weights(base, trainer, [norm], group_name="g", send=lambda trainer, tensors: None)
            expect_error(status, reply, "group_name", r"no weight update group 'g'", "group closed after a bad call")
            trainer.close_servers()

            # A trainer that stops sending: the deadline names it, and the group is closed. Meanwhile the server
            # answers with the old weights.
            assert init_group(base, trainer, group_name="g")[0] == 200
            started = time.time()

            def stall(trainer, tensors):
                send_first(trainer, tensors)
                assert greedy(server) == before, "answers during a transfer differ from the old weights'"
                assert time.time() - started < TIMEOUT_SECONDS, "answering took as long as the transfer's timeout"
            status, reply = update_weights(base, trainer, [norm, router], group_name="g", send=stall)
            expect_error(status, reply, "group_name", rf"tensor 2 of 2 \(\"{re.escape(router[0])}\"\): nothing from "
                         rf"the trainer \(rank 0\) at 127.0.0.1:{trainer.port} for {TIMEOUT_SECONDS} s", "timeout")
            assert time.time() - started < TIMEOUT_SECONDS + 5
            unchanged("a timeout")
            trainer.close_servers()

            # A trainer that dies half-way through a tensor.
            assert init_group(base, trainer, group_name="g")[0] == 200

            def die(trainer, tensors):
                send_first(trainer, tensors)
                name, _, _, data = tensors[1]
                conn = trainer.servers[0]
                conn.sendall(struct.pack("<I", len(name)) + name.encode() + struct.pack("<Q", len(data)))
                conn.sendall(data[:len(data) // 2])
                trainer.close_servers()
            status, reply = update_weights(base, trainer, [norm, router], group_name="g", send=die)
            expect_error(status, reply, "group_name", rf"tensor 2 of 2 .*closed the connection after "
                         rf"{len(router[3]) // 2} of {len(router[3])} bytes", "trainer died")
            unchanged("a trainer that died")

            # Tensors in another order than announced.
            assert init_group(base, trainer, group_name="g")[0] == 200
            def send_out_of_order(trainer, tensors):
                # The server hangs up once it has read the unexpected name, possibly before all its bytes arrived.
                try:
                    send_first(trainer, tensors[1:])
                except (ConnectionResetError, BrokenPipeError):
                    pass
            status, reply = update_weights(base, trainer, [norm, router], group_name="g", send=send_out_of_order)
            expect_error(status, reply, "group_name", r"sent \".*mlp.gate.weight\" where the update lists", "order")
            unchanged("tensors out of order")
            trainer.close_servers()

            # The new checkpoint in two buckets (as SkyRL sends it): after the first the weights are a mix, after the
            # second they are the new checkpoint's, exactly.
            assert init_group(base, trainer, group_name="g")[0] == 200
            half = len(new_tensors) // 2
            status, reply = update_weights(base, trainer, new_tensors[:half], group_name="g", flush_cache=False)
            assert status == 200 and reply["success"] and reply["weight_version"] == "1", reply
            # The second while a long request is in flight: as in SGLang the update waits for it, so all its tokens
            # come from one version of the weights (the mixed ones).
            long_request = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 500, "temperature": 0,
                            "ignore_eos": True, "return_token_ids": True}
            status, alone = post(base, "/v1/completions", long_request)
            assert status == 200, alone
            # Streamed, so that the update starts only once the request is surely running.
            stream = urllib.request.urlopen(urllib.request.Request(
                base + "/v1/completions", data=json.dumps({**long_request, "stream": True}).encode(),
                headers={"Content-Type": "application/json"}), timeout=300)
            long_started = time.time()
            first = stream_token_ids(stream, first_only=True)
            rest = in_thread(lambda: (stream_token_ids(stream), time.time()))
            update_started = time.time()
            status, reply = update_weights(base, trainer, new_tensors[half:], group_name="g", weight_version="step-2")
            assert status == 200 and reply["success"] and reply["weight_version"] == "step-2", reply
            updated = time.time()
            remaining, long_ended = rest()
            assert long_ended <= updated, "the update was answered before the request in flight had finished"
            assert first + remaining == alone["choices"][0]["token_ids"], \
                "a request in flight during an update mixed two versions of the weights"
            print(f"  an update waited for the request in flight ({long_ended - long_started:.2f} s, "
                  f"update answered {updated - update_started:.2f} s after it was sent)")
            for _ in range(2):  # with data-parallel replicas (least-loaded routing) each prompt reaches both
                after = greedy(server)
                assert after == expected, f"after the update:\n{after}\nexpected (a server started on it):\n{expected}"
            status, reply = post(base, "/v1/completions", {"model": "tiny", "prompt": [1], "max_tokens": 1})
            assert reply["weight_version"] == "step-2", reply
            print(f"  {len(new_tensors)} tensors sent in two updates: greedy answers equal a fresh server's")

            # A BF16 router is taken (widened to F32, the router's dtype).
            bits = struct.unpack(f"<{len(router[3]) // 4}I", router[3])
            bf16 = struct.pack(f"<{len(bits)}H", *[b >> 16 for b in bits])
            status, reply = update_weights(base, trainer, [(router[0], "bfloat16", router[2], bf16)], group_name="g")
            assert status == 200, reply

            # The first checkpoint again, from disk: its answers come back.
            status, reply = post(base, "/update_weights_from_disk", {"model_path": models[1], "weight_version": "disk"})
            assert status == 200 and reply["success"] and reply["weight_version"] == "disk", reply
            for _ in range(2):
                assert greedy(server) == before, "after /update_weights_from_disk of the first checkpoint"
            print("  the first checkpoint from disk gives its answers again")

            status, reply = post(base, "/destroy_weights_update_group", {"group_name": "g"})
            assert status == 200 and reply["success"], reply
            status, reply = post(base, "/destroy_weights_update_group", {"group_name": "g"})
            expect_error(status, reply, "group_name", r"no weight update group 'g'", "destroyed twice")

            for engine_backend in SKYRL_ENDPOINTS:
                check_skyrl(server, trainer, engine_backend, models, before, expected, new_tensors, greedy)
        finally:
            trainer.close()
            server.stop()
        print("weight sync over tcp: ok")


if __name__ == "__main__":
    main()
