// The harness against the real binary and real guests: the TypeScript
// counter and chat of examples/ (target/wasm/counter-js.wasm, chat-js.wasm,
// built by `scripts/build-guests --js`). The binary is WASMKEEP_BIN, else
// `wasmkeep` on PATH (`scripts/test --js` sets WASMKEEP_BIN). Run after
// `npm run build` (`npm test` does both).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

import { RefusedError, TestNode, wasmkeepBin } from '../dist/index.js';

function guest(name) {
  const path = fileURLToPath(new URL(`../../../target/wasm/${name}.wasm`, import.meta.url));
  assert.ok(existsSync(path), `${path} is missing: run scripts/build-guests --js`);
  return path;
}

async function nodeWith(t, className, guestName) {
  const node = await TestNode.start();
  t.after(() => node.stop());
  await node.deploy(className, guest(guestName));
  return node;
}

async function text(response) {
  return [response.status, await response.text()];
}

/** Asserts that `promise` is the node's refusal with `status`. */
async function refused(promise, status, says) {
  await assert.rejects(promise, (err) => {
    assert.ok(err instanceof RefusedError, String(err));
    assert.equal(err.status, status, err.message);
    if (says) assert.match(err.message, says);
    return true;
  });
}

test('a counter survives hibernation', async (t) => {
  const node = await nodeWith(t, 'counter', 'counter-js');
  const actor = node.actor('demo/counter/a');
  assert.deepEqual(await text(await actor.fetch('/increment', { method: 'POST' })), [200, '1']);
  assert.deepEqual(await text(await actor.fetch('/increment', { method: 'POST' })), [200, '2']);
  assert.equal(await actor.isResident(), true);
  await actor.hibernate();
  assert.equal(await actor.isResident(), false);
  assert.deepEqual(await text(await actor.fetch('/value')), [200, '2']);
  assert.equal(await actor.isResident(), true);
});

test('sql reads what a request wrote, and writes only with sqlWrite', async (t) => {
  const node = await nodeWith(t, 'counter', 'counter-js');
  const actor = node.actor('demo/counter/sql');
  await refused(actor.sql('SELECT 1'), 404, /nothing in the bucket/);
  await actor.fetch('/increment', { method: 'POST' });
  assert.deepEqual(await actor.sql('SELECT n FROM counter WHERE id = 1'), { columns: ['n'], rows: [[1]] });
  // A write is not the read's: refused, nothing changed.
  await refused(actor.sql('UPDATE counter SET n = 7'), 400, /read-only/);
  assert.deepEqual(
    await actor.sqlWrite('UPDATE counter SET n = 41 WHERE id = 1 RETURNING n'),
    { columns: ['n'], rows: [[41]], changes: 1 },
  );
  assert.deepEqual(await text(await actor.fetch('/increment', { method: 'POST' })), [200, '42']);
  // A bad statement: 400 with SQLite's message, nothing written.
  await refused(actor.sqlWrite('UPDATE nowhere SET x = 1'), 400, /no such table/);
  assert.deepEqual((await actor.sql('SELECT n FROM counter WHERE id = 1')).rows, [[42]]);
});

test('fireAlarm runs a far-off alarm now and is refused when none is set', async (t) => {
  const node = await nodeWith(t, 'counter', 'counter-js');
  const actor = node.actor('demo/counter/alarm');
  await refused(actor.fireAlarm(), 409, /no alarm set/);
  await actor.fetch('/alarm?in_ms=3600000', { method: 'POST' });
  await actor.fireAlarm();
  assert.deepEqual(await text(await actor.fetch('/alarms')), [200, '1']);
  // Spent; a hibernated actor's alarm runs too.
  await refused(actor.fireAlarm(), 409);
  await actor.fetch('/alarm?in_ms=3600000', { method: 'POST' });
  await actor.hibernate();
  await actor.fireAlarm();
  assert.deepEqual(await text(await actor.fetch('/alarms')), [200, '2']);
});

test('advance runs the alarms due by then, and only those', async (t) => {
  const node = await nodeWith(t, 'counter', 'counter-js');
  const soon = node.actor('demo/counter/soon');
  const later = node.actor('demo/counter/later');
  await soon.fetch('/alarm?in_ms=60000', { method: 'POST' });
  await later.fetch('/alarm?in_ms=7200000', { method: 'POST' });
  await later.hibernate();
  const before = node.now();
  assert.deepEqual(await node.advance(61_000), ['demo/counter/soon']);
  assert.ok(node.now() >= before + 61_000);
  assert.deepEqual(await text(await soon.fetch('/alarms')), [200, '1']);
  assert.deepEqual(await text(await later.fetch('/alarms')), [200, '0']);
  assert.deepEqual(await node.advance(7_200_000), ['demo/counter/later']);
  assert.deepEqual(await node.advance(0), []);
  await assert.rejects(node.advance(-1), /non-negative/);
});

test('a socket is answered, and keeps its actor from hibernating', async (t) => {
  const node = await nodeWith(t, 'counter', 'counter-js');
  const actor = node.actor('demo/counter/ws');
  const ws = await actor.socket('/ws');
  ws.send('inc');
  assert.equal(await ws.nextText(), '1');
  ws.send('hello');
  assert.equal(await ws.nextText(), 'hello');
  await refused(actor.hibernate(), 409, /open socket/);
  await ws.close();
  await actor.hibernate();
  assert.equal(await actor.isResident(), false);
});

test('a chat message reaches every socket of the room', async (t) => {
  const node = await nodeWith(t, 'chat', 'chat-js');
  const room = node.actor('demo/chat/room');
  const ann = await room.socket('/ws');
  const bob = await room.socket('/ws');
  const bothHear = async (text) => {
    assert.equal(await ann.nextText(), text);
    assert.equal(await bob.nextText(), text);
  };
  ann.send('join ann');
  await bothHear('ann joined');
  bob.send('join bob');
  await bothHear('bob joined');
  ann.send('hi');
  await bothHear('ann: hi');
  const posted = await room.fetch('/post?user=carl', { method: 'POST', body: 'hello' });
  assert.equal(posted.status, 200);
  await bothHear('carl: hello');
  await ann.close();
  await bob.close();
});

test('a bad component, class or actor id is refused', async (t) => {
  const node = await TestNode.start();
  t.after(() => node.stop());
  await refused(node.deploy('counter', new TextEncoder().encode('not wasm')), 400);
  await refused(node.deploy('Bad Class', new Uint8Array()), 400);
  assert.throws(() => node.actor('no-slashes'), /not an actor id/);
});

test('a missing binary is a clear error', async () => {
  const saved = { bin: process.env.WASMKEEP_BIN, path: process.env.PATH };
  try {
    process.env.WASMKEEP_BIN = '/nonexistent/wasmkeep';
    assert.throws(() => wasmkeepBin(), /WASMKEEP_BIN is \/nonexistent\/wasmkeep/);
    delete process.env.WASMKEEP_BIN;
    process.env.PATH = '/nonexistent';
    assert.throws(() => wasmkeepBin(), /set WASMKEEP_BIN to its path, or put wasmkeep on PATH/);
    await assert.rejects(TestNode.start(), /no wasmkeep binary/);
  } finally {
    if (saved.bin === undefined) delete process.env.WASMKEEP_BIN;
    else process.env.WASMKEEP_BIN = saved.bin;
    process.env.PATH = saved.path;
  }
});
