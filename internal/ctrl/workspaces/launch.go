package workspaces

// This file is launch revisions: the exact launches hosts offer, the
// default of each platform, and which one a workspace is bound to.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"

	"google.golang.org/protobuf/proto"

	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// platformPattern is a platform key: <driver>-<runtime>/<arch>.
var platformPattern = regexp.MustCompile(`^[a-z0-9]+-[a-z0-9]+/[a-z0-9_]+$`)

// digestPattern is sha256:<hex>.
var digestPattern = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// checkLaunches validates the launches a host registers.
func checkLaunches(launches []*hostv1.Launch) error {
	for i, l := range launches {
		switch {
		case !platformPattern.MatchString(l.GetPlatform()):
			return invalid("launches[%d].platform %q is not <driver>-<runtime>/<arch>, such as oci-runc/amd64", i, l.GetPlatform())
		case l.RuntimeVersion == "":
			return invalid("launches[%d].runtime_version is required", i)
		case !digestPattern.MatchString(l.GuestBuild):
			return invalid("launches[%d].guest_build must be sha256:<hex>", i)
		case !digestPattern.MatchString(l.SeccompProfile):
			return invalid("launches[%d].seccomp_profile must be sha256:<hex>", i)
		}
	}
	return nil
}

// launchID is the ID of l's launch revision. It is derived from l's
// content, so the same launch registered by any host is one revision.
func launchID(l *hostv1.Launch) string {
	h := sha256.New()
	for _, f := range []string{l.Platform, l.RuntimeVersion, l.GuestBuild, l.SeccompProfile} {
		fmt.Fprintf(h, "%d:%s;", len(f), f)
	}
	return "launch-" + hex.EncodeToString(h.Sum(nil))[:32]
}

// registerLaunches stores the launches a host offers as launch revisions.
// One not seen before becomes the default of its platform (see
// platformDefault).
func (s *Service) registerLaunches(ctx context.Context, tx store.Tx, hostID string, launches []*hostv1.Launch) error {
	for _, l := range launches {
		body, err := proto.Marshal(l)
		if err != nil {
			return err
		}
		id := launchID(l)
		created, err := tx.PutLaunchRevision(ctx, store.LaunchRevision{ID: id, Platform: l.Platform, Body: body, CreatedAt: s.Now.UTC()})
		if err != nil {
			return err
		}
		if created {
			slog.Info("new launch revision is its platform's default", "launch", id, "platform", l.Platform,
				"runtime", l.RuntimeVersion, "guest", l.GuestBuild, "host", hostID)
		}
	}
	return nil
}

// launchOf returns the launch of a stored revision.
func launchOf(ctx context.Context, tx store.Tx, id string) (*hostv1.Launch, error) {
	rev, err := tx.LaunchRevision(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("launch revision %s: %w", id, err)
	}
	l := new(hostv1.Launch)
	if err := proto.Unmarshal(rev.Body, l); err != nil {
		return nil, fmt.Errorf("launch revision %s: %w", id, err)
	}
	return l, nil
}

// bindLaunch binds a workspace to the current default of its platform (the
// platform of the launch it is bound to, or, for one bound to none, of its
// host's preferred launch) and advances launch_binding_version when that
// changes launch_ref. Only creation and an explicit start call it; every
// other way back into a running state keeps the binding.
func (s *Service) bindLaunch(ctx context.Context, tx store.Tx, r *record) error {
	platform, err := s.launchPlatform(ctx, tx, r)
	if err != nil || platform == "" {
		return err // a host that registers no launch runs any
	}
	offered, err := offeredLaunches(ctx, tx)
	if err != nil {
		return err
	}
	def, err := platformDefault(ctx, tx, platform, offered)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	spec := r.ws.Spec
	switch {
	case spec.LaunchRef == def.ID:
	case spec.LaunchRef == "":
		spec.LaunchRef = def.ID
	default:
		spec.LaunchRef = def.ID
		spec.LaunchBindingVersion++
	}
	return nil
}

// platformDefault returns the current default launch revision of
// platform: of the revisions offered (by ID, see offeredLaunches), the
// one stored last; when none of platform is offered, the one of platform
// stored last. A build rolled back on every host is so the default again,
// and one that only LOST hosts offer is not: it would leave no host to
// place a workspace bound to it on.
func platformDefault(ctx context.Context, tx store.Tx, platform string, offered []string) (store.LaunchRevision, error) {
	def, err := tx.NewestLaunchRevision(ctx, platform, offered)
	if errors.Is(err, store.ErrNotFound) && len(offered) > 0 {
		return tx.NewestLaunchRevision(ctx, platform, nil)
	}
	return def, err
}

// offeredLaunches returns the IDs of the launches that registered hosts
// offer, each once, LOST hosts left out (see platformDefault). A drained
// host's count: the workspaces it holds start there again, bound by their
// start to the default.
func offeredLaunches(ctx context.Context, tx store.Tx) ([]string, error) {
	hosts, err := tx.Hosts(ctx)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, h := range hosts {
		if !h.LostAt.IsZero() {
			continue
		}
		reg, err := decodeHost(h)
		if err != nil {
			return nil, err
		}
		for _, l := range reg.GetLaunches() {
			if id := launchID(l); !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
	}
	return ids, nil
}

// servesLaunch reports whether host h runs the launch a workspace placed
// there binds to (see bindLaunch): the default of platform, or, for a new
// workspace (platform empty), the default of h's preferred launch's
// platform, given the IDs of the launches offered (offeredLaunches). A
// host that registers no launch runs only workspaces bound to none.
func servesLaunch(ctx context.Context, tx store.Tx, h candidate, platform string, offered []string) (bool, error) {
	launches := h.reg.GetLaunches()
	if platform == "" {
		if len(launches) == 0 {
			return true, nil
		}
		platform = launches[0].Platform
	}
	def, err := platformDefault(ctx, tx, platform, offered)
	if errors.Is(err, store.ErrNotFound) {
		return len(launches) == 0, nil
	}
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(launches, func(l *hostv1.Launch) bool { return launchID(l) == def.ID }), nil
}

// launchPlatform is the platform a workspace is on: its bound launch's,
// or its host's preferred launch's; empty when neither names one.
func (s *Service) launchPlatform(ctx context.Context, tx store.Tx, r *record) (string, error) {
	if ref := r.ws.Spec.GetLaunchRef(); ref != "" {
		rev, err := tx.LaunchRevision(ctx, ref)
		return rev.Platform, err
	}
	reg, err := HostRegistration(ctx, tx, r.row.HostID)
	if err != nil || len(reg.GetLaunches()) == 0 {
		return "", err
	}
	return reg.Launches[0].Platform, nil
}
