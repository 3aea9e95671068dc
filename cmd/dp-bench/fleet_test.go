package main

import (
	"os"
	"strings"
	"testing"

	"github.com/cdi-device-plugin/cdi-device-plugin/cmd/dp-bench/internal/report"
)

func TestFleetFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-fleet", "-1"}, "-fleet=-1"},
		{[]string{"-fleet", "2", "-fleet-fill", "1.5"}, "-fleet-fill=1.5"},
		{[]string{"-fleet", "2", "-fleet-steady", "0s"}, "-fleet-steady=0s"},
		{[]string{"-fleet", "2", "-fleet-storm-rate", "0"}, "-fleet-storm-rate=0"},
		{[]string{"-fleet", "2", "-fleet-rounds", "0"}, "-fleet-rounds=0"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, err := parseFlags(append(tc.args, "-targets", "fleet.yaml"), &strings.Builder{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one naming %s", err, tc.want)
			}
		})
	}
}

func TestReplaceBetween(t *testing.T) {
	path := t.TempDir() + "/fleet.md"
	if err := report.WriteBetween(path, mdBeginFleet, mdEndFleet, "", []byte("one\n")); err != nil {
		t.Fatal(err)
	}
	if err := report.WriteBetween(path, mdBeginFleet, mdEndFleet, "", []byte("two\n")); err != nil {
		t.Fatal(err)
	}
	b, _ := readFileString(path)
	if strings.Contains(b, "one") || strings.Count(b, "two") != 1 || strings.Count(b, mdBeginFleet) != 1 {
		t.Errorf("file after two writes:\n%s", b)
	}
}

func readFileString(p string) (string, error) {
	b, err := os.ReadFile(p)
	return string(b), err
}
