// hearth sample Worker: a Hono app (https://hono.dev) in the Workers module
// syntax, exactly as it would be written for workerd or Cloudflare.
// Built with `hearth build worker.js`; the bench serves the same file on
// workerd (bundled by esbuild). Routes:
//   GET  /                 text
//   GET  /json             JSON
//   GET  /users/:id        JSON with a path parameter (and ?q= echoed)
//   POST /echo             the JSON body, echoed with its size
//   GET  /env/:name        the var or secret `name` of the Worker (env)
//   ANY  /auth/*           passes the request to the service binding AUTH
//                          (env.AUTH.fetch) and answers with its status,
//                          headers and body
//   ANY  /dispatch/:worker/*
//                          passes the request to user Worker `worker` of
//                          dispatch namespace USERS (env.USERS.get(worker))
//   GET  /origin/*         proxies to the origin in the var ORIGIN (the
//                          rest of the path and the query), adding the
//                          secret API_KEY as a bearer token: the origin
//                          must be on the Worker's allow-list
//   anything else          Hono's 404
import { Hono } from 'hono';

const app = new Hono();

app.get('/', (c) => c.text('Hello from Hono on hearth!'));

app.get('/json', (c) => c.json({ framework: 'hono', ok: true }));

app.get('/users/:id', (c) =>
  c.json({ id: c.req.param('id'), q: c.req.query('q') ?? null }),
);

app.post('/echo', async (c) => {
  const body = await c.req.json();
  return c.json({ body, size: JSON.stringify(body).length });
});

app.get('/env/:name', (c) => {
  const value = c.env[c.req.param('name')];
  if (typeof value !== 'string') {
    return c.json({ error: 'not set' }, 404);
  }
  return c.json({ value });
});

app.all('/auth/*', async (c) => {
  if (!c.env.AUTH) {
    return c.json({ error: 'no AUTH binding' }, 500);
  }
  const answer = await c.env.AUTH.fetch(c.req.raw);
  return c.json({
    status: answer.status,
    headers: Object.fromEntries(answer.headers),
    body: await answer.text(),
  });
});

app.all('/dispatch/:worker/*', async (c) => {
  if (!c.env.USERS) {
    return c.json({ error: 'no USERS namespace' }, 500);
  }
  const answer = await c.env.USERS.get(c.req.param('worker')).fetch(c.req.raw);
  return c.json({ status: answer.status, body: await answer.text() });
});

app.get('/origin/*', async (c) => {
  const url = new URL(c.req.url);
  const path = url.pathname.slice('/origin'.length) || '/';
  const answer = await fetch(`${c.env.ORIGIN}${path}${url.search}`, {
    headers: { authorization: `Bearer ${c.env.API_KEY}` },
  });
  return new Response(answer.body, {
    status: answer.status,
    headers: { 'content-type': answer.headers.get('content-type') ?? 'text/plain' },
  });
});

export default app;
