// Durable Object alarms (Cloudflare's API): each object is named by `?o=`;
// its routes set, read and delete its alarm, and say what its alarm()
// handler saw. `?fail=N` makes the handler throw on its first N tries;
// `?rearm=N` makes it set a new alarm on its first N runs.
import { DurableObject } from "cloudflare:workers";

export class Alarmed extends DurableObject {
  async fetch(request) {
    const url = new URL(request.url);
    const s = this.ctx.storage;
    const n = (name) => Number(url.searchParams.get(name) ?? 0);
    switch (url.pathname) {
      case "/set": {
        await s.put({ fail: n("fail"), rearm: n("rearm") });
        const at = Date.now() + n("in");
        // A Date, as Cloudflare's examples pass it; getAlarm gives ms.
        await s.setAlarm(new Date(at));
        return Response.json({ same: (await s.getAlarm()) === at });
      }
      case "/get":
        return Response.json({ alarm: await s.getAlarm() });
      case "/delete":
        await s.deleteAlarm();
        return Response.json({ alarm: await s.getAlarm() });
      case "/rollback": {
        // A transaction's alarm change is undone with its writes.
        const before = await s.getAlarm();
        try {
          await s.transaction(async (txn) => {
            await txn.setAlarm(Date.now() + 1000000);
            throw new Error("undo");
          });
        } catch {}
        return Response.json({ kept: (await s.getAlarm()) === before });
      }
      case "/fired":
        return Response.json({ fired: (await s.get("fired")) ?? [] });
      case "/bad":
        try {
          await s.setAlarm("soon");
          return Response.json({ refused: false });
        } catch (e) {
          return Response.json({ refused: e.name });
        }
      default:
        return new Response("no such route", { status: 404 });
    }
  }

  async alarm(alarmInfo) {
    const s = this.ctx.storage;
    const fired = (await s.get("fired")) ?? [];
    fired.push(alarmInfo);
    await s.put("fired", fired);
    if (((await s.get("fail")) ?? 0) > alarmInfo.retryCount) {
      throw new Error("failing on purpose");
    }
    const rearm = (await s.get("rearm")) ?? 0;
    if (rearm > 0) {
      await s.put("rearm", rearm - 1);
      await s.setAlarm(Date.now() + 100);
    }
  }
}

export default {
  fetch(request, env) {
    const name = new URL(request.url).searchParams.get("o") ?? "a";
    return env.ALARMS.get(env.ALARMS.idFromName(name)).fetch(request);
  },
};
