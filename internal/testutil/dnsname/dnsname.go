// Package dnsname makes DNS names for tests of the limits on names.
package dnsname

import "strings"

// Long returns a valid lowercase DNS name of n characters: labels of 63
// a's (the last one shorter) joined by dots.
func Long(n int) string {
	var b strings.Builder
	for b.Len() < n {
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(strings.Repeat("a", min(63, n-b.Len())))
	}
	return b.String()
}
