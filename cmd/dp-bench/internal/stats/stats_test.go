package stats

import (
	"slices"
	"testing"
	"time"
)

// TestQuantile: the quantiles are nearest-rank, and the samples are left
// in their order.
func TestQuantile(t *testing.T) {
	ds := []time.Duration{5, 1, 4, 2, 3, 10, 9, 8, 7, 6}
	orig := slices.Clone(ds)
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 5}, {0.99, 10}, {0.1, 1}, {0, 1}, {1, 10}} {
		if got := Quantile(ds, c.q); got != c.want {
			t.Errorf("quantile %g: %d, want %d", c.q, got, c.want)
		}
	}
	if got := Quantile(nil, 0.5); got != 0 {
		t.Errorf("quantile of none: %v, want 0", got)
	}
	if !slices.Equal(ds, orig) {
		t.Errorf("the samples were reordered: %v", ds)
	}
}

// TestMedian: the middle value, or the mean of the two middle ones.
func TestMedian(t *testing.T) {
	for _, c := range []struct {
		v    []float64
		want float64
	}{{[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}, {[]float64{7}, 7}, {nil, 0}} {
		if got := Median(c.v); got != c.want {
			t.Errorf("median of %v: %g, want %g", c.v, got, c.want)
		}
	}
}
