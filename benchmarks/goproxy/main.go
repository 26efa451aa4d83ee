// Command goproxy is the baseline the relay benchmark compares cri-resmgr against: a minimal
// gRPC proxy that relays every call to a backend as raw bytes (no protobuf decoding), the way
// a generic Go relay would, using grpc-go on both sides.
package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"log"
	"net"
	"os"

	"cri-resmgr/benchmarks/goproxy/raw"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

func main() {
	listen := flag.String("listen", "", "unix socket to serve on")
	backend := flag.String("backend", "", "unix socket of the backend")
	flag.Parse()
	if *listen == "" || *backend == "" {
		log.Fatal("usage: goproxy -listen SOCKET -backend SOCKET")
	}
	conn, err := grpc.NewClient("unix://"+*backend,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(raw.Codec{})))
	if err != nil {
		log.Fatal(err)
	}
	os.Remove(*listen)
	lis, err := net.Listen("unix", *listen)
	if err != nil {
		log.Fatal(err)
	}
	server := grpc.NewServer(grpc.ForceServerCodec(raw.Codec{}),
		grpc.UnknownServiceHandler(func(_ any, in grpc.ServerStream) error { return relay(conn, in) }))
	log.Fatal(server.Serve(lis))
}

// relay forwards one call of any shape: metadata, messages both ways, headers and trailers.
func relay(conn *grpc.ClientConn, in grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(in)
	md, _ := metadata.FromIncomingContext(in.Context())
	ctx, cancel := context.WithCancel(metadata.NewOutgoingContext(in.Context(), md.Copy()))
	defer cancel()
	out, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, method)
	if err != nil {
		return err
	}
	up := make(chan error, 1)
	go func() {
		for {
			var msg []byte
			if err := in.RecvMsg(&msg); err != nil {
				if errors.Is(err, io.EOF) {
					up <- out.CloseSend()
				} else {
					up <- err
				}
				return
			}
			if err := out.SendMsg(&msg); err != nil {
				up <- err
				return
			}
		}
	}()
	first := true
	for {
		var msg []byte
		err := out.RecvMsg(&msg)
		if first {
			if header, herr := out.Header(); herr == nil {
				in.SendHeader(header)
			}
			first = false
		}
		if err != nil {
			in.SetTrailer(out.Trailer())
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err // the backend's status, passed on as it is
		}
		if err := in.SendMsg(&msg); err != nil {
			return err
		}
	}
}
