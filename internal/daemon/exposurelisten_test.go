package daemon

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestExposureAddress(t *testing.T) {
	for listen, want := range map[string]string{
		"127.0.0.1:8870":  "127.0.0.1:8871",
		":8870":           ":8871",
		"[::1]:9000":      "[::1]:9001",
		"127.0.0.1:0":     "127.0.0.1:0", // the system's choice, for both
		"127.0.0.1:65535": "",
		"127.0.0.1:http":  "",
	} {
		got, err := exposureAddress(listen)
		if got != want || (err != nil) != (want == "") {
			t.Errorf("exposureAddress(%q) = %q, %v; want %q", listen, got, err, want)
		}
	}
}

// TestExposureOriginOfAProxiedDeployment: `up` given the public URL of a
// proxy in front of it is refused unless its exposures have a public URL
// (or domain) of their own: their path URLs would name the exposure
// listener's address, which no caller behind the proxy reaches.
func TestExposureOriginOfAProxiedDeployment(t *testing.T) {
	proxied := Options{Host: true, PublicURL: "https://kibotos.example.test"}
	if err := checkExposureOrigin(proxied); err == nil || !strings.Contains(err.Error(), "--exposure-public-url") {
		t.Errorf("a public URL alone: %v, want a refusal naming --exposure-public-url", err)
	}
	for _, o := range []Options{
		{Host: true},
		{Host: true, PublicURL: proxied.PublicURL, ExposurePublicURL: "https://x.kibotos.example.test"},
		{Host: true, PublicURL: proxied.PublicURL, ExposureDomain: "kibotos.example.test"},
		{PublicURL: proxied.PublicURL}, // ctrl alone serves no exposure
	} {
		if err := checkExposureOrigin(o); err != nil {
			t.Errorf("%+v: %v", o, err)
		}
	}
}

// TestRelativeHome: a relative --home is made absolute, as what is under
// it is named by absolute paths.
func TestRelativeHome(t *testing.T) {
	o := Options{Home: "kibotos-home"}
	if err := o.absoluteHome(); err != nil || !filepath.IsAbs(o.Home) || filepath.Base(o.Home) != "kibotos-home" {
		t.Errorf("home %q, %v; want it absolute", o.Home, err)
	}
	if _, err := storagePools(o); err != nil {
		t.Errorf("the storage pools under a home made absolute: %v", err)
	}
}
