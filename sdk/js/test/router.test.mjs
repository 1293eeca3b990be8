import assert from 'node:assert/strict';
import { test } from 'node:test';
import { HttpError } from '../dist/errors.js';
import { INTERNAL_ERROR_TEXT, Request, Response, setErrorReporter } from '../dist/http.js';
import { Router, parseInteger } from '../dist/router.js';

function router() {
  return new Router()
    .get('/', () => 'help')
    .get('/items/:id', (_req, params) => `item ${parseInteger(params.id, 'path parameter id', { min: 0 })}`)
    .post('/items/:id', () => Response.status(201))
    .get('/files/*path', (_req, params) => params.path)
    .get('/users/:user/posts/:post', (_req, p) => `${p.user}:${p.post}`);
}

const get = (path, method = 'GET') => router().handle(new Request(method, path));

test('path parameters are captured and passed to the handler', () => {
  const response = get('/items/42');
  assert.equal(response.status, 200);
  assert.equal(response.text(), 'item 42');
  assert.equal(response.header('Content-Type'), 'text/plain; charset=utf-8');
  assert.equal(get('/users/al%20ice/posts/7').text(), 'al ice:7');
});

test('a bad parameter is a 400 naming it', () => {
  const response = get('/items/x');
  assert.equal(response.status, 400);
  assert.match(response.text(), /path parameter id="x"/);
});

test('a wrong method is a 405 with allow', () => {
  const response = get('/items/1', 'DELETE');
  assert.equal(response.status, 405);
  assert.equal(response.header('allow'), 'GET, HEAD, POST');
  assert.equal(response.text(), 'method not allowed\n');
});

test('an unknown path is a 404', () => {
  assert.equal(get('/nope').status, 404);
  assert.equal(get('/nope').text(), 'not found\n');
  assert.equal(get('/items/1/x').status, 404);
  assert.equal(get('/items').status, 404);
});

test('HEAD runs the GET route unless a route takes HEAD', () => {
  const response = get('/items/42', 'HEAD');
  assert.deepEqual([response.status, response.text()], [200, 'item 42']);
  const own = new Router().get('/x', () => 'get').route('HEAD', '/x', () => Response.status(204));
  assert.equal(own.handle(new Request('HEAD', '/x')).status, 204);
  assert.equal(get('/nope', 'HEAD').status, 404);
});

test('root, trailing slashes, rest patterns and query strings', () => {
  assert.equal(get('/?x=1').text(), 'help');
  assert.equal(get('').text(), 'help');
  assert.equal(get('/items/5/').text(), 'item 5');
  assert.equal(get('/files/a/b%20c').text(), 'a/b c');
  // A + in a path is a +; in a query a space.
  assert.equal(get('/files/a+b%2Bc?q=x+y').text(), 'a+b+c');
});

test('methods are matched in any case and * takes every method', () => {
  const r = new Router().route('post', '/a', () => 'posted').all('/any', (req) => req.method);
  assert.equal(r.handle(new Request('POST', '/a')).text(), 'posted');
  assert.equal(r.handle(new Request('patch', '/any')).text(), 'PATCH');
});

test('a rest segment must be last', () => {
  assert.throws(() => new Router().get('/*rest/x', () => ''), /must be the last segment/);
});

test('async handlers resolve to responses; their errors become answers', async () => {
  const r = new Router()
    .get('/ok', async () => 'later')
    .get('/bad', async () => {
      throw HttpError.badRequest('no');
    });
  const ok = r.handle(new Request('GET', '/ok'));
  assert.ok(ok instanceof Promise);
  assert.equal((await ok).text(), 'later');
  const bad = await r.handle(new Request('GET', '/bad'));
  assert.deepEqual([bad.status, bad.text()], [400, 'bad request: no\n']);
  // A sync handler stays sync.
  assert.ok(router().handle(new Request('GET', '/')) instanceof Response);
});

test("an actor's own error is a 500 that does not tell the client why, and is reported", () => {
  const reported = [];
  setErrorReporter((message) => reported.push(message));
  try {
    const secret = 'UNIQUE constraint failed: users.email (alice@example.com)';
    const r = new Router()
      .get('/throw', () => {
        throw new Error(secret);
      })
      .get('/number', () => 42);
    const response = r.handle(new Request('GET', '/throw'));
    assert.equal(response.status, 500);
    assert.equal(response.text(), `${INTERNAL_ERROR_TEXT}\n`);
    assert.equal(reported.length, 1);
    assert.match(reported[0], /alice@example.com/);
    const wrong = r.handle(new Request('GET', '/number'));
    assert.equal(wrong.status, 500);
    assert.match(reported[1], /returned number; return a Response or a string/);
  } finally {
    setErrorReporter(() => {});
  }
});

test('parseInteger checks the range and the digits', () => {
  assert.equal(parseInteger('12', 'x'), 12);
  assert.equal(parseInteger('-3', 'x'), -3);
  assert.throws(() => parseInteger(undefined, 'query parameter n'), { status: 400, message: 'bad request: missing query parameter n' });
  assert.throws(() => parseInteger('1.5', 'x'), { status: 400 });
  assert.throws(() => parseInteger('7', 'x', { max: 5 }), /is not a whole number in/);
  assert.throws(() => parseInteger('99999999999999999999', 'x'), { status: 400 });
});
