package daemon_test

import (
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/spf13/cobra"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/cli"
	"github.com/kibotos/kibotos/internal/daemon"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/registrytest"
)

const registryUser, registryPassword = registrytest.User, registrytest.Password

// kibotos runs the CLI against d with stdin and returns its stdout.
func (d *deployment) kibotos(stdin string, args ...string) (string, error) {
	token, err := os.ReadFile(filepath.Join(d.home, daemon.AdminTokenFile))
	if err != nil {
		return "", err
	}
	root := &cobra.Command{Use: "kibotos", SilenceUsage: true, SilenceErrors: true}
	root.AddCommand(cli.Commands()...)
	var stdout, stderr bytes.Buffer
	root.SetIn(strings.NewReader(stdin))
	root.SetOut(&stdout)
	root.SetErr(&stderr)
	// The connection flags go before a "--" that ends the flags.
	i := slices.Index(args, "--")
	if i < 0 {
		i = len(args)
	}
	conn := []string{"--addr", d.url, "--token", strings.TrimSpace(string(token))}
	root.SetArgs(slices.Concat(args[:i], conn, args[i:]))
	err = root.Execute()
	return stdout.String(), err
}

// An image pushed to a registry with auth is imported by reference through
// the CLI and runs; refused credentials and a missing tag fail with their
// codes and store nothing.
func TestRegistryImportRuns(t *testing.T) {
	host := registrytest.Start(t, true)
	content := "pulled from a registry\n"
	img := testutil.HelloImage(t, content)
	ref, err := name.ParseReference(host+"/app:1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img, remote.WithAuth(&authn.Basic{Username: registryUser, Password: registryPassword})); err != nil {
		t.Fatal(err)
	}
	layers, _ := img.Layers()
	added, _ := layers[len(layers)-1].Digest()
	manifest, _ := img.Digest()
	// Two manifests the registry serves but cannot back: one names a
	// layer it lacks, one the last layer with a size it does not have.
	raw, _ := img.Manifest()
	missing, lie := raw.DeepCopy(), raw.DeepCopy()
	missing.Layers[len(layers)-1].Digest = v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("1", 64)}
	lie.Layers[len(layers)-1].Size = 5
	for tag, m := range map[string]*v1.Manifest{"missing": missing, "lie": lie} {
		registrytest.PutManifest(t, host, "app", tag, m)
	}

	t.Setenv("DOCKER_CONFIG", t.TempDir()) // no docker credentials
	d := upWith(t, t.TempDir(), daemon.Options{
		UnsafeExemptRanges: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		InsecureRegistries: []string{host},
	})
	defer d.stop()
	if _, err := d.kibotos("", "template", "create", "app"); err != nil {
		t.Fatal(err)
	}
	blobs := filepath.Join(d.home, "templates", "blobs", "sha256")
	for _, c := range []struct {
		what, stdin string
		args        []string
		want        string
	}{
		{"wrong password", "wrong\n", []string{host + "/app:1", "--username", registryUser, "--password-stdin"}, "permission_denied"},
		{"no credentials", "", []string{host + "/app:1"}, "permission_denied"},
		{"missing tag", registryPassword + "\n", []string{host + "/app:2", "--username", registryUser, "--password-stdin"}, "not_found"},
		{"missing layer", registryPassword + "\n", []string{host + "/app:missing", "--username", registryUser, "--password-stdin"}, "not_found"},
		{"layer of another size", registryPassword + "\n", []string{host + "/app:lie", "--username", registryUser, "--password-stdin"}, "invalid_argument"},
	} {
		_, err := d.kibotos(c.stdin, append([]string{"template", "import", "app"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %s", c.what, err, c.want)
		}
		t.Logf("%s: %v", c.what, err)
		out, err := d.kibotos("", "template", "get", "app", "-o", "json")
		if err != nil || strings.Contains(out, "revisions") {
			t.Errorf("%s: the template has revisions: %s (%v)", c.what, out, err)
		}
		for _, dg := range []v1.Hash{added, manifest} {
			if _, err := os.Stat(filepath.Join(blobs, dg.Hex)); !os.IsNotExist(err) {
				t.Errorf("%s: blob %s is stored (%v)", c.what, dg, err)
			}
		}
	}

	out, err := d.kibotos(registryPassword+"\n", "template", "import", "app", host+"/app:1",
		"--username", registryUser, "--password-stdin", "-o", "json")
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	if !strings.Contains(out, manifest.String()) || !strings.Contains(out, `"registry:`+host+`/app:1"`) {
		t.Errorf("import printed %s, want image %s from the registry", out, manifest)
	}
	if _, err := os.Stat(filepath.Join(blobs, added.Hex)); err != nil {
		t.Errorf("the pulled layer is not stored: %v", err)
	}

	spec := small()
	spec.Template = &ctrlv1.TemplateSelector{TemplateId: "app"}
	ws := d.await(d.create(spec).WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	got, err := d.kibotos("", "ws", "exec", ws.WorkspaceId, "--", "cat", "/hello.txt")
	if err != nil || got != content {
		t.Errorf("exec in the pulled image: %q, %v", got, err)
	}
}

// A registry whose certificate a private authority signed is pulled from
// over HTTPS by a deployment given that authority with RegistryCAFile
// (kibotos up --registry-ca-file); one without it says what failed.
func TestRegistryImportPrivateCA(t *testing.T) {
	host, caPEM, client := registrytest.StartTLS(t)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, []byte(caPEM), 0o600); err != nil {
		t.Fatal(err)
	}
	img := testutil.HelloImage(t, "over a private CA\n")
	ref, err := name.ParseReference(host + "/app:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img, remote.WithTransport(client.Transport)); err != nil {
		t.Fatal(err)
	}
	manifest, _ := img.Digest()

	t.Setenv("DOCKER_CONFIG", t.TempDir())
	exempt := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	importApp := func(o daemon.Options) (string, error) {
		d := upWith(t, t.TempDir(), o)
		defer d.stop()
		if _, err := d.kibotos("", "template", "create", "app"); err != nil {
			t.Fatal(err)
		}
		return d.kibotos("", "template", "import", "app", host+"/app:1", "-o", "json")
	}
	out, err := importApp(daemon.Options{UnsafeExemptRanges: exempt, RegistryCAFile: caFile})
	if err != nil || !strings.Contains(out, manifest.String()) {
		t.Fatalf("import over the private CA: %v\n%s", err, out)
	}
	_, err = importApp(daemon.Options{UnsafeExemptRanges: exempt})
	if err == nil || !strings.Contains(err.Error(), "--registry-ca-file") {
		t.Errorf("import without the CA: %v, want a hint at --registry-ca-file", err)
	}
}

// A registry CA file that holds no certificate stops the start, before
// anything is opened.
func TestRegistryCAFileRefused(t *testing.T) {
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{notPEM: "holds no PEM certificate", "/nonexistent/ca.pem": "no such file"} {
		home := t.TempDir()
		err := daemon.Run(t.Context(), daemon.Options{Home: home, Listen: "127.0.0.1:0", RegistryCAFile: file})
		if err == nil || !strings.Contains(err.Error(), "registry CA file") || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want a refusal saying %q", file, err, want)
		}
		if entries, _ := os.ReadDir(home); len(entries) != 0 {
			t.Errorf("%s: the refused start wrote %v", file, entries)
		}
	}
}
