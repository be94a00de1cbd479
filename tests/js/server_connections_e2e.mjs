// Connections must not cost threads (issue 22): with 1,000 idle connections and 32 slow streaming readers held open,
// /health answers within 500 ms every time and the server's thread count stays where it was before them; idle
// connections are closed after the keep-alive timeout; the HTTP layer's own refusals (400, 404, 405, 413, 431) are
// OpenAI error JSON, and clients that leave as their stream ends are not counted as 400; --http-threads out of range
// is refused naming the range.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import net from 'node:net';
import { BEAMLINE, makeTinyModel, metrics, metricValue, rawExchange, startServer, waitFor } from './server_harness.mjs';

const IDLE_CONNECTIONS = 1000;
const SLOW_STREAMS = 32;
const HEALTH_PROBES = 20;
const HEALTH_LIMIT_MS = 500;
// Threads the server may add under this load over its warmed-up count (none are expected: the event-loop threads and
// the worker pool exist from the start).
const THREAD_SLACK = 4;
const LEAVING_STREAMS = 400;
const LEAVING_AT_ONCE = 16;

function threadCount(pid) {
  return Number(readFileSync(`/proc/${pid}/status`, 'utf8').match(/^Threads:\s+(\d+)/m)[1]);
}

function connect(port) {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, '127.0.0.1', () => resolve(socket));
    socket.once('error', reject);
  });
}

function assertErrorAnswer(answer, status, what) {
  assert.match(answer, new RegExp(`^HTTP/1\\.1 ${status} `), `${what}: ${answer.slice(0, 200)}`);
  assert.match(answer, /content-type: application\/json/i, `${what}: ${answer.slice(0, 300)}`);
  const json = JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4));
  assert.equal(typeof json.error?.message, 'string', what);
  for (const key of ['type', 'param', 'code']) assert.ok(key in json.error, `${what}: error.${key} missing`);
  return json;
}

// A streaming completion read a few bytes at a time: the socket is paused, and resumed for a moment every 300 ms.
function slowStream(port, index) {
  const body = JSON.stringify({ prompt: `story ${index}`, max_tokens: 48, ignore_eos: true, stream: true });
  const socket = net.connect(port, '127.0.0.1');
  let text = '';
  const done = new Promise((resolve, reject) => {
    socket.on('data', (chunk) => {
      text += chunk.toString();
      socket.pause();
    });
    socket.on('error', reject);
    socket.on('close', () => resolve(text));
  });
  const trickle = setInterval(() => socket.resume(), 300);
  socket.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n` +
    `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
  return { done: done.finally(() => clearInterval(trickle)), text: () => text };
}

// A keep-alive streaming completion whose client hangs up once it has read the chunk with the finish_reason, so that
// its leaving races the server's writing of the stream's end; every other one resets the connection instead of
// closing it.
function leavingStream(port, index) {
  const body = JSON.stringify({ prompt: `leave ${index}`, max_tokens: 1 + (index % 4), ignore_eos: true,
    stream: true });
  const socket = net.connect(port, '127.0.0.1');
  let text = '';
  return new Promise((resolve) => {
    socket.on('data', (chunk) => {
      text += chunk.toString();
      if (!/"finish_reason":"/.test(text)) return;
      if (index % 2) socket.resetAndDestroy(); else socket.destroy();
    });
    socket.on('error', () => {});
    socket.on('close', () => resolve(text));
    socket.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
      `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
  });
}

describe('connections', () => {
  let model;
  let server;

  before(async () => {
    model = makeTinyModel('tiny');
    server = await startServer(model.dir, ['--max-request-body-bytes', '64K']);
  });

  after(async () => {
    const { code } = await server.stop();
    model.cleanup();
    assert.equal(code, 0, `server exit code after SIGTERM\n${server.log()}`);
  });

  test(`${IDLE_CONNECTIONS} idle connections and ${SLOW_STREAMS} slow streams cost no threads; /health stays fast`, async (t) => {
    // Warm up: the first request starts whatever the engine starts lazily.
    const warm = await fetch(`${server.base}/v1/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: 'warm', max_tokens: 2 }),
    });
    assert.equal(warm.status, 200);
    await warm.text();
    const pid = server.proc.pid;
    const baseline = threadCount(pid);

    const idle = await Promise.all(Array.from({ length: IDLE_CONNECTIONS }, () => connect(server.port)));
    let idleClosed = 0;
    for (const socket of idle) {
      socket.on('close', () => { ++idleClosed; });
      socket.on('error', () => {});
    }
    const streams = Array.from({ length: SLOW_STREAMS }, (_, i) => slowStream(server.port, i));

    const healthTimes = [];
    let peakThreads = threadCount(pid);
    for (let probe = 0; probe < HEALTH_PROBES; ++probe) {
      const start = performance.now();
      const response = await fetch(`${server.base}/health`);
      healthTimes.push(performance.now() - start);
      assert.equal(response.status, 200);
      peakThreads = Math.max(peakThreads, threadCount(pid));
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    const metricsStart = performance.now();
    assert.equal((await fetch(`${server.base}/metrics`)).status, 200);
    const metricsMs = performance.now() - metricsStart;
    t.diagnostic(`threads: ${baseline} warmed up, ${peakThreads} at most under load; /health max ` +
      `${Math.max(...healthTimes).toFixed(1)} ms over ${HEALTH_PROBES} probes; /metrics ${metricsMs.toFixed(1)} ms; ` +
      `idle connections closed meanwhile: ${idleClosed}`);
    for (const ms of healthTimes) assert.ok(ms < HEALTH_LIMIT_MS, `/health took ${ms.toFixed(1)} ms: ${healthTimes}`);
    assert.ok(metricsMs < HEALTH_LIMIT_MS, `/metrics took ${metricsMs.toFixed(1)} ms`);
    assert.ok(peakThreads <= baseline + THREAD_SLACK, `threads grew from ${baseline} to ${peakThreads}`);

    const texts = await Promise.all(streams.map((stream) => stream.done));
    for (const text of texts) assert.match(text, /data: \[DONE\]\n\n\r\n0\r\n\r\n$/, JSON.stringify(text.slice(-200)));
    // The keep-alive timeout (5 s) closes connections that send nothing.
    await waitFor(async () => idleClosed === IDLE_CONNECTIONS, 20000, 'every idle connection closed by the server');
    await waitFor(async () => {
      const { samples } = await metrics(server.base);
      return metricValue(samples, 'vllm:num_requests_running') === 0 &&
        metricValue(samples, 'vllm:kv_cache_usage_perc') === 0;
    }, 30000, 'nothing running and every KV block free');
  });

  test(`${LEAVING_STREAMS} clients leaving as their streams end are not counted as malformed requests`, async () => {
    const count400 = async () => metricValue((await metrics(server.base)).samples, 'beamline:http_responses_total',
      'code="400"') ?? 0;
    const refused = await count400();
    for (let first = 0; first < LEAVING_STREAMS; first += LEAVING_AT_ONCE) {
      const leaving = Array.from({ length: LEAVING_AT_ONCE }, (_, i) => leavingStream(server.port, first + i));
      const texts = await Promise.all(leaving);
      for (const text of texts) assert.match(text, /^HTTP\/1\.1 200 /, text.slice(0, 200));
    }
    // A connection whose client left is closed, never read from again as if it had sent a malformed request.
    assert.equal(await count400(), refused, 'beamline:http_responses_total{code="400"} grew');
    assert.equal((await fetch(`${server.base}/health`)).status, 200);
  });

  test('the HTTP layer refuses with OpenAI error JSON: 400, 404, 405, 413, 431', async () => {
    const port = server.port;
    const bad = assertErrorAnswer(await rawExchange(port, 'GARBAGE\r\n\r\n'), 400, 'a malformed request line');
    assert.match(bad.error.message, /malformed HTTP request/);
    assertErrorAnswer(await rawExchange(port, 'GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n'), 404, 'an unknown path');
    const wrong = await rawExchange(port, 'GET /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n');
    assertErrorAnswer(wrong, 405, 'GET on a POST path');
    assert.match(wrong, /allow: POST/i);
    const big = 'x'.repeat(100 << 10);
    assertErrorAnswer(await rawExchange(port, `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: ${big.length}\r\n\r\n${big}`),
      413, 'a body over --max-request-body-bytes');
    assertErrorAnswer(await rawExchange(port, `GET /health HTTP/1.1\r\nHost: x\r\nX-Junk: ${'y'.repeat(100 << 10)}\r\n\r\n`),
      431, 'a header over the limit');
    assert.equal((await fetch(`${server.base}/health`)).status, 200);
  });

  test('--http-threads out of range is refused naming the range', () => {
    for (const value of ['0', '65', '8192']) {
      const run = spawnSync(BEAMLINE, ['serve', '--model', model.dir, '--port', '0', '--http-threads', value],
        { encoding: 'utf8', timeout: 60000 });
      assert.notEqual(run.status, 0, `--http-threads ${value} was accepted`);
      assert.match(run.stdout + run.stderr, new RegExp(`--http-threads ${value}: must be 1 to 64`),
        run.stdout + run.stderr);
    }
  });
});
