package meta

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/internal/testutil/dnsname"
)

func TestValidateLabels(t *testing.T) {
	tests := []struct {
		name   string
		labels map[string]string
		want   string // empty: valid; else a substring of the error
	}{
		{"nil", nil, ""},
		{"empty", map[string]string{}, ""},
		{"simple", map[string]string{"app": "web", "tier": "front-end"}, ""},
		{"prefixed key", map[string]string{"example.com/x": "1"}, ""},
		{"subdomain prefix", map[string]string{"a.b-c.example.com/My_Name.v2": "v"}, ""},
		{"empty value", map[string]string{"app": ""}, ""},
		{"name 63 chars", map[string]string{strings.Repeat("k", 63): "v"}, ""},
		{"value 63 chars", map[string]string{"k": strings.Repeat("v", 63)}, ""},
		{"prefix 253 chars", map[string]string{dnsname.Long(253) + "/k": "v"}, ""},
		{"mixed case", map[string]string{"App.Name": "Web_1.A"}, ""},

		{"empty key", map[string]string{"": "v"}, `label "": name part must be non-empty`},
		{"space in key", map[string]string{"Bad Key": "v"}, `label "Bad Key": name part must consist of`},
		{"name 64 chars", map[string]string{strings.Repeat("k", 64): "v"}, "name part must be no more than 63 bytes"},
		{"prefix 254 chars", map[string]string{dnsname.Long(254) + "/k": "v"}, "prefix part must be no more than 253 bytes"},
		{"empty prefix", map[string]string{"/k": "v"}, `label "/k": prefix part must be non-empty`},
		{"empty name", map[string]string{"example.com/": "v"}, "name part must be non-empty"},
		{"uppercase prefix", map[string]string{"Example.com/k": "v"}, "prefix part a lowercase RFC 1123 subdomain"},
		{"two slashes", map[string]string{"a/b/c": "v"}, `label "a/b/c": a valid label key must consist of`},
		{"leading dash", map[string]string{"-k": "v"}, "name part must consist of"},
		{"trailing dot", map[string]string{"k.": "v"}, "name part must consist of"},
		{"non-ASCII key", map[string]string{"clé": "v"}, "name part must consist of"},
		{"value 64 chars", map[string]string{"k": strings.Repeat("v", 64)}, `label "k": invalid value: must be no more than 63 bytes`},
		{"value with space", map[string]string{"k": "a b"}, `label "k": invalid value: a valid label must be an empty string or consist of`},
		{"value leading dash", map[string]string{"k": "-v"}, "invalid value: a valid label"},
		{"value with slash", map[string]string{"k": "a/b"}, "invalid value: a valid label"},
		{"value with NUL", map[string]string{"k": "a\x00b"}, "invalid value: a valid label"},
		{"first key in order", map[string]string{"b b": "v", "a a": "v", "c": "v v"}, `label "a a":`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			check(t, ValidateLabels(tt.labels), tt.want)
		})
	}
}

func TestValidateSelector(t *testing.T) {
	check(t, ValidateSelector(nil), "")
	check(t, ValidateSelector(map[string]string{"example.com/team": "infra", "env": ""}), "")
	check(t, ValidateSelector(map[string]string{"Bad Key": "v"}), `label selector key "Bad Key": name part must consist of`)
	check(t, ValidateSelector(map[string]string{"k": "a b"}), `label selector key "k": invalid value: a valid label`)
}

func TestValidateAnnotations(t *testing.T) {
	tests := []struct {
		name        string
		annotations map[string]string
		want        string
	}{
		{"nil", nil, ""},
		{"empty value", map[string]string{"note": ""}, ""},
		{"free text", map[string]string{"example.com/description": "Any text: spaces, /slashes/, \"quotes\",\nnewlines and ünïcödé ✓"}, ""},
		{"long value", map[string]string{"k": strings.Repeat("v", 100000)}, ""},
		{"at size limit", map[string]string{"k": strings.Repeat("v", MaxAnnotationsSize-1)}, ""},
		{"two at size limit", map[string]string{"a": strings.Repeat("v", MaxAnnotationsSize/2-1), "b": strings.Repeat("v", MaxAnnotationsSize/2-1)}, ""},

		{"over size limit", map[string]string{"k": strings.Repeat("v", MaxAnnotationsSize)}, "annotations total 262145 bytes, more than the limit of 262144"},
		{"two over size limit", map[string]string{"a": strings.Repeat("v", MaxAnnotationsSize/2), "b": strings.Repeat("v", MaxAnnotationsSize/2-1)}, "annotations total 262145 bytes"},
		{"empty key", map[string]string{"": "v"}, `annotation "": name part must be non-empty`},
		{"bad key", map[string]string{"Bad Key": "v"}, `annotation "Bad Key": name part must consist of`},
		{"name 64 chars", map[string]string{strings.Repeat("k", 64): "v"}, "name part must be no more than 63 bytes"},
		{"NUL", map[string]string{"k": "a\x00b"}, `annotation "k": value contains U+0000`},
		{"invalid UTF-8", map[string]string{"k": "a\xffb"}, `annotation "k": value is not valid UTF-8`},
		{"surrogate half", map[string]string{"k": "\xed\xa0\x80"}, "value is not valid UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			check(t, ValidateAnnotations(tt.annotations), tt.want)
		})
	}
}

func TestMatches(t *testing.T) {
	labels := map[string]string{"app": "web", "env": "", "example.com/team": "infra"}
	tests := []struct {
		selector map[string]string
		want     bool
	}{
		{nil, true},
		{map[string]string{}, true},
		{map[string]string{"app": "web"}, true},
		{map[string]string{"app": "web", "example.com/team": "infra"}, true},
		{map[string]string{"env": ""}, true},
		{map[string]string{"app": "Web"}, false},
		{map[string]string{"app": ""}, false},
		{map[string]string{"missing": ""}, false},
		{map[string]string{"app": "web", "tier": "front"}, false},
	}
	for _, tt := range tests {
		if got := Matches(labels, tt.selector); got != tt.want {
			t.Errorf("Matches(%v) = %v, want %v", tt.selector, got, tt.want)
		}
	}
	if Matches(nil, map[string]string{"app": "web"}) {
		t.Error("nil labels match a non-empty selector")
	}
	if !Matches(nil, nil) {
		t.Error("nil labels do not match the empty selector")
	}
}

func TestEqual(t *testing.T) {
	tests := []struct {
		a, b map[string]string
		want bool
	}{
		{nil, nil, true},
		{nil, map[string]string{}, true},
		{map[string]string{}, nil, true},
		{map[string]string{"a": "1"}, map[string]string{"a": "1"}, true},
		{map[string]string{"a": ""}, nil, false},
		{map[string]string{"a": "1"}, map[string]string{"a": "2"}, false},
		{map[string]string{"a": "1"}, map[string]string{"b": "1"}, false},
		{map[string]string{"a": "1"}, map[string]string{"a": "1", "b": "2"}, false},
	}
	for _, tt := range tests {
		if got := Equal(tt.a, tt.b); got != tt.want {
			t.Errorf("Equal(%v, %v) = %v, want %v", tt.a, tt.b, got, tt.want)
		}
	}
}

func check(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Errorf("unexpected error: %v", err)
	case want != "" && err == nil:
		t.Errorf("got no error, want %q", want)
	case want != "" && !strings.Contains(err.Error(), want):
		t.Errorf("got %v, want it to contain %q", err, want)
	}
}

func TestLabelCount(t *testing.T) {
	m := map[string]string{}
	for i := range MaxLabels {
		m[fmt.Sprintf("k%d", i)] = "v"
	}
	if err := ValidateLabels(m); err != nil {
		t.Errorf("%d labels: %v", MaxLabels, err)
	}
	if err := ValidateSelector(m); err != nil {
		t.Errorf("selector of %d: %v", MaxLabels, err)
	}
	m["one-more"] = "v"
	if err := ValidateLabels(m); err == nil || !strings.Contains(err.Error(), "more than the limit of 64") {
		t.Errorf("%d labels: %v", len(m), err)
	}
	if err := ValidateSelector(m); err == nil {
		t.Errorf("selector of %d: accepted", len(m))
	}
}
