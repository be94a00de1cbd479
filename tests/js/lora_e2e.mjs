// LoRA adapters as vLLM serves them (docs/lora.md), against `beamline serve --enable-lora` on a random tiny MoE model
// on the CPU: --lora-modules at start, /v1/load_lora_adapter and /v1/unload_lora_adapter with vLLM's bodies, adapters
// in /v1/models with their parent, a request choosing its adapter by `model` (through the official openai client too),
// concurrent requests of two adapters and the base model equal to each alone, and bad adapters refused naming the file
// and the key or tensor.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import { makeTinyModel, postJson, readTensors, startServer, writeTensors } from './server_harness.mjs';

const model = makeTinyModel('tiny');
const root = mkdtempSync(join(tmpdir(), 'beamline-lora-'));
after(() => {
  rmSync(root, { recursive: true, force: true });
  model.cleanup();
});
const shapes = new Map([...readTensors(join(model.dir, 'model.safetensors'))].map(([name, t]) => [name, t.shape]));

// A deterministic stream of values in [-scale, scale).
function values(count, seed, scale) {
  const out = Buffer.alloc(4 * count);
  let state = seed >>> 0;
  for (let i = 0; i < count; ++i) {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
    out.writeFloatLE(scale * (state / 2 ** 31 - 1), 4 * i);
  }
  return out;
}

// A PEFT adapter directory: adapter_config.json and adapter_model.safetensors (F32) for `modules`; `edit` may change
// the config or the tensors afterwards.
function writeAdapter(name, { rank = 4, modules, seed = 1, config = {}, edit = () => {} }) {
  const dir = join(root, name);
  mkdirSync(dir);
  const targets = [...new Set(modules.map((m) => m.split('.').pop()))];
  writeFileSync(join(dir, 'adapter_config.json'), JSON.stringify({
    peft_type: 'LORA', r: rank, lora_alpha: 2 * rank, target_modules: targets, bias: 'none', ...config,
  }));
  const tensors = new Map();
  modules.forEach((module, i) => {
    const [out, inFeatures] = shapes.get(`${module}.weight`);
    tensors.set(`base_model.model.${module}.lora_A.weight`,
      { dtype: 'F32', shape: [rank, inFeatures], bytes: values(rank * inFeatures, seed * 100 + 2 * i, 0.5) });
    tensors.set(`base_model.model.${module}.lora_B.weight`,
      { dtype: 'F32', shape: [out, rank], bytes: values(out * rank, seed * 100 + 2 * i + 1, 0.1) });
  });
  edit(tensors);
  writeTensors(join(dir, 'adapter_model.safetensors'), tensors);
  return dir;
}

// Attention of layer 1, the dense MLP of layer 0, and every expert of layer 2 (MoE LoRA).
const everything = [
  'model.layers.1.self_attn.q_proj', 'model.layers.1.self_attn.v_proj', 'model.layers.1.self_attn.o_proj',
  'model.layers.0.mlp.gate_proj', 'model.layers.0.mlp.down_proj',
  ...Array.from({ length: 8 }, (_, e) => ['gate_proj', 'up_proj', 'down_proj'].map((p) => `model.layers.2.mlp.experts.${e}.${p}`)).flat(),
];
const a1 = writeAdapter('a1', { modules: everything, seed: 1 });
const a2 = writeAdapter('a2', { modules: everything, seed: 2, rank: 8 });
const tooLarge = writeAdapter('large', { modules: everything.slice(0, 2), rank: 16 });
const unknownModule = writeAdapter('unknown', {
  modules: everything.slice(0, 1),
  edit: (tensors) => tensors.set('base_model.model.model.layers.1.self_attn.qkv_proj.lora_A.weight',
    { dtype: 'F32', shape: [4, 64], bytes: values(256, 9, 0.1) }),
});
const wrongShape = writeAdapter('shape', {
  modules: everything.slice(0, 1),
  edit: (tensors) => {
    const name = 'base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight';
    tensors.set(name, { dtype: 'F32', shape: [63, 4], bytes: values(252, 7, 0.1) });
  },
});

const server = await startServer(model.dir, ['--enable-lora', '--max-loras', '2', '--max-lora-rank', '8',
  '--lora-modules', `a1=${a1}`]);
after(() => server.stop());

async function greedy(name, prompt) {
  const reply = await postJson(server.base, '/v1/completions',
    { model: name, prompt, max_tokens: 6, temperature: 0, logprobs: 0, return_token_ids: true });
  assert.equal(reply.status, 200, reply.text);
  assert.equal(reply.json.model, name);  // vLLM reports the adapter's name
  return { ids: reply.json.choices[0].token_ids, logprobs: reply.json.choices[0].logprobs.token_logprobs };
}
const prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [11, 12, 13], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52]];

test('--lora-modules adapters are listed in /v1/models with their parent', async () => {
  const models = await (await fetch(`${server.base}/v1/models`)).json();
  assert.deepEqual(models.data.map((m) => m.id), ['tiny', 'a1']);
  const card = models.data[1];
  assert.equal(card.parent, 'tiny');
  assert.equal(card.root, a1);
  assert.equal(card.object, 'model');
});

test('a request chooses its adapter by model; the adapter changes the answer', async () => {
  const client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'unused' });
  const viaClient = await client.completions.create({ model: 'a1', prompt: prompts[0], max_tokens: 6, temperature: 0, logprobs: 0 });
  const direct = await greedy('a1', prompts[0]);
  assert.deepEqual(viaClient.choices[0].logprobs.token_logprobs, direct.logprobs);
  const base = await greedy('tiny', prompts[0]);
  assert.notDeepEqual(base.logprobs, direct.logprobs);
  const chat = await postJson(server.base, '/v1/chat/completions',
    { model: 'a1', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 });
  assert.equal(chat.status, 200, chat.text);
  assert.equal(chat.json.model, 'a1');
});

test('load, use and unload with vLLM\'s bodies; concurrent adapters equal each alone', async () => {
  const loaded = await postJson(server.base, '/v1/load_lora_adapter', { lora_name: 'a2', lora_path: a2 });
  assert.equal(loaded.status, 200, loaded.text);
  assert.match(loaded.text, /Success: LoRA adapter 'a2' added/);
  const names = ['a1', 'tiny', 'a2'];
  const alone = [];
  for (const name of names) for (const prompt of prompts) alone.push(await greedy(name, prompt));
  const together = await Promise.all(names.flatMap((name) => prompts.map((prompt) => greedy(name, prompt))));
  assert.deepEqual(together, alone);
  assert.notDeepEqual(alone[0].logprobs, alone[6].logprobs);  // a1 and a2 differ

  const unloaded = await postJson(server.base, '/v1/unload_lora_adapter', { lora_name: 'a2' });
  assert.equal(unloaded.status, 200, unloaded.text);
  const gone = await postJson(server.base, '/v1/completions', { model: 'a2', prompt: [1, 2], max_tokens: 2 });
  assert.equal(gone.status, 404, gone.text);
  assert.equal(gone.json.error.code, 'model_not_found');
  // Its slot is free again.
  const again = await postJson(server.base, '/v1/load_lora_adapter', { lora_name: 'a2b', lora_path: a2 });
  assert.equal(again.status, 200, again.text);
  assert.deepEqual((await greedy('a2b', prompts[2])).logprobs, alone[8].logprobs);
  assert.equal((await postJson(server.base, '/v1/unload_lora_adapter', { lora_name: 'a2b' })).status, 200);
});

test('bad loads and unloads are refused naming the field, the file and the key or tensor', async () => {
  const cases = [
    [{ lora_name: 'a1', lora_path: a2 }, 400, 'lora_name', /already been loaded/],
    [{ lora_path: a2 }, 400, 'lora_name', /lora_name/],
    [{ lora_name: 'x' }, 400, 'lora_path', /lora_path/],
    [{ lora_name: 'large', lora_path: tooLarge }, 400, 'lora_path', /adapter_config\.json: key "r": rank 16 exceeds --max-lora-rank 8/],
    [{ lora_name: 'unknown', lora_path: unknownModule }, 400, 'lora_path', /adapter_model\.safetensors: tensor "base_model\.model\.model\.layers\.1\.self_attn\.qkv_proj\.lora_A\.weight"/],
    [{ lora_name: 'shape', lora_path: wrongShape }, 400, 'lora_path', /q_proj\.lora_B\.weight" has shape \[63, 4\], expected \[64, 4\]/],
    [{ lora_name: 'missing', lora_path: join(root, 'missing') }, 400, 'lora_path', /adapter_config\.json: cannot open/],
  ];
  for (const [body, status, param, message] of cases) {
    const reply = await postJson(server.base, '/v1/load_lora_adapter', body);
    assert.equal(reply.status, status, `${JSON.stringify(body)}: ${reply.text}`);
    assert.equal(reply.json.error.param, param, reply.text);
    assert.match(reply.json.error.message, message);
  }
  const unknown = await postJson(server.base, '/v1/unload_lora_adapter', { lora_name: 'nope' });
  assert.equal(unknown.status, 404, unknown.text);
  // Two slots (--max-loras 2): a1 and one more.
  assert.equal((await postJson(server.base, '/v1/load_lora_adapter', { lora_name: 'b', lora_path: a2 })).status, 200);
  const full = await postJson(server.base, '/v1/load_lora_adapter', { lora_name: 'c', lora_path: a2 });
  assert.equal(full.status, 400, full.text);
  assert.match(full.json.error.message, /--max-loras 2/);
  // Failed loads left nothing behind.
  const models = await (await fetch(`${server.base}/v1/models`)).json();
  assert.deepEqual(models.data.map((m) => m.id), ['tiny', 'a1', 'b']);
});
