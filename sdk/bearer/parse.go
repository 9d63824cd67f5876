package bearer

import "strings"

// Parse returns the token of an Authorization header value of the Bearer
// scheme, which it matches in any case (RFC 9110), with the white space
// around the token removed; ok is false for any other value.
func Parse(header string) (token string, ok bool) {
	scheme, rest, found := strings.Cut(header, " ")
	if !found || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(rest)
	return token, token != ""
}
