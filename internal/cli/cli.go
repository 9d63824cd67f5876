// Package cli is the client half of the kibotos command: the verbs that call
// a running control plane (ws, template, egress, resolver, volume, project,
// token, admin) over the Connect protocol, and the data-plane verbs of ws
// (exec, cp, ps, logs, top), which go through the sdk package. Root makes
// the kibotos root of Commands, version and a main's own verbs: the server
// verbs in cmd/kibotos-server, their stand-ins in cmd/kibotos.
//
// Every verb returns its error from RunE without a prefix; the root prints it
// after "kibotos: ", so a call that fails reads "kibotos: <code>: <message>".
// `ws exec` returns an *ExitError, which the root turns into the exit code
// of the remote command without printing anything.
package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	"github.com/kibotos/kibotos/gen/kibotos/data/v1/datav1connect"
	"github.com/kibotos/kibotos/internal/cafile"
	"github.com/kibotos/kibotos/sdk"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// Defaults of the connection flags, and the environment variables that
// override them.
const (
	defaultAddr = "http://127.0.0.1:8870"
	defaultHome = "/var/lib/kibotos"

	envAddr   = "KIBOTOS_ADDR"
	envToken  = "KIBOTOS_TOKEN"
	envHome   = "KIBOTOS_HOME"
	envCAFile = "KIBOTOS_CA_FILE"

	// adminTokenFile is the file under the home directory where `kibotos up`
	// writes the bootstrap admin token.
	adminTokenFile = "admin-token"
)

// callTimeout bounds each call, not a whole command: `list --all` gives
// every page its own 30 seconds. Tests shorten it.
var callTimeout = 30 * time.Second

// Commands returns the top-level client commands.
func Commands() []*cobra.Command {
	cmds := []*cobra.Command{
		wsCommand(),
		templateCommand(),
		egressCommand(),
		resolverCommand(),
		volumeCommand(),
		exposureCommand(),
		transferCommand(),
		projectCommand(),
		tokenCommand(),
		adminCommand(),
		contextCommand(),
	}
	for _, cmd := range cmds {
		rejectUnknownSubcommands(cmd)
		hintUnreachable(cmd)
		addCompletion(cmd)
	}
	return cmds
}

// hintUnreachable makes every command under cmd that fails because
// nothing listens at the server's address say so, and how to start one.
func hintUnreachable(cmd *cobra.Command) {
	for _, sub := range cmd.Commands() {
		hintUnreachable(sub)
	}
	run := cmd.RunE
	if run == nil {
		return
	}
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		err := run(cmd, args)
		if err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
			return err
		}
		addr := defaultAddr
		if cmd.Flags().Lookup("addr") != nil {
			c := connOf(cmd)
			named, _ := c.chooseContext(cmd)
			addr = named.setting(cmd, "addr", c.addr, envAddr, named.addr())
		}
		if base, berr := baseURL(addr); berr == nil {
			addr = base
		}
		if refused := refusedAddr(err); refused != "" && !sameEndpoint(addr, refused) {
			// A data-plane call: the server named the workspace's host.
			return fmt.Errorf("cannot reach %s, the host that runs the workspace (the server at %s named it): is its host agent running?: %w", refused, addr, err)
		}
		return fmt.Errorf("cannot reach the Kibotos server at %s: is it running? (make up / kibotos up): %w", addr, err)
	}
}

// refusedAddr returns the address whose connection err says was refused;
// empty when it names none.
func refusedAddr(err error) string {
	var op *net.OpError
	if errors.As(err, &op) && op.Addr != nil {
		return op.Addr.String()
	}
	return ""
}

// sameEndpoint reports whether hostPort may be where the server URL base
// listens: its port, and its host unless base names one by a DNS name.
func sameEndpoint(base, hostPort string) bool {
	u, err := url.Parse(base)
	host, port, serr := net.SplitHostPort(hostPort)
	if err != nil || serr != nil {
		return true
	}
	want := u.Port()
	if want == "" {
		want = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	if port != want {
		return false
	}
	ip, perr := netip.ParseAddr(u.Hostname())
	got, gerr := netip.ParseAddr(host)
	return perr != nil || gerr != nil || ip.Unmap() == got.Unmap()
}

// rejectUnknownSubcommands makes every group under cmd (a command that only
// holds subcommands) fail on an argument that names none of them, as the
// root does: cobra would otherwise print the group's help and succeed. A
// group given no argument still prints its help.
func rejectUnknownSubcommands(cmd *cobra.Command) {
	for _, sub := range cmd.Commands() {
		rejectUnknownSubcommands(sub)
	}
	if cmd.Runnable() || !cmd.HasSubCommands() {
		return
	}
	cmd.Args = cobra.ArbitraryArgs
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return cmd.Help()
		}
		msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
		if suggestions := cmd.SuggestionsFor(args[0]); len(suggestions) > 0 {
			msg += "; did you mean " + strings.Join(suggestions, " or ") + "?"
		}
		return errors.New(msg)
	}
}

// conn holds the connection flags every client command takes. Flags win over
// the environment, the environment over the defaults; both are read when the
// command runs, not when it is built.
type conn struct {
	addr    string
	token   string
	home    string
	caFile  string
	context string // a context's name (context.go)
	output  string
}

const (
	outputTable = "table"
	outputWide  = "wide" // the table with more columns, where it has them
	outputJSON  = "json"
	outputYAML  = "yaml"
)

// addConnFlags registers the connection flags on cmd as persistent flags, so
// that every verb under it accepts them.
func addConnFlags(cmd *cobra.Command) *conn {
	c := new(conn)
	f := cmd.PersistentFlags()
	f.StringVar(&c.addr, "addr", defaultAddr, "control plane address, URL or host:port (env "+envAddr+")")
	f.StringVar(&c.token, "token", "", "API token (env "+envToken+"; default: the first line of HOME/admin-token)")
	f.StringVar(&c.home, "home", defaultHome, "directory holding admin-token (env "+envHome+")")
	f.StringVar(&c.caFile, "ca-file", "", "PEM certificate authorities trusted for https:// beside the system's, such as a private CA (env "+envCAFile+")")
	f.StringVarP(&c.output, "output", "o", outputTable, "output format: table, wide, json or yaml")
	f.StringVar(&c.context, "context", "", "the context (kibotos context list) naming the server, token and CA file; their flags win over it (env "+envContext+")")
	cmd.RegisterFlagCompletionFunc("context", completeContexts)
	return c
}

// settings are the resolved connection flags.
type settings struct {
	baseURL string
	token   string
	// tls trusts --ca-file; nil trusts the system's roots.
	tls *tls.Config
}

// resolve applies the environment to the flags the user did not give and
// checks them.
func (c *conn) resolve(cmd *cobra.Command) (settings, error) {
	if !slices.Contains([]string{outputTable, outputWide, outputJSON, outputYAML}, c.output) {
		return settings{}, fmt.Errorf("--output %q: want table, wide, json or yaml", c.output)
	}
	named, err := c.chooseContext(cmd)
	if err != nil {
		return settings{}, err
	}
	base, err := baseURL(named.setting(cmd, "addr", c.addr, envAddr, named.addr()))
	if err != nil {
		return settings{}, err
	}
	token, err := c.findToken(cmd, named)
	if err != nil {
		return settings{}, err
	}
	var tlsConfig *tls.Config
	if caFile := named.setting(cmd, "ca-file", c.caFile, envCAFile, named.caFile()); caFile != "" {
		if tlsConfig, err = cafile.Load(caFile); err != nil {
			return settings{}, fmt.Errorf("--ca-file: %w", err)
		}
	}
	return settings{baseURL: base, token: token, tls: tlsConfig}, nil
}

// http1 is the transport of dial: HTTP/1 (HTTP/2 by ALPN over TLS),
// trusting cfg.
func http1(cfg *tls.Config) http.RoundTripper {
	if cfg == nil {
		return http.DefaultTransport
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = cfg
	return t
}

// flagOrEnv returns the flag's value when the user gave it, else the
// environment variable when set, else the flag's default.
func flagOrEnv(cmd *cobra.Command, flag, value, env string) string {
	if cmd.Flags().Changed(flag) {
		return value
	}
	if v := os.Getenv(env); v != "" {
		return v
	}
	return value
}

// baseURL turns --addr into the base URL of the API: a bare host:port is
// served over plain HTTP.
func baseURL(addr string) (string, error) {
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	u, err := url.Parse(addr)
	if err != nil {
		return "", fmt.Errorf("--addr: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("--addr %q: want host:port or an http:// or https:// URL", addr)
	}
	return strings.TrimRight(addr, "/"), nil
}

// findToken returns --token, else the token of the named context or KIBOTOS_TOKEN (in
// the order setting gives), else the first line of HOME/admin-token.
func (c *conn) findToken(cmd *cobra.Command, named chosenContext) (string, error) {
	if cmd.Flags().Changed("token") {
		if t := strings.TrimSpace(c.token); t != "" {
			return t, nil
		}
		return "", errors.New("--token is empty")
	}
	if t := strings.TrimSpace(named.setting(cmd, "token", "", envToken, named.token())); t != "" {
		return t, nil
	}
	path := filepath.Join(flagOrEnv(cmd, "home", c.home, envHome), adminTokenFile)
	data, err := os.ReadFile(path)
	if err == nil {
		first, _, _ := strings.Cut(string(data), "\n")
		if t := strings.TrimSpace(first); t != "" {
			return t, nil
		}
		err = errors.New("first line is empty")
	}
	why := err.Error()
	if errors.Is(err, fs.ErrNotExist) {
		why = "no such file"
	}
	return "", fmt.Errorf("no API token: pass --token, set %s, or point --home (env %s) at a directory whose %s is readable (%s: %s)",
		envToken, envHome, adminTokenFile, path, why)
}

// dial resolves the connection flags and builds a client with newClient,
// which is a generated constructor such as
// ctrlv1connect.NewEgressServiceClient. Its HTTP client is the SDK's over
// HTTP/1, so a stream such as WatchWorkspace cut by a restart of the
// server ends with unavailable.
func dial[C any](cmd *cobra.Command, c *conn, newClient func(connect.HTTPClient, string, ...connect.ClientOption) C) (C, error) {
	s, err := c.resolve(cmd)
	if err != nil {
		var zero C
		return zero, err
	}
	hc := sdk.NewHTTPClient(http1(s.tls))
	return newClient(hc, s.baseURL, connect.WithInterceptors(bearer.Token(s.token), timeout(callTimeout))), nil
}

// dialStreaming is dial for client-streaming calls, which upload a request
// body while the server reads it and need HTTP/2: it uses the SDK's default
// HTTP client, which speaks HTTP/2 over cleartext with prior knowledge (h2c)
// to http:// and negotiates HTTP/2 with ALPN to https://. Unary calls of the client keep
// callTimeout; streams run until the command's context ends. closeIdle
// releases the dedicated connections.
func dialStreaming[C any](cmd *cobra.Command, c *conn, newClient func(connect.HTTPClient, string, ...connect.ClientOption) C) (cl C, closeIdle func(), err error) {
	s, err := c.resolve(cmd)
	if err != nil {
		return cl, nil, err
	}
	hc := sdk.NewHTTPClient(sdk.NewTransport(s.tls))
	return newClient(hc, s.baseURL, connect.WithInterceptors(bearer.Token(s.token), timeout(callTimeout))), hc.CloseIdleConnections, nil
}

// openWorkspace resolves the connection flags and returns a handle on the
// Workspace id, whose data-plane calls the SDK makes with the session the
// session cache holds for it (sessioncache.go), else with one it issues.
// Unary calls keep callTimeout; streams run until the command's context
// ends. closeIdle keeps the handle's session in the cache, unless it is
// the one the cache gave, and releases the connections.
func openWorkspace(cmd *cobra.Command, c *conn, id string) (ws *sdk.Workspace, closeIdle func(), err error) {
	s, err := c.resolve(cmd)
	if err != nil {
		return nil, nil, err
	}
	cl := sdk.New(s.baseURL, s.token, sdk.WithTLSConfig(s.tls), sdk.WithClientOptions(connect.WithInterceptors(timeout(callTimeout))))
	cache := openSessionCache()
	cached := cache.load(s.baseURL, s.token, id)
	if cached != nil {
		ws = cl.WorkspaceWithSession(id, cached)
	} else if ws, err = cl.Workspace(cmd.Context(), id); err != nil {
		cl.Close()
		return nil, nil, err
	}
	return ws, func() {
		// The handle holds the session it was given until the data plane
		// refuses it: then the file changes, else it stays as it is.
		if current := ws.CurrentSession(); cached == nil || current != cached {
			cache.store(s.baseURL, s.token, id, current)
		}
		cl.Close()
	}, nil
}

// timeout bounds every unary call; the Connect protocol also tells the
// server. Streams are bounded by their command (ws --wait has --timeout).
func timeout(d time.Duration) connect.UnaryInterceptorFunc {
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if req.Spec().Procedure == datav1connect.ProcessServiceSendInputProcedure {
				// It waits, as a pipe does, until the command reads: as
				// long as the command takes to get there.
				return next(ctx, req)
			}
			ctx, cancel := context.WithTimeout(ctx, d)
			defer cancel()
			return next(ctx, req)
		}
	}
}

// dialCall dials the server with a new client and runs one unary method of
// it, named by its method expression (adminv1connect.AdminServiceClient.ListTokens).
func dialCall[C, Req, Resp any](cmd *cobra.Command, c *conn, newClient func(connect.HTTPClient, string, ...connect.ClientOption) C,
	method func(C, context.Context, *connect.Request[Req]) (*connect.Response[Resp], error), req *Req) (*Resp, error) {
	cl, err := dial(cmd, c, newClient)
	if err != nil {
		return nil, err
	}
	return call(cmd.Context(), func(ctx context.Context, r *connect.Request[Req]) (*connect.Response[Resp], error) {
		return method(cl, ctx, r)
	}, req)
}

// call runs one unary method of a generated client and unwraps the Connect
// envelope. Its errors are *connect.Error, whose text is "<code>: <message>".
func call[Req, Resp any](ctx context.Context, method func(context.Context, *connect.Request[Req]) (*connect.Response[Resp], error), req *Req) (*Resp, error) {
	resp, err := method(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// carrying runs one unary method like call and returns its response, which
// -o json prints, with the resource that get picks out of it, which a table
// prints.
func carrying[Req, Resp any, PResp interface {
	*Resp
	proto.Message
}, R any](ctx context.Context, method func(context.Context, *connect.Request[Req]) (*connect.Response[Resp], error), req *Req, get func(PResp) R) (proto.Message, R, error) {
	resp, err := call(ctx, method, req)
	if err != nil {
		var none R
		return nil, none, err
	}
	return PResp(resp), get(PResp(resp)), nil
}

// listed runs one List method and returns the page's items and the token of
// the next page.
func listed[Req, Resp any, PResp interface {
	*Resp
	GetNextPageToken() string
}, R any](ctx context.Context, method func(context.Context, *connect.Request[Req]) (*connect.Response[Resp], error), req *Req, items func(PResp) []R) ([]R, string, error) {
	resp, err := call(ctx, method, req)
	if err != nil {
		return nil, "", err
	}
	return items(PResp(resp)), PResp(resp).GetNextPageToken(), nil
}
