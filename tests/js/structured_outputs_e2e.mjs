// Structured outputs end to end on the shipped model (models/beam-nano, served with no --model): with tools at
// temperature 0 and 1.0 every turn ends as Harmony allows (a call or an answer, never cut short) and every call's
// arguments validate against the tool's schema with ajv; response_format json_schema through the official openai
// client gives content that ajv validates; vLLM's structured_outputs (choice, regex, json) on completions; a keyword
// the grammar engine cannot enforce is a 400 naming it; --no-harmony-constraint serves too.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import OpenAI from 'openai';
import Ajv from 'ajv';
import { startServer, postJson } from './server_harness.mjs';

const repoRoot = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const ajv = new Ajv({ strict: false });

const weather = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Get the current weather for a city.',
    parameters: {
      type: 'object',
      properties: {
        city: { type: 'string', description: 'The city name, e.g. Paris', maxLength: 40 },
        unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
      },
      required: ['city'],
      additionalProperties: false,
    },
  },
};
const time = {
  type: 'function',
  function: {
    name: 'get_time',
    description: 'Get the local time in a time zone.',
    parameters: {
      type: 'object',
      properties: { timezone: { type: 'string', pattern: '^[A-Z][A-Za-z_]+/[A-Z][A-Za-z_]+$' } },
      required: ['timezone'],
      additionalProperties: false,
    },
  },
};
const validators = Object.fromEntries([weather, time].map((t) => [t.function.name, ajv.compile(t.function.parameters)]));

const prompts = [
  "What's the weather in Paris?",
  'Is it cold in Oslo right now? Use fahrenheit.',
  'What time is it in Europe/Berlin?',
  'Weather for Tokyo, please.',
  'Say hello.',
];

async function withServer(extraArgs, body) {
  const server = await startServer(null, extraArgs, { cwd: repoRoot });
  try {
    await body(server, new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'unused' }));
  } finally {
    await server.stop();
  }
}

test('structured outputs on beam-nano', async (t) => {
  await withServer([], async (server, client) => {
    await t.test('tools at temperature 0 and 1.0: a call with valid arguments or an answer, never cut', async () => {
      let calls = 0;
      for (const temperature of [0, 1.0]) {
        for (const [i, content] of prompts.entries()) {
          const response = await client.chat.completions.create({
            model: 'beam-nano', messages: [{ role: 'user', content }], tools: [weather, time],
            temperature, seed: 100 + i, max_tokens: 400,
          });
          const choice = response.choices[0];
          assert.ok(['tool_calls', 'stop'].includes(choice.finish_reason), JSON.stringify(choice));
          if (choice.finish_reason === 'stop') {
            assert.equal(typeof choice.message.content, 'string', JSON.stringify(choice));
            continue;
          }
          for (const call of choice.message.tool_calls) {
            const validate = validators[call.function.name];
            assert.ok(validate, `undeclared tool ${call.function.name}`);
            assert.ok(validate(JSON.parse(call.function.arguments)),
              `${call.function.arguments}: ${JSON.stringify(validate.errors)}`);
            ++calls;
          }
        }
      }
      assert.ok(calls >= 4, `the model made ${calls} calls`);
    });

    await t.test('tool_choice required and named are enforced', async () => {
      for (const tool_choice of ['required', { type: 'function', function: { name: 'get_time' } }]) {
        const response = await client.chat.completions.create({
          model: 'beam-nano', messages: [{ role: 'user', content: 'Say hello.' }], tools: [weather, time],
          tool_choice, temperature: 1.0, seed: 7, max_tokens: 200,
        });
        const choice = response.choices[0];
        assert.equal(choice.finish_reason, 'tool_calls', JSON.stringify(choice));
        const call = choice.message.tool_calls[0];
        if (typeof tool_choice === 'object') assert.equal(call.function.name, 'get_time');
        assert.ok(validators[call.function.name](JSON.parse(call.function.arguments)), call.function.arguments);
      }
    });

    await t.test('response_format json_schema through the openai client', async () => {
      const schema = {
        type: 'object',
        properties: {
          city: { type: 'string', maxLength: 24 },
          temperature_c: { type: 'integer', minimum: -50, maximum: 60 },
          conditions: { type: 'string', enum: ['sunny', 'cloudy', 'rain', 'snow'] },
        },
        required: ['city', 'temperature_c', 'conditions'],
        additionalProperties: false,
      };
      const validate = ajv.compile(schema);
      for (const temperature of [0, 1.0]) {
        for (const seed of [1, 2]) {
          const response = await client.chat.completions.create({
            model: 'beam-nano', messages: [{ role: 'user', content: 'Describe the weather in Paris as JSON.' }],
            response_format: { type: 'json_schema', json_schema: { name: 'weather', schema, strict: true } },
            temperature, seed, max_tokens: 400,
          });
          const choice = response.choices[0];
          assert.equal(choice.finish_reason, 'stop', JSON.stringify(choice));
          const value = JSON.parse(choice.message.content);
          assert.ok(validate(value), `${choice.message.content}: ${JSON.stringify(validate.errors)}`);
        }
      }
      const object = await client.chat.completions.create({
        model: 'beam-nano', messages: [{ role: 'user', content: 'Any JSON object.' }],
        response_format: { type: 'json_object' }, temperature: 1.0, seed: 3, max_tokens: 400,
      });
      if (object.choices[0].finish_reason === 'stop') {
        assert.equal(typeof JSON.parse(object.choices[0].message.content), 'object');
      }
    });

    await t.test("vLLM's structured_outputs on completions", async () => {
      const complete = async (structured_outputs, extra = {}) => {
        const result = await postJson(server.base, '/v1/completions', {
          model: 'beam-nano', prompt: 'The answer is', max_tokens: 64, temperature: 1.0, seed: 5, structured_outputs,
          ...extra,
        });
        assert.equal(result.status, 200, result.text);
        return result.json.choices[0];
      };
      const choice = await complete({ choice: ['yes', 'no', 'maybe later'] });
      assert.ok(['yes', 'no', 'maybe later'].includes(choice.text), choice.text);
      assert.equal(choice.finish_reason, 'stop');
      // The grammar's end stops the output even when eos is ignored.
      const ignoring = await complete({ choice: ['yes', 'no'] }, { ignore_eos: true });
      assert.ok(['yes', 'no'].includes(ignoring.text), ignoring.text);
      assert.equal(ignoring.finish_reason, 'stop');
      const regex = await complete({ regex: '[0-9]{3}-[a-z]{2,4}' });
      assert.match(regex.text, /^[0-9]{3}-[a-z]{2,4}$/);
      const json = await complete({ json: { type: 'object', properties: { n: { type: 'integer', minimum: 0, maximum: 9 } },
        required: ['n'], additionalProperties: false } });
      if (json.finish_reason === 'stop') assert.ok(Number.isInteger(JSON.parse(json.text).n), json.text);
      const grammar = await complete({ grammar: 'root ::= "(" [a-c]{1,3} ")"' });
      assert.match(grammar.text, /^\([a-c]{1,3}\)$/);
    });

    await t.test('what cannot be enforced is a 400 naming the keyword', async () => {
      const chat = (body) => postJson(server.base, '/v1/chat/completions',
        { model: 'beam-nano', messages: [{ role: 'user', content: 'hi' }], ...body });
      const bad = await chat({ response_format: { type: 'json_schema', json_schema: { name: 'x',
        schema: { type: 'object', patternProperties: { '^a': { type: 'string' } } } } } });
      assert.equal(bad.status, 400, bad.text);
      assert.equal(bad.json.error.param, 'response_format.json_schema.schema');
      assert.match(bad.json.error.message, /patternProperties/);
      const tool = await chat({ tools: [{ type: 'function', function: { name: 'f',
        parameters: { type: 'object', dependencies: { a: ['b'] } } } }] });
      assert.equal(tool.status, 400, tool.text);
      assert.equal(tool.json.error.param, 'tools');
      assert.match(tool.json.error.message, /dependencies/);
      const tag = await chat({ structured_outputs: { structural_tag: '{}' } });
      assert.equal(tag.status, 400, tag.text);
      assert.equal(tag.json.error.param, 'structured_outputs.structural_tag');
      const both = await chat({ response_format: { type: 'json_object' }, structured_outputs: { regex: 'a' } });
      assert.equal(both.status, 400, both.text);
      const ok = await chat({ max_tokens: 4 });
      assert.equal(ok.status, 200, ok.text);
    });
  });
});

test('--no-harmony-constraint serves unconstrained chat, and still holds requested formats', async () => {
  await withServer(['--no-harmony-constraint'], async (server, client) => {
    const plain = await client.chat.completions.create({
      model: 'beam-nano', messages: [{ role: 'user', content: 'Say hello.' }], temperature: 0, max_tokens: 64,
    });
    assert.equal(plain.choices.length, 1);
    const response = await client.chat.completions.create({
      model: 'beam-nano', messages: [{ role: 'user', content: 'Pick a color.' }], temperature: 1.0, seed: 4,
      response_format: { type: 'json_schema', json_schema: { name: 'c', schema: { type: 'object',
        properties: { color: { enum: ['red', 'blue'] } }, required: ['color'], additionalProperties: false } } },
      max_tokens: 400,
    });
    assert.equal(response.choices[0].finish_reason, 'stop', JSON.stringify(response.choices[0]));
    assert.ok(['red', 'blue'].includes(JSON.parse(response.choices[0].message.content).color));
  });
});
