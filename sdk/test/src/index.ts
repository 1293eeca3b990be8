// @wasmkeep/test: a test harness for wasmkeep actors in Node (ADR 0073,
// ADR 0075). It starts `wasmkeep dev --test-routes` on a memory bucket, a
// temporary data folder and a free loopback port, and drives an actor
// through the node's test routes: the same operations, with the same
// outcomes, as the Rust harness (`wasmkeep-test`).
//
//   const node = await TestNode.start();
//   await node.deploy('counter', 'counter.wasm');
//   const actor = node.actor('demo/counter/a');
//   await actor.fetch('/increment', { method: 'POST' });
//   await actor.hibernate();
//   (await actor.sql('SELECT n FROM counter')).rows;   // [[1]]
//   await node.advance(60_000);                         // the alarms due by then ran
//   await node.stop();

import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { createInterface } from 'node:readline';
import WebSocket from 'ws';

/** How long the binary may take to start serving. */
const START_TIME_MAX_MS = 60_000;
/** How long a socket read waits before it fails the test. */
export const SOCKET_RECV_TIME_MAX_MS = 30_000;
/** How many of the node's last log lines an error about it quotes. */
const LOG_TAIL_LINES_MAX = 40;
/** What `wasmkeep dev` prints on stdout once it serves. */
const SERVING_PREFIX = 'wasmkeep dev: serving on http://';

/** The node refused or failed an operation: its HTTP status, its error's
 * stable code and message (`409` for an alarm that is not set or a
 * hibernation while a socket is open, `400` for a bad statement). */
export class RefusedError extends Error {
  readonly status: number;
  readonly code: string;

  constructor(status: number, code: string, message: string) {
    super(`the node answered ${status}: ${message}`);
    this.name = 'RefusedError';
    this.status = status;
    this.code = code;
  }
}

/** Rows a statement returned; a blob is `{hex: "..."}`. */
export interface Rows {
  columns: string[];
  rows: unknown[][];
}

/** What a statement with `sqlWrite` returned, and the rows it changed. */
export interface Written extends Rows {
  changes: number;
}

export interface StartOptions {
  /** The `wasmkeep` binary; default `WASMKEEP_BIN`, else `wasmkeep` on PATH. */
  bin?: string;
}

/** The `wasmkeep` binary: `WASMKEEP_BIN`, else `wasmkeep` on PATH. */
export function wasmkeepBin(): string {
  const given = process.env.WASMKEEP_BIN;
  if (given) {
    if (!isFile(given)) {
      throw new Error(`WASMKEEP_BIN is ${given}, which is not a file`);
    }
    return given;
  }
  for (const dir of (process.env.PATH ?? '').split(delimiter)) {
    const bin = join(dir, 'wasmkeep');
    if (dir && isFile(bin)) return bin;
  }
  throw new Error('no wasmkeep binary: set WASMKEEP_BIN to its path, or put wasmkeep on PATH');
}

function isFile(path: string): boolean {
  try {
    return statSync(path).isFile();
  } catch {
    return false;
  }
}

/** Builds the actor project in `dir` with `wasmkeep build` and returns the
 * component it wrote (`DIR/NAME.wasm`). */
export function build(dir: string, options: StartOptions = {}): string {
  const bin = options.bin ?? wasmkeepBin();
  const run = spawnSync(bin, ['build', dir], { stdio: ['ignore', 'ignore', 'pipe'], encoding: 'utf8' });
  const stderr = run.stderr ?? '';
  if (run.error || run.status !== 0) {
    throw new Error(`wasmkeep build ${dir} failed (${run.error?.message ?? `exit ${run.status}`}):\n${stderr}`);
  }
  // It says `wasmkeep: built PATH (N bytes)` last.
  const built = stderr
    .split('\n')
    .reverse()
    .map((line) => /^wasmkeep: built (.*) \(\d+ bytes\)$/.exec(line)?.[1])
    .find((path) => path !== undefined);
  if (!built) throw new Error(`wasmkeep build said no component:\n${stderr}`);
  return built;
}

/** Where compiled components are kept between runs (shared with the Rust
 * harness; keyed by the component's digest and the engine's version). */
function componentCacheDir(): string {
  return join(tmpdir(), 'wasmkeep-test-components');
}

/** One `wasmkeep dev --test-routes` process. */
export class TestNode {
  /** `http://127.0.0.1:PORT`, for any other client. */
  readonly url: string;
  readonly #child: ChildProcess;
  readonly #dataDir: string;
  readonly #log: string[];
  /** The node's wall clock minus this machine's, as last read. */
  #offsetMs = 0;

  private constructor(url: string, child: ChildProcess, dataDir: string, log: string[]) {
    this.url = url;
    this.#child = child;
    this.#dataDir = dataDir;
    this.#log = log;
  }

  /** Starts the node and waits until it serves. */
  static async start(options: StartOptions = {}): Promise<TestNode> {
    const bin = options.bin ?? wasmkeepBin();
    const dataDir = mkdtempSync(join(tmpdir(), 'wasmkeep-test-'));
    try {
      const cache = componentCacheDir();
      mkdirSync(cache, { recursive: true });
      symlinkSync(cache, join(dataDir, 'components'));
    } catch {
      // Without the shared cache each node compiles anew.
    }
    const child = spawn(
      bin,
      ['dev', '--test-routes', '--bucket', 'memory://', '--listen', '127.0.0.1:0', '--console', 'off', '--data-dir', dataDir],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    const log: string[] = [];
    createInterface({ input: child.stderr! }).on('line', (line) => {
      if (log.length === LOG_TAIL_LINES_MAX) log.shift();
      log.push(line);
    });
    const fail = (why: string) => {
      child.kill('SIGKILL');
      rmSync(dataDir, { recursive: true, force: true });
      return new Error(`${bin} dev --test-routes ${why}:\n${log.map((l) => `  ${l}`).join('\n')}`);
    };
    const url = await new Promise<string>((resolve, reject) => {
      let settled = false;
      const settle = (outcome: () => void) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        outcome();
      };
      const timer = setTimeout(
        () => settle(() => reject(fail(`did not serve within ${START_TIME_MAX_MS} ms`))),
        START_TIME_MAX_MS,
      );
      createInterface({ input: child.stdout! }).on('line', (line) => {
        if (line.startsWith(SERVING_PREFIX)) {
          settle(() => resolve(`http://${line.slice(SERVING_PREFIX.length).split(/\s/)[0]}`));
        }
      });
      child.once('error', (e) => settle(() => reject(fail(`could not start (${e.message})`))));
      child.once('exit', (code, signal) => {
        // stderr's last lines may still be on their way.
        setImmediate(() => settle(() => reject(fail(`stopped before serving (${signal ?? `exit ${code}`})`))));
      });
    });
    const node = new TestNode(url, child, dataDir, log);
    await node.#waitHealthy();
    return node;
  }

  async #waitHealthy(): Promise<void> {
    const deadline = Date.now() + START_TIME_MAX_MS;
    for (;;) {
      const ok = await fetch(`${this.url}/_wasmkeep/health`).then((r) => r.ok, () => false);
      if (ok) return;
      if (Date.now() >= deadline) throw new Error(`the node at ${this.url} never answered its health check`);
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  }

  /** A test route (`/_wasmkeep/test/...`): its JSON answer (`null` for
   * none); any status but 2xx is a {@link RefusedError}. */
  async testRoute(method: string, path: string, body?: Uint8Array | string): Promise<any> {
    const response = await fetch(`${this.url}/_wasmkeep/test${path}`, { method, body });
    const text = await response.text();
    if (!response.ok) {
      let code = '';
      let message = text;
      try {
        const json = JSON.parse(text) as { code?: string; error?: string };
        code = json.code ?? '';
        message = json.error ?? text;
      } catch {
        // Not the node's JSON: the text as it came.
      }
      throw new RefusedError(response.status, code, message);
    }
    return text === '' ? null : JSON.parse(text);
  }

  /** Deploys a component (its bytes, or a `.wasm` file's path) as
   * `className`, validated and compiled as `wasmkeep deploy` does, and
   * loads it at once; actors switch at their next event. */
  async deploy(className: string, component: Uint8Array | string): Promise<void> {
    const bytes = typeof component === 'string' ? readFileSync(component) : component;
    await this.testRoute('POST', `/classes/${encodeURIComponent(className)}`, bytes);
  }

  /** A handle on the actor `TENANT/CLASS/NAME` (nothing runs until it is
   * asked something). */
  actor(id: string): TestActor {
    const parts = id.split('/');
    if (parts.length !== 3 || parts.some((p) => p === '')) {
      throw new Error(`${JSON.stringify(id)} is not an actor id: write TENANT/CLASS/NAME`);
    }
    return new TestActor(this, parts.map(encodeURIComponent).join('/'), id);
  }

  /** The node's wall clock now (milliseconds since the Unix epoch; alarm
   * times are on it): this machine's, plus how far `advance` moved it. */
  now(): number {
    return Date.now() + this.#offsetMs;
  }

  /** Moves the node's wall clock forward by `ms` and runs every alarm due
   * by then, each in its actor's mailbox; resolves once they ran (their
   * writes durable) with the ids of the actors whose alarm ran. */
  async advance(ms: number): Promise<string[]> {
    if (!Number.isSafeInteger(ms) || ms < 0) {
      throw new Error(`advance(${ms}): a whole, non-negative number of milliseconds`);
    }
    try {
      const answer = (await this.testRoute('POST', `/clock/advance?ms=${ms}`)) as { ran: string[] };
      return answer.ran;
    } finally {
      // The node moved its clock if it took the call, even if an alarm failed.
      const { now_ms } = (await this.testRoute('GET', '/clock')) as { now_ms: number };
      this.#offsetMs = now_ms - Date.now();
    }
  }

  /** Stops the node (killed: its memory bucket goes with it) and removes
   * its data folder. */
  async stop(): Promise<void> {
    if (this.#child.exitCode === null && this.#child.signalCode === null) {
      const exited = new Promise((resolve) => this.#child.once('exit', resolve));
      this.#child.kill('SIGKILL');
      await exited;
    }
    rmSync(this.#dataDir, { recursive: true, force: true });
  }

  /** The node's last log lines (its stderr). */
  logs(): string {
    return this.#log.join('\n');
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.stop();
  }
}

/** One actor of a {@link TestNode}. */
export class TestActor {
  readonly #node: TestNode;
  /** The id's parts, percent-encoded for a path. */
  readonly #path: string;
  /** `TENANT/CLASS/NAME`. */
  readonly id: string;

  constructor(node: TestNode, path: string, id: string) {
    this.#node = node;
    this.#path = path;
    this.id = id;
  }

  /** A request to the actor: `path` inside it, with its query (`/value?x=1`). */
  fetch(path: string, init?: RequestInit): Promise<Response> {
    return fetch(`${this.#node.url}/${this.#path}${path}`, init);
  }

  /** A read-only statement on the actor's database as the bucket holds it
   * (every acknowledged write), as `wasmkeep actor sql` runs it: nothing of
   * the actor runs and nothing is written. A statement that writes is
   * refused (400); an actor with nothing in the bucket is 404. */
  async sql(statement: string): Promise<Rows> {
    return (await this.#node.testRoute('POST', `/actors/${this.#path}/sql`, statement)) as Rows;
  }

  /** A statement that may write, run as one event of the actor (activating
   * it if needed), as `wasmkeep actor sql --write` runs it. */
  async sqlWrite(statement: string): Promise<Written> {
    return (await this.#node.testRoute('POST', `/actors/${this.#path}/sql?write=1`, statement)) as Written;
  }

  /** Runs the actor's alarm now, whatever time it is set for; a
   * {@link RefusedError} 409 if none is set. */
  async fireAlarm(): Promise<void> {
    await this.#node.testRoute('POST', `/actors/${this.#path}/alarm`);
  }

  /** Hibernates the actor (out of memory; its next event restores it from
   * the bucket); a {@link RefusedError} 409 while a socket is open. */
  async hibernate(): Promise<void> {
    await this.#node.testRoute('POST', `/actors/${this.#path}/hibernate`);
  }

  /** Whether the actor is in the node's memory now. */
  async isResident(): Promise<boolean> {
    const answer = (await this.#node.testRoute('GET', `/actors/${this.#path}/resident`)) as { resident: boolean };
    return answer.resident;
  }

  /** Opens a WebSocket to the actor at `path`. */
  socket(path: string): Promise<TestSocket> {
    return TestSocket.open(`${this.#node.url.replace(/^http/, 'ws')}/${this.#path}${path}`);
  }
}

/** A WebSocket client of an actor, whose messages are read in order. */
export class TestSocket {
  readonly #ws: WebSocket;
  readonly #queue: (string | Uint8Array | null)[] = [];
  #waiting: ((message: string | Uint8Array | null) => void) | undefined;
  #closed: Promise<void>;

  private constructor(ws: WebSocket) {
    this.#ws = ws;
    ws.on('message', (data, isBinary) => {
      const message = isBinary ? new Uint8Array(data as Buffer) : (data as Buffer).toString('utf8');
      this.#push(message);
    });
    this.#closed = new Promise((resolve) => {
      ws.once('close', () => {
        this.#push(null);
        resolve();
      });
    });
  }

  static open(url: string): Promise<TestSocket> {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(url);
      const socket = new TestSocket(ws);
      ws.once('open', () => resolve(socket));
      ws.once('error', reject);
      ws.once('unexpected-response', (_request, response) => {
        reject(new Error(`${url}: the node answered ${response.statusCode}, not a WebSocket`));
      });
    });
  }

  #push(message: string | Uint8Array | null): void {
    const waiting = this.#waiting;
    if (waiting) {
      this.#waiting = undefined;
      waiting(message);
    } else {
      this.#queue.push(message);
    }
  }

  send(message: string | Uint8Array): void {
    this.#ws.send(message);
  }

  /** The next message (text as a string, binary as bytes); `null` once the
   * socket closed. Fails after {@link SOCKET_RECV_TIME_MAX_MS}. */
  next(): Promise<string | Uint8Array | null> {
    if (this.#queue.length > 0) return Promise.resolve(this.#queue.shift()!);
    if (this.#waiting) return Promise.reject(new Error('another next() is waiting on this socket'));
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#waiting = undefined;
        reject(new Error(`no socket message within ${SOCKET_RECV_TIME_MAX_MS} ms`));
      }, SOCKET_RECV_TIME_MAX_MS);
      this.#waiting = (message) => {
        clearTimeout(timer);
        resolve(message);
      };
    });
  }

  /** The next message, which must be text. */
  async nextText(): Promise<string> {
    const message = await this.next();
    if (typeof message !== 'string') {
      throw new Error(message === null ? 'the socket closed' : 'a binary message where text was expected');
    }
    return message;
  }

  /** Closes the socket (code 1000) and waits for the actor's close. */
  async close(): Promise<void> {
    this.#ws.close(1000);
    await this.#closed;
  }
}
