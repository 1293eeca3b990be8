import assert from 'node:assert/strict';
import { test } from 'node:test';
import { CallError, HttpError, errorText } from '../dist/errors.js';
import { Request, Response, errorResponse, parseQuery, percentDecode, stringifyJson } from '../dist/http.js';

const bytes = (text) => new TextEncoder().encode(text);

test('the query string is split from the path and decoded', () => {
  const request = new Request('get', '/history?limit=5&user=al%20ice+b&flag');
  assert.equal(request.method, 'GET');
  assert.equal(request.path, '/history');
  assert.equal(request.query, 'limit=5&user=al%20ice+b&flag');
  assert.equal(request.queryParam('user'), 'al ice b');
  assert.equal(request.queryParam('flag'), '');
  assert.equal(request.queryParam('missing'), undefined);
  assert.deepEqual(parseQuery('a=1&a=2&&b'), [['a', '1'], ['a', '2'], ['b', '']]);
});

test('percent-decoding keeps invalid escapes and decodes UTF-8', () => {
  assert.equal(percentDecode('100%'), '100%');
  assert.equal(percentDecode('%zz%41'), '%zzA');
  assert.equal(percentDecode('%e2%82%ac'), '\u20ac');
  assert.equal(percentDecode('a+b', false), 'a+b');
  assert.equal(percentDecode('%ff'), '\ufffd');
});

test('request bodies as bytes, text and JSON; bad ones are 400s', () => {
  const request = Request.fromWit({
    method: 'POST',
    path: '/a?b=c',
    headers: [['content-type', 'application/json']],
    body: bytes('{"n": 1}'),
  });
  assert.equal(request.header('Content-Type'), 'application/json');
  assert.equal(request.text(), '{"n": 1}');
  assert.deepEqual(request.json(), { n: 1 });
  assert.deepEqual(request.body, bytes('{"n": 1}'));
  const notJson = new Request('POST', '/', { body: 'nope' });
  assert.throws(() => notJson.json(), (err) => err instanceof HttpError && err.status === 400);
  const notUtf8 = new Request('POST', '/', { body: new Uint8Array([0xff, 0xfe]) });
  assert.throws(() => notUtf8.text(), { status: 400, message: 'bad request: the body is not valid UTF-8' });
});

test('a request round-trips its query through the WIT shape', () => {
  const request = new Request('GET', '/a?b=c', { headers: { 'X-Y': 'z' } });
  const wit = request.toWit();
  assert.equal(wit.path, '/a?b=c');
  assert.deepEqual(wit.headers, [['x-y', 'z']]);
  assert.deepEqual(Request.fromWit(wit), request);
});

test('response builders set status, content type and body', () => {
  const text = Response.text('hi', 201);
  assert.deepEqual([text.status, text.header('content-type'), text.text()], [201, 'text/plain; charset=utf-8', 'hi']);
  const json = Response.json({ n: 1n, big: 2n ** 60n, list: [1, 'a'] });
  assert.equal(json.header('content-type'), 'application/json');
  assert.equal(json.text(), '{"n":1,"big":"1152921504606846976","list":[1,"a"]}');
  assert.deepEqual(json.json(), { n: 1, big: '1152921504606846976', list: [1, 'a'] });
  const raw = Response.bytes(new Uint8Array([1, 2]), 'image/png');
  assert.deepEqual([raw.header('content-type'), [...raw.body]], ['image/png', [1, 2]]);
  assert.deepEqual([Response.status(204).status, Response.status(204).body.length, Response.status(204).headers], [204, 0, []]);
  assert.equal(Response.badRequest('x').text(), 'bad request: x\n');
  assert.equal(Response.methodNotAllowed(['GET', 'HEAD']).header('allow'), 'GET, HEAD');
});

test('the constructor is like the web one', () => {
  const r = new Response('hi', { status: 202, headers: { 'X-A': '1' } });
  assert.deepEqual(r.headers, [['content-type', 'text/plain; charset=utf-8'], ['x-a', '1']]);
  const typed = new Response('<p>', { headers: [['Content-Type', 'text/html']] });
  assert.deepEqual(typed.headers, [['content-type', 'text/html']]);
  assert.equal(new Response().status, 200);
  assert.throws(() => new Response('', { status: 42 }), RangeError);
  assert.throws(() => new Response(42), /a body is a string or a Uint8Array, not number/);
});

test('setHeader replaces, withHeader adds', () => {
  const response = Response.text('<p>hi</p>')
    .setHeader('Content-Type', 'text/html')
    .withHeader('set-cookie', 'a=1')
    .withHeader('Set-Cookie', 'b=2');
  const values = (name) => response.headers.filter(([n]) => n === name).map(([, v]) => v);
  assert.deepEqual(values('content-type'), ['text/html']);
  assert.deepEqual(values('set-cookie'), ['a=1', 'b=2']);
  assert.equal(response.toWit().status, 200);
});

test('errors become responses with their status', () => {
  assert.deepEqual([errorResponse(new HttpError(409, 'taken')).status, errorResponse(new HttpError(409, 'taken')).text()], [409, 'taken\n']);
  assert.equal(errorResponse(new CallError('room', 'a', 'no such class')).status, 502);
  assert.equal(errorResponse('a string').status, 500);
});

test('errorText reads the payload componentize-js throws', () => {
  const thrown = Object.assign(new Error('ComponentError'), { payload: 'no such table: t' });
  assert.equal(errorText(thrown), 'no such table: t');
  assert.equal(errorText(new Error('plain')), 'plain');
  assert.equal(errorText('s'), 's');
});

test('stringifyJson passes everything else through', () => {
  assert.equal(stringifyJson({ a: [1, null, 'x'] }), '{"a":[1,null,"x"]}');
  assert.equal(stringifyJson(-(2n ** 53n)), '"-9007199254740992"');
});
