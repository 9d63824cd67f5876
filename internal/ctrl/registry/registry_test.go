package registry_test

import (
	"context"
	"crypto/x509"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/kibotos/kibotos/internal/ctrl/registry"
	"github.com/kibotos/kibotos/internal/netcheck"
	"github.com/kibotos/kibotos/internal/testutil/registrytest"
)

const user, password = registrytest.User, registrytest.Password

func push(t testing.TB, ref string, img v1.Image) {
	t.Helper()
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img, remote.WithAuth(&authn.Basic{Username: user, Password: password})); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
}

func randomImage(t testing.TB, platform v1.Platform) v1.Image {
	t.Helper()
	return withPlatform(t, randomImageOf(t, 1024, 2), platform)
}

// randomImageOf is an image of n random layers of size bytes each, for
// the hosts' platform.
func randomImageOf(t testing.TB, size int64, n int64) v1.Image {
	t.Helper()
	img, err := random.Image(size, n)
	if err != nil {
		t.Fatal(err)
	}
	return withPlatform(t, img, registry.DefaultPlatform)
}

func withPlatform(t testing.TB, img v1.Image, platform v1.Platform) v1.Image {
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = platform.OS, platform.Architecture, platform.Variant
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func digest(t *testing.T, img v1.Image) v1.Hash {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// loopbackOnly admits loopback, as a deployment exempting 127.0.0.0/8.
func loopbackOnly(a netip.Addr) error {
	if a.IsLoopback() {
		return nil
	}
	return errors.New("not loopback")
}

func TestPullWithCredentials(t *testing.T) {
	host := registrytest.Start(t, true)
	img := randomImage(t, registry.DefaultPlatform)
	push(t, host+"/app:1", img)
	p := &registry.Puller{Check: loopbackOnly, Insecure: []string{host}}
	ctx := context.Background()

	got, err := p.Pull(ctx, host+"/app:1", registry.DefaultPlatform, registry.Credentials{Username: user, Password: password})
	if err != nil {
		t.Fatal(err)
	}
	if digest(t, got) != digest(t, img) {
		t.Errorf("pulled %s, pushed %s", digest(t, got), digest(t, img))
	}
	// Every layer reads in full.
	layers, err := got.Layers()
	if err != nil || len(layers) != 2 {
		t.Fatalf("layers %v, %v", layers, err)
	}
	byDigest := host + "/app@" + digest(t, img).String()
	if _, err := p.Pull(ctx, byDigest, registry.DefaultPlatform, registry.Credentials{Username: user, Password: password}); err != nil {
		t.Errorf("pull by digest: %v", err)
	}

	for _, c := range []struct {
		what  string
		ref   string
		creds registry.Credentials
		want  error
	}{
		{"wrong password", host + "/app:1", registry.Credentials{Username: user, Password: "wrong"}, registry.ErrDenied},
		{"no credentials", host + "/app:1", registry.Credentials{}, registry.ErrDenied},
		{"missing tag", host + "/app:2", registry.Credentials{Username: user, Password: password}, registry.ErrNotFound},
		{"missing repository", host + "/nothing:1", registry.Credentials{Username: user, Password: password}, registry.ErrNotFound},
		{"bad reference", host + "/App:1", registry.Credentials{}, registry.ErrBadReference},
	} {
		_, err := p.Pull(ctx, c.ref, registry.DefaultPlatform, c.creds)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.what, err, c.want)
		}
	}
}

func TestPullAnonymous(t *testing.T) {
	host := registrytest.Start(t, false)
	img := randomImage(t, registry.DefaultPlatform)
	push(t, host+"/app:1", img)
	p := &registry.Puller{Check: loopbackOnly, Insecure: []string{host}}
	got, err := p.Pull(context.Background(), host+"/app:1", registry.DefaultPlatform, registry.Credentials{})
	if err != nil || digest(t, got) != digest(t, img) {
		t.Fatalf("pulled %v, %v", got, err)
	}
}

// A registry is reached only where the deployment's range check admits
// and, over plain HTTP, only when listed as insecure.
func TestPullRefused(t *testing.T) {
	host := registrytest.Start(t, false)
	push(t, host+"/app:1", randomImage(t, registry.DefaultPlatform))
	ctx := context.Background()
	checker := &netcheck.Checker{}
	for _, c := range []struct {
		what string
		p    *registry.Puller
		want string
	}{
		{"special-purpose range", &registry.Puller{Check: checker.CheckAddr, Insecure: []string{host}}, "special-purpose range"},
		// Refused over HTTPS, the registry is not then blamed for plain HTTP.
		{"special-purpose range, not insecure", &registry.Puller{Check: checker.CheckAddr}, "special-purpose range"},
		{"plain HTTP not listed", &registry.Puller{Check: loopbackOnly}, "--insecure-registry " + host},
	} {
		_, err := c.p.Pull(ctx, host+"/app:1", registry.DefaultPlatform, registry.Credentials{})
		if !errors.Is(err, registry.ErrRefused) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrRefused saying %q", c.what, err, c.want)
		}
	}
	exempt := &netcheck.Checker{Exempt: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
	if _, err := (&registry.Puller{Check: exempt.CheckAddr, Insecure: []string{host}}).Pull(ctx, host+"/app:1",
		registry.DefaultPlatform, registry.Credentials{}); err != nil {
		t.Errorf("exempt loopback: %v", err)
	}
}

// An image index resolves to the image of the platform asked for, of its
// variant before another (linux/amd64/v3, listed first, also satisfies
// linux/amd64 but needs more of the CPU).
func TestPullIndexByPlatform(t *testing.T) {
	host := registrytest.Start(t, false)
	arm := v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}
	amdV3 := v1.Platform{OS: "linux", Architecture: "amd64", Variant: "v3"}
	amdImg, armImg, v3Img := randomImage(t, registry.DefaultPlatform), randomImage(t, arm), randomImage(t, amdV3)
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: v3Img, Descriptor: v1.Descriptor{Platform: &amdV3}},
		mutate.IndexAddendum{Add: amdImg, Descriptor: v1.Descriptor{Platform: &registry.DefaultPlatform}},
		mutate.IndexAddendum{Add: armImg, Descriptor: v1.Descriptor{Platform: &arm}})
	ref, err := name.ParseReference(host+"/multi:1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx); err != nil {
		t.Fatal(err)
	}
	p := &registry.Puller{Check: loopbackOnly, Insecure: []string{host}}
	ctx := context.Background()
	for _, c := range []struct {
		platform string
		want     v1.Image
	}{{"", amdImg}, {"linux/amd64", amdImg}, {"linux/amd64/v3", v3Img}, {"linux/arm64/v8", armImg}} {
		pl, err := registry.ParsePlatform(c.platform)
		if err != nil {
			t.Fatal(err)
		}
		got, err := p.Pull(ctx, host+"/multi:1", pl, registry.Credentials{})
		if err != nil || digest(t, got) != digest(t, c.want) {
			t.Errorf("platform %q: %v, %v", c.platform, got, err)
		}
	}
	_, err = p.Pull(ctx, host+"/multi:1", v1.Platform{OS: "linux", Architecture: "s390x"}, registry.Credentials{})
	if !errors.Is(err, registry.ErrNotFound) || !strings.Contains(err.Error(), "linux/arm64/v8") {
		t.Errorf("absent platform: %v", err)
	}
	for _, bad := range []string{"linux", "linux/amd64/v1/x", "/amd64"} {
		if _, err := registry.ParsePlatform(bad); !errors.Is(err, registry.ErrBadReference) {
			t.Errorf("ParsePlatform(%q) = %v", bad, err)
		}
	}
}

// A registry whose certificate a private authority signed is reached with
// that authority in RootCAs, and refused without it.
func TestPullPrivateCA(t *testing.T) {
	host, caPEM, client := registrytest.StartTLS(t)
	cas := x509.NewCertPool()
	if !cas.AppendCertsFromPEM([]byte(caPEM)) {
		t.Fatal("no CA")
	}
	img := randomImage(t, registry.DefaultPlatform)
	ref, err := name.ParseReference(host + "/app:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img, remote.WithTransport(client.Transport)); err != nil {
		t.Fatal(err)
	}

	p := &registry.Puller{Check: loopbackOnly, RootCAs: cas}
	got, err := p.Pull(context.Background(), host+"/app:1", registry.DefaultPlatform, registry.Credentials{})
	if err != nil || digest(t, got) != digest(t, img) {
		t.Fatalf("pull with the CA: %v, %v", got, err)
	}
	_, err = (&registry.Puller{Check: loopbackOnly}).Pull(context.Background(), host+"/app:1", registry.DefaultPlatform, registry.Credentials{})
	if !errors.Is(err, registry.ErrRefused) || !strings.Contains(err.Error(), "certificate signed by unknown authority") || !strings.Contains(err.Error(), "--registry-ca-file") {
		t.Errorf("pull without the CA: %v, want a certificate error", err)
	}
}

// TestBlobErrors: a blob the registry lacks, or one whose size is not the
// manifest's, fails the read of the pulled image; BlobError tells which.
func TestBlobErrors(t *testing.T) {
	host := registrytest.Start(t, false)
	img := randomImage(t, registry.DefaultPlatform)
	push(t, host+"/app:1", img)
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	gone, err := layers[1].Digest()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	// "lie" names the first layer with a size it does not have.
	lie := raw.DeepCopy()
	lie.Layers[0].Size = 5
	registrytest.PutManifest(t, host, "app", "lie", lie)
	// The registry loses the second layer.
	registrytest.DeleteBlob(t, host, "app", gone)

	p := &registry.Puller{Check: loopbackOnly, Insecure: []string{host}}
	for _, c := range []struct {
		ref  string
		want error
	}{
		{host + "/app:1", registry.ErrNotFound},
		{host + "/app:lie", registry.ErrBadBlob},
	} {
		got, err := p.Pull(context.Background(), c.ref, registry.DefaultPlatform, registry.Credentials{})
		if err != nil {
			t.Fatalf("pull %s: %v", c.ref, err)
		}
		err = readLayers(got)
		if err == nil {
			t.Fatalf("%s: every layer read", c.ref)
		}
		if berr := registry.BlobError(c.ref, err); !errors.Is(berr, c.want) || !registry.Classified(berr) {
			t.Errorf("%s: BlobError(%v) = %v, want %v", c.ref, err, berr, c.want)
		}
	}
	if registry.Classified(registry.BlobError(host+"/app:1", errors.New("connection reset by peer"))) {
		t.Error("a broken connection is classified as the image's fault")
	}
}

// readLayers reads every layer of img to its end.
func readLayers(img v1.Image) error {
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, rc)
		rc.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// A registry that accepts a pull and then says nothing fails it once a
// read has waited Puller.Idle, rather than holding it for good.
func TestPullOfAStallingRegistry(t *testing.T) {
	stall := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v2/" {
			return
		}
		select {
		case <-stall:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(stall) // before the Close, which waits for the handler
	host := strings.TrimPrefix(srv.URL, "http://")
	p := &registry.Puller{Check: loopbackOnly, Insecure: []string{host}, Idle: 200 * time.Millisecond}
	done := make(chan error, 1)
	go func() {
		_, err := p.Pull(context.Background(), host+"/stall:1", registry.DefaultPlatform, registry.Credentials{})
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a pull from a registry that never answered succeeded")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a pull from a registry that never answers did not end")
	}
}
