// Package meta validates and compares the caller-owned labels and
// annotations of resources. Keys of both follow the Kubernetes
// qualified-name rules; label values follow the Kubernetes label-value
// rules; annotation values are any UTF-8 string without U+0000. A resource
// carries at most MaxLabels labels and MaxAnnotationsSize bytes of
// annotations.
package meta

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/validate/content"
)

// MaxLabels bounds the labels of one resource, and the entries of a label
// selector. Kubernetes sets no count; the bound keeps a resource and the
// index its labels feed small.
const MaxLabels = 64

// MaxAnnotationsSize is the limit on the sum of the byte lengths of all
// annotation keys and values, as Kubernetes' TotalAnnotationSizeLimitB.
const MaxAnnotationsSize = 256 << 10

// ValidateLabels checks every key and value of m, in key order, and
// reports the first offending key.
func ValidateLabels(m map[string]string) error {
	return validateLabels("label", m)
}

// ValidateSelector checks a label selector under the label rules. The
// empty selector is valid.
func ValidateSelector(m map[string]string) error {
	return validateLabels("label selector key", m)
}

func validateLabels(what string, m map[string]string) error {
	if len(m) > MaxLabels {
		return fmt.Errorf("%d %ss, more than the limit of %d", len(m), what, MaxLabels)
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if errs := content.IsLabelKey(k); len(errs) > 0 {
			return fmt.Errorf("%s %q: %s", what, k, strings.Join(errs, "; "))
		}
		if errs := content.IsLabelValue(m[k]); len(errs) > 0 {
			return fmt.Errorf("%s %q: invalid value: %s", what, k, strings.Join(errs, "; "))
		}
	}
	return nil
}

// Bytes is the size of m as the annotation limit counts it: the lengths
// of its keys and values.
func Bytes(m map[string]string) int {
	size := 0
	for k, v := range m {
		size += len(k) + len(v)
	}
	return size
}

// ValidateAnnotations checks the total size of m against
// MaxAnnotationsSize, then every key and value in key order.
func ValidateAnnotations(m map[string]string) error {
	if size := Bytes(m); size > MaxAnnotationsSize {
		return fmt.Errorf("annotations total %d bytes, more than the limit of %d", size, MaxAnnotationsSize)
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if errs := content.IsLabelKey(k); len(errs) > 0 {
			return fmt.Errorf("annotation %q: %s", k, strings.Join(errs, "; "))
		}
		v := m[k]
		if !utf8.ValidString(v) {
			return fmt.Errorf("annotation %q: value is not valid UTF-8", k)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return fmt.Errorf("annotation %q: value contains U+0000", k)
		}
	}
	return nil
}

// Matches reports whether labels carry every entry of selector with exactly
// that value. The empty selector matches everything.
func Matches(labels, selector map[string]string) bool {
	for k, want := range selector {
		if got, ok := labels[k]; !ok || got != want {
			return false
		}
	}
	return true
}

// Equal reports whether a and b hold the same entries; nil and empty are
// equal.
func Equal(a, b map[string]string) bool {
	return maps.Equal(a, b)
}
