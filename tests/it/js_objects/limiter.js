// A rate limiter: one object per client (idFromName of its address), a
// budget of 3 requests kept in storage and loaded once, in the
// constructor, under blockConcurrencyWhile; RPC for the budget left.
import { DurableObject } from "cloudflare:workers";

export class RateLimiter extends DurableObject {
  constructor(ctx, env) {
    super(ctx, env);
    ctx.blockConcurrencyWhile(async () => {
      this.tokens = (await ctx.storage.get("tokens")) ?? 3;
    });
  }

  async fetch(request) {
    if (this.tokens <= 0) {
      return new Response("rate limited", { status: 429 });
    }
    this.tokens -= 1;
    await this.ctx.storage.put("tokens", this.tokens);
    return new Response("ok, " + this.tokens + " left");
  }

  async left() {
    return this.tokens;
  }

  async refill(n) {
    if (typeof n !== "number" || n < 0) throw new RangeError("refill takes a count");
    this.tokens += n;
    await this.ctx.storage.put("tokens", this.tokens);
    return this.tokens;
  }
}

export default {
  async fetch(request, env) {
    const url = new URL(request.url);
    const client = request.headers.get("x-client") ?? "anonymous";
    const stub = env.LIMITER.get(env.LIMITER.idFromName(client));
    if (url.pathname === "/left") return new Response(String(await stub.left()));
    if (url.pathname === "/refill") {
      try {
        return new Response(String(await stub.refill(Number(url.searchParams.get("n")))));
      } catch (e) {
        return new Response(e.name + ": " + e.message, { status: 400 });
      }
    }
    return stub.fetch(request);
  },
};
