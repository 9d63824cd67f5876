package workspaces

import (
	"context"
	"fmt"
	"path"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/templates"
	"github.com/kibotos/kibotos/internal/guestabi"
	"github.com/kibotos/kibotos/internal/netcheck"
)

// Resource rules from the reference.
const (
	MiB             = 1 << 20
	MinMemoryBytes  = 128 * MiB
	DefaultCPUMilli = 1000
	// MinCPUMillis is the smallest CPU share a runtime accepts: hosts run
	// a workspace with a CFS period of 100 ms, and the kernel refuses a
	// quota below 1 ms (a hundredth of the period).
	MinCPUMillis = 10
	// MaxPolicyEntries bounds each of a network policy's allow and deny
	// lists: every entry is sent to the host and matched per connection.
	MaxPolicyEntries = 1000
	// MaxDestinations bounds an egress entry's destinations.
	MaxDestinations = 256
)

// knownCapabilities are the capability names the API defines. A host
// offers volume.storage_pool when it reaches a storage pool.
var knownCapabilities = map[string]bool{
	guestabi.CapabilityStoragePool: true, guestabi.CapabilityScreen: true, guestabi.CapabilityInput: true, guestabi.CapabilityGvisor: true,
}

func invalid(format string, a ...any) error {
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(format, a...))
}

// checkResources validates a creation request's resources and fills the
// default CPU.
func checkResources(r *ctrlv1.ResourceRequest) (*ctrlv1.ResourceRequest, error) {
	if r == nil {
		return nil, invalid("spec.resources is required: memory_bytes must be set")
	}
	out := proto.CloneOf(r)
	if out.MemoryBytes%MiB != 0 || out.MemoryBytes < MinMemoryBytes {
		return nil, invalid("spec.resources.memory_bytes %d must be a whole number of MiB and at least 128 MiB", out.MemoryBytes)
	}
	if out.WritableLayerBytes%MiB != 0 {
		return nil, invalid("spec.resources.writable_layer_bytes %d must be a whole number of MiB (0 selects the host's default)", out.WritableLayerBytes)
	}
	switch {
	case out.CpuMillis == 0:
		out.CpuMillis = DefaultCPUMilli
	case out.CpuMillis < MinCPUMillis:
		return nil, invalid("spec.resources.cpu_millis %d is below the minimum of %d (a hundredth of a core); 0 selects %d", out.CpuMillis, MinCPUMillis, DefaultCPUMilli)
	}
	return out, nil
}

// checkCapabilities checks that every required capability is a name the
// API defines; whether a host offers it is placement's question.
func checkCapabilities(c *ctrlv1.CapabilityRequirements) error {
	for _, name := range c.GetRequired() {
		if !knownCapabilities[name] {
			return invalid("spec.capabilities: unknown capability %q", name)
		}
	}
	return nil
}

// checkDisplayCapabilities refuses the capabilities screen and input for
// a template revision that carries no display: hosts offer them only for
// one that does.
func checkDisplayCapabilities(c *ctrlv1.CapabilityRequirements, ref *ctrlv1.TemplateRef, img templates.Image) error {
	if img.Display != nil {
		return nil
	}
	for _, name := range c.GetRequired() {
		if name == guestabi.CapabilityScreen || name == guestabi.CapabilityInput {
			return capabilityError(fmt.Errorf("capability %q needs a template that carries a display; template %q revision %s carries none (the built-in template desktop does)",
				name, ref.GetTemplateId(), ref.GetRevision()))
		}
	}
	return nil
}

// capabilityUnavailable is the refusal of a known capability that no
// host of the deployment offers.
func capabilityUnavailable(name string) error {
	return capabilityError(fmt.Errorf("capability %q is not offered by any host of this deployment", name))
}

// capabilityError is failed_precondition with reason CAPABILITY_UNAVAILABLE.
func capabilityError(cause error) error {
	err := connect.NewError(connect.CodeFailedPrecondition, cause)
	if d, derr := connect.NewErrorDetail(&ctrlv1.ErrorDetail{
		Reason: ctrlv1.FailureReason_FAILURE_REASON_CAPABILITY_UNAVAILABLE,
		Stage:  ctrlv1.FailureStage_FAILURE_STAGE_VALIDATING,
	}); derr == nil {
		err.AddDetail(d)
	}
	return err
}

// DefaultMountPath is where a Volume is mounted when a binding names no
// path.
const DefaultMountPath = "/data"

// checkVolume validates a requested binding and returns it as it is
// stored: mode, path and delete_with_workspace explicit. A NEW request
// comes back NEW, with no volume_id yet; create (CreateWorkspace) decides
// whether NEW is allowed and whether no binding at all means NONE.
func checkVolume(v *ctrlv1.WorkspaceVolumeBinding, create bool) (*ctrlv1.WorkspaceVolumeBinding, error) {
	none := &ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NONE}
	if v == nil {
		if create {
			return none, nil
		}
		return nil, invalid("volume is required: BOUND to a volume_id, or NONE")
	}
	mode := v.GetMode()
	if mode == ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_UNSPECIFIED && create {
		mode = ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NEW
	}
	deleteWith := false
	switch mode {
	case ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NONE:
		if v.VolumeId != "" || v.MountPath != "" || v.DeleteWithWorkspace != nil {
			return nil, invalid("volume: NONE takes no volume_id, mount_path or delete_with_workspace")
		}
		return none, nil
	case ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NEW:
		if !create {
			return nil, invalid("volume: NEW is only accepted by CreateWorkspace; bind an existing volume (BOUND) or NONE")
		}
		if v.VolumeId != "" {
			return nil, invalid("volume: NEW takes no volume_id")
		}
		deleteWith = true
	case ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_BOUND:
		if v.VolumeId == "" {
			return nil, invalid("volume: BOUND requires volume_id")
		}
	default:
		return nil, invalid("volume.mode %d is not a known mode", v.GetMode())
	}
	mountPath, err := checkMountPath(v.MountPath)
	if err != nil {
		return nil, err
	}
	if v.DeleteWithWorkspace != nil {
		deleteWith = v.GetDeleteWithWorkspace()
	}
	return &ctrlv1.WorkspaceVolumeBinding{VolumeId: v.VolumeId, Mode: mode, MountPath: mountPath, DeleteWithWorkspace: &deleteWith}, nil
}

// checkMountPath validates the guest path a Volume is mounted at with the
// runtime's rule (guestabi.CheckVolumePath) and returns it in its clean
// form, as stored; empty selects the default.
func checkMountPath(p string) (string, error) {
	if p == "" {
		return DefaultMountPath, nil
	}
	if !path.IsAbs(p) {
		return "", invalid("volume.mount_path %q must be an absolute guest path", p)
	}
	clean := path.Clean(p)
	if err := guestabi.CheckVolumePath(clean); err != nil {
		if clean != p {
			return "", invalid("volume.mount_path %q is %q once cleaned: %v", p, clean, err)
		}
		return "", invalid("volume.mount_path: %v", err)
	}
	return clean, nil
}

func checkExpiration(p *ctrlv1.WorkspaceExpirationPolicy, now time.Time) error {
	if p == nil {
		return nil
	}
	if p.Deadline == nil {
		return invalid("expiration.deadline is required")
	}
	if !p.Deadline.IsValid() {
		return invalid("expiration.deadline (seconds %d, nanos %d) is not a valid timestamp: one from 0001-01-01 to 9999-12-31 UTC, with nanos from 0 to 999,999,999",
			p.Deadline.Seconds, p.Deadline.Nanos)
	}
	switch p.Action {
	case ctrlv1.WorkspaceExpirationAction_WORKSPACE_EXPIRATION_ACTION_STOP, ctrlv1.WorkspaceExpirationAction_WORKSPACE_EXPIRATION_ACTION_DELETE:
	default:
		return invalid("expiration.action must be STOP or DELETE")
	}
	if !p.Deadline.AsTime().After(now) {
		return invalid("expiration.deadline %s is not in the future", p.Deadline.AsTime().Format(time.RFC3339))
	}
	return nil
}

// checkPolicy validates a network policy's content and returns it
// normalized (unspecified mode = DENY_ALL) with the references it holds.
// References to Egresses and Resolvers are checked in tx.
//
// The special-purpose check of direct resolver upstreams may resolve a
// hostname, so it is not done here, inside a transaction:
// checkDirectUpstreams does it before.
func checkPolicy(ctx context.Context, tx store.Tx, projectID string, p *ctrlv1.NetworkPolicy) (*ctrlv1.NetworkPolicy, []store.PolicyReference, error) {
	out := &ctrlv1.NetworkPolicy{Mode: p.GetMode(), Allow: p.GetAllow(), Deny: p.GetDeny(), Egresses: p.GetEgresses(), Resolvers: p.GetResolvers()}
	switch out.Mode {
	case ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_UNSPECIFIED:
		out.Mode = ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_DENY_ALL
	case ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_DENY_ALL, ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET:
	default:
		return nil, nil, invalid("network_policy.mode %d is not a known mode", out.Mode)
	}
	if out.Mode == ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_DENY_ALL &&
		len(out.Allow)+len(out.Deny)+len(out.Egresses)+len(out.Resolvers) > 0 {
		return nil, nil, invalid("network_policy: DENY_ALL accepts no allow, deny, egresses or resolvers entries")
	}
	for _, l := range []struct {
		field string
		list  []string
	}{{"allow", out.Allow}, {"deny", out.Deny}} {
		field, list := l.field, l.list
		if len(list) > MaxPolicyEntries {
			return nil, nil, invalid("network_policy.%s has %d entries, more than the limit of %d", field, len(list), MaxPolicyEntries)
		}
		for i, e := range list {
			if _, err := netcheck.CanonicalPrefix(e); err != nil {
				return nil, nil, invalid("network_policy.%s[%d]: %v", field, i, err)
			}
		}
	}
	if len(out.Egresses) > 1 {
		return nil, nil, invalid("network_policy.egresses: at most one entry is accepted")
	}
	if len(out.Resolvers) > 1 {
		return nil, nil, invalid("network_policy.resolvers: at most one entry is accepted")
	}
	var refs []store.PolicyReference
	listed := map[string]*ctrlv1.EgressSpec{}
	for _, e := range out.Egresses {
		if n := len(e.Destinations); n < 1 || n > MaxDestinations {
			return nil, nil, invalid("network_policy.egresses: destinations has %d entries; it must have 1 to %d", n, MaxDestinations)
		}
		for i, d := range e.Destinations {
			if _, err := netcheck.CanonicalPrefix(d); err != nil {
				return nil, nil, invalid("network_policy.egresses.destinations[%d]: %v", i, err)
			}
		}
		spec := new(ctrlv1.EgressSpec)
		if err := loadLive(ctx, tx, store.KindEgress, projectID, e.EgressId, "Egress", spec); err != nil {
			return nil, nil, err
		}
		listed[e.EgressId] = spec
		refs = append(refs, store.PolicyReference{Kind: store.RefEgress, TargetID: e.EgressId})
	}
	for _, r := range out.Resolvers {
		spec := new(ctrlv1.ResolverSpec)
		if err := loadLive(ctx, tx, store.KindResolver, projectID, r.ResolverId, "Resolver", spec); err != nil {
			return nil, nil, err
		}
		refs = append(refs, store.PolicyReference{Kind: store.RefResolver, TargetID: r.ResolverId})
		switch path := r.GetPath().GetKind().(type) {
		case *ctrlv1.ResolverPath_EgressId:
			eg, ok := listed[path.EgressId]
			if !ok {
				return nil, nil, invalid("network_policy.resolvers: path egress %q must be listed in the same policy's egresses", path.EgressId)
			}
			if spec.GetUdp() != nil {
				if !eg.GetUdpEnabled() {
					return nil, nil, invalid("network_policy.resolvers: udp Resolver %q needs Egress %q to have udp_enabled", r.ResolverId, path.EgressId)
				}
				refs = append(refs, store.PolicyReference{Kind: store.RefEgressUDP, TargetID: path.EgressId})
			}
		case *ctrlv1.ResolverPath_Direct:
		default:
			return nil, nil, invalid("network_policy.resolvers: path is required (direct or egress_id)")
		}
	}
	return out, refs, nil
}

// checkDirectUpstreams refuses a policy whose resolver on the direct path
// has its upstream in a fixed special-purpose range. It reads the
// Resolvers in its own transaction and resolves hostnames outside any.
func checkDirectUpstreams(ctx context.Context, st store.Store, checker *netcheck.Checker, projectID string, p *ctrlv1.NetworkPolicy) error {
	var addrs map[string]string // resolver ID → upstream
	err := st.View(ctx, func(tx store.Tx) error {
		addrs = map[string]string{}
		for _, r := range p.GetResolvers() {
			if r.GetPath().GetDirect() == nil {
				continue
			}
			spec := new(ctrlv1.ResolverSpec)
			if err := loadLive(ctx, tx, store.KindResolver, projectID, r.ResolverId, "Resolver", spec); err != nil {
				return err
			}
			if addr := directUpstream(spec); addr != "" {
				addrs[r.ResolverId] = addr
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for id, addr := range addrs {
		if err := checker.CheckDirect(ctx, addr); err != nil {
			return invalid("network_policy.resolvers: direct path to Resolver %q: %v", id, err)
		}
	}
	return nil
}

// directUpstream returns the host:port a Resolver's queries go to.
func directUpstream(spec *ctrlv1.ResolverSpec) string {
	switch {
	case spec.GetUdp() != nil:
		return spec.GetUdp().Address
	case spec.GetTcp() != nil:
		return spec.GetTcp().Address
	case spec.GetTls() != nil:
		return spec.GetTls().Address
	}
	return "" // https: the URL's host is checked on every dial
}

// loadLive reads a live object's spec; missing or deleted is not_found.
func loadLive(ctx context.Context, tx store.Tx, kind store.Kind, projectID, id, noun string, spec proto.Message) error {
	o, err := liveSpec(ctx, tx, kind, projectID, id, spec)
	if err == nil && o == nil {
		err = connect.NewError(connect.CodeNotFound, fmt.Errorf("%s %q not found", noun, id))
	}
	return err
}
