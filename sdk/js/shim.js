// Runs a Worker written in the Workers module syntax,
//   export default { async fetch(request, env, ctx) { ... } }
// as a wasi:http component whose instance serves request after request.
// `hearth build` (./build.mjs) bundles this file first, then the Worker.
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
//  3. answers through the response outparam: a thrown error or a
//     non-`Response` value answers 500;
//  4. after the answer, awaits what `ctx.waitUntil` was given;
//  5. ends the request: timers it started and did not clear are cancelled,
//     so none of its callbacks, nor promises waiting on them, run during a
//     later request; if it failed (step 3), or left an outgoing `fetch`
//     running, the call throws after answering, which traps the instance
//     and the host retires it (a half-finished request's I/O must not
//     complete inside the next one).
//
// `env` (the second argument) is built on the first request an instance
// serves, from the environment hearth gives it (wasi:cli/environment), not
// at build time: componentize-js takes its snapshot then, and the
// environment of that moment is the build machine's. An instance's
// environment never changes (a deploy or `hearth secret put` loads the
// Worker anew, with new instances), so one read per instance is a read at
// request time. It holds:
//   - every var and secret of the Worker, by name (`env.API_KEY`), as a
//     string;
//   - each service binding as an object with `fetch(input, init)`
//     (`env.AUTH.fetch(request)`), under the binding's name and its
//     upper-case form with `-` as `_` (binding `auth-v2` is `env["auth-v2"]`
//     and `env.AUTH_V2`): the request goes to `http://<binding>.internal`
//     with its path and query, which hearth routes to the bound Worker;
//   - each dispatch namespace the same way, with `get(name)` giving the user
//     Worker's `fetch` (`env.USERS.get("user-a").fetch(request)`).
// hearth names the bindings in HEARTH_SERVICES and HEARTH_DISPATCH
// (comma-separated); the runtime's own HEARTH_* entries are not in `env`.
//
// Module state (globals, caches) persists between requests, as in workerd.
// Bodies are buffered, not streamed, both ways.
//
// The request's head (step 1) and the answer (step 3) each take one call
// of hearth's `hearth:js/fast-http` (sdk/js/wit/world.wit) instead of the
// seven and eight wasi:http calls they would take: every call through the
// bindings componentize-js generates costs 4-12 us of interpreted JS,
// whatever it carries (docs/js-reuse.md). So the component runs on hearth
// only. A body larger than `respond` takes (8 KiB, what one outgoing body
// of wasi:http buffers) is written through wasi:http's streams, and the
// request body is read through them.

import {
  Fields,
  OutgoingBody,
  OutgoingResponse,
  ResponseOutparam,
} from 'wasi:http/types@0.2.10';
import { getEnvironment } from 'wasi:cli/environment@0.2.10';
import { requestHead, respond as respondWhole } from 'hearth:js/fast-http';

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

// One for every instance: constructing it per request is work for the
// interpreter (no JIT in this engine, see docs/js-reuse.md).
const utf8 = new TextEncoder();

// The largest body `respond` of hearth:js/fast-http takes: one outgoing
// body's buffer on the wasi:http path (runtime/src/host.rs,
// OUTGOING_BODY_BYTES), so a guest parks no more of its memory in the host.
const WHOLE_BODY_LIMIT = 8192;

// Headers the host sets itself (wasi:http refuses them in a response or
// an outgoing request).
const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'transfer-encoding',
  'upgrade',
  'host',
]);

/**
 * The request body, read in full. With a declared length (`length` ≥ 0)
 * the reads stop once that many bytes arrived: the host (hyper) ends a
 * body at its content-length, so the read that would only report the end
 * (a host call and a thrown `closed` error, ≈ 10 µs) is skipped.
 */
function readBody(incoming, length) {
  const body = incoming.consume();
  const stream = body.stream();
  const chunks = [];
  let total = 0;
  while (total !== length) {
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

let bindingsTuned = false;

/**
 * Makes every later wasi call cheaper: the bindings componentize-js
 * generates (they run in a global of their own, not the Worker's) evaluate
 * `globalThis?.process?.env?.JCO_DEBUG` twice per call, a miss on their
 * global that SpiderMonkey resolves the slow way (the standard-class
 * resolver, then the prototype chain). An own `process` property there that
 * is `undefined` makes it a hit. `value` is any object the bindings made
 * (the incoming request's resource object); the Worker's global is never
 * touched.
 */
function tuneBindings(value) {
  bindingsTuned = true;
  try {
    const global = value.constructor.constructor('return this')();
    if (global !== globalThis && !('process' in global)) {
      Object.defineProperty(global, 'process', {
        value: undefined,
        writable: true,
        configurable: true,
      });
    }
  } catch {
    // Not these bindings: nothing to tune.
  }
}

function toRequest(incoming) {
  if (!bindingsTuned) {
    tuneBindings(incoming);
  }
  // One host call: method, URL, then name and value of each header, one
  // per line (the host decodes values as a TextDecoder would).
  const lines = requestHead(incoming).split('\n');
  const method = lines[0];
  const url = lines[1];
  // Indexed loops, not `for…of` with destructuring: the interpreter runs
  // the iterator protocol op by op.
  const pairs = new Array((lines.length - 2) >> 1);
  for (let i = 2, j = 0; i < lines.length; i += 2, j++) {
    pairs[j] = [lines[i], lines[i + 1]];
  }
  // The pairs themselves, not a `Headers` made of them (≈ 5 µs less: the
  // `Request` copies them into its own `Headers` either way); GET is the
  // default method.
  if (method === 'GET') {
    return new Request(url, { headers: pairs });
  }
  if (method === 'HEAD') {
    return new Request(url, { method, headers: pairs });
  }
  return new Request(url, { method, headers: pairs, body: readBody(incoming, declaredLength(pairs)) });
}

/**
 * The request's `content-length` as a number, or -1 when it has none, it
 * is not a plain decimal or the body is chunked.
 */
function declaredLength(pairs) {
  let length = -1;
  for (let i = 0; i < pairs.length; i++) {
    const name = pairs[i][0];
    if (name === 'content-length') {
      const v = pairs[i][1];
      length = /^[0-9]{1,15}$/.test(v) ? Number(v) : -1;
    } else if (name === 'transfer-encoding') {
      // Framed by its chunks, whatever a content-length says.
      return -1;
    }
  }
  return length;
}

/**
 * Answers with one host call: the headers as lines of name and value (a
 * `Headers` holds no line break in either), hop-by-hop ones left out. A
 * body larger than `respond` takes goes through wasi:http.
 */
function respond(outparam, status, headers, bytes) {
  if (bytes.byteLength > WHOLE_BODY_LIMIT) {
    respondStreamed(outparam, status, headers, bytes);
    return;
  }
  let lines = '';
  for (const pair of headers) {
    const name = pair[0];
    if (!HOP_BY_HOP.has(name)) {
      lines = lines.length === 0 ? `${name}\n${pair[1]}` : `${lines}\n${name}\n${pair[1]}`;
    }
  }
  // The lines' UTF-8, then the body, in one list: the engine's encoder and
  // one copy, where the bindings would lower a string with a loop of
  // interpreted JS over its characters and a second list with another call
  // into the allocator. A UTF-16 unit takes at most 3 bytes of UTF-8.
  const all = new Uint8Array(lines.length * 3 + bytes.byteLength);
  const headLength = lines.length === 0 ? 0 : utf8.encodeInto(lines, all).written;
  all.set(bytes, headLength);
  respondWhole(outparam, status, headLength, all.subarray(0, headLength + bytes.byteLength));
}

/** Answers through wasi:http (the body written in 4 KiB writes). */
function respondStreamed(outparam, status, headers, bytes) {
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

/** The key a binding named `name` also has in `env`: AUTH for auth. */
function bindingKey(name) {
  return name.toUpperCase().replace(/-/g, '_');
}

/**
 * A binding's `fetch`: `input` and `init` as for the global `fetch`; the
 * request is sent to `host` (a `.internal` name) with its method, path,
 * query, headers and body. A relative URL (`/check`) is taken as a path.
 */
function fetcherFor(host) {
  return {
    async fetch(input, init) {
      if (typeof input === 'string' && !/^[a-z][a-z0-9+.-]*:/i.test(input)) {
        input = `http://${host}${input.startsWith('/') ? '' : '/'}${input}`;
      }
      const request = new Request(input, init);
      const url = new URL(request.url);
      const method = request.method;
      const body =
        method === 'GET' || method === 'HEAD' ? undefined : await request.arrayBuffer();
      // Host and hop-by-hop headers are the host's to set (wasi:http
      // refuses them in a request the guest makes).
      const headers = new Headers();
      for (const [name, value] of request.headers) {
        if (!HOP_BY_HOP.has(name)) {
          headers.append(name, value);
        }
      }
      return fetch(`http://${host}${url.pathname}${url.search}`, { method, headers, body });
    },
  };
}

function namesIn(value) {
  return value.split(',').filter((name) => name.length > 0);
}

let cachedEnv = null;

/**
 * The Worker's `env`, read from the instance's environment on first use
 * (see the top of this file).
 */
function workerEnv(base) {
  if (cachedEnv) {
    return cachedEnv;
  }
  const env = { ...base };
  const add = (name, value) => {
    env[name] = value;
    const key = bindingKey(name);
    if (!(key in env)) {
      env[key] = value;
    }
  };
  let services = [];
  let namespaces = [];
  for (const [name, value] of getEnvironment()) {
    if (name === 'HEARTH_SERVICES') {
      services = namesIn(value);
    } else if (name === 'HEARTH_DISPATCH') {
      namespaces = namesIn(value);
    } else if (!name.startsWith('HEARTH_')) {
      env[name] = value;
    }
  }
  for (const name of services) {
    add(name, fetcherFor(`${name}.internal`));
  }
  for (const ns of namespaces) {
    add(ns, {
      get(worker) {
        return fetcherFor(`${worker}.${ns}.dispatch.internal`);
      },
    });
  }
  cachedEnv = env;
  return env;
}

/**
 * The `wasi:http/incoming-handler` export for `worker` (a module's default
 * export with a `fetch` method). `env` is the Worker's vars, secrets and
 * bindings (see the top of this file), over the entries of `base`.
 */
export function incomingHandlerFor(worker, base = {}) {
  if (!worker || typeof worker.fetch !== 'function') {
    throw new TypeError(
      'the Worker has no default export with a fetch method: ' +
        'write `export default { async fetch(request, env, ctx) { ... } }`',
    );
  }
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
        const response = await worker.fetch(request, workerEnv(base), ctx);
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
      if (timers.size > 0) {
        for (const id of timers) {
          realClearTimeout(id);
          realClearInterval(id);
        }
        timers.clear();
      }
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
