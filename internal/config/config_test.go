package config_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/kibotos/kibotos/internal/config"
)

func flags() (*pflag.FlagSet, *string, *string, *[]string, *time.Duration) {
	fs := pflag.NewFlagSet("up", pflag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8870", "")
	format := fs.String("log-format", "text", "")
	insecure := fs.StringArray("insecure-registry", nil, "")
	ttl := fs.Duration("transfer-ttl", time.Hour, "")
	fs.String("config", "", "")
	return fs, listen, format, insecure, ttl
}

func write(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// The file sets every flag it names; the command line overrides it.
func TestApply(t *testing.T) {
	fs, listen, format, insecure, ttl := flags()
	if err := fs.Parse([]string{"--log-format", "text"}); err != nil {
		t.Fatal(err)
	}
	path := write(t, "listen: 0.0.0.0:9000\nlog-format: json\ninsecure-registry: [127.0.0.1:5000, registry.lan]\ntransfer-ttl: 2h\n")
	if err := config.Apply(fs, path); err != nil {
		t.Fatal(err)
	}
	if *listen != "0.0.0.0:9000" || *format != "text" || strings.Join(*insecure, ",") != "127.0.0.1:5000,registry.lan" || *ttl != 2*time.Hour {
		t.Errorf("listen %s, log-format %s, insecure %v, ttl %s", *listen, *format, *insecure, *ttl)
	}
}

func TestApplyRefusals(t *testing.T) {
	for _, c := range []struct{ content, want string }{
		{"listn: x\n", `"listn" is not a setting`},
		{"config: other.yaml\n", `"config" is not a setting`},
		{"transfer-ttl: soon\n", "transfer-ttl"},
		{"listen: [a, b]\n", "listen: takes one value"},
		{"insecure-registry: {a: b}\n", "not a mapping"},
		{"- a\n", "cannot unmarshal"},
	} {
		fs, _, _, _, _ := flags()
		err := config.Apply(fs, write(t, c.content))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.content, err, c.want)
		}
	}
	fs, _, _, _, _ := flags()
	if err := config.Apply(fs, write(t, "")); err != nil {
		t.Errorf("empty file: %v", err)
	}
}
