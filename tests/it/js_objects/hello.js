// Cloudflare's Durable Objects starter (wrangler's template), unchanged:
// an RPC method called on the stub.
import { DurableObject } from "cloudflare:workers";

/** A Durable Object's behavior is defined in an exported Javascript class */
export class MyDurableObject extends DurableObject {
  /**
   * The constructor is invoked once upon creation of the Durable Object, i.e. the first call to
   * 	`DurableObjectStub::get` for a given identifier (no-op constructors can be omitted)
   *
   * @param {DurableObjectState} ctx - The interface for interacting with Durable Object state
   * @param {Env} env - The interface to reference bindings declared in wrangler.jsonc
   */
  constructor(ctx, env) {
    super(ctx, env);
  }

  /**
   * The Durable Object exposes an RPC method sayHello which will be invoked when when a Durable
   *  Object instance receives a request from a Worker via the same method invocation on the stub
   *
   * @param {string} name - The name provided to a Durable Object instance from a Worker
   * @returns {Promise<string>} The greeting to be sent back to the Worker
   */
  async sayHello(name) {
    return `Hello, ${name}!`;
  }
}

export default {
  /**
   * This is the standard fetch handler for a Cloudflare Worker
   *
   * @param {Request} request - The request submitted to the Worker from the client
   * @param {Env} env - The interface to reference bindings declared in wrangler.jsonc
   * @param {ExecutionContext} ctx - The execution context of the Worker
   * @returns {Promise<Response>} The response to be sent back to the client
   */
  async fetch(request, env, ctx) {
    // Create a `DurableObjectId` for an instance of the `MyDurableObject`
    // class named "foo". Requests from all Workers to the instance named
    // "foo" will go to a single globally unique Durable Object instance.
    const id = env.MY_DURABLE_OBJECT.idFromName("foo");

    // Create a stub to open a communication channel with the Durable
    // Object instance.
    const stub = env.MY_DURABLE_OBJECT.get(id);

    // Call the `sayHello()` RPC method on the stub to invoke the method on
    // the remote Durable Object instance
    const greeting = await stub.sayHello("world");

    return new Response(greeting);
  },
};
