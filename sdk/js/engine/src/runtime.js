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
    request: __hearth_web.incoming,
    env,
    ctx,
    // The Worker's answer taken apart: [status, [name, value, ...], bytes].
    answer: __hearth_web.outgoing,
  };
})();
