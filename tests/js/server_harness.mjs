// Starts `beamline serve` on a random tiny model for the end-to-end tests, and small HTTP helpers.
import { spawn, execFileSync } from 'node:child_process';
import http from 'node:http';
import net from 'node:net';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export const BEAMLINE = process.env.BEAMLINE_EXE;
if (!BEAMLINE) throw new Error('set BEAMLINE_EXE to the beamline binary');

// A random tiny checkpoint (weights, tokenizer.json, generation_config.json, harmony.json) in a temp dir.
export function makeTinyModel(name = 'tiny') {
  const root = mkdtempSync(join(tmpdir(), 'beamline-serve-'));
  const dir = join(root, name);
  execFileSync(BEAMLINE, ['make-model', '--preset', 'tiny', '--out', dir, '--seed', '3'], { stdio: 'pipe' });
  return { dir, cleanup: () => rmSync(root, { recursive: true, force: true }) };
}

// Starts the server on a free port (--port 0; the port is read from its start-up log line).
// modelDir null serves the default model (models/beam-nano), from the `cwd` given in options.
export async function startServer(modelDir, extraArgs = [], options = {}) {
  const args = ['serve', ...(modelDir ? ['--model', modelDir] : []), '--port', '0', '--max-model-len', '4096',
    '--kv-cache-memory', '64M', '--block-size', '8', ...extraArgs];
  const proc = spawn(BEAMLINE, args, { stdio: ['ignore', 'pipe', 'pipe'], cwd: options.cwd });
  let log = '';
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server did not start in 60 s:\n${log}`)), 60000);
    const onData = (chunk) => {
      log += chunk.toString();
      const match = log.match(/at http:\/\/[^:]+:(\d+)\/v1/);
      if (match) {
        clearTimeout(timer);
        resolve(Number(match[1]));
      }
    };
    proc.stdout.on('data', onData);
    proc.stderr.on('data', onData);
    proc.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`server exited with ${code} before listening:\n${log}`));
    });
  });
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
  proc.stdout.on('data', (chunk) => { log += chunk.toString(); });
  proc.stderr.on('data', (chunk) => { log += chunk.toString(); });
  return {
    proc,
    port,
    base: `http://127.0.0.1:${port}`,
    exited,
    log: () => log,
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGTERM');
      return exited;
    },
  };
}

// safetensors: an 8-byte little-endian header length, the JSON header, the data. Read as name -> {dtype, shape, bytes}.
export function readTensors(file) {
  const bytes = readFileSync(file);
  const length = Number(bytes.readBigUInt64LE(0));
  const header = JSON.parse(bytes.subarray(8, 8 + length).toString());
  const data = bytes.subarray(8 + length);
  const tensors = new Map();
  for (const [name, entry] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    const [begin, end] = entry.data_offsets;
    tensors.set(name, { dtype: entry.dtype, shape: entry.shape, bytes: data.subarray(begin, end) });
  }
  return tensors;
}
const elementBytes = { F32: 4, BF16: 2, F16: 2 };
export function writeTensors(file, tensors) {
  // Widest elements first, so every tensor's data stays aligned to its elements.
  const names = [...tensors.keys()].sort((a, b) => elementBytes[tensors.get(b).dtype] - elementBytes[tensors.get(a).dtype]);
  const header = {};
  let offset = 0;
  for (const name of names) {
    const { dtype, shape, bytes } = tensors.get(name);
    header[name] = { dtype, shape, data_offsets: [offset, offset + bytes.length] };
    offset += bytes.length;
  }
  let json = JSON.stringify(header);
  json += ' '.repeat((8 - (json.length % 8)) % 8);  // spaces are allowed; the data starts aligned
  const length = Buffer.alloc(8);
  length.writeBigUInt64LE(BigInt(json.length));
  writeFileSync(file, Buffer.concat([length, Buffer.from(json), ...names.map((name) => tensors.get(name).bytes)]));
}
export async function postJson(base, path, body, headers = {}) {
  const response = await fetch(base + path, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await response.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* checked by the caller */ }
  return { status: response.status, text, json };
}

// Prometheus text → Map of 'name{labels}' → number.
export function parseMetrics(text) {
  const samples = new Map();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const space = line.lastIndexOf(' ');
    samples.set(line.slice(0, space), Number(line.slice(space + 1)));
  }
  return samples;
}

export async function metrics(base) {
  const response = await fetch(base + '/metrics');
  const text = await response.text();
  return { text, samples: parseMetrics(text) };
}

// The value of a metric whose labels contain `labelFilter` (first match).
export function metricValue(samples, name, labelFilter = '') {
  for (const [key, value] of samples) {
    if (key.startsWith(name + '{') && key.includes(labelFilter)) return value;
  }
  return undefined;
}

export async function waitFor(condition, timeoutMs, what) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await condition()) return;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

// Reads an SSE response to its end: the parsed `data:` JSON events and whether [DONE] came last.
export async function readSse(response) {
  const text = await response.text();
  const events = [];
  let done = false;
  for (const block of text.split('\n\n')) {
    for (const line of block.split('\n')) {
      if (!line.startsWith('data: ')) continue;
      const data = line.slice(6);
      if (data === '[DONE]') { done = true; continue; }
      assertNotAfterDone(done);
      events.push(JSON.parse(data));
    }
  }
  return { events, done };
}

function assertNotAfterDone(done) {
  if (done) throw new Error('an SSE event came after [DONE]');
}

// A streaming POST over its own TCP connection (node:http, no pooling limit): resolves to readSse's result.
export function rawStream(port, body, path = '/v1/completions') {
  return new Promise((resolve, reject) => {
    const request = http.request({
      host: '127.0.0.1', port, path, method: 'POST', agent: false,
      headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) },
    }, (response) => {
      let text = '';
      response.setEncoding('utf8');
      response.on('data', (chunk) => { text += chunk; });
      response.on('end', () => {
        if (response.statusCode !== 200) reject(new Error(`HTTP ${response.statusCode}: ${text}`));
        else resolve(readSse({ text: async () => text }));
      });
      response.on('error', reject);
    });
    request.on('error', reject);
    request.end(body);
  });
}

// Raw bytes on a fresh connection; resolves to what the server wrote before closing (or after `timeoutMs`, for
// requests the server still waits to complete).
export function rawExchange(port, bytes, timeoutMs = 2000) {
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1');
    let answer = '';
    const timer = setTimeout(() => socket.destroy(), timeoutMs);
    socket.on('data', (chunk) => { answer += chunk.toString('latin1'); });
    socket.on('error', () => {});
    socket.on('close', () => { clearTimeout(timer); resolve(answer); });
    socket.write(bytes);
  });
}
