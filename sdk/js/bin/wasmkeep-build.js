#!/usr/bin/env node
// wasmkeep-build: a TypeScript (or JavaScript) actor -> a WebAssembly component.
//
//   wasmkeep-build src/actor.ts -o actor.wasm
//
// 1. type-checks the project with the SDK's TypeScript when it has a
//    tsconfig.json (skip with --no-check);
// 2. bundles the entry and everything it imports (the SDK included) into one
//    ES module with esbuild, leaving the wasmkeep:* and wasi:* imports to the
//    component; a small wrapper exports the entry's default export (what
//    defineActor returned) as the world's `handler` and `events`;
// 3. builds the component with componentize-js against the SDK's copy of
//    wit/actor.wit (world `actor`). fetch() stays available (wasi:http
//    outgoing, allow-listed per class by the host); the fetch-event export is
//    not part of the world and is disabled.
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { copyFile, mkdir, mkdtemp, rm, stat, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const SDK = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const require = createRequire(import.meta.url);

const USAGE = `usage: wasmkeep-build ENTRY [-o OUT.wasm] [--no-check] [--tsconfig FILE] [--bundle FILE]

  ENTRY          the actor module (.ts or .js); its default export is what
                 defineActor returned (or it exports handler and events)
  -o OUT.wasm    the component to write (default: ENTRY's name with .wasm)
  --no-check     skip the type check
  --tsconfig F   the tsconfig.json to check with (default: ./tsconfig.json when present)
  --bundle F     also keep the bundled ES module at F
`;

function parseArgs(argv) {
  const opts = { entry: undefined, out: undefined, check: true, tsconfig: undefined, bundle: undefined };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) fail(`${arg} needs a value`);
      return argv[++i];
    };
    if (arg === '-o' || arg === '--out') opts.out = value();
    else if (arg === '--no-check') opts.check = false;
    else if (arg === '--tsconfig') opts.tsconfig = value();
    else if (arg === '--bundle') opts.bundle = value();
    else if (arg === '-h' || arg === '--help') {
      process.stdout.write(USAGE);
      process.exit(0);
    } else if (arg.startsWith('-')) fail(`unknown option ${arg}`);
    else if (opts.entry === undefined) opts.entry = arg;
    else fail(`one entry only (got ${opts.entry} and ${arg})`);
  }
  if (opts.entry === undefined) fail('no entry given');
  opts.out ??= basename(opts.entry).replace(/\.[cm]?[jt]s$/, '') + '.wasm';
  return opts;
}

function fail(message) {
  process.stderr.write(`wasmkeep-build: ${message}\n\n${USAGE}`);
  process.exit(2);
}

function seconds(since) {
  return `${((performance.now() - since) / 1000).toFixed(1)} s`;
}

function say(message) {
  process.stderr.write(`wasmkeep-build: ${message}\n`);
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const entry = resolve(opts.entry);
  const out = resolve(opts.out);
  if (!existsSync(entry)) fail(`${opts.entry} does not exist`);

  const tsconfig = opts.tsconfig ?? (existsSync('tsconfig.json') ? 'tsconfig.json' : undefined);
  if (opts.check && tsconfig !== undefined) {
    const started = performance.now();
    const tsc = join(dirname(require.resolve('typescript/package.json')), 'bin', 'tsc');
    const result = spawnSync(process.execPath, [tsc, '--noEmit', '-p', tsconfig], { stdio: 'inherit' });
    if (result.status !== 0) {
      say('the type check failed (--no-check skips it)');
      process.exit(1);
    }
    say(`type check ${seconds(started)}`);
  }

  const work = await mkdtemp(join(tmpdir(), 'wasmkeep-build-'));
  try {
    let started = performance.now();
    const bundle = join(work, 'actor.js');
    const esbuild = await import('esbuild');
    // The wrapper turns the entry's default export into the world's exports;
    // componentize-js reads them as static named exports.
    const wrapper = [
      `import * as entry from ${JSON.stringify(entry)};`,
      `const actor = entry.default ?? entry;`,
      `if (!actor || typeof actor.handler !== 'object' || typeof actor.events !== 'object') {`,
      `  throw new Error(${JSON.stringify(`${opts.entry}: export default defineActor({ ... }) (or export handler and events)`)});`,
      `}`,
      `export const handler = actor.handler;`,
      `export const events = actor.events;`,
    ].join('\n');
    await esbuild.build({
      stdin: { contents: wrapper, resolveDir: process.cwd(), sourcefile: 'wasmkeep-entry.js', loader: 'js' },
      bundle: true,
      format: 'esm',
      platform: 'neutral',
      mainFields: ['module', 'main'],
      target: 'es2022',
      external: ['wasmkeep:*', 'wasi:*'],
      outfile: bundle,
      logLevel: 'warning',
      legalComments: 'none',
    });
    say(`bundle ${seconds(started)} (${(await stat(bundle)).size} bytes)`);
    if (opts.bundle !== undefined) {
      await mkdir(dirname(resolve(opts.bundle)), { recursive: true });
      await copyFile(bundle, resolve(opts.bundle));
    }

    started = performance.now();
    const { componentize } = await import('@bytecodealliance/componentize-js');
    const { component } = await componentize({
      sourcePath: bundle,
      witPath: join(SDK, 'wit'),
      worldName: 'actor',
      disableFeatures: ['fetch-event'],
    });
    await mkdir(dirname(out), { recursive: true });
    await writeFile(out, component);
    say(`componentize ${seconds(started)}`);
    say(`built ${out} (${component.length} bytes)`);
  } finally {
    await rm(work, { recursive: true, force: true });
  }
}

main().catch((err) => {
  process.stderr.write(`wasmkeep-build: ${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
});
