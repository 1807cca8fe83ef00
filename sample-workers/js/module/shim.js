// Runs a Worker written in the Workers module syntax,
//   export default { async fetch(request, env, ctx) { ... } }
// as a wasi:http component whose instance serves request after request.
//
// Why: with StarlingMonkey's fetch event (`addEventListener('fetch')`, what
// componentize-js attaches when a world exports wasi:http/incoming-handler
// and the JS does not), one instance answers one request only: the engine
// creates a single FetchEvent when the snapshot is taken. A module that
// exports `incomingHandler` itself turns the fetch event off, and each call
// of wasi:http/incoming-handler#handle is then an ordinary export call:
// componentize-js runs the JS function, drives the event loop until its
// promise settles and returns, as often as the host calls it. This file is
// that export, written once for every Worker (see docs/js-reuse.md).
//
// A call:
//  1. reads the request (method, URL, headers; the body in full, unless GET
//     or HEAD) into a standard `Request`;
//  2. awaits `worker.fetch(request, env, ctx)` and the response body;
//  3. answers through the response outparam (the body written in 4 KiB
//     writes, then finished): a thrown error or a non-`Response` value
//     answers 500;
//  4. after the answer, awaits what `ctx.waitUntil` was given;
//  5. ends the request: timers it started and did not clear are cancelled,
//     so none of its callbacks, nor promises waiting on them, run during a
//     later request; if it failed (step 3), or left an outgoing `fetch`
//     running, the call throws after answering, which traps the instance
//     and the host retires it (a half-finished request's I/O must not
//     complete inside the next one).
//
// Module state (globals, caches) persists between requests, as in workerd.
// Bodies are buffered, not streamed, both ways.

import {
  Fields,
  OutgoingBody,
  OutgoingResponse,
  ResponseOutparam,
} from 'wasi:http/types@0.2.10';

const symbolDispose = Symbol.dispose || Symbol.for('dispose');

/** Drops a WASI resource now rather than when the GC finalizes it. */
function drop(resource) {
  const f = resource && resource[symbolDispose];
  if (f) {
    f.call(resource);
  }
}

// Timers of the current request: wrapped before the Worker's module runs
// (the entry imports this file first), so every setTimeout/setInterval the
// Worker makes is seen.
const timers = new Set();
const { setTimeout: realSetTimeout, setInterval: realSetInterval } = globalThis;
const { clearTimeout: realClearTimeout, clearInterval: realClearInterval } = globalThis;
globalThis.setTimeout = function setTimeout(callback, ms, ...args) {
  const id = realSetTimeout(
    (...a) => {
      timers.delete(id);
      return callback(...a);
    },
    ms,
    ...args,
  );
  timers.add(id);
  return id;
};
globalThis.setInterval = function setInterval(callback, ms, ...args) {
  const id = realSetInterval(callback, ms, ...args);
  timers.add(id);
  return id;
};
globalThis.clearTimeout = function clearTimeout(id) {
  timers.delete(id);
  realClearTimeout(id);
};
globalThis.clearInterval = function clearInterval(id) {
  timers.delete(id);
  realClearInterval(id);
};

// Outgoing fetches not yet settled.
let inFlight = 0;
const realFetch = globalThis.fetch;
if (realFetch) {
  globalThis.fetch = function fetch(...args) {
    inFlight += 1;
    const done = () => {
      inFlight -= 1;
    };
    const p = realFetch(...args);
    p.then(done, done);
    return p;
  };
}

const METHODS = {
  get: 'GET',
  head: 'HEAD',
  post: 'POST',
  put: 'PUT',
  delete: 'DELETE',
  connect: 'CONNECT',
  options: 'OPTIONS',
  trace: 'TRACE',
  patch: 'PATCH',
};

// One of each for every request: constructing them per request is work
// for the interpreter (no JIT in this engine, see docs/js-reuse.md).
const utf8 = new TextEncoder();
const text = new TextDecoder();

// Headers the host sets itself (wasi:http refuses them in a response).
const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'transfer-encoding',
  'upgrade',
  'host',
]);

function readBody(incoming) {
  const body = incoming.consume();
  const stream = body.stream();
  const chunks = [];
  let total = 0;
  for (;;) {
    let chunk;
    try {
      chunk = stream.blockingRead(65536n);
    } catch (e) {
      if (e && e.payload && e.payload.tag === 'closed') {
        break;
      }
      throw e;
    }
    chunks.push(chunk);
    total += chunk.byteLength;
  }
  drop(stream);
  drop(body);
  const bytes = new Uint8Array(total);
  let at = 0;
  for (const c of chunks) {
    bytes.set(c, at);
    at += c.byteLength;
  }
  return bytes;
}

function toRequest(incoming) {
  const m = incoming.method();
  const method = m.tag === 'other' ? m.val : METHODS[m.tag];
  const scheme = incoming.scheme();
  const proto = scheme && scheme.tag === 'HTTPS' ? 'https' : 'http';
  const authority = incoming.authority() || 'localhost';
  const url = `${proto}://${authority}${incoming.pathWithQuery() || '/'}`;
  const fields = incoming.headers();
  const entries = fields.entries();
  drop(fields);
  // Indexed loops, not `for…of` with destructuring: the interpreter runs
  // the iterator protocol op by op.
  const pairs = new Array(entries.length);
  for (let i = 0; i < entries.length; i++) {
    const e = entries[i];
    pairs[i] = [e[0], text.decode(e[1])];
  }
  const headers = new Headers(pairs);
  const init = { method, headers };
  if (method !== 'GET' && method !== 'HEAD') {
    init.body = readBody(incoming);
  }
  return new Request(url, init);
}

function respond(outparam, status, headers, bytes) {
  const list = [];
  for (const pair of headers) {
    const name = pair[0];
    if (!HOP_BY_HOP.has(name)) {
      list.push([name, utf8.encode(pair[1])]);
    }
  }
  const response = new OutgoingResponse(Fields.fromList(list));
  // 200 is what a new outgoing-response has: one host call fewer.
  if (status !== 200) {
    response.setStatusCode(status);
  }
  const body = response.body();
  ResponseOutparam.set(outparam, { tag: 'ok', val: response });
  const stream = body.write();
  for (let at = 0; at < bytes.byteLength; at += 4096) {
    stream.blockingWriteAndFlush(bytes.subarray(at, at + 4096));
  }
  drop(stream);
  OutgoingBody.finish(body, undefined);
}

/**
 * The `wasi:http/incoming-handler` export for `worker` (a module's default
 * export with a `fetch` method), given `env` as the Worker's environment.
 */
export function incomingHandlerFor(worker, env = {}) {
  return {
    async handle(incoming, outparam) {
      const waits = [];
      const ctx = {
        waitUntil(promise) {
          waits.push(promise);
        },
        passThroughOnException() {},
      };
      let failure = null;
      let status;
      let headers;
      let bytes;
      try {
        const request = toRequest(incoming);
        const response = await worker.fetch(request, env, ctx);
        if (!(response instanceof Response)) {
          throw new TypeError('fetch() did not return a Response');
        }
        bytes = new Uint8Array(await response.arrayBuffer());
        status = response.status;
        headers = response.headers;
      } catch (e) {
        failure = e;
        console.error(`Worker fetch failed: ${e && e.stack ? e.stack : e}`);
        status = 500;
        headers = new Headers({ 'content-type': 'text/plain' });
        bytes = utf8.encode('Internal Server Error');
      }
      drop(incoming);
      respond(outparam, status, headers, bytes);
      if (waits.length > 0) {
        await Promise.allSettled(waits);
      }
      for (const id of timers) {
        realClearTimeout(id);
        realClearInterval(id);
      }
      timers.clear();
      if (failure) {
        throw new Error('the Worker failed: this instance is retired');
      }
      if (inFlight > 0) {
        throw new Error(
          `the request ended with ${inFlight} fetch() calls still running: this instance is retired`,
        );
      }
    },
  };
}
