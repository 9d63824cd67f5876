package workspaces

// This file is host registration: what each host offers, and its
// data-plane endpoint.

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/proto"

	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

func decodeHost(h store.Host) (*hostv1.RegisterHostRequest, error) {
	reg := new(hostv1.RegisterHostRequest)
	if err := proto.Unmarshal(h.Body, reg); err != nil {
		return nil, fmt.Errorf("host %s: %w", h.ID, err)
	}
	return reg, nil
}

// RegisterHost stores a host's registration and capacity.
func (s *Service) RegisterHost(ctx context.Context, reg *hostv1.RegisterHostRequest) error {
	if reg.HostId == "" {
		return invalid("host_id is required")
	}
	body, err := proto.Marshal(reg)
	if err != nil {
		return err
	}
	c := reg.GetCapacity()
	return s.Store.Update(ctx, func(tx store.Tx) error {
		return tx.PutHost(ctx, store.Host{ID: reg.HostId, Body: body, CPUMillis: c.GetCpuMillis(),
			MemoryBytes: c.GetMemoryBytes(), LayerBytes: c.GetLayerBytes(), SeenAt: s.Now.UTC()})
	})
}

// DataPlaneEndpoint returns the data-plane endpoint a host registered;
// empty when it registered none, or when no host has the ID.
func DataPlaneEndpoint(ctx context.Context, tx store.Tx, hostID string) (string, error) {
	hosts, err := tx.Hosts(ctx)
	if err != nil {
		return "", err
	}
	for _, h := range hosts {
		if h.ID != hostID {
			continue
		}
		reg, err := decodeHost(h)
		if err != nil {
			return "", err
		}
		return reg.DataPlaneEndpoint, nil
	}
	return "", nil
}
