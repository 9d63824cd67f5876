package daemon

import (
	"fmt"
	"net/url"
	"strings"
)

// ParseOrigins reads comma-separated origins, scheme://host[:port] with
// scheme http or https and nothing after the port (a trailing slash is
// dropped); empty gives nil.
func ParseOrigins(s string) ([]string, error) {
	var out []string
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		u, err := url.Parse(strings.TrimSuffix(part, "/"))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
			u.Path != "" || u.RawQuery != "" || u.Fragment != "" {
			return nil, fmt.Errorf("%q is not an origin: want scheme://host[:port] with scheme http or https", part)
		}
		out = append(out, u.Scheme+"://"+u.Host)
	}
	return out, nil
}

// consoleOrigins returns the configured origins, or else the origin of the
// control plane's URL.
func consoleOrigins(configured []string, ctrlURL string) []string {
	if len(configured) > 0 {
		return configured
	}
	u, err := url.Parse(ctrlURL)
	if err != nil || u.Host == "" {
		return nil
	}
	return []string{u.Scheme + "://" + u.Host}
}
