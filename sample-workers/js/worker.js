// hearth sample Worker in JavaScript.
//
// Built by componentize-js (StarlingMonkey) into a wasi:http proxy component:
// the engine turns each call of wasi:http/incoming-handler#handle into a
// `fetch` event, so this is the Service Worker style of Worker.
//
// It answers every request with JSON describing it:
//   {"worker":"js","method":"POST","path":"/x?y=1","headers":{...},
//    "body":"...","bodyLength":N}
// `path` is the URL's pathname and query; `headers` maps each lower-case
// header name to its value (repeated headers joined with ", ", as the
// Fetch API's Headers does); `body` is the request body decoded as UTF-8
// (malformed bytes become U+FFFD) and `bodyLength` its length in bytes.
//
// With a request header `x-js-fetch: <url>` it first calls `fetch(url)`,
// the standard Fetch API (on hearth: a Worker it is bound to, e.g.
// http://next.internal/), and adds `"fetched": {"status": N, "body": "..."}`
// to the answer, or `"fetchError": "..."` if the fetch was refused.

addEventListener('fetch', (event) => {
  event.respondWith(handle(event.request));
});

async function handle(request) {
  const url = new URL(request.url);
  const headers = {};
  for (const [name, value] of request.headers) {
    headers[name] = value;
  }
  // GET and HEAD requests cannot carry a body in the Fetch API.
  let bytes = new Uint8Array(0);
  if (request.method !== 'GET' && request.method !== 'HEAD') {
    bytes = new Uint8Array(await request.arrayBuffer());
  }
  const answer = {
    worker: 'js',
    method: request.method,
    path: url.pathname + url.search,
    headers,
    body: new TextDecoder().decode(bytes),
    bodyLength: bytes.byteLength,
  };
  const target = request.headers.get('x-js-fetch');
  if (target) {
    try {
      const resp = await fetch(target);
      answer.fetched = { status: resp.status, body: await resp.text() };
    } catch (e) {
      answer.fetchError = String(e);
    }
  }
  return new Response(JSON.stringify(answer), {
    status: 200,
    headers: { 'content-type': 'application/json' },
  });
}
