package apiclient

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestWatchResumes: a watch the API server ends is opened again
// from the last resourceVersion seen (bookmarks included), so that the
// events in between are neither lost nor sent twice; after a 410 Gone
// (as an ERROR event or as the answer) it is opened from now, without
// one.
func TestWatchResumes(t *testing.T) {
	var mu sync.Mutex
	var asked []string // each watch's resourceVersion
	ev := func(typ, rv string) string {
		return fmt.Sprintf(`{"type":%q,"object":{"kind":"Pod","metadata":{"name":"p%s","resourceVersion":%q}}}`+"\n", typ, rv, rv)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		asked = append(asked, r.URL.Query().Get("resourceVersion"))
		n := len(asked)
		mu.Unlock()
		switch n {
		case 1: // from now: two objects, then the server ends the watch
			fmt.Fprint(w, ev("ADDED", "5"), ev("ADDED", "6"))
		case 2: // resumed: one change and a bookmark, then ends again
			fmt.Fprint(w, ev("MODIFIED", "7"), `{"type":"BOOKMARK","object":{"kind":"Pod","metadata":{"resourceVersion":"9"}}}`+"\n")
		case 3: // too old now
			fmt.Fprint(w, `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Expired","code":410}}`+"\n")
		case 4: // from now again: every object
			fmt.Fprint(w, ev("ADDED", "12"))
		case 5:
			w.WriteHeader(http.StatusGone)
			fmt.Fprint(w, `{"kind":"Status","code":410}`)
		default:
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}
	}))
	defer srv.Close()
	api := &Client{base: srv.URL, http: srv.Client()}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var got []string
	seen := make(chan struct{}, 16)
	handle := func(e Event) {
		var o struct{ Metadata ObjectMeta }
		_ = json.Unmarshal(e.Object, &o)
		mu.Lock()
		got = append(got, e.Type+" "+o.Metadata.Name)
		mu.Unlock()
		seen <- struct{}{}
	}
	w, err := api.Watch(ctx, "/api/v1/pods", url.Values{}, handle, func(string, ...any) {})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.After(10 * time.Second)
	for {
		mu.Lock()
		done := len(asked) >= 6
		mu.Unlock()
		if done {
			break
		}
		select {
		case <-seen:
		case <-deadline:
			mu.Lock()
			t.Fatalf("watches asked %q, events %q: not 6 watches within 10s", asked, got)
		case <-time.After(10 * time.Millisecond):
		}
	}
	cancel()
	w.Wait()
	mu.Lock()
	defer mu.Unlock()
	wantAsked := []string{"", "6", "9", "", "12", ""}
	if strings.Join(asked[:6], ",") != strings.Join(wantAsked, ",") {
		t.Errorf("the watches asked from resourceVersions %q, want %q", asked[:6], wantAsked)
	}
	wantGot := []string{"ADDED p5", "ADDED p6", "MODIFIED p7", "ADDED p12"}
	if strings.Join(got, ",") != strings.Join(wantGot, ",") {
		t.Errorf("events %q, want %q (no bookmark, no error)", got, wantGot)
	}
}
