// Package podresources is the kubelet's PodResources API as the product
// reads it: a Client for one socket that keeps one gRPC connection between
// calls, and List, one call folded into Resources: which device-plugin
// devices containers hold, and which devices DRA claims hold.
//
// The metrics, the device plugin's claim guard and recovery, and the DRA
// driver's safety checks all read it through this package.
package podresources

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// DefaultTimeout bounds one List (both of its tries); a caller bounds it
// further with its context.
const DefaultTimeout = 5 * time.Second

var (
	// ErrNoSocket is a List's error when the socket is not there (no
	// kubelet yet, or the API is not mounted into the container). Nothing
	// is known then; some callers treat that apart from a List that fails.
	ErrNoSocket = errors.New("no PodResources socket")
	// ErrClosed is a List's error after Close.
	ErrClosed = errors.New("PodResources client closed")
)

// Client asks the kubelet's PodResources API on one socket, over one
// connection kept between calls: a new connection for every call (a gRPC
// client, its HTTP/2 handshake) costs about as much as the List itself.
// A List that fails on a kept connection is asked once more on a new one:
// a restarted kubelet has a new socket, and gRPC's reconnect back-off on
// the old connection would fail calls for seconds; so a failure says what
// a fresh connection says. Lists may run at once; they share the
// connection. Close it when done.
type Client struct {
	socket  string
	timeout time.Duration

	mu     sync.Mutex
	conn   *grpc.ClientConn
	closed bool
}

// New returns a client of the PodResources API on socket; it connects at
// the first List.
func New(socket string) *Client {
	return &Client{socket: socket, timeout: DefaultTimeout}
}

// Socket is the socket the client asks.
func (c *Client) Socket() string { return c.socket }

// List asks which container holds which device, in one call, within
// DefaultTimeout. A missing socket is an error naming it that wraps
// ErrNoSocket (and the fs error, fs.ErrNotExist for an absent file); a
// failed List an error naming the socket.
func (c *Client) List(ctx context.Context) (*Resources, error) {
	if _, err := os.Stat(c.socket); err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrNoSocket, c.socket, err)
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	conn, fresh, err := c.connection(nil)
	if err != nil {
		return nil, fmt.Errorf("PodResources List on %s: %w", c.socket, err)
	}
	resp, err := list(ctx, conn)
	if err != nil && !fresh && ctx.Err() == nil {
		// The kept connection failed (the kubelet restarted, say): once
		// more on a new one.
		if conn, _, err = c.connection(conn); err == nil {
			resp, err = list(ctx, conn)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("PodResources List on %s: %w", c.socket, err)
	}
	return fold(resp), nil
}

// connection returns the kept connection, or a new one, kept now (fresh),
// when there is none or the kept one is failed (a List failed on it).
func (c *Client) connection(failed *grpc.ClientConn) (conn *grpc.ClientConn, fresh bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, false, ErrClosed
	}
	if failed != nil && c.conn == failed {
		_ = c.conn.Close()
		c.conn = nil
	}
	if c.conn != nil {
		return c.conn, false, nil
	}
	if c.conn, err = grpc.NewClient("unix://"+c.socket, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		return nil, false, err
	}
	return c.conn, true, nil
}

func list(ctx context.Context, conn *grpc.ClientConn) (*podresourcesapi.ListPodResourcesResponse, error) {
	return podresourcesapi.NewPodResourcesListerClient(conn).List(ctx, &podresourcesapi.ListPodResourcesRequest{})
}

// Close closes the kept connection; Lists after it fail with ErrClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.conn == nil {
		return nil
	}
	err := c.conn.Close()
	c.conn = nil
	return err
}

// List is one List on socket over a connection of its own, for a caller
// that asks once.
func List(ctx context.Context, socket string) (*Resources, error) {
	c := New(socket)
	defer func() { _ = c.Close() }()
	return c.List(ctx)
}
