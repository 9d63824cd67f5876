package volumes

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// poolName is what a storage pool may be called: it is a flag value and
// a word in messages, so it stays plain.
var poolName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// hostIDPattern is what a host ID is (as workspaces checks it): a DNS
// label.
var hostIDPattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidPoolName checks the name of a storage pool.
func ValidPoolName(name string) error {
	if !poolName.MatchString(name) {
		return fmt.Errorf("storage pool name %q must be 1 to 63 lowercase letters, digits and '-', starting and ending with a letter or digit", name)
	}
	return nil
}

// Pool is one storage pool as the registered hosts reach it.
type Pool struct {
	Name string
	// Hosts reach the pool, in ID order, with what each registered of it.
	Hosts []PoolHost
}

// PoolHost is one host's registration of a pool.
type PoolHost struct {
	HostID string
	Reg    *hostv1.StoragePool
	// Open is true while the host takes new Volumes: not LOST, not
	// drained.
	Open bool
}

// openHost returns the first host of the pool that takes new Volumes.
func (p Pool) openHost() (string, bool) {
	for _, h := range p.Hosts {
		if h.Open {
			return h.HostID, true
		}
	}
	return "", false
}

// host returns the pool as hostID reaches it, or nil.
func (p Pool) host(hostID string) *hostv1.StoragePool {
	for _, h := range p.Hosts {
		if h.HostID == hostID {
			return h.Reg
		}
	}
	return nil
}

// Pools returns the storage pools of the registered hosts, by name.
func Pools(ctx context.Context, tx store.Tx) (map[string]Pool, error) {
	hosts, err := tx.Hosts(ctx)
	if err != nil {
		return nil, err
	}
	pools := map[string]Pool{}
	for _, h := range hosts {
		reg := new(hostv1.RegisterHostRequest)
		if err := proto.Unmarshal(h.Body, reg); err != nil {
			return nil, fmt.Errorf("host %s: %w", h.ID, err)
		}
		for _, sp := range reg.StoragePools {
			p := pools[sp.Name]
			p.Name = sp.Name
			p.Hosts = append(p.Hosts, PoolHost{HostID: h.ID, Reg: sp, Open: h.LostAt.IsZero() && !h.Drained})
			pools[sp.Name] = p
		}
	}
	return pools, nil
}

// resolvePool returns the pool a request names, the default for an
// empty name; a pool no host reaches is not_found.
func (s *Service) resolvePool(ctx context.Context, tx store.Tx, name string) (Pool, error) {
	if name == "" {
		name = s.DefaultPool
	}
	pools, err := Pools(ctx, tx)
	if err != nil {
		return Pool{}, err
	}
	if len(pools) == 0 {
		err := connect.NewError(connect.CodeFailedPrecondition, errors.New(`no host of this deployment offers the capability "volume.storage_pool": none has a storage pool`))
		if d, derr := connect.NewErrorDetail(&ctrlv1.ErrorDetail{Reason: ctrlv1.FailureReason_FAILURE_REASON_CAPABILITY_UNAVAILABLE,
			Stage: ctrlv1.FailureStage_FAILURE_STAGE_CREATING_VOLUME}); derr == nil {
			err.AddDetail(d)
		}
		return Pool{}, err
	}
	p, ok := pools[name]
	if !ok {
		return Pool{}, connect.NewError(connect.CodeNotFound, fmt.Errorf("storage pool %q is not reached by any host of this deployment", name))
	}
	return p, nil
}

// PoolSummary is a pool as the operator lists it.
type PoolSummary struct {
	Name               string
	HostIDs            []string
	DefaultVolumeBytes uint64
	Default            bool
}

// ListPools returns every pool a registered host reaches, by name.
func (s *Service) ListPools(ctx context.Context) ([]PoolSummary, error) {
	var out []PoolSummary
	err := s.Store.View(ctx, func(tx store.Tx) error {
		pools, err := Pools(ctx, tx)
		if err != nil {
			return err
		}
		for _, p := range pools {
			sum := PoolSummary{Name: p.Name, Default: p.Name == s.DefaultPool, DefaultVolumeBytes: p.Hosts[0].Reg.DefaultVolumeBytes}
			for _, h := range p.Hosts {
				sum.HostIDs = append(sum.HostIDs, h.HostID)
			}
			out = append(out, sum)
		}
		return nil
	})
	slices.SortFunc(out, func(a, b PoolSummary) int { return strings.Compare(a.Name, b.Name) })
	return out, err
}

// checkRoom refuses to give a pool's Volumes bytes more of capacity when
// their capacities (Reserved) would then add up to more than the pool can
// give, as the host that is to hold the Volume registered it
// (StoragePool.capacity_bytes; zero refuses nothing); on a pool that
// shares the host's layer filesystem, the writable layers placed on the
// host count too. Volumes and layers are sparse images, so this is what
// keeps a guest that fills its Volume from filling the filesystem under
// every other. except is a Volume counted at bytes instead of its own
// capacity (one that grows).
func (s *Service) checkRoom(ctx context.Context, tx store.Tx, pool Pool, hostID, except string, bytes uint64) error {
	reg := pool.host(hostID)
	if reg == nil && len(pool.Hosts) > 0 {
		reg, hostID = pool.Hosts[0].Reg, pool.Hosts[0].HostID
	}
	if reg == nil || reg.CapacityBytes == nil {
		return nil // not known
	}
	room := reg.GetCapacityBytes()
	held, err := Reserved(ctx, tx, pool.Name, hostID, except)
	if err != nil {
		return err
	}
	given, holders := bytes+held, "its volumes"
	if reg.GetSharesLayerFilesystem() {
		used, err := tx.HostUsage(ctx, hostID)
		if err != nil {
			return err
		}
		given += used.LayerBytes
		holders = "its volumes and the writable layers on its filesystem"
	}
	if given > room {
		return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf(
			"storage pool %s cannot give a volume %d bytes: %s would then hold %d bytes, and it can give %d; ask for less, or delete volumes",
			pool.Name, bytes, holders, given, room))
	}
	return nil
}

// Reserved sums the capacities of the live Volumes hostID holds in its
// pool of that name (each host's pool is its own, whatever its name), a
// growth under way counting at its target, but except's.
func Reserved(ctx context.Context, tx store.Tx, pool, hostID, except string) (uint64, error) {
	rows, err := tx.PoolVolumes(ctx, pool)
	if err != nil {
		return 0, err
	}
	var held uint64
	for _, row := range rows {
		if row.ID == except || row.HostID != hostID {
			continue
		}
		r, err := decode(row)
		if err != nil {
			return 0, err
		}
		held += max(r.V.Spec.CapacityBytes, r.Book.Target)
	}
	return held, nil
}
