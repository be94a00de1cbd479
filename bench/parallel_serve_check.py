#!/usr/bin/env python3
"""Serving checks of a sharded server for bench/gpu_two.sh (python3 stdlib only), on serve_check.py's machinery
(server start, the 32 greedy /v1/completions requests, the comparison rows):

- float32 compute and KV cache, `beamline serve --tensor-parallel-size N`: the 32 requests sent all at once equal
  the same requests sent one at a time, token for token (100%); the lone answers' first 16 tokens against one
  process's (--tensor-parallel-size 1) at >= 90% (two summation orders: near-ties may flip);
- the last worker rank killed (SIGKILL) while 4 requests stream: the server exits with a non-zero status within 60 s
  and its log names the rank; every one of the 4 streams ends within that time with an error (an error event, an
  HTTP error or a cut connection), none with a normal end and none left hanging.

Prints Markdown table rows (4).

  parallel_serve_check.py BEAMLINE_BINARY MODEL_DIR [DEVICE] [--tensor-parallel-size N] [--log FILE]
  (DEVICE cuda by default, cpu for the dry run; N 2 by default; --log: where the servers' output goes, else a
  temporary file)
"""
import json
import os
import re
import signal
import sys
import tempfile
import threading
import time
import urllib.request

from serve_check import BACKENDS_AGREE, MAX_TOKENS, REQUESTS, equal_row, make_prompts, print_row, run_all, \
    start_server, with_server

STREAMS = 4
EXIT_WITHIN = 60  # seconds after the kill


# One streamed completion long enough to be cut: how it ended ("finished", "error event: ...", "cut: ...") and the
# chunks it received, in `outcome` (a dict the caller reads).
def stream_until_cut(port, model, prompt, outcome):
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 8192, "temperature": 0, "ignore_eos": True,
                       "stream": True}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    outcome["chunks"] = 0
    try:
        with urllib.request.urlopen(request, timeout=EXIT_WITHIN + 30) as response:
            for line in response:
                line = line.strip()
                if line == b"data: [DONE]":
                    outcome["end"] = "finished"
                    return
                if not line.startswith(b"data: "):
                    continue
                chunk = json.loads(line[len(b"data: "):])
                if "error" in chunk:
                    outcome["end"] = f"error event: {json.dumps(chunk['error'])[:120]}"
                    return
                outcome["chunks"] += 1
        outcome["end"] = "cut: the stream closed without [DONE]"
    except Exception as error:  # an HTTP error or a cut connection: what the client is meant to see
        outcome["end"] = f"cut: {type(error).__name__}: {str(error)[:80]}"


def killed_worker_rows(binary, model, device, ranks, log_path, prompts):
    victim = ranks - 1
    port = 8353
    with open(log_path, "a") as log:
        log.write(f"\n=== killed worker: serve --tensor-parallel-size {ranks}, rank {victim} gets SIGKILL ===\n")
        log.flush()
        start = os.path.getsize(log_path)
        server = start_server(binary, model, device, port, "float32", ["--tensor-parallel-size", str(ranks)], log)
    try:
        with open(log_path) as f:
            f.seek(start)
            found = re.search(rf"rank {victim} of {ranks} ready \(pid (\d+)\)", f.read())
        if not found:
            print_row(f"serve --tensor-parallel-size {ranks}: rank {victim} killed mid-stream, the server exits",
                      f"no 'rank {victim} of {ranks} ready (pid ...)' line in the log", "exit naming the rank", False)
            return print_row(f"serve --tensor-parallel-size {ranks}: in-flight streams end with errors",
                             "not run: no worker pid", f"{STREAMS} of {STREAMS} errors", False)
        served = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10).read())
        model_name = served["data"][0]["id"]
        outcomes = [{} for _ in range(STREAMS)]
        threads = [threading.Thread(target=stream_until_cut, args=(port, model_name, prompts[i], outcomes[i]),
                                    daemon=True) for i in range(STREAMS)]
        for thread in threads:
            thread.start()
        deadline = time.time() + 60
        while time.time() < deadline and min(o.get("chunks", 0) for o in outcomes) < 2:
            time.sleep(0.05)
        streaming = sum(o.get("chunks", 0) >= 2 for o in outcomes)
        killed_at = time.time()
        os.kill(int(found.group(1)), signal.SIGKILL)
        try:
            status = server.wait(timeout=EXIT_WITHIN)
        except Exception:
            status = None
        exit_seconds = time.time() - killed_at
        for thread in threads:
            thread.join(timeout=max(1.0, killed_at + EXIT_WITHIN - time.time()))
        with open(log_path) as f:
            f.seek(start)
            named = re.search(rf"rank {victim}\b.*(exited|signal|failed|died|lost)", f.read())
        exited = status is not None and status != 0
        ok = print_row(f"serve --tensor-parallel-size {ranks} --dtype float32: rank {victim} killed while {streaming} "
                       f"of {STREAMS} requests stream: the server exits naming the rank",
                       (f"exit {status} after {exit_seconds:.1f} s" if status is not None else
                        f"still running after {EXIT_WITHIN} s") +
                       (f"; log: `{named.group(0)[:100]}`" if named else "; no log line names the rank"),
                       f"non-zero exit within {EXIT_WITHIN} s, rank {victim} named", exited and named is not None)
        ends = [o.get("end", "hung (no end)") for o in outcomes]
        errors = sum(end.startswith(("cut", "error event")) for end in ends)
        kinds = "; ".join(sorted(set(ends)))
        return ok & print_row(f"serve --tensor-parallel-size {ranks}: the {STREAMS} in-flight streams end with errors",
                              f"{errors} of {STREAMS} errors ({kinds})",
                              f"{STREAMS} of {STREAMS} within {EXIT_WITHIN} s, none hanging, "
                              f"{STREAMS} streaming at the kill",
                              errors == STREAMS and streaming == STREAMS)
    finally:
        if server.poll() is None:
            server.terminate()  # mpirun ends every rank on SIGTERM
            server.wait()


def main(binary, model, device, ranks, log_path):
    vocab = json.load(open(os.path.join(model, "config.json")))["vocab_size"]
    prompts = make_prompts(vocab)
    parallel = ["--tensor-parallel-size", str(ranks)]
    with open(log_path, "a") as log:
        together, alone = with_server(binary, model, device, 8351, "float32", parallel,
                                      lambda p: (run_all(p, prompts, concurrent=True), run_all(p, prompts, False)),
                                      log)
        one_process = with_server(binary, model, device, 8352, "float32", [],
                                  lambda p: run_all(p, prompts, concurrent=False), log)
    title = f"serve --device {device} --dtype float32 --tensor-parallel-size {ranks}"
    ok = equal_row(f"{title}: {REQUESTS} concurrent vs one at a time (greedy, {MAX_TOKENS} tokens)", together, alone,
                   1.0)
    ok &= equal_row(f"{title}: one at a time vs one process (--tensor-parallel-size 1), first 16 tokens", alone,
                    one_process, BACKENDS_AGREE, 16)
    ok &= killed_worker_rows(binary, model, device, ranks, log_path, prompts)
    return ok


if __name__ == "__main__":
    args = sys.argv[1:]
    options = {"--tensor-parallel-size": "2", "--log": os.path.join(tempfile.mkdtemp(), "servers.log")}
    for flag in options:
        if flag in args:
            at = args.index(flag)
            options[flag] = args[at + 1]
            del args[at:at + 2]
    if len(args) not in (2, 3):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    device = args[2] if len(args) == 3 else "cuda"
    sys.exit(0 if main(args[0], args[1], device, int(options["--tensor-parallel-size"]), options["--log"]) else 1)
