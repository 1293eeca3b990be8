// The actor on a real node, with @wasmkeep/test: builds it (`wasmkeep
// build`), starts `wasmkeep dev --test-routes` on a memory bucket and a free
// loopback port, and asks it over HTTP; reads its database, hibernates it.
// Finds `wasmkeep` on PATH, or in $WASMKEEP_BIN.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { TestNode, build } from '@wasmkeep/test';

const project = fileURLToPath(new URL('..', import.meta.url));

test('increments are counted, and kept across hibernation', async (t) => {
  const component = build(project);
  const node = await TestNode.start();
  t.after(() => node.stop());
  await node.deploy('{{name}}', component);
  const actor = node.actor('demo/{{name}}/first');
  const ask = async (method, path) => {
    const r = await actor.fetch(path, { method });
    return [r.status, await r.text()];
  };
  assert.deepEqual(await ask('GET', '/value'), [200, '0']);
  assert.deepEqual(await ask('POST', '/increment'), [200, '1']);
  assert.deepEqual(await ask('POST', '/increment'), [200, '2']);
  // The actor's own database, as the bucket holds it.
  assert.deepEqual((await actor.sql('SELECT n FROM counter')).rows, [[2]]);
  // Out of memory and back: the count is kept.
  await actor.hibernate();
  assert.deepEqual(await ask('GET', '/value'), [200, '2']);
});
