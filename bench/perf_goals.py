#!/usr/bin/env python3
"""Issue 21's goal table from one bench/gpu_perf.sh call: one row per goal, measured, goal, met or short by how much,
the peer measured in the same call, and what (measured in the same call) limits the row.

Reads the steps' outputs that gpu_perf.sh leaves in its perf/ folder (roof.txt, moe.txt, moe-peers.txt,
attention-decode.txt, attention-prefill.txt, attention-peers.txt, serve.txt, op-times-serve.txt, op-times-decode.txt,
profile.txt, and steps.tsv: each step's exit status and seconds) and prints the Markdown table. A row whose
measurement, peer or limit did not run says "not run" and why (the step's exit status, or the row missing from its
output); the exit status is then 1, after the table and the JSON are written. --dry-run (gpu_perf.sh's run without
a GPU) marks every row "not run".

Usage: python3 bench/perf_goals.py PERF_DIR [--json FILE] [--dry-run]   (exit 2: an output it cannot read)
"""
import argparse
import json
import math
import os
import re
import sys
import traceback

HBM = 4.8e12  # bytes per second: the floors' bandwidth
PREFILL_FLOOR_MS = 67.1  # GEMM FLOPs of an 8,192-token prefill step of the 8-layer model / 758 TFLOP/s
STEP_FLOOR_BYTES = 8292925440  # what a batch-1 decode step of the 8-layer model must read
NOT_RUN = "not run"


class Missing(Exception):
    """A value the row needs did not come out of its step."""


def number(cell):
    """The first number of a table cell ("4.02 TB/s", "84%", "33,907")."""
    match = re.search(r"-?\d[\d,]*\.?\d*(?:e[-+]?\d+)?", cell)
    if not match:
        raise Missing(f"no number in '{cell}'")
    return float(match.group(0).replace(",", ""))


def tables(text):
    """Every Markdown table of `text`, as (header cells, list of row dicts). A log line (a server's, on stderr, in the
    same output) between two rows does not end a table; a header row (one followed by its --- row) starts one."""
    runs, run = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            run.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif not (run and re.match(r"\[\d{4}-\d\d-\d\d ", line)):
            runs.append(run)
            run = []

    def separator(cells):
        return all(set(cell) <= set("-: ") for cell in cells)

    found = []
    for run in runs:
        starts = [i for i in range(len(run) - 1) if separator(run[i + 1]) and not separator(run[i])]
        for start, end in zip(starts, starts[1:] + [len(run)]):
            header = run[start]
            rows = [dict(zip(header, row)) for row in run[start + 2:end] if len(row) == len(header)]
            found.append((header, rows))
    return found


class Step:
    """One step's output and exit status."""

    def __init__(self, folder, name, statuses):
        self.name = name
        self.status = statuses.get(name)
        path = os.path.join(folder, f"{name}.txt")
        self.text = open(path, errors="replace").read() if os.path.exists(path) else ""

    def why_not(self):
        if self.status is None:
            return f"step {self.name} was not in this call"
        if self.status == "budget":
            return f"step {self.name}: the budget was spent"
        if self.status.startswith("skipped"):
            return f"step {self.name} {self.status}"
        if self.status != "0":
            return f"step {self.name} exited {self.status}"
        return f"step {self.name} ran without this row"

    def table(self, column):
        """The rows of the first table that has `column` in its header."""
        for header, rows in tables(self.text):
            if column in header:
                return rows
        raise Missing(self.why_not())

    def row(self, column, value):
        """The row of the table with `column` whose `column` equals `value`."""
        for row in self.table(column):
            if row.get(column) == value:
                return row
        raise self.missing(value)

    def missing(self, what):
        return Missing(f"{self.why_not()}: {what}" if self.status == "0" else self.why_not())

    def search(self, pattern):
        match = re.search(pattern, self.text, re.MULTILINE)
        if not match:
            raise Missing(self.why_not())
        return match


def attempt(compute):
    """compute()'s text, or "not run (why)"."""
    try:
        return compute()
    except Missing as missing:
        return f"{NOT_RUN} ({missing})"


class Goals:
    def __init__(self, folder):
        statuses = {}
        steps_file = os.path.join(folder, "steps.tsv")
        if os.path.exists(steps_file):
            for line in open(steps_file):
                fields = line.rstrip("\n").split("\t")
                if len(fields) >= 2:
                    statuses[fields[0]] = fields[1]
        names = ("roof", "moe", "moe-peers", "attention-decode", "attention-prefill", "attention-peers", "serve",
                 "op-times-serve", "op-times-decode", "profile")
        self.steps = {name: Step(folder, name, statuses) for name in names}
        self.rows = []

    # ---- the measured limits ----

    def roof(self, bytes_read):
        """(TB/s, MB) of the read roof at the byte count nearest `bytes_read` (on a log scale)."""
        rows = self.steps["roof"].table("read roof: bytes read")
        best = min(rows, key=lambda r: abs(math.log(number(r["read roof: bytes read"]) * 1e6 / bytes_read)))
        return number(best["TB/s"]), number(best["read roof: bytes read"])

    def roof_text(self, bytes_read, achieved_tbs):
        tbs, mb = self.roof(bytes_read)
        return (f"read roof {tbs:.2f} TB/s at {mb:.0f} MB ({tbs * 1e12 / HBM:.2f} of 4.8); ours {achieved_tbs:.2f} "
                f"TB/s = {achieved_tbs / tbs:.2f} of the roof")

    def gemm(self, work_prefix):
        """(cuBLAS ms, TFLOP/s, TFLOP) of the roof's GEMM set whose work starts with `work_prefix`."""
        for row in self.steps["roof"].table("GEMM roof: work"):
            if row["GEMM roof: work"].startswith(work_prefix):
                return number(row["cuBLAS ms"]), number(row["TFLOP/s"]), number(row["TFLOP"])
        raise self.steps["roof"].missing(work_prefix)

    def op_shares(self, step, skip=(), top=4):
        """The op timer's top ops by share, and its line on gaps between ops."""
        rows = [r for r in self.steps[step].table("share of op time") if r["op"] not in skip]
        if not rows:
            raise Missing(f"step {step}: no op timed")
        total = sum(number(r["total ms"]) for r in rows)
        ops = ", ".join(f"{r['op']} {100 * number(r['total ms']) / total:.0f}%" for r in rows[:top])
        gaps = self.steps[step].search(r"gaps shorter than .*?, ([\d.]+)% of ops \+ gaps").group(1)
        return ops, gaps

    # ---- rows ----

    def add(self, work, measured, goal, verdict, peer, limit):
        self.rows.append({"work": work, "measured": measured, "goal": goal, "verdict": verdict, "peer": peer,
                          "limit": limit})

    def moe(self, tokens):
        """Our bfloat16 MoE row at `tokens`."""
        for row in self.steps["moe"].table("route ms (graph)"):
            if row["tokens"] == str(tokens) and row["dtype"] == "bfloat16":
                return row
        raise self.steps["moe"].missing(f"{tokens} tokens")

    def moe_limit(self, tokens):
        row = self.moe(tokens)
        ms, route = number(row["MoE ms (route + experts, graph)"]), number(row["route ms (graph)"])
        floor_ms, router_floor = number(row["floor ms"]), number(row["router floor ms"])
        expert_bytes = (floor_ms - router_floor) * 1e-3 * HBM
        expert_tbs = expert_bytes / ((ms - route) * 1e-3) / 1e12
        text = (f"route {route:.4f} ms ({100 * route / ms:.0f}% of the layer); experts {ms - route:.3f} ms at "
                f"{expert_tbs:.2f} TB/s; ")
        text += attempt(lambda: (lambda roof: f"read roof {roof[0]:.2f} TB/s at {roof[1]:.0f} MB "
                                              f"({roof[0] * 1e12 / HBM:.2f} of 4.8): the layer's bytes at the roof "
                                              f"take {floor_ms * HBM / (roof[0] * 1e12):.3f} ms")(
            self.roof(floor_ms * 1e-3 * HBM)))
        if tokens >= 1024:
            def flops():
                gemm_ms, gemm_tflops, tflop = self.gemm(f"MoE {tokens} tokens")
                return (f"; {tflop / (ms * 1e-3):.0f} TFLOP/s; cuBLAS on the same FLOPs as dense GEMMs "
                        f"{gemm_ms:.2f} ms ({gemm_tflops:.0f} TFLOP/s)")
            text += attempt(flops)
        return text

    def moe_peer(self, tokens, as_ratio):
        def compute():
            row = self.steps["moe-peers"].row("tokens", str(tokens))
            ms, ratio = number(row["PyTorch MoE ms (route + experts)"]), number(row["floor / time"])
            return f"PyTorch {ms:.3f} ms ({ratio:.2f} of its floor, {row['experts hit']} experts)" if as_ratio \
                else f"PyTorch {ms:.2f} ms"
        return attempt(compute)

    def at_most(self, work, value, goal, goal_text, peer, limit):
        verdict = "**met**" if value <= goal else f"short: {100 * (value / goal - 1):.0f}% over ({value / goal:.2f}×)"
        self.add(work, f"{value:.3f} ms", goal_text, verdict, peer, limit)

    def at_least(self, work, value, goal, measured, goal_text, peer, limit):
        verdict = "**met**" if value >= goal else \
            f"short: {100 * (1 - value / goal):.0f}% below ({value / goal:.2f}× the goal)"
        self.add(work, measured, goal_text, verdict, peer, limit)

    def row_or_not_run(self, work, goal_text, build):
        try:
            build()
        except Missing as missing:
            self.add(work, f"{NOT_RUN} ({missing})", goal_text, NOT_RUN, "", "")

    def build(self):
        def moe_one():
            ms = number(self.moe(1)["MoE ms (route + experts, graph)"])
            self.at_most("MoE layer, 1 token, all-in (route + experts, CUDA graph)", ms, 0.150, "≤ 0.150 ms",
                         self.moe_peer(1, True), attempt(lambda: self.moe_limit(1)))
        self.row_or_not_run("MoE layer, 1 token, all-in", "≤ 0.150 ms", moe_one)
        for tokens, goal in ((16, 0.97), (64, 0.97), (256, 0.97), (1024, 0.92)):
            def moe_ratio(tokens=tokens, goal=goal):
                row = self.moe(tokens)
                ratio = number(row["floor / time"])
                self.at_least(f"MoE layer, {tokens} tokens, all-in ({row['experts hit']} experts)", ratio, goal,
                              f"{ratio:.2f} of floor ({number(row['MoE ms (route + experts, graph)']):.3f} ms)",
                              f"≥ {goal:.2f} of floor", self.moe_peer(tokens, True),
                              attempt(lambda: self.moe_limit(tokens)))
            self.row_or_not_run(f"MoE layer, {tokens} tokens, all-in", f"≥ {goal:.2f} of floor", moe_ratio)

        def moe_prefill():
            ms = number(self.moe(8192)["MoE ms (route + experts, graph)"])
            self.at_most("MoE layer, 8,192 tokens (prefill)", ms, 11.3, "≤ 11.3 ms", self.moe_peer(8192, False),
                         attempt(lambda: self.moe_limit(8192)))
        self.row_or_not_run("MoE layer, 8,192 tokens (prefill)", "≤ 11.3 ms", moe_prefill)

        def gemm_roof_text(ours):
            def compute():
                _, tflops, _ = self.gemm("GEMM 8192")
                return f"cuBLAS BF16 GEMM 8192³ {tflops:.0f} TFLOP/s in this call; ours {ours / tflops:.2f} of it"
            return attempt(compute)

        def prefill_attention(work, case, peer_name, factor):
            ours = number(self.steps["attention-prefill"].row("case", case)["achieved"])
            peer = number(self.steps["attention-peers"].row("case", f"{case} ({peer_name})")["achieved"])
            goal_text = f"≥ {'' if factor == 1 else f'{factor:g} × '}{peer_name} ({factor * peer:.0f} TFLOP/s)"
            self.at_least(work, ours, factor * peer, f"{ours:.0f} TFLOP/s",
                          goal_text, f"{peer_name} {peer:.0f} TFLOP/s", gemm_roof_text(ours))

        for work, case, peer_name, factor in (
                ("prefill attention, causal 8K, TFLOP/s", "prefill causal 8K tokens", "SDPA", 1),
                ("sliding-window-512 prefill 32K, TFLOP/s", "prefill window-512 32K tokens", "flex_attention", 2)):
            self.row_or_not_run(work, f"≥ {'' if factor == 1 else f'{factor} × '}{peer_name} in the same call",
                                lambda w=work, c=case, p=peer_name, f=factor: prefill_attention(w, c, p, f))

        for case in ("decode global B=1 L=128K", "decode global B=32 L=8K", "decode global B=128 L=4K"):
            def decode_attention(case=case):
                row = self.steps["attention-decode"].row("case", case)
                ratio = number(row["% of floor"]) / 100
                tbs, kv_bytes = number(row["achieved"]), number(row["bytes or FLOPs"]) * 1e6
                peer = attempt(lambda: "SDPA (unpaged) {:.2f} of floor".format(
                    number(self.steps["attention-peers"].row("case", f"{case} (SDPA)")["% of floor"]) / 100))
                self.at_least(f"paged decode attention {case.removeprefix('decode global ')}", ratio, 0.92,
                              f"{ratio:.2f} of floor ({number(row['ms']):.4f} ms)", "≥ 0.92 of floor", peer,
                              attempt(lambda: self.roof_text(kv_bytes, tbs)))
            self.row_or_not_run(f"paged decode attention {case.removeprefix('decode global ')}", "≥ 0.92 of floor",
                                decode_attention)

        def decode_step():
            serve = self.eight_k_serve()
            ms = number(serve.row("batch", "1")["ms per decode step"])
            self.at_most("8-layer Beam-1.0 decode step, batch 1, 8K context", ms, 2.08, "≤ 2.08 ms",
                         "— (vLLM is not on the GPU machine)", self.decode_step_limit())
        self.row_or_not_run("8-layer Beam-1.0 decode step, batch 1, 8K context", "≤ 2.08 ms", decode_step)

        def prefill():
            rows = self.eight_k_serve().table("prefill tokens/s")
            if not rows:
                raise self.steps["serve"].missing("no batch")
            best = max(rows, key=lambda r: number(r["prefill tokens/s"]))
            rate = number(best["prefill tokens/s"])
            floor_rate = 8192 / (PREFILL_FLOOR_MS * 1e-3)
            self.at_least("prefill throughput, 8K prompts", rate / floor_rate, 0.60,
                          f"{rate / floor_rate:.2f} of floor ({rate:,.0f} tokens/s, batch {best['batch']})",
                          "≥ 0.60 of the GEMM-FLOP floor", "—", self.prefill_limit(rate))
        self.row_or_not_run("prefill throughput, 8K prompts", "≥ 0.60 of the GEMM-FLOP floor", prefill)

    def eight_k_serve(self):
        """The serve step, which the goals need with 8,192-token prompts (SERVE_PROMPT changes them)."""
        serve = self.steps["serve"]
        prompt = int(serve.search(r"; prompt (\d+) tokens").group(1))
        if prompt != 8192:
            raise Missing(f"step serve ran with {prompt}-token prompts, not 8192")
        return serve

    def decode_step_limit(self):
        def replay():
            # The op timer's run has its own step time (serve_throughput's table in the same output): the graph
            # replay's device time against it is the share of the step that the device is not busy with it.
            step = self.steps["op-times-serve"]
            device_ms = number(step.row("op", "graph replay (a whole decode step)")["mean us"]) / 1e3
            timed_ms = number(step.row("batch", "1")["ms per decode step"])
            return (f"device time per step (graph replay) {device_ms:.3f} ms of a {timed_ms:.2f} ms step in the same "
                    f"run ({100 * (1 - device_ms / timed_ms):.0f}% host)")

        def roof():
            tbs, mb = self.roof(STEP_FLOOR_BYTES)
            return (f"the step's bytes at the read roof ({tbs:.2f} TB/s at {mb:.0f} MB): "
                    f"{STEP_FLOOR_BYTES / tbs / 1e9:.2f} ms")

        def eager():
            ops, gaps = self.op_shares("op-times-decode")
            return f"op by op (16-token context): {ops}; gaps between ops {gaps}%"

        def kernels():
            # Optional: the GPU machine may have no Nsight Systems (gpu_perf.sh then skips the step, saying so).
            if (self.steps["profile"].status or "").startswith("skipped"):
                return f"no per-kernel profile ({self.steps['profile'].status})"
            match = self.steps["profile"].search(r"^batch 1: .*?per step \(median\) ([\d.]+) µs .*?, ([\d.]+) µs in "
                                                 r"kernels, ([\d.]+) µs between them")
            span, busy, gap = (float(g) for g in match.groups())
            top = self.steps["profile"].table("µs per step")[:3]
            names = ", ".join(f"{r['kernel']} {number(r['µs per step']):.0f} µs" for r in top)
            return (f"kernels {busy:.0f} µs of a {span:.0f} µs step span ({100 * gap / span:.0f}% between kernels): "
                    f"{names}")

        return "; ".join(attempt(part) for part in (replay, roof, eager, kernels))

    def prefill_limit(self, rate):
        def gemms():
            ms, tflops, tflop = self.gemm("prefill")
            ours_ms = 8192 / rate * 1e3
            return (f"cuBLAS on the step's GEMMs {ms:.1f} ms for 8,192 tokens ({tflops:.0f} TFLOP/s, "
                    f"{PREFILL_FLOOR_MS / ms:.2f} of the floor); ours {ours_ms:.1f} ms per 8,192 tokens "
                    f"({tflop / ours_ms * 1e3:.0f} TFLOP/s of GEMM work)")

        def ops():
            top, gaps = self.op_shares("op-times-serve", skip=("graph replay (a whole decode step)",))
            return (f"prefill op by op (serve, batch 1, 8K prompt): {top}; gaps between ops (its prefill and decode "
                    f"steps) {gaps}%")

        return "; ".join(attempt(part) for part in (gemms, ops))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--dry-run", action="store_true", help="a run without a GPU: every row is not run")
    args = parser.parse_args()
    goals = Goals(args.folder)
    try:
        goals.build()
    except Exception as error:  # a format this script does not know: say so, apart from "not run" (exit 1)
        traceback.print_exc()
        print(f"perf_goals: cannot read the steps' outputs in {args.folder}: {error!r}", file=sys.stderr)
        return 2
    if args.dry_run:
        for row in goals.rows:
            row["verdict"] = f"{NOT_RUN} (dry run without a GPU)"
    print("## Goals (issue 21)\n")
    print("| work | measured | goal | met? | peer, same call | measured limit |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in goals.rows:
        print(f"| {row['work']} | {row['measured']} | {row['goal']} | {row['verdict']} | {row['peer'] or '—'} | "
              f"{row['limit'] or '—'} |")
    not_run = [row["work"] for row in goals.rows
               if any(NOT_RUN in row[k] for k in ("measured", "verdict", "peer", "limit"))]
    met = sum(row["verdict"] == "**met**" for row in goals.rows)
    print(f"\n{met} of {len(goals.rows)} goals met; {len(not_run)} row(s) with something not run"
          + (f": {', '.join(not_run)}" if not_run else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": goals.rows, "met": met, "not_run": not_run}, f, indent=1)
    return 1 if not_run else 0


if __name__ == "__main__":
    sys.exit(main())
