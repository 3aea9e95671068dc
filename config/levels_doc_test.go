package config

import (
	"os"
	"strings"
	"testing"
)

// docTableRows are the table rows of docs/configuration.md.
func docTableRows(t *testing.T) []string {
	t.Helper()
	doc, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	for _, l := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(l, "|") {
			rows = append(rows, l)
		}
	}
	return rows
}

// TestLogLevelsDocumented: the --log-level row of docs/configuration.md
// names every level the configuration accepts (fatal and panic too: at
// those nothing is logged while running, not even the error a binary
// exits with, which the row must say).
func TestLogLevelsDocumented(t *testing.T) {
	var row string
	for _, l := range docTableRows(t) {
		if strings.HasPrefix(l, "| `--log-level` |") {
			row = l
		}
	}
	if row == "" {
		t.Fatal("docs/configuration.md has no --log-level row")
	}
	for _, l := range levels {
		if !strings.Contains(row, "`"+string(l)+"`") {
			t.Errorf("the --log-level row of docs/configuration.md does not name %s: %s", l, row)
		}
	}
	if !strings.Contains(row, "exit") {
		t.Errorf("the --log-level row does not say that fatal and panic hide the error a binary exits with: %s", row)
	}
}
