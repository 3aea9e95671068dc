// Package apiclient is dp-bench's client of the Kubernetes API server:
// JSON over HTTPS with a client certificate, not rate-limited, for the
// few objects dp-bench reads and writes, in types of its own (types.go:
// k8s.io/api's JSON names, only the fields dp-bench uses; the tests
// decode them strictly into k8s.io/api's types), and a watch that
// resumes where the API server ended it.
//
// It is not client-go on purpose. Every baseline of dp-bench's tables is
// dp-bench itself (a Go binary that exits at once, or one that idles:
// package proc), so what dp-bench links is in every baseline: linking
// client-go doubled the baseline's resident memory (12.9 → 26.6 MiB) and
// its start-up (4.1 → 9.3 ms), the figures the device plugins are set
// against. cmd/dp-bench's TestLinksNoKubeClient keeps client-go, k8s.io/api
// and apimachinery's API packages out of the binary.
package apiclient

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
	"strings"
	"time"
)

// Client calls the API server as one user (a client certificate).
type Client struct {
	base string
	http *http.Client
}

// New is a client of the API server at base (https://host:port) that
// trusts caPEM and presents certPEM/keyPEM.
func New(base string, caPEM, certPEM, keyPEM []byte) (*Client, error) {
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
	return &Client{base: strings.TrimSuffix(base, "/"), http: &http.Client{Transport: tr}}, nil
}

// StatusError is an answer of the API server other than 2xx.
type StatusError struct {
	Code            int
	Reason, Message string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("API server: %d %s: %s", e.Code, e.Reason, e.Message)
}

// IsAlreadyExists reports whether err is the API server's 409
// AlreadyExists.
func IsAlreadyExists(err error) bool {
	var e *StatusError
	return errors.As(err, &e) && e.Code == http.StatusConflict && e.Reason == "AlreadyExists"
}

// IsNotFound reports whether err is the API server's 404.
func IsNotFound(err error) bool {
	var e *StatusError
	return errors.As(err, &e) && e.Code == http.StatusNotFound
}

// IsGone reports whether err is the API server's 410 (a resourceVersion
// too old to watch from).
func IsGone(err error) bool {
	var e *StatusError
	return errors.As(err, &e) && e.Code == http.StatusGone
}

// Do sends method path with in (JSON, when not nil) and decodes the answer
// into out (when not nil; a *string takes the body as it is).
func (c *Client) Do(ctx context.Context, method, path string, in, out any) error {
	return c.send(ctx, method, path, "application/json", in, out)
}

// MergePatch sends a JSON merge patch.
func (c *Client) MergePatch(ctx context.Context, path string, in any) error {
	return c.send(ctx, http.MethodPatch, path, "application/merge-patch+json", in, nil)
}

// send is Do with in sent as contentType (a JSON encoding: a merge patch,
// ...).
func (c *Client) send(ctx context.Context, method, path, contentType string, in, out any) error {
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
		e := &StatusError{Code: resp.StatusCode, Message: strings.TrimSpace(string(b))}
		var st Status
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
