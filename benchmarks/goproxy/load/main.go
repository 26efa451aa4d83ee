// Command load is the relay benchmark's load client: N concurrent clients, each on its own
// connection and goroutine (as N real callers would be), calling one unary method with a
// request given as raw bytes, so the client is never what limits the figures. It prints one
// latency in nanoseconds per line on stdout, then the calls per second on stderr.
package main

import (
	"context"
	"encoding/hex"
	"flag"
	"fmt"
	"log"
	"os"
	"sync"
	"time"

	"cri-resmgr/benchmarks/goproxy/raw"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func main() {
	socket := flag.String("socket", "", "unix socket to call")
	method := flag.String("method", "", "full method name, e.g. /runtime.v1.RuntimeService/Version")
	request := flag.String("request", "", "the request message, hex-encoded")
	calls := flag.Int("calls", 2000, "calls in all, shared by the clients")
	clients := flag.Int("clients", 1, "concurrent clients, each with its own connection")
	warmup := flag.Int("warmup", 50, "calls per client before measuring")
	flag.Parse()
	req, err := hex.DecodeString(*request)
	if err != nil || *socket == "" || *method == "" {
		log.Fatal("usage: load -socket SOCKET -method METHOD [-request HEX] [-calls N] [-clients N]")
	}
	conns := make([]*grpc.ClientConn, *clients)
	for i := range conns {
		conns[i], err = grpc.NewClient("unix://"+*socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.ForceCodec(raw.Codec{})))
		if err != nil {
			log.Fatal(err)
		}
		defer conns[i].Close()
	}
	call := func(conn *grpc.ClientConn) time.Duration {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var reply []byte
		start := time.Now()
		if err := conn.Invoke(ctx, *method, &req, &reply); err != nil {
			log.Fatal(err)
		}
		return time.Since(start)
	}
	for _, conn := range conns {
		for i := 0; i < *warmup; i++ {
			call(conn)
		}
	}
	per := *calls / *clients
	if per < 1 {
		per = 1
	}
	latencies := make([][]time.Duration, *clients)
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	for i, conn := range conns {
		ready.Add(1)
		done.Add(1)
		go func(i int, conn *grpc.ClientConn) {
			defer done.Done()
			out := make([]time.Duration, 0, per)
			ready.Done()
			<-start
			for j := 0; j < per; j++ {
				out = append(out, call(conn))
			}
			latencies[i] = out
		}(i, conn)
	}
	ready.Wait()
	began := time.Now()
	close(start)
	done.Wait()
	elapsed := time.Since(began)
	w := os.Stdout
	n := 0
	for _, l := range latencies {
		for _, d := range l {
			fmt.Fprintln(w, d.Nanoseconds())
			n++
		}
	}
	fmt.Fprintf(os.Stderr, "%.1f\n", float64(n)/elapsed.Seconds())
}
