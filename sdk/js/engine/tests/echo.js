// A JSON-echo Worker in the Workers module syntax
// (`export default { fetch(request, env, ctx) }`), as workerd runs it: the
// engine's tests build it (`hearth::testing::build_js`, what `hearth build`
// does after bundling), and the js_vs_workerd bench serves it on hearth and
// on workerd unchanged.
//
// It answers every request with the JSON of the componentize-js sample
// (sample-workers/js/worker.js)
//   {"worker":"js","method","path","headers","body","bodyLength"}
// plus `served`: the requests this instance has served (a module-level
// counter: it shows reuse, and that module state persists as on workerd).
// Test hooks, by request header:
//   x-js-leave: timer   start a timer and a promise chain on it, not awaited;
//                        the next request reports `leaked: true` if either
//                        ran after this request ended.
//   x-js-sleep: MS       await a MS ms timer before answering (the event
//                        loop runs timers while this request waits).
//   x-js-spin: 1         loop forever (the host's CPU limit ends it).
//   x-js-throw: 1        throw from fetch (the host answers 500, and the
//                        instance is retired).
//   x-js-wait-until: 1   record a ctx.waitUntil task, finished after the
//                        response; the next request reports `waitedUntil`.
//   x-js-respond: JSON   answer as the JSON says instead, e.g.
//                        {"status":201,"headers":[["x-a","1"],["x-a","2"]],
//                         "bytes":[0,255],"repeat":3}: the body is `bytes`
//                        `repeat` times (what the engine must carry
//                        to the client unchanged).

let served = 0;
let leaked = false;
let waitedUntil = 0;

export default {
  async fetch(request, env, ctx) {
    served += 1;
    if (request.headers.get('x-js-spin')) {
      for (;;) {
        served += 0;
      }
    }
    if (request.headers.get('x-js-throw')) {
      throw new Error('thrown on purpose (x-js-throw)');
    }
    const respond = request.headers.get('x-js-respond');
    if (respond) {
      const spec = JSON.parse(respond);
      const one = new Uint8Array(spec.bytes || []);
      const times = spec.repeat || 1;
      const body = new Uint8Array(one.byteLength * times);
      for (let i = 0; i < times; i++) {
        body.set(one, i * one.byteLength);
      }
      return new Response(body, { status: spec.status || 200, headers: spec.headers || [] });
    }
    if (request.headers.get('x-js-leave') === 'timer') {
      setTimeout(() => {
        leaked = true;
      }, 0);
      new Promise((resolve) => setTimeout(resolve, 1)).then(() => {
        leaked = true;
      });
    }
    if (request.headers.get('x-js-wait-until')) {
      ctx.waitUntil(Promise.resolve().then(() => {
        waitedUntil += 1;
      }));
    }
    const sleep = Number(request.headers.get('x-js-sleep') || 0);
    if (sleep > 0) {
      await new Promise((resolve) => setTimeout(resolve, sleep));
    }
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
      served,
      leaked,
      waitedUntil,
    };
    return new Response(JSON.stringify(answer), {
      status: 200,
      headers: { 'content-type': 'application/json' },
    });
  },
};
