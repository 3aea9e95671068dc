package kubeletsim

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	grpcstatus "google.golang.org/grpc/status"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// DRA is a DRA driver as the kubelet sees it: registered through its
// registration socket, then called on the endpoint it named.
type DRA struct {
	// Info is the driver's answer to GetInfo.
	Info *registerapi.PluginInfo
	// Node calls NodePrepareResources and NodeUnprepareResources, Health
	// NodeWatchResources, on the driver's endpoint.
	Node   drav1.DRAPluginClient
	Health drahealthv1.DRAResourceHealthClient
	conn   *grpc.ClientConn
}

// ErrRefused is returned by RegisterDRA for a driver the kubelet would
// refuse; other errors are those of the calls (a socket not served yet).
var ErrRefused = errors.New("registration refused")

// RegisterDRA registers the driver serving the registration socket sock
// as the kubelet's plugin watcher and DRA manager do: GetInfo must name a
// DRA plugin that offers the v1 DRA service; the registration is then
// confirmed (NotifyRegistrationStatus) and the endpoint dialled.
func RegisterDRA(ctx context.Context, sock string) (*DRA, error) {
	rc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	reg := registerapi.NewRegistrationClient(rc)
	info, err := reg.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		return nil, fmt.Errorf("GetInfo on %s: %w", sock, err)
	}
	var refused error
	switch {
	case info.Type != registerapi.DRAPlugin:
		refused = fmt.Errorf("plugin type %q, want %q", info.Type, registerapi.DRAPlugin)
	case !slices.Contains(info.SupportedVersions, drav1.DRAPluginService):
		refused = fmt.Errorf("services %v lack %s", info.SupportedVersions, drav1.DRAPluginService)
	case info.Endpoint == "":
		refused = errors.New("no endpoint")
	}
	status := &registerapi.RegistrationStatus{PluginRegistered: refused == nil}
	if refused != nil {
		status.Error = refused.Error()
	}
	if _, err := reg.NotifyRegistrationStatus(ctx, status); err != nil {
		return nil, fmt.Errorf("NotifyRegistrationStatus on %s: %w", sock, err)
	}
	if refused != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrRefused, info.Name, refused)
	}
	conn, err := grpc.NewClient("unix://"+info.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	return &DRA{Info: info, Node: drav1.NewDRAPluginClient(conn), Health: drahealthv1.NewDRAResourceHealthClient(conn), conn: conn}, nil
}

// Close closes the connection to the endpoint.
func (c *DRA) Close() error { return c.conn.Close() }

// Prepare asks the driver to prepare claims, as the kubelet does for a
// pod's claims of one driver.
func (c *DRA) Prepare(ctx context.Context, claims ...*drav1.Claim) (*drav1.NodePrepareResourcesResponse, error) {
	return c.Node.NodePrepareResources(ctx, &drav1.NodePrepareResourcesRequest{Claims: claims})
}

// Unprepare asks the driver to unprepare claims.
func (c *DRA) Unprepare(ctx context.Context, claims ...*drav1.Claim) (*drav1.NodeUnprepareResourcesResponse, error) {
	return c.Node.NodeUnprepareResources(ctx, &drav1.NodeUnprepareResourcesRequest{Claims: claims})
}

// PrepareClaim prepares one claim and returns the driver's answer for it,
// or an error: the call's, or the claim not answered, or answered with an
// error, as the kubelet reads the answer.
func (c *DRA) PrepareClaim(ctx context.Context, claim *drav1.Claim) (*drav1.NodePrepareResourceResponse, error) {
	resp, err := c.Prepare(ctx, claim)
	if err != nil {
		return nil, err
	}
	got, ok := resp.GetClaims()[claim.Uid]
	return got, claimAnswer(claim, ok, got.GetError())
}

// UnprepareClaim unprepares one claim, with PrepareClaim's errors.
func (c *DRA) UnprepareClaim(ctx context.Context, claim *drav1.Claim) error {
	resp, err := c.Unprepare(ctx, claim)
	if err != nil {
		return err
	}
	got, ok := resp.GetClaims()[claim.Uid]
	return claimAnswer(claim, ok, got.GetError())
}

// ErrNoHealth is WatchHealth's error for a driver that does not serve the
// health service: the kubelet goes on without its devices' health then.
var ErrNoHealth = errors.New("the driver serves no health stream")

// WatchHealth opens the health stream (NodeWatchResources) that the
// kubelet opens on each driver it registered, and reads it until ctx ends
// (ctx's error) or the stream does; each update goes to update. A stream
// is a cost of the driver that the kubelet's calls alone leave out.
func (c *DRA) WatchHealth(ctx context.Context, update func(*drahealthv1.NodeWatchResourcesResponse)) error {
	s, err := c.Health.NodeWatchResources(ctx, &drahealthv1.NodeWatchResourcesRequest{})
	for err == nil {
		var r *drahealthv1.NodeWatchResourcesResponse
		if r, err = s.Recv(); err == nil {
			update(r)
		}
	}
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case grpcstatus.Code(err) == codes.Unimplemented:
		return fmt.Errorf("%w: %w", ErrNoHealth, err)
	}
	return err
}

// claimAnswer is the error of a driver's answer for claim c: none, not
// answered (ok false), or the driver's error message.
func claimAnswer(c *drav1.Claim, ok bool, msg string) error {
	switch {
	case !ok:
		return fmt.Errorf("claim %s not answered", c.Name)
	case msg != "":
		return fmt.Errorf("claim %s: %s", c.Name, msg)
	}
	return nil
}
