package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// dp-bench talks to the API server over plain HTTP with the few objects it
// needs, in types of its own (apitypes.go), rather than through client-go:
// every baseline process is dp-bench itself (helper.go), and client-go's
// packages would double its start-up and triple its memory, the baselines
// of the device plugins' tables. The tests check these types against
// k8s.io/api's.

// apiClient calls the API server as one user (a client certificate).
type apiClient struct {
	base string
	http *http.Client
}

// newAPIClient is a client of the API server at base (https://host:port)
// that trusts caPEM and presents certPEM/keyPEM.
func newAPIClient(base string, caPEM, certPEM, keyPEM []byte) (*apiClient, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("API client: no CA certificate")
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("API client: %w", err)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 8, IdleConnTimeout: time.Minute}
	return &apiClient{base: strings.TrimSuffix(base, "/"), http: &http.Client{Transport: tr}}, nil
}

// apiError is an answer of the API server other than 2xx.
type apiError struct {
	Code    int
	Reason  string
	Message string
}

func (e *apiError) Error() string {
	return fmt.Sprintf("API server: %d %s: %s", e.Code, e.Reason, e.Message)
}

// isAlreadyExists reports whether err is the API server's 409 AlreadyExists.
func isAlreadyExists(err error) bool {
	var e *apiError
	return errors.As(err, &e) && e.Code == http.StatusConflict && e.Reason == "AlreadyExists"
}

// isNotFound reports whether err is the API server's 404.
func isNotFound(err error) bool {
	var e *apiError
	return errors.As(err, &e) && e.Code == http.StatusNotFound
}

// isGone reports whether err is the API server's 410 (a resourceVersion
// too old to watch from).
func isGone(err error) bool {
	var e *apiError
	return errors.As(err, &e) && e.Code == http.StatusGone
}

// do sends method path with in (JSON, when not nil) and decodes the answer
// into out (when not nil).
func (c *apiClient) do(ctx context.Context, method, path string, in, out any) error {
	return c.send(ctx, method, path, "application/json", in, out)
}

// send is do with in sent as contentType (a JSON encoding: a merge patch,
// ...).
func (c *apiClient) send(ctx context.Context, method, path, contentType string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		e := &apiError{Code: resp.StatusCode, Message: strings.TrimSpace(string(b))}
		var st apiStatus
		if json.Unmarshal(b, &st) == nil && st.Message != "" {
			e.Reason, e.Message = st.Reason, st.Message
		}
		return e
	}
	if out == nil {
		return nil
	}
	if s, ok := out.(*string); ok {
		*s = string(b)
		return nil
	}
	return json.Unmarshal(b, out)
}

// watchEvent is one event of a watch, and when dp-bench received it.
type watchEvent struct {
	Type   string          `json:"type"`
	Object json.RawMessage `json:"object"`
	At     time.Time       `json:"-"`
}

// Watch event types.
const (
	watchAdded    = "ADDED"
	watchModified = "MODIFIED"
	watchDeleted  = "DELETED"
	watchError    = "ERROR"
	watchBookmark = "BOOKMARK"
)

// openWatch starts a watch of the collection at path with the query q:
// the response whose body streams the events, or the API's error.
func (c *apiClient) openWatch(ctx context.Context, path string, q url.Values) (*http.Response, error) {
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
		return nil, &apiError{Code: resp.StatusCode, Message: strings.TrimSpace(string(b))}
	}
	return resp, nil
}

// watch watches the collection at path with the query q until ctx is
// done; the events go to the returned channel, stamped when read, which
// is closed when the watch ends.
func (c *apiClient) watch(ctx context.Context, path string, q url.Values) (<-chan watchEvent, error) {
	resp, err := c.openWatch(ctx, path, q)
	if err != nil {
		return nil, err
	}
	out := make(chan watchEvent, 1024)
	go func() {
		defer close(out)
		defer resp.Body.Close()
		dec := json.NewDecoder(resp.Body)
		for {
			var ev watchEvent
			if err := dec.Decode(&ev); err != nil {
				return
			}
			ev.At = time.Now()
			select {
			case out <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}
