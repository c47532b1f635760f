// The client matrix's script, through node-redis: node matrix.mjs PORT PROTOCOL.
//
// The same steps as matrix.py (see ../../clients.rs): commands with typed
// replies, a pipeline, a transaction (MULTI/EXEC, and WATCH), the usual
// error replies, and a reconnect after the server restarts. Each step
// prints "ok STEP"; the first failure exits with status 1.
import { createClient } from "redis";
import assert from "node:assert/strict";
import readline from "node:readline";

const [port, proto] = process.argv.slice(2).map(Number);
const r = createClient({
  socket: { host: "127.0.0.1", port, reconnectStrategy: () => 100 },
  RESP: proto,
});
r.on("error", () => {}); // reconnects are expected across the restart
await r.connect();

async function failsWith(prefix, fn) {
  try {
    await fn();
  } catch (e) {
    assert.ok(e.message.startsWith(prefix), `error ${e.message} does not start with ${prefix}`);
    return;
  }
  assert.fail(`no error, expected ${prefix}`);
}

assert.equal(await r.ping(), "PONG");
assert.equal(await r.set("m:k", "v"), "OK");
assert.equal(await r.get("m:k"), "v");
assert.equal(await r.get("m:missing"), null);
assert.equal(await r.incr("m:n"), 1);
assert.equal(Number(await r.incrByFloat("m:f", 1.5)), 1.5);
assert.equal(await r.hSet("m:h", { a: "1", b: "2" }), 2);
assert.deepEqual({ ...(await r.hGetAll("m:h")) }, { a: "1", b: "2" });
assert.equal(Number(await r.expire("m:k", 100)), 1);
assert.equal(await r.ttl("m:k"), 100);
assert.equal(await r.mSet({ "m:x": "1", "m:y": "2" }), "OK");
assert.deepEqual(await r.mGet(["m:x", "m:y", "m:z"]), ["1", "2", null]);
assert.equal(await r.type("m:h"), "hash");
assert.equal(await r.exists(["m:x", "m:z"]), 1);
assert.equal(await r.del(["m:x", "m:y"]), 2);
const keys = [];
for await (const batch of r.scanIterator({ MATCH: "m:*", COUNT: 10 })) {
  keys.push(...(Array.isArray(batch) ? batch : [batch]));
}
assert.deepEqual(keys.sort(), ["m:f", "m:h", "m:k", "m:n"]);
assert.deepEqual({ ...(await r.configGet("appendfsync")) }, { appendfsync: "always" });
console.log("ok commands");

const p = r.multi();
for (let i = 0; i < 100; i++) p.set(`m:p${i}`, String(i));
for (let i = 0; i < 100; i++) p.get(`m:p${i}`);
const out = await p.execAsPipeline();
assert.deepEqual(out.slice(100), Array.from({ length: 100 }, (_, i) => String(i)));
console.log("ok pipeline");

const tx = await r.multi().set("m:t", "a").append("m:t", "b").incr("m:n").get("m:t").exec();
assert.deepEqual(tx, ["OK", 2, 2, "ab"]);
await r.executeIsolated?.(async () => {}); // absent in node-redis 5+: WATCH below
const iso = await r.duplicate().connect();
await iso.watch("m:n");
const n = Number(await iso.get("m:n"));
await iso.multi().set("m:n", String(n * 2)).exec();
await iso.quit?.() ?? iso.close();
assert.equal(await r.get("m:n"), "4");
console.log("ok transaction");

await failsWith("WRONGTYPE", () => r.incr("m:h"));
await failsWith("ERR wrong number of arguments", () => r.sendCommand(["GET"]));
await failsWith("ERR unknown command", () => r.sendCommand(["NOSUCHCOMMAND", "x"]));
await failsWith("ERR value is not an integer", () => r.sendCommand(["INCRBY", "m:n", "x"]));
console.log("ok errors");

console.log("restart");
await new Promise((done) => readline.createInterface({ input: process.stdin }).once("line", done));
const deadline = Date.now() + 10000;
let got;
for (;;) {
  try {
    got = await r.get("m:t");
    break;
  } catch (e) {
    if (Date.now() > deadline) throw e;
    await new Promise((t) => setTimeout(t, 100));
  }
}
assert.equal(got, "ab");
assert.deepEqual({ ...(await r.hGetAll("m:h")) }, { a: "1", b: "2" });
console.log("ok reconnect");
await r.quit?.() ?? r.close();
process.exit(0);
