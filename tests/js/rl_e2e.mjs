// The rollout API as an RL framework drives it (SkyRL's remote engine: token ids in through /v1/completions, control
// endpoints over plain HTTP) and SGLang's /generate, against `beamline serve` on random tiny models on the CPU: batched token prompts with
// return_token_ids, --logprobs-mode, /pause /resume /sleep /wake_up /reset_prefix_cache /flush_cache, and
// /update_weights_from_disk, whose answers equal a fresh server's on the new checkpoint and whose bad inputs (unknown
// tensor, wrong shape or dtype, a path outside --weight-update-dir) are refused naming them, old weights kept.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, copyFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import { BEAMLINE, postJson, readTensors, startServer, writeTensors } from './server_harness.mjs';

const root = mkdtempSync(join(tmpdir(), 'beamline-rl-'));
const updates = join(root, 'updates');
mkdirSync(updates);
function makeModel(dir, seed) {
  execFileSync(BEAMLINE, ['make-model', '--preset', 'tiny', '--out', dir, '--seed', String(seed)], { stdio: 'pipe' });
  return dir;
}
const served = makeModel(join(root, 'tiny'), 3);
const step1 = makeModel(join(updates, 'step1'), 4);

// A copy of step1 under updates/ with its tensors edited by `edit(tensors)`.
function brokenUpdate(name, edit) {
  const dir = join(updates, name);
  mkdirSync(dir);
  copyFileSync(join(step1, 'config.json'), join(dir, 'config.json'));
  const tensors = readTensors(join(step1, 'model.safetensors'));
  edit(tensors);
  writeTensors(join(dir, 'model.safetensors'), tensors);
  return dir;
}
const tensorNames = [...readTensors(join(step1, 'model.safetensors')).keys()];
const normName = tensorNames.find((k) => k.endsWith('input_layernorm.weight'));
const routerName = tensorNames.find((k) => k.endsWith('mlp.gate.weight'));
const unknownTensor = brokenUpdate('unknown', (tensors) => {
  tensors.set('model.layers.0.self_attn.q_proj.lora_A.weight', { dtype: 'F32', shape: [1], bytes: Buffer.alloc(4) });
});
const wrongShape = brokenUpdate('shape', (tensors) => {
  const norm = tensors.get(normName);
  tensors.set(normName, { ...norm, shape: [norm.shape[0] / 2], bytes: norm.bytes.subarray(0, norm.bytes.length / 2) });
});
const wrongDtype = brokenUpdate('dtype', (tensors) => {
  // The router must stay F32: sent as BF16 (its upper halves), the update is refused.
  const router = tensors.get(routerName);
  const halves = Buffer.alloc(router.bytes.length / 2);
  for (let i = 0; i < halves.length / 2; ++i) halves.writeUInt16LE(router.bytes.readUInt16LE(4 * i + 2), 2 * i);
  tensors.set(routerName, { ...router, dtype: 'BF16', bytes: halves });
});
after(() => rmSync(root, { recursive: true, force: true }));

const prompts = [[1, 2, 3, 4], [7, 8], [5, 6, 9, 10, 11]];

async function completion(server, body) {
  const reply = await postJson(server.base, '/v1/completions', { model: 'tiny', ...body });
  assert.equal(reply.status, 200, reply.text);
  return reply.json;
}
// Greedy token ids and logprobs of each prompt, one request each.
async function greedy(server) {
  const out = [];
  for (const prompt of prompts) {
    const reply = await completion(server, { prompt, max_tokens: 6, temperature: 0, logprobs: 1, return_token_ids: true });
    out.push({ ids: reply.choices[0].token_ids, logprobs: reply.choices[0].logprobs.token_logprobs });
  }
  return out;
}
const control = (server, path, body) => postJson(server.base, path, body ?? {});

test('token in, token out: batched token-id prompts with return_token_ids (openai client) and SGLang /generate', async () => {
  const server = await startServer(served, ['--weight-update-dir', updates]);
  try {
    const client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'unused' });
    const single = await greedy(server);
    const batch = await client.completions.create({
      model: 'tiny', prompt: prompts, max_tokens: 6, temperature: 0, n: 2, logprobs: 1, return_token_ids: true,
    });
    assert.equal(batch.choices.length, prompts.length * 2);
    for (const choice of batch.choices) {
      const p = Math.floor(choice.index / 2);  // vLLM's numbering: prompt p's samples are p * n .. p * n + n - 1
      assert.deepEqual(choice.prompt_token_ids, prompts[p]);
      assert.deepEqual(choice.token_ids, single[p].ids);
      assert.deepEqual(choice.logprobs.token_logprobs, single[p].logprobs);
    }
    assert.equal(batch.usage.prompt_tokens, prompts.flat().length);  // each prompt once, whatever n
    assert.equal(batch.weight_version, '0');
    // Streamed, the ids come in chunks and the prompt's ids with the first.
    const stream = await client.completions.create({
      model: 'tiny', prompt: prompts[0], max_tokens: 6, temperature: 0, stream: true, return_token_ids: true,
    });
    const ids = [];
    let promptIds = null;
    for await (const chunk of stream) {
      if (chunk.choices[0]?.prompt_token_ids) promptIds = chunk.choices[0].prompt_token_ids;
      ids.push(...(chunk.choices[0]?.token_ids ?? []));
    }
    assert.deepEqual(promptIds, prompts[0]);
    assert.deepEqual(ids, single[0].ids);
    // SGLang's /generate: the same tokens and logprobs, a list for a batch, an object for one prompt.
    const generated = await postJson(server.base, '/generate', {
      input_ids: prompts, sampling_params: { max_new_tokens: 6, temperature: 0 }, return_logprob: true,
    });
    assert.equal(generated.status, 200, generated.text);
    assert.equal(generated.json.length, prompts.length);
    generated.json.forEach((answer, p) => {
      assert.deepEqual(answer.output_ids, single[p].ids);
      assert.deepEqual(answer.meta_info.output_token_logprobs.map(([logprob, id]) => [logprob, id]),
        single[p].ids.map((id, i) => [single[p].logprobs[i], id]));
      assert.deepEqual(answer.meta_info.finish_reason, { type: 'length', length: 6 });
      assert.equal(answer.meta_info.prompt_tokens, prompts[p].length);
      assert.equal(answer.meta_info.weight_version, '0');
    });
    const one = await postJson(server.base, '/generate', { input_ids: prompts[0], sampling_params: { max_new_tokens: 6, temperature: 0 } });
    assert.deepEqual(one.json.output_ids, single[0].ids);
    for (const [body, param, message] of [
      [{ input_ids: [1, 2], sampling_params: { beam_width: 2 } }, 'sampling_params', /sampling_params.beam_width/],
      [{ input_ids: [1, 2], sampling_params: { max_new_tokens: 0 } }, 'sampling_params.max_new_tokens', /max_tokens/],
      [{ input_ids: [[1, 2], [1, 1e9]] }, 'input_ids', /input_ids\[1\]: 1000000000 is not a token id/],
      [{ input_ids: [1], text: 'hi' }, 'input_ids', /exactly one/],
    ]) {
      const reply = await postJson(server.base, '/generate', body);
      assert.equal(reply.status, 400, reply.text);
      assert.equal(reply.json.error.param, param);
      assert.match(reply.json.error.message, message);
    }
    // What is refused, naming the field.
    const cases = [
      [{ prompt: prompts, stream: true, max_tokens: 2 }, 'prompt', /streaming takes one prompt/],
      [{ prompt: [[1, 2], [1, -4]], max_tokens: 2 }, 'prompt', /prompt\[1\]: -4 is not a token id/],
      [{ prompt: [[1, 2], []], max_tokens: 2 }, 'prompt', /prompt\[1\]/],
      [{ prompt: [1, 2], max_tokens: 2, prompt_logprobs: 999 }, 'prompt_logprobs', /between 0 and/],
      [{ prompt: [1, 2], max_tokens: 2, return_routed_experts: true }, 'return_routed_experts',
        /--enable-return-routed-experts/],
    ];
    for (const [body, param, message] of cases) {
      const reply = await postJson(server.base, '/v1/completions', { model: 'tiny', ...body });
      assert.equal(reply.status, 400, reply.text);
      assert.equal(reply.json.error.param, param);
      assert.match(reply.json.error.message, message);
    }
  } finally {
    await server.stop();
  }
});

test('control endpoints: pause (keep, abort, wait), resume, sleep, wake_up, prefix cache resets', async () => {
  const server = await startServer(served, ['--weight-update-dir', updates]);
  try {
    const before = await greedy(server);
    assert.deepEqual((await control(server, '/pause?mode=keep')).json, { status: 'paused' });
    assert.equal((await fetch(`${server.base}/is_paused`).then((r) => r.json())).is_paused, true);
    let done = false;
    const held = completion(server, { prompt: prompts[0], max_tokens: 6, temperature: 0, return_token_ids: true })
      .then((reply) => { done = true; return reply; });
    await new Promise((resolve) => setTimeout(resolve, 300));
    assert.equal(done, false, 'a request sent while paused is held');
    assert.deepEqual((await control(server, '/resume')).json, { status: 'resumed' });
    assert.deepEqual((await held).choices[0].token_ids, before[0].ids);

    // abort: the request in flight ends with finish_reason abort.
    const long = completion(server, { prompt: prompts[1], max_tokens: 3000, ignore_eos: true, temperature: 0 });
    await new Promise((resolve) => setTimeout(resolve, 200));
    assert.equal((await control(server, '/pause', { mode: 'abort' })).status, 200);
    assert.equal((await long).choices[0].finish_reason, 'abort');
    await control(server, '/resume');
    // wait: pause returns once the request in flight has finished (vLLM's older wait_for_inflight_requests).
    const finishing = completion(server, { prompt: prompts[1], max_tokens: 300, ignore_eos: true, temperature: 0 });
    await new Promise((resolve) => setTimeout(resolve, 100));
    assert.equal((await control(server, '/pause?wait_for_inflight_requests=true')).status, 200);
    assert.equal((await finishing).choices[0].finish_reason, 'length');
    await control(server, '/resume');

    // sleep as SkyRL calls it (JSON bodies); wake_up with its default {"tags": 1} wakes everything.
    assert.equal((await control(server, '/sleep', { level: 1 })).status, 200);
    assert.equal((await fetch(`${server.base}/is_sleeping`).then((r) => r.json())).is_sleeping, true);
    assert.equal((await control(server, '/resume')).status, 400, 'asleep: wake_up first');
    assert.equal((await control(server, '/wake_up', { tags: 1 })).status, 200);
    assert.equal((await fetch(`${server.base}/is_sleeping`).then((r) => r.json())).is_sleeping, false);
    assert.equal((await control(server, '/sleep?level=2')).status, 200);
    assert.deepEqual((await control(server, '/wake_up?tags=weights')).json, { status: 'sleeping' });
    assert.deepEqual((await control(server, '/wake_up?tags=kv_cache')).json, { status: 'awake' });
    assert.deepEqual(await greedy(server), before);
    // A request in flight across a sleep: the KV pool goes (one process gives its device memory back), so it is
    // computed again after /wake_up, and gets the tokens it gets alone.
    const long_body = { prompt: prompts[1], max_tokens: 400, ignore_eos: true, temperature: 0, return_token_ids: true };
    const alone = await completion(server, long_body);
    const across = completion(server, long_body);
    await new Promise((resolve) => setTimeout(resolve, 100));
    const slept = await control(server, '/sleep', { level: 1 });
    assert.equal(slept.json.device_memory_released, true);
    await new Promise((resolve) => setTimeout(resolve, 200));
    assert.deepEqual((await control(server, '/wake_up')).json, { status: 'awake' });
    assert.deepEqual((await across).choices[0].token_ids, alone.choices[0].token_ids);

    for (const path of ['/reset_prefix_cache', '/flush_cache']) assert.equal((await control(server, path)).status, 200);
    for (const [path, param] of [['/sleep?level=3', 'level'], ['/pause?mode=later', 'mode'], ['/wake_up?tags=gpu', 'tags']]) {
      const reply = await control(server, path);
      assert.equal(reply.status, 400, path);
      assert.equal(reply.json.error.param, param);
    }
    assert.deepEqual(await greedy(server), before);
  } finally {
    await server.stop();
  }
});

test('update_weights_from_disk: new weights equal a fresh server on them; bad updates are refused, old weights kept', async () => {
  const server = await startServer(served, ['--weight-update-dir', updates]);
  const fresh = await startServer(step1, ['--served-model-name', 'tiny']);
  try {
    const before = await greedy(server);
    const bad = [
      [{ model_path: unknownTensor }, /lora_A.weight" is not a tensor of this model/],
      [{ model_path: wrongShape }, new RegExp(`${normName}.*expected shape`)],
      [{ model_path: wrongDtype }, new RegExp(`${routerName}.*dtype BF16 is not allowed`)],
      [{ model_path: served }, /outside --weight-update-dir/],
      [{ model_path: join(updates, '..', 'tiny') }, /outside --weight-update-dir/],
      [{ model_path: join(updates, 'missing') }, /is not a directory/],
      [{}, /model_path: missing/],
    ];
    for (const [body, message] of bad) {
      const reply = await control(server, '/update_weights_from_disk', body);
      assert.equal(reply.status, 400, reply.text);
      assert.equal(reply.json.error.param, 'model_path');
      assert.match(reply.json.error.message, message);
      assert.deepEqual(await greedy(server), before, `weights unchanged after ${JSON.stringify(body)}`);
    }
    const reply = await control(server, '/update_weights_from_disk', { model_path: step1, weight_version: 'step-1' });
    assert.equal(reply.status, 200, reply.text);
    assert.equal(reply.json.success, true);
    assert.equal(reply.json.weight_version, 'step-1');
    const updated = await greedy(server);
    assert.deepEqual(updated, await greedy(fresh), 'the same tokens and logprobs as a server started on the new weights');
    assert.notDeepEqual(updated, before);
    assert.equal((await completion(server, { prompt: [1], max_tokens: 1 })).weight_version, 'step-1');
    // Every generation endpoint reports it.
    const asked = { model: 'tiny', max_tokens: 1 };
    for (const [path, body, version] of [
      ['/v1/chat/completions', { ...asked, messages: [{ role: 'user', content: 'hi' }] }, (json) => json.weight_version],
      ['/v1/responses', { model: 'tiny', input: 'hi', max_output_tokens: 1 }, (json) => json.weight_version],
      ['/generate', { input_ids: [1, 2], sampling_params: { max_new_tokens: 1 } }, (json) => json.meta_info.weight_version],
    ]) {
      const answer = await postJson(server.base, path, body);
      assert.equal(answer.status, 200, answer.text);
      assert.equal(version(answer.json), 'step-1', path);
    }
    // Without a weight_version, the count of updates.
    assert.equal((await control(server, '/update_weights_from_disk', { model_path: step1 })).json.weight_version, '2');
  } finally {
    await server.stop();
    await fresh.stop();
  }
  // Without --weight-update-dir the endpoint is off, saying how to turn it on.
  const closed = await startServer(served);
  try {
    const reply = await control(closed, '/update_weights_from_disk', { model_path: step1 });
    assert.equal(reply.status, 400);
    assert.match(reply.json.error.message, /--weight-update-dir/);
  } finally {
    await closed.stop();
  }
});

test('--logprobs-mode: raw_logits and processed_logprobs report those values for the same tokens', async () => {
  const raw = await startServer(served);
  const logits = await startServer(served, ['--logprobs-mode', 'raw_logits']);
  const processed = await startServer(served, ['--logprobs-mode', 'processed_logprobs']);
  try {
    const body = { prompt: prompts[2], max_tokens: 8, temperature: 0, logprobs: 3, return_token_ids: true };
    const [a, b] = [await completion(raw, body), await completion(logits, body)];
    assert.deepEqual(b.choices[0].token_ids, a.choices[0].token_ids);
    // A logit and its logprob differ by the row's log-sum-exp: differences between tokens agree.
    a.choices[0].logprobs.top_logprobs.forEach((top, i) => {
      const rawTop = Object.values(top), logitTop = Object.values(b.choices[0].logprobs.top_logprobs[i]);
      // (Tokens are keyed by their text: two tokens of one text leave fewer entries, and nothing to compare.)
      if (rawTop.length === 3 && logitTop.length === 3) {
        assert.ok(Math.abs((rawTop[0] - rawTop[2]) - (logitTop[0] - logitTop[2])) < 1e-4);
      }
      assert.ok(logitTop[0] > a.choices[0].logprobs.token_logprobs[i], 'logits are not log-probabilities');
    });
    // Sampled with top_k 2, the processed distribution has two tokens: their probabilities sum to 1, and the third
    // best is filtered out (-inf, sent as vLLM's -9999).
    const sampled = { prompt: prompts[2], max_tokens: 8, temperature: 0.7, top_k: 2, seed: 5, logprobs: 3 };
    const [c, d] = [await completion(raw, sampled), await completion(processed, sampled)];
    assert.equal(d.choices[0].text, c.choices[0].text);
    for (const top of d.choices[0].logprobs.top_logprobs) {
      const values = Object.values(top).sort((x, y) => y - x);
      if (values.length !== 3) continue;  // two tokens of one text
      assert.ok(Math.abs(Math.exp(values[0]) + Math.exp(values[1]) - 1) < 1e-4, `top-2 of ${values}`);
      assert.equal(values[2], -9999);
    }
  } finally {
    await raw.stop();
    await logits.stop();
    await processed.stop();
  }
});
