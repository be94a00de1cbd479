#!/usr/bin/env python3
"""train.py --init-from and carry_checkpoint.py on the CPU (about 30 s): continuing a run from a carried checkpoint.

  PYTHONPATH=<dir with the regex module> /usr/bin/python3 tools/train/test_init_from.py

1. train.py trains the smoke config 2 steps and saves (BF16, router F32); the file is split into parts as gpu_run.sh
   returns it;
2. carry_checkpoint.py converts the parts folder to bf16 (lossless here) and int8;
3. train.py --init-from the bf16 copy, one step at learning rate 0 and bias rate 0, saves: every tensor equals the
   first run's (the loaded weights are the saved ones); its log says the optimizer starts fresh;
4. the int8 copy loads within half a step of each row's scale, an F32 checkpoint's bf16 copy within BF16 rounding;
5. --init-from under another --config stops naming the first differing key (hidden_size); a tensor of another shape,
   a BF16 router and a missing row scale are refused naming the tensor.
"""
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
import carry_checkpoint  # noqa: E402
import safetensors_io  # noqa: E402
from beam_config import BeamConfig  # noqa: E402
from beam_torch import BeamForCausalLM  # noqa: E402

TOKENIZER = os.path.join(ROOT, "models", "beam-nano", "tokenizer.json")
TRAIN = [sys.executable, os.path.join(HERE, "train.py"), "--tokenizer", TOKENIZER, "--config", "smoke",
         "--device", "cpu", "--examples", "200", "--heldout", "20", "--ood", "20", "--no-compile", "--workers", "2",
         "--batch-tokens", "4000"]


def train(out, *extra):
    run = subprocess.run(TRAIN + ["--out", out] + list(extra), capture_output=True, text=True)
    return run.returncode, run.stdout + run.stderr


def model_from(directory):
    model = BeamForCausalLM(BeamConfig.load(os.path.join(directory, "config.json")))
    carry_checkpoint.load_into(model, directory)
    return model


def refused(what, fn, words):
    try:
        fn()
    except ValueError as error:
        ok = all(w in str(error) for w in words)
        print(f"{what}: refused ({error}): {'ok' if ok else 'FAILED (should name ' + ', '.join(words) + ')'}")
        return ok
    print(f"{what}: FAILED (accepted)")
    return False


def main():
    failures = 0
    work = tempfile.mkdtemp(prefix="test-init-from.")
    try:
        first = os.path.join(work, "first")
        rc, log = train(first, "--max-steps", "2")
        if rc:
            print(log)
            print("FAILED: the first training run")
            return 1
        parts = os.path.join(work, "parts")
        os.makedirs(parts)
        data = open(os.path.join(first, "model.safetensors"), "rb").read()
        for i, start in enumerate(range(0, len(data), 300000)):
            with open(os.path.join(parts, f"model.safetensors.part-a{chr(97 + i)}"), "wb") as f:
                f.write(data[start:start + 300000])
        shutil.copyfile(os.path.join(first, "config.json"), os.path.join(parts, "config.json"))
        copies = {}
        for fmt in ("bf16", "int8"):
            copies[fmt] = os.path.join(work, fmt)
            run = subprocess.run([sys.executable, os.path.join(HERE, "carry_checkpoint.py"), parts, copies[fmt],
                                  "--format", fmt], capture_output=True, text=True)
            print(run.stdout.strip())
            if not os.path.exists(os.path.join(copies[fmt], "model.safetensors")):
                print(run.stderr)
                print(f"FAILED: carry_checkpoint.py --format {fmt}")
                return 1

        resumed = os.path.join(work, "resumed")
        rc, log = train(resumed, "--init-from", copies["bf16"], "--max-steps", "1", "--lr", "0", "--bias-rate", "0",
                        "--seed", "2")
        saved, again = (safetensors_io.load(os.path.join(d, "model.safetensors")) for d in (first, resumed))
        same = rc == 0 and saved.keys() == again.keys() and all(
            saved[n].dtype == again[n].dtype and np.array_equal(saved[n].array, again[n].array) for n in saved)
        fresh = "optimizer state starts fresh" in log
        print(f"resumed from the bf16 copy of the parts ({len(saved)} tensors): weights as saved "
              f"{'ok' if same else 'FAILED'}; log says the optimizer starts fresh {'ok' if fresh else 'FAILED'}")
        if not (same and fresh):
            print(log)
        failures += not (same and fresh)

        reference = model_from(first).state_dict()
        int8 = model_from(copies["int8"]).state_dict()
        stored = safetensors_io.load(os.path.join(copies["int8"], "model.safetensors"))
        worst, ok = 0.0, True
        for name, value in reference.items():
            if stored[name].dtype == "I8":
                step = torch.tensor(stored[name + carry_checkpoint.SCALE_SUFFIX].array)[:, None]
                error = float(((int8[name] - value).abs() / step).max())
                worst = max(worst, error)
                ok &= error <= 0.5 + 1e-3
            else:
                ok &= torch.equal(int8[name], value)
        print(f"int8 copy: matrices within {worst:.3f} of a step (<= 0.5), the rest exact: {'ok' if ok else 'FAILED'}")
        failures += not ok

        wide = os.path.join(work, "f32")
        os.makedirs(wide)
        shutil.copyfile(os.path.join(first, "config.json"), os.path.join(wide, "config.json"))
        generator = torch.Generator().manual_seed(3)
        f32 = {n: v * (1 + 1e-3 * torch.randn(v.shape, generator=generator)) for n, v in reference.items()}
        safetensors_io.save(os.path.join(wide, "model.safetensors"),
                            {n: safetensors_io.Tensor("F32", v.numpy()) for n, v in f32.items()})
        carry_checkpoint.write(wide, copies["bf16"], "bf16")
        narrow = model_from(copies["bf16"]).state_dict()
        relative = max(float(((narrow[n] - v).abs() / v.abs().clamp_min(1e-30)).max()) for n, v in f32.items()
                       if not n.endswith(("gate.weight", "e_score_correction_bias")))
        router = all(torch.equal(narrow[n], v) for n, v in f32.items()
                     if n.endswith(("gate.weight", "e_score_correction_bias")))
        ok = relative <= 2.0 ** -8 and router
        print(f"F32 checkpoint's bf16 copy: within {relative:.2e} relative (<= 2^-8), router F32 exact: "
              f"{'ok' if ok else 'FAILED'}")
        failures += not ok

        rc, log = train(os.path.join(work, "wrong"), "--init-from", copies["bf16"], "--config", "v2")
        ok = rc != 0 and "key hidden_size" in log and "Traceback" not in log
        print(f"--config v2 from a smoke checkpoint: stopped ({log.strip().splitlines()[-1]}): "
              f"{'ok' if ok else 'FAILED'}")
        failures += not ok

        model = BeamForCausalLM(BeamConfig.load(os.path.join(first, "config.json")))
        tensors = safetensors_io.load(os.path.join(first, "model.safetensors"))

        def with_tensors(changed):
            directory = os.path.join(work, "changed")
            os.makedirs(directory, exist_ok=True)
            shutil.copyfile(os.path.join(first, "config.json"), os.path.join(directory, "config.json"))
            safetensors_io.save(os.path.join(directory, "model.safetensors"), {**tensors, **changed})
            return lambda: carry_checkpoint.load_into(model, directory)

        q = "model.layers.1.self_attn.q_proj.weight"
        failures += not refused("a q_proj of another shape", with_tensors(
            {q: safetensors_io.Tensor("BF16", tensors[q].array[:-1])}), [q, "expected", "BF16"])
        router = "model.layers.3.mlp.gate.weight"
        failures += not refused("a BF16 router", with_tensors(
            {router: safetensors_io.Tensor("BF16", safetensors_io.float32_to_bf16_bits(tensors[router].array))}),
            [router, "expected F32"])
        failures += not refused("I8 without its row scales", with_tensors(
            {q: safetensors_io.Tensor("I8", np.zeros(tensors[q].array.shape, np.int8))}), [q, "row_scale"])
    finally:
        shutil.rmtree(work)
    print("FAILED" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
