// Command kibotos-server is the whole of Kibotos: `up` runs the embedded
// deployment, `ctrl` the control plane alone, `host` a host agent, and the
// other verbs are the CLI. The kibotos command (cmd/kibotos), the CLI
// alone, runs it in its own place for `kibotos up`, `ctrl` and `host`: the
// server's packages, whose initialisation costs every start, stay out of
// the CLI.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/spf13/cobra"

	"github.com/kibotos/kibotos/internal/cli"
	"github.com/kibotos/kibotos/internal/config"
	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/command"
	"github.com/kibotos/kibotos/internal/ctrl/transfers"
	"github.com/kibotos/kibotos/internal/ctrl/workspaces"
	"github.com/kibotos/kibotos/internal/daemon"
	"github.com/kibotos/kibotos/internal/host/agent"
	"github.com/kibotos/kibotos/internal/host/netslot"
	"github.com/kibotos/kibotos/internal/host/psi"
	"github.com/kibotos/kibotos/internal/host/runtime/oci"
	"github.com/kibotos/kibotos/internal/imagestore"
	"github.com/kibotos/kibotos/internal/logging"
	"github.com/kibotos/kibotos/internal/netcheck"
)

func main() {
	cli.Main(rootCommand())
}

// rootCommand is the whole of kibotos: the server verbs and the CLI.
func rootCommand() *cobra.Command {
	return cli.Root(upCommand(), ctrlCommand(), hostCommand())
}

// serveFlags are the flags `up` and `ctrl` share.
type serveFlags struct {
	commonFlags
	blobs        string
	transferTTL  time.Duration
	desktopCache string
	insecure     []string
	registryCA   string
	pprofListen  string
	otlp         string
	authCache    time.Duration
	retention    time.Duration
	hostLease    time.Duration
}

// commonFlags are the flags of every server command, `up`, `ctrl` and
// `host`: its listener, its logging, its unsafe exempt ranges and the
// config file that may set all of its flags.
type commonFlags struct {
	listen       string
	publicURL    string
	tlsCert      string
	tlsKey       string
	metricsToken string
	exempt       string
	logFormat    string
	logLevel     string
	config       string
}

func (f *commonFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.listen, "listen", daemon.DefaultListen, "address to serve on")
	cmd.Flags().StringVar(&f.publicURL, "public-url", os.Getenv("KIBOTOS_PUBLIC_URL"),
		"the URL callers use to reach this listener, such as https://kibotos.example.com (default: http:// (https:// with --tls-cert) and the --listen address, an unspecified one replaced by the host name; env KIBOTOS_PUBLIC_URL)")
	cmd.Flags().StringVar(&f.tlsCert, "tls-cert", os.Getenv("KIBOTOS_TLS_CERT"),
		"PEM certificate (chain) the listener serves TLS with, with --tls-key (env KIBOTOS_TLS_CERT)")
	cmd.Flags().StringVar(&f.tlsKey, "tls-key", os.Getenv("KIBOTOS_TLS_KEY"), "PEM private key of --tls-cert (env KIBOTOS_TLS_KEY)")
	cmd.Flags().StringVar(&f.metricsToken, "metrics-token-file", os.Getenv("KIBOTOS_METRICS_TOKEN_FILE"),
		"a file holding the bearer token GET /metrics requires (default: none, the metrics are open to whoever reaches --listen; env KIBOTOS_METRICS_TOKEN_FILE)")
	cmd.Flags().StringVar(&f.exempt, "unsafe-exempt-ranges", os.Getenv("KIBOTOS_UNSAFE_EXEMPT_RANGES"),
		"UNSAFE, for local testing only: comma-separated CIDRs exempt from the special-purpose and hard-deny checks (env KIBOTOS_UNSAFE_EXEMPT_RANGES)")
	cmd.Flags().StringVar(&f.logFormat, "log-format", envOr("KIBOTOS_LOG_FORMAT", logging.FormatText), "log format on stderr: text or json (env KIBOTOS_LOG_FORMAT)")
	cmd.Flags().StringVar(&f.logLevel, "log-level", envOr("KIBOTOS_LOG_LEVEL", "info"), "least level logged: debug, info, warn or error; debug adds a line per host-agent call (env KIBOTOS_LOG_LEVEL)")
	cmd.Flags().StringVar(&f.config, config.FlagName, os.Getenv("KIBOTOS_CONFIG"),
		"YAML file of settings, keyed by flag name (listen: ..., log-format: json); flags given here override it (env KIBOTOS_CONFIG)")
	// The file is read before the command runs, so that its settings reach
	// every flag.
	cmd.PreRunE = func(cmd *cobra.Command, _ []string) error {
		if f.config == "" {
			return nil
		}
		return config.Apply(cmd.Flags(), f.config)
	}
}

// options checks the flags, installs the logger they ask for and sets the
// rest on o.
func (f *commonFlags) options(o daemon.Options) (daemon.Options, error) {
	logger, err := logging.New(os.Stderr, f.logFormat, f.logLevel)
	if err != nil {
		return o, err
	}
	slog.SetDefault(logger)
	exempt, err := netcheck.ParseExemptRanges(f.exempt)
	if err != nil {
		return o, fmt.Errorf("--unsafe-exempt-ranges: %w", err)
	}
	o.UnsafeExemptRanges = exempt
	o.Listen, o.PublicURL, o.TLSCert, o.TLSKey, o.MetricsTokenFile, o.Out = f.listen, f.publicURL, f.tlsCert, f.tlsKey, f.metricsToken, os.Stdout
	return o, nil
}

func (f *serveFlags) register(cmd *cobra.Command) {
	f.commonFlags.register(cmd)
	cmd.Flags().DurationVar(&f.hostLease, "host-lease", workspaces.DefaultHostLease,
		"how long a host may stay silent before it is LOST and its workspaces and volumes UNKNOWN")
	desktopCache, set := os.LookupEnv("KIBOTOS_DESKTOP_CACHE")
	if !set {
		desktopCache = imagestore.DesktopCacheDir
	}
	cmd.Flags().StringVar(&f.desktopCache, "desktop-cache", desktopCache,
		"directory of the built-in template desktop's image, built there on the first start (minutes) and kept; empty: no desktop template (env KIBOTOS_DESKTOP_CACHE)")
	cmd.Flags().StringVar(&f.blobs, "blobs", os.Getenv("KIBOTOS_BLOBS"),
		"blob store of transfer artifacts: s3://BUCKET?region=...&endpoint=..., file:///DIR (default: HOME/blobs; env KIBOTOS_BLOBS)")
	cmd.Flags().DurationVar(&f.transferTTL, "transfer-ttl", transfers.DefaultTTL, "how long a transfer's artifact is kept before it EXPIRES")
	cmd.Flags().StringVar(&f.pprofListen, "pprof-listen", os.Getenv("KIBOTOS_PPROF_LISTEN"),
		"serve Go's profiles (net/http/pprof, /debug/pprof/) on this loopback address, such as 127.0.0.1:6060 (default: off; env KIBOTOS_PPROF_LISTEN)")
	cmd.Flags().StringVar(&f.otlp, "otlp-endpoint", os.Getenv("KIBOTOS_OTLP_ENDPOINT"),
		"export a trace span of every API call over OTLP/HTTP to this collector, such as http://127.0.0.1:4318 (path /v1/traces unless the URL has one; default: off; env KIBOTOS_OTLP_ENDPOINT)")
	cmd.Flags().StringArrayVar(&f.insecure, "insecure-registry", envList("KIBOTOS_INSECURE_REGISTRIES"),
		"a registry, HOST[:PORT] as image references name it, that template imports reach over plain HTTP; repeatable (default: none, every registry over HTTPS; env KIBOTOS_INSECURE_REGISTRIES, comma-separated)")
	cmd.Flags().StringVar(&f.registryCA, "registry-ca-file", os.Getenv("KIBOTOS_REGISTRY_CA_FILE"),
		"PEM certificate authorities that template imports trust, beside the system's, for registries whose certificates a private authority signed (env KIBOTOS_REGISTRY_CA_FILE)")
	cmd.Flags().DurationVar(&f.authCache, "auth-cache-ttl", auth.DefaultCacheTTL,
		"how long an authenticated API token is trusted without reading the store again: a revoked token is refused by every call that starts this long after the revocation (0: read the store on every call)")
	cmd.Flags().DurationVar(&f.retention, "command-retention", command.DefaultRetention,
		"how long a command's record, and a deleted resource's, is kept: a retry within it replays the first answer, after it the same command_id runs as a new command and the deleted resource is not_found (at least 1h)")
}

func (f *serveFlags) options(o daemon.Options) (daemon.Options, error) {
	o, err := f.commonFlags.options(o)
	if err != nil {
		return o, err
	}
	o.PprofListen, o.OTLPEndpoint = f.pprofListen, f.otlp
	if f.transferTTL <= 0 {
		return o, fmt.Errorf("--transfer-ttl %s must be positive", f.transferTTL)
	}
	if f.hostLease < time.Second {
		return o, fmt.Errorf("--host-lease %s: want at least 1s", f.hostLease)
	}
	o.HostLease = f.hostLease
	o.BlobsURL, o.TransferTTL = f.blobs, f.transferTTL
	o.DesktopCache = f.desktopCache
	for _, r := range f.insecure {
		if _, err := name.NewRegistry(r, name.StrictValidation); err != nil || strings.ContainsAny(r, "/@") {
			return o, fmt.Errorf("--insecure-registry %q: want HOST[:PORT], such as 127.0.0.1:5000", r)
		}
	}
	o.InsecureRegistries = f.insecure
	o.RegistryCAFile = f.registryCA
	if f.retention < command.MinRetention {
		return o, fmt.Errorf("--command-retention %s: want at least %s, the longest drain of a deleted Egress", f.retention, command.MinRetention)
	}
	o.CommandRetention = f.retention
	if f.authCache < 0 {
		return o, fmt.Errorf("--auth-cache-ttl %s must not be negative", f.authCache)
	}
	// Zero on the command line means no cache, which the server spells
	// as a negative TTL.
	o.AuthCacheTTL = f.authCache
	if o.AuthCacheTTL == 0 {
		o.AuthCacheTTL = -1
	}
	return o, nil
}

// optionFlags are a set of flags that fill in part of daemon.Options.
type optionFlags interface {
	options(o daemon.Options) (daemon.Options, error)
}

// runWith fills in o from each set of flags in turn and runs run with it.
func runWith(ctx context.Context, run func(context.Context, daemon.Options) error, o daemon.Options, flags ...optionFlags) error {
	for _, f := range flags {
		var err error
		if o, err = f.options(o); err != nil {
			return err
		}
	}
	return run(ctx, o)
}

func upCommand() *cobra.Command {
	var (
		flags                          serveFlags
		host                           hostFlags
		home                           string
		exposureListen, exposurePublic string
	)
	cmd := &cobra.Command{
		Use:   "up",
		Short: cli.ServerVerbShort("up"),
		Long: "Run the embedded deployment. On first start it creates the store under --home and an admin\n" +
			"token, printed once and kept in HOME/admin-token (mode 0600), where the CLI finds it.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runWith(cmd.Context(), daemon.Run, daemon.Options{Home: home, Host: true,
				ExposureListen: exposureListen, ExposurePublicURL: exposurePublic}, &flags, &host)
		},
	}
	cmd.Flags().StringVar(&home, "home", envOr("KIBOTOS_HOME", daemon.DefaultHome), "state directory (env KIBOTOS_HOME)")
	cmd.Flags().StringVar(&exposureListen, "exposure-listen", os.Getenv("KIBOTOS_EXPOSURE_LISTEN"),
		"address of the listener that serves exposures' path URLs, an origin apart from the API and the web console's (default: --listen's with the next port, 8871 beside 8870; unused with --exposure-domain; env KIBOTOS_EXPOSURE_LISTEN)")
	cmd.Flags().StringVar(&exposurePublic, "exposure-public-url", os.Getenv("KIBOTOS_EXPOSURE_PUBLIC_URL"),
		"the URL callers use to reach --exposure-listen, which exposures' path URLs are under (default: derived from --exposure-listen as --public-url is from --listen; env KIBOTOS_EXPOSURE_PUBLIC_URL)")
	host.register(cmd)
	flags.register(cmd)
	return cmd
}

func hostCommand() *cobra.Command {
	var (
		flags     commonFlags
		host      hostFlags
		home      string
		ctrlURL   string
		tokenFile string
		caFile    string
		name      string
		otlp      string
	)
	defaultName, _ := os.Hostname()
	cmd := &cobra.Command{
		Use:   "host",
		Short: cli.ServerVerbShort("host"),
		Long: "Run one host agent: it registers with the control plane at --ctrl as --name, authenticated by\n" +
			"the host token in --token-file (kibotos admin host-token create), runs the workspaces placed on it,\n" +
			"and serves their data plane and exposures on --listen at --public-url.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runWith(cmd.Context(), daemon.RunHost, daemon.Options{Home: home, CtrlURL: ctrlURL, TokenFile: tokenFile, CAFile: caFile,
				HostID: name, OTLPEndpoint: otlp}, &flags, &host)
		},
	}
	cmd.Flags().StringVar(&home, "home", envOr("KIBOTOS_HOME", daemon.DefaultHome), "state directory of this host (env KIBOTOS_HOME)")
	cmd.Flags().StringVar(&ctrlURL, "ctrl", os.Getenv("KIBOTOS_CTRL"), "URL of the control plane, such as https://ctrl.example.com (env KIBOTOS_CTRL)")
	cmd.Flags().StringVar(&otlp, "otlp-endpoint", os.Getenv("KIBOTOS_OTLP_ENDPOINT"),
		"export a trace span of every data-plane call over OTLP/HTTP to this collector, such as http://127.0.0.1:4318 (path /v1/traces unless the URL has one; default: off; env KIBOTOS_OTLP_ENDPOINT)")
	cmd.Flags().StringVar(&tokenFile, "token-file", os.Getenv("KIBOTOS_HOST_TOKEN_FILE"),
		"file holding the host token (kibotos admin host-token create; env KIBOTOS_HOST_TOKEN_FILE)")
	cmd.Flags().StringVar(&caFile, "ca-file", os.Getenv("KIBOTOS_CA_FILE"),
		"PEM certificate authorities trusted for an https --ctrl beside the system's (env KIBOTOS_CA_FILE)")
	cmd.Flags().StringVar(&name, "name", envOr("KIBOTOS_HOST_NAME", strings.ToLower(defaultName)),
		"the host's ID in the deployment: 1 to 63 of a-z, 0-9 and '-' (default: the machine's host name; env KIBOTOS_HOST_NAME)")
	host.register(cmd)
	flags.register(cmd)
	return cmd
}

// hostFlags are the flags of a host agent, embedded (`up`) or alone
// (`host`).
type hostFlags struct {
	guest      string
	runtime    string
	resolvers  string
	pools      []string
	volumeSize string
	tmpfsPct   int
	conns      int
	warmPool   int
	overcommit daemon.Overcommit
	layerSize  string
	probeEvery time.Duration
	memory     guestMemoryFlags
	domain     string
	origins    string
}

func (f *hostFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.guest, "guest-agent", "", "the kibotos-guest binary (default: next to this executable)")
	cmd.Flags().StringVar(&f.runtime, "runtime", "runc", "OCI runtime of workspaces: runc, crun or runsc")
	cmd.Flags().IntVar(&f.tmpfsPct, "guest-tmpfs-percent", oci.DefaultGuestTmpfsPercent,
		"size of a workspace's /tmp, of its /run and of its /dev/shm, each, in percent of its memory limit (1 to 100)")
	cmd.Flags().IntVar(&f.conns, "guest-connections", netslot.DefaultMaxFlows,
		"most TCP connections of one workspace its network slot carries at once; each holds up to 2 MiB of this process's memory (about 0.6 MiB measured) while one side does not read (1 to 65536)")
	cmd.Flags().IntVar(&f.warmPool, "warm-pool", agent.DefaultWarmPool,
		"workspaces the host keeps started ahead of time (slot, writable layer, guest agent) for the latest template and sizes it started fresh, handed out on create; 0 keeps none (0 to 256)")
	cmd.Flags().Float64Var(&f.overcommit.CPU, "cpu-overcommit", daemon.DefaultOvercommit.CPU,
		"how many times its cores the host offers as workspaces' CPU quotas: idle workspaces use none (1 to 64)")
	cmd.Flags().Float64Var(&f.overcommit.Memory, "memory-overcommit", daemon.DefaultOvercommit.Memory,
		"how many times its memory the host offers as workspaces' memory limits; above 1, for many idle workspaces: if they all use their memory at once the host reclaims and kills (1 to 64)")
	cmd.Flags().DurationVar(&f.probeEvery, "guest-probe-interval", agent.DefaultGuestProbeInterval,
		"how often the host probes the guest agent of each running workspace (each probe gives up after 1s)")
	f.memory.register(cmd)
	cmd.Flags().StringVar(&f.resolvers, "resolvers", os.Getenv("KIBOTOS_RESOLVERS"),
		"comma-separated IP[:port] deployment DNS resolvers workspaces use under PUBLIC_INTERNET (default: the nameservers of /etc/resolv.conf; env KIBOTOS_RESOLVERS)")
	cmd.Flags().StringArrayVar(&f.pools, "storage-pool", envList("KIBOTOS_STORAGE_POOLS"),
		"a storage pool for Volumes, NAME=DIR; repeatable (default: default=HOME/volumes; the pool named default, else the first, is the deployment's default; env KIBOTOS_STORAGE_POOLS, comma-separated)")
	cmd.Flags().StringVar(&f.volumeSize, "volume-size", os.Getenv("KIBOTOS_VOLUME_SIZE"),
		"capacity of a Volume created without one, such as 1GiB (default 1GiB; env KIBOTOS_VOLUME_SIZE)")
	cmd.Flags().StringVar(&f.layerSize, "max-layer-size", os.Getenv("KIBOTOS_MAX_LAYER_SIZE"),
		"most file content one template layer may unpack to, sparse files at full size, such as 16GiB; larger layers are refused (default 16GiB; env KIBOTOS_MAX_LAYER_SIZE)")
	cmd.Flags().StringVar(&f.domain, "exposure-domain", os.Getenv("KIBOTOS_EXPOSURE_DOMAIN"),
		"serve exposures by host name only, <port>-<workspace>.DOMAIN, at the scheme and port of --public-url; needs a wildcard DNS name (and certificate) for *.DOMAIN (default: by path, /x/<exposure>/ under --exposure-public-url for up, --public-url for host; env KIBOTOS_EXPOSURE_DOMAIN)")
	cmd.Flags().StringVar(&f.origins, "console-origins", os.Getenv("KIBOTOS_CONSOLE_ORIGINS"),
		"comma-separated origins (scheme://host[:port]) whose pages, the web console's, may call the data-plane gateway from a browser (CORS) (default: the control plane's public origin: --public-url for up, --ctrl for host; env KIBOTOS_CONSOLE_ORIGINS)")
}

// options checks the flags and sets them on o.
func (f *hostFlags) options(o daemon.Options) (daemon.Options, error) {
	if f.tmpfsPct < 1 || f.tmpfsPct > 100 {
		return o, fmt.Errorf("--guest-tmpfs-percent %d: want 1 to 100", f.tmpfsPct)
	}
	if f.conns < 1 || f.conns > 65536 {
		return o, fmt.Errorf("--guest-connections %d: want 1 to 65536", f.conns)
	}
	o.GuestConnections = f.conns
	if f.warmPool < 0 || f.warmPool > agent.MaxWarmPool {
		return o, fmt.Errorf("--warm-pool %d: want 0 to %d", f.warmPool, agent.MaxWarmPool)
	}
	o.WarmPool = f.warmPool
	if err := f.overcommit.Check(); err != nil {
		return o, err
	}
	o.Overcommit = f.overcommit
	if f.probeEvery < 100*time.Millisecond {
		return o, fmt.Errorf("--guest-probe-interval %s: want at least 100ms", f.probeEvery)
	}
	th, err := f.memory.thresholds()
	if err != nil {
		return o, err
	}
	o.GuestAgent, o.Runtime, o.GuestTmpfsPercent, o.GuestProbeInterval, o.GuestMemory = f.guest, f.runtime, f.tmpfsPct, f.probeEvery, th
	if o.DeploymentResolvers, err = daemon.ParseResolvers(f.resolvers); err != nil {
		return o, fmt.Errorf("--resolvers: %w", err)
	}
	o.StoragePools, o.ExposureDomain = f.pools, f.domain
	if o.ConsoleOrigins, err = daemon.ParseOrigins(f.origins); err != nil {
		return o, fmt.Errorf("--console-origins: %w", err)
	}
	if f.volumeSize != "" {
		if o.VolumeBytes, err = cli.ParseMiB("--volume-size", f.volumeSize); err != nil {
			return o, err
		}
	}
	if f.layerSize != "" {
		if o.MaxLayerBytes, err = cli.ParseMiB("--max-layer-size", f.layerSize); err != nil {
			return o, err
		}
	}
	return o, nil
}

// guestMemoryFlags are the flags of `kibotos up` that say when a guest's
// memory is saturated and when its largest process is killed.
type guestMemoryFlags struct {
	window    time.Duration
	percent   int
	killAfter time.Duration
}

func (f *guestMemoryFlags) register(cmd *cobra.Command) {
	d := psi.DefaultThresholds
	cmd.Flags().DurationVar(&f.window, "guest-memory-window", d.Window,
		"span over which the host measures how long every process of a workspace was stalled waiting for memory (PSI full stall of its cgroup)")
	cmd.Flags().IntVar(&f.percent, "guest-memory-stall-percent", int(d.SaturatedPermille/10),
		"share of --guest-memory-window, in percent (1 to 100), at or above which a workspace's memory is SATURATED")
	cmd.Flags().DurationVar(&f.killAfter, "guest-memory-kill-after", d.KillAfter,
		"how long a workspace stays SATURATED before the host kills its process with the largest resident set (never the guest agent)")
}

// thresholds checks the flags and returns them as thresholds.
func (f *guestMemoryFlags) thresholds() (psi.Thresholds, error) {
	switch {
	case f.window < 100*time.Millisecond:
		return psi.Thresholds{}, fmt.Errorf("--guest-memory-window %s: want at least 100ms", f.window)
	case f.percent < 1 || f.percent > 100:
		return psi.Thresholds{}, fmt.Errorf("--guest-memory-stall-percent %d: want 1 to 100", f.percent)
	case f.killAfter <= 0:
		return psi.Thresholds{}, fmt.Errorf("--guest-memory-kill-after %s: want more than 0", f.killAfter)
	}
	return psi.Thresholds{Window: f.window, SaturatedPermille: uint32(f.percent) * 10, KillAfter: f.killAfter}, nil
}

// envList is a comma-separated environment variable as a list; nil when
// unset.
func envList(key string) []string {
	if v := os.Getenv(key); v != "" {
		return strings.Split(v, ",")
	}
	return nil
}

func ctrlCommand() *cobra.Command {
	var (
		flags    serveFlags
		storeURL string
		home     string
	)
	cmd := &cobra.Command{
		Use:   "ctrl",
		Short: cli.ServerVerbShort("ctrl"),
		Long: "Run the control plane without a host agent: hosts attach with kibotos host. With --store postgres://...\n" +
			"any number of replicas share the database; without it the SQLite database under --home serves one.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if storeURL == "" && home == "" {
				return fmt.Errorf("--store postgres://... (env KIBOTOS_STORE) or --home DIR (SQLite) is required")
			}
			return runWith(cmd.Context(), daemon.Run, daemon.Options{StoreURL: storeURL, Home: home}, &flags)
		},
	}
	cmd.Flags().StringVar(&storeURL, "store", os.Getenv("KIBOTOS_STORE"), "store URL, postgres://... (env KIBOTOS_STORE)")
	cmd.Flags().StringVar(&home, "home", "", "state directory: the SQLite database without --store, and HOME/admin-token, the bootstrap admin token")
	flags.register(cmd)
	return cmd
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
