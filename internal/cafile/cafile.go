// Package cafile reads the certificate authorities a client trusts beside
// the system's, for deployments whose certificates a private authority
// signed (the CLI's --ca-file, kibotos host --ca-file).
package cafile

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// Load returns a TLS client configuration that trusts the certificate
// authorities in the PEM file at path beside the system's roots.
func Load(path string) (*tls.Config, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}
