// Package store defines the control plane's durable state: the records ctrl
// keeps and the one Store interface that the SQLite (embedded) and PostgreSQL
// (multi-node) backends implement. The storetest package holds the single
// suite both must pass.
//
// The store does not interpret resource content: specs are opaque bytes and
// every rule about them lives in the services above. What it guarantees is
// transactional: everything one Update does commits or rolls back together,
// so a command's change and its idempotency record are never apart.
package store

import (
	"context"
	"errors"
	"time"
)

var (
	// ErrNotFound is returned when a record does not exist.
	ErrNotFound = errors.New("store: not found")
	// ErrExists is returned when a record with the same key already exists.
	ErrExists = errors.New("store: already exists")
	// ErrFull is returned by an Update the database could not store for
	// want of disk space.
	ErrFull = errors.New("store: the database's disk is full")
	// ErrUnavailable is returned by a call that could not reach the
	// database (a server that is down or restarting): the same call may
	// succeed later.
	ErrUnavailable = errors.New("store: the database does not answer")
)

// Store is the control plane's database.
type Store interface {
	// Update runs fn in a read-write transaction and commits when fn returns
	// nil; it returns once the commit is durable. A backend may run
	// concurrent Updates in one transaction, each in a savepoint (group
	// commit): an fn that fails rolls back its own work alone. Transactions are serializable: when one loses a race with a
	// concurrent one (a serialization failure, or ErrExists from a key that
	// a concurrent transaction inserted first), fn runs again from the start
	// on fresh state, a bounded number of times. fn must therefore keep its
	// effects inside tx.
	Update(ctx context.Context, fn func(Tx) error) error
	// View runs fn in a read-only transaction that sees one snapshot.
	View(ctx context.Context, fn func(Tx) error) error
	// ViewCached is View for a read that a backend may serve, in part or
	// whole, from records it keeps in memory (Object and Workspace, the
	// reads by ID). fn still sees one moment, but it may run more than
	// once to do so, as Update's may, so it must set, not accumulate, what
	// it returns.
	ViewCached(ctx context.Context, fn func(Tx) error) error
	// Close releases the database.
	Close() error
}

// Tx is one transaction. Methods return ErrNotFound or ErrExists as their
// doc says; any other error is the database's.
type Tx interface {
	// Setting returns a deployment-wide value, or ErrNotFound.
	Setting(ctx context.Context, key string) ([]byte, error)
	// PutSetting stores a deployment-wide value, replacing an existing one.
	PutSetting(ctx context.Context, key string, value []byte) error

	// CreateProject stores a new project; ErrExists if the ID or name is taken.
	CreateProject(ctx context.Context, p Project) error
	// Project returns a project, or ErrNotFound.
	Project(ctx context.Context, id string) (Project, error)
	// Projects returns every project ordered by ID.
	Projects(ctx context.Context) ([]Project, error)

	// CreateToken stores a new API token; ErrExists if the ID is taken.
	CreateToken(ctx context.Context, t Token) error
	// Token returns a token, revoked ones included, or ErrNotFound.
	Token(ctx context.Context, id string) (Token, error)
	// Tokens returns the tokens of a project ordered by ID.
	Tokens(ctx context.Context, projectID string) ([]Token, error)
	// RevokeToken marks a token revoked at the given time; ErrNotFound if
	// it does not exist. Revoking a revoked token keeps the first time.
	RevokeToken(ctx context.Context, id string, at time.Time) error

	// CreateHostToken stores a new host token; ErrExists if the ID is taken.
	CreateHostToken(ctx context.Context, t HostToken) error
	// HostToken returns a host token, revoked ones included, or ErrNotFound.
	HostToken(ctx context.Context, id string) (HostToken, error)
	// HostTokens returns every host token ordered by ID.
	HostTokens(ctx context.Context) ([]HostToken, error)
	// RevokeHostToken marks a host token revoked at the given time;
	// ErrNotFound if it does not exist. Revoking again keeps the first time.
	RevokeHostToken(ctx context.Context, id string, at time.Time) error

	// Command returns the record of an executed command, or ErrNotFound.
	Command(ctx context.Context, projectID, commandID string) (Command, error)
	// PutCommand records an executed command; ErrExists if the project
	// already has a command with this ID.
	PutCommand(ctx context.Context, c Command) error
	// PruneCommands deletes up to limit command records created before
	// the given time, oldest first, and returns how many it deleted.
	PruneCommands(ctx context.Context, before time.Time, limit int) (int, error)
	// PruneDeleted deletes up to limit rows of what ended before the given
	// time, oldest first within each kind, and returns how many it
	// deleted: workspaces, Volumes, Transfers and objects deleted,
	// exposures ended, API and host tokens revoked. Each goes with the
	// rows keyed by its ID (its labels, a template's revisions, a
	// workspace's policy references, exposures and sessions); reading it
	// again is ErrNotFound. Live rows, projects and hosts stay.
	PruneDeleted(ctx context.Context, before time.Time, limit int) (int, error)

	// CreateObject stores a new object; ErrExists if the ID is taken.
	CreateObject(ctx context.Context, o Object) error
	// Object returns an object of the kind in the project, deleted ones
	// included (DeletedAt set), or ErrNotFound.
	Object(ctx context.Context, kind Kind, projectID, id string) (Object, error)
	// UpdateObject replaces every mutable field of an existing object (spec,
	// revisions, labels, annotations, timestamps, deletion); ErrNotFound if
	// it does not exist.
	UpdateObject(ctx context.Context, o Object) error
	// Objects returns live objects of q.Kind in q.ProjectID whose ID sorts
	// after q.After and whose labels carry every entry of q.Selector, in ID
	// order, at most q.Limit of them.
	Objects(ctx context.Context, q ObjectQuery) ([]Object, error)
	// DeletedObjects returns the IDs of the objects of kind (any project)
	// deleted after since, in ID order.
	DeletedObjects(ctx context.Context, kind Kind, since time.Time) ([]string, error)

	// SetPolicyReferences replaces the references a workspace's network
	// policy holds; an empty list removes them (as deleting the workspace
	// must).
	SetPolicyReferences(ctx context.Context, projectID, workspaceID string, refs []PolicyReference) error
	// ReferencingWorkspaces returns up to limit IDs, in order, of workspaces
	// in the project whose policy holds ref.
	ReferencingWorkspaces(ctx context.Context, projectID string, ref PolicyReference, limit int) ([]string, error)

	WorkspaceTx
	VolumeTx
	SessionTx
	ExposureTx
	TransferTx
}

// Project is a tenant: every resource and token belongs to exactly one.
type Project struct {
	ID   string
	Name string
	// Operator marks the deployment's own project, whose admins manage
	// every project.
	Operator  bool
	CreatedAt time.Time
}

// Token is an API token. Only a hash of its secret is kept.
type Token struct {
	ID         string
	ProjectID  string
	Role       string
	Name       string
	SecretHash []byte
	CreatedAt  time.Time
	// RevokedAt is zero while the token is valid.
	RevokedAt time.Time
}

// HostToken is what a host agent authenticates with. Only a hash of its
// secret is kept.
type HostToken struct {
	ID         string
	Name       string
	SecretHash []byte
	CreatedAt  time.Time
	// RevokedAt is zero while the token is valid.
	RevokedAt time.Time
	// HostIDs are the only host IDs the token may register, sorted,
	// unless AnyHost.
	HostIDs []string
	// AnyHost tokens may register a host of any ID.
	AnyHost bool
}

// Command is the idempotency record of one executed command: a replay with
// the same method and request hash gets Response back byte for byte.
type Command struct {
	ProjectID   string
	CommandID   string
	Method      string
	RequestHash []byte
	Response    []byte
	CreatedAt   time.Time
}

// Kind names a kind of object.
type Kind string

// Object kinds.
const (
	KindEgress   Kind = "egress"
	KindResolver Kind = "resolver"
	KindTemplate Kind = "template"
)

// Object is a project-owned resource with an opaque spec under a revision,
// and caller-owned labels and annotations under revisions of their own.
type Object struct {
	Kind      Kind
	ProjectID string
	ID        string
	// Spec is the serialized content; the store never reads it.
	Spec     []byte
	Revision uint64
	// DrainSeconds is the drain the change to Revision gave the connections
	// of the revision before it.
	DrainSeconds        uint32
	Labels              map[string]string
	LabelsRevision      uint64
	Annotations         map[string]string
	AnnotationsRevision uint64
	CreatedAt           time.Time
	UpdatedAt           time.Time
	// DeletedAt is zero while the object is live.
	DeletedAt time.Time
}

// Deleted reports whether the object has been deleted.
func (o Object) Deleted() bool { return !o.DeletedAt.IsZero() }

// ObjectQuery selects one page of objects.
type ObjectQuery struct {
	Kind      Kind
	ProjectID string
	After     string
	Selector  map[string]string
	Limit     int
}

// RefKind is how a workspace's network policy uses an object.
type RefKind string

// Reference kinds.
const (
	// RefEgress: the policy lists the Egress in its egresses.
	RefEgress RefKind = "egress"
	// RefEgressUDP: the policy sends a udp Resolver's queries through the
	// Egress, which therefore must keep udp_enabled.
	RefEgressUDP RefKind = "egress_udp"
	// RefResolver: the policy lists the Resolver in its resolvers.
	RefResolver RefKind = "resolver"
)

// PolicyReference is one use of an object by a workspace's network policy.
type PolicyReference struct {
	Kind     RefKind
	TargetID string
}

// WorkspaceTx is the part of a transaction that keeps workspaces, their
// templates and the hosts that run them.
type WorkspaceTx interface {
	// CreateWorkspace stores a new workspace; ErrExists if the ID is taken.
	CreateWorkspace(ctx context.Context, w Workspace) error
	// Workspace returns a workspace, deleted ones included, or ErrNotFound.
	Workspace(ctx context.Context, projectID, id string) (Workspace, error)
	// UpdateWorkspace replaces every mutable field; ErrNotFound if missing.
	UpdateWorkspace(ctx context.Context, w Workspace) error
	// Workspaces returns one page of live workspaces, like Objects.
	Workspaces(ctx context.Context, q ObjectQuery) ([]Workspace, error)
	// HostWorkspaces returns every live workspace placed on a host.
	HostWorkspaces(ctx context.Context, hostID string) ([]Workspace, error)
	// HostWorkspacesByID returns the live workspaces placed on a host
	// whose IDs are among ids.
	HostWorkspacesByID(ctx context.Context, hostID string, ids []string) ([]Workspace, error)
	// WorkspacesByID returns the workspaces of the IDs in any project,
	// deleted ones included, ordered by ID; an ID of no workspace is left
	// out.
	WorkspacesByID(ctx context.Context, ids []string) ([]Workspace, error)
	// HostUsage sums what the live workspaces placed on a host hold, as
	// HostWorkspaces would give them, without reading them.
	HostUsage(ctx context.Context, hostID string) (HostUsage, error)
	// ExpiredWorkspaces returns up to limit live workspaces whose
	// expiration deadline is at or before now.
	ExpiredWorkspaces(ctx context.Context, now time.Time, limit int) ([]Workspace, error)
	// TemplateUsers returns up to limit IDs of live workspaces in the
	// project created from the template.
	TemplateUsers(ctx context.Context, projectID, templateID string, limit int) ([]string, error)

	// PutTemplateRevision stores an imported template revision; ErrExists
	// if the template already has it.
	PutTemplateRevision(ctx context.Context, r TemplateRevision) error
	// TemplateRevisions returns a template's revisions, oldest first.
	TemplateRevisions(ctx context.Context, projectID, templateID string) ([]TemplateRevision, error)

	// PutHost stores or replaces a host's registration (body, capacity,
	// SeenAt); a registered host keeps its LostAt and Drained.
	PutHost(ctx context.Context, h Host) error
	// UpdateHost replaces a registered host's SeenAt, LostAt and Drained;
	// ErrNotFound if no host has the ID.
	UpdateHost(ctx context.Context, h Host) error
	// Hosts returns every registered host ordered by ID.
	Hosts(ctx context.Context) ([]Host, error)

	// PutLaunchRevision stores a launch revision unless one with its ID
	// exists, and reports whether it stored it: a revision is immutable.
	PutLaunchRevision(ctx context.Context, l LaunchRevision) (bool, error)
	// LaunchRevision returns a launch revision or ErrNotFound.
	LaunchRevision(ctx context.Context, id string) (LaunchRevision, error)
	// NewestLaunchRevision returns the launch revision of the platform
	// stored last among the IDs given (among all when none is), or
	// ErrNotFound when there is none.
	NewestLaunchRevision(ctx context.Context, platform string, among []string) (LaunchRevision, error)
}

// Workspace is one workspace's row. Body is the serialized API resource,
// which the store never reads; the other fields are what queries select
// and placement sums.
type Workspace struct {
	ProjectID string
	ID        string
	// TemplateID names the template it was created from.
	TemplateID string
	Body       []byte
	Labels     map[string]string
	// HostID is the host the workspace is placed on; empty before
	// placement.
	HostID string
	// Reserved capacity on HostID.
	CPUMillis   uint32
	MemoryBytes uint64
	LayerBytes  uint64
	// Running is true while the workspace wants an execution (its CPU and
	// memory count against the host).
	Running bool
	// ExpiresAt is the expiration deadline; zero when none.
	ExpiresAt time.Time
	CreatedAt time.Time
	UpdatedAt time.Time
	// DeletedAt is zero until the workspace is DELETED.
	DeletedAt time.Time
}

// TemplateRevision is one immutable imported revision of a template.
// Templates themselves are Objects of KindTemplate whose ID is the
// caller-chosen template ID.
type TemplateRevision struct {
	ProjectID  string
	TemplateID string
	Revision   string
	// Body is the serialized revision (image, layers), opaque here.
	Body      []byte
	CreatedAt time.Time
}

// LaunchRevision is one exact, immutable launch a host registered.
type LaunchRevision struct {
	// ID is derived from the launch's content.
	ID string
	// Platform is the platform key, such as oci-runc/amd64.
	Platform string
	// Body is the serialized launch, opaque here.
	Body      []byte
	CreatedAt time.Time
}

// HostUsage is what the live workspaces placed on a host hold: placement
// reserves the layer bytes of every one and the CPU and memory of the
// running ones.
type HostUsage struct {
	Workspaces int
	LayerBytes uint64
	// CPUMillis and MemoryBytes are the sums over the running ones.
	CPUMillis   uint64
	MemoryBytes uint64
}

// Host is a registered host and its capacity.
type Host struct {
	ID string
	// Body is the serialized registration, opaque here.
	Body        []byte
	CPUMillis   uint32
	MemoryBytes uint64
	LayerBytes  uint64
	// SeenAt is when the host last registered or reported.
	SeenAt time.Time
	// LostAt is when ctrl found the host's lease run out; zero while the
	// host reports.
	LostAt time.Time
	// Drained hosts take no new placements.
	Drained bool
	// TokenID is the host token the host registered with; PutHost keeps
	// the one stored when it is empty.
	TokenID string
}

// VolumeTx is the part of a transaction that keeps Volumes.
type VolumeTx interface {
	// CreateVolume stores a new volume; ErrExists if the ID is taken.
	CreateVolume(ctx context.Context, v Volume) error
	// Volume returns a volume of the project, deleted ones included (with
	// their labels), or ErrNotFound.
	Volume(ctx context.Context, projectID, id string) (Volume, error)
	// UpdateVolume replaces every mutable field (body, labels, host, pool,
	// workspace, updated_at, deleted_at); ErrNotFound if missing.
	UpdateVolume(ctx context.Context, v Volume) error
	// Volumes returns one page of live volumes, like Objects.
	Volumes(ctx context.Context, q ObjectQuery) ([]Volume, error)
	// HostVolumes returns every live volume (any project) held by a host,
	// in ID order.
	HostVolumes(ctx context.Context, hostID string) ([]Volume, error)
	// PoolVolumes returns every live volume (any project) in a storage
	// pool, in ID order.
	PoolVolumes(ctx context.Context, pool string) ([]Volume, error)
}

// Volume is one Volume's row. Body is the serialized API resource and
// ctrl's bookkeeping, which the store never reads; the other fields are
// what queries select.
type Volume struct {
	ProjectID string
	ID        string
	Body      []byte
	Labels    map[string]string
	// HostID is the host that holds the volume (manages its image); empty
	// when none does.
	HostID string
	// Pool is the storage pool the volume lives in.
	Pool string
	// WorkspaceID is the undeleted workspace bound to the volume; empty
	// when it is free.
	WorkspaceID string
	CreatedAt   time.Time
	UpdatedAt   time.Time
	// DeletedAt is zero until the volume is DELETED.
	DeletedAt time.Time
}

// SessionTx is the part of a transaction that indexes issued data-plane
// sessions, so that a session can be found by its ID alone. A session's
// authorization state (its workspace's key and revocations) is kept with
// the workspace, not here.
type SessionTx interface {
	// CreateSession indexes a new session; ErrExists if the project already
	// has a session with this ID.
	CreateSession(ctx context.Context, s Session) error
	// Session returns a session of the project, or ErrNotFound.
	Session(ctx context.Context, projectID, id string) (Session, error)
	// DeleteSessions deletes up to limit sessions that expired before
	// before, oldest first, and returns how many it deleted.
	DeleteSessions(ctx context.Context, before time.Time, limit int) (int, error)
	// TokenSessions returns the sessions an API token issued (any
	// project) that expire after expiringAfter, by project and ID.
	TokenSessions(ctx context.Context, tokenID string, expiringAfter time.Time) ([]Session, error)
}

// Session is one issued data-plane session.
type Session struct {
	ProjectID   string
	ID          string
	WorkspaceID string
	// Generation is the workspace generation the session was issued for.
	Generation uint64
	ExpiresAt  time.Time
	CreatedAt  time.Time
	// TokenID is the API token that issued it; empty for a session issued
	// before the store kept it.
	TokenID string
}

// ExposureTx is the part of a transaction that keeps the exposures of
// guest ports. An exposure is live until it ends (revoked, or ended with
// its workspace's execution); ended rows stay as tombstones.
type ExposureTx interface {
	// CreateExposure stores a new live exposure; ErrExists if the ID is
	// taken or a live exposure of the workspace already has the port.
	CreateExposure(ctx context.Context, e Exposure) error
	// Exposure returns an exposure of the project, ended ones included, or
	// ErrNotFound.
	Exposure(ctx context.Context, projectID, id string) (Exposure, error)
	// EndExposure marks a live exposure of the project ended at the given
	// time; ErrNotFound if it does not exist, nothing when it already ended.
	EndExposure(ctx context.Context, projectID, id string, at time.Time) error
	// WorkspaceExposures returns the live exposures of a workspace of the
	// project whose ID sorts after after, in ID order, at most limit of
	// them (0: all).
	WorkspaceExposures(ctx context.Context, projectID, workspaceID, after string, limit int) ([]Exposure, error)
	// HostExposures returns the live exposures of the workspaces placed
	// on a host and not deleted, by workspace ID and then ID.
	HostExposures(ctx context.Context, hostID string) ([]Exposure, error)
	// EndWorkspaceExposures ends the live exposures of a workspace of the
	// project that are not persistent, and the persistent ones too when
	// persistent is true, and returns how many it ended.
	EndWorkspaceExposures(ctx context.Context, projectID, workspaceID string, persistent bool, at time.Time) (int, error)
}

// Exposure is one exposure's row. Body is the serialized exposure (the
// API resource and its token's hash), which the store never reads; the
// other fields are what queries select.
type Exposure struct {
	ProjectID   string
	ID          string
	WorkspaceID string
	Port        uint32
	// Persistent exposures outlive a stop of their workspace.
	Persistent bool
	Body       []byte
	CreatedAt  time.Time
	// EndedAt is zero while the exposure is live.
	EndedAt time.Time
}

// TransferTx is the part of a transaction that keeps Transfers.
type TransferTx interface {
	// CreateTransfer stores a new transfer; ErrExists if the ID is taken.
	CreateTransfer(ctx context.Context, t Transfer) error
	// Transfer returns a transfer of the project, deleted ones included
	// (with their labels), or ErrNotFound.
	Transfer(ctx context.Context, projectID, id string) (Transfer, error)
	// TransferByID returns a transfer of any project by its ID, deleted
	// ones included, or ErrNotFound; for the collection of artifacts,
	// which are stored by transfer ID.
	TransferByID(ctx context.Context, id string) (Transfer, error)
	// UpdateTransfer replaces every mutable field (body, labels, host,
	// pending, expires_at, updated_at, deleted_at); ErrNotFound if missing.
	UpdateTransfer(ctx context.Context, t Transfer) error
	// Transfers returns one page of live transfers, like Objects.
	Transfers(ctx context.Context, q ObjectQuery) ([]Transfer, error)
	// HostTransfers returns every live transfer (any project) assigned to a
	// host, in ID order.
	HostTransfers(ctx context.Context, hostID string) ([]Transfer, error)
	// PendingTransfers returns up to limit live transfers (any project)
	// that wait for work, in ID order.
	PendingTransfers(ctx context.Context, limit int) ([]Transfer, error)
	// ExpiredTransfers returns up to limit live transfers (any project)
	// whose expires_at is at or before now.
	ExpiredTransfers(ctx context.Context, now time.Time, limit int) ([]Transfer, error)
}

// Transfer is one Transfer's row. Body is the serialized API resource and
// ctrl's bookkeeping, which the store never reads; the other fields are
// what queries select.
type Transfer struct {
	ProjectID string
	ID        string
	Body      []byte
	Labels    map[string]string
	// HostID is the host an export is assigned to; empty otherwise.
	HostID string
	// Pending is true while the transfer waits for work.
	Pending bool
	// ExpiresAt is when the artifact is deleted; zero when it never is
	// (or no longer needs to be).
	ExpiresAt time.Time
	CreatedAt time.Time
	UpdatedAt time.Time
	// DeletedAt is zero until the transfer is DELETED.
	DeletedAt time.Time
}
