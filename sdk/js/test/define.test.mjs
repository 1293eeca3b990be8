import assert from 'node:assert/strict';
import { test } from 'node:test';
import { makeExports } from '../dist/define.js';
import { HttpError } from '../dist/errors.js';
import { Response } from '../dist/http.js';
import { Router } from '../dist/router.js';

const wit = (method, path, body = '') => ({ method, path, headers: [], body: new TextEncoder().encode(body) });
const text = (response) => new TextDecoder().decode(response.body);

function exportsOf(definition) {
  const logged = [];
  const exports = makeExports(definition, (level, message) => logged.push([level, message]));
  return { exports, logged };
}

test('a router serves the handler export', () => {
  const router = new Router().post('/echo/:word', (req, p) => `${p.word} ${req.text()}`);
  const { exports } = exportsOf({ fetch: router });
  const response = exports.handler.handle(wit('POST', '/echo/hi?x=1', 'there'));
  assert.deepEqual([response.status, text(response)], [200, 'hi there']);
  assert.deepEqual(response.headers, [['content-type', 'text/plain; charset=utf-8']]);
  assert.equal(exports.handler.handle(wit('GET', '/echo/hi')).status, 405);
});

test('a fetch function, sync or async; no fetch is a 404', async () => {
  const sync = exportsOf({ fetch: (req) => Response.json({ path: req.path }) }).exports;
  assert.equal(text(sync.handler.handle(wit('GET', '/a?b'))), '{"path":"/a"}');
  const async_ = exportsOf({ fetch: async () => 'later' }).exports;
  const pending = async_.handler.handle(wit('GET', '/'));
  assert.ok(pending instanceof Promise);
  assert.equal(text(await pending), 'later');
  assert.equal(exportsOf({}).exports.handler.handle(wit('GET', '/')).status, 404);
});

test('errors in fetch become answers, never traps', async () => {
  const { exports } = exportsOf({
    fetch: (req) => {
      if (req.path === '/teapot') throw new HttpError(418, "I'm a teapot");
      if (req.path === '/async') return Promise.reject(new Error('late'));
      throw new Error('boom');
    },
  });
  const teapot = exports.handler.handle(wit('GET', '/teapot'));
  assert.deepEqual([teapot.status, text(teapot)], [418, "I'm a teapot\n"]);
  assert.equal(exports.handler.handle(wit('GET', '/x')).status, 500);
  assert.equal((await exports.handler.handle(wit('GET', '/async'))).status, 500);
});

test("the alarm gets numbers; its error is thrown as the result's err string", async () => {
  const calls = [];
  const ok = exportsOf({ alarm: (at, retry) => void calls.push([at, retry]) }).exports;
  assert.equal(ok.events.alarm(1_700_000_000_000n, 2), undefined);
  assert.deepEqual(calls, [[1_700_000_000_000, 2]]);
  // No alarm handler: nothing to do.
  assert.equal(exportsOf({}).exports.events.alarm(1n, 0), undefined);

  const { exports, logged } = exportsOf({
    alarm: () => {
      throw new Error('database busy');
    },
  });
  assert.throws(() => exports.events.alarm(1n, 0), (thrown) => thrown === 'database busy');
  assert.deepEqual(logged, [['warn', 'alarm failed (retry 0): database busy']]);

  const later = exportsOf({ alarm: async () => Promise.reject(new Error('later')) }).exports;
  await assert.rejects(later.events.alarm(1n, 1), (thrown) => thrown === 'later');
  assert.equal(await exportsOf({ alarm: async () => {} }).exports.events.alarm(1n, 0), undefined);
});

test('socket events get text or bytes; their errors are logged', async () => {
  const seen = [];
  const { exports, logged } = exportsOf({
    message: (id, message) => {
      if (message === 'fail') throw new Error('cannot');
      seen.push([id, message]);
    },
    close: async (id, code, reason) => {
      seen.push([id, code, reason]);
      throw new Error('close failed');
    },
  });
  exports.events.socketMessage(4n, { tag: 'text', val: 'inc' });
  exports.events.socketMessage(4n, { tag: 'binary', val: new Uint8Array([1]) });
  assert.doesNotThrow(() => exports.events.socketMessage(4n, { tag: 'text', val: 'fail' }));
  await exports.events.socketClose(4n, 1000, 'bye');
  assert.deepEqual(seen, [[4n, 'inc'], [4n, new Uint8Array([1])], [4n, 1000, 'bye']]);
  assert.deepEqual(logged, [['error', 'socket 4 message failed: cannot'], ['error', 'socket 4 close failed: close failed']]);
  // Without handlers the events are ignored.
  const none = exportsOf({}).exports;
  assert.equal(none.events.socketMessage(1n, { tag: 'text', val: 'x' }), undefined);
  assert.equal(none.events.socketClose(1n, 1000, ''), undefined);
});
