package workspaces

// This file is placement: which host has room for a workspace and offers
// what it requires, and whether a change still fits on its host.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/ctrl/scheduler"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/volumes"
)

// placement is what a workspace needs of its host beyond capacity.
type placement struct {
	// host is the only host it may run on (the holder of its Volume);
	// empty for any.
	host string
	// pool is the storage pool the host must reach; empty for none.
	pool string
	// capabilities are the capabilities the host must offer.
	capabilities []string
	// platform is the platform of the launch the workspace is bound to
	// (oci-runc/amd64); empty for a new one, which takes its host's.
	platform string
}

// place picks a host with room for the workspace that meets need, and
// returns it with the writable layer's capacity (the host's default when
// none was asked for).
func (s *Service) place(ctx context.Context, tx store.Tx, res *ctrlv1.ResourceRequest, need placement) (string, uint64, error) {
	all, err := s.hosts(ctx, tx, "")
	if err != nil {
		return "", 0, err
	}
	offered := map[string]bool{} // by any host
	for _, h := range all {
		maps.Copy(offered, h.offers)
	}
	launches, err := offeredLaunches(ctx, tx)
	if err != nil {
		return "", 0, err
	}
	want := slices.Clone(need.capabilities)
	for _, c := range want {
		if !offered[c] {
			return "", 0, capabilityUnavailable(c)
		}
	}
	if need.pool != "" {
		want = append(want, "pool:"+need.pool)
	}
	var hosts []scheduler.Host
	var launchless bool // a host was left out only for its launches
	var hostClosed bool // need.host is LOST or drained
	open := 0           // hosts that take new placements
	for _, h := range all {
		if h.lost || h.drained {
			hostClosed = hostClosed || h.ID == need.host
			continue // no new placement on a LOST or drained host
		}
		open++
		if (need.host == "" || h.ID == need.host) && !slices.ContainsFunc(want, func(c string) bool { return !h.offers[c] }) {
			serves, err := servesLaunch(ctx, tx, h, need.platform, launches)
			if err != nil {
				return "", 0, err
			}
			if !serves {
				launchless = true
				continue
			}
			hosts = append(hosts, h.Host)
		}
	}
	if open == 0 {
		return "", 0, connect.NewError(connect.CodeResourceExhausted,
			errors.New("no host takes new workspaces now (none is attached, or every one is drained or not reporting); retry later"))
	}
	if hostClosed {
		return "", 0, connect.NewError(connect.CodeResourceExhausted,
			errors.New("the host that holds this workspace's volume takes no new workspaces now (it is drained or not reporting); retry once it does"))
	}
	if launchless && len(hosts) == 0 {
		return "", 0, capabilityError(errors.New("no host runs the current launch of this workspace's platform (its runtime, guest agent build and seccomp profile)"))
	}
	if need.pool != "" && len(hosts) == 0 {
		return "", 0, connect.NewError(connect.CodeFailedPrecondition,
			fmt.Errorf("no host that holds volumes of storage pool %q has the capabilities this workspace requires", need.pool))
	}
	id, layer, err := scheduler.Place(hosts, scheduler.Request{
		CPUMillis: res.CpuMillis, MemoryBytes: res.MemoryBytes, LayerBytes: res.WritableLayerBytes})
	if err != nil {
		return "", 0, exhausted(err)
	}
	return id, layer, nil
}

// placeStart finds room for a workspace that starts: on the host that
// keeps its layer, or, when that host is LOST, on another host with room
// and the capabilities it requires, where it starts with a new layer
// (continuity RESET, reason LAYER_UNAVAILABLE). A workspace whose Volume
// the LOST host holds waits for it (its Volume is UNKNOWN).
func (s *Service) placeStart(ctx context.Context, tx store.Tx, r *record) error {
	lost, err := hostLost(ctx, tx, r.row.HostID)
	if err != nil || !lost {
		if err == nil {
			err = s.fitsOnItsHost(ctx, tx, r)
		}
		return err
	}
	res := proto.CloneOf(r.ws.GetSpec().GetResources())
	res.WritableLayerBytes = r.row.LayerBytes
	platform, err := s.launchPlatform(ctx, tx, r)
	if err != nil {
		return err
	}
	host, layer, err := s.place(ctx, tx, res, placement{capabilities: r.ws.GetSpec().GetCapabilities().GetRequired(), platform: platform})
	if err != nil {
		return err
	}
	slog.Info("workspace moves off a lost host", "workspace", r.row.ID, "from", r.row.HostID, "to", host)
	r.row.HostID, r.row.LayerBytes = host, layer
	r.book.LayerMoves++ // a new layer, whatever the new host kept of an old one
	return nil
}

// fitsOnItsHost checks that a stopped workspace's CPU and memory fit on
// the host that keeps its layer (the layer's bytes stay reserved there).
func (s *Service) fitsOnItsHost(ctx context.Context, tx store.Tx, r *record) error {
	return s.fitsMore(ctx, tx, r, scheduler.Request{CPUMillis: r.row.CPUMillis, MemoryBytes: r.row.MemoryBytes})
}

// fitsMore checks that the workspace's host has room for req beyond what
// it already holds there. When the workspace would then hold more than
// the host has at all, no wait makes it fit: the refusal says so.
func (s *Service) fitsMore(ctx context.Context, tx store.Tx, r *record, req scheduler.Request) error {
	all, err := s.hosts(ctx, tx, r.row.HostID)
	if err != nil {
		return err
	}
	var hosts []scheduler.Host
	for _, h := range all {
		h.DefaultLayerBytes = 0
		hosts = append(hosts, h.Host)
	}
	if _, _, err := scheduler.Place(hosts, req); err != nil {
		total := scheduler.Request{CPUMillis: req.CPUMillis, MemoryBytes: req.MemoryBytes, LayerBytes: req.LayerBytes + r.row.LayerBytes}
		if holdsExecution(r) {
			total.CPUMillis += r.row.CPUMillis
			total.MemoryBytes += r.row.MemoryBytes
		}
		if len(hosts) == 1 && scheduler.Exceeds(total, hosts[0].Capacity) {
			err = fmt.Errorf("%w: %w", scheduler.ErrTooLarge, err)
		}
		return exhausted(err)
	}
	return nil
}

// exhausted is resource_exhausted without the scheduler's detail, which
// names hosts: callers learn which resource no host has (CPU, memory,
// disk), nothing of the deployment's layout.
func exhausted(err error) error {
	slog.Info("placement refused", "err", err)
	what, together := "the CPU, memory and disk", " all at once"
	var shortage *scheduler.Shortage
	if errors.As(err, &shortage) && len(shortage.Lacking) > 0 {
		what, together = "the "+joinNames(shortage.Lacking), ""
	}
	if errors.Is(err, scheduler.ErrTooLarge) {
		return connect.NewError(connect.CodeResourceExhausted,
			fmt.Errorf("no host of this deployment is large enough for %s this workspace asks for, however idle it is: ask for less", what))
	}
	return connect.NewError(connect.CodeResourceExhausted,
		fmt.Errorf("no host has %s this workspace needs free%s; retry later or ask for less", what, together))
}

// joinNames joins names as a sentence does: "a", "a and b", "a, b and c".
func joinNames(names []string) string {
	if len(names) == 1 {
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

// hosts returns the registered hosts (or only the one named) with what
// is reserved on each (layer bytes of every placed workspace and of the
// Volumes of its pools on the layers' filesystem, CPU and memory of the
// running ones) and what each offers.
func (s *Service) hosts(ctx context.Context, tx store.Tx, only string) ([]candidate, error) {
	all, err := tx.Hosts(ctx)
	if err != nil {
		return nil, err
	}
	var out []candidate
	for _, h := range all {
		if only != "" && h.ID != only {
			continue
		}
		reg, err := decodeHost(h)
		if err != nil {
			return nil, err
		}
		used, err := tx.HostUsage(ctx, h.ID)
		if err != nil {
			return nil, err
		}
		// Volumes on the layers' filesystem draw on the same free space.
		for _, p := range reg.StoragePools {
			if p.GetSharesLayerFilesystem() {
				held, err := volumes.Reserved(ctx, tx, p.Name, h.ID, "")
				if err != nil {
					return nil, err
				}
				used.LayerBytes += held
			}
		}
		host := scheduler.Host{ID: h.ID, Capacity: scheduler.Resources{CPUMillis: h.CPUMillis, MemoryBytes: h.MemoryBytes, LayerBytes: h.LayerBytes},
			DefaultLayerBytes: reg.GetCapacity().GetDefaultLayerBytes(),
			Reserved:          scheduler.Resources{CPUMillis: uint32(min(used.CPUMillis, math.MaxUint32)), MemoryBytes: used.MemoryBytes, LayerBytes: used.LayerBytes}}
		offers := map[string]bool{}
		for _, c := range reg.Capabilities {
			offers[c] = true
		}
		for _, p := range reg.StoragePools {
			offers["pool:"+p.Name] = true
		}
		out = append(out, candidate{Host: host, offers: offers, row: h, reg: reg, placed: used.Workspaces, lost: !h.LostAt.IsZero(), drained: h.Drained})
	}
	return out, nil
}

// candidate is a registered host as placement sees it.
type candidate struct {
	scheduler.Host
	// offers holds its capabilities and, as "pool:NAME", its storage pools.
	offers map[string]bool
	// row is the host as stored, reg its registration.
	row store.Host
	reg *hostv1.RegisterHostRequest
	// placed counts the live workspaces placed on it.
	placed        int
	lost, drained bool
}
