package sdk

import (
	"context"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// ExposeOptions describe an exposure of a guest port.
type ExposeOptions struct {
	// Public lets anyone with the URL reach the port; otherwise a request
	// needs the exposure's Token.
	Public bool
	// Persistent keeps the exposure across stops of the Workspace: it comes
	// back at the next start. Otherwise it ends with the execution.
	Persistent bool
	// CommandID makes the call idempotent; empty picks a random one. A
	// retry with the same ID returns the exposure without its token.
	CommandID string
}

// Exposure is a URL that reaches a guest port over HTTP/1.1, HTTP/2 and
// WebSocket.
type Exposure struct {
	// ID names the exposure, for RevokeExposure.
	ID string
	// URL is the absolute http(s) URL of the port.
	URL string
	// Token is what a request sends, as Authorization: Bearer Token, or
	// once as URL?kibotos_token=Token in a browser (which then keeps a
	// cookie). Empty for a public exposure.
	Token string
	// Info is the exposure as the server returned it.
	Info *ctrlv1.Exposure
}

// Expose gives a TCP port of the (AVAILABLE) Workspace's guest a URL.
// A port already exposed is already_exists; a stopped Workspace
// failed_precondition.
func (w *Workspace) Expose(ctx context.Context, port uint32, o ExposeOptions) (*Exposure, error) {
	auth := ctrlv1.ExposureAuth_EXPOSURE_AUTH_TOKEN
	if o.Public {
		auth = ctrlv1.ExposureAuth_EXPOSURE_AUTH_PUBLIC
	}
	resp, err := w.c.exposures().CreateExposure(ctx, connect.NewRequest(&ctrlv1.CreateExposureRequest{
		Command: commandMetadata(o.CommandID), WorkspaceId: w.id, Port: port, Auth: auth, Persistent: o.Persistent}))
	if err != nil {
		return nil, err
	}
	x := resp.Msg.GetExposure()
	return &Exposure{ID: x.GetExposureId(), URL: x.GetUrl(), Token: x.GetToken(), Info: x}, nil
}

// Exposures returns the Workspace's live exposures, without tokens.
func (w *Workspace) Exposures(ctx context.Context) ([]*ctrlv1.Exposure, error) {
	var out []*ctrlv1.Exposure
	for token := ""; ; {
		resp, err := w.c.exposures().ListExposures(ctx, connect.NewRequest(&ctrlv1.ListExposuresRequest{WorkspaceId: w.id, PageToken: token}))
		if err != nil {
			return nil, err
		}
		out = append(out, resp.Msg.GetExposures()...)
		if token = resp.Msg.GetNextPageToken(); token == "" {
			return out, nil
		}
	}
}

// RevokeExposure ends an exposure: within a second its URL no longer
// reaches the guest. Revoking an ended exposure succeeds.
func (c *Client) RevokeExposure(ctx context.Context, id string) error {
	_, err := c.exposures().RevokeExposure(ctx, connect.NewRequest(&ctrlv1.RevokeExposureRequest{Command: commandMetadata(""), ExposureId: id}))
	return err
}
