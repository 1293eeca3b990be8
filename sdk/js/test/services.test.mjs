import assert from 'node:assert/strict';
import { test } from 'node:test';
import { createAlarm } from '../dist/alarm.js';
import { CallError, SocketError } from '../dist/errors.js';
import { Request } from '../dist/http.js';
import { createActors, createIdentity, createLog, createSecrets, formatLog } from '../dist/services.js';
import { createSockets, fromWitMessage, toWitMessage } from '../dist/sockets.js';

const hostError = (payload) => Object.assign(new Error('ComponentError'), { payload });

function fakeSockets(open = { 1n: 'alice', 2n: 'bob', 3n: undefined }) {
  const sent = [];
  return {
    sent,
    send(id, message) {
      if (!(id in open)) throw hostError('no such socket');
      sent.push([id, message]);
    },
    close(id, code, reason) {
      if (!(id in open)) throw hostError('no such socket');
      sent.push([id, 'close', code, reason]);
      delete open[id];
    },
    // The bindings may hand a list<u64> over as a BigUint64Array.
    list: () => BigUint64Array.from(Object.keys(open).map(BigInt)),
    setTag(id, tag) {
      if (!(id in open)) throw hostError('no such socket');
      open[id] = tag;
    },
    getTag: (id) => open[id],
  };
}

test('socket messages convert both ways', () => {
  assert.deepEqual(toWitMessage('hi'), { tag: 'text', val: 'hi' });
  assert.deepEqual(toWitMessage(new Uint8Array([1])), { tag: 'binary', val: new Uint8Array([1]) });
  assert.throws(() => toWitMessage(5), /a socket message is a string or a Uint8Array, not number/);
  assert.equal(fromWitMessage({ tag: 'text', val: 'x' }), 'x');
  assert.deepEqual(fromWitMessage({ tag: 'binary', val: new Uint8Array([2]) }), new Uint8Array([2]));
});

test('sockets: send, close, list, tags; errors are SocketErrors', () => {
  const host = fakeSockets();
  const sockets = createSockets(host);
  assert.deepEqual(sockets.list(), [1n, 2n, 3n]);
  sockets.send(1n, 'hi');
  sockets.close(2n);
  assert.deepEqual(host.sent, [[1n, { tag: 'text', val: 'hi' }], [2n, 'close', 1000, '']]);
  assert.throws(() => sockets.send(9n, 'x'), (err) => err instanceof SocketError && err.socket === 9n && err.message === 'socket 9: no such socket');
  sockets.setTag(3n, 'carol');
  assert.equal(sockets.tag(3n), 'carol');
  assert.equal(sockets.tag(9n), undefined);
});

test('broadcast skips the excepted socket and other tags, and counts', () => {
  const host = fakeSockets({ 1n: 'a', 2n: 'b', 3n: 'a' });
  const sockets = createSockets(host);
  assert.equal(sockets.broadcast('all'), 3);
  host.sent.length = 0;
  assert.equal(sockets.broadcast('not 1', { except: 1n }), 2);
  assert.deepEqual(host.sent.map(([id]) => id), [2n, 3n]);
  host.sent.length = 0;
  assert.equal(sockets.broadcast(new Uint8Array([7]), { tag: 'a' }), 2);
  assert.deepEqual(host.sent, [[1n, { tag: 'binary', val: new Uint8Array([7]) }], [3n, { tag: 'binary', val: new Uint8Array([7]) }]]);
});

test('a socket that fails during a broadcast is skipped', () => {
  const host = fakeSockets({ 1n: undefined, 2n: undefined });
  const send = host.send;
  host.send = (id, m) => {
    if (id === 1n) throw hostError('closed');
    send(id, m);
  };
  assert.equal(createSockets(host).broadcast('x'), 1);
});

test('alarm: get, set (ms, bigint, Date), setIn, clear', () => {
  let at;
  const host = { get: () => at, set: (ms) => (at = ms), clear: () => (at = undefined) };
  const alarm = createAlarm(host, () => 1_000);
  assert.equal(alarm.get(), undefined);
  assert.equal(alarm.set(5_000), 5_000);
  assert.equal(at, 5_000n);
  assert.equal(alarm.get(), 5_000);
  assert.equal(alarm.set(new Date(7_000)), 7_000);
  assert.equal(alarm.set(8_000n), 8_000);
  assert.equal(alarm.setIn(250), 1_250);
  assert.equal(at, 1_250n);
  alarm.clear();
  assert.equal(alarm.get(), undefined);
  assert.throws(() => alarm.set(1.5), /1.5 is not a whole number of milliseconds/);
  assert.throws(() => alarm.setIn(NaN), RangeError);
  assert.throws(() => alarm.set(2n ** 64n), /does not fit a signed 64-bit integer/);
});

test('actor calls send the WIT request and wrap failures', () => {
  const seen = [];
  const actors = createActors({
    call(className, name, request) {
      seen.push([className, name, request]);
      if (name === 'gone') throw hostError('no such class');
      return { status: 201, headers: [['x-a', '1']], body: new TextEncoder().encode('made') };
    },
  });
  const response = actors.call('room', 'lobby', { method: 'post', path: '/join?who=al', body: 'hi' });
  assert.deepEqual([response.status, response.header('X-A'), response.text()], [201, '1', 'made']);
  assert.deepEqual(seen[0], ['room', 'lobby', { method: 'POST', path: '/join?who=al', headers: [], body: new TextEncoder().encode('hi') }]);
  actors.call('room', 'lobby', new Request('GET', '/x'));
  assert.equal(seen[1][2].method, 'GET');
  assert.throws(
    () => actors.call('room', 'gone', { path: '/' }),
    (err) => err instanceof CallError && err.message === 'call to room/gone: no such class',
  );
});

test('secrets, identity and the log', () => {
  assert.equal(createSecrets({ get: (n) => (n === 'k' ? 'v' : undefined) }).get('k'), 'v');
  assert.deepEqual(createIdentity({ id: () => ({ tenant: 't', class: 'c', name: 'n' }) })(), { tenant: 't', class: 'c', name: 'n' });
  const lines = [];
  const log = createLog({ log: (level, message) => lines.push([level, message]) });
  log.info('count is', 3, { big: 2n ** 64n });
  log.warn('w');
  log.log('trace', 't');
  assert.deepEqual(lines, [['info', 'count is 3 {"big":"18446744073709551616"}'], ['warn', 'w'], ['trace', 't']]);
  assert.match(formatLog([new Error('boom')]), /^Error: boom\n/);
  assert.equal(formatLog([undefined, null, 1n]), 'undefined null "1"');
});
