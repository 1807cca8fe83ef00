// Issue 43's counter, as written there (Cloudflare's API, unchanged).
import { DurableObject } from "cloudflare:workers";
export class Counter extends DurableObject {
  async fetch(request) {
    const n = ((await this.ctx.storage.get("n")) ?? 0) + 1;
    await this.ctx.storage.put("n", n);
    return new Response(String(n));
  }
}
export default { fetch(req, env) { return env.COUNTER.get(env.COUNTER.idFromName("global")).fetch(req); } };
