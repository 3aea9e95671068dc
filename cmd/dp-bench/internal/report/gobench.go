package report

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/stats"
)

// GoBench is one Go benchmark over its -count runs.
type GoBench struct {
	Package  string  `json:"package"`
	Name     string  `json:"name"`
	N        int     `json:"n"`
	NsPerOp  float64 `json:"nsPerOpMedian"`
	BPerOp   float64 `json:"bytesPerOpMedian"`
	AllocsOp float64 `json:"allocsPerOpMedian"`
}

var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+([\d.]+) ns/op(?:\s+([\d.]+) B/op\s+([\d.]+) allocs/op)?`)

// ParseGoBench reads `go test -bench` output and takes the Median of
// every benchmark's runs.
func ParseGoBench(path string) ([]GoBench, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readGoBench(f)
}

func readGoBench(r io.Reader) ([]GoBench, error) {
	type acc struct {
		pkg, name    string
		ns, b, alloc []float64
	}
	var order []string
	all := map[string]*acc{}
	pkg := ""
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if p, ok := strings.CutPrefix(line, "pkg: "); ok {
			pkg = strings.TrimSpace(p)
			continue
		}
		m := benchLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		key := pkg + " " + m[1]
		a := all[key]
		if a == nil {
			a = &acc{pkg: pkg, name: m[1]}
			all[key] = a
			order = append(order, key)
		}
		for i, dst := range []*[]float64{&a.ns, &a.b, &a.alloc} {
			if m[i+2] == "" {
				continue
			}
			v, err := strconv.ParseFloat(m[i+2], 64)
			if err != nil {
				return nil, fmt.Errorf("%q: %w", line, err)
			}
			*dst = append(*dst, v)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	var out []GoBench
	for _, k := range order {
		a := all[k]
		g := GoBench{Package: a.pkg, Name: a.name, N: len(a.ns), NsPerOp: stats.Median(a.ns)}
		if len(a.b) > 0 {
			g.BPerOp, g.AllocsOp = stats.Median(a.b), stats.Median(a.alloc)
		}
		out = append(out, g)
	}
	return out, nil
}

func writeGoBench(w io.Writer, bs []GoBench) {
	if len(bs) == 0 {
		return
	}
	fmt.Fprintf(w, "\n### Go benchmarks\n\nMedian of the runs (`-count`), in-process; no gRPC but in UeventToListAndWatch (a kernel event through the uevent seam to the kubelet stand-in's ListAndWatch update).\n\n| benchmark | package | time/op | B/op | allocs/op | runs |\n| --- | --- | --- | --- | --- | --- |\n")
	for _, b := range bs {
		pkg := b.Package
		if i := strings.LastIndexByte(pkg, '/'); i >= 0 {
			pkg = pkg[i+1:]
		}
		fmt.Fprintf(w, "| %s | %s | %s | %.0f | %.0f | %d |\n", strings.TrimPrefix(b.Name, "Benchmark"), pkg,
			time.Duration(b.NsPerOp).Round(dur(b.NsPerOp)), b.BPerOp, b.AllocsOp, b.N)
	}
}

// dur rounds a time to about three significant digits.
func dur(ns float64) time.Duration {
	r := time.Duration(1)
	for ns >= 1000 {
		ns /= 10
		r *= 10
	}
	return r
}
