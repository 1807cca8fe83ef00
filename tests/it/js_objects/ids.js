// IDs, bindings on env and the object's ctx, as booleans and values that
// do not depend on how a runtime makes IDs (so hearth's answer and
// workerd's can be compared).
import { DurableObject } from "cloudflare:workers";

export class Probe extends DurableObject {
  async fetch(request) {
    return Response.json({
      url: request.url,
      idIsHex: /^[0-9a-f]{64}$/.test(this.ctx.id.toString()),
      asked: request.headers.get("x-id") === this.ctx.id.toString(),
      storage: typeof this.ctx.storage.get,
      env: typeof this.env.PROBES,
    });
  }

  async whoami() {
    return this.ctx.id.toString();
  }
}

export default {
  async fetch(request, env) {
    const ns = env.PROBES;
    const a = ns.idFromName("a");
    const again = ns.idFromName("a");
    const unique = ns.newUniqueId();
    let invalid = null;
    try {
      ns.idFromString("not an id");
    } catch (e) {
      invalid = e.name;
    }
    const stub = ns.get(a);
    const inside = await (await stub.fetch("https://example.com/path?q=1", { headers: { "x-id": a.toString() } })).json();
    return Response.json({
      nope: typeof env.NOPE,
      inEnv: "PROBES" in env,
      notInEnv: "NOPE" in env,
      hex: /^[0-9a-f]{64}$/.test(a.toString()),
      same: a.equals(again) && a.toString() === again.toString(),
      differs: !a.equals(ns.idFromName("b")) && !unique.equals(ns.newUniqueId()),
      uniqueHex: /^[0-9a-f]{64}$/.test(unique.toString()),
      name: a.name ?? null,
      uniqueName: unique.name ?? null,
      fromString: ns.idFromString(a.toString()).equals(a),
      invalid,
      inside,
      rpc: (await stub.whoami()) === a.toString(),
      getByName: (await ns.getByName("a").whoami()) === a.toString(),
    });
  },
};
