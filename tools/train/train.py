#!/usr/bin/env python3
"""Trains beam-nano (a Beam-architecture model, every feature exercised) on synthetic Harmony conversations.

  python3 tools/train/train.py --tokenizer models/beam-nano/tokenizer.json --out OUT_DIR \
      [--config v3] [--examples 300000] [--heldout 1000] [--ood 1000] [--seconds 240] [--seed 1] [--init-from DIR]

Generates the data in-process (tools/data/generate.py, all CPU cores), tokenizes it with the given
tokenizer.json, trains with the loss on assistant-produced tokens only, prints the held-out loss, and writes
OUT_DIR/{config.json, model.safetensors (BF16, router F32), tokenizer.json, harmony.json,
generation_config.json}; --heldout-out and --ood-out save the held-out conversations (the same files
`generate.py --train 0 --heldout N --ood M --seed S` writes).

Speed (on CUDA): the loss is beam_fast.fast_loss (SDPA attention, sliding layers in window-sized blocks, the
experts as one wide SwiGLU, LM head only where the loss reads, no host sync in a step; each decoder layer and the
head compiled with dynamic shapes), bf16 autocast, fused AdamW; batches are conversations of about the same length
(length-sorted, so padding is the rounding of each batch's length to 8), collated on the host with the LM head's
target positions. While the data is generated, the eager fast loss is checked against the reference's on the GPU
(float32, loss and every gradient within 1e-4 relative), then the compiled one against the eager one under bf16
autocast (the training step's graphs, so training starts compiled); a torch.compile failure falls back to eager, a
mismatch to the reference's loss. --profile-steps N writes a torch.profiler table of N steps (profile.txt).

--init-from DIR starts from a checkpoint folder instead of random weights (carry_checkpoint.load_into: config.json
and model.safetensors or gpu_run.sh's parts; F32, BF16, or carry_checkpoint.py's int8 copy; router F32): its config
must equal --config's and every tensor the model's shape, else it stops naming the key or tensor. The optimizer
starts fresh (AdamW's moments at zero) and the learning rate warms up again over --warmup steps; the routers'
e_score_correction_bias comes from the checkpoint. Give it another --seed than the run it continues, or the data
begin again with the same conversations.

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
import traceback

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "data"))
sys.path.insert(0, os.path.join(ROOT, "tools", "tokenizer"))
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
import beam_fast  # noqa: E402
import carry_checkpoint  # noqa: E402
import generate  # noqa: E402
from beam_config import CONFIGS, BeamConfig  # noqa: E402
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


def start_split(pool, split, count, seed):
    """Starts generating a split on the pool; the result's get() is its examples, in the seed's order."""
    return pool.map_async(_make_chunk, generate.split_jobs(split, count, seed))


def collect(pending):
    return [item for part in pending.get() for item in part]


class TrainData:
    """The training conversations as the pool makes them (in the seed's order). Streaming, training draws batches from
    the chunks made so far while the rest is made (the pool makes tokens faster than a step uses them); otherwise
    take() waits for every chunk, and the batches depend only on the seed."""

    def __init__(self, pool, count, seed, stream):
        self.parts = pool.imap(_make_chunk, generate.split_jobs("train", count, seed))
        self.examples, self.complete, self.stream = [], False, stream

    def take(self):
        """Takes in the chunks made by now (waiting for at least one; for all when not streaming); returns the index
        of the first new conversation."""
        first = len(self.examples)
        while not self.complete:
            waiting = not self.stream or len(self.examples) == first
            try:
                part = self.parts.next(timeout=None if waiting else 0)
            except StopIteration:
                self.complete = True
            except multiprocessing.TimeoutError:
                break
            else:
                self.examples.extend(part)
        return first


def batches(examples, batch_tokens, rng, first=0):
    """Length-bucketed batches of examples[first:] (ids, mask) holding about batch_tokens tokens each, in random
    order."""
    order = sorted(range(first, len(examples)), key=lambda i: (len(examples[i][0]), rng.random()))
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
    """Right-padded tokens, loss mask and valid mask [B, T] (T rounded up to 8) and the LM head's target positions
    (beam_fast.target_positions, computed here so that the device step has no sync)."""
    longest = -(-max(len(examples[i][0]) for i in indices) // 8) * 8
    tokens = np.zeros((len(indices), longest), dtype=np.int64)
    loss_mask = np.zeros((len(indices), longest), dtype=bool)
    valid = np.zeros((len(indices), longest), dtype=bool)
    for row, i in enumerate(indices):
        ids, mask = examples[i][0], examples[i][1]
        tokens[row, :len(ids)] = ids
        loss_mask[row, :len(ids)] = mask
        valid[row, :len(ids)] = True
    tensors = [torch.from_numpy(a) for a in (tokens, loss_mask, valid)]
    tensors.append(beam_fast.target_positions(tensors[1]))
    if device == "cuda":
        return tuple(t.pin_memory().to(device, non_blocking=True) for t in tensors)
    return tuple(tensors)


def loss_on(loss_fn, model, tokens, loss_mask, valid, targets=None):
    device = tokens.device.type
    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
        return loss_fn(model, tokens, loss_mask, valid, targets)


@torch.no_grad()
def heldout_loss(loss_fn, model, examples, device, batch_tokens):
    model.eval()
    total, count = 0.0, 0
    for indices in batches(examples, batch_tokens, random.Random(0)):
        tokens, loss_mask, valid, targets = collate(examples, indices, device)
        n = len(targets)
        total += float(loss_on(loss_fn, model, tokens, loss_mask, valid, targets)) * n
        count += n
    model.train()
    return total / count


def random_batch(vocab, rows, length, device, seed):
    """Random tokens in right-padded rows (the last row shorter), for the checks before training."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (rows, length), generator=generator)
    loss_mask = torch.rand(rows, length, generator=generator) < 0.5
    valid = torch.ones(rows, length, dtype=torch.bool)
    valid[-1, length // 2:] = False
    loss_mask &= valid
    return tokens.to(device), loss_mask.to(device), valid.to(device)


def choose_loss(model, device, compile_wanted, seed, compile_mode=None):
    """The fast loss when it matches the reference on this device (float32, eager, random rows longer than the
    sliding window), compiled when torch.compile's loss matches the eager one as training runs it (bf16 autocast on
    CUDA); else the reference's loss. The compiled check compiles the training step's graphs; a short batch then
    compiles the branch of rows within the window, so that training starts without compiling."""
    window = model.config.sliding_window
    check = random_batch(model.config.vocab_size, 3, 2 * window + 40, device, seed)
    short = random_batch(model.config.vocab_size, 8, window - 8, device, seed + 1)

    def attempt(what, fn):
        started = time.time()
        try:
            return fn()
        except Exception as error:  # noqa: BLE001 (any failure here falls back to a slower loss)
            print(f"{what} failed: {type(error).__name__}: {error}", flush=True)
            return False
        finally:
            model.zero_grad(set_to_none=True)
            print(f"{what}: {time.time() - started:.1f} s", flush=True)

    def reference_check():
        torch.set_float32_matmul_precision("highest")      # the check compares float32 with float32
        try:
            return beam_fast.check_against_reference(model, *check)
        finally:
            torch.set_float32_matmul_precision("high")

    def training_step(batch):
        loss_on(beam_fast.fast_loss, model, *batch).backward()
        return True

    def compiled_check():
        beam_fast.use_compile(True, compile_mode)
        if hasattr(torch, "_logging"):
            torch._logging.set_logs(recompiles=True, graph_breaks=True)
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
            ok = beam_fast.check_against_reference(model, *check, tolerance=2e-2, reference=beam_fast.eager_loss,
                                                   exact_routing=False, label="compiled vs eager fast path")
        return ok and training_step(short)

    if attempt("reference check", reference_check):
        if compile_wanted:
            if attempt("compile and check", compiled_check):
                print(f"loss: fast path, torch.compile on (mode {compile_mode or 'default'})", flush=True)
                return beam_fast.fast_loss
            beam_fast.use_compile(False)
        if attempt("eager training step", lambda: training_step(short) and training_step(check)):
            print("loss: fast path, torch.compile off", flush=True)
            return beam_fast.fast_loss
    print("WARNING: the fast path failed or does not match the reference here; loss: the reference's (slow)",
          flush=True)
    return beam_fast.reference_loss


class StepProfiler:
    """--profile-steps: torch.profiler over N training steps from step `start` (compiled and warm by then); writes the
    ops and kernels by device time (and by host time) to `path`, with the steps' wall time."""

    def __init__(self, steps, start, path, device):
        self.steps, self.start, self.path, self.device = steps, start, path, device
        self.profiler, self.began = None, None

    def _sync(self):
        if self.device == "cuda":
            torch.cuda.synchronize()

    def step(self, step):
        """Called before each training step."""
        if self.steps and step == self.start:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.device == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._sync()
            self.profiler = torch.profiler.profile(activities=activities)
            self.profiler.__enter__()
            self.began = time.time()
        elif self.profiler is not None and step == self.start + self.steps:
            self.finish(step)

    def finish(self, step):
        """Ends the profile (also when training ends inside it) and writes the table."""
        if self.profiler is None:
            return
        self._sync()
        seconds, steps = time.time() - self.began, max(step - self.start, 1)
        self.profiler.__exit__(None, None, None)
        events = self.profiler.key_averages()
        self.profiler = None
        by_device = next((key for key in ("self_device_time_total", "self_cuda_time_total")
                          if self.device == "cuda" and len(events) and hasattr(events[0], key)), "self_cpu_time_total")
        with open(self.path, "w") as f:
            f.write(f"{steps} steps (from step {self.start}) in {seconds:.3f} s under the profiler: "
                    f"{1000 * seconds / steps:.1f} ms a step\n\n")
            f.write(f"by {by_device}:\n{events.table(sort_by=by_device, row_limit=60)}\n")
            f.write(f"by cpu_time_total:\n{events.table(sort_by='cpu_time_total', row_limit=30)}\n")
        print(f"profile of {steps} steps: {1000 * seconds / steps:.1f} ms a step; {self.path}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--heldout-out", help="write the held-out conversations here (JSONL, as generate.py)")
    parser.add_argument("--ood-out", help="write the out-of-distribution conversations here (JSONL, as generate.py)")
    parser.add_argument("--config", choices=sorted(CONFIGS), default="v3", help="model shape (beam_config.py)")
    parser.add_argument("--init-from", help="start from this checkpoint folder (see above) instead of random weights")
    parser.add_argument("--examples", type=int, default=300000)
    parser.add_argument("--heldout", type=int, default=1000)
    parser.add_argument("--ood", type=int, default=1000, help="conversations of held-out templates and tools")
    parser.add_argument("--seconds", type=float, default=240.0, help="training time budget (schedule follows it)")
    parser.add_argument("--stop-by", type=float, help="end training by this many seconds after the start, data and "
                        "checks included (the schedule shrinks to fit)")
    parser.add_argument("--max-steps", type=int, help="stop after this many steps (smoke tests)")
    parser.add_argument("--batch-tokens", type=int, default=48000)
    parser.add_argument("--lr", type=float, default=1.5e-3)
    parser.add_argument("--warmup", type=int, default=150)
    parser.add_argument("--bias-rate", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2),
                        help="data processes (default: all cores but two: the training loop and its copies)")
    parser.add_argument("--stream-data", action="store_true", help="start training on the first conversations made "
                        "while the pool makes the rest (the batches then depend on timing)")
    parser.add_argument("--no-compile", action="store_true", help="do not try torch.compile")
    parser.add_argument("--compile-mode", help="torch.compile's mode (e.g. max-autotune-no-cudagraphs; default: its "
                        "default)")
    parser.add_argument("--profile-steps", type=int, default=0, help="profile this many training steps (after "
                        "--profile-start) with torch.profiler into --profile-out")
    parser.add_argument("--profile-start", type=int, default=50)
    parser.add_argument("--profile-out", help="the profile's table (default: OUT/../profile.txt)")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = args.device
    torch.set_float32_matmul_precision("high")   # TF32 for the FP32 LM head, as before
    started = time.time()
    tokenizer = Tokenizer.load(args.tokenizer)
    eos = [tokenizer.token_id("<|return|>"), tokenizer.token_id("<|call|>")]
    config_dict = CONFIGS[args.config](tokenizer.vocab_size(), tokenizer.token_id("<|startoftext|>"), eos,
                                       tokenizer.token_id("<|endoftext|>"))
    if args.init_from:
        try:
            carry_checkpoint.check_config(config_dict, args.init_from)
        except ValueError as error:
            sys.exit(f"--init-from: {error}")
    # the pool forks before CUDA starts; the data is generated while the model is built and checked
    pool = multiprocessing.Pool(args.workers, initializer=_worker_init, initargs=(args.tokenizer,))
    data = TrainData(pool, args.examples, args.seed, args.stream_data)
    pending = [start_split(pool, "heldout", args.heldout, args.seed + generate.HELDOUT_SEED_OFFSET),
               start_split(pool, "ood", args.ood, args.seed + generate.OOD_SEED_OFFSET)]

    model = BeamForCausalLM(BeamConfig(config_dict))
    if args.init_from:
        try:
            counts = carry_checkpoint.load_into(model, args.init_from)
        except ValueError as error:
            pool.terminate()
            sys.exit(f"--init-from: {error}")
        print(f"init from {args.init_from}: {sum(counts.values())} tensors ("
              f"{', '.join(f'{n} {dtype}' for dtype, n in sorted(counts.items()))}); optimizer state starts fresh, "
              f"learning rate warms up again over {args.warmup} steps", flush=True)
    else:
        init_weights(model, args.seed)
    model.to(device)
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {args.config}, {params / 1e6:.2f} M parameters", flush=True)
    loss_fn = choose_loss(model, device, not args.no_compile, args.seed, args.compile_mode)
    print(f"checks done: {time.time() - started:.0f} s", flush=True)

    train = data.examples

    def report_data():
        tokens = sum(len(e[0]) for e in train)
        print(f"data: {len(train)} of {args.examples} train conversations ({tokens / 1e6:.1f} M tokens) made; "
              f"{time.time() - started:.0f} s", flush=True)

    decay = [p for n, p in model.named_parameters() if p.ndim == 2 and "embed" not in n and "gate.weight" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim == 2 and "embed" not in n
                                                               and "gate.weight" not in n)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                                  **({"fused": True} if device == "cuda" else {}))
    rng = random.Random(args.seed)
    plan = batches(train, args.batch_tokens, rng, data.take())
    report_data()
    step, epoch, train_started = 0, 0, time.time()
    budget = args.seconds if args.stop_by is None else min(args.seconds, args.stop_by - (train_started - started))
    print(f"training for {budget:.0f} s", flush=True)
    seen_tokens, padded_tokens = 0, 0
    moe_layers = model.moe_layers()
    running = None
    profiler = StepProfiler(args.profile_steps, args.profile_start, args.profile_out or
                            os.path.join(os.path.dirname(os.path.abspath(args.out)), "profile.txt"), device)
    try:
        while True:
            elapsed = time.time() - train_started
            if elapsed >= budget or (args.max_steps is not None and step >= args.max_steps):
                break
            while not plan:
                if data.complete:
                    epoch += 1
                    plan = batches(train, args.batch_tokens, rng)
                else:
                    plan = batches(train, args.batch_tokens, rng, data.take())
                    if data.complete:
                        report_data()
            progress = elapsed / budget
            lr = args.lr * min(1.0, (step + 1) / args.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
            for group in optimizer.param_groups:
                group["lr"] = lr
            profiler.step(step)
            indices = plan.pop()
            tokens, loss_mask, valid, targets = collate(train, indices, device)
            seen_tokens += sum(len(train[i][0]) for i in indices)
            padded_tokens += tokens.numel()
            optimizer.zero_grad(set_to_none=True)
            try:
                loss = loss_on(loss_fn, model, tokens, loss_mask, valid, targets)
                loss.backward()
            except Exception as error:  # noqa: BLE001 (a compiled piece failing on a new shape: go on eagerly)
                if not beam_fast.compiled():
                    raise
                print(f"step {step}: compiled loss failed ({type(error).__name__}: {error}); torch.compile off",
                      flush=True)
                beam_fast.use_compile(False)
                optimizer.zero_grad(set_to_none=True)
                loss = loss_on(loss_fn, model, tokens, loss_mask, valid, targets)
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            with torch.no_grad():
                for moe in moe_layers:
                    load = moe.last_load.float()
                    moe.gate.e_score_correction_bias += args.bias_rate * torch.sign(load.mean() - load)
            step += 1
            if step % 50 == 0 or args.max_steps is not None:
                value = float(loss)
                running = value if running is None else 0.9 * running + 0.1 * value
            if step % 500 == 0 or args.max_steps is not None:
                imbalance = max(float(m.last_load.max() / m.last_load.float().mean()) for m in moe_layers)
                rate = seen_tokens / (time.time() - train_started) / 1e6
                print(f"step {step} epoch {epoch} {elapsed:.0f}s lr {lr:.2e} train loss {running:.4f} "
                      f"max expert load/mean {imbalance:.2f} {rate:.2f} M tokens/s", flush=True)
    except Exception:  # noqa: BLE001 (the one device call must still bring back what was trained)
        traceback.print_exc()
        print(f"ERROR: training stopped at step {step} by the error above; saving what was trained", flush=True)
    profiler.finish(step)
    seconds = time.time() - train_started
    print(f"trained {step} steps in {seconds:.0f} s ({epoch} full epochs, {seen_tokens / 1e6:.1f} M tokens, "
          f"{seen_tokens / seconds / 1e6:.2f} M tokens/s, padding {1 - seen_tokens / max(padded_tokens, 1):.1%})",
          flush=True)

    held, ood = (collect(p) for p in pending)
    pool.close()
    print(f"held-out: {len(held)} conversations, out-of-distribution: {len(ood)}", flush=True)

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
    beam_fast.use_compile(False)   # a few batches without gradients: not worth compiling again
    print(f"held-out loss (assistant tokens): {heldout_loss(loss_fn, model, held, device, args.batch_tokens):.4f}; "
          f"out-of-distribution: {heldout_loss(loss_fn, model, ood, device, args.batch_tokens):.4f}", flush=True)
    print(f"wrote {args.out}; total {time.time() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
