#!/usr/bin/env python3
"""Trains a DFlash-style block drafter (DRAFTER_SEMANTICS.md, docs/model-format.md §6) for a Beam target.

  python3 tools/train/train_drafter.py --target models/beam-nano --out OUT_DIR [--conversations 32000]
      [--gen-seconds 45] [--seconds 130] [--layers 3] [--block-size 8] [--target-layer-ids 1,3,5,7]
      [--sliding-window 128] [--anchors 32] [--batch 128] [--gamma 4] [--eval-conversations 300] [--json R]

The recipe (DFlash):
- Data: the target's own greedy completions (bf16 autocast, batched, KV cache) of every model turn of
  generate.py's synthetic conversations (train split, --seed; the prompts' earlier turns are the data's own
  renderings). Generation stops at --gen-seconds or when the prompts run out. The drafter learns to predict what
  the target will say, which is what greedy verification accepts.
- Target frozen: per batch it runs (bf16 autocast, no grad) over the whole sequences and hands out its residual
  stream after each of target_layer_ids.
- Random anchors: per sequence up to --anchors distinct anchor positions P among the generated tokens (P from the
  prompt length to the second-to-last token), each a block [x_P, MASK x (B-1)] at positions P..P+B-1; all blocks
  of a sequence go through the drafter in one pass with a block-sparse mask (a block sees the context features
  before its anchor within the drafter's window, and itself bidirectionally; blocks never see each other).
- Block-parallel prediction: block row i predicts x_{P+i} (i = 1..B-1; rows past the end of the sequence are
  not scored), cross-entropy weighted by exp(-(i-1)/gamma), which favours the early positions every accepted run
  must pass through.
- The mask token is the target's pad token (<|endoftext|> for beam-nano): a rendered Harmony conversation never
  holds it; the script checks that no prompt or completion does.
Writes OUT_DIR/config.json and model.safetensors (BF16), then measures acceptance on held-out turns at K =
block_size - 1 (drafter_acceptance.py; --eval-conversations 0 skips it) and writes the report to --json.
"""
import argparse
import json
import math
import multiprocessing
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "data"))
sys.path.insert(0, os.path.join(ROOT, "tools", "tokenizer"))
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import beam_numpy  # noqa: E402
import drafter_acceptance  # noqa: E402
import generate  # noqa: E402
from beam_torch import load_checkpoint  # noqa: E402
from bpe import Tokenizer  # noqa: E402
from drafter_numpy import drafter_config  # noqa: E402
from drafter_torch import (BeamDrafter, DrafterConfig, draft, init_drafter_weights, load_drafter,  # noqa: E402
                           save_drafter, target_features)

_tokenizer = None


def _worker_init(tokenizer_path):
    global _tokenizer
    _tokenizer = Tokenizer.load(tokenizer_path)


def _prompts_of_chunk(job):
    split, seed, count = job
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        example = generate.make_example(rng, split)
        out.extend(_tokenizer.encode(turn["prompt"]) for turn in example["turns"])
    return out


def training_prompts(tokenizer_path, conversations, seed, workers):
    """Token ids of the prompt of every model turn of `conversations` train-split conversations."""
    jobs = generate.split_jobs("train", conversations, seed, chunk=500)
    with multiprocessing.Pool(workers, initializer=_worker_init, initargs=(tokenizer_path,)) as pool:
        return [prompt for part in pool.imap(_prompts_of_chunk, jobs) for prompt in part]


def generate_sequences(target, prompts, stops, max_new_tokens, batch, seconds, device, rng, log):
    """(prompt + greedy completion ids, prompt length) for as many prompts as `seconds` allow, in random order;
    each batch is sorted by length so that little of it is padding."""
    order = list(range(len(prompts)))
    rng.shuffle(order)
    started = time.time()
    sequences = []
    for begin in range(0, len(order), batch):
        if time.time() - started >= seconds:
            break
        chunk = [prompts[i] for i in order[begin:begin + batch]]
        completions = drafter_acceptance.complete(target, chunk, stops, max_new_tokens, device, batch, autocast=True)
        sequences.extend((np.array(p + c, dtype=np.int64), len(p)) for p, c in zip(chunk, completions))
        log(f"generated {len(sequences)} completions ({sum(len(s) - n for s, n in sequences)} tokens) in "
            f"{time.time() - started:.0f} s")
    return [(ids, start) for ids, start in sequences if len(ids) - 1 > start]


def length_batches(sequences, batch, rng):
    order = sorted(range(len(sequences)), key=lambda i: (len(sequences[i][0]), rng.random()))
    groups = [order[i:i + batch] for i in range(0, len(order), batch)]
    rng.shuffle(groups)
    return groups


def collate(sequences, indices, anchors_per, block_size, rng, device):
    """tokens [N, T], anchors [N, A], labels [N, A, B-1] and their validity (padding anchors and positions past a
    sequence's end are not scored)."""
    longest = max(len(sequences[i][0]) for i in indices)
    n = len(indices)
    tokens = torch.zeros(n, longest, dtype=torch.long)
    anchors = torch.zeros(n, anchors_per, dtype=torch.long)
    anchor_valid = torch.zeros(n, anchors_per, dtype=torch.bool)
    lengths = torch.zeros(n, dtype=torch.long)
    for row, i in enumerate(indices):
        ids, start = sequences[i]
        tokens[row, :len(ids)] = torch.from_numpy(ids)
        lengths[row] = len(ids)
        chosen = rng.sample(range(start, len(ids) - 1), min(anchors_per, len(ids) - 1 - start))
        anchors[row, :len(chosen)] = torch.tensor(chosen)
        anchors[row, len(chosen):] = chosen[0]
        anchor_valid[row, :len(chosen)] = True
    tokens, anchors = tokens.to(device, non_blocking=True), anchors.to(device, non_blocking=True)
    lengths, anchor_valid = lengths.to(device), anchor_valid.to(device)
    positions = anchors[:, :, None] + torch.arange(1, block_size, device=device)            # [N, A, B-1]
    valid = (positions < lengths[:, None, None]) & anchor_valid[:, :, None]
    labels = tokens.gather(1, positions.clamp(max=longest - 1).reshape(n, -1)).view_as(positions)
    return tokens, anchors, labels, valid


def block_loss(target, drafter, tokens, anchors, labels, valid, weights):
    """Position-weighted cross-entropy of the block predictions, and per-position argmax accuracy."""
    device = tokens.device.type
    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
        with torch.no_grad():
            features = target_features(target, tokens, drafter.config.target_layer_ids)
        logits = draft(target, drafter, tokens, anchors, features)                          # [N, A, B-1, V]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
    ce = ce.view_as(labels)
    w = weights * valid
    loss = (ce * w).sum() / w.sum()
    with torch.no_grad():
        hits = (logits.argmax(-1) == labels) & valid
        accuracy = hits.sum((0, 1)).float() / valid.sum((0, 1)).clamp(min=1).float()
    return loss, accuracy


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, help="target checkpoint directory (with tokenizer.json)")
    parser.add_argument("--out", required=True, help="drafter directory to write")
    parser.add_argument("--conversations", type=int, default=32000, help="train-split conversations to prompt with")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--gen-seconds", type=float, default=45.0, help="time budget for generating the data")
    parser.add_argument("--gen-batch", type=int, default=2048)
    parser.add_argument("--max-new-tokens", type=int, default=384)
    parser.add_argument("--seconds", type=float, default=130.0, help="training time budget (schedule follows it)")
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--intermediate-size", type=int, default=1024)
    parser.add_argument("--block-size", type=int, default=8)
    parser.add_argument("--target-layer-ids", default="1,3,5,7")
    parser.add_argument("--sliding-window", type=int, default=128)
    parser.add_argument("--mask-token-id", type=int, help="default: the target's pad_token_id")
    parser.add_argument("--anchors", type=int, default=32, help="anchors per sequence per step")
    parser.add_argument("--batch", type=int, default=128, help="sequences per step")
    parser.add_argument("--gamma", type=float, default=4.0, help="loss weight exp(-(i-1)/gamma) at block row i")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--eval-conversations", type=int, default=300)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", help="write the training and acceptance report here")
    args = parser.parse_args()

    started = time.time()

    def log(message):
        print(f"[{time.time() - started:6.1f} s] {message}", flush=True)

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    device = args.device
    torch.backends.cuda.matmul.allow_tf32 = True
    tokenizer_path = os.path.join(args.target, "tokenizer.json")
    tokenizer = Tokenizer.load(tokenizer_path)
    # tokenized in worker processes before CUDA is initialised in this one
    prompts = training_prompts(tokenizer_path, args.conversations, args.seed, args.workers)
    log(f"{len(prompts)} training prompts from {args.conversations} conversations")
    target = load_checkpoint(args.target, device)
    for p in target.parameters():
        p.requires_grad_(False)
    config_dict = drafter_config(beam_numpy.read_config(args.target), layers=args.layers,
                                 target_layer_ids=[int(v) for v in args.target_layer_ids.split(",")],
                                 block_size=args.block_size, mask_token_id=args.mask_token_id,
                                 sliding_window=args.sliding_window, intermediate_size=args.intermediate_size)
    config = DrafterConfig(config_dict, target.config)
    mask = config.mask_token_id

    stops = drafter_acceptance.stop_ids(tokenizer)
    sequences = generate_sequences(target, prompts, stops, args.max_new_tokens, args.gen_batch, args.gen_seconds,
                                   device, rng, log)
    holding_mask = sum(int((ids == mask).any()) for ids, _ in sequences)
    if holding_mask:
        sys.exit(f"mask_token_id {mask} ({tokenizer.decode([mask])!r}) occurs in {holding_mask} training sequences: "
                 f"choose a token the data never holds (--mask-token-id)")
    anchors_total = sum(len(ids) - 1 - start for ids, start in sequences)
    log(f"data: {len(sequences)} sequences, {anchors_total} anchor positions (generated tokens); mask token "
        f"{mask} {tokenizer.decode([mask])!r} occurs in none")

    drafter = BeamDrafter(config)
    init_drafter_weights(drafter, args.seed)
    drafter.to(device)
    params = sum(p.numel() for p in drafter.parameters())
    log(f"drafter: {args.layers} layers, {params / 1e6:.2f} M parameters, block {args.block_size}, "
        f"target layers {config.target_layer_ids}, window {args.sliding_window}")
    decay = [p for p in drafter.parameters() if p.ndim == 2]
    no_decay = [p for p in drafter.parameters() if p.ndim != 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                                  **({"fused": True} if device == "cuda" else {}))
    weights = torch.exp(-torch.arange(args.block_size - 1, dtype=torch.float32, device=device) / args.gamma)

    plan, epoch, step = length_batches(sequences, args.batch, rng), 0, 0
    train_started = time.time()
    running_loss, running_acc = None, None
    while time.time() - train_started < args.seconds:
        if not plan:
            epoch += 1
            plan = length_batches(sequences, args.batch, rng)
        progress = (time.time() - train_started) / args.seconds
        lr = args.lr * min(1.0, (step + 1) / args.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = collate(sequences, plan.pop(), args.anchors, args.block_size, rng, device)
        loss, accuracy = block_loss(target, drafter, *batch, weights)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        optimizer.step()
        step += 1
        if step % 20 == 0:
            value, acc = float(loss.detach()), accuracy.cpu().numpy()
            running_loss = value if running_loss is None else 0.9 * running_loss + 0.1 * value
            running_acc = acc if running_acc is None else 0.9 * running_acc + 0.1 * acc
        if step % 200 == 0:
            log(f"step {step} epoch {epoch} lr {lr:.2e} loss {running_loss:.4f} accuracy per position "
                + " ".join(f"{a:.3f}" for a in running_acc))
    train_seconds = time.time() - train_started
    log(f"trained {step} steps in {train_seconds:.0f} s ({epoch} full epochs)")

    drafter.cpu()
    save_drafter(drafter, args.out)
    log(f"wrote {args.out}")
    report = {"target": args.target, "config": config_dict, "parameters": params, "steps": step, "epochs": epoch,
              "train_seconds": round(train_seconds, 1), "sequences": len(sequences), "anchor_positions": anchors_total,
              "final_train_loss": running_loss,
              "final_train_accuracy_per_position": None if running_acc is None else [float(a) for a in running_acc],
              "args": vars(args)}
    if args.eval_conversations > 0:
        torch.backends.cuda.matmul.allow_tf32 = False
        stored = load_drafter(args.out, target.config, device)
        report["acceptance"] = drafter_acceptance.measure(target, stored, tokenizer, args.eval_conversations,
                                                          args.block_size - 1, device, args.max_new_tokens, log)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    log("done")


if __name__ == "__main__":
    main()
