// A key-value room: one object per room name, its entries in storage:
// put/get/delete (single and batch), list with its options, a transaction
// that rolls back, deleteAll, and values structured clone copies.
import { DurableObject } from "cloudflare:workers";

export class Room extends DurableObject {
  async fetch(request) {
    const url = new URL(request.url);
    const q = url.searchParams;
    const s = this.ctx.storage;
    switch (url.pathname) {
      case "/put":
        await s.put(q.get("key"), await request.json());
        return Response.json({ ok: true });
      case "/get":
        return Response.json({ value: (await s.get(q.get("key"))) ?? null });
      case "/delete":
        return Response.json({ deleted: await s.delete(q.get("key")) });
      case "/batch": {
        await s.put({ "b:1": 1, "b:2": [2, 2], "b:3": { three: 3 } });
        const got = await s.get(["b:3", "b:1", "b:none", "b:2"]);
        const deleted = await s.delete(["b:1", "b:2", "b:none"]);
        return Response.json({ got: [...got], deleted, left: [...(await s.list({ prefix: "b:" }))] });
      }
      case "/list": {
        const options = {};
        for (const name of ["prefix", "start", "startAfter", "end"]) {
          if (q.has(name)) options[name] = q.get(name);
        }
        if (q.has("limit")) options.limit = Number(q.get("limit"));
        if (q.has("reverse")) options.reverse = true;
        return Response.json([...(await s.list(options))]);
      }
      case "/move": {
        // Moves a value to a new key in one transaction; refuses (and rolls
        // back the half-done move) if the target exists.
        const from = q.get("from");
        const to = q.get("to");
        try {
          await s.transaction(async (txn) => {
            const v = await txn.get(from);
            await txn.delete(from);
            if ((await txn.get(to)) !== undefined) throw new Error(to + " exists");
            await txn.put(to, v);
          });
          return Response.json({ moved: true });
        } catch (e) {
          return Response.json({ moved: false, why: e.message }, { status: 409 });
        }
      }
      case "/rollback": {
        await s.transaction(async (txn) => {
          await txn.put("rolled", "back");
          txn.rollback();
        });
        return Response.json({ rolled: (await s.get("rolled")) ?? null });
      }
      case "/types": {
        const shared = { n: 1 };
        const value = {
          map: new Map([["k", new Set([1, 2])]]),
          date: new Date(86400000),
          big: 12345678901234567890n,
          bytes: new Uint8Array([1, 2, 3]),
          special: [NaN, -0, Infinity, undefined, null],
          regexp: /ab+c/gi,
          error: new RangeError("far"),
          shared: [shared, shared],
        };
        value.self = value;
        await s.put("types", value);
        const v = await s.get("types");
        return Response.json({
          map: v.map instanceof Map && v.map.get("k") instanceof Set && v.map.get("k").has(2),
          date: v.date instanceof Date && v.date.toISOString(),
          big: typeof v.big === "bigint" && v.big.toString(),
          bytes: v.bytes instanceof Uint8Array && [...v.bytes],
          special: [Number.isNaN(v.special[0]), Object.is(v.special[1], -0), v.special[2], v.special.length, 3 in v.special, v.special[4]],
          regexp: v.regexp instanceof RegExp && String(v.regexp),
          error: v.error instanceof RangeError && v.error.message,
          shared: v.shared[0] === v.shared[1],
          cyclic: v.self === v,
        });
      }
      case "/refused": {
        try {
          await s.put("f", { f() {} });
          return Response.json({ refused: false });
        } catch (e) {
          return Response.json({ refused: e.name, kept: (await s.get("f")) ?? null });
        }
      }
      case "/clear":
        await s.deleteAll();
        return Response.json([...(await s.list())]);
      default:
        return new Response("no such route", { status: 404 });
    }
  }
}

export default {
  fetch(request, env) {
    const room = new URL(request.url).searchParams.get("room") ?? "lobby";
    return env.ROOMS.get(env.ROOMS.idFromName(room)).fetch(request);
  },
};
