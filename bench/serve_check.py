#!/usr/bin/env python3
"""Serving comparison for bench/gpu_check.sh (python3 stdlib only): does a request's answer depend on what shares its
steps? 32 greedy /v1/completions requests, sent all at once and then one at a time, to `beamline serve`:

- float32 compute and KV cache: the concurrent answers equal the lone ones token for token (100%), also against
  --enforce-eager (op by op instead of recorded decode graphs), --no-async-scheduling (each step waits for the
  previous step's tokens), and with preemption forced by a KV cache too small for the batch; the lone answers'
  first 16 tokens against `--device cpu` (>= 90%: near-ties may flip between two backends' summation orders);
- the defaults (bfloat16 compute, BF16 KV, async scheduling, decode graphs), and again eager and synchronous, and
  with preemption forced, on the default model (beam-nano, given by --bfloat16-model) and 32 of its held-out chat
  prompts (tools/data/generate.py): teacher-forced, i.e. at every position where the concurrent and the lone answer share
  their prefix, the chosen tokens agree (>= 99% of such positions) and their logprobs agree within the BF16
  tolerance. A position where the tokens first differ counts as a disagreement; the positions after it have
  different prefixes and are not compared. These servers return each token's routed experts: BF16 rounding that
  differs with the batch can flip a near-tie in an MoE router's top-k, and a token routed to other experts is
  computed by other weights, so from the first position whose routing differs (prompt or output, any MoE layer)
  the logprob bound no longer applies; those positions still count for the argmax share, and the row says how
  many there were (2026-12-03: one position of 506 moved 0.15 on the H200, the others at most 0.024). (On the random-weight preset, bfloat16 alone moves the logits 3-5% from
  float32, so near-ties flip between any two summation orders: 98.0-99.0% there on 2026-12-03, see
  bench/results/2026-12-03-gpu-check.md. A trained model's margins are what the serving defaults are for.);
- bfloat16 with --batch-invariant (vLLM's VLLM_BATCH_INVARIANT), with the defaults and with preemption forced:
  teacher-forced as above, but every position must agree (100%) with bit-identical logprobs (|d logprob| = 0).

Prints Markdown table rows (13).

  serve_check.py BEAMLINE_BINARY MODEL_DIR [DEVICE] [--bfloat16-model DIR] [--batch-invariant-only]
  (MODEL_DIR: the float32 and --batch-invariant rows, random token prompts; --bfloat16-model: the bfloat16 rows,
  held-out chat prompts, MODEL_DIR with random prompts when absent; DEVICE cuda by default, cpu to try the script
  without a GPU; --batch-invariant-only: only the 2 rows of --batch-invariant)
"""
import base64
import collections
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

REQUESTS = 32
MAX_TOKENS = 16
BACKENDS_AGREE = 0.9  # cuda against cpu: two summation orders
ARGMAX_AGREE = 0.99
# |logprob alone - logprob concurrent| of a token chosen from the same prefix, BF16 compute: the op harness's BF16
# tolerance is 1e-2 relative on a logit, and a logprob near 0 moves with its neighbours' logits.
LOGPROB_TOLERANCE = 0.1
# 64 blocks of the small preset's KV: a sequence of the longest prompt and its 16 tokens takes ~30, so the 32 requests
# (8..200-token prompts) run about two at a time and the scheduler must preempt (96 blocks preempted 0 times on the
# H200). A block is 64 KiB in F32 (float32, and the cpu backend whatever the dtype), 32 KiB in BF16.
# beam-nano keeps 8 KiB a token in F32: 3.5M holds 448 tokens: the longest chat prompt (325), its 16 tokens and
# the blocks that round them up.
def preempting_kv(device, dtype, model=""):
    f32 = dtype == "float32" or device == "cpu"
    if "beam-nano" in model:
        return "3584K" if f32 else "1792K"
    return "4M" if f32 else "2M"


# The server's output goes to `log` (an open file) when given, else to this script's stderr.
def start_server(binary, model, device, port, dtype, extra=(), log=None):
    # The GPU server sizes its KV cache from the device's memory, as `vllm serve` does.
    budget = ["--gpu-memory-utilization", "0.3"] if device == "cuda" else ["--kv-cache-memory", "4G"]
    if "--kv-cache-memory" in extra:
        budget = []
    # float32 compute comes with an F32 KV cache (--kv-cache-dtype auto follows --dtype).
    process = subprocess.Popen([binary, "serve", "--model", model, "--device", device, "--port", str(port),
                                "--dtype", dtype, "--speculative-config", "none", *budget, *extra],
                               stdout=log or sys.stderr, stderr=log or sys.stderr)
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return process
        except OSError:
            time.sleep(0.5)
        if process.poll() is not None:
            raise RuntimeError(f"beamline serve --device {device} exited with {process.returncode}")
    process.kill()
    raise RuntimeError(f"beamline serve --device {device} did not become healthy")


def get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return response.read().decode()


def preemptions(port):
    for line in get(port, "/metrics").splitlines():
        if line.startswith("vllm:num_preemptions_total"):
            return float(line.split()[-1])
    raise RuntimeError("/metrics has no vllm:num_preemptions_total")


# One greedy completion: its token ids, each chosen token's logprob and, when `top_k` is given (a server started
# with --enable-return-routed-experts, docs/rl.md), the expert set of every MoE layer for each token the model
# computed (the prompt's, then the output's but the last), as one tuple per token: Routing(prompt_length, rows).
Routing = collections.namedtuple("Routing", "prompt_length rows")


def complete(port, model, prompt, top_k=0):
    request_body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "logprobs": 0,
                    "return_token_ids": True}
    if top_k:
        request_body["return_routed_experts"] = True
    body = json.dumps(request_body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        choice = json.load(response)["choices"][0]
    answer = [choice["token_ids"], choice["logprobs"]["token_logprobs"]]
    if top_k:
        if "routed_experts" not in choice:
            raise RuntimeError("a request with return_routed_experts got no routed_experts")
        packed = base64.b64decode(choice["routed_experts"])
        ids = struct.unpack(f"<{len(packed) // 2}h", packed)
        tokens = len(prompt) + len(choice["token_ids"]) - 1
        per_token = len(ids) // tokens
        if per_token * tokens != len(ids) or per_token % top_k:
            raise RuntimeError(f"routed_experts holds {len(ids)} ids, not {tokens} tokens x MoE layers x {top_k}")
        rows = [tuple(tuple(sorted(ids[at + layer:at + layer + top_k])) for layer in range(0, per_token, top_k))
                for at in range(0, len(ids), per_token)]
        answer.append(Routing(len(prompt), rows))
    return answer


def run_all(port, prompts, concurrent, top_k=0):
    results = [None] * len(prompts)
    model = json.loads(get(port, "/v1/models"))["data"][0]["id"]

    def worker(i):
        results[i] = complete(port, model, prompts[i], top_k)

    if concurrent:
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(prompts))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    else:
        for i in range(len(prompts)):
            worker(i)
    failed = [i for i, result in enumerate(results) if result is None]
    if failed:
        raise RuntimeError(f"requests {failed} got no answer (see the server's log above)")
    return results


def print_row(name, measured, limit, passed):
    print(f"| {name} | {measured} | {limit} | {'pass' if passed else '**FAIL**'} |")
    return passed


def equal_row(name, answers, reference, limit_fraction, first=MAX_TOKENS):
    matches = sum(a[0][:first] == b[0][:first] for a, b in zip(answers, reference))
    return print_row(name, f"{matches} of {REQUESTS} requests equal", f">= {limit_fraction:.0%}",
                     matches >= limit_fraction * REQUESTS)


# The first token (prompt and output together) whose routed experts differ between two answers; None when the
# answers carry no routing, the length of the shorter when every common token is routed alike.
def first_routing_difference(answer, other):
    if len(answer) < 3 or len(other) < 3:
        return None
    rows, other_rows = answer[2].rows, other[2].rows
    common = min(len(rows), len(other_rows))
    return next((i for i in range(common) if rows[i] != other_rows[i]), common)


# Teacher-forced agreement: positions compared while the prefixes are equal, the first difference included. With
# routing, an output position whose logits come from tokens routed differently (its previous token or any before)
# is left out of the logprob bound and counted.
def teacher_forced_row(name, answers, reference, argmax_agree=ARGMAX_AGREE, logprob_tolerance=LOGPROB_TOLERANCE):
    compared = agreed = rerouted = 0
    worst = 0.0
    for answer, lone in zip(answers, reference):
        (tokens, logprobs), (lone_tokens, lone_logprobs) = answer[:2], lone[:2]
        difference = first_routing_difference(answer, lone)
        for position in range(min(len(tokens), len(lone_tokens))):
            compared += 1
            if tokens[position] != lone_tokens[position]:
                break
            agreed += 1
            if difference is not None and answer[2].prompt_length + position - 1 >= difference:
                rerouted += 1
                continue
            worst = max(worst, abs(logprobs[position] - lone_logprobs[position]))
    fraction = agreed / max(compared, 1)
    routing_note = "" if rerouted == 0 else f" ({rerouted} after a routing flip, not bounded)"
    return print_row(name, f"argmax {agreed} of {compared} positions ({fraction:.2%}), max |d logprob| {worst:.3g}"
                     f"{routing_note}", f">= {argmax_agree:.0%}, <= {logprob_tolerance}",
                     compared > 0 and fraction >= argmax_agree and worst <= logprob_tolerance)


# Runs `work(port)` against a server started with these flags (its output to `log` when given), then stops it.
def with_server(binary, model, device, port, dtype, extra, work, log=None):
    server = start_server(binary, model, device, port, dtype, extra, log)
    try:
        return work(port)
    finally:
        server.terminate()
        server.wait()


def concurrent_with_preemption(prompts, top_k=0):
    def work(port):
        answers = run_all(port, prompts, True, top_k)
        return answers, preemptions(port)
    return work


# The experts each token of `model` picks per MoE layer; 0 for a model without MoE layers.
def moe_top_k(model):
    with open(os.path.join(model, "config.json")) as f:
        config = json.load(f)
    return config.get("num_experts_per_tok", 0) if config.get("n_routed_experts", 0) else 0


def make_prompts(vocab=1000):
    rng = random.Random(5)
    return [[rng.randrange(min(vocab, 1000)) for _ in range(rng.randrange(8, 200))] for _ in range(REQUESTS)]


# The first model turn of 32 held-out conversations of the beam-nano data generator, as token ids.
def chat_prompts(binary, model):
    with tempfile.TemporaryDirectory() as directory:
        generator = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "data", "generate.py")
        subprocess.run([sys.executable, generator, "--out", directory, "--train", "0", "--heldout",
                        str(REQUESTS), "--ood", "0", "--seed", "5", "--workers", "1"], check=True,
                       stdout=subprocess.DEVNULL)
        with open(os.path.join(directory, "heldout.jsonl")) as f:
            texts = [json.loads(line)["turns"][0]["prompt"] for line in f][:REQUESTS]
    encoded = subprocess.run([binary, "tokenize", "--model", model, "--allow-special", "--jsonl"], check=True,
                             input="".join(json.dumps(text) + "\n" for text in texts), capture_output=True,
                             text=True).stdout.splitlines()
    if len(encoded) != REQUESTS:
        raise RuntimeError(f"beamline tokenize gave {len(encoded)} lines for {REQUESTS} prompts")
    return [[int(token) for token in line.split()] for line in encoded]


# --batch-invariant at the defaults (bfloat16, BF16 KV, async scheduling, decode graphs), then with preemption forced
# (a preempted request's prompt and tokens are computed again as prefill rows): every position equal, logprobs equal.
def batch_invariant_rows(binary, model, device, prompts):
    ok = True
    dtype = "bfloat16"
    batched, alone = with_server(binary, model, device, 8331, dtype, ["--batch-invariant"],
                                 lambda p: (run_all(p, prompts, concurrent=True), run_all(p, prompts, False)))
    kv = preempting_kv(device, dtype)
    preempted, count = with_server(binary, model, device, 8332, dtype, ["--batch-invariant", "--kv-cache-memory", kv],
                                   concurrent_with_preemption(prompts))
    runs = [("32 concurrent vs one at a time", batched),
            (f"32 concurrent with preemption forced ({count:.0f} preemptions) vs one at a time", preempted)]
    for name, answers in runs:
        title = (f"serve --device {device} --dtype {dtype} --batch-invariant: {name} (greedy, {MAX_TOKENS} tokens), "
                 "teacher-forced")
        ok &= teacher_forced_row(title, answers, alone, 1.0, 0.0)
    return ok


def main(binary, small_model, device, bfloat16_model):
    random_prompts = make_prompts()
    ok = True
    port = 8311
    for dtype in ("float32", "bfloat16"):
        model, prompts, top_k = small_model, random_prompts, 0
        if dtype == "bfloat16" and bfloat16_model:
            model, prompts = bfloat16_model, chat_prompts(binary, bfloat16_model)
            top_k = moe_top_k(bfloat16_model)
        routing_flag = ["--enable-return-routed-experts"] if top_k else []

        def serve(extra, work):
            nonlocal port
            port += 1
            return with_server(binary, model, device, port, dtype, routing_flag + extra, work)

        batched, alone = serve([], lambda p: (run_all(p, prompts, True, top_k), run_all(p, prompts, False, top_k)))
        eager = serve(["--enforce-eager"], lambda p: run_all(p, prompts, True, top_k))
        synchronous = serve(["--no-async-scheduling"], lambda p: run_all(p, prompts, True, top_k))
        kv = preempting_kv(device, dtype, model)
        preempted, count = serve(["--kv-cache-memory", kv], concurrent_with_preemption(prompts, top_k))
        label = "" if model == small_model else f" on {os.path.basename(os.path.normpath(model))}, chat prompts"
        ok &= print_row(f"serve --device {device} --dtype {dtype}{label}: preemptions forced by --kv-cache-memory {kv}",
                        f"{count:.0f} preemptions", "> 0", count > 0)
        defaults = "async scheduling, decode graphs" if device != "cpu" else \
            "async scheduling; the CPU records no decode graphs"
        runs = [(f"32 concurrent (defaults: {defaults}) vs one at a time", batched),
                ("32 concurrent with --enforce-eager vs one at a time", eager),
                ("32 concurrent with --no-async-scheduling vs one at a time", synchronous),
                ("32 concurrent with preemption forced vs one at a time", preempted)]
        for name, answers in runs:
            title = f"serve --device {device} --dtype {dtype}{label}: {name} (greedy, {MAX_TOKENS} tokens)"
            if dtype == "float32":
                ok &= equal_row(title, answers, alone, 1.0)
            else:
                ok &= teacher_forced_row(title + ", teacher-forced", answers, alone)
        if dtype == "float32" and device != "cpu":
            cpu = with_server(binary, small_model, "cpu", 8310, dtype, [], lambda p: run_all(p, prompts, concurrent=False))
            ok &= equal_row(f"serve: {device} vs cpu, float32, one at a time, first 16 tokens", alone, cpu,
                            BACKENDS_AGREE, 16)
    ok &= batch_invariant_rows(binary, small_model, device, random_prompts)
    return ok


if __name__ == "__main__":
    only_invariant = "--batch-invariant-only" in sys.argv
    args = [arg for arg in sys.argv[1:] if arg != "--batch-invariant-only"]
    bfloat16_model = None
    if "--bfloat16-model" in args:
        at = args.index("--bfloat16-model")
        bfloat16_model = args[at + 1] if at + 1 < len(args) else None
        del args[at:at + 2]
    if len(args) not in (2, 3) or ("--bfloat16-model" in sys.argv and not bfloat16_model):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    binary, model, device = args[0], args[1], args[2] if len(args) == 3 else "cuda"
    if only_invariant:
        sys.exit(0 if batch_invariant_rows(binary, model, device, make_prompts()) else 1)
    sys.exit(0 if main(binary, model, device, bfloat16_model) else 1)
