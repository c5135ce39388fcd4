// Package metricstest scrapes a /metrics endpoint over HTTP and reads the
// figures back, for the tests that check what a real flow counted.
package metricstest

import (
	"bytes"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families is one scrape, by metric name.
type Families map[string]*dto.MetricFamily

// Parse reads a text exposition, such as a body fetched some other way.
func Parse(t testing.TB, body []byte) Families {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("metrics exposition: %v", err)
	}
	return fams
}

// Scrape GETs url and parses the text exposition; anything but 200 and a
// parsable body fails the test.
func Scrape(t testing.TB, url string) Families {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	return fams
}

// Labels is name=value pairs a series must have (others may be there too).
type Labels map[string]string

func matches(m *dto.Metric, want Labels) bool {
	n := 0
	for _, lp := range m.GetLabel() {
		if v, ok := want[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}

// Sum adds up the value of every series of name that has the labels: a
// counter's or gauge's value, a histogram's sample count. ok is false
// when the scrape has no such family or no such series.
func (f Families) Sum(name string, want Labels) (sum float64, ok bool) {
	fam := f[name]
	if fam == nil {
		return 0, false
	}
	for _, m := range fam.GetMetric() {
		if !matches(m, want) {
			continue
		}
		ok = true
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Histogram != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		case m.Untyped != nil:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum, ok
}

// HistogramSum adds up the sum of the observations of every series of a
// histogram that has the labels.
func (f Families) HistogramSum(name string, want Labels) (float64, bool) {
	fam := f[name]
	if fam == nil {
		return 0, false
	}
	var sum float64
	ok := false
	for _, m := range fam.GetMetric() {
		if m.Histogram != nil && matches(m, want) {
			sum += m.GetHistogram().GetSampleSum()
			ok = true
		}
	}
	return sum, ok
}

// Get is Sum, failing the test when the series is missing.
func (f Families) Get(t testing.TB, name string, want Labels) float64 {
	t.Helper()
	v, ok := f.Sum(name, want)
	if !ok {
		t.Fatalf("no series %s%v in the scrape; it has %s", name, want, f.Names(name))
		return 0
	}
	return v
}

// Names lists the series of the families that share like's first two
// name components (bcd_site_, better_compute_), for a failure message.
func (f Families) Names(like string) string {
	parts := strings.SplitAfterN(like, "_", 3)
	prefix := strings.Join(parts[:min(2, len(parts))], "")
	var out []string
	for name, fam := range f {
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		for _, m := range fam.GetMetric() {
			var ls []string
			for _, lp := range m.GetLabel() {
				ls = append(ls, lp.GetName()+"="+lp.GetValue())
			}
			out = append(out, fmt.Sprintf("%s{%s}", name, strings.Join(ls, ",")))
		}
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}
