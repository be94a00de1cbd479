#!/usr/bin/env python3
"""Issue 20's rollout loop: this script is the RL trainer (PyTorch, beam-nano held in float32 by
tools/reference/beam_torch.py) driving running `beamline serve` processes as its rollout engines, as SkyRL drives
SGLang: change the weights, push them by the weight-sync protocol (docs/rl.md), sample, check, K times.

  python3 bench/rollout_loop.py --beamline BIN [--device cpu|cuda] [--model models/beam-nano] [--rounds 3]
          [--rollouts 16] [--replay-rollouts 64] [--max-tokens 96] [--weight-sync tcp|nccl] [--out DIR]

Two servers are started on --model and stay up: A serves --dtype float32, B --dtype bfloat16. With --weight-sync tcp
(the default) both join one weight update group (the trainer rank 0, A rank 1, B rank 2; each tensor frame goes to
both). With --weight-sync nccl the trainer's tensors live on a second GPU (--trainer-device, cuda:1) and the servers
run on the first (CUDA_VISIBLE_DEVICES), and each server joins a group of its own (the trainer rank 0, the server
rank 1): NCCL refuses two ranks of one communicator on one GPU, and both servers share GPU 0; the trainer broadcasts
every tensor once per group (tools/reference/trainer_nccl.py: libnccl.so.2 through ctypes, the one PyTorch loaded,
which the servers are then given too). Each round the trainer
  1. adds noise (--noise times each tensor's RMS) to every trained tensor of its FP32 master weights, and takes as the
     policy the master rounded to BF16 (the router, weight and bias, stays FP32: the server requires it), which is what
     it sends (bfloat16 frames, float32 router) and saves (config.json + model.safetensors, --checkpoints/step-K);
  2. sends the policy to A and B (/pause, /update_weights_from_distributed with one bucket and weight_version
     step-K, /resume), over tcp frames or NCCL broadcasts;
  3. samples --rollouts completions from A (/v1/completions, token ids in and out, temperature 1, logprobs,
     return_routed_experts; Harmony prompts of tools/data/generate.py's held-out split) and --replay-rollouts from B;
and checks
  (a) A's logprobs equal those of a fresh server (--dtype float32) started on the saved checkpoint, bit for bit: every
      rollout scored teacher-forced by prompt_logprobs (the token and its 5 best alternatives at every position);
  (b) the logprobs A returned while sampling (decode) and scoring (prefill) are within --tolerance (1e-4) of the
      reference's for the same tokens (the policy in float32 PyTorch, log-softmax in float64), the reference routing
      as A did in that request (A's returned experts replayed: where (c) finds only float32 ties, a tie broken the
      other way would otherwise move every later position; without the replay it is reported too);
  (c) the experts A returned equal the reference's routing at every token and MoE layer (in order of selection),
      except float32 ties: rows where the reference's scores of the experts A chose and of those it chose itself
      differ by at most TIE_GAP (1e-6, a few float32 roundings of the sigmoid scores; a different summation order of
      the router's dot products moves a score that much) are counted and reported, not failed;
  (d) routing replay (R3): the mean absolute logprob gap between B's sampled tokens and the reference, with B's
      returned routing replayed in the reference and without (the reference routing by itself); goal <= 0.008
      with replay (the published SkyRL figure for BF16 rollouts). With --replay-quantization mxfp8, B serves MXFP8
      weights, quantized on arrival from the BF16 frames (MXFP8 rollouts; goal <= 0.03, the published figure).
Also reported: how far the round's noise moved the reference's logprobs of A's rollouts (so (a)-(c) can tell the
weights apart), the broadcast's seconds and bytes, B's routing against the reference's own.

`nccl` needs two GPUs (nvidia-h200-x2) and is refused, saying so, with fewer; on one GPU and on the cpu backend the
loop uses `tcp`. On the cpu backend --dtype bfloat16 still computes in FP32 (the cpu backend always does), so (d)
measures BF16 serving only on cuda.

Writes --out/rollout.json and --out/rollout.md (the tables it prints); exits 1 when any check fails or did not run.
"""
import argparse
import base64
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import traceback

import numpy as np

try:
    import torch
except ImportError:
    print("rollout_loop.py needs PyTorch (Debian: python3-torch): not run", file=sys.stderr)
    sys.exit(77)  # CTest's skip

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
sys.path.insert(0, os.path.join(ROOT, "tools", "data"))
import beam_torch  # noqa: E402
import generate  # noqa: E402
from beamline_server import DEFAULT_BEAMLINE, Server  # noqa: E402
from weight_sync_trainer import Trainer, byte_count, check_frames, in_thread, post  # noqa: E402

GROUP = "rollout"
TIMEOUT_SECONDS = 120          # the servers' --distributed-timeout-seconds and the trainer's NCCL waits
PROMPT_LOGPROBS = 5
REPLAY_GOAL = 0.008            # SkyRL's published gap with routing replay, BF16 rollouts
QUANTIZED_REPLAY_GOAL = 0.03   # the same for MXFP8 rollouts
TIE_GAP = 1e-6                 # router scores this close are a float32 tie: either choice is right


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--beamline", default=DEFAULT_BEAMLINE)
    parser.add_argument("--device", default="cpu", help="the servers' --device (cpu or cuda)")
    parser.add_argument("--reference-device", help="torch device of the reference (default: --trainer-device with "
                                                   "nccl; else cuda if the servers run there and torch sees one, "
                                                   "else cpu)")
    parser.add_argument("--weight-sync", choices=["tcp", "nccl"], default="tcp",
                        help="the weight update groups' backend; nccl needs two GPUs (the trainer on "
                             "--trainer-device, the servers on the first one visible)")
    parser.add_argument("--trainer-device", default="cuda:1", help="with nccl: the GPU the trainer's tensors live on "
                                                                   "and broadcast from (not the servers')")
    parser.add_argument("--model", default=os.path.join(ROOT, "models", "beam-nano"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rollouts", type=int, default=16, help="rollouts from the float32 server per round")
    parser.add_argument("--replay-rollouts", type=int, default=64, help="rollouts from the bfloat16 server per round")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--max-prompt-tokens", type=int, default=800, help="prompts longer than this are redrawn")
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--kv-cache-memory", default="256M")
    parser.add_argument("--noise", type=float, default=0.005, help="noise per round, times each tensor's RMS")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=20)
    parser.add_argument("--reference-batch", type=int, default=8, help="sequences per reference forward pass")
    parser.add_argument("--extra-args", default="", help="more `beamline serve` flags for every server")
    parser.add_argument("--replay-quantization", choices=["fp8", "mxfp8", "nvfp4"],
                        help="B serves its weights quantized so (--quantization): each update is quantized on arrival "
                             "(docs/rl.md); (d)'s goal is then the published MXFP8 figure, 0.03")
    parser.add_argument("--out", default="rollout-out", help="where the results go")
    parser.add_argument("--checkpoints", help="where the trainer saves its checkpoints (default: a temporary folder, "
                                             "removed at the end)")
    return parser.parse_args()


# ---------------------------------------------------------------- servers

def start_server(args, model, dtype, quantization=None):
    extra = ["--dtype", dtype, "--served-model-name", "policy", "--enable-return-routed-experts",
             "--speculative-config", "none", "--seed", "0", "--max-logprobs", str(PROMPT_LOGPROBS),
             "--distributed-timeout-seconds", str(TIMEOUT_SECONDS)] + args.extra_args.split()
    if quantization:
        extra += ["--quantization", quantization]
    return Server(args.beamline, model, args.device, extra, max_model_len=args.max_model_len,
                  kv_cache_memory=args.kv_cache_memory, env=args.server_env)


def completions(server, body):
    status, reply = post(server.base, "/v1/completions", {"model": "policy", **body})
    if status != 200:
        raise RuntimeError(f"/v1/completions answered {status}: {reply}")
    return reply


def tokenize(server, text):
    status, reply = post(server.base, "/tokenize", {"prompt": text})
    if status != 200:
        raise RuntimeError(f"/tokenize answered {status}: {reply}")
    return reply["tokens"]


def draw_prompts(server, rng, count, max_tokens):
    """`count` Harmony prompts (token ids) of generate.py's held-out split, none longer than max_tokens."""
    prompts = []
    while len(prompts) < count:
        ids = tokenize(server, generate.make_example(rng, "heldout")["turns"][0]["prompt"])
        if len(ids) <= max_tokens:
            prompts.append(ids)
    return prompts


def sample(server, prompts, args, seed, version, moe_layers, top_k):
    """Rollouts at temperature 1: (token ids, output start, output logprobs, routing [len - 1, layers, top_k])."""
    reply = completions(server, {"prompt": prompts, "max_tokens": args.max_tokens, "temperature": 1.0, "seed": seed,
                                 "logprobs": 0, "return_token_ids": True, "return_routed_experts": True})
    if reply["weight_version"] != version:
        raise RuntimeError(f"rollouts report weight_version {reply['weight_version']!r}, expected {version!r}")
    rollouts = []
    for choice in sorted(reply["choices"], key=lambda c: c["index"]):
        tokens = choice["prompt_token_ids"] + choice["token_ids"]
        logprobs = choice["logprobs"]["token_logprobs"]
        if len(logprobs) != len(choice["token_ids"]):
            raise RuntimeError(f"choice {choice['index']}: {len(logprobs)} logprobs for {len(choice['token_ids'])} "
                               f"tokens")
        routing = np.frombuffer(base64.b64decode(choice["routed_experts"]), "<i2").astype(np.int64)
        routing = routing.reshape(-1, moe_layers, top_k)
        if routing.shape[0] != len(tokens) - 1:
            raise RuntimeError(f"choice {choice['index']}: {routing.shape[0]} routing rows for {len(tokens)} tokens")
        rollouts.append({"tokens": tokens, "start": len(choice["prompt_token_ids"]),
                         "logprobs": np.array(logprobs, dtype=np.float64), "routing": routing})
    return rollouts


def score(server, tokens, moe_layers=None, top_k=None):
    """prompt_logprobs of a whole token sequence, teacher-forced: [None, {id: {logprob, rank, ...}}, ...]; with
    moe_layers and top_k also the experts the server routed tokens[:-1] to, [len - 1, layers, top_k]."""
    routed = moe_layers is not None
    reply = completions(server, {"prompt": tokens, "max_tokens": 1, "temperature": 0,
                                 "prompt_logprobs": PROMPT_LOGPROBS, "return_routed_experts": routed})
    entries = reply["choices"][0]["prompt_logprobs"]
    if not routed:
        return entries
    routing = np.frombuffer(base64.b64decode(reply["choices"][0]["routed_experts"]), "<i2").astype(np.int64)
    routing = routing.reshape(-1, moe_layers, top_k)
    if routing.shape[0] < len(tokens) - 1:
        raise RuntimeError(f"scoring {len(tokens)} tokens returned {routing.shape[0]} routing rows")
    return entries, routing[:len(tokens) - 1]


# ---------------------------------------------------------------- trainer

def is_router(name):
    return name.endswith(beam_torch.ROUTER_SUFFIXES)


def perturb(master, noise, generator):
    """Adds noise * RMS(tensor) Gaussian noise to every trained tensor (the parameters) of the FP32 master."""
    with torch.no_grad():
        for _, parameter in master.named_parameters():
            rms = parameter.pow(2).mean().sqrt()
            parameter.add_(torch.randn(parameter.shape, generator=generator) * (noise * rms))


def policy_of(master, device):
    """The weights the rollout engines get: the master rounded to BF16, the router kept FP32; an FP32 module."""
    state = {name: tensor if is_router(name) else tensor.to(torch.bfloat16).float()
             for name, tensor in master.state_dict().items()}
    policy = beam_torch.BeamForCausalLM(master.config)
    policy.load_state_dict(state)
    return policy.to(device).eval()


def weight_frames(policy):
    """(name, torch dtype, shape, tensor) per tensor, in the order save_checkpoint writes them, on the policy's device
    and in the dtype it saves (beam_torch.to_numpy_tensor: the router FP32, the rest BF16): exactly its bytes."""
    state = policy.state_dict()
    frames = []
    for name in sorted(state, key=lambda n: (not is_router(n), n)):
        dtype = torch.float32 if is_router(name) else torch.bfloat16
        tensor = state[name].detach().to(dtype).contiguous()
        frames.append((name, str(dtype).removeprefix("torch."), list(tensor.shape), tensor))
    return frames


def save_policy(policy, source, directory):
    """The trainer's checkpoint: beam_torch.save_checkpoint plus the source model's tokenizer and Harmony files."""
    beam_torch.save_checkpoint(policy, directory)
    for name in os.listdir(source):
        if name.endswith(".json") and name != "config.json":
            shutil.copy(os.path.join(source, name), directory)


def prepare_nccl(args):
    """With --weight-sync nccl: exits, saying why, without two GPUs or with the trainer on the servers' GPU; the
    servers get the first visible GPU (CUDA_VISIBLE_DEVICES), the reference the trainer's by default."""
    if args.device != "cuda":
        sys.exit("--weight-sync nccl: the servers are NCCL ranks on a GPU, so --device must be cuda")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < 2:
        sys.exit(f"--weight-sync nccl needs two GPUs (nvidia-h200-x2): NCCL refuses two ranks on one GPU, so the "
                 f"trainer (rank 0) cannot share the servers' GPU; PyTorch sees {count}")
    trainer = torch.device(args.trainer_device)
    if trainer.type != "cuda" or trainer.index in (None, 0) or trainer.index >= count:
        sys.exit(f"--trainer-device {args.trainer_device}: expected one of cuda:1 .. cuda:{count - 1} (cuda:0 is the "
                 f"servers' GPU)")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    args.server_env = {"CUDA_VISIBLE_DEVICES": visible.split(",")[0] if visible else "0"}
    if args.reference_device is None:
        args.reference_device = args.trainer_device


def make_trainers(args):
    """Rank 0 of each weight update group: tcp, one trainer for both servers; nccl, one per server (both servers are
    on one GPU, and NCCL refuses two ranks of one communicator on one GPU). With nccl the servers are given the
    libnccl the trainer loaded (NCCL ranks of different versions may not talk), and args.weight_sync_detail says
    what was used."""
    if args.weight_sync == "tcp":
        args.weight_sync_detail = "tcp: one group, the trainer writes every frame to both servers"
        return [Trainer()]
    trainers = [Trainer(backend="nccl", device=args.trainer_device, timeout=TIMEOUT_SECONDS) for _ in range(2)]
    library = trainers[0].nccl.library.path
    if os.path.isabs(library):
        paths = [os.path.dirname(library)] + [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
        args.server_env["LD_LIBRARY_PATH"] = ":".join(paths)
    args.weight_sync_detail = (f"nccl: {trainers[0].nccl.describe()}; servers on GPU "
                               f"{args.server_env['CUDA_VISIBLE_DEVICES']}, a group of two ranks each")
    return trainers


def groups_of(trainers, servers):
    """[(trainer, the servers of its group)]: one trainer takes every server, else each server its own."""
    if len(trainers) == 1:
        return [(trainers[0], servers)]
    return [(trainer, [server]) for trainer, server in zip(trainers, servers)]


def join_group(trainer, servers):
    """One weight update group: the trainer rank 0, server i rank i + 1 (nccl: the trainer joins the NCCL group once
    the last server has its id, while the servers' calls wait)."""
    world = len(servers) + 1
    answers = [in_thread(lambda s=server, rank=rank: post(s.base, "/init_weights_update_group", {
        "master_address": trainer.host, "master_port": trainer.port, "rank_offset": rank, "world_size": world,
        "group_name": GROUP, "backend": trainer.backend})) for rank, server in enumerate(servers, 1)]
    ranks = sorted(trainer.accept()["rank"] for _ in servers)
    assert ranks == list(range(1, world)), ranks
    for answer in answers:
        status, reply = answer()
        if status != 200:
            raise RuntimeError(f"/init_weights_update_group answered {status}: {reply}")


def destroy_groups(groups):
    """/destroy_weights_update_group on every server while each trainer closes its end (with nccl, destroying a
    communicator is a collective within a node: the trainer's and the servers' must overlap)."""
    answers = [in_thread(lambda s=server: post(s.base, "/destroy_weights_update_group", {"group_name": GROUP}))
               for _, servers in groups for server in servers]
    for trainer, _ in groups:
        trainer.close_servers()
    for answer in answers:
        status, reply = answer()
        if status != 200:
            raise RuntimeError(f"/destroy_weights_update_group answered {status}: {reply}")


def control(server, path, body):
    status, reply = post(server.base, path, body)
    if status != 200:
        raise RuntimeError(f"{path} answered {status}: {reply}")


def broadcast(groups, frames, version):
    """As SkyRL syncs: /pause (mode wait) every server, /update_weights_from_distributed on each while each group's
    trainer sends every frame (tcp: to each of its servers; nccl: one broadcast), /resume; the seconds taken."""
    check_frames(frames)
    body = {"group_name": GROUP, "weight_version": version, "names": [f[0] for f in frames],
            "dtypes": [f[1] for f in frames], "shapes": [f[2] for f in frames], "flush_cache": True}
    servers = [server for _, members in groups for server in members]
    started = time.time()
    for server in servers:
        control(server, "/pause", {"mode": "wait"})
    answers = [in_thread(lambda s=server: post(s.base, "/update_weights_from_distributed", body)) for server in servers]
    for trainer, _ in groups:
        for name, _, _, data in frames:
            trainer.send_tensor(name, data)
    for answer in answers:
        status, reply = answer()
        if status != 200 or reply.get("weight_version") != version:
            raise RuntimeError(f"/update_weights_from_distributed answered {status}: {reply}")
    for server in servers:
        control(server, "/resume", {})
    return time.time() - started


# ---------------------------------------------------------------- reference

@torch.no_grad()
def reference(model, rollouts, batch, replay=False):
    """The reference's log-probabilities of tokens[1:] (float64 log-softmax of its float32 logits) and its routing
    [len - 1, layers, top_k] for each rollout, with the scores its router chose by (sigmoid + bias, [len - 1, layers,
    experts]); with `replay`, each rollout's returned routing is used instead of its own (pad rows route to experts
    0..top_k-1)."""
    device = next(model.parameters()).device
    gates = [moe.gate for moe in model.moe_layers()]
    top_k = model.config.num_experts_per_tok
    choices = []

    def keep_choice(gate, inputs):
        choices.append(torch.sigmoid(inputs[0].float() @ gate.weight.float().t()) + gate.e_score_correction_bias)
    hooks = [gate.register_forward_pre_hook(keep_choice) for gate in gates]
    results = []
    for first in range(0, len(rollouts), batch):
        chunk = rollouts[first:first + batch]
        width = max(len(r["tokens"]) - 1 for r in chunk)
        tokens = torch.zeros(len(chunk), width, dtype=torch.long)
        positions = torch.full((len(chunk), width), -1, dtype=torch.long)
        forced = torch.arange(top_k).repeat(len(gates), len(chunk), width, 1)      # [layers, B, T, top_k]
        for row, rollout in enumerate(chunk):
            n = len(rollout["tokens"]) - 1
            tokens[row, :n] = torch.tensor(rollout["tokens"][:-1])
            positions[row, :n] = torch.arange(n)
            forced[:, row, :n] = torch.from_numpy(rollout["routing"]).transpose(0, 1)
        for layer, gate in enumerate(gates):
            gate.replay = forced[layer].reshape(-1, top_k) if replay else None
        choices.clear()
        try:
            logits = model(tokens.to(device), positions.to(device))
        finally:
            for gate in gates:
                gate.replay = None
        logprobs = torch.log_softmax(logits.double(), dim=-1)
        routing = torch.stack([g.last_selected.view(len(chunk), width, top_k) for g in gates], dim=2).cpu().numpy()
        scores = torch.stack([c.view(len(chunk), width, -1) for c in choices], dim=2).cpu().numpy()
        for row, rollout in enumerate(chunk):
            n = len(rollout["tokens"]) - 1
            targets = torch.tensor(rollout["tokens"][1:], device=device)
            chosen = logprobs[row, :n].gather(1, targets[:, None])[:, 0].cpu().numpy()
            results.append({"logprobs": chosen, "routing": routing[row, :n], "choice": scores[row, :n]})
    for hook in hooks:
        hook.remove()
    return results


# ---------------------------------------------------------------- one round

def output_gap(rollouts, refs):
    """Absolute differences between the server's and the reference's logprobs of every sampled token."""
    return np.concatenate([np.abs(r["logprobs"] - ref["logprobs"][r["start"] - 1:])
                           for r, ref in zip(rollouts, refs)])


def first_difference(scored, fresh_scored):
    """Where the first sequence whose prompt_logprobs differ between two servers does, and by how much; None if none."""
    for index, (ours, theirs) in enumerate(zip(scored, fresh_scored)):
        if ours == theirs:
            continue
        position = next(i for i, (x, y) in enumerate(zip(ours, theirs)) if x != y)
        gap = max(abs(ours[position][k]["logprob"] - theirs[position][k]["logprob"])
                  for k in set(ours[position]) & set(theirs[position]))
        return f"sequence {index}, position {position} of {len(ours)}: logprobs differ by up to {gap:.2e}"
    return None


def prompt_logprob_gap(scored, rollouts, refs):
    """Absolute differences between prompt_logprobs' token entries and the reference, at every position but the
    first."""
    gaps = []
    for entries, rollout, ref in zip(scored, rollouts, refs):
        served = [entries[i][str(token)]["logprob"] for i, token in enumerate(rollout["tokens"]) if i > 0]
        gaps.append(np.abs(np.array(served) - ref["logprobs"]))
    return np.concatenate(gaps)


def routing_mismatch(rollouts, refs):
    """(rows [token, layer] whose ids differ in order, of those whose sets differ, total rows, a description of the
    first row that differs or None, of the differing rows those that are float32 ties). A row is a tie when the
    reference's scores of the served experts and of its own experts in their places differ by at most TIE_GAP; the
    description gives the largest such gap over all differing rows."""
    ordered = unordered = total = ties = 0
    first, tie_gap = None, 0.0
    for index, (rollout, ref) in enumerate(zip(rollouts, refs)):
        served, own = rollout["routing"], ref["routing"]
        differs = (served != own).any(-1)
        ordered += int(differs.sum())
        unordered += int((np.sort(served, -1) != np.sort(own, -1)).any(-1).sum())
        total += served.shape[0] * served.shape[1]
        for token, layer in np.argwhere(differs):
            choice = ref["choice"][token, layer]
            gap = float(np.abs(choice[served[token, layer]] - choice[own[token, layer]]).max())
            ties += gap <= TIE_GAP
            tie_gap = max(tie_gap, gap)
            if first is None:
                first = (f"rollout {index}, token {token}, MoE layer {layer}: served {served[token, layer].tolist()}, "
                         f"reference {own[token, layer].tolist()}")
    if first is not None:
        first += f"; largest score gap of a differing row {tie_gap:.2e}"
    return ordered, unordered, total, first, ties


def run_round(args, index, master, previous, servers, groups, rng, generator, config):
    version = f"step-{index}"
    moe_layers = config.num_hidden_layers - config.first_k_dense_replace
    top_k = config.num_experts_per_tok
    perturb(master, args.noise, generator)
    policy = policy_of(master, args.reference_device)
    frames = weight_frames(policy)
    checkpoint = os.path.join(args.checkpoints, version)
    save_policy(policy, args.model, checkpoint)
    seconds = broadcast(groups, frames, version)
    row = {"round": index, "weight_version": version, "broadcast_s": seconds,
           "broadcast_bytes": sum(byte_count(f[3]) for f in frames), "tensors": len(frames)}

    prompt_limit = min(args.max_prompt_tokens, args.max_model_len - args.max_tokens - 1)
    a = servers["float32"]
    rollouts = sample(a, draw_prompts(a, rng, args.rollouts, prompt_limit), args, args.seed + index, version,
                      moe_layers, top_k)
    scored, scored_routing = zip(*(score(a, r["tokens"], moe_layers, top_k) for r in rollouts))
    fresh = start_server(args, checkpoint, "float32")
    try:
        fresh_scored = [score(fresh, r["tokens"]) for r in rollouts]
    finally:
        fresh.stop()
    row["a_sequences_equal"] = sum(x == y for x, y in zip(scored, fresh_scored))
    row["a_sequences"] = len(rollouts)
    row["a_values"] = sum(len(e) for entries in scored for e in entries if e)
    row["a_first_difference"] = first_difference(scored, fresh_scored)

    refs = reference(policy, rollouts, args.reference_batch)
    as_sampled = reference(policy, rollouts, args.reference_batch, replay=True)
    as_scored_rollouts = [dict(r, routing=routing) for r, routing in zip(rollouts, scored_routing)]
    as_scored = reference(policy, as_scored_rollouts, args.reference_batch, replay=True)
    row["b_decode_max"] = float(output_gap(rollouts, as_sampled).max())
    row["b_prefill_max"] = float(prompt_logprob_gap(scored, rollouts, as_scored).max())
    row["b_decode_max_own_routing"] = float(output_gap(rollouts, refs).max())
    row["b_prefill_max_own_routing"] = float(prompt_logprob_gap(scored, rollouts, refs).max())
    row["tokens_sampled"] = int(sum(len(r["tokens"]) - r["start"] for r in rollouts))
    row["tokens_scored"] = int(sum(len(r["tokens"]) - 1 for r in rollouts))
    ordered, unordered, total, first, ties = routing_mismatch(rollouts, refs)
    scored_ordered, _, scored_total, scored_first, scored_ties = routing_mismatch(as_scored_rollouts, refs)
    row["c_rows_differ"], row["c_sets_differ"], row["c_rows"], row["c_first_difference"] = \
        ordered + scored_ordered, unordered, total + scored_total, first or scored_first
    row["c_ties"] = ties + scored_ties
    before = reference(previous, rollouts, args.reference_batch)
    row["moved_mean"] = float(np.mean(np.concatenate([np.abs(x["logprobs"] - y["logprobs"])
                                                      for x, y in zip(refs, before)])))

    b = servers["bfloat16"]
    replay_rollouts = sample(b, draw_prompts(b, rng, args.replay_rollouts, prompt_limit), args,
                             args.seed + 1000 + index, version, moe_layers, top_k)
    own = reference(policy, replay_rollouts, args.reference_batch)
    replayed = reference(policy, replay_rollouts, args.reference_batch, replay=True)
    row["d_gap_replay"] = float(output_gap(replay_rollouts, replayed).mean())
    row["d_gap_no_replay"] = float(output_gap(replay_rollouts, own).mean())
    row["d_tokens"] = int(sum(len(r["tokens"]) - r["start"] for r in replay_rollouts))
    ordered, _, total, _, _ = routing_mismatch(replay_rollouts, own)
    row["d_routing_differs"] = ordered / total
    return row, policy


# ---------------------------------------------------------------- report

def verdicts(rows, args, cpu, error):
    """(check, result, goal, passed) over all rounds; a loop that stopped early fails."""
    ran = ("every round ran", f"{len(rows)} of {args.rounds}" + (f": {error}" if error else ""), str(args.rounds),
           error is None and len(rows) == args.rounds)
    transport = ("weight sync", getattr(args, "weight_sync_detail", args.weight_sync), "reported", True)
    if not rows:
        return [ran, transport]
    passed = sum(round_passes(r, args) for r in rows)
    every = ("every round passed (a)-(d) with new weights (each round's noise moved them)",
             f"{passed} of {len(rows)}", str(len(rows)), passed == len(rows))
    equal = sum(r["a_sequences_equal"] for r in rows)
    sequences = sum(r["a_sequences"] for r in rows)
    decode = max(r["b_decode_max"] for r in rows)
    prefill = max(r["b_prefill_max"] for r in rows)
    differ = sum(r["c_rows_differ"] for r in rows)
    ties = sum(r["c_ties"] for r in rows)
    decode_own = max(r["b_decode_max_own_routing"] for r in rows)
    prefill_own = max(r["b_prefill_max_own_routing"] for r in rows)
    sets_differ = sum(r["c_sets_differ"] for r in rows)
    routing_rows = sum(r["c_rows"] for r in rows)
    replay = max(r["d_gap_replay"] for r in rows)
    no_replay = max(r["d_gap_no_replay"] for r in rows)
    moved = min(r["moved_mean"] for r in rows)
    bf16 = " (cpu: computed in FP32)" if cpu else ""
    if args.replay_quantization:
        bf16 = f", {args.replay_quantization.upper()} weights quantized on arrival" + bf16
    goal = QUANTIZED_REPLAY_GOAL if args.replay_quantization else REPLAY_GOAL
    first_a = next((r["a_first_difference"] for r in rows if r["a_first_difference"]), None)
    first_c = next((r["c_first_difference"] for r in rows if r["c_first_difference"]), None)
    values = sum(r["a_values"] for r in rows)
    return [
        ran,
        transport,
        every,
        ("(a) float32 server after sync vs a fresh server on the saved checkpoint, prompt_logprobs (token + top 5)",
         f"{equal}/{sequences} sequences bit-identical ({values} values)" + (f"; first: {first_a}" if first_a else ""),
         "all", equal == sequences),
        ("(b) server logprobs vs PyTorch reference, float32, routed as the server did: sampled tokens (decode)",
         f"max {decode:.2e}", f"<= {args.tolerance:g}", decode <= args.tolerance),
        ("(b) the same, teacher-forced prompt_logprobs (prefill)", f"max {prefill:.2e}", f"<= {args.tolerance:g}",
         prefill <= args.tolerance),
        ("(b) both, the reference routing by itself (float32 ties may route differently)",
         f"max {decode_own:.2e} / {prefill_own:.2e}", "reported", True),
        ("(c) routed experts vs the reference's routing, every token x MoE layer (sampling and scoring requests)",
         f"{differ} of {routing_rows} rows differ ({sets_differ} as sets while sampling), {ties} of them float32 "
         f"ties (score gap <= {TIE_GAP:g})" + (f"; first: {first_c}" if first_c else ""),
         "0 beyond ties", differ == ties),
        (f"(d) bfloat16 serving{bf16}: mean abs logprob gap, routing replayed in the reference",
         f"max over rounds {replay:.2e}", f"<= {goal}", replay <= goal),
        ("(d) the same without replay", f"max over rounds {no_replay:.2e}", "reported", True),
        ("the round's noise moved the reference's logprobs (mean abs)", f"min over rounds {moved:.2e}",
         f"> {args.tolerance:g}", moved > args.tolerance),
    ]


def round_passes(r, args):
    """Whether round `r` passed (a) to (d) and its noise moved the weights: each round is held to every goal."""
    goal = QUANTIZED_REPLAY_GOAL if args.replay_quantization else REPLAY_GOAL
    return (r["a_sequences_equal"] == r["a_sequences"] and r["b_decode_max"] <= args.tolerance
            and r["b_prefill_max"] <= args.tolerance and r["c_rows_differ"] == r["c_ties"] and r["d_gap_replay"] <= goal
            and r["moved_mean"] > args.tolerance)


def markdown(rows, checks, args):
    lines = []
    if rows:
        lines += ["| round | sync (2 servers) | (a) bit-identical | (b) decode / prefill max | (c) rows differ | "
                  "(d) gap replay / none | B routing != ref | moved | round passes |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
                  *(round_row(r, args) for r in rows), ""]
    lines += ["| check | result | goal | pass |", "| --- | --- | --- | --- |"]
    lines += [f"| {c} | {result} | {goal} | {'yes' if ok else '**NO**'} |" for c, result, goal, ok in checks]
    return "\n".join(lines)


def round_row(r, args):
    return (f"| {r['weight_version']} | {r['broadcast_s']:.2f} s, {r['broadcast_bytes'] / 2**20:.1f} MiB, "
            f"{r['tensors']} tensors | {r['a_sequences_equal']}/{r['a_sequences']} | "
            f"{r['b_decode_max']:.2e} / {r['b_prefill_max']:.2e} ({r['tokens_sampled']} / "
            f"{r['tokens_scored']} tokens) | {r['c_rows_differ']}/{r['c_rows']} ({r['c_ties']} ties) | "
            f"{r['d_gap_replay']:.2e} / {r['d_gap_no_replay']:.2e} ({r['d_tokens']} tokens) | "
            f"{100 * r['d_routing_differs']:.2f}% | {r['moved_mean']:.2e} | "
            f"{'yes' if round_passes(r, args) else '**NO**'} |")


def describe_failure(failure):
    return f"{type(failure).__name__}: {failure}".replace("|", "/").replace("\n", " ")[:300]


def main():
    args = parse_args()
    # A time limit's SIGTERM unwinds like a failure: the servers are stopped and the rounds done so far reported.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated (SIGTERM)"))
    args.server_env = None
    if args.weight_sync == "nccl":
        prepare_nccl(args)
    if args.reference_device is None:
        args.reference_device = "cuda" if args.device == "cuda" and torch.cuda.is_available() else "cpu"
    torch.set_float32_matmul_precision("highest")   # no TF32 in the float32 reference
    if args.rounds < 1:
        sys.exit("--rounds must be at least 1")
    os.makedirs(args.out, exist_ok=True)
    scratch = None
    if args.checkpoints is None:
        scratch = args.checkpoints = tempfile.mkdtemp(prefix="rollout-checkpoints-")
    rng = random.Random(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    master = beam_torch.load_checkpoint(args.model)
    previous = policy_of(master, args.reference_device)
    servers, trainers, rows, error = {}, [], [], None
    try:
        trainers = make_trainers(args)
        servers["float32"] = start_server(args, args.model, "float32")
        servers["bfloat16"] = start_server(args, args.model, "bfloat16", args.replay_quantization)
        groups = groups_of(trainers, [servers["float32"], servers["bfloat16"]])
        for trainer, members in groups:
            join_group(trainer, members)
        for index in range(1, args.rounds + 1):
            row, previous = run_round(args, index, master, previous, servers, groups, rng, generator, master.config)
            rows.append(row)
            print(json.dumps(row), flush=True)
        destroy_groups(groups)
    except (Exception, SystemExit) as failure:  # reported as a failed check, with the rounds done so far
        traceback.print_exc()
        error = describe_failure(failure)
    finally:
        for server in servers.values():
            server.stop()
        for trainer in trainers:  # after a failure the servers are gone: abort rather than destroy with them
            try:
                trainer.close(abort=error is not None)
            except Exception as failure:  # noqa: BLE001 (the report is still written)
                traceback.print_exc()
                error = error or describe_failure(failure)
        if scratch is not None:
            shutil.rmtree(scratch)
    checks = verdicts(rows, args, args.device == "cpu", error)
    table = markdown(rows, checks, args)
    print(table)
    with open(os.path.join(args.out, "rollout.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(args.out, "rollout.json"), "w") as f:
        json.dump({"args": vars(args), "rounds": rows,
                   "checks": [{"check": c, "result": r, "goal": g, "pass": ok} for c, r, g, ok in checks]}, f, indent=1)
    if not all(ok for *_, ok in checks):
        sys.exit(1)


if __name__ == "__main__":
    main()
