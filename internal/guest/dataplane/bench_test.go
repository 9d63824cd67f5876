package dataplane

import (
	"context"
	"os"
	"path/filepath"
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

// BenchmarkReadFile reads a 256 MiB file through a generated client over
// the agent's HTTP/2 server on a unix socket: the guest's part of a
// download.
func BenchmarkReadFile(b *testing.B) {
	e := newTestEnv(b)
	path := filepath.Join(memDir(b), "f")
	const size = 256 << 20
	if err := os.WriteFile(path, make([]byte, size), 0o644); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(size)
	for b.Loop() {
		stream, err := e.fc.ReadFile(context.Background(), connect.NewRequest(&datav1.ReadFileRequest{Path: path}))
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for stream.Receive() {
			n += len(stream.Msg().GetData())
		}
		if err := stream.Close(); err != nil || n != size {
			b.Fatalf("read %d bytes: %v", n, err)
		}
	}
}

// BenchmarkWriteFile writes a 256 MiB file in 1 MiB messages, as the SDK
// uploads, through a generated client over the agent's HTTP/2 server on a
// unix socket: the guest's part of an upload.
func BenchmarkWriteFile(b *testing.B) {
	e := newTestEnv(b)
	path := filepath.Join(memDir(b), "f")
	const size = 256 << 20
	chunk := make([]byte, 1<<20)
	b.SetBytes(size)
	for b.Loop() {
		stream := e.fc.WriteFile(context.Background())
		if err := stream.Send(&datav1.WriteFileRequest{Part: &datav1.WriteFileRequest_Start{Start: &datav1.WriteFileStart{Path: path}}}); err != nil {
			b.Fatal(err)
		}
		for range size / len(chunk) {
			if err := stream.Send(&datav1.WriteFileRequest{Part: &datav1.WriteFileRequest_Data{Data: chunk}}); err != nil {
				b.Fatal(err)
			}
		}
		if err := stream.Send(&datav1.WriteFileRequest{Part: &datav1.WriteFileRequest_Commit{Commit: true}}); err != nil {
			b.Fatal(err)
		}
		if _, err := stream.CloseAndReceive(); err != nil {
			b.Fatal(err)
		}
	}
}

// memDir returns a new directory in memory (under /dev/shm), or else on
// disk: the file benchmarks time the data plane, not the disk.
func memDir(b *testing.B) string {
	dir, err := os.MkdirTemp("/dev/shm", "dataplane-bench")
	if err != nil {
		return b.TempDir()
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
