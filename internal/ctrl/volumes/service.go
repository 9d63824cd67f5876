package volumes

import (
	"context"
	"crypto/rand"
	"fmt"
	"slices"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/changes"
	"github.com/kibotos/kibotos/internal/ctrl/command"
	"github.com/kibotos/kibotos/internal/ctrl/ids"
	"github.com/kibotos/kibotos/internal/ctrl/meta"
	"github.com/kibotos/kibotos/internal/ctrl/pagetoken"
	"github.com/kibotos/kibotos/internal/ctrl/resource"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// Service implements the volume methods over a store.
type Service struct {
	Store store.Store
	Pages *pagetoken.Codec
	// DefaultPool is the pool an empty storage_pool selects.
	DefaultPool string
	// InUse is the failed_precondition of a change that a workspace of the
	// caller's project stands in the way of, with that workspace attached
	// (workspaces.InUse).
	InUse func(ctx context.Context, tx store.Tx, projectID, workspaceID, format string, a ...any) error
	// Changes is told about every committed change, so that the streams of
	// hosts and the watchers of bound workspaces wake up.
	Changes *changes.Broker
	// Now is the clock; nil is time.Now.
	Now resource.Clock
}

func (s *Service) changed() {
	if s.Changes != nil {
		s.Changes.Publish("")
	}
}

// Write describes a write request.
type Write[R proto.Message] = resource.Mutation[R]

func invalid(format string, a ...any) error {
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(format, a...))
}

func precondition(format string, a ...any) error {
	return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(format, a...))
}

// checkCapacity checks a requested capacity: a whole number of MiB, or
// zero where zero delegates to the pool's profile.
func checkCapacity(field string, bytes uint64, zeroAllowed bool) error {
	if bytes == 0 && zeroAllowed {
		return nil
	}
	if bytes == 0 || bytes%MiB != 0 {
		return invalid("%s %d must be a positive whole number of MiB", field, bytes)
	}
	if bytes > MaxVolumeBytes {
		return invalid("%s %d is above the maximum of %d (16 TiB - 1 MiB)", field, bytes, uint64(MaxVolumeBytes))
	}
	return nil
}

// Load reads a Volume of the project, a DELETED one included; an unknown
// one is not_found.
func Load(ctx context.Context, tx store.Tx, projectID, id string) (*Record, error) {
	return resource.Load(ctx, tx.Volume, decode, "volume", projectID, id)
}

// save stores a record, stamping updated_at.
func (s *Service) save(ctx context.Context, tx store.Tx, r *Record) error {
	now := s.Now.UTC()
	r.V.UpdatedAt = timestamppb.New(now)
	r.Row.UpdatedAt = now
	return resource.Save(ctx, r.encode, tx.UpdateVolume, &r.Row)
}

// create stores a new Volume in CREATING on a host that reaches pool.
func (s *Service) create(ctx context.Context, tx store.Tx, projectID string, pool Pool, hostID string, capacity uint64,
	labels, annotations map[string]string) (*Record, error) {
	reg := pool.host(hostID)
	if reg == nil {
		return nil, fmt.Errorf("volumes: host %s does not reach pool %s", hostID, pool.Name)
	}
	if capacity == 0 {
		capacity = reg.DefaultVolumeBytes
	}
	if capacity == 0 || capacity%MiB != 0 {
		return nil, fmt.Errorf("volumes: pool %s on host %s has no usable default capacity (%d)", pool.Name, hostID, capacity)
	}
	if err := s.checkRoom(ctx, tx, pool, hostID, "", capacity); err != nil {
		return nil, err
	}
	now := s.Now.UTC()
	r := &Record{
		V: &ctrlv1.Volume{
			VolumeId:            ids.New("vol"),
			Spec:                &ctrlv1.VolumeSpec{CapacityBytes: capacity, StoragePool: pool.Name},
			State:               ctrlv1.VolumeState_VOLUME_STATE_CREATING,
			CreatedAt:           timestamppb.New(now),
			UpdatedAt:           timestamppb.New(now),
			Labels:              labels,
			Annotations:         annotations,
			LabelsRevision:      1,
			AnnotationsRevision: 1,
		},
		Book: Bookkeeping{UUID: newUUID(), Target: capacity},
	}
	r.Row = store.Volume{ProjectID: projectID, ID: r.V.VolumeId, HostID: hostID, CreatedAt: now, UpdatedAt: now}
	row, err := r.encode()
	if err != nil {
		return nil, err
	}
	if err := tx.CreateVolume(ctx, row); err != nil {
		return nil, err
	}
	r.Row = row
	return r, nil
}

// newUUID returns a random (version 4) UUID in canonical form.
func newUUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// Create stores a new Volume in CREATING on a host that reaches its pool.
func Create[R proto.Message](ctx context.Context, s *Service, w Write[R], spec *ctrlv1.VolumeSpec,
	labels, annotations map[string]string, respond func(*ctrlv1.Volume) R) (R, error) {
	var zero R
	cmd, err := resource.CommandOf(ctx, w)
	if err != nil {
		return zero, err
	}
	if err := checkCapacity("spec.capacity_bytes", spec.GetCapacityBytes(), true); err != nil {
		return zero, err
	}
	if p := spec.GetStoragePool(); p != "" {
		if err := ValidPoolName(p); err != nil {
			return zero, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("spec.%w", err))
		}
	}
	if err := resource.CheckMaps(labels, annotations); err != nil {
		return zero, err
	}
	resp, err := command.Run(ctx, s.Store, cmd, func(ctx context.Context, tx store.Tx) (R, error) {
		pool, err := s.resolvePool(ctx, tx, spec.GetStoragePool())
		if err != nil {
			return zero, err
		}
		host, ok := pool.openHost()
		if !ok {
			return zero, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf(
				"no host that reaches storage pool %q takes new volumes now: each is LOST or drained", pool.Name))
		}
		r, err := s.create(ctx, tx, cmd.ProjectID, pool, host, spec.GetCapacityBytes(), labels, annotations)
		if err != nil {
			return zero, err
		}
		return respond(r.commandView()), nil
	})
	if err == nil {
		s.changed()
	}
	return resp, err
}

// Get returns a Volume, a DELETED one included.
func (s *Service) Get(ctx context.Context, id string) (*ctrlv1.Volume, error) {
	return resource.Read(ctx, s.Store, "volume_id", id, Load, view)
}

// view presents a Volume as reads return it.
func view(_ context.Context, _ store.Tx, r *Record) (*ctrlv1.Volume, error) { return r.View(), nil }

// List returns one page of the Volumes that are not DELETED.
func (s *Service) List(ctx context.Context, pageSize uint32, token string, selector map[string]string) ([]*ctrlv1.Volume, string, error) {
	return resource.ListPage(ctx, s.Store, s.Pages, "volume", pageSize, token, selector,
		store.Tx.Volumes,
		func(v store.Volume) string { return v.ID },
		func(v store.Volume) int { return len(v.Body) + meta.Bytes(v.Labels) },
		resource.Decoded(decode, view))
}

// mutate runs one command that changes one Volume: load it, let change
// edit the record, store it when it changed, and answer with the Volume.
func mutate[R proto.Message](ctx context.Context, s *Service, w Write[R], id string,
	change func(ctx context.Context, tx store.Tx, r *Record) error, respond func(*ctrlv1.Volume) R) (R, error) {
	resp, changed, err := resource.EditID(ctx, s.Store, w, "volume_id", id, Load, (*Record).encode, change, s.save,
		func(_ context.Context, _ store.Tx, r *Record) (*ctrlv1.Volume, error) { return r.commandView(), nil }, respond)
	if changed {
		s.changed()
	}
	return resp, err
}

// writable refuses a change to a Volume that is going away or LOST.
func writable(r *Record) error {
	switch r.V.State {
	case ctrlv1.VolumeState_VOLUME_STATE_DELETING, ctrlv1.VolumeState_VOLUME_STATE_DELETED:
		return precondition("volume %s is %s", r.V.VolumeId, StateName(r.V.State))
	case ctrlv1.VolumeState_VOLUME_STATE_LOST:
		return precondition("volume %s is LOST: its storage pool %s was declared lost, so it can only be read and deleted", r.V.VolumeId, r.V.Spec.GetStoragePool())
	}
	return nil
}

// Resize grows a Volume. An AVAILABLE one is RESIZING until its host grew
// it; an ATTACHED one grows online where its host allows that.
func Resize[R proto.Message](ctx context.Context, s *Service, w Write[R], id string, bytes uint64, respond func(*ctrlv1.Volume) R) (R, error) {
	var zero R
	if err := checkCapacity("capacity_bytes", bytes, false); err != nil {
		return zero, err
	}
	return mutate(ctx, s, w, id, func(ctx context.Context, tx store.Tx, r *Record) error {
		if err := writable(r); err != nil {
			return err
		}
		current := r.V.Spec.CapacityBytes
		switch {
		case bytes < current:
			return invalid("capacity_bytes %d is below the volume's %d bytes: a volume only grows", bytes, current)
		case bytes == current && r.Book.Target == current:
			return nil
		}
		switch r.V.State {
		case ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE:
			r.V.State = ctrlv1.VolumeState_VOLUME_STATE_RESIZING
		case ctrlv1.VolumeState_VOLUME_STATE_ATTACHED:
			pools, err := Pools(ctx, tx)
			if err != nil {
				return err
			}
			reg := pools[r.V.Spec.StoragePool].host(r.Row.HostID)
			if reg == nil || !reg.OnlineGrow {
				why := "its host does not reach the pool"
				if reg != nil {
					why = reg.OnlineGrowRefusal
				}
				return s.InUse(ctx, tx, r.Row.ProjectID, r.V.BoundWorkspaceId,
					"volume %s is ATTACHED to workspace %s and its host cannot grow it while mounted (%s); stop the workspace and resize again",
					r.V.VolumeId, r.V.BoundWorkspaceId, why)
			}
		default:
			return precondition("volume %s is %s; only an AVAILABLE or ATTACHED volume can be resized", r.V.VolumeId, StateName(r.V.State))
		}
		pools, err := Pools(ctx, tx)
		if err != nil {
			return err
		}
		if err := s.checkRoom(ctx, tx, pools[r.V.Spec.StoragePool], r.Row.HostID, r.V.VolumeId, bytes); err != nil {
			return err
		}
		r.Book.Target = bytes
		r.V.Failure = nil
		return nil
	}, respond)
}

// Delete deletes a Volume no undeleted workspace binds.
func Delete[R proto.Message](ctx context.Context, s *Service, w Write[R], id string, respond func(*ctrlv1.Volume) R) (R, error) {
	return mutate(ctx, s, w, id, func(ctx context.Context, tx store.Tx, r *Record) error {
		switch r.V.State {
		case ctrlv1.VolumeState_VOLUME_STATE_DELETING, ctrlv1.VolumeState_VOLUME_STATE_DELETED:
			return nil
		}
		if ws := r.V.BoundWorkspaceId; ws != "" {
			return s.InUse(ctx, tx, r.Row.ProjectID, ws, "volume %s is bound to workspace %s; delete the workspace or rebind it first", r.V.VolumeId, ws)
		}
		s.beginDelete(r)
		return nil
	}, respond)
}

// beginDelete moves a Volume to DELETING, or to DELETED at once when no
// host holds data of it (LOST).
func (s *Service) beginDelete(r *Record) {
	r.V.Failure = nil
	if r.V.State == ctrlv1.VolumeState_VOLUME_STATE_LOST || r.Row.HostID == "" {
		s.finishDelete(r)
		return
	}
	r.V.State = ctrlv1.VolumeState_VOLUME_STATE_DELETING
}

// finishDelete marks a Volume DELETED.
func (s *Service) finishDelete(r *Record) {
	r.V.State = ctrlv1.VolumeState_VOLUME_STATE_DELETED
	r.V.BoundWorkspaceId = ""
	r.Row.HostID = ""
	r.Row.DeletedAt = s.Now.UTC()
}

// UpdateMap replaces the labels or the annotations (field) under CAS on
// their revision.
func UpdateMap[R proto.Message](ctx context.Context, s *Service, w Write[R], field resource.MapField, id string, expected uint64,
	m map[string]string, respond func(*ctrlv1.Volume) R) (R, error) {
	if err := field.CheckMapWrite(m, expected); err != nil {
		var zero R
		return zero, err
	}
	return mutate(ctx, s, w, id, func(ctx context.Context, tx store.Tx, r *Record) error {
		if err := writable(r); err != nil {
			return err
		}
		current, revision := field.Select(&r.V.Labels, &r.V.LabelsRevision, &r.V.Annotations, &r.V.AnnotationsRevision)
		return field.Replace(current, revision, expected, m)
	}, respond)
}

// PoolLoss is what declaring a pool lost changed.
type PoolLoss struct {
	// HostID is the host whose pool was declared lost: the one named, or
	// the only host of the pool; empty when the pool has no host left.
	HostID string
	// Lost are the Volumes made LOST, in every project.
	Lost []string
}

// DeclarePoolLost makes every Volume that hostID holds in pool and that is
// not DELETED LOST (one being deleted DELETED), in every project. A pool name is each host's own:
// several hosts may reach a pool of one name (each has a "default"), and
// the Volumes the others hold there are untouched. An empty hostID means
// the pool's only host: the only one that reaches it, holds Volumes of it,
// or held Volumes of it now LOST; when there are several, the call is
// invalid_argument, naming them, and changes nothing. A pool no host
// reaches and no Volume names is not_found, and so is a host that is not
// one of the pool's.
func (s *Service) DeclarePoolLost(ctx context.Context, pool, hostID string) (PoolLoss, error) {
	if err := ValidPoolName(pool); err != nil {
		return PoolLoss{}, connect.NewError(connect.CodeInvalidArgument, err)
	}
	if hostID != "" && !hostIDPattern.MatchString(hostID) {
		return PoolLoss{}, invalid("host_id %q is not a host ID: 1 to 63 lowercase letters, digits and '-', starting and ending with a letter or digit", hostID)
	}
	var (
		loss    PoolLoss
		changed bool
	)
	err := s.Store.Update(ctx, func(tx store.Tx) error {
		loss, changed = PoolLoss{HostID: hostID}, false
		rows, err := tx.PoolVolumes(ctx, pool)
		if err != nil {
			return err
		}
		pools, err := Pools(ctx, tx)
		if err != nil {
			return err
		}
		p, reached := pools[pool]
		if len(rows) == 0 && !reached {
			return connect.NewError(connect.CodeNotFound, fmt.Errorf("storage pool %q: no host reaches it and no volume lives in it", pool))
		}
		records := make([]*Record, 0, len(rows))
		for _, row := range rows {
			r, err := decode(row)
			if err != nil {
				return err
			}
			records = append(records, r)
		}
		// The pool's hosts: those that reach it, those that hold Volumes
		// of it (a host may have registered again without the pool), and
		// those whose pool was declared lost while LOST Volumes remember
		// them, so that an empty host never means another host than the
		// one a declaration named before.
		var hosts []string
		for _, h := range p.Hosts {
			hosts = append(hosts, h.HostID)
		}
		for _, r := range records {
			hosts = append(hosts, r.Holder(), r.Book.LostFrom)
		}
		slices.Sort(hosts)
		hosts = slices.Compact(hosts)
		hosts = slices.DeleteFunc(hosts, func(h string) bool { return h == "" })
		switch {
		case hostID == "" && len(hosts) > 1:
			return invalid("storage pool %q is on hosts %s: name the host whose pool is gone (host_id; kibotos admin pool lost %s --host HOST)",
				pool, strings.Join(hosts, ", "), pool)
		case hostID == "" && len(hosts) == 1:
			loss.HostID = hosts[0]
		case hostID == "":
			return nil // only Volumes LOST long ago name the pool
		case !slices.Contains(hosts, hostID):
			return connect.NewError(connect.CodeNotFound, fmt.Errorf("host %q neither reaches storage pool %q nor holds a volume of it (it is on %s)",
				hostID, pool, orNone(hosts)))
		}
		for _, r := range records {
			if r.Holder() != loss.HostID || r.V.State == ctrlv1.VolumeState_VOLUME_STATE_LOST {
				continue // on another host's pool of the same name, or LOST
			}
			if r.V.State == ctrlv1.VolumeState_VOLUME_STATE_DELETING {
				s.finishDelete(r) // nothing is left to delete
				if err := s.save(ctx, tx, r); err != nil {
					return err
				}
				changed = true
				continue
			}
			r.V.State = ctrlv1.VolumeState_VOLUME_STATE_LOST
			r.V.Failure = nil
			r.Book.Target = r.V.Spec.CapacityBytes
			r.Book.LostFrom = r.Row.HostID
			r.Row.HostID = "" // no host converges it any more
			if err := s.save(ctx, tx, r); err != nil {
				return err
			}
			loss.Lost = append(loss.Lost, r.V.VolumeId)
			changed = true
		}
		return nil
	})
	if err != nil {
		return PoolLoss{}, err
	}
	if changed {
		s.changed()
	}
	return loss, nil
}

// orNone joins host IDs for a message.
func orNone(hosts []string) string {
	if len(hosts) == 0 {
		return "no host"
	}
	return strings.Join(hosts, ", ")
}
