package server_test

import (
	"context"
	"testing"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/testutil"
)

// BenchmarkCreateEgress measures CreateEgress over HTTP (Connect binary)
// on SQLite, with b.N parallel callers spread over GOMAXPROCS goroutines.
// Run: go test -run '^$' -bench . ./internal/server/
func BenchmarkCreateEgress(b *testing.B) {
	e := newEnv(b, testutil.SQLiteStore(b))
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := e.egress.CreateEgress(ctx, connect.NewRequest(&ctrlv1.CreateEgressRequest{
				Command: cmd(), Spec: socks5("93.184.216.34:1080"), Labels: map[string]string{"bench": "yes"}})); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
}

// BenchmarkGetEgress measures GetEgress over HTTP on SQLite.
func BenchmarkGetEgress(b *testing.B) {
	e := newEnv(b, testutil.SQLiteStore(b))
	ctx := context.Background()
	eg := e.createEgress(socks5("93.184.216.34:1080"), nil)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := e.egress.GetEgress(ctx, connect.NewRequest(&ctrlv1.GetEgressRequest{EgressId: eg.EgressId})); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
}
