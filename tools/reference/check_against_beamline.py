#!/usr/bin/env python3
"""Compares the engine's logits with the Python references on the same checkpoint and tokens.

  python3 tools/reference/check_against_beamline.py [--beamline build/apps/beamline/beamline]
          [--model DIR | --preset tiny | --random-nano] [--tokens 48] [--seed 0] [--skip-beamline]

Without --model it writes a random checkpoint with `beamline make-model --preset P --out DIR --seed S`,
or, with --random-nano, one of beam-nano's shape with beam_torch.py (norm weights and router biases
drawn at random too, so every term of the math matters).
It draws random token ids, computes logits with beam_torch.py (CPU, FP32; when torch is importable) and
beam_numpy.py (float64), and with `beamline logits` (the command template --logits-cmd, filled with
{beamline} {model} {tokens} {out}; it must write a [T, V] float32 .npy). Prints each pair's max absolute
difference and ||a - b|| / ||b||, and exits 1 when a pair exceeds --tolerance (relative) or the argmax
agreement is below 99%.
--skip-beamline compares only the two Python references (torch vs numpy).
"""
import argparse
import os
import shlex
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from beam_config import BeamConfig  # noqa: E402
import beam_numpy  # noqa: E402

DEFAULT_LOGITS_CMD = "{beamline} logits --model {model} --tokens {tokens} --out {out}"


def torch_logits(model_dir, tokens):
    try:
        import torch
    except ImportError:
        return None
    from beam_torch import load_checkpoint
    model = load_checkpoint(model_dir, "cpu")
    with torch.no_grad():
        return model(torch.tensor([tokens]))[0].double().numpy()


def write_random_nano(directory, seed):
    from beam_config import nano_config
    from beam_torch import BeamForCausalLM, init_weights, randomize_for_checks, save_checkpoint
    model = BeamForCausalLM(BeamConfig(nano_config(4096, 4087, [4089, 4095], 4088)))
    init_weights(model, seed)
    randomize_for_checks(model, seed + 1)
    save_checkpoint(model, directory)


def compare(name_a, a, name_b, b, tolerance):
    diff = np.abs(a - b).max()
    relative = np.linalg.norm(a - b) / np.linalg.norm(b)
    agree = float((a.argmax(-1) == b.argmax(-1)).mean())
    ok = relative <= tolerance and agree >= 0.99
    print(f"{name_a} vs {name_b}: max |diff| {diff:.3e}, relative {relative:.3e}, argmax agreement "
          f"{100 * agree:.1f}% {'OK' if ok else 'FAIL'}")
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--beamline", default=os.path.join(HERE, "..", "..", "build", "apps", "beamline", "beamline"))
    parser.add_argument("--model")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tolerance", type=float, default=2e-3,
                        help="relative error allowed (FP32 engine vs FP64 numpy; raise for BF16 engine math)")
    parser.add_argument("--logits-cmd", default=DEFAULT_LOGITS_CMD)
    parser.add_argument("--skip-beamline", action="store_true")
    parser.add_argument("--random-nano", action="store_true")
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="beam-check-")
    model_dir = args.model
    if model_dir is None and args.random_nano:
        model_dir = os.path.join(work, "model")
        write_random_nano(model_dir, args.seed)
    elif model_dir is None:
        model_dir = os.path.join(work, "model")
        subprocess.run([args.beamline, "make-model", "--preset", args.preset, "--out", model_dir,
                        "--seed", str(args.seed)], check=True)
    config = BeamConfig.load(os.path.join(model_dir, "config.json"))
    rng = np.random.default_rng(args.seed)
    tokens = rng.integers(0, config.vocab_size, size=args.tokens).tolist()
    print(f"model {model_dir}: {config.num_hidden_layers} layers, {args.tokens} random tokens")

    results = {"numpy": beam_numpy.forward(beam_numpy.read_config(model_dir), beam_numpy.read_checkpoint(model_dir),
                                           tokens)}
    from_torch = torch_logits(model_dir, tokens)
    if from_torch is not None:
        results["torch"] = from_torch
    if not args.skip_beamline:
        out = os.path.join(work, "logits.npy")
        command = args.logits_cmd.format(beamline=shlex.quote(args.beamline), model=shlex.quote(model_dir),
                                         tokens=",".join(map(str, tokens)), out=shlex.quote(out))
        subprocess.run(command, shell=True, check=True)
        results["beamline"] = np.load(out).astype(np.float64).reshape(len(tokens), -1)
    ok = True
    names = list(results)
    for other in names[1:]:
        ok &= compare(other, results[other], "numpy", results["numpy"], args.tolerance)
    if len(names) < 2:
        sys.exit("nothing to compare: no torch and --skip-beamline")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
