// The package's shape: pure modules stay pure, the WIT copy matches the repository's.
import assert from 'node:assert/strict';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const SDK = join(dirname(fileURLToPath(import.meta.url)), '..');

test('only host.js imports wasmkeep:* (index.js wires it); every other module loads in Node', async () => {
  const dist = join(SDK, 'dist');
  for (const file of readdirSync(dist).filter((f) => f.endsWith('.js'))) {
    const source = readFileSync(join(dist, file), 'utf8');
    const importsHost = /from\s+['"]wasmkeep:/.test(source);
    assert.equal(importsHost, file === 'host.js', `${file} ${importsHost ? 'imports' : 'does not import'} wasmkeep:*`);
    if (file !== 'host.js' && file !== 'index.js') await import(join(dist, file));
  }
  // The public types must not name the host modules (a user's tsc has no declarations for them).
  for (const file of readdirSync(dist).filter((f) => f.endsWith('.d.ts'))) {
    assert.doesNotMatch(readFileSync(join(dist, file), 'utf8'), /wasmkeep:actor/, file);
  }
});

test("the SDK's copy of the WIT is the repository's", (t) => {
  const repo = join(SDK, '..', '..', 'wit', 'actor.wit');
  if (!existsSync(repo)) return t.skip('not inside the wasmkeep repository');
  assert.equal(
    readFileSync(join(SDK, 'wit', 'actor.wit'), 'utf8'),
    readFileSync(repo, 'utf8'),
    'sdk/js/wit/actor.wit differs from wit/actor.wit: copy it (cp wit/actor.wit sdk/js/wit/)',
  );
});

test('every interface of the world has a declaration for the compiler', () => {
  const wit = readFileSync(join(SDK, 'wit', 'actor.wit'), 'utf8');
  const declared = readFileSync(join(SDK, 'src', 'wit.d.ts'), 'utf8');
  const imports = [...wit.matchAll(/^\s*import (\w[\w-]*);/gm)].map((m) => m[1]);
  assert.ok(imports.length >= 7, `imports: ${imports}`);
  for (const name of imports) assert.match(declared, new RegExp(`'wasmkeep:actor/${name}@0\\.1\\.0'`), name);
});
