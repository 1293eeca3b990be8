// The actor on a real node: builds it (`wasmkeep build`), serves it with
// `wasmkeep dev` on a free loopback port and a new folder bucket,
// and asks it over HTTP. Finds `wasmkeep` on PATH, or in $WASMKEEP.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const wasmkeep = process.env.WASMKEEP || 'wasmkeep';
const project = fileURLToPath(new URL('..', import.meta.url));

function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

test('increments are counted', async (t) => {
  execFileSync(wasmkeep, ['build', project], { stdio: 'inherit' });
  const data = mkdtempSync(join(tmpdir(), '{{name}}-test-'));
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  const node = spawn(wasmkeep, [
    'dev', '--listen', `127.0.0.1:${port}`, '--console', 'off',
    // The compiled component is cached in .wasmkeep from one run to the next.
    `--bucket=file://${join(data, 'bucket')}`, `--data-dir=${join(project, '.wasmkeep')}`,
    `{{name}}=${join(project, '{{name}}.wasm')}`,
  ], { stdio: ['ignore', 'ignore', 'inherit'] });
  t.after(() => {
    node.kill();
    rmSync(data, { recursive: true, force: true });
  });
  const deadline = Date.now() + 60_000;
  for (;;) {
    const ok = await fetch(`${base}/_wasmkeep/health`).then((r) => r.ok, () => false);
    if (ok) break;
    assert.ok(Date.now() < deadline, 'the node did not start');
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  const actor = `${base}/demo/{{name}}/first`;
  const ask = async (method, path) => {
    const r = await fetch(actor + path, { method });
    return [r.status, await r.text()];
  };
  assert.deepEqual(await ask('GET', '/value'), [200, '0']);
  assert.deepEqual(await ask('POST', '/increment'), [200, '1']);
  assert.deepEqual(await ask('POST', '/increment'), [200, '2']);
  assert.deepEqual(await ask('GET', '/value'), [200, '2']);
});
