// A self-checking Worker for hearth's JS engine's web APIs
// (sdk/js/engine/src/web/*.js): `GET /` runs every check below and answers
// JSON {passed: N, failed: [{name, error}]}. It must give `failed: []` on
// workerd and on the engine (tests/it/js_web.rs runs it on hearth). Checks
// compare behaviour and error types, not error messages (those differ).

const checks = [];
const test = (name, f) => checks.push([name, f]);

const fmt = (v) => {
  try { return typeof v === 'string' ? JSON.stringify(v) : typeof v === 'bigint' ? v + 'n' : JSON.stringify(v) ?? String(v); } catch { return String(v); }
};
function eq(got, want, what = '') {
  if (!Object.is(got, want)) throw new Error(`${what ? what + ': ' : ''}expected ${fmt(want)}, got ${fmt(got)}`);
}
function same(got, want, what = '') {
  const a = JSON.stringify(got), b = JSON.stringify(want);
  if (a !== b) throw new Error(`${what ? what + ': ' : ''}expected ${b}, got ${a}`);
}
function ok(v, what = 'expected true') { if (!v) throw new Error(what); }
// The error `f` throws, checked to be `type` (a constructor, or a DOMException name).
function throws(f, type, what = '') {
  try { f(); } catch (e) { checkErr(e, type, what); return e; }
  throw new Error(`${what ? what + ': ' : ''}did not throw`);
}
async function rejects(p, type, what = '') {
  try { await (typeof p === 'function' ? p() : p); } catch (e) { checkErr(e, type, what); return e; }
  throw new Error(`${what ? what + ': ' : ''}did not reject`);
}
function checkErr(e, type, what) {
  if (typeof type === 'string') {
    if (!(e instanceof DOMException) || e.name !== type) throw new Error(`${what}: expected DOMException ${type}, got ${e && e.name}: ${e && e.message}`);
  } else if (!(e instanceof type)) throw new Error(`${what}: expected ${type.name}, got ${e && e.name}: ${e && e.message}`);
}
const bytes = (...a) => new Uint8Array(a);
const hex = (buf) => Array.from(new Uint8Array(buf), (b) => b.toString(16).padStart(2, '0')).join('');
const streamOfChunks = (chunks) => new ReadableStream({
  start(c) { for (const x of chunks) c.enqueue(x); c.close(); },
});
const readStream = async (s) => {
  const out = [];
  const r = s.getReader();
  for (;;) { const { value, done } = await r.read(); if (done) return out; out.push(value); }
};

// ---------------- Headers ----------------
test('Headers: names are case-insensitive, stored lower case', () => {
  const h = new Headers({ 'Content-Type': 'text/html' });
  eq(h.get('content-type'), 'text/html');
  eq(h.get('CONTENT-TYPE'), 'text/html');
  ok(h.has('Content-type'));
  same([...h.keys()], ['content-type']);
});
test('Headers: values lose leading and trailing whitespace', () => {
  const h = new Headers();
  h.set('a', ' \t x y \t ');
  eq(h.get('a'), 'x y');
  h.append('b', '\n1 ');
  eq(h.get('b'), '1');
});
test('Headers: invalid names and values throw TypeError', () => {
  throws(() => new Headers({ 'a b': 'x' }), TypeError, 'space in name');
  throws(() => new Headers({ 'a': 'x\ny' }), TypeError, 'LF in value');
  throws(() => new Headers({ 'a': 'x\0y' }), TypeError, 'NUL in value');
  throws(() => new Headers().set('a', 'x\ry'), TypeError, 'CR in value');
  throws(() => new Headers().append('a', 'x\r\ny'), TypeError, 'CRLF in value');
  throws(() => new Headers().get('a b'), TypeError, 'get with bad name');
  throws(() => new Headers([['a', 'b', 'c']]), TypeError, 'pair of three');
});
test('Headers: append combines with ", "; set replaces; delete removes', () => {
  const h = new Headers();
  h.append('x-a', '1');
  h.append('X-A', '2');
  eq(h.get('x-a'), '1, 2');
  h.set('x-a', '3');
  eq(h.get('x-a'), '3');
  h.delete('X-a');
  eq(h.get('x-a'), null);
  ok(!h.has('x-a'));
});
test('Headers: iteration is sorted by name', () => {
  const h = new Headers([['b', '2'], ['C', '3'], ['a', '1']]);
  same([...h], [['a', '1'], ['b', '2'], ['c', '3']]);
  same([...h.entries()], [['a', '1'], ['b', '2'], ['c', '3']]);
  same([...h.keys()], ['a', 'b', 'c']);
  same([...h.values()], ['1', '2', '3']);
  const seen = [];
  h.forEach(function (v, k, o) { seen.push(k + '=' + v); eq(o, h); eq(this.t, 1); }, { t: 1 });
  same(seen, ['a=1', 'b=2', 'c=3']);
  h.append('0', 'z');
  same([...h.keys()], ['0', 'a', 'b', 'c'], 'after a change');
});
test('Headers: set-cookie is not combined in iteration; getSetCookie', () => {
  const h = new Headers();
  h.append('Set-Cookie', 'a=1');
  h.append('set-cookie', 'b=2');
  h.append('x', '1');
  same(h.getSetCookie(), ['a=1', 'b=2']);
  eq(h.get('set-cookie'), 'a=1, b=2');
  same([...h], [['set-cookie', 'a=1'], ['set-cookie', 'b=2'], ['x', '1']]);
  h.set('set-cookie', 'c=3');
  same(h.getSetCookie(), ['c=3']);
  same(new Headers().getSetCookie(), []);
});
test('Headers: constructors from Headers, pairs, record', () => {
  const a = new Headers({ x: '1', y: '2' });
  const b = new Headers(a);
  b.set('x', '9');
  eq(a.get('x'), '1', 'copy is independent');
  same([...new Headers([['k', 'v'], ['k', 'w']])], [['k', 'v, w']]);
  same([...new Headers(new Map([['m', '1']]))], [['m', '1']]);
  same([...new Headers()], []);
  eq(new Headers({ n: 5 }).get('n'), '5', 'values become strings');
  throws(() => new Headers(5), TypeError, 'a number');
});

// ---------------- Request ----------------
test('Request: from a URL string, defaults', () => {
  const r = new Request('https://example.com/a?b=1');
  eq(r.url, 'https://example.com/a?b=1');
  eq(r.method, 'GET');
  eq(r.redirect, 'follow');
  eq(r.body, null);
  eq(r.bodyUsed, false);
  ok(r.headers instanceof Headers);
  ok(r.signal instanceof AbortSignal);
  eq(r.signal.aborted, false);
});
test('Request: the URL is parsed and serialized', () => {
  eq(new Request('HTTPS://EXAMPLE.com/a/../b').url, 'https://example.com/b');
  eq(new Request(new URL('http://x.test/p')).url, 'http://x.test/p');
  throws(() => new Request('/relative'), TypeError, 'relative URL');
  throws(() => new Request('http://'), TypeError, 'invalid URL');
});
test('Request: method normalization and refusal', () => {
  eq(new Request('http://a/', { method: 'post' }).method, 'POST');
  eq(new Request('http://a/', { method: 'Delete' }).method, 'DELETE');
  eq(new Request('http://a/', { method: 'options' }).method, 'OPTIONS');
  eq(new Request('http://a/', { method: 'PATCH' }).method, 'PATCH');
  throws(() => new Request('http://a/', { method: 'CONNECT' }), TypeError, 'CONNECT');
  throws(() => new Request('http://a/', { method: 'bad method' }), TypeError, 'not a token');
});
test('Request: GET/HEAD with a body is a TypeError', () => {
  throws(() => new Request('http://a/', { body: 'x' }), TypeError, 'GET');
  throws(() => new Request('http://a/', { method: 'HEAD', body: 'x' }), TypeError, 'HEAD');
  eq(new Request('http://a/', { body: null }).body, null, 'null body is fine');
});
test('Request: headers from init; string body sets content-type', async () => {
  const r = new Request('http://a/', { method: 'POST', body: 'hi', headers: { 'X-A': '1' } });
  eq(r.headers.get('x-a'), '1');
  eq(r.headers.get('content-type'), 'text/plain;charset=UTF-8');
  ok(r.body instanceof ReadableStream);
  eq(await r.text(), 'hi');
  eq(r.bodyUsed, true);
  const r2 = new Request('http://a/', { method: 'POST', body: 'hi', headers: { 'content-type': 'x/y' } });
  eq(r2.headers.get('content-type'), 'x/y', 'given content-type kept');
});
test('Request: bodies of every kind', async () => {
  const post = (body) => new Request('http://a/', { method: 'POST', body });
  eq(await post('héllo').text(), 'héllo', 'string');
  eq(await post(bytes(104, 105).buffer).text(), 'hi', 'ArrayBuffer');
  eq(await post(bytes(104, 105)).text(), 'hi', 'Uint8Array');
  eq(await post(new Uint16Array([0x6968])).text(), 'hi', 'Uint16Array');
  eq(await post(new DataView(bytes(0, 104, 105, 0).buffer, 1, 2)).text(), 'hi', 'DataView');
  const p = post(new URLSearchParams({ a: '1 2', b: 'é' }));
  eq(p.headers.get('content-type'), 'application/x-www-form-urlencoded;charset=UTF-8');
  eq(await p.text(), 'a=1+2&b=%C3%A9', 'URLSearchParams');
  const b = post(new Blob(['x', 'y'], { type: 'text/x' }));
  eq(b.headers.get('content-type'), 'text/x');
  eq(await b.text(), 'xy', 'Blob');
  eq(await post(streamOfChunks([bytes(97), bytes(98)])).text(), 'ab', 'ReadableStream');
});
test('Request: a body source is copied when the Request is made', async () => {
  const src = bytes(1, 2, 3);
  const r = new Request('http://a/', { method: 'PUT', body: src });
  src[0] = 9;
  same(Array.from(new Uint8Array(await r.arrayBuffer())), [1, 2, 3]);
});
test('Request: body mixins: json, arrayBuffer, bytes, blob, formData', async () => {
  const post = (body, headers) => new Request('http://a/', { method: 'POST', body, headers });
  same(await post('{"a":[1,2]}').json(), { a: [1, 2] }, 'json');
  const ab = await post('abc').arrayBuffer();
  ok(ab instanceof ArrayBuffer, 'arrayBuffer type');
  eq(ab.byteLength, 3);
  const u8 = await post('abc').bytes();
  ok(u8 instanceof Uint8Array, 'bytes type');
  same(Array.from(u8), [97, 98, 99]);
  const bl = await post('abc', { 'content-type': 'text/plain' }).blob();
  ok(bl instanceof Blob);
  eq(bl.size, 3);
  eq(bl.type, 'text/plain');
  const fd = await post(new URLSearchParams('a=1&a=2&b=3')).formData();
  same(fd.getAll('a'), ['1', '2']);
  await rejects(post('{bad').json(), SyntaxError, 'bad JSON');
});
test('Request: using a body twice rejects with TypeError', async () => {
  const r = new Request('http://a/', { method: 'POST', body: 'x' });
  await r.text();
  eq(r.bodyUsed, true);
  await rejects(r.text(), TypeError, 'text twice');
  await rejects(r.arrayBuffer(), TypeError, 'arrayBuffer after text');
  const s = new Request('http://a/', { method: 'POST', body: 'x' });
  s.body.getReader();
  await rejects(s.text(), TypeError, 'locked body');
});
test('Request: clone', async () => {
  const r = new Request('http://a/x', { method: 'POST', body: 'data', headers: { a: '1' } });
  const c = r.clone();
  eq(c.url, 'http://a/x');
  eq(c.method, 'POST');
  eq(c.headers.get('a'), '1');
  c.headers.set('a', '2');
  eq(r.headers.get('a'), '1', 'headers are copied');
  eq(await r.text(), 'data');
  eq(await c.text(), 'data');
  const used = new Request('http://a/', { method: 'POST', body: 'x' });
  await used.text();
  throws(() => used.clone(), TypeError, 'clone of a used body');
  const st = new Request('http://a/', { method: 'POST', body: streamOfChunks([bytes(1), bytes(2)]) });
  const st2 = st.clone();
  same(Array.from(await st.bytes()), [1, 2], 'stream body, original');
  same(Array.from(await st2.bytes()), [1, 2], 'stream body, clone');
});
test('Request: from a Request, with and without init', async () => {
  const a = new Request('http://a/p', { method: 'POST', body: 'b', headers: { x: '1' }, redirect: 'manual' });
  const b = new Request(a, { headers: { y: '2' } });
  eq(b.url, 'http://a/p');
  eq(b.method, 'POST');
  eq(b.redirect, 'manual');
  eq(b.headers.get('x'), null, 'init headers replace');
  eq(b.headers.get('y'), '2');
  eq(await b.text(), 'b');
  const c = new Request(new Request('http://a/'), { method: 'PUT', body: 'z' });
  eq(c.method, 'PUT');
  eq(await c.text(), 'z');
  throws(() => new Request('http://a/', { redirect: 'sometimes' }), TypeError, 'bad redirect');
});
test('Request: signal from init', () => {
  const ac = new AbortController();
  const r = new Request('http://a/', { signal: ac.signal });
  eq(r.signal.aborted, false);
  ac.abort();
  eq(r.signal.aborted, true);
});

// ---------------- Response ----------------
test('Response: defaults', async () => {
  const r = new Response();
  eq(r.status, 200);
  eq(r.ok, true);
  eq(r.statusText, '');
  eq(r.type, 'default');
  eq(r.url, '');
  eq(r.redirected, false);
  eq(r.body, null);
  eq(r.bodyUsed, false);
  eq(await r.text(), '');
  eq(await r.text(), '', 'a null body reads twice');
});
test('Response: status range, statusText', () => {
  eq(new Response(null, { status: 404 }).ok, false);
  eq(new Response(null, { status: 299 }).ok, true);
  eq(new Response(null, { status: 500, statusText: 'Oops' }).statusText, 'Oops');
  throws(() => new Response(null, { status: 199 }), RangeError, '199');
  throws(() => new Response(null, { status: 600 }), RangeError, '600');
  throws(() => new Response(null, { status: 0 }), RangeError, '0');
  throws(() => new Response(null, { statusText: 'a\nb' }), TypeError, 'LF in statusText');
});
test('Response: null-body statuses refuse a body', () => {
  for (const status of [204, 205, 304]) {
    throws(() => new Response('x', { status }), TypeError, String(status));
    eq(new Response(null, { status }).status, status);
  }
});
test('Response: a string body sets text/plain;charset=UTF-8 when absent', () => {
  eq(new Response('x').headers.get('content-type'), 'text/plain;charset=UTF-8');
  eq(new Response('x', { headers: { 'Content-Type': 'a/b' } }).headers.get('content-type'), 'a/b');
  eq(new Response(bytes(1)).headers.get('content-type'), null, 'bytes: none');
});
test('Response: headers init of every kind', () => {
  const h = new Headers({ a: '1' });
  eq(new Response(null, { headers: h }).headers.get('a'), '1');
  eq(new Response(null, { headers: [['b', '2']] }).headers.get('b'), '2');
  eq(new Response(null, { headers: { c: '3' } }).headers.get('c'), '3');
});
test('Response: body mixins and bodyUsed', async () => {
  const r = new Response('{"x":1}');
  same(await r.json(), { x: 1 });
  eq(r.bodyUsed, true);
  await rejects(r.json(), TypeError, 'twice');
  same(Array.from(await new Response(bytes(1, 2)).bytes()), [1, 2]);
  eq((await new Response('abc').arrayBuffer()).byteLength, 3);
  eq(await (await new Response('q').blob()).text(), 'q');
  eq(await new Response('\u00e9\u{1F600}').text(), 'é😀', 'UTF-8 round trip');
});
test('Response: clone', async () => {
  const r = new Response('body', { status: 201, statusText: 'Made', headers: { a: '1' } });
  const c = r.clone();
  eq(c.status, 201);
  eq(c.statusText, 'Made');
  eq(c.headers.get('a'), '1');
  eq(await c.text(), 'body');
  eq(await r.text(), 'body');
  throws(() => r.clone(), TypeError, 'clone after use');
});
test('Response.json', async () => {
  const r = Response.json({ a: [1, 'x'] }, { status: 202, headers: { 'x-y': 'z' } });
  eq(r.status, 202);
  eq(r.headers.get('content-type'), 'application/json');
  eq(r.headers.get('x-y'), 'z');
  same(await r.json(), { a: [1, 'x'] });
  eq(Response.json(1, { headers: { 'content-type': 'a/b' } }).headers.get('content-type'), 'a/b');
  throws(() => Response.json(1n), TypeError, 'a BigInt');
});
test('Response: headers asked for late are one object, and a clone has its own', async () => {
  const r = new Response('x');
  const c = r.clone();
  ok(r.headers === r.headers, 'the same Headers each time');
  r.headers.set('x-a', '1');
  eq(c.headers.get('x-a'), null, 'the clone has its own headers');
  eq(c.headers.get('content-type'), 'text/plain;charset=UTF-8');
  eq([...new Response(null).headers].length, 0, 'no body, no headers');
  eq(new Response(new Uint8Array(1)).headers.get('content-type'), null, 'bytes have no content-type');
  eq(Response.json([1]).headers.get('content-type'), 'application/json');
  eq(Response.json([1]).statusText, '');
  eq(new Response(null, { statusText: 'Fine' }).clone().statusText, 'Fine');
  eq(await c.text(), 'x');
});
test('Response.redirect', () => {
  const r = Response.redirect('http://a.test/b', 301);
  eq(r.status, 301);
  eq(r.headers.get('location'), 'http://a.test/b');
  eq(Response.redirect('http://a.test/').status, 302, 'default status');
  eq(Response.redirect(new URL('http://a.test/x?y')).headers.get('location'), 'http://a.test/x?y');
  throws(() => Response.redirect('http://a.test/', 200), RangeError, 'status 200');
  throws(() => Response.redirect('nope'), TypeError, 'invalid URL');
});
test('Response.error', () => {
  const r = Response.error();
  eq(r.status, 0);
  eq(r.type, 'error');
  eq(r.ok, false);
  eq(r.body, null);
});
test('Response: from a stream and from another body', async () => {
  eq(await new Response(streamOfChunks([bytes(104), bytes(105)])).text(), 'hi');
  const a = new Response('passed on');
  const b = new Response(a.body, { status: 203 });
  eq(b.status, 203);
  eq(await b.text(), 'passed on');
  ok(a.bodyUsed, 'the source body is disturbed');
  const locked = new ReadableStream();
  locked.getReader();
  throws(() => new Response(locked), TypeError, 'a locked stream');
});
test('Response: body is a ReadableStream of bytes', async () => {
  const r = new Response('abc');
  const s = r.body;
  ok(s instanceof ReadableStream);
  eq(r.body, s, 'the same stream each time');
  const chunks = await readStream(s);
  const all = chunks.reduce((n, c) => n + c.length, 0);
  eq(all, 3);
  ok(chunks[0] instanceof Uint8Array);
  ok(r.bodyUsed, 'read through the stream');
  await rejects(r.text(), TypeError, 'text after reading the stream');
});

// ---------------- ReadableStream ----------------
test('ReadableStream: start, enqueue, close, read', async () => {
  const s = new ReadableStream({ start(c) { c.enqueue('a'); c.enqueue('b'); c.close(); } });
  eq(s.locked, false);
  const r = s.getReader();
  eq(s.locked, true);
  same(await r.read(), { value: 'a', done: false });
  same(await r.read(), { value: 'b', done: false });
  same(await r.read(), { done: true });
  eq(await r.closed, undefined);
});
test('ReadableStream: pull on demand', async () => {
  let n = 0;
  const s = new ReadableStream({
    pull(c) { n++; if (n > 3) c.close(); else c.enqueue(n); },
  }, { highWaterMark: 0 });
  const got = [];
  for await (const x of s) got.push(x);
  same(got, [1, 2, 3]);
});
test('ReadableStream: async pull', async () => {
  let i = 0;
  const s = new ReadableStream({
    async pull(c) { await null; i++; if (i === 3) c.close(); else c.enqueue(i); },
  });
  same(await readStream(s), [1, 2]);
});
test('ReadableStream: error', async () => {
  const boom = new Error('boom');
  const s = new ReadableStream({ start(c) { c.error(boom); } });
  const r = s.getReader();
  const e = await rejects(r.read(), Error, 'read');
  eq(e, boom);
  await rejects(r.closed, Error, 'closed');
  const t = new ReadableStream({ pull() { throw boom; } });
  eq(await rejects(t.getReader().read(), Error, 'pull throws'), boom);
});
test('ReadableStream: cancel calls the source', async () => {
  let reason;
  const s = new ReadableStream({ cancel(r) { reason = r; } });
  const rd = s.getReader();
  await rd.cancel('why');
  eq(reason, 'why');
  same(await rd.read(), { done: true });
  const t = new ReadableStream();
  t.getReader();
  await rejects(t.cancel(), TypeError, 'cancel of a locked stream');
});
test('ReadableStream: releaseLock unlocks; a second reader throws while locked', async () => {
  const s = streamOfChunks([1, 2]);
  const a = s.getReader();
  throws(() => s.getReader(), TypeError, 'second reader');
  same(await a.read(), { value: 1, done: false });
  a.releaseLock();
  eq(s.locked, false);
  await rejects(a.read(), TypeError, 'read after release');
  const b = s.getReader();
  same(await b.read(), { value: 2, done: false });
});
test('ReadableStream: async iteration, break cancels', async () => {
  let canceled = false;
  const s = new ReadableStream({
    start(c) { c.enqueue(1); c.enqueue(2); c.enqueue(3); },
    cancel() { canceled = true; },
  });
  const got = [];
  for await (const x of s) { got.push(x); if (x === 2) break; }
  same(got, [1, 2]);
  ok(canceled, 'cancel called');
  eq(s.locked, false);
});
test('ReadableStream: tee', async () => {
  const [a, b] = streamOfChunks(['x', 'y']).tee();
  same(await readStream(a), ['x', 'y']);
  same(await readStream(b), ['x', 'y']);
});
test('ReadableStream: desiredSize and enqueue after close', () => {
  let ctrl;
  new ReadableStream({ start(c) { ctrl = c; } }, { highWaterMark: 2 });
  eq(ctrl.desiredSize, 2);
  ctrl.enqueue('a');
  eq(ctrl.desiredSize, 1);
  ctrl.close();
  throws(() => ctrl.enqueue('b'), TypeError, 'enqueue after close');
});

// ---------------- WritableStream / TransformStream ----------------
test('WritableStream: writes reach the sink in order, then close', async () => {
  const got = [];
  let closed = false;
  const ws = new WritableStream({
    async write(chunk) { await null; got.push(chunk); },
    close() { closed = true; },
  });
  const w = ws.getWriter();
  eq(ws.locked, true);
  throws(() => ws.getWriter(), TypeError, 'second writer');
  w.write('a');
  w.write('b');
  await w.close();
  same(got, ['a', 'b']);
  ok(closed, 'sink closed');
  await w.closed;
  await rejects(w.write('c'), TypeError, 'write after close');
});
test('WritableStream: abort, and a sink that throws errors the stream', async () => {
  let reason;
  const ws = new WritableStream({ abort(r) { reason = r; } });
  await ws.abort('stop');
  eq(reason, 'stop');
  const boom = new Error('sink');
  const bad = new WritableStream({ write() { throw boom; } });
  const w = bad.getWriter();
  eq(await rejects(w.write('x'), Error, 'the failing write'), boom);
  eq(await rejects(w.closed, Error, 'closed'), boom);
});
test('TransformStream: identity and transform', async () => {
  const id = new TransformStream();
  const w = id.writable.getWriter();
  w.write('x');
  w.write('y');
  w.close();
  same(await readStream(id.readable), ['x', 'y']);
  const up = new TransformStream({
    transform(chunk, c) { c.enqueue(String(chunk).toUpperCase()); },
    flush(c) { c.enqueue('!'); },
  });
  const out = streamOfChunks(['a', 'b']).pipeThrough(up);
  same(await readStream(out), ['A', 'B', '!']);
});
test('TransformStream: a Response body written after the Response is made', async () => {
  const { readable, writable } = new TransformStream();
  const r = new Response(readable);
  const w = writable.getWriter();
  const enc = new TextEncoder();
  w.write(enc.encode('stream'));
  w.write(enc.encode('ed'));
  w.close();
  eq(await r.text(), 'streamed');
});
test('pipeTo, TextEncoderStream, TextDecoderStream', async () => {
  const got = [];
  await streamOfChunks(['h', 'é']).pipeThrough(new TextEncoderStream()).pipeThrough(new TextDecoderStream())
    .pipeTo(new WritableStream({ write(c) { got.push(c); } }));
  eq(got.join(''), 'hé');
  const split = streamOfChunks([bytes(0xf0, 0x9f), bytes(0x98, 0x80)]).pipeThrough(new TextDecoderStream());
  eq((await readStream(split)).join(''), '😀', 'a character across chunks');
});

// ---------------- URL ----------------
test('URL: components', () => {
  const u = new URL('HTTP://User:Pw@Example.COM:8080/a/../b?q=1#h');
  eq(u.href, 'http://User:Pw@example.com:8080/b?q=1#h');
  eq(u.origin, 'http://example.com:8080');
  eq(u.protocol, 'http:');
  eq(u.username, 'User');
  eq(u.password, 'Pw');
  eq(u.host, 'example.com:8080');
  eq(u.hostname, 'example.com');
  eq(u.port, '8080');
  eq(u.pathname, '/b');
  eq(u.search, '?q=1');
  eq(u.hash, '#h');
  eq(String(u), u.href);
  eq(u.toJSON(), u.href);
  eq(JSON.stringify({ u }), '{"u":"http://User:Pw@example.com:8080/b?q=1#h"}');
});
test('URL: defaults, default ports, empty parts', () => {
  const u = new URL('https://a.test:443/?#');
  eq(u.port, '');
  eq(u.host, 'a.test');
  eq(u.search, '');
  eq(u.hash, '');
  eq(u.href, 'https://a.test/?#');
  eq(new URL('http://a.test').pathname, '/');
});
test('URL: relative to a base', () => {
  eq(new URL('../c?d', 'http://a.test/x/y/z').href, 'http://a.test/x/c?d');
  eq(new URL('//b.test/p', 'https://a.test/').href, 'https://b.test/p');
  eq(new URL('?q', new URL('http://a.test/p')).href, 'http://a.test/p?q');
});
test('URL: invalid input throws TypeError; canParse', () => {
  throws(() => new URL('nope'), TypeError, 'no scheme');
  throws(() => new URL('http://a b/'), TypeError, 'space in host');
  throws(() => new URL('/x', 'nope'), TypeError, 'bad base');
  eq(URL.canParse('http://a/'), true);
  eq(URL.canParse('nope'), false);
  eq(URL.canParse('/x', 'http://a/'), true);
});
test('URL: encoding, IDNA, IPv6, non-special schemes', () => {
  eq(new URL('http://a.test/a b?c d#e f').href, 'http://a.test/a%20b?c%20d#e%20f');
  eq(new URL('http://münchen.test/').hostname, 'xn--mnchen-3ya.test');
  eq(new URL('http://[::1]:8000/').hostname, '[::1]');
  const m = new URL('mailto:someone@example.com');
  eq(m.protocol, 'mailto:');
  eq(m.pathname, 'someone@example.com');
  eq(m.origin, 'null');
  eq(new URL('data:text/plain,hi').pathname, 'text/plain,hi');
});
test('URL: simple absolute URLs parse as the parser parses them', () => {
  const cases = [
    ['http://a.test/', 'http:', 'a.test', '/', ''],
    ['https://example.com/a/b?c=d&e', 'https:', 'example.com', '/a/b', '?c=d&e'],
    ['http://localhost/x.y/z-1_2~3', 'http:', 'localhost', '/x.y/z-1_2~3', ''],
    ['http://a.test//double//slash', 'http:', 'a.test', '//double//slash', ''],
    ['http://a.test/p?', 'http:', 'a.test', '/p', ''],
    ['http://a.test/p?q?r/s', 'http:', 'a.test', '/p', '?q?r/s'],
    ['http://a.test/%41%2f', 'http:', 'a.test', '/%41%2f', ''],
    ['http://sub-1.a-b.test./', 'http:', 'sub-1.a-b.test.', '/', ''],
  ];
  for (const [s, protocol, host, pathname, search] of cases) {
    const u = new URL(s);
    same([u.href, u.protocol, u.host, u.hostname, u.port, u.pathname, u.search, u.hash, u.username, u.origin],
      [s, protocol, host, host, '', pathname, search, '', '', protocol + '//' + host], s);
  }
  // What the parser rewrites (not its own href).
  const rewritten = [
    ['http://a.test/./b/../c', 'http://a.test/c'],
    ['http://a.test/.%2e/c', 'http://a.test/c'],
    ['http://a.test:80/', 'http://a.test/'],
    ['http://A.test/', 'http://a.test/'],
    ['http://a.test', 'http://a.test/'],
    ['http://a.test/a b', 'http://a.test/a%20b'],
    ["http://a.test/?a'b", 'http://a.test/?a%27b'],
    ['http://1.2.3.4/', 'http://1.2.3.4/'],
    ['http://0x7f.1/', 'http://127.0.0.1/'],
    ['http://a.test/p#f', 'http://a.test/p#f'],
    ['http://u@a.test/', 'http://u@a.test/'],
    ['http://a.test\\p', 'http://a.test/p'],
  ];
  for (const [s, href] of rewritten) eq(new URL(s).href, href, s);
  throws(() => new URL('http://a.123/'), TypeError, 'a host ending in a number that is not IPv4');
});
test('URL: setters', () => {
  const u = new URL('http://a.test/p?q=1#h');
  u.pathname = '/x y';
  eq(u.pathname, '/x%20y');
  u.search = 'z=2';
  eq(u.search, '?z=2');
  u.hash = 'frag';
  eq(u.hash, '#frag');
  u.hostname = 'b.test';
  eq(u.host, 'b.test');
  u.port = '8080';
  eq(u.host, 'b.test:8080');
  u.port = '80';
  eq(u.port, '', 'the default port');
  u.protocol = 'https';
  eq(u.protocol, 'https:');
  u.username = 'me';
  u.password = 'pw';
  eq(u.href, 'https://me:pw@b.test/x%20y?z=2#frag');
  u.host = 'c.test:1';
  eq(u.href, 'https://me:pw@c.test:1/x%20y?z=2#frag');
  u.search = '';
  u.hash = '';
  eq(u.href, 'https://me:pw@c.test:1/x%20y');
  u.href = 'http://d.test/';
  eq(u.hostname, 'd.test');
  throws(() => { u.href = 'nope'; }, TypeError, 'bad href');
  u.port = 'abc';
  eq(u.port, '', 'a bad port is ignored');
});
test('URL: searchParams stays in sync both ways', () => {
  const u = new URL('http://a.test/?a=1&b=2');
  const p = u.searchParams;
  eq(p.get('a'), '1');
  eq(u.searchParams, p, 'the same object');
  p.append('c', '3 4');
  eq(u.search, '?a=1&b=2&c=3+4');
  p.delete('a');
  eq(u.href, 'http://a.test/?b=2&c=3+4');
  u.search = '?x=9';
  eq(p.get('x'), '9');
  eq(p.get('b'), null);
  u.href = 'http://a.test/?y=8';
  eq(p.get('y'), '8');
  p.delete('y');
  eq(u.href, 'http://a.test/', 'an empty list drops the query');
});

// ---------------- URLSearchParams ----------------
test('URLSearchParams: parsing and serializing', () => {
  const p = new URLSearchParams('?a=1&b=x+y&c=%20%C3%A9&d&=e&a=2');
  eq(p.get('a'), '1');
  same(p.getAll('a'), ['1', '2']);
  eq(p.get('b'), 'x y');
  eq(p.get('c'), ' é');
  eq(p.get('d'), '');
  eq(p.get(''), 'e');
  eq(p.get('zz'), null);
  eq(p.size, 6);
  eq(new URLSearchParams({ a: 'b c', 'é': '&=' }).toString(), 'a=b+c&%C3%A9=%26%3D');
  eq(new URLSearchParams([['x', '1'], ['x', '2']]).toString(), 'x=1&x=2');
  eq(new URLSearchParams(new URLSearchParams('k=v')).toString(), 'k=v');
  eq(new URLSearchParams('a=~*-._').toString(), 'a=%7E*-._');
  throws(() => new URLSearchParams([['a']]), TypeError, 'a pair of one');
});
test('URLSearchParams: methods', () => {
  const p = new URLSearchParams('b=2&a=1&b=3');
  ok(p.has('a'));
  ok(p.has('b', '3'));
  ok(!p.has('b', '4'));
  p.set('b', '9');
  eq(p.toString(), 'b=9&a=1');
  p.append('a', '0');
  p.sort();
  eq(p.toString(), 'a=1&a=0&b=9');
  p.delete('a', '0');
  eq(p.toString(), 'a=1&b=9');
  same([...p], [['a', '1'], ['b', '9']]);
  same([...p.keys()], ['a', 'b']);
  same([...p.values()], ['1', '9']);
  const seen = [];
  p.forEach((v, k) => seen.push(k + v));
  same(seen, ['a1', 'b9']);
});

// ---------------- TextEncoder / TextDecoder ----------------
test('TextEncoder: encode and encodeInto', () => {
  const e = new TextEncoder();
  eq(e.encoding, 'utf-8');
  same(Array.from(e.encode('aé😀')), [97, 195, 169, 240, 159, 152, 128]);
  same(Array.from(e.encode()), []);
  same(Array.from(e.encode('\ud800')), [239, 191, 189], 'a lone surrogate');
  const buf = new Uint8Array(5);
  same(e.encodeInto('aé😀', buf), { read: 2, written: 3 }, 'stops before a character that does not fit');
  same(Array.from(buf.subarray(0, 3)), [97, 195, 169]);
  same(e.encodeInto('😀', new Uint8Array(4)), { read: 2, written: 4 });
});
test('TextDecoder: decode, BOM, fatal, streaming', () => {
  const d = new TextDecoder();
  eq(d.encoding, 'utf-8');
  eq(d.fatal, false);
  eq(d.ignoreBOM, false);
  eq(d.decode(bytes(104, 195, 169)), 'hé');
  eq(d.decode(bytes(104, 105).buffer), 'hi', 'an ArrayBuffer');
  eq(d.decode(new DataView(bytes(104, 105).buffer)), 'hi', 'a DataView');
  eq(d.decode(), '');
  eq(d.decode(bytes(0xef, 0xbb, 0xbf, 65)), 'A', 'BOM dropped');
  eq(new TextDecoder('utf-8', { ignoreBOM: true }).decode(bytes(0xef, 0xbb, 0xbf, 65)), '\ufeffA', 'BOM kept');
  eq(d.decode(bytes(0xff, 65)), '\ufffdA', 'replacement');
  throws(() => new TextDecoder('utf-8', { fatal: true }).decode(bytes(0xff)), TypeError, 'fatal');
  eq(new TextDecoder('UTF8').encoding, 'utf-8', 'a label');
  throws(() => new TextDecoder('no-such-encoding'), RangeError, 'unknown label');
  const s = new TextDecoder();
  eq(s.decode(bytes(0xf0, 0x9f), { stream: true }) + s.decode(bytes(0x98, 0x80)), '😀', 'a character across chunks');
});

// ---------------- atob / btoa ----------------
test('atob and btoa', () => {
  eq(btoa('hello'), 'aGVsbG8=');
  eq(btoa(''), '');
  eq(btoa('\xff\xfe'), '//4=');
  eq(atob('aGVsbG8='), 'hello');
  eq(atob(' aGVs bG8 '), 'hello', 'whitespace ignored');
  eq(atob('aGVsbG8'), 'hello', 'no padding');
  eq(atob('//4='), '\xff\xfe');
  throws(() => btoa('€'), 'InvalidCharacterError', 'btoa of a non-Latin1 character');
  throws(() => atob('a'), 'InvalidCharacterError', 'atob of a bad length');
  throws(() => atob('a!=='), 'InvalidCharacterError', 'atob of a bad character');
});

// ---------------- console ----------------
test('console: methods exist and do not throw', () => {
  for (const m of ['log', 'info', 'warn', 'error', 'debug']) {
    eq(typeof console[m], 'function', m);
  }
  console.log('web.test.js: console.log', 1, { a: [1, 'x'] }, null);
  console.error(new Error('web.test.js: a logged error'));
});

// ---------------- structuredClone ----------------
test('structuredClone: values and containers', () => {
  for (const v of [1, 'x', null, undefined, true, 10n, NaN]) eq(structuredClone(v), v, String(v));
  const d = new Date(1234567);
  const c = structuredClone({ a: [1, { b: 2 }], d, r: /x+/gi, m: new Map([[1, 'a']]), s: new Set([2]) });
  same(c.a, [1, { b: 2 }]);
  ok(c.d instanceof Date && c.d.getTime() === 1234567 && c.d !== d, 'Date');
  ok(c.r instanceof RegExp && c.r.source === 'x+' && c.r.flags === 'gi', 'RegExp');
  ok(c.m instanceof Map && c.m.get(1) === 'a', 'Map');
  ok(c.s instanceof Set && c.s.has(2), 'Set');
});
test('structuredClone: buffers and typed arrays are copied', () => {
  const u = bytes(1, 2, 3);
  const c = structuredClone(u);
  ok(c instanceof Uint8Array);
  c[0] = 9;
  eq(u[0], 1);
  const ab = structuredClone(new Float64Array([1.5]).buffer);
  eq(new Float64Array(ab)[0], 1.5);
  const buf = new ArrayBuffer(8);
  const two = structuredClone({ x: new Uint8Array(buf), y: new Uint16Array(buf) });
  eq(two.x.buffer, two.y.buffer, 'views of one buffer share the copy');
});
test('structuredClone: cycles and shared references', () => {
  const o = { name: 'o' };
  o.self = o;
  o.list = [o];
  const c = structuredClone(o);
  ok(c !== o);
  eq(c.self, c);
  eq(c.list[0], c);
  const shared = {};
  const p = structuredClone({ a: shared, b: shared });
  eq(p.a, p.b);
});
test('structuredClone: functions and symbols are a DataCloneError', () => {
  throws(() => structuredClone(() => 1), 'DataCloneError', 'function');
  throws(() => structuredClone({ f() {} }), 'DataCloneError', 'method');
  throws(() => structuredClone(Symbol('s')), 'DataCloneError', 'symbol');
});

// ---------------- crypto ----------------
test('crypto.getRandomValues', () => {
  const a = new Uint8Array(32);
  eq(crypto.getRandomValues(a), a, 'returns its argument');
  ok(a.some((x) => x !== 0), 'filled');
  crypto.getRandomValues(new Uint32Array(4));
  crypto.getRandomValues(new Uint8Array(65536));
  throws(() => crypto.getRandomValues(new Uint8Array(65537)), 'QuotaExceededError', 'over 65536 bytes');
  throws(() => crypto.getRandomValues(new Float32Array(4)), 'TypeMismatchError', 'floats');
});
test('crypto.randomUUID', () => {
  const u = crypto.randomUUID();
  ok(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/.test(u), u);
  ok(u !== crypto.randomUUID(), 'different each time');
});
test('crypto.subtle.digest', async () => {
  const data = new TextEncoder().encode('abc');
  eq(hex(await crypto.subtle.digest('SHA-1', data)), 'a9993e364706816aba3e25717850c26c9cd0d89d');
  eq(hex(await crypto.subtle.digest('SHA-256', data)), 'ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad');
  eq(hex(await crypto.subtle.digest({ name: 'sha-384' }, data.buffer)).slice(0, 16), 'cb00753f45a35e8b');
  eq(hex(await crypto.subtle.digest('SHA-512', data)).slice(0, 16), 'ddaf35a193617aba');
  ok((await crypto.subtle.digest('SHA-256', new Uint8Array(0))) instanceof ArrayBuffer);
  await rejects(crypto.subtle.digest('SHA-999', data), 'NotSupportedError', 'an unknown digest');
});
test('crypto.subtle HMAC: importKey, sign, verify (RFC 4231 case 2)', async () => {
  const enc = new TextEncoder();
  const data = enc.encode('what do ya want for nothing?');
  const want = {
    'SHA-1': 'effcdf6ae5eb2fa2d27416d5f184df9c259a7c79',
    'SHA-256': '5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843',
    'SHA-384': 'af45d2e376484031617f78d2b58a6b1b9c7ef464f5a01b47e42ec3736322445e8e2240ca5e69e2c78b3239ecfab21649',
    'SHA-512': '164b7a7bfcf819e2e395fbe73b56e0a387bd64222e831fd610270cd7ea2505549758bf75c05a994a6d034f65f8f0e6fdcaeab1a34d4a6b4b636e070a38bce737',
  };
  for (const [hash, tag] of Object.entries(want)) {
    const key = await crypto.subtle.importKey('raw', enc.encode('Jefe'), { name: 'HMAC', hash }, false, ['sign', 'verify']);
    ok(key instanceof CryptoKey, 'a CryptoKey');
    eq(key.type, 'secret');
    eq(key.extractable, false);
    eq(key.algorithm.name, 'HMAC');
    eq(key.algorithm.hash.name, hash);
    eq(key.algorithm.length, 32);
    const sig = await crypto.subtle.sign('HMAC', key, data);
    ok(sig instanceof ArrayBuffer, 'sign gives an ArrayBuffer');
    eq(hex(sig), tag, hash);
    eq(await crypto.subtle.verify('HMAC', key, sig, data), true, 'its own tag');
    const bad = new Uint8Array(sig);
    bad[0] ^= 1;
    eq(await crypto.subtle.verify({ name: 'HMAC' }, key, bad, data), false, 'a changed tag');
    eq(await crypto.subtle.verify('HMAC', key, sig, enc.encode('other')), false, 'other data');
    eq(await crypto.subtle.verify('HMAC', key, sig.slice(0, 16), data), false, 'a short tag');
  }
});
test('crypto.subtle HMAC keys: usages, export, JWK, generateKey', async () => {
  const enc = new TextEncoder();
  const data = enc.encode('what do ya want for nothing?');
  const signOnly = await crypto.subtle.importKey('raw', enc.encode('k'), { name: 'HMAC', hash: { name: 'SHA-256' } }, true, ['sign']);
  await rejects(crypto.subtle.verify('HMAC', signOnly, new Uint8Array(32), data), 'InvalidAccessError', 'verify with a sign-only key');
  eq(hex(await crypto.subtle.exportKey('raw', signOnly)), '6b');
  const jwk = await crypto.subtle.exportKey('jwk', signOnly);
  eq(jwk.kty, 'oct');
  eq(jwk.k, 'aw');
  eq(jwk.alg, 'HS256');
  eq(jwk.ext, true);
  same(jwk.key_ops, ['sign']);
  const fromJwk = await crypto.subtle.importKey('jwk', { kty: 'oct', k: 'SmVmZQ', alg: 'HS256' }, { name: 'HMAC', hash: 'SHA-256' }, false, ['sign']);
  eq(hex(await crypto.subtle.sign('HMAC', fromJwk, data)), '5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843');
  await rejects(crypto.subtle.exportKey('raw', fromJwk), 'InvalidAccessError', 'export of a key that is not extractable');
  const gen = await crypto.subtle.generateKey({ name: 'HMAC', hash: 'SHA-512' }, true, ['sign', 'verify']);
  eq(gen.algorithm.length, 1024);
  const raw = await crypto.subtle.exportKey('raw', gen);
  eq(raw.byteLength, 128);
  const other = await crypto.subtle.generateKey({ name: 'HMAC', hash: 'SHA-512' }, true, ['sign']);
  ok(hex(raw) !== hex(await crypto.subtle.exportKey('raw', other)), 'two generated keys differ');
  const tag = await crypto.subtle.sign('HMAC', gen, data);
  eq(await crypto.subtle.verify('HMAC', gen, tag, data), true, 'a generated key verifies its tag');
  await rejects(crypto.subtle.importKey('raw', enc.encode('k'), { name: 'HMAC', hash: 'SHA-256' }, false, ['encrypt']), 'SyntaxError', 'a usage HMAC has not');
  await rejects(crypto.subtle.importKey('raw', enc.encode('k'), { name: 'HMAC', hash: 'SHA-999' }, false, ['sign']), 'NotSupportedError', 'an unknown hash');
  await rejects(crypto.subtle.importKey('raw', enc.encode('k'), { name: 'HMAC' }, false, ['sign']), TypeError, 'no hash');
  await rejects(crypto.subtle.sign('HMAC', 'not a key', data), TypeError, 'a string as the key');
});
test('crypto.subtle.timingSafeEqual (workerd)', () => {
  eq(crypto.subtle.timingSafeEqual(bytes(1, 2, 3), bytes(1, 2, 3)), true);
  eq(crypto.subtle.timingSafeEqual(bytes(1, 2, 3).buffer, bytes(1, 2, 4)), false);
  throws(() => crypto.subtle.timingSafeEqual(bytes(1), bytes(1, 2)), TypeError, 'lengths differ');
});

// ---------------- performance, queueMicrotask ----------------
test('performance.now', () => {
  const a = performance.now();
  const b = performance.now();
  eq(typeof a, 'number');
  ok(b >= a, 'monotonic');
  eq(typeof performance.timeOrigin, 'number');
});
test('queueMicrotask runs before the next task, in order', async () => {
  const order = [];
  queueMicrotask(() => order.push(1));
  queueMicrotask(() => order.push(2));
  order.push(0);
  await Promise.resolve();
  await Promise.resolve();
  same(order, [0, 1, 2]);
  throws(() => queueMicrotask(1), TypeError, 'not a function');
});

// ---------------- Event / EventTarget ----------------
test('Event: properties', () => {
  const e = new Event('ping', { cancelable: true, bubbles: true });
  eq(e.type, 'ping');
  eq(e.cancelable, true);
  eq(e.bubbles, true);
  eq(e.defaultPrevented, false);
  e.preventDefault();
  eq(e.defaultPrevented, true);
  const f = new Event('x');
  f.preventDefault();
  eq(f.defaultPrevented, false, 'not cancelable');
  eq(typeof f.timeStamp, 'number');
  throws(() => new Event(), TypeError, 'no type');
});
test('EventTarget: listeners, once, remove, handleEvent, dispatch result', () => {
  const t = new EventTarget();
  const got = [];
  const f = (e) => { got.push('f:' + e.type); eq(e.target, t); eq(e.currentTarget, t); };
  t.addEventListener('a', f);
  t.addEventListener('a', f); // ignored: the same listener twice
  t.addEventListener('a', { handleEvent(e) { got.push('obj'); } });
  t.addEventListener('a', () => got.push('once'), { once: true });
  t.dispatchEvent(new Event('a'));
  t.dispatchEvent(new Event('a'));
  same(got, ['f:a', 'obj', 'once', 'f:a', 'obj']);
  t.removeEventListener('a', f);
  got.length = 0;
  t.dispatchEvent(new Event('a'));
  same(got, ['obj']);
  const c = new EventTarget();
  c.addEventListener('x', (e) => e.preventDefault());
  eq(c.dispatchEvent(new Event('x', { cancelable: true })), false, 'canceled');
  throws(() => c.dispatchEvent({ type: 'x' }), TypeError, 'not an Event');
});
test('EventTarget: stopImmediatePropagation; a listener removed by a signal', () => {
  const t = new EventTarget();
  const got = [];
  t.addEventListener('a', (e) => { got.push(1); e.stopImmediatePropagation(); });
  t.addEventListener('a', () => got.push(2));
  t.dispatchEvent(new Event('a'));
  same(got, [1]);
  const ac = new AbortController();
  const u = new EventTarget();
  let n = 0;
  u.addEventListener('b', () => n++, { signal: ac.signal });
  u.dispatchEvent(new Event('b'));
  ac.abort();
  u.dispatchEvent(new Event('b'));
  eq(n, 1);
});
test('EventTarget: subclassing', () => {
  class Bus extends EventTarget {}
  const b = new Bus();
  let hit = false;
  b.addEventListener('go', () => { hit = true; });
  b.dispatchEvent(new Event('go'));
  ok(hit);
});

// ---------------- AbortController / AbortSignal / DOMException ----------------
test('AbortController: abort, reason, events, throwIfAborted', () => {
  const c = new AbortController();
  const s = c.signal;
  eq(s.aborted, false);
  eq(s.reason, undefined);
  s.throwIfAborted();
  const got = [];
  s.onabort = (e) => got.push('on:' + e.type);
  s.addEventListener('abort', () => got.push('listener'));
  c.abort();
  eq(s.aborted, true);
  ok(s.reason instanceof DOMException);
  eq(s.reason.name, 'AbortError');
  same(got, ['on:abort', 'listener']);
  c.abort('again');
  same(got, ['on:abort', 'listener'], 'a second abort does nothing');
  throws(() => s.throwIfAborted(), 'AbortError', 'throwIfAborted');
  const d = new AbortController();
  d.abort('mine');
  eq(d.signal.reason, 'mine');
  try { d.signal.throwIfAborted(); throw new Error('did not throw'); } catch (e) { eq(e, 'mine'); }
});
test('AbortSignal.abort, AbortSignal.any, constructor', () => {
  const s = AbortSignal.abort();
  eq(s.aborted, true);
  eq(s.reason.name, 'AbortError');
  eq(AbortSignal.abort(5).reason, 5);
  throws(() => new AbortSignal(), TypeError, 'illegal constructor');
  const a = new AbortController();
  const any = AbortSignal.any([a.signal, new AbortController().signal]);
  eq(any.aborted, false);
  a.abort('x');
  eq(any.aborted, true);
  eq(any.reason, 'x');
  eq(typeof AbortSignal.timeout, 'function');
});
test('AbortSignal.timeout (when timers run)', async () => {
  if (typeof setTimeout !== 'function') return;
  const s = AbortSignal.timeout(1);
  eq(s.aborted, false);
  await new Promise((r) => s.addEventListener('abort', r));
  eq(s.reason.name, 'TimeoutError');
});
test('DOMException', () => {
  const e = new DOMException('msg', 'NotFoundError');
  ok(e instanceof Error);
  eq(e.message, 'msg');
  eq(e.name, 'NotFoundError');
  eq(e.code, 8);
  eq(new DOMException().name, 'Error');
  eq(new DOMException('x', 'DataCloneError').code, 25);
  eq(new DOMException('x', 'Custom').code, 0);
  eq(DOMException.ABORT_ERR, 20);
});

// ---------------- Blob / File / FormData ----------------
test('Blob: size, type, text, arrayBuffer, slice, stream', async () => {
  const b = new Blob(['ab', bytes(99), new Blob(['d'])], { type: 'Text/Plain' });
  eq(b.size, 4);
  eq(b.type, 'text/plain');
  eq(await b.text(), 'abcd');
  eq((await b.arrayBuffer()).byteLength, 4);
  eq(await b.slice(1, 3).text(), 'bc');
  eq(await b.slice(-2).text(), 'cd');
  eq(b.slice(0, 1, 'x/y').type, 'x/y');
  eq(new Blob().size, 0);
  const chunks = await readStream(b.stream());
  eq(new TextDecoder().decode(chunks[0]), 'abcd');
});
test('File', () => {
  const f = new File(['x'], 'a.txt', { type: 'text/plain', lastModified: 42 });
  ok(f instanceof Blob);
  eq(f.name, 'a.txt');
  eq(f.lastModified, 42);
  eq(f.size, 1);
});
test('FormData: methods', () => {
  const f = new FormData();
  f.append('a', '1');
  f.append('a', '2');
  f.set('b', '3');
  eq(f.get('a'), '1');
  same(f.getAll('a'), ['1', '2']);
  ok(f.has('b'));
  f.delete('a');
  ok(!f.has('a'));
  f.append('file', new Blob(['x']), 'x.txt');
  const file = f.get('file');
  ok(file instanceof File);
  eq(file.name, 'x.txt');
  same([...f.keys()], ['b', 'file']);
});
test('FormData: as a body and back', async () => {
  const f = new FormData();
  f.append('name', 'value é');
  f.append('up', new File(['file body'], 'f.txt', { type: 'text/plain' }));
  const r = new Response(f);
  ok(/^multipart\/form-data; boundary=/.test(r.headers.get('content-type')), r.headers.get('content-type'));
  const back = await r.formData();
  eq(back.get('name'), 'value é');
  const up = back.get('up');
  ok(up instanceof File);
  eq(up.name, 'f.txt');
  eq(up.type, 'text/plain');
  eq(await up.text(), 'file body');
});

// ---------------- the incoming request ----------------
test('incoming request: method, url, headers are immutable', async (request) => {
  eq(request.method, 'GET');
  const u = new URL(request.url);
  eq(u.pathname, '/');
  ok(request.headers instanceof Headers);
  throws(() => request.headers.set('x-new', '1'), TypeError, 'set');
  throws(() => request.headers.append('x-new', '1'), TypeError, 'append');
  throws(() => request.headers.delete('accept'), TypeError, 'delete');
  eq(request.body, null, 'GET has no body');
  eq(request.bodyUsed, false);
  eq(await request.text(), '');
  const copy = new Request(request);
  copy.headers.set('x-new', '1');
  eq(copy.headers.get('x-new'), '1', 'a copy is mutable');
  const h = new Headers(request.headers);
  h.set('x-new', '2');
});
test('globals are defined', () => {
  for (const name of ['Headers', 'Request', 'Response', 'ReadableStream', 'ReadableStreamDefaultReader', 'URL',
    'WritableStream', 'TransformStream', 'TextEncoderStream', 'TextDecoderStream',
    'URLSearchParams', 'TextEncoder', 'TextDecoder', 'atob', 'btoa', 'console', 'structuredClone', 'crypto',
    'performance', 'queueMicrotask', 'Event', 'EventTarget', 'AbortController', 'AbortSignal', 'DOMException',
    'Blob', 'File', 'FormData', 'CryptoKey', 'SubtleCrypto']) {
    ok(typeof globalThis[name] !== 'undefined', name);
  }
});

export default {
  async fetch(request) {
    const failed = [];
    let passed = 0;
    for (const [name, f] of checks) {
      try {
        await f(request);
        passed++;
      } catch (e) {
        failed.push({ name, error: String(e && e.stack ? e.message + ' ' + e.stack.split('\n').slice(0, 2).join(' ') : e) });
      }
    }
    // Headers set after the Response is made reach the client too.
    const answer = new Response(JSON.stringify({ passed, failed, total: checks.length }));
    answer.headers.set('content-type', 'application/json');
    answer.headers.set('x-passed', String(passed));
    return answer;
  },
};
