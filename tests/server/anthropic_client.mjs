// anthropic_client.mjs - the official Anthropic Node SDK against `dsv4 serve` (run by the
// server test group: node tests/server/anthropic_client.mjs BASE_URL MODEL CANNED_DIR).
//
// Against the live server: messages.create (whole and streamed, same text), count_tokens,
// a tool round trip in the request (tool_use and tool_result blocks), and errors raised as
// the SDK's typed exceptions. Tool calls cannot come from a random-weight model, so they
// are checked on canned answers that dsv4's own output code produced (CANNED_DIR, written
// by the C test): a small local HTTP server replays them and the SDK must parse the
// thinking, text and tool_use blocks, whole and through messages.stream().finalMessage().
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { startReplay } from './replay.mjs';
import Anthropic from '@anthropic-ai/sdk';

const [baseURL, model, canned] = process.argv.slice(2);
if (!baseURL || !model || !canned) {
    console.error('usage: node anthropic_client.mjs BASE_URL MODEL CANNED_DIR');
    process.exit(2);
}
const client = new Anthropic({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
const messages = [{ role: 'user', content: 'hello there, tell me about rivers' }];

// whole
const whole = await client.messages.create({ model, messages, max_tokens: 16, temperature: 0 });
assert.equal(whole.type, 'message');
assert.equal(whole.role, 'assistant');
assert.ok(['end_turn', 'max_tokens'].includes(whole.stop_reason));
assert.ok(whole.usage.input_tokens + whole.usage.cache_read_input_tokens > 0 && whole.usage.output_tokens > 0);
const wholeText = whole.content.filter((b) => b.type === 'text').map((b) => b.text).join('');

// streamed: the same text, through the SDK's event accumulator
const stream = client.messages.stream({ model, messages, max_tokens: 16, temperature: 0 });
let deltas = '';
stream.on('text', (t) => { deltas += t; });
const final = await stream.finalMessage();
assert.equal(deltas, wholeText);
assert.equal(final.content.filter((b) => b.type === 'text').map((b) => b.text).join(''), wholeText);
assert.equal(final.stop_reason, whole.stop_reason);
assert.equal(final.usage.output_tokens, whole.usage.output_tokens);

// count_tokens: the prompt of the request above
const counted = await client.messages.countTokens({ model, messages });
assert.equal(counted.input_tokens, whole.usage.input_tokens + whole.usage.cache_read_input_tokens);

// a tool round trip in the request: accepted and rendered
const tools = [{
    name: 'get_weather', description: 'Weather for a city',
    input_schema: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] },
}];
const round = await client.messages.create({
    model, tools, max_tokens: 8, system: 'You check the weather.',
    messages: [
        { role: 'user', content: 'weather in Paris?' },
        { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_01', name: 'get_weather', input: { city: 'Paris' } }] },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_01', content: 'sunny, 21 C' }] },
    ],
});
assert.equal(round.type, 'message');

// errors arrive as typed exceptions with the status
await assert.rejects(
    client.messages.create({ model: 'no-such-model', messages, max_tokens: 4 }),
    (e) => e instanceof Anthropic.NotFoundError && e.status === 404);
await assert.rejects(
    client.messages.create({ model, messages, max_tokens: 4, tool_choice: { type: 'tool', name: 'nope' }, tools }),
    (e) => e instanceof Anthropic.BadRequestError && e.status === 400 && /not in tools/.test(e.message));

// tool use, from dsv4's canned answers
const wholeBody = fs.readFileSync(`${canned}/messages_whole.json`, 'utf8');
const sseBody = fs.readFileSync(`${canned}/messages_stream.sse`, 'utf8');
const replay = await startReplay(wholeBody, sseBody);
const replayClient = new Anthropic({ baseURL: `http://127.0.0.1:${replay.port}`, apiKey: 'x', maxRetries: 0 });
const expectBlocks = (m) => {
    assert.equal(m.stop_reason, 'tool_use');
    const [th, tx, c1, c2] = m.content;
    assert.equal(th.type, 'thinking');
    assert.equal(th.thinking, 'The user wants two things.');
    assert.equal(tx.type, 'text');
    assert.equal(tx.text, 'Let me check.');
    assert.equal(c1.type, 'tool_use');
    assert.equal(c1.name, 'get_weather');
    assert.deepEqual(c1.input, { city: 'Paris', days: 3 });
    assert.equal(c2.name, 'get_time');
    assert.deepEqual(c2.input, { tz: 'CET' });
    assert.ok(c1.id && c2.id && c1.id !== c2.id);
};
try {
    expectBlocks(await replayClient.messages.create({ model, messages, tools, max_tokens: 100 }));
    const s = replayClient.messages.stream({ model, messages, tools, max_tokens: 100 });
    expectBlocks(await s.finalMessage());
} finally {
    replay.close();
}
console.log('anthropic client: ok');
