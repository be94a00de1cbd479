// `beamline bench serve` against a stand-in server whose timings are known, and against `beamline serve` on the
// default model (beam-nano, CPU): vLLM's summary table
// and result JSON, with figures that agree with the server's own /metrics counters, for the completions and the
// chat backends; a wrong model fails at the initial test request, naming the server's answer.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import http from 'node:http';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { BEAMLINE, metrics, metricValue, startServer } from './server_harness.mjs';

const run = promisify(execFile);
const repoRoot = join(dirname(fileURLToPath(import.meta.url)), '..', '..');

// The counters a benchmark must agree with: its requests, prompt tokens and generated tokens.
async function counters(base) {
  const { samples } = await metrics(base);
  let requests = 0;
  for (const [key, value] of samples) if (key.startsWith('vllm:request_success_total{')) requests += value;
  return {
    requests,
    prompt: metricValue(samples, 'vllm:prompt_tokens_total') ?? samples.get('vllm:prompt_tokens_total'),
    generated: metricValue(samples, 'vllm:generation_tokens_total') ?? samples.get('vllm:generation_tokens_total'),
  };
}

function summaryValue(stdout, label) {
  const line = stdout.split('\n').find((l) => l.startsWith(label));
  assert.ok(line, `no "${label}" line in:\n${stdout}`);
  return Number(line.slice(label.length).trim());
}

// A stand-in OpenAI server with known timings: each streamed completion waits TTFT_MS, then sends TOKENS chunks of
// one token ITL_MS apart, a usage chunk and [DONE]. It records what it was sent and how many requests overlapped.
const TTFT_MS = 120;
const ITL_MS = 40;
const TOKENS = 5;
function startMockServer() {
  const seen = { bodies: [], active: 0, peak: 0 };
  const server = http.createServer((request, response) => {
    let body = '';
    request.on('data', (chunk) => { body += chunk; });
    request.on('end', async () => {
      if (request.url === '/v1/models') {
        response.end(JSON.stringify({ object: 'list', data: [{ id: 'mock-model', object: 'model' }] }));
        return;
      }
      if (request.url !== '/v1/completions') {  // e.g. /metrics: this server has none
        response.writeHead(404).end();
        return;
      }
      const payload = JSON.parse(body);
      seen.bodies.push(payload);
      seen.peak = Math.max(seen.peak, ++seen.active);
      response.writeHead(200, { 'Content-Type': 'text/event-stream' });
      const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
      await sleep(TTFT_MS);
      for (let i = 0; i < TOKENS; ++i) {
        if (i > 0) await sleep(ITL_MS);
        response.write(`data: ${JSON.stringify({ choices: [{ index: 0, text: 'tok ', finish_reason: null }] })}\n\n`);
        response.write(': keep-alive\n\n');  // comments are no chunks
      }
      response.write(`data: ${JSON.stringify({ choices: [], usage: {
        prompt_tokens: payload.prompt.length, completion_tokens: TOKENS, total_tokens: payload.prompt.length + TOKENS } })}\n\n`);
      response.end('data: [DONE]\n\n');
      --seen.active;
    });
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve({ server, seen, port: server.address().port })));
}

test('against a stand-in server with known timings: TTFT, ITL, TPOT and E2EL as it paced them', async () => {
  const mock = await startMockServer();
  const dir = mkdtempSync(join(tmpdir(), 'beamline-bench-mock-'));
  try {
    const { stdout } = await run(BEAMLINE, ['bench', 'serve', '--base-url', `http://127.0.0.1:${mock.port}`,
      '--num-prompts', '6', '--random-input-len', '10', '--random-output-len', String(TOKENS), '--ignore-eos',
      '--max-concurrency', '2', '--percentile-metrics', 'ttft,tpot,itl,e2el', '--save-result', '--result-dir', dir,
      '--result-filename', 'mock.json']);
    const result = JSON.parse(readFileSync(join(dir, 'mock.json'), 'utf8'));
    assert.equal(result.model_id, 'mock-model', 'the model comes from /v1/models');
    assert.equal(result.completed, 6);
    assert.equal(result.total_input_tokens, 6 * 10);
    assert.equal(result.total_output_tokens, 6 * TOKENS);
    assert.equal(mock.seen.bodies.length, 6 + 1, 'six requests and the initial test request');
    assert.ok(mock.seen.peak <= 2, `--max-concurrency 2 but ${mock.seen.peak} requests overlapped`);
    assert.equal(result.max_concurrent_requests, 2);
    for (const body of mock.seen.bodies) {
      assert.equal(body.model, 'mock-model');
      assert.equal(body.max_tokens, TOKENS);
      assert.equal(body.ignore_eos, true);
      assert.equal(body.stream, true);
      assert.deepEqual(body.stream_options, { include_usage: true });
      assert.equal(body.prompt.length, 10);
    }
    // Timers on a busy CI machine run late, never early: each figure lies between its pace and a margin above it.
    const within = (value, low, what) => assert.ok(value >= low * 0.95 && value < low + 150, `${what} ${value} ms, paced ${low} ms`);
    within(result.mean_ttft_ms, TTFT_MS, 'mean TTFT');
    within(result.median_itl_ms, ITL_MS, 'median ITL');
    within(result.mean_tpot_ms, ITL_MS, 'mean TPOT');
    within(result.mean_e2el_ms, TTFT_MS + (TOKENS - 1) * ITL_MS, 'mean E2EL');
    // Three rounds of two requests each.
    assert.ok(result.duration >= 3 * (TTFT_MS + (TOKENS - 1) * ITL_MS) / 1000 * 0.95, `duration ${result.duration} s`);
    assert.ok(Math.abs(result.request_throughput - 6 / result.duration) < 1e-9);
    assert.equal(summaryValue(stdout, 'Successful requests:'), 6);
    assert.equal(result.prefix_cache_hit_rate, null, 'no /metrics here: no hit rate');
    assert.ok(!stdout.includes('Prefix cache hit rate'));
  } finally {
    mock.server.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('--lora-modules: each request names one of the adapters, drawn by --seed', async () => {
  const mock = await startMockServer();
  try {
    const args = ['bench', 'serve', '--base-url', `http://127.0.0.1:${mock.port}`, '--num-prompts', '24',
      '--random-input-len', '4', '--random-output-len', String(TOKENS), '--lora-modules', 'sql', 'math', 'chat',
      '--seed', '3'];
    await run(BEAMLINE, args);
    // The first body is the initial test request, which names the base model as vLLM's does.
    const models = (bodies) => bodies.slice(1).map((body) => body.model);
    const first = models(mock.seen.bodies);
    assert.equal(mock.seen.bodies[0].model, 'mock-model');
    assert.equal(first.length, 24);
    assert.deepEqual([...new Set(first)].sort(), ['chat', 'math', 'sql']);
    mock.seen.bodies.length = 0;
    await run(BEAMLINE, args);
    assert.deepEqual(models(mock.seen.bodies).sort(), [...first].sort(), 'the same draw for the same --seed');
  } finally {
    mock.server.close();
  }
});

test('a --max-concurrency sweep: one run and one JSON per level, and the sweep table', async () => {
  const mock = await startMockServer();
  const dir = mkdtempSync(join(tmpdir(), 'beamline-bench-sweep-'));
  try {
    const { stdout } = await run(BEAMLINE, ['bench', 'serve', '--base-url', `http://127.0.0.1:${mock.port}`,
      '--num-prompts', '4', '--random-input-len', '8', '--random-output-len', String(TOKENS), '--max-concurrency', '1,4',
      '--save-result', '--result-dir', dir]);
    assert.equal(stdout.match(/Serving Benchmark Result/g).length, 2);
    const files = readdirSync(dir).sort();
    assert.deepEqual(files.filter((f) => f.endsWith('.json')).map((f) => f.replace(/-\d{8}-\d{6}\.json$/, '')),
                     ['vllm-infqps-concurrency1-mock-model', 'vllm-infqps-concurrency4-mock-model']);
    const tsv = files.find((f) => f.endsWith('.tsv'));
    const rows = readFileSync(join(dir, tsv), 'utf8').trim().split('\n').map((line) => line.split('\t'));
    assert.equal(rows[0][0], 'max_concurrency');
    assert.deepEqual(rows.slice(1).map((row) => row[0]), ['1', '4']);
    const column = (name) => rows[0].indexOf(name);
    // Four requests one at a time take about four times as long as all four at once.
    const throughput = rows.slice(1).map((row) => Number(row[column('request_throughput')]));
    assert.ok(throughput[1] > 2 * throughput[0], `request throughput at 1 and 4: ${throughput}`);
    await assert.rejects(run(BEAMLINE, ['bench', 'serve', '--base-url', `http://127.0.0.1:${mock.port}`,
      '--num-prompts', '1', '--max-concurrency', '1,x']), (error) => {
      assert.match(error.stderr + error.stdout, /--max-concurrency: 'x' is not a positive count/);
      return true;
    });
  } finally {
    mock.server.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

describe('beamline bench serve', () => {
  let server;
  let resultDir;

  before(async () => {
    server = await startServer(null, [], { cwd: repoRoot });
    resultDir = mkdtempSync(join(tmpdir(), 'beamline-bench-'));
  });

  after(async () => {
    await server.stop();
    rmSync(resultDir, { recursive: true, force: true });
  });

  test('completions: the summary and JSON agree with the server\'s /metrics', async () => {
    const before = await counters(server.base);
    const { stdout } = await run(BEAMLINE, ['bench', 'serve', '--base-url', server.base, '--num-prompts', '8',
      '--random-input-len', '32', '--random-output-len', '8', '--ignore-eos', '--max-concurrency', '4',
      '--percentile-metrics', 'ttft,tpot,itl,e2el', '--metric-percentiles', '50,99', '--save-result', '--save-detailed',
      '--result-dir', resultDir, '--result-filename', 'completions.json']);
    const afterRun = await counters(server.base);
    assert.match(stdout, /^=+ Serving Benchmark Result =+$/m);
    assert.equal(summaryValue(stdout, 'Successful requests:'), 8);
    assert.equal(summaryValue(stdout, 'Failed requests:'), 0);
    assert.equal(summaryValue(stdout, 'Total input tokens:'), 8 * 32);
    assert.equal(summaryValue(stdout, 'Total generated tokens:'), 8 * 8);
    for (const label of ['Mean TTFT (ms):', 'Median TPOT (ms):', 'P99 ITL (ms):', 'P50 E2EL (ms):']) {
      assert.ok(summaryValue(stdout, label) > 0, label);
    }

    const result = JSON.parse(readFileSync(join(resultDir, 'completions.json'), 'utf8'));
    assert.equal(result.completed, 8);
    assert.equal(result.failed, 0);
    assert.equal(result.model_id, 'beam-nano');
    assert.equal(result.request_rate, 'inf');
    assert.equal(result.max_concurrency, 4);
    assert.ok(result.max_concurrent_requests >= 1 && result.max_concurrent_requests <= 4, result.max_concurrent_requests);
    assert.equal(result.total_input_tokens, 8 * 32);
    assert.equal(result.total_output_tokens, 8 * 8);
    assert.equal(result.output_lens.length, 8);
    // One ITL per chunk with text after the first: at most one per token after the first (a chunk may carry
    // several tokens, a token may carry no text of its own).
    assert.ok(result.itls.every((itl) => itl.length >= 1 && itl.length <= 7), JSON.stringify(result.itls));
    for (const key of ['mean_ttft_ms', 'median_tpot_ms', 'p99_itl_ms', 'p50_e2el_ms', 'std_e2el_ms']) {
      assert.ok(result[key] > 0, key);
    }
    assert.ok(result.p99_e2el_ms >= result.p50_e2el_ms);
    assert.ok(Math.abs(result.output_throughput - result.total_output_tokens / result.duration) < 1e-6);
    // The server counted the same work, plus the initial test request (the first prompt again).
    assert.equal(afterRun.requests - before.requests, 8 + 1);
    assert.equal(afterRun.generated - before.generated, 8 * 8 + 8);
    assert.equal(afterRun.prompt - before.prompt, 8 * 32 + 32);
  });

  test('chat backend with Poisson arrivals; the default file name', async () => {
    const { stdout } = await run(BEAMLINE, ['bench', 'serve', '--backend', 'openai-chat', '--host', '127.0.0.1',
      '--port', String(server.port), '--model', 'beam-nano', '--num-prompts', '4', '--random-input-len', '16',
      '--random-output-len', '6', '--ignore-eos', '--request-rate', '20', '--save-result', '--result-dir', resultDir]);
    assert.equal(summaryValue(stdout, 'Successful requests:'), 4);
    assert.equal(summaryValue(stdout, 'Total generated tokens:'), 4 * 6);
    assert.equal(summaryValue(stdout, 'Request rate configured (RPS):'), 20);
    const file = readdirSync(resultDir).find((name) => name.startsWith('openai-chat-20.0qps-beam-nano-'));
    assert.ok(file, readdirSync(resultDir).join(', '));
    const result = JSON.parse(readFileSync(join(resultDir, file), 'utf8'));
    assert.equal(result.endpoint_type, 'openai-chat');
    assert.equal(result.request_rate, 20);
    assert.equal(result.ttfts, undefined, 'per-request lists only with --save-detailed');
  });

  test('multi-turn sessions: every turn sent, the server\'s prefix-cache hit rate reported', async () => {
    const { stdout } = await run(BEAMLINE, ['bench', 'serve', '--backend', 'openai-chat', '--base-url', server.base,
      '--dataset-name', 'multi-turn', '--num-sessions', '3', '--num-turns', '3', '--random-input-len', '24',
      '--random-output-len', '8', '--max-concurrency', '3', '--save-result', '--result-dir', resultDir,
      '--result-filename', 'multi-turn.json']);
    assert.equal(summaryValue(stdout, 'Successful requests:'), 3 * 3);
    const result = JSON.parse(readFileSync(join(resultDir, 'multi-turn.json'), 'utf8'));
    assert.equal(result.completed, 9);
    // Turns 2 and 3 resend the conversation so far: much of their prompt is cached. The default model's block drafter
    // recomputes its window (128 tokens) behind a cache hit (docs/speculative-decoding.md), so not most of it.
    assert.ok(result.prefix_cache_hit_rate > 0.2, `hit rate ${result.prefix_cache_hit_rate}`);
    assert.equal(summaryValue(stdout, 'Prefix cache hit rate (%):').toFixed(2), (100 * result.prefix_cache_hit_rate).toFixed(2));
  });

  test('a wrong model fails at the initial test request, with the server\'s answer', async () => {
    await assert.rejects(
      run(BEAMLINE, ['bench', 'serve', '--base-url', server.base, '--model', 'nope', '--num-prompts', '2']),
      (error) => {
        assert.notEqual(error.code, 0);
        assert.match(error.stderr + error.stdout, /initial test run failed: HTTP 404.*model_not_found/s);
        return true;
      });
  });
});
