package apiclient

import (
	"regexp"
	"testing"
)

// TestNewUID: a version 4, variant 1 UUID in the API server's text form,
// a new one each time.
func TestNewUID(t *testing.T) {
	form := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for range 100 {
		u, err := NewUID()
		if err != nil {
			t.Fatal(err)
		}
		if !form.MatchString(u) || seen[u] {
			t.Fatalf("NewUID() = %q: not a fresh version 4 UUID", u)
		}
		seen[u] = true
	}
}
