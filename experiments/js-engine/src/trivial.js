// SPIKE: the cheapest Worker, to separate the engine's per-call cost
// (Request built, fetch called, promise settled, Response read) from the
// JSON-echo Worker's own JS.
export default {
  async fetch(request) {
    return new Response('hello');
  },
};
