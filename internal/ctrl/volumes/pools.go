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
			p.Hosts = append(p.Hosts, PoolHost{HostID: h.ID, Reg: sp})
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
