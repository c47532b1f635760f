"""The client matrix's script, through redis-py: python3 matrix.py PORT PROTOCOL.

Every client of the matrix runs the same steps against critio-kv (see
../clients.rs): commands with typed replies, a pipeline, a transaction
(MULTI/EXEC, and WATCH), the usual error replies, and, after printing
"restart" and reading a line from stdin (the test restarts the server
meanwhile), a reconnect that finds the data. Each step prints "ok STEP";
the first failure raises, and the exit status is not 0.
"""

import sys
import time

import redis

port, protocol = int(sys.argv[1]), int(sys.argv[2])
r = redis.Redis(host="127.0.0.1", port=port, protocol=protocol, decode_responses=True)


def step(name):
    print("ok", name, flush=True)


def expect(got, want, what):
    if got != want:
        raise AssertionError(f"{what}: got {got!r}, want {want!r}")


def fails_with(prefix, fn):
    try:
        fn()
    except redis.ResponseError as e:
        if not str(e).startswith(prefix):
            raise AssertionError(f"error {e!r} does not start with {prefix!r}")
        return
    raise AssertionError(f"no error, expected {prefix!r}")


expect(r.ping(), True, "PING")
expect(r.set("m:k", "v"), True, "SET")
expect(r.get("m:k"), "v", "GET")
expect(r.get("m:missing"), None, "GET missing")
expect(r.incr("m:n"), 1, "INCR")
expect(r.incrbyfloat("m:f", 1.5), 1.5, "INCRBYFLOAT")
expect(r.hset("m:h", mapping={"a": "1", "b": "2"}), 2, "HSET")
expect(r.hgetall("m:h"), {"a": "1", "b": "2"}, "HGETALL")
expect(r.expire("m:k", 100), True, "EXPIRE")
expect(r.ttl("m:k"), 100, "TTL")
expect(r.mset({"m:x": "1", "m:y": "2"}), True, "MSET")
expect(r.mget("m:x", "m:y", "m:z"), ["1", "2", None], "MGET")
expect(r.type("m:h"), "hash", "TYPE")
expect(r.exists("m:x", "m:z"), 1, "EXISTS")
expect(r.delete("m:x", "m:y"), 2, "DEL")
expect(sorted(r.scan_iter(match="m:*")), ["m:f", "m:h", "m:k", "m:n"], "SCAN")
r.client_setname("matrix")
expect(r.client_getname(), "matrix", "CLIENT GETNAME")
expect(r.config_get("appendfsync"), {"appendfsync": "always"}, "CONFIG GET")
step("commands")

p = r.pipeline(transaction=False)
for i in range(100):
    p.set(f"m:p{i}", i)
for i in range(100):
    p.get(f"m:p{i}")
out = p.execute()
expect(out[100:], [str(i) for i in range(100)], "pipeline")
step("pipeline")

p = r.pipeline()  # MULTI/EXEC
p.set("m:t", "a").append("m:t", "b").incr("m:n").get("m:t")
expect(p.execute(), [True, 2, 2, "ab"], "MULTI/EXEC")


def double(pipe):
    n = int(pipe.get("m:n"))
    pipe.multi()
    pipe.set("m:n", n * 2)


r.transaction(double, "m:n")
expect(r.get("m:n"), "4", "WATCH transaction")
step("transaction")

fails_with("WRONGTYPE", lambda: r.incr("m:h"))
fails_with("wrong number of arguments", lambda: r.execute_command("GET"))
fails_with("unknown command", lambda: r.execute_command("NOSUCHCOMMAND", "x"))
fails_with("value is not an integer", lambda: r.incrby("m:n", "x"))
step("errors")

print("restart", flush=True)
sys.stdin.readline()
deadline = time.time() + 10
while True:
    try:
        got = r.get("m:t")
        break
    except redis.ConnectionError:
        if time.time() > deadline:
            raise
        time.sleep(0.1)
expect(got, "ab", "GET after restart")
expect(r.hgetall("m:h"), {"a": "1", "b": "2"}, "HGETALL after restart")
step("reconnect")
