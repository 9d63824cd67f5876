// Package promtest scrapes a deployment's GET /metrics in tests, parses
// the answer with the Prometheus text parser, and reads series from it.
package promtest

import (
	"net/http"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/internal/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families are the metric families of one scrape, by name.
type Families map[string]*dto.MetricFamily

// Get sends GET baseURL/metrics, with the bearer token unless it is empty,
// and returns the status code and the body.
func Get(t testing.TB, client *http.Client, baseURL, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, baseURL+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, b := testutil.Do(t, client, req)
	if resp.StatusCode == http.StatusOK && !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("GET /metrics answered %q, want the text format", resp.Header.Get("Content-Type"))
	}
	return resp.StatusCode, string(b)
}

// Scrape gets baseURL/metrics, which must answer 200, and parses it with
// the text parser, names restricted to the classic character set.
func Scrape(t testing.TB, client *http.Client, baseURL, token string) Families {
	t.Helper()
	status, body := Get(t, client, baseURL, token)
	if status != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", status, body)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parsing /metrics: %v\n%s", err, body)
	}
	return fams
}

// Value returns the sum over the series of family name whose labels
// include labels (a name and value each): a counter's or gauge's value, a
// histogram's count of observations. It reports false when no series
// matches.
func (f Families) Value(name string, labels ...string) (float64, bool) {
	fam := f[name]
	if fam == nil {
		return 0, false
	}
	var sum float64
	found := false
	for _, m := range fam.Metric {
		if !has(m, labels) {
			continue
		}
		found = true
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		case m.Untyped != nil:
			sum += m.Untyped.GetValue()
		}
	}
	return sum, found
}

// Must is Value that fails the test when no series matches.
func (f Families) Must(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	v, ok := f.Value(name, labels...)
	if !ok {
		t.Fatalf("no series %s%v in the scrape", name, labels)
	}
	return v
}

// has reports whether m carries every label of pairs (name, value, ...).
func has(m *dto.Metric, pairs []string) bool {
	for i := 0; i+1 < len(pairs); i += 2 {
		ok := false
		for _, l := range m.Label {
			if l.GetName() == pairs[i] && l.GetValue() == pairs[i+1] {
				ok = true
			}
		}
		if !ok {
			return false
		}
	}
	return true
}
