// End-to-end test of duoserve with the official OpenAI Node SDK (issue 5): models.list,
// completions (plain and streamed, golden text on stories260k), chat completions (plain and
// streamed, on the built-in demo model, which has a chat template) and the SDK's error classes
// on 400, 401 and 404.
//
// Starts its own daemons on 127.0.0.1 with --port 0 (the port is read from the log line
// "listening on http://127.0.0.1:PORT"), one on the demo model, one on stories260k, and one on
// stories260k with --api-key; kills them at the end, also on failure.
//
// usage: DUOSERVE_BIN=build/duoserve node --test tests/node/openai_sdk.test.mjs
//        (DUO_SHARED overrides ../shared; run from anywhere)
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(HERE, '..', '..');
const BIN = path.resolve(ROOT, process.env.DUOSERVE_BIN || path.join('build', 'duoserve'));
const SHARED = path.resolve(ROOT, process.env.DUO_SHARED || path.join('..', 'shared'));
const STORIES = path.join(SHARED, 'models', 'stories260k');
const HAVE_STORIES = existsSync(path.join(STORIES, 'config.json'));
const NO_STORIES = HAVE_STORIES ? false : `${STORIES} not found`;
const DEMO = 'duoserve-demo';
const API_KEY = 'sk-duoserve-node-test';

const REQUEST_MS = 30_000;   // every SDK request and every test
const START_MS = 30_000;     // a daemon reports its port and turns healthy within this
const T = { timeout: REQUEST_MS };

const cache = mkdtempSync(path.join(tmpdir(), 'duoserve-node-'));
const daemons = [];

// Last resort: whatever happens, no daemon outlives this process.
process.on('exit', () => {
  for (const d of daemons) if (d.proc.exitCode === null && d.proc.signalCode === null) d.proc.kill('SIGKILL');
  rmSync(cache, { recursive: true, force: true });
});
for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => process.exit(1));

function sleep(ms) { return new Promise((r) => setTimeout(r, ms)); }

async function startDaemon(name, args) {
  const proc = spawn(BIN, ['serve', ...args, '--host', '127.0.0.1', '--port', '0'], {
    stdio: ['ignore', 'ignore', 'pipe'],
    env: { ...process.env, DUOSERVE_CACHE: cache },
  });
  const d = { name, proc, log: '', port: null };
  daemons.push(d);
  proc.stderr.setEncoding('utf8');
  proc.stderr.on('data', (s) => {
    d.log += s;
    const m = d.port === null && d.log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
    if (m) d.port = Number(m[1]);
  });
  const deadline = Date.now() + START_MS;
  while (d.port === null && Date.now() < deadline && proc.exitCode === null) await sleep(20);
  if (d.port === null) throw new Error(`${name}: no port reported:\n${d.log.slice(-2000)}`);
  while (Date.now() < deadline && proc.exitCode === null) {
    try {
      const r = await fetch(`http://127.0.0.1:${d.port}/health`, { signal: AbortSignal.timeout(2000) });
      if (r.status === 200) return d;
    } catch { /* not up yet */ }
    await sleep(50);
  }
  throw new Error(`${name}: not healthy within ${START_MS} ms:\n${d.log.slice(-2000)}`);
}

async function stopDaemon(d) {
  if (d.proc.exitCode !== null || d.proc.signalCode !== null) return;
  const exited = new Promise((r) => d.proc.once('exit', r));
  d.proc.kill('SIGTERM');
  const t = setTimeout(() => d.proc.kill('SIGKILL'), 10_000);
  await exited;
  clearTimeout(t);
}

function client(d, apiKey = 'unused') {
  return new OpenAI({ apiKey, baseURL: `http://127.0.0.1:${d.port}/v1`, timeout: REQUEST_MS, maxRetries: 0 });
}

// Calls fn, which must throw an instance of cls; returns the error.
async function rejectsWith(fn, cls) {
  let err = null;
  try { await fn(); } catch (e) { err = e; }
  assert.ok(err, `expected ${cls.name}, the call succeeded`);
  assert.ok(err instanceof cls, `expected ${cls.name}, got ${err?.constructor?.name}: ${err?.message}`);
  assert.ok(err instanceof OpenAI.APIError, 'is an OpenAI.APIError');
  return err;
}

let demo, stories, keyed;

describe('duoserve with the OpenAI Node SDK', { timeout: 170_000 }, () => {
  before(async () => {
    demo = await startDaemon('demo', []);
    if (HAVE_STORIES) {
      stories = await startDaemon('stories260k', ['-m', STORIES]);
      keyed = await startDaemon('stories260k --api-key', ['-m', STORIES, '--api-key', API_KEY]);
    } else {
      keyed = await startDaemon('demo --api-key', ['--api-key', API_KEY]);
    }
  }, { timeout: 3 * START_MS });

  after(async () => {
    await Promise.all(daemons.map(stopDaemon));
    const bad = daemons.filter((d) => /runtime error:|AddressSanitizer|LeakSanitizer/.test(d.log));
    if (bad.length) console.log(bad.map((d) => `${d.name}:\n${d.log.slice(-3000)}`).join('\n'));
    assert.equal(bad.length, 0, 'sanitizer reports in the daemon logs');
  }, { timeout: 30_000 });

  // ---- models ----

  test('models.list lists the demo model', T, async () => {
    const ids = [];
    for await (const m of client(demo).models.list()) {
      assert.equal(m.object, 'model');
      ids.push(m.id);
    }
    assert.deepEqual(ids, [DEMO]);
  });

  test('models.list lists stories260k by its -m path', { ...T, skip: NO_STORIES }, async () => {
    const page = await client(stories).models.list();
    assert.deepEqual(page.data.map((m) => m.id), [STORIES]);
  });

  // ---- completions (stories260k: golden greedy text) ----

  const golden = () => readFileSync(path.join(STORIES, 'expected_greedy.txt'), 'utf8');
  const req = () => ({ model: STORIES, prompt: [1], max_tokens: 5, temperature: 0 });
  let plainText = null;
  // the non-streamed text, from the first test or (if that one failed) fetched here
  const reference = async () => plainText ?? (await client(stories).completions.create(req())).choices[0].text;

  test('completions.create: golden greedy start, usage, finish_reason length', { ...T, skip: NO_STORIES }, async () => {
    const c = await client(stories).completions.create(req());
    assert.equal(c.object, 'text_completion');
    assert.equal(typeof c.id, 'string');
    assert.equal(c.model, STORIES);
    assert.equal(c.choices.length, 1);
    const ch = c.choices[0];
    assert.equal(ch.index, 0);
    assert.equal(typeof ch.text, 'string');
    assert.ok(ch.text.length > 0, 'non-empty text');
    assert.ok(golden().startsWith(ch.text), `text ${JSON.stringify(ch.text)} starts expected_greedy.txt`);
    assert.ok(ch.text.startsWith('Once'), `text ${JSON.stringify(ch.text)} starts with "Once"`);
    assert.equal(ch.finish_reason, 'length');
    assert.deepEqual(c.usage, { prompt_tokens: 1, completion_tokens: 5, total_tokens: 6, prompt_tokens_details: { cached_tokens: 0 } });
    plainText = ch.text;
  });

  test('completions.create: a longer greedy run is still the golden text', { ...T, skip: NO_STORIES }, async () => {
    const c = await client(stories).completions.create({ ...req(), max_tokens: 60 });
    const text = c.choices[0].text;
    assert.ok(text.length > 100 && golden().startsWith(text), JSON.stringify(text));
    assert.ok(text.startsWith('Once upon a time'), JSON.stringify(text));
    assert.equal(c.usage.completion_tokens, 60);
  });

  test('completions.create stream: chunks concatenate to the non-streamed text', { ...T, skip: NO_STORIES }, async () => {
    const want = await reference();
    const stream = await client(stories).completions.create({ ...req(), stream: true });
    let text = '', n = 0, finish = null;
    for await (const chunk of stream) {
      assert.equal(chunk.object, 'text_completion');
      assert.equal(chunk.choices.length, 1);
      text += chunk.choices[0].text;
      if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
      n++;
    }
    assert.ok(n >= 1, 'at least one chunk');
    assert.equal(text, want);
    assert.equal(finish, 'length');
  });

  test('completions.create stream with include_usage: usage chunk last', { ...T, skip: NO_STORIES }, async () => {
    const stream = await client(stories).completions.create({
      ...req(), stream: true, stream_options: { include_usage: true },
    });
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);
    const want = await reference();
    const last = chunks.at(-1);
    assert.deepEqual(last.choices, []);
    assert.deepEqual(last.usage, { prompt_tokens: 1, completion_tokens: 5, total_tokens: 6, prompt_tokens_details: { cached_tokens: 0 } });
    assert.equal(chunks.slice(0, -1).map((c) => c.choices[0].text).join(''), want);
  });

  test('completions.create stream: breaking out of the loop frees the request', { ...T, skip: NO_STORIES }, async () => {
    const cl = client(stories);
    const stream = await cl.completions.create({ ...req(), max_tokens: 400, ignore_eos: true, stream: true });
    let n = 0;
    for await (const chunk of stream) { assert.equal(typeof chunk.choices[0].text, 'string'); if (++n === 2) break; }
    assert.equal(n, 2);
    // the SDK aborts the HTTP request; the server notices and the running count drops to 0
    let running = null;
    for (let i = 0; i < 200 && running !== 0; i++) {
      const r = await fetch(`http://127.0.0.1:${stories.port}/metrics`, { signal: AbortSignal.timeout(5000) });
      const m = (await r.text()).match(/^duoserve:num_requests_running(?:\{[^}]*\})? (\S+)$/m);
      running = m ? Number(m[1]) : null;
      if (running !== 0) await sleep(50);
    }
    assert.equal(running, 0, 'duoserve:num_requests_running returns to 0');
    const c = await cl.completions.create(req());
    assert.equal(c.choices[0].text, await reference(), 'still serves the same text afterwards');
  });

  test('completions.create: text prompt on the demo model', T, async () => {
    const c = await client(demo).completions.create({ model: DEMO, prompt: 'Hello', max_tokens: 4, temperature: 0 });
    assert.equal(typeof c.choices[0].text, 'string');
    assert.ok(['length', 'stop'].includes(c.choices[0].finish_reason), c.choices[0].finish_reason);
    assert.equal(c.usage.total_tokens, c.usage.prompt_tokens + c.usage.completion_tokens);
    assert.ok(c.usage.completion_tokens >= 1 && c.usage.completion_tokens <= 4, JSON.stringify(c.usage));
  });

  // ---- chat (the demo model has a chat template) ----

  const chatReq = () => ({
    model: DEMO,
    messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hi' }],
    max_completion_tokens: 8,
    temperature: 0,
  });
  let chatText = null;
  const chatReference = async () => chatText ?? (await client(demo).chat.completions.create(chatReq())).choices[0].message.content;

  test('chat.completions.create: assistant message, finish_reason, usage', T, async () => {
    const c = await client(demo).chat.completions.create(chatReq());
    assert.equal(c.object, 'chat.completion');
    assert.equal(c.model, DEMO);
    assert.equal(c.choices.length, 1);
    const ch = c.choices[0];
    assert.equal(ch.message.role, 'assistant');
    assert.equal(typeof ch.message.content, 'string');
    assert.ok(['length', 'stop'].includes(ch.finish_reason), ch.finish_reason);
    assert.ok(c.usage.prompt_tokens > 2, JSON.stringify(c.usage));
    assert.ok(c.usage.completion_tokens >= 1 && c.usage.completion_tokens <= 8, JSON.stringify(c.usage));
    assert.equal(c.usage.total_tokens, c.usage.prompt_tokens + c.usage.completion_tokens);
    chatText = ch.message.content;
  });

  test('chat.completions.create: max_tokens (deprecated spelling) is honoured too', T, async () => {
    const { max_completion_tokens: _, ...body } = chatReq();
    const c = await client(demo).chat.completions.create({ ...body, max_tokens: 3, ignore_eos: true });
    assert.equal(c.usage.completion_tokens, 3);
    assert.equal(c.choices[0].finish_reason, 'length');
  });

  test('chat.completions.create stream: first delta has the role, content adds up', T, async () => {
    const want = await chatReference();
    const stream = await client(demo).chat.completions.create({ ...chatReq(), stream: true });
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);
    assert.ok(chunks.length >= 1);
    for (const c of chunks) assert.equal(c.object, 'chat.completion.chunk');
    assert.equal(chunks[0].choices[0].delta.role, 'assistant');
    const text = chunks.map((c) => c.choices[0]?.delta?.content ?? '').join('');
    assert.equal(text, want);
    const finish = chunks.map((c) => c.choices[0]?.finish_reason).filter(Boolean);
    assert.equal(finish.length, 1, 'exactly one finish_reason');
  });

  test('chat.completions.stream helper: finalChatCompletion', T, async () => {
    const want = await chatReference();
    const runner = client(demo).chat.completions.stream(chatReq());
    const final = await runner.finalChatCompletion();
    assert.equal(final.choices[0].message.role, 'assistant');
    assert.equal(final.choices[0].message.content, want);
  });

  // ---- structured output and tools (the demo model writes noise: only the grammar makes it JSON) ----

  const person = {
    type: 'object',
    additionalProperties: false,
    properties: {
      name: { type: 'string', maxLength: 10 },
      age: { type: 'integer', minimum: 0, maximum: 120 },
      tags: { type: 'array', items: { enum: ['a', 'b'] }, maxItems: 2 },
    },
    required: ['name', 'age', 'tags'],
  };
  const isPerson = (p) => p !== null && typeof p === 'object' && Object.keys(p).length === 3 &&
    typeof p.name === 'string' && [...p.name].length <= 10 && Number.isInteger(p.age) && p.age >= 0 && p.age <= 120 &&
    Array.isArray(p.tags) && p.tags.length <= 2 && p.tags.every((t) => t === 'a' || t === 'b');
  const weatherParams = {
    type: 'object',
    additionalProperties: false,
    properties: { city: { type: 'string', maxLength: 12 }, days: { type: 'integer', minimum: 1, maximum: 7 } },
    required: ['city', 'days'],
  };
  const isWeather = (a) => a !== null && typeof a === 'object' && Object.keys(a).length === 2 &&
    typeof a.city === 'string' && [...a.city].length <= 12 && Number.isInteger(a.days) && a.days >= 1 && a.days <= 7;
  const weather = {
    type: 'function',
    function: { name: 'get_weather', description: 'Weather for a city', strict: true, parameters: weatherParams },
  };
  const clock = {
    type: 'function',
    function: { name: 'get_time', strict: true, parameters: { type: 'object', additionalProperties: false,
      properties: { tz: { enum: ['UTC', 'CET'] } }, required: ['tz'] } },
  };
  const ask = [{ role: 'user', content: 'What is the weather in Paris?' }];
  const callsOf = (m) => m.tool_calls.map((c) => [c.function.name, c.function.arguments]);

  test('chat.completions.parse: response_format json_schema gives message.parsed', T, async () => {
    for (const seed of [1, 2, 3]) {
      const c = await client(demo).chat.completions.parse({
        model: DEMO, messages: ask, max_completion_tokens: 1500, seed,
        response_format: { type: 'json_schema', json_schema: { name: 'person', strict: true, schema: person } },
      });
      const m = c.choices[0].message;
      assert.equal(c.choices[0].finish_reason, 'stop');
      assert.ok(isPerson(m.parsed), JSON.stringify(m));
      assert.deepEqual(m.parsed, JSON.parse(m.content));
    }
  });

  test('chat.completions.parse: strict tools give parsed_arguments (tool_choice required)', T, async () => {
    for (const seed of [4, 5]) {
      const c = await client(demo).chat.completions.parse({
        model: DEMO, messages: ask, tools: [weather, clock], tool_choice: 'required', parallel_tool_calls: false,
        max_completion_tokens: 1500, seed,
      });
      const ch = c.choices[0];
      assert.equal(ch.finish_reason, 'tool_calls');
      assert.equal(ch.message.content, null);
      assert.equal(ch.message.tool_calls.length, 1);
      const call = ch.message.tool_calls[0];
      assert.equal(call.type, 'function');
      assert.match(call.id, /^call_[A-Za-z0-9]{24}$/);
      const args = call.function.parsed_arguments;
      assert.deepEqual(args, JSON.parse(call.function.arguments));
      if (call.function.name === 'get_weather') assert.ok(isWeather(args), JSON.stringify(args));
      else assert.ok(call.function.name === 'get_time' && ['UTC', 'CET'].includes(args.tz), JSON.stringify(call));
    }
  });

  test('chat.completions.stream helper with a named tool: the same calls as not streamed', T, async () => {
    const body = {
      model: DEMO, messages: ask, tools: [weather, clock], max_completion_tokens: 1500, seed: 7,
      tool_choice: { type: 'function', function: { name: 'get_weather' } },
    };
    const plain = await client(demo).chat.completions.create(body);
    const runner = client(demo).chat.completions.stream(body);
    const done = [];
    runner.on('tool_calls.function.arguments.done', (e) => done.push([e.name, e.arguments]));
    const final = await runner.finalChatCompletion();
    assert.equal(plain.choices[0].finish_reason, 'tool_calls');
    assert.equal(final.choices[0].finish_reason, 'tool_calls');
    assert.deepEqual(callsOf(final.choices[0].message), callsOf(plain.choices[0].message));
    assert.deepEqual(done, callsOf(plain.choices[0].message));
    assert.equal(done[0][0], 'get_weather');
    assert.ok(isWeather(JSON.parse(done[0][1])), done[0][1]);
  });

  test('chat.completions.runTools: the named tool runs with the parsed arguments', T, async () => {
    const seen = [];
    const runner = client(demo).chat.completions.runTools({
      model: DEMO, messages: ask, max_completion_tokens: 1500, seed: 8,
      tools: [{ type: 'function', function: { name: 'get_weather', parameters: weatherParams, parse: JSON.parse,
        function: (args) => { seen.push(args); return { forecast: 'sunny' }; } } }],
      tool_choice: { type: 'function', function: { name: 'get_weather' } },
    });
    await runner.done();
    assert.equal(seen.length, 1);
    assert.ok(isWeather(seen[0]), JSON.stringify(seen[0]));
    const tool = runner.messages.find((m) => m.role === 'tool');
    assert.equal(tool.content, '{"forecast":"sunny"}');
  });

  test('400: a schema outside the supported subset raises BadRequestError naming it', T, async () => {
    const err = await rejectsWith(() => client(demo).chat.completions.create({
      model: DEMO, messages: ask, max_completion_tokens: 5,
      response_format: { type: 'json_schema', json_schema: { name: 'p', schema: { type: 'string', pattern: '^a$' } } },
    }), OpenAI.BadRequestError);
    assert.equal(err.param, 'response_format');
    assert.match(err.error.message, /pattern/);
  });

  // ---- errors ----

  test('400 (temperature 5) raises BadRequestError with a message', T, async () => {
    const m = HAVE_STORIES ? STORIES : DEMO;
    const err = await rejectsWith(() => client(HAVE_STORIES ? stories : demo).completions.create(
      { model: m, prompt: [1], max_tokens: 2, temperature: 5 }), OpenAI.BadRequestError);
    assert.equal(err.status, 400);
    assert.equal(typeof err.error?.message, 'string');
    assert.ok(err.error.message.length > 0);
    assert.ok(err.message.includes(err.error.message), err.message);
    assert.equal(err.type, 'invalid_request_error');
  });

  test('400 on chat: chat with a model without a chat template raises BadRequestError', { ...T, skip: NO_STORIES }, async () => {
    const err = await rejectsWith(() => client(stories).chat.completions.create(
      { model: STORIES, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 }), OpenAI.BadRequestError);
    assert.equal(err.status, 400);
    assert.ok(err.error?.message, 'has a message');
  });

  test('400 on a stream request raises before iteration', T, async () => {
    const err = await rejectsWith(() => client(demo).chat.completions.create(
      { ...chatReq(), temperature: 5, stream: true }), OpenAI.BadRequestError);
    assert.equal(err.status, 400);
  });

  test('401: a wrong API key raises AuthenticationError', T, async () => {
    const err = await rejectsWith(() => client(keyed, 'sk-wrong').models.list(), OpenAI.AuthenticationError);
    assert.equal(err.status, 401);
    assert.ok(err.error?.message, 'has a message');
    assert.equal(err.code, 'invalid_api_key');
    const err2 = await rejectsWith(() => client(keyed, 'sk-wrong').completions.create(
      { model: 'x', prompt: [1], max_tokens: 1 }), OpenAI.AuthenticationError);
    assert.equal(err2.status, 401);
  });

  test('401 server: the right API key works', T, async () => {
    const page = await client(keyed, API_KEY).models.list();
    assert.equal(page.data.length, 1);
    const id = page.data[0].id;
    const c = await client(keyed, API_KEY).completions.create({ model: id, prompt: [1], max_tokens: 2, temperature: 0 });
    assert.equal(c.usage.completion_tokens, 2);
  });

  test('404: unknown model raises NotFoundError', T, async () => {
    const err = await rejectsWith(() => client(demo).completions.create(
      { model: 'no-such-model', prompt: [1], max_tokens: 2 }), OpenAI.NotFoundError);
    assert.equal(err.status, 404);
    assert.equal(err.code, 'model_not_found');
    const err2 = await rejectsWith(() => client(demo).chat.completions.create(
      { ...chatReq(), model: 'no-such-model' }), OpenAI.NotFoundError);
    assert.equal(err2.status, 404);
  });
});
