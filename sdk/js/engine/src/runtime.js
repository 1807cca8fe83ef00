// The per-request glue between the host (src/request.rs) and the Worker:
// the Request the host builds, `env`, `ctx`, the global `fetch`, and
// reading the Response back. Evaluated after the web APIs (src/web/*.js), before the Worker's
// module. It builds and takes apart Requests and Responses only through
// `__hearth_web` (src/web/fetch.js), never their fields.
//
// The natives it uses are defined in Rust before it runs
// (src/event_loop.rs, src/fetch.rs): `__hearth_fetch(method, url, pairs,
// body)` sends one outgoing request and answers [id, promise of [status,
// pairs, id, url]] once the response head has arrived,
// `__hearth_fetch_read(id)` answers a promise of the body's next piece (a
// Uint8Array, or null at its end), `__hearth_fetch_abort(id)` cancels the
// request or its body;
// `__hearth_wait_until(promise)` records a `ctx.waitUntil` promise. It
// takes them off the global object, so only this file calls them.
(() => {
  const g = globalThis;
  const W = g.__hearth_web;
  const nativeFetch = g.__hearth_fetch;
  const nativeAbort = g.__hearth_fetch_abort;
  const nativeRead = g.__hearth_fetch_read;
  const waitUntil = g.__hearth_wait_until;
  delete g.__hearth_fetch;
  delete g.__hearth_fetch_read;
  delete g.__hearth_fetch_abort;
  delete g.__hearth_wait_until;

  // One request taken apart by `toFetch`: a promise of the host's answer,
  // [status, pairs, id, url]. An abort of `signal` rejects it with the
  // signal's reason and cancels the request.
  function once(method, url, pairs, body, signal) {
    const [id, answer] = nativeFetch(method, url, pairs, body);
    if (!signal || typeof signal.addEventListener !== 'function') return answer;
    return new Promise((resolve, reject) => {
      const onAbort = () => {
        nativeAbort(id);
        reject(signal.reason);
      };
      if (signal.aborted) return onAbort();
      signal.addEventListener('abort', onAbort);
      answer.then(
        (v) => {
          signal.removeEventListener('abort', onAbort);
          resolve(v);
        },
        (e) => {
          signal.removeEventListener('abort', onAbort);
          reject(e);
        },
      );
    });
  }

  // `scheme://authority` of an absolute URL, lower case.
  function originOf(url) {
    const p = url.indexOf('://');
    let i = p + 3;
    while (i < url.length && url[i] !== '/' && url[i] !== '?' && url[i] !== '#') i++;
    return url.slice(0, i).toLowerCase();
  }

  // `location` resolved against `url`.
  function resolve(location, url) {
    if (location.indexOf('://') > 0) return location;
    if (location.startsWith('//')) return url.slice(0, url.indexOf(':') + 1) + location;
    if (location.startsWith('/')) return originOf(url) + location;
    return new URL(location, url).href;
  }

  const REDIRECTS = [301, 302, 303, 307, 308];
  // Statuses whose responses have no body.
  const NULL_BODY = [101, 103, 204, 205, 304];

  // Fetch `id`'s body as a stream that reads a piece from the host each
  // time the Worker reads (no read ahead); an abort of `signal` errors it
  // with the signal's reason and cancels the body in the host.
  function bodyStream(id, signal) {
    const listens = signal && typeof signal.addEventListener === 'function';
    let controller = null;
    const onAbort = () => {
      nativeAbort(id);
      try { controller.error(signal.reason); } catch {}
    };
    const done = () => { if (listens) signal.removeEventListener('abort', onAbort); };
    return new ReadableStream({
      start(c) {
        controller = c;
        if (listens) signal.addEventListener('abort', onAbort);
      },
      pull(c) {
        return nativeRead(id).then(
          (piece) => {
            if (piece === null) { done(); c.close(); } else c.enqueue(piece);
          },
          (e) => { done(); throw e; },
        );
      },
      cancel() { done(); nativeAbort(id); },
    }, { highWaterMark: 0 });
  }

  // Sends a request taken apart by `toFetch` and answers a Response,
  // following redirects as the Fetch spec does unless `redirect` is
  // 'manual' ('error' rejects): at most 20; a 303, or a 301/302 of a POST,
  // becomes a GET without a body; `authorization` is not sent to another
  // origin.
  async function send(method, url, pairs, body, signal, redirect) {
    for (let hops = 0; ; hops++) {
      const r = await once(method, url, pairs, body, signal);
      const status = r[0];
      let location = null;
      if (redirect !== 'manual' && REDIRECTS.indexOf(status) >= 0) {
        for (let i = 0; i < r[1].length; i += 2) if (r[1][i] === 'location') location = r[1][i + 1];
      }
      if (location === null) {
        if (method === 'HEAD' || NULL_BODY.indexOf(status) >= 0) {
          nativeAbort(r[2]);
          return W.fromFetch(status, r[1], null, url);
        }
        return W.fromFetch(status, r[1], bodyStream(r[2], signal), url);
      }
      nativeAbort(r[2]);
      if (redirect === 'error') throw new TypeError('fetch ' + url + ' was redirected (redirect: "error")');
      if (hops === 20) throw new TypeError('fetch ' + url + ': more than 20 redirects');
      const next = resolve(location, url);
      const drop = [];
      if (status === 303 ? method !== 'GET' && method !== 'HEAD' : status <= 302 && method === 'POST') {
        method = 'GET';
        body = undefined;
        drop.push('content-type', 'content-length', 'content-encoding', 'content-language', 'content-location');
      }
      if (originOf(next) !== originOf(url)) drop.push('authorization');
      if (drop.length > 0) {
        const kept = [];
        for (let i = 0; i < pairs.length; i += 2) {
          if (drop.indexOf(pairs[i].toLowerCase()) < 0) kept.push(pairs[i], pairs[i + 1]);
        }
        pairs = kept;
      }
      url = next;
    }
  }

  // `signal` and `redirect` of `fetch(input, init)`.
  function optionOf(input, init, name) {
    if (init && init[name] !== undefined) return init[name];
    return input instanceof Request ? input[name] : undefined;
  }

  // The global `fetch(input, init)`: a failure (a bad URL, a request
  // hearth refuses, a connection refused) rejects with a TypeError that
  // says why. It resolves once the response head has arrived; the body
  // streams as the Worker reads it.
  async function fetch(input, init) {
    const a = await W.toFetch(input, init);
    return send(a[0], a[1], a[2], a[3], optionOf(input, init, 'signal'), optionOf(input, init, 'redirect'));
  }

  // The path and query of an absolute URL ('/' when it has none).
  function pathOf(url) {
    const p = url.indexOf('://');
    let rest = p >= 0 ? url.slice(p + 3) : url;
    const h = rest.indexOf('#');
    if (h >= 0) rest = rest.slice(0, h);
    let i = 0;
    while (i < rest.length && rest[i] !== '/' && rest[i] !== '?') i++;
    const path = rest.slice(i);
    if (path === '') return '/';
    return path[0] === '?' ? '/' + path : path;
  }

  // A binding's `fetch`: `input` and `init` as for the global `fetch`,
  // sent to `host` (a `.internal` name, which hearth routes to the bound
  // Worker) with its method, path, query, headers and body. A string
  // without a scheme (`/check`) is taken as a path.
  function fetcherFor(host) {
    return {
      async fetch(input, init) {
        if (typeof input === 'string' && input.indexOf('://') < 0) {
          input = 'http://' + host + (input[0] === '/' ? '' : '/') + input;
        }
        const a = await W.toFetch(input, init);
        const signal = optionOf(input, init, 'signal');
        return send(a[0], 'http://' + host + pathOf(a[1]), a[2], a[3], signal, optionOf(input, init, 'redirect'));
      },
    };
  }

  // A Durable Object stub's `fetch` (objects.js): `input` and `init` as
  // for the global `fetch`, sent to `host` (`<binding>.<id>.object.internal`)
  // with its path and query, and the URL given in the header
  // `hearth-object-url` (the object sees it as its request's URL). The
  // caller's own `hearth-object-url` and `hearth-object-rpc` headers are
  // dropped (a client's request passed on must not call an RPC method);
  // `rpc` names the method of an RPC call (objects.js).
  async function fetchObject(host, input, init, rpc) {
    const a = await W.toFetch(input, init);
    const pairs = [];
    for (let i = 0; i < a[2].length; i += 2) {
      const name = a[2][i].toLowerCase();
      if (name !== 'hearth-object-url' && name !== 'hearth-object-rpc') pairs.push(a[2][i], a[2][i + 1]);
    }
    pairs.push('hearth-object-url', a[1]);
    if (rpc !== undefined) pairs.push('hearth-object-rpc', rpc);
    const signal = optionOf(input, init, 'signal');
    return send(a[0], 'http://' + host + pathOf(a[1]), pairs, a[3], signal, optionOf(input, init, 'redirect'));
  }

  // The key a binding named `name` also has in `env`: AUTH_V2 for auth-v2.
  function bindingKey(name) {
    return name.toUpperCase().split('-').join('_');
  }

  function namesIn(value) {
    return value.split(',').filter((name) => name.length > 0);
  }

  // The Worker's `env` from the instance's environment, [name, value, ...]
  // (src/env.rs calls this once per instance).
  function makeEnv(pairs) {
    const env = {};
    let services = [];
    let namespaces = [];
    for (let i = 0; i < pairs.length; i += 2) {
      const name = pairs[i];
      const value = pairs[i + 1];
      if (name === 'HEARTH_SERVICES') services = namesIn(value);
      else if (name === 'HEARTH_DISPATCH') namespaces = namesIn(value);
      else if (!name.startsWith('HEARTH_')) env[name] = value;
    }
    const add = (name, value) => {
      env[name] = value;
      const key = bindingKey(name);
      if (!(key in env)) env[key] = value;
    };
    for (const name of services) add(name, fetcherFor(name + '.internal'));
    for (const ns of namespaces) {
      add(ns, {
        get(worker) {
          return fetcherFor(worker + '.' + ns + '.dispatch.internal');
        },
      });
    }
    return env;
  }

  g.fetch = fetch;
  // workerd's `scheduler.wait(ms)`: a promise of a timer (awaitable
  // setTimeout; an abort of `options.signal` rejects it).
  g.scheduler = {
    wait(ms, options) {
      const signal = options && options.signal;
      return new Promise((resolve, reject) => {
        if (signal && signal.aborted) return reject(signal.reason);
        const id = setTimeout(resolve, ms);
        if (signal && typeof signal.addEventListener === 'function') {
          signal.addEventListener('abort', () => {
            clearTimeout(id);
            reject(signal.reason);
          });
        }
      });
    },
  };
  g.__hearth = {
    // Called by the host per request: the Request for fetch.
    request: W.incoming,
    makeEnv,
    fetchObject,
    // One for every request (nothing in it is per request).
    ctx: {
      waitUntil(promise) {
        waitUntil(Promise.resolve(promise));
      },
      passThroughOnException() {},
    },
    // The Worker's answer taken apart: [status, [name, value, ...], bytes].
    answer: W.outgoing,
  };
})();
