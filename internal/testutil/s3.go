package testutil

import (
	"net/http/httptest"
	"testing"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

// S3 starts an S3-compatible server in memory on loopback until the test
// ends, with one bucket, and returns the bucket's gocloud.dev/blob URL
// (s3://...?endpoint=...). It sets the AWS credential variables the s3
// blob driver reads in the test's environment (and so its children's).
func S3(t testing.TB) string {
	t.Helper()
	backend := s3mem.New()
	const bucket = "kibotos"
	if err := backend.CreateBucket(bucket); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gofakes3.New(backend).Server())
	t.Cleanup(srv.Close)
	t.Setenv("AWS_ACCESS_KEY_ID", "kibotos-test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "kibotos-test-secret")
	return "s3://" + bucket + "?region=us-east-1&use_path_style=true&disable_https=true&endpoint=" + srv.URL
}
