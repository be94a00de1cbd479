"""A `beamline serve` process for the Python checks of tools/reference, and a small JSON client (stdlib only)."""
import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

DEFAULT_BEAMLINE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "apps", "beamline",
                                "beamline")


def check_parser(doc):
    """The arguments every check takes (--beamline, --device); the check adds its own."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--beamline", default=DEFAULT_BEAMLINE)
    parser.add_argument("--device", default="cpu")
    return parser


def make_tiny_model(beamline, out, seed):
    """Writes a random checkpoint of make-model's `tiny` preset to `out`; returns `out`."""
    subprocess.run([beamline, "make-model", "--preset", "tiny", "--out", out, "--seed", str(seed)], check=True,
                   capture_output=True)
    return out


def post(base, path, body, stream=False):
    """(status, JSON body); streamed, (status, the list of SSE events' JSON)."""
    request = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            text = response.read().decode()
            status = response.status
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read().decode())
    if not stream:
        return status, json.loads(text)
    events = [json.loads(line[len("data: "):]) for line in text.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    return status, events


def bench_serve_throughput(beamline, base, prompts, input_len, output_len, concurrency, timeout, extra=()):
    """Output tokens/s of one `beamline bench serve` run against the server at `base`: `prompts` random prompts of
    `input_len` ids (100-3000), `output_len` tokens each (eos ignored), at most `concurrency` in flight; `extra` more
    bench serve flags. Exits naming what went wrong when the run fails or prints no throughput."""
    command = [beamline, "bench", "serve", "--base-url", base, "--num-prompts", str(prompts),
               "--random-input-len", str(input_len), "--random-output-len", str(output_len),
               "--random-token-id-range", "100-3000", "--ignore-eos", "--max-concurrency", str(concurrency),
               "--seed", "1", *extra]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        sys.exit(f"bench serve failed:\n{result.stdout}\n{result.stderr}")
    value = re.search(r"^Output token throughput \(tok/s\):\s*([\d.]+)", result.stdout, re.M)
    if value is None:
        sys.exit(f"bench serve printed no 'Output token throughput' line:\n{result.stdout}")
    return float(value.group(1))


def finished_by_engine(base, expected_total, wait_seconds=5.0):
    """{engine label: requests finished} from /metrics (vllm:request_success_total, summed over finish reasons), read
    again until they add up to `expected_total` (an engine's stats are a snapshot up to ~50 ms old while it is busy)
    or `wait_seconds` pass."""
    deadline = time.time() + wait_seconds
    while True:
        with urllib.request.urlopen(base + "/metrics", timeout=30) as response:
            text = response.read().decode()
        counts = {}
        for match in re.finditer(r'^vllm:request_success_total\{[^}]*engine="(\d+)"[^}]*\} ([\d.e+]+)$', text, re.M):
            counts[match.group(1)] = counts.get(match.group(1), 0) + int(float(match.group(2)))
        if sum(counts.values()) >= expected_total or time.time() > deadline:
            return counts
        time.sleep(0.1)


class Server:
    """Serves `model` on a free port (read from the start-up log) until stop(); `env`: environment variables to set
    for it (e.g. CUDA_VISIBLE_DEVICES)."""

    def __init__(self, beamline, model, device, extra, max_model_len=512, kv_cache_memory="64M", env=None):
        args = [beamline, "serve", "--model", model, "--device", device, "--port", "0", "--max-model-len",
                str(max_model_len), "--kv-cache-memory", kv_cache_memory, "--block-size", "8"] + extra
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, **env} if env else None)
        self.log = ""
        deadline = time.time() + 120
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.log += line
            match = re.search(r"at http://[^:]+:(\d+)/v1", line)
            if match:
                self.base = f"http://127.0.0.1:{match.group(1)}"
                # The log keeps being read, so that a full pipe never stalls the server.
                threading.Thread(target=self._drain, daemon=True).start()
                return
        self.stop()
        sys.exit(f"the server did not start:\n{self.log}")

    def _drain(self):
        for line in self.proc.stdout:
            self.log += line

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
