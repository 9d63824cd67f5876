package testutil

import (
	"io"
	"net/http"
	"testing"
)

// Do sends req with client and returns the response, its body read whole
// and closed; the test fails when either does not work.
func Do(t testing.TB, client *http.Client, req *http.Request) (*http.Response, []byte) {
	t.Helper()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}
