#!/usr/bin/env python3
"""Trains beam-nano (a Beam-architecture model, every feature exercised) on synthetic Harmony conversations.

  python3 tools/train/train.py --tokenizer models/beam-nano/tokenizer.json --out OUT_DIR \
      [--examples 300000] [--heldout 1000] [--ood 1000] [--seconds 240] [--seed 1]

Generates the data in-process (tools/data/generate.py, all CPU cores), tokenizes it with the given
tokenizer.json, trains with the loss on assistant-produced tokens only, prints the held-out loss, and writes
OUT_DIR/{config.json, model.safetensors (BF16, router F32), tokenizer.json, harmony.json,
generation_config.json}; --heldout-out and --ood-out save the held-out conversations (the same files
`generate.py --train 0 --heldout N --ood M --seed S` writes).

Router balance: aux-loss-free (DeepSeek-V3): after every step each MoE layer's e_score_correction_bias moves
by --bias-rate toward balance (up for experts that got fewer tokens than the mean, down for more).
"""
import argparse
import json
import math
import multiprocessing
import os
import random
import shutil
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "data"))
sys.path.insert(0, os.path.join(ROOT, "tools", "tokenizer"))
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
import generate  # noqa: E402
from beam_config import BeamConfig, nano_config  # noqa: E402
from beam_torch import BeamForCausalLM, init_weights, save_checkpoint  # noqa: E402
from bpe import Tokenizer  # noqa: E402

_tokenizer = None


def _worker_init(tokenizer_path):
    global _tokenizer
    _tokenizer = Tokenizer.load(tokenizer_path)


def _make_chunk(job):
    split, seed, count = job
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        example = generate.make_example(rng, split)
        ids, mask = [], []
        for text, trainable in example["segments"]:
            piece = _tokenizer.encode(text)
            ids.extend(piece)
            mask.extend([trainable] * len(piece))
        out.append((np.array(ids, dtype=np.int16 if max(ids) < 32768 else np.int32), np.array(mask, dtype=bool),
                    json.dumps(example, ensure_ascii=False) if split != "train" else None))
    return out


def build_split(tokenizer_path, split, count, seed, workers):
    jobs = generate.split_jobs(split, count, seed)
    with multiprocessing.Pool(workers, initializer=_worker_init, initargs=(tokenizer_path,)) as pool:
        return [item for part in pool.imap(_make_chunk, jobs) for item in part]


def batches(examples, batch_tokens, rng):
    """Length-bucketed batches of (ids, mask) holding about batch_tokens tokens each, in random order."""
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i][0]), rng.random()))
    out, current, longest = [], [], 0
    for index in order:
        length = len(examples[index][0])
        if current and max(longest, length) * (len(current) + 1) > batch_tokens:
            out.append(current)
            current, longest = [], 0
        current.append(index)
        longest = max(longest, length)
    if current:
        out.append(current)
    rng.shuffle(out)
    return out


def collate(examples, indices, device):
    longest = max(len(examples[i][0]) for i in indices)
    tokens = torch.zeros(len(indices), longest, dtype=torch.long)
    loss_mask = torch.zeros(len(indices), longest, dtype=torch.bool)
    valid = torch.zeros(len(indices), longest, dtype=torch.bool)
    for row, i in enumerate(indices):
        ids, mask = examples[i][0], examples[i][1]
        tokens[row, :len(ids)] = torch.from_numpy(ids.astype(np.int64))
        loss_mask[row, :len(ids)] = torch.from_numpy(mask)
        valid[row, :len(ids)] = True
    return tokens.to(device, non_blocking=True), loss_mask.to(device), valid.to(device)


def loss_on(model, tokens, loss_mask, valid):
    device = tokens.device.type
    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
        logits = model(tokens, valid=valid)
    target_mask = loss_mask[:, 1:]
    logits = logits[:, :-1][target_mask]
    targets = tokens[:, 1:][target_mask]
    return F.cross_entropy(logits.float(), targets)


@torch.no_grad()
def heldout_loss(model, examples, device, batch_tokens):
    model.eval()
    total, count = 0.0, 0
    for indices in batches(examples, batch_tokens, random.Random(0)):
        tokens, loss_mask, valid = collate(examples, indices, device)
        n = int(loss_mask[:, 1:].sum())
        total += float(loss_on(model, tokens, loss_mask, valid)) * n
        count += n
    model.train()
    return total / count


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--heldout-out", help="write the held-out conversations here (JSONL, as generate.py)")
    parser.add_argument("--ood-out", help="write the out-of-distribution conversations here (JSONL, as generate.py)")
    parser.add_argument("--examples", type=int, default=300000)
    parser.add_argument("--heldout", type=int, default=1000)
    parser.add_argument("--ood", type=int, default=1000, help="conversations of held-out templates and tools")
    parser.add_argument("--seconds", type=float, default=240.0, help="training time budget (schedule follows it)")
    parser.add_argument("--batch-tokens", type=int, default=48000)
    parser.add_argument("--lr", type=float, default=1.5e-3)
    parser.add_argument("--warmup", type=int, default=150)
    parser.add_argument("--bias-rate", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = args.device
    torch.backends.cuda.matmul.allow_tf32 = True
    started = time.time()
    tokenizer = Tokenizer.load(args.tokenizer)
    train = build_split(args.tokenizer, "train", args.examples, args.seed, args.workers)
    held = build_split(args.tokenizer, "heldout", args.heldout, args.seed + generate.HELDOUT_SEED_OFFSET,
                       args.workers)
    ood = build_split(args.tokenizer, "ood", args.ood, args.seed + generate.OOD_SEED_OFFSET, args.workers)
    train_tokens = sum(len(e[0]) for e in train)
    print(f"data: {len(train)} train conversations ({train_tokens / 1e6:.1f} M tokens), {len(held)} held-out, "
          f"{len(ood)} out-of-distribution; "
          f"{time.time() - started:.0f} s", flush=True)

    eos = [tokenizer.token_id("<|return|>"), tokenizer.token_id("<|call|>")]
    config_dict = nano_config(tokenizer.vocab_size(), tokenizer.token_id("<|startoftext|>"), eos,
                              tokenizer.token_id("<|endoftext|>"))
    model = BeamForCausalLM(BeamConfig(config_dict))
    init_weights(model, args.seed)
    model.to(device)
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params / 1e6:.2f} M parameters", flush=True)

    decay = [p for n, p in model.named_parameters() if p.ndim == 2 and "embed" not in n and "gate.weight" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim == 2 and "embed" not in n
                                                               and "gate.weight" not in n)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                                  **({"fused": True} if device == "cuda" else {}))
    rng = random.Random(args.seed)
    plan = batches(train, args.batch_tokens, rng)
    step, epoch, train_started = 0, 0, time.time()
    moe_layers = model.moe_layers()
    running = None
    while True:
        elapsed = time.time() - train_started
        if elapsed >= args.seconds:
            break
        if not plan:
            epoch += 1
            plan = batches(train, args.batch_tokens, rng)
        progress = elapsed / args.seconds
        lr = args.lr * min(1.0, (step + 1) / args.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for group in optimizer.param_groups:
            group["lr"] = lr
        tokens, loss_mask, valid = collate(train, plan.pop(), device)
        loss = loss_on(model, tokens, loss_mask, valid)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        with torch.no_grad():
            for moe in moe_layers:
                load = moe.last_load.float()
                moe.gate.e_score_correction_bias += args.bias_rate * torch.sign(load.mean() - load)
        step += 1
        if step % 50 == 0:
            value = float(loss)
            running = value if running is None else 0.9 * running + 0.1 * value
        if step % 500 == 0:
            imbalance = max(float(m.last_load.max() / m.last_load.float().mean()) for m in moe_layers)
            print(f"step {step} epoch {epoch} {elapsed:.0f}s lr {lr:.2e} train loss {running:.4f} "
                  f"max expert load/mean {imbalance:.2f}", flush=True)
    seconds = time.time() - train_started
    print(f"trained {step} steps in {seconds:.0f} s ({epoch} full epochs)", flush=True)

    # the checkpoint is written before anything else can fail
    harmony = {"channels": ["analysis", "commentary", "final"], "reasoning_channel": "analysis",
               "final_channel": "final", "tool_channel": "commentary", "tool_namespace": "functions",
               "stop_tokens": ["<|return|>", "<|call|>"], "model_identity": generate.BEAM_IDENTITY,
               "knowledge_cutoff": generate.BEAM_CUTOFF, "default_reasoning_effort": "medium"}
    generation = {"bos_token_id": config_dict["bos_token_id"], "eos_token_id": eos,
                  "pad_token_id": config_dict["pad_token_id"], "do_sample": False}
    model.cpu()
    save_checkpoint(model, args.out, {"harmony.json": harmony, "generation_config.json": generation})
    shutil.copyfile(args.tokenizer, os.path.join(args.out, "tokenizer.json"))
    for path, examples in [(args.heldout_out, held), (args.ood_out, ood)]:
        if path:
            with open(path, "w") as f:
                for _, _, line in examples:
                    f.write(line + "\n")
    model.to(device)
    print(f"held-out loss (assistant tokens): {heldout_loss(model, held, device, args.batch_tokens):.4f}; "
          f"out-of-distribution: {heldout_loss(model, ood, device, args.batch_tokens):.4f}", flush=True)
    print(f"wrote {args.out}; total {time.time() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
