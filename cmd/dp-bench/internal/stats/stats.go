// Package stats reduces dp-bench's samples to the figures of its tables,
// in two ways only.
//
// Quantile is the nearest-rank quantile: the smallest sample that has at
// least the share q of the samples at or below it, so that every figure
// is a time that was measured. Every p50 and p99 of calls is one; a p50 of
// an even count of calls is the lower of the two middle ones.
//
// Median is the median of a figure over runs, rounds or nodes: the middle
// value, or the mean of the two middle values for an even count. Every
// "median over the runs" of the tables is one, and so are the medians of
// the Go benchmarks' runs, of the fleet's rounds and of its drivers'
// memory.
package stats

import (
	"math"
	"slices"
	"time"
)

// Quantile is the q-quantile of ds by nearest rank (0 for none); ds is
// left as it is.
func Quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// Median is the median of v: its middle value, or the mean of the two
// middle values for an even count (0 for none); v is left as it is.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
