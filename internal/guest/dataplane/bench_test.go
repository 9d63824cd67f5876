package dataplane

import (
	"context"
	"testing"

	"connectrpc.com/connect"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
)

// BenchmarkStartProcessTrue times StartProcess of `true` through a
// generated client over the agent's HTTP/2 server on a unix socket, to its
// exit event: the guest's part of an exec round trip.
func BenchmarkStartProcessTrue(b *testing.B) {
	e := newTestEnv(b)
	ctx := context.Background()
	req := &datav1.StartProcessRequest{Args: []string{"true"}}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			stream, err := e.pc.StartProcess(ctx, connect.NewRequest(req))
			if err != nil {
				b.Error(err)
				return
			}
			exited := false
			for stream.Receive() {
				exited = stream.Msg().GetExited() != nil
			}
			if err := stream.Close(); err != nil || !exited {
				b.Errorf("stream: exited %v, %v", exited, err)
				return
			}
		}
	})
}
