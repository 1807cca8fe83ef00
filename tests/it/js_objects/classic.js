// Cloudflare's Durable Object counter example of its docs' older style,
// unchanged: a plain class with `constructor(state, env)`, the stub called
// with the request's URL.
export class Counter {
  constructor(state, env) {
    this.state = state;
  }

  // Handle HTTP requests from clients.
  async fetch(request) {
    // Apply requested action.
    let url = new URL(request.url);

    // Durable Object storage is automatically cached in-memory, so reading the
    // same key every request is fast.
    // You could also store the value in a class member if you prefer.
    let value = (await this.state.storage.get("value")) || 0;

    switch (url.pathname) {
      case "/increment":
        ++value;
        break;
      case "/decrement":
        --value;
        break;
      case "/":
        // Serves the current value.
        break;
      default:
        return new Response("Not found", { status: 404 });
    }

    // You do not have to worry about a concurrent request having modified the value in storage.
    // "input gates" will automatically protect against unwanted concurrency.
    // Read-modify-write is safe.
    await this.state.storage.put("value", value);

    return new Response(value);
  }
}

export default {
  async fetch(request, env) {
    let id = env.COUNTER.idFromName("A");

    // Construct the stub for the Durable Object using the ID.
    // A stub is a client Object used to send messages to the Durable Object.
    let obj = env.COUNTER.get(id);

    // Send a request to the Durable Object, then await its response.
    let resp = await obj.fetch(request.url);
    let count = await resp.text();

    return new Response("Durable Object 'A' count: " + count);
  },
};
