// The per-request glue between the host (src/request.rs) and the Worker:
// the Request the host builds, `env`, `ctx`, and reading the Response back.
// Evaluated after web.js, before the Worker's module.
(() => {
  const g = globalThis;
  const env = {};
  let waits = [];
  const ctx = {
    waitUntil(p) { waits.push(p); },
    passThroughOnException() {},
  };
  g.__hearth = {
    // Called by the host per request: the Request, env and ctx for fetch.
    request(method, url, pairs, body) {
      const h = new Headers();
      for (let i = 0; i < pairs.length; i += 2) h.append(pairs[i], pairs[i + 1]);
      return new Request(method, url, h, body);
    },
    env,
    ctx,
    // The Response's headers as a flat [name, value, ...] array.
    headers(r) {
      const out = [];
      for (const [k, v] of r.headers._m) out.push(k, v);
      return out;
    },
  };
})();
