// Package ids mints resource identifiers: a short kind prefix and a
// time-ordered random part, so that new resources sort after old ones and
// keyset pagination meets rows inserted during a walk at its end.
package ids

import (
	"encoding/base32"

	"github.com/google/uuid"
)

// encoding is Crockford's base32 alphabet in lower case. Its characters are
// in ascending ASCII order, so the text sorts like the UUIDv7 bytes.
var encoding = base32.NewEncoding("0123456789abcdefghjkmnpqrstvwxyz").WithPadding(base32.NoPadding)

// New returns prefix + "_" + 26 characters of a UUIDv7.
func New(prefix string) string {
	u := uuid.Must(uuid.NewV7())
	return prefix + "_" + encoding.EncodeToString(u[:])
}
