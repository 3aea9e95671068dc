package apiclient

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Event is one event of a watch, and when dp-bench received it.
type Event struct {
	Type   string          `json:"type"`
	Object json.RawMessage `json:"object"`
	At     time.Time       `json:"-"`
}

// Watch event types.
const (
	Added    = "ADDED"
	Modified = "MODIFIED"
	Deleted  = "DELETED"
	Error    = "ERROR"
	Bookmark = "BOOKMARK"
)

// Watcher is a watch in progress.
type Watcher struct{ done chan struct{} }

// Wait returns once the watch has ended (its context is done) and its
// handler has returned for the last time.
func (w *Watcher) Wait() { <-w.done }

// Watch watches the collection at path with the query q until ctx is
// done, and hands every event to handle, in order, stamped when it was
// read. It returns once the first watch is open.
//
// A watch the API server ends (one that falls behind, or at its timeout)
// is opened again from the last resourceVersion seen, bookmarks included,
// so that no event is lost or handed twice; when the API server no longer
// has that version (410 Gone), from now, and the API server then sends
// every object as ADDED first. Each end goes to logf with its cause;
// ERROR and BOOKMARK events are not handed.
func (c *Client) Watch(ctx context.Context, path string, q url.Values, handle func(Event), logf func(string, ...any)) (*Watcher, error) {
	var rv string
	open := func() (*http.Response, error) {
		qq := url.Values{}
		maps.Copy(qq, q)
		if rv != "" {
			qq.Set("resourceVersion", rv)
			qq.Set("allowWatchBookmarks", "true")
		}
		return c.openWatch(ctx, path, qq)
	}
	resp, err := open()
	if err != nil {
		return nil, err
	}
	w := &Watcher{done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			err := decodeEvents(resp.Body, &rv, handle)
			resp.Body.Close()
			for ctx.Err() == nil {
				logf("the watch of %s ended (%v): watching again from resourceVersion %q", path, err, rv)
				if resp, err = open(); err == nil {
					break
				}
				if IsGone(err) {
					rv = ""
				}
				select {
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
			}
			if ctx.Err() != nil {
				return
			}
		}
	}()
	return w, nil
}

// decodeEvents hands the events of one watch's body to handle, keeping
// *rv at the last resourceVersion seen ("" after a 410 Gone), and returns
// why the watch ended.
func decodeEvents(body io.Reader, rv *string, handle func(Event)) error {
	dec := json.NewDecoder(body)
	for {
		var ev Event
		if err := dec.Decode(&ev); err != nil {
			return err
		}
		ev.At = time.Now()
		var obj struct {
			Code     int        `json:"code"` // of an ERROR's Status
			Metadata ObjectMeta `json:"metadata"`
		}
		_ = json.Unmarshal(ev.Object, &obj)
		if ev.Type == Error {
			if obj.Code == http.StatusGone {
				*rv = "" // too old: from now, with every object
			}
			return fmt.Errorf("watch error %s", ev.Object)
		}
		if obj.Metadata.ResourceVersion != "" {
			*rv = obj.Metadata.ResourceVersion
		}
		if ev.Type == Bookmark {
			continue
		}
		handle(ev)
	}
}

// openWatch starts a watch of the collection at path with the query q:
// the response whose body streams the events, or the API's error.
func (c *Client) openWatch(ctx context.Context, path string, q url.Values) (*http.Response, error) {
	q.Set("watch", "true")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path+"?"+q.Encode(), http.NoBody)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return nil, &StatusError{Code: resp.StatusCode, Message: strings.TrimSpace(string(b))}
	}
	return resp, nil
}
