package sdk

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// h2cServer serves h on loopback over HTTP/1.1 and cleartext HTTP/2, as
// Connect's streaming calls need, until the test ends.
func h2cServer(t *testing.T, h http.Handler) *httptest.Server {
	srv := httptest.NewUnstartedServer(h)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}
