package workspaces

// This file is host registration: what each host offers, and its
// data-plane endpoint.

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/scheduler"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

func decodeHost(h store.Host) (*hostv1.RegisterHostRequest, error) {
	reg := new(hostv1.RegisterHostRequest)
	if err := proto.Unmarshal(h.Body, reg); err != nil {
		return nil, fmt.Errorf("host %s: %w", h.ID, err)
	}
	return reg, nil
}

// hostIDPattern is what a host may call itself: a DNS label, as the
// host ID appears in paths, listings and log lines.
var hostIDPattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// checkHostID validates a host ID a host sent.
func checkHostID(id string) error {
	if !hostIDPattern.MatchString(id) {
		return invalid("host_id must be 1 to 63 lowercase letters, digits and '-', starting and ending with a letter or digit")
	}
	return nil
}

// CheckRegistered refuses a host ID that is malformed (invalid_argument),
// that the caller's host token was not issued for (permission_denied, see
// checkTokenMayRegister), that no host registered (not_found), or that
// registered with another host token than the caller's (permission_denied,
// see checkHostOwner): only a registered host, with its own token,
// reports, watches its assignments and reads artifacts.
func (s *Service) CheckRegistered(ctx context.Context, hostID string) error {
	if err := checkHostID(hostID); err != nil {
		return err
	}
	return s.Store.View(ctx, func(tx store.Tx) error {
		// A host registered before hosts kept their token has none that
		// checkHostOwner could compare: a token issued for other hosts
		// must not act as it either.
		if err := checkTokenMayRegister(ctx, tx, hostID); err != nil {
			return err
		}
		h, found, err := hostByID(ctx, tx, hostID)
		switch {
		case err != nil:
			return err
		case !found:
			return connect.NewError(connect.CodeNotFound, fmt.Errorf("host %q is not registered", hostID))
		}
		return checkHostOwner(ctx, h)
	})
}

// CheckAgent is CheckRegistered for a call of the agent that registered
// the host with stateID: once another agent registered it with another
// state, this one is refused (failed_precondition), so that it takes no
// assignment and renews no lease, and fences itself. Empty: not known.
func (s *Service) CheckAgent(ctx context.Context, hostID, stateID string) error {
	if err := s.CheckRegistered(ctx, hostID); err != nil || stateID == "" {
		return err
	}
	return s.Store.View(ctx, func(tx store.Tx) error {
		reg, err := HostRegistration(ctx, tx, hostID)
		if err != nil {
			return err
		}
		if prev := reg.GetStateId(); prev != "" && prev != stateID {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
				"host %q is served by another agent now, which registered it after this one: this agent serves it no more; stop it, or give it a name of its own (--name)", hostID))
		}
		return nil
	})
}

// checkHostOwner refuses a call for host h made with a host token other
// than the one h registered with: a host token never acts as another
// host, whose assignments carry its workspaces' data-plane keys. That
// holds after h's token is revoked too: only a registration moves the
// name to another token (checkHostTakeover). A call without a host token
// (this process's own) is not refused.
func checkHostOwner(ctx context.Context, h store.Host) error {
	caller := auth.HostTokenFrom(ctx)
	if caller == "" || h.TokenID == "" || h.TokenID == caller {
		return nil
	}
	return connect.NewError(connect.CodePermissionDenied, fmt.Errorf(
		"host %q is registered with another host token: give each host a name of its own (--name), or revoke that token and register the host with this one to move the name", h.ID))
}

// checkHostTakeover is checkHostOwner for a registration of host h,
// which takes h's name over once the token h registered with is revoked.
func checkHostTakeover(ctx context.Context, tx store.Tx, h store.Host) error {
	refused := checkHostOwner(ctx, h)
	if refused == nil || h.TokenID == auth.DeploymentHostToken {
		return refused
	}
	tok, err := tx.HostToken(ctx, h.TokenID)
	switch {
	case errors.Is(err, store.ErrNotFound), err == nil && !tok.RevokedAt.IsZero():
		return nil // the owner is revoked: the caller takes the name
	case err != nil:
		return err
	}
	return refused
}

// checkTokenMayRegister refuses a registration of hostID with a host token
// issued for other host IDs (permission_denied), so that a host's stolen
// token cannot register made-up hosts, which would claim capacity and take
// new placements with their data-plane keys and assignments. Tokens issued
// for any host, and the deployment's own (whose secret only the store and
// `kibotos up`'s host agent hold), register any ID.
func checkTokenMayRegister(ctx context.Context, tx store.Tx, hostID string) error {
	caller := auth.HostTokenFrom(ctx)
	if caller == "" || caller == auth.DeploymentHostToken {
		return nil
	}
	tok, err := tx.HostToken(ctx, caller)
	if err != nil || tok.AnyHost || slices.Contains(tok.HostIDs, hostID) {
		return err
	}
	return connect.NewError(connect.CodePermissionDenied, fmt.Errorf(
		"this host token was not issued for host %q: register the host under a name the token was issued for, or with a token issued for this one (kibotos admin host-token create --host %s)",
		hostID, hostID))
}

// RegisterHost stores a host's registration and capacity.
func (s *Service) RegisterHost(ctx context.Context, reg *hostv1.RegisterHostRequest) error {
	if err := checkHostID(reg.HostId); err != nil {
		return err
	}
	if err := checkLaunches(reg.Launches); err != nil {
		return err
	}
	body, err := proto.Marshal(reg)
	if err != nil {
		return err
	}
	c := reg.GetCapacity()
	return s.updateAnnouncing(ctx, func(tx store.Tx) ([]string, error) {
		if err := checkTokenMayRegister(ctx, tx, reg.HostId); err != nil {
			return nil, err
		}
		var restarted []string
		if h, found, err := hostByID(ctx, tx, reg.HostId); err != nil {
			return nil, err
		} else if found {
			if err := checkHostTakeover(ctx, tx, h); err != nil {
				return nil, err
			}
			if restarted, err = s.checkHostState(ctx, tx, h, reg.StateId); err != nil {
				return nil, err
			}
		}
		err := tx.PutHost(ctx, store.Host{ID: reg.HostId, Body: body, CPUMillis: c.GetCpuMillis(),
			MemoryBytes: c.GetMemoryBytes(), LayerBytes: c.GetLayerBytes(), SeenAt: s.Now.UTC(), TokenID: auth.HostTokenFrom(ctx)})
		if err != nil {
			return nil, err
		}
		if err := s.registerLaunches(ctx, tx, reg.HostId, reg.Launches); err != nil {
			return nil, err
		}
		back, err := s.hostSeen(ctx, tx, reg.HostId)
		return append(restarted, back...), err
	})
}

// checkHostState compares the state a host registers with (state_id) with
// the one it registered with before. Another one, while the host reported
// within its lease, is refused: a second agent under the name, or one
// that lost its layers, would run the host's workspaces again on empty
// layers beside those that run. Once the lease has passed it is taken,
// and each workspace the host ran starts again there as a new execution
// (the next generation, on an empty layer: RESET, LAYER_UNAVAILABLE), so
// that it shares no execution ID (and cgroup) with one the agent that
// left may have left running, nor takes the sessions of the one it lost.
// It returns the workspaces it started again.
func (s *Service) checkHostState(ctx context.Context, tx store.Tx, h store.Host, stateID string) (restarted []string, err error) {
	prev, err := decodeHost(h)
	if err != nil || prev.GetStateId() == "" || stateID == "" || prev.GetStateId() == stateID {
		return nil, err
	}
	if silent := s.Now.UTC().Sub(h.SeenAt); h.LostAt.IsZero() && silent < s.Lease() {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
			"host %q is served by another agent, or was by one whose layer directory this one does not have (it reported %s ago): "+
				"stop the other agent or give this one a name of its own (--name); or, if its layers are gone, wait %s for the host's lease to pass, "+
				"after which its workspaces start again on empty layers",
			h.ID, silent.Round(time.Second), (s.Lease()-silent).Round(time.Second)))
	}
	records, err := decodeAll(tx.HostWorkspaces(ctx, h.ID))
	if err != nil {
		return nil, err
	}
	for _, r := range records {
		if r.ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE &&
			(r.ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_UNKNOWN || r.book.Unknown != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE) {
			continue // a start finds the layer missing on its own
		}
		r.book.Unknown = 0
		r.ws.State = ctrlv1.WorkspaceState_WORKSPACE_STATE_STARTING
		nextExecution(r)
		if err := s.save(ctx, tx, r); err != nil {
			return nil, err
		}
		restarted = append(restarted, r.row.ID)
	}
	return restarted, nil
}

// DataPlaneEndpoint returns the data-plane endpoint a host registered;
// empty when it registered none, or when no host has the ID.
func DataPlaneEndpoint(ctx context.Context, tx store.Tx, hostID string) (string, error) {
	reg, err := HostRegistration(ctx, tx, hostID)
	return reg.GetDataPlaneEndpoint(), err
}

// HostRegistration returns what a host registered; nil when no host has
// the ID.
func HostRegistration(ctx context.Context, tx store.Tx, hostID string) (*hostv1.RegisterHostRequest, error) {
	h, found, err := hostByID(ctx, tx, hostID)
	if err != nil || !found {
		return nil, err
	}
	return decodeHost(h)
}

// hostByID returns the registered host of the ID; found is false when no
// host has it.
func hostByID(ctx context.Context, tx store.Tx, hostID string) (h store.Host, found bool, err error) {
	hosts, err := tx.Hosts(ctx)
	if err != nil {
		return store.Host{}, false, err
	}
	for _, h := range hosts {
		if h.ID == hostID {
			return h, true, nil
		}
	}
	return store.Host{}, false, nil
}

// HostView is a registered host as operators read it.
type HostView struct {
	ID string
	// Registration is what the host registered.
	Registration *hostv1.RegisterHostRequest
	// Capacity is what it offers, Reserved what its placed workspaces hold.
	Capacity, Reserved scheduler.Resources
	// SeenAt is when it last registered or reported.
	SeenAt        time.Time
	Lost, Drained bool
	// Workspaces counts the live workspaces placed on it.
	Workspaces int
}

func (c candidate) view() HostView {
	return HostView{ID: c.ID, Registration: c.reg, Capacity: c.Capacity, Reserved: c.Reserved, SeenAt: c.row.SeenAt,
		Lost: c.lost, Drained: c.drained, Workspaces: c.placed}
}

// ListHosts returns every registered host, ordered by ID.
func (s *Service) ListHosts(ctx context.Context) ([]HostView, error) {
	var out []HostView
	err := s.Store.View(ctx, func(tx store.Tx) error {
		hosts, err := s.hosts(ctx, tx, "")
		for _, h := range hosts {
			out = append(out, h.view())
		}
		return err
	})
	return out, err
}

// DataPlaneEndpoints returns the data-plane endpoints the registered
// hosts serve at, for the console's page to connect to; none when the
// store does not answer.
func (s *Service) DataPlaneEndpoints(ctx context.Context) []string {
	hosts, err := s.ListHosts(ctx)
	if err != nil {
		return nil
	}
	out := make([]string, 0, len(hosts))
	for _, h := range hosts {
		if e := h.Registration.GetDataPlaneEndpoint(); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// DrainHost stops (drained) or resumes new placements on a host; an ID
// that is none is invalid_argument, an unknown host not_found.
func (s *Service) DrainHost(ctx context.Context, hostID string, drained bool) (HostView, error) {
	var out HostView
	if err := checkHostID(hostID); err != nil {
		return out, err
	}
	err := s.Store.Update(ctx, func(tx store.Tx) error {
		hosts, err := s.hosts(ctx, tx, hostID)
		if err != nil {
			return err
		}
		if len(hosts) == 0 {
			return connect.NewError(connect.CodeNotFound, fmt.Errorf("host %q is not registered", hostID))
		}
		h := hosts[0]
		h.row.Drained, h.drained = drained, drained
		out = h.view()
		return tx.UpdateHost(ctx, h.row)
	})
	return out, err
}
