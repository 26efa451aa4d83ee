// Package raw is the gRPC codec of the benchmark's Go programs: messages pass as the bytes they are.
package raw

import "google.golang.org/grpc/encoding"

// Codec hands messages through as the bytes they arrived as (under the name "proto", so peers
// see ordinary protobuf calls).
type Codec struct{}

func (Codec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (Codec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (Codec) Name() string { return "proto" }

var _ encoding.Codec = Codec{}
