#!/usr/bin/env python3
"""Checks of the GPU runs (bench/gpu_check.sh, gpu_two.sh, gpu_eight.sh), printed as Markdown table rows; exit 1 when a
check fails.

  compare_logits.py logits CUDA.npy CPU.npy NAME         same argmax at >= 99% of positions, relative error <= 2e-2
  compare_logits.py logits-bf16 CUDA.npy CPU.npy NAME    the same for --dtype bfloat16 on the GPU (activations rounded
                                                            to BF16 at every matrix unit): >= 90%, <= 1e-1
  compare_logits.py decode LOGITS.npy PROMPT_LEN IDS NAME  greedy ids decoded step by step (IDS, comma-separated)
                                                            equal the argmax of one-shot prefill logits over
                                                            prompt + ids (teacher forcing)
  compare_logits.py parallel MANY.npy ONE.npy NAME       a sharded run (--tensor-parallel-size ...) against one process,
                                                            float32: relative error <= 1e-5, same argmax at >= 99%
  compare_logits.py parallel-bf16 MANY.npy ONE.npy NAME  the same in bfloat16 (both runs round to BF16, in different
                                                            summation orders): same argmax at >= 99%, <= 1e-1
"""
import sys

import numpy as np

ARGMAX_AGREEMENT = 0.99
RELATIVE_ERROR = 2e-2
# One BF16 rounding per matrix input (2^-9 relative) over a few layers of a random model; a wrong kernel is off by ~1.
BF16_ARGMAX_AGREEMENT = 0.90
BF16_RELATIVE_ERROR = 1e-1
# Sharded against whole in float32: the same products, summed in another order (tests/parallel measure ~3e-7 on the CPU).
PARALLEL_RELATIVE_ERROR = 1e-5


def row(name, measured, limit, passed):
    print(f"| {name} | {measured} | {limit} | {'pass' if passed else '**FAIL**'} |")
    return passed


def compare_logits(cuda_path, cpu_path, name, min_agreement=ARGMAX_AGREEMENT, max_error=RELATIVE_ERROR):
    cuda, cpu = np.load(cuda_path).astype(np.float64), np.load(cpu_path).astype(np.float64)
    if cuda.shape != cpu.shape:
        return row(name, f"shapes {cuda.shape} vs {cpu.shape}", "equal shapes", False)
    if np.isnan(cuda).any() or np.isnan(cpu).any():
        return row(name, "NaN in the logits", "no NaN", False)
    agreement = float(np.mean(cuda.argmax(axis=-1) == cpu.argmax(axis=-1)))
    error = float(np.linalg.norm(cuda - cpu) / np.linalg.norm(cpu))
    ok = agreement >= min_agreement and error <= max_error
    return row(name, f"argmax agreement {agreement:.4f} over {cuda.shape[0]} positions, rel. error {error:.2e}",
               f">= {min_agreement}, <= {max_error:.0e}", ok)


def compare_decode(logits_path, prompt_length, ids_text, name):
    logits = np.load(logits_path)
    ids = [int(t) for t in ids_text.strip().split(",") if t]
    prompt_length = int(prompt_length)
    # Position prompt_length - 1 + i predicts generated token i.
    predicted = logits[prompt_length - 1:prompt_length - 1 + len(ids)].argmax(axis=-1).tolist()
    matches = sum(int(a == b) for a, b in zip(predicted, ids))
    return row(name, f"{matches} of {len(ids)} decoded tokens equal the prefill argmax", "all", matches == len(ids))


def main(argv):
    if len(argv) >= 5 and argv[1] == "logits":
        return compare_logits(argv[2], argv[3], argv[4])
    if len(argv) >= 5 and argv[1] == "logits-bf16":
        return compare_logits(argv[2], argv[3], argv[4], BF16_ARGMAX_AGREEMENT, BF16_RELATIVE_ERROR)
    if len(argv) >= 5 and argv[1] == "parallel":
        return compare_logits(argv[2], argv[3], argv[4], ARGMAX_AGREEMENT, PARALLEL_RELATIVE_ERROR)
    if len(argv) >= 5 and argv[1] == "parallel-bf16":
        return compare_logits(argv[2], argv[3], argv[4], ARGMAX_AGREEMENT, BF16_RELATIVE_ERROR)
    if len(argv) >= 6 and argv[1] == "decode":
        return compare_decode(argv[2], argv[3], argv[4], argv[5])
    print(__doc__, file=sys.stderr)
    return False


if __name__ == "__main__":
    sys.exit(0 if main(sys.argv) else 1)
