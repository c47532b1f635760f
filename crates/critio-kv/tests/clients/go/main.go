// The client matrix's script, through go-redis v9: matrix PORT PROTOCOL.
//
// The same steps as matrix.py (see ../../clients.rs): commands with typed
// replies, a pipeline, a transaction (MULTI/EXEC, and WATCH), the usual
// error replies, and a reconnect after the server restarts. Each step
// prints "ok STEP"; the first failure exits with status 1.
package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

var ctx = context.Background()

func expect(got, want interface{}, what string) {
	if !reflect.DeepEqual(got, want) {
		fmt.Fprintf(os.Stderr, "%s: got %#v, want %#v\n", what, got, want)
		os.Exit(1)
	}
}

func must(err error, what string) {
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", what, err)
		os.Exit(1)
	}
}

func failsWith(prefix string, err error) {
	if err == nil || !strings.HasPrefix(err.Error(), prefix) {
		fmt.Fprintf(os.Stderr, "error %v does not start with %q\n", err, prefix)
		os.Exit(1)
	}
}

func main() {
	port := os.Args[1]
	proto, _ := strconv.Atoi(os.Args[2])
	r := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + port, Protocol: proto})

	pong, err := r.Ping(ctx).Result()
	must(err, "PING")
	expect(pong, "PONG", "PING")
	must(r.Set(ctx, "m:k", "v", 0).Err(), "SET")
	v, err := r.Get(ctx, "m:k").Result()
	must(err, "GET")
	expect(v, "v", "GET")
	expect(r.Get(ctx, "m:missing").Err(), redis.Nil, "GET missing")
	expect(r.Incr(ctx, "m:n").Val(), int64(1), "INCR")
	expect(r.IncrByFloat(ctx, "m:f", 1.5).Val(), 1.5, "INCRBYFLOAT")
	expect(r.HSet(ctx, "m:h", "a", "1", "b", "2").Val(), int64(2), "HSET")
	expect(r.HGetAll(ctx, "m:h").Val(), map[string]string{"a": "1", "b": "2"}, "HGETALL")
	expect(r.Expire(ctx, "m:k", 100*time.Second).Val(), true, "EXPIRE")
	expect(r.TTL(ctx, "m:k").Val(), 100*time.Second, "TTL")
	must(r.MSet(ctx, "m:x", "1", "m:y", "2").Err(), "MSET")
	expect(r.MGet(ctx, "m:x", "m:y", "m:z").Val(), []interface{}{"1", "2", nil}, "MGET")
	expect(r.Type(ctx, "m:h").Val(), "hash", "TYPE")
	expect(r.Exists(ctx, "m:x", "m:z").Val(), int64(1), "EXISTS")
	expect(r.Del(ctx, "m:x", "m:y").Val(), int64(2), "DEL")
	var keys []string
	iter := r.Scan(ctx, 0, "m:*", 10).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	must(iter.Err(), "SCAN")
	sort.Strings(keys)
	expect(keys, []string{"m:f", "m:h", "m:k", "m:n"}, "SCAN")
	expect(r.ConfigGet(ctx, "appendfsync").Val(), map[string]string{"appendfsync": "always"}, "CONFIG GET")
	fmt.Println("ok commands")

	p := r.Pipeline()
	gets := make([]*redis.StringCmd, 100)
	for i := 0; i < 100; i++ {
		p.Set(ctx, fmt.Sprintf("m:p%d", i), i, 0)
	}
	for i := 0; i < 100; i++ {
		gets[i] = p.Get(ctx, fmt.Sprintf("m:p%d", i))
	}
	_, err = p.Exec(ctx)
	must(err, "pipeline")
	for i := 0; i < 100; i++ {
		expect(gets[i].Val(), strconv.Itoa(i), "pipeline GET")
	}
	fmt.Println("ok pipeline")

	tx := r.TxPipeline() // MULTI/EXEC
	tx.Set(ctx, "m:t", "a", 0)
	tx.Append(ctx, "m:t", "b")
	incr := tx.Incr(ctx, "m:n")
	got := tx.Get(ctx, "m:t")
	_, err = tx.Exec(ctx)
	must(err, "MULTI/EXEC")
	expect(incr.Val(), int64(2), "MULTI/EXEC INCR")
	expect(got.Val(), "ab", "MULTI/EXEC GET")
	err = r.Watch(ctx, func(t *redis.Tx) error {
		n, err := t.Get(ctx, "m:n").Int()
		if err != nil {
			return err
		}
		_, err = t.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, "m:n", n*2, 0)
			return nil
		})
		return err
	}, "m:n")
	must(err, "WATCH transaction")
	expect(r.Get(ctx, "m:n").Val(), "4", "WATCH transaction")
	fmt.Println("ok transaction")

	failsWith("WRONGTYPE", r.Incr(ctx, "m:h").Err())
	failsWith("ERR wrong number of arguments", r.Do(ctx, "GET").Err())
	failsWith("ERR unknown command", r.Do(ctx, "NOSUCHCOMMAND", "x").Err())
	failsWith("ERR value is not an integer", r.Do(ctx, "INCRBY", "m:n", "x").Err())
	fmt.Println("ok errors")

	fmt.Println("restart")
	bufio.NewReader(os.Stdin).ReadString('\n')
	deadline := time.Now().Add(10 * time.Second)
	for {
		v, err = r.Get(ctx, "m:t").Result()
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	must(err, "GET after restart")
	expect(v, "ab", "GET after restart")
	expect(r.HGetAll(ctx, "m:h").Val(), map[string]string{"a": "1", "b": "2"}, "HGETALL after restart")
	fmt.Println("ok reconnect")
}
