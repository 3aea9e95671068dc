package device

import (
	"strings"
	"testing"
)

// unescapeHostSuffix inverts HostSuffix: it exists, so HostSuffix is
// injective.
func unescapeHostSuffix(s string) (string, bool) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '_':
			b.WriteByte('/')
		case ':':
			if i+1 == len(s) || (s[i+1] != '_' && s[i+1] != ':') {
				return "", false
			}
			i++
			b.WriteByte(s[i])
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String(), true
}

// FuzzHostSuffix: the ID part of a host device path has no '/', decodes
// back to the path (two paths never share an ID), and a replica suffix
// ("::<r>") cannot be confused with a path's escapes.
func FuzzHostSuffix(f *testing.F) {
	for _, s := range []string{"net/tun", "net_tun", "a_/b", "a/_b", "c:d", "c_d", "a:", "a::0", "ttyS0", "dri/renderD128"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, rel string) {
		s := HostSuffix(rel)
		if strings.Contains(s, "/") {
			t.Fatalf("HostSuffix(%q) = %q has a '/'", rel, s)
		}
		if back, ok := unescapeHostSuffix(s); !ok || back != rel {
			t.Fatalf("HostSuffix(%q) = %q decodes to %q (%v)", rel, s, back, ok)
		}
		// A replica ID splits at its last "::" into the device and r.
		id := ReplicaID(ID("x", "", s), 3, 4)
		if i := strings.LastIndex(id, "::"); id[:i] != ID("x", "", s) || id[i+2:] != "3" {
			t.Fatalf("replica ID %q of %q is ambiguous", id, rel)
		}
	})
}
