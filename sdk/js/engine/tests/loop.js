// A test Worker of the engine's request lifecycle, event loop, timers,
// fetch, env and ctx (src/request.rs, src/event_loop.rs, src/timers.rs,
// src/fetch.rs, src/env.rs), one route per behaviour; tests/it/js_loop.rs
// deploys it (with vars, a service binding, a dispatch namespace and an
// allowed origin) and checks each route's answer.
//
//   GET /timers          timers fire in due order, extra arguments, nested
//                        timers, an interval cleared after 3 runs, a
//                        cleared timeout never runs, microtasks between
//                        callbacks, scheduler.wait: {"log": [...]}
//   GET /leave           leaves a 0 ms timer, a promise on a 1 ms timer and
//                        an interval behind; `leaked` in later answers says
//                        whether any ran after this request ended
//   GET /sleep?ms=N      answers after an N ms timer
//   GET /fetch?url=U[&redirect=MODE]
//                        fetch(U): {status, body, header (x-origin),
//                        location, url} or {error}
//   GET /fetch-len?url=U fetch(U)'s body: {status, length, sum} (a
//                        checksum: sum of byte[i] * (i % 7), mod 1000003)
//   GET /fetch-abort?url=U  fetch(U/hold) aborted after 10 ms by an
//                        AbortController: {aborted, error}
//   GET /fetch2?url=U    two fetches of U at once (U gets ?n=1, ?n=2)
//   GET /fetch-status?url=U  fetch(U)'s status, its body never read:
//                        {status, served}
//   GET /read-one-then-wait?url=U  reads one piece of fetch(U)'s body,
//                        then waits 500 ms on a timer: {read, served}
//   GET /proxy?url=U     answers fetch(U) itself (its body streams through)
//   GET /fetch-abort-body?url=U  fetch(U) aborted after its body's first
//                        read: {first, aborted, error}
//   GET /fetch-leave?url=U  starts fetch(U) and answers without awaiting
//                        it (the instance traps after answering)
//   GET /auth            env.AUTH.fetch('/check?q=1', {headers}) answer
//   GET /dispatch?name=W env.USERS.get(W).fetch(url, init) answer (a
//                        POST with a body, to another host: the binding's
//                        host is used, with the path and query)
//   GET /check           what a binding's callee answers: its method,
//                        path and x-from header
//   GET /env             the env's string entries and binding names
//   GET /wait            ctx.waitUntil(a 10 ms timer, then a count)
//   GET /wait-gate?url=U ctx.waitUntil(fetch(U/gate), then fetch(U/after-gate))
//   GET /throw           throws (500, instance retired)
//   GET /reject          an async rejection (500, instance retired)
//   GET /not-response    answers 42 (500, instance retired)
//   GET /never           awaits a promise nothing can settle (500)
//   GET /unhandled       leaves a rejected promise without a handler
//   GET /microtask       queues a microtask that throws (answers 200)
//   GET /big?kb=N        an N KiB body, byte i = i % 251
//   anything else        {served, leaked, waited}

let served = 0;
let leaked = false;
let waited = 0;

const json = (v, status = 200) =>
  new Response(JSON.stringify(v), { status, headers: { 'content-type': 'application/json' } });

function query(url, name) {
  const q = url.indexOf('?');
  if (q < 0) return null;
  for (const part of url.slice(q + 1).split('&')) {
    const eq = part.indexOf('=');
    if (part.slice(0, eq) === name) return decodeURIComponent(part.slice(eq + 1));
  }
  return null;
}

function pathOf(url) {
  const rest = url.slice(url.indexOf('://') + 3);
  const slash = rest.indexOf('/');
  const path = slash < 0 ? '/' : rest.slice(slash);
  const q = path.indexOf('?');
  return q < 0 ? path : path.slice(0, q);
}

async function timers() {
  const log = [];
  await new Promise((done) => {
    setTimeout(() => log.push('t100'), 100);
    setTimeout((a, b) => {
      log.push('t50:' + a + b);
      Promise.resolve().then(() => log.push('micro-after-t50'));
    }, 50, 'x', 'y');
    setTimeout(() => {
      log.push('t0');
      setTimeout(() => log.push('nested-t0'), 0);
    }, 0);
    const gone = setTimeout(() => log.push('cleared'), 5);
    clearTimeout(gone);
    setTimeout(() => log.push('neg'), -5);
    let n = 0;
    const iv = setInterval(() => {
      n += 1;
      log.push('iv' + n);
      if (n === 3) clearInterval(iv);
    }, 2);
    setTimeout(() => {
      log.push('t200');
    }, 200);
    scheduler.wait(250).then(() => {
      log.push('wait250');
      done();
    });
  });
  return json({ log });
}

async function show(resp) {
  return {
    status: resp.status,
    body: await resp.text(),
    header: resp.headers.get('x-origin'),
    location: resp.headers.get('location'),
    url: resp.url,
  };
}

export default {
  async fetch(request, env, ctx) {
    served += 1;
    const url = request.url;
    const path = pathOf(url);
    switch (path) {
      case '/timers':
        return timers();
      case '/leave':
        setTimeout(() => {
          leaked = true;
        }, 0);
        new Promise((resolve) => setTimeout(resolve, 1)).then(() => {
          leaked = true;
        });
        setInterval(() => {
          leaked = true;
        }, 1);
        return json({ served, leaked });
      case '/sleep':
        await new Promise((resolve) => setTimeout(resolve, Number(query(url, 'ms'))));
        return json({ served, slept: true, leaked });
      case '/fetch':
        try {
          const init = { headers: { 'x-test': 'loop' } };
          if (query(url, 'redirect')) init.redirect = query(url, 'redirect');
          return json(await show(await fetch(query(url, 'url'), init)));
        } catch (e) {
          return json({ error: e.name + ': ' + e.message });
        }
      case '/fetch-len': {
        const r = await fetch(query(url, 'url'));
        const bytes = new Uint8Array(await r.arrayBuffer());
        let sum = 0;
        for (let i = 0; i < bytes.length; i++) sum = (sum + bytes[i] * (i % 7)) % 1000003;
        return json({ status: r.status, length: bytes.length, sum });
      }
      case '/fetch-abort': {
        // The origin's /hold answers only when the test lets it: the abort
        // comes first.
        const c = new AbortController();
        const pending = fetch(query(url, 'url') + '/hold', { signal: c.signal });
        setTimeout(() => c.abort(), 10);
        try {
          await pending;
          return json({ aborted: false });
        } catch (e) {
          return json({ aborted: true, error: e.name });
        }
      }
      case '/fetch2': {
        const u = query(url, 'url');
        const both = await Promise.all([fetch(u + '?n=1'), fetch(u + '?n=2')]);
        return json(await Promise.all(both.map(show)));
      }
      case '/fetch-status': {
        // The body is never read.
        const r = await fetch(query(url, 'url'));
        return json({ status: r.status, served });
      }
      case '/read-one-then-wait': {
        // One piece of a large body read, the rest left at the host, then
        // a 500 ms wait on a timer.
        const r = await fetch(query(url, 'url'));
        const reader = r.body.getReader();
        const first = await reader.read();
        await new Promise((resolve) => setTimeout(resolve, 500));
        return json({ read: first.value.length, served });
      }
      case '/proxy':
        return fetch(query(url, 'url'));
      case '/fetch-abort-body': {
        // Aborted after the body's first piece: the next read rejects.
        const c = new AbortController();
        const r = await fetch(query(url, 'url'), { signal: c.signal });
        const reader = r.body.getReader();
        const first = new TextDecoder().decode((await reader.read()).value);
        c.abort();
        try {
          await reader.read();
          return json({ first, aborted: false });
        } catch (e) {
          return json({ first, aborted: true, error: e.name });
        }
      }
      case '/fetch-leave':
        fetch(query(url, 'url'));
        return json({ left: true });
      case '/auth':
        return json(await show(await env.AUTH.fetch('/check?q=1', { headers: { 'x-from': 'loop' } })));
      case '/dispatch':
        return json(
          await show(
            await env.USERS.get(query(url, 'name')).fetch('http://any.host/check?via=dispatch', {
              method: 'POST',
              headers: { 'x-from': 'dispatch' },
              body: 'hello',
            }),
          ),
        );
      case '/check':
        return new Response(
          JSON.stringify({
            method: request.method,
            path: url.slice(url.indexOf('/', 8)),
            from: request.headers.get('x-from'),
            body: await request.text(),
          }),
          { headers: { 'x-origin': 'callee' } },
        );
      case '/env': {
        const vars = {};
        const bindings = [];
        for (const k of Object.keys(env)) {
          if (typeof env[k] === 'string') vars[k] = env[k];
          else bindings.push(k);
        }
        return json({ vars, bindings });
      }
      case '/wait-gate': {
        const u = query(url, 'url');
        ctx.waitUntil(fetch(u + '/gate').then(() => fetch(u + '/after-gate')));
        return json({ waiting: true });
      }
      case '/wait':
        ctx.waitUntil(
          new Promise((resolve) => setTimeout(resolve, 10)).then(() => {
            waited += 1;
          }),
        );
        return json({ waited });
      case '/throw':
        throw new Error('thrown on purpose');
      case '/reject':
        await null;
        throw new TypeError('rejected on purpose');
      case '/not-response':
        return 42;
      case '/never':
        await new Promise(() => {});
        return json({});
      case '/microtask':
        queueMicrotask(() => {
          throw new Error('thrown in a microtask');
        });
        return json({ ok: true });
      case '/unhandled':
        Promise.reject(new Error('nobody handles this'));
        return json({ ok: true });
      case '/big': {
        const n = Number(query(url, 'kb')) * 1024;
        const body = new Uint8Array(n);
        for (let i = 0; i < n; i++) body[i] = i % 251;
        return new Response(body);
      }
      default:
        return json({ served, leaked, waited });
    }
  },
};
