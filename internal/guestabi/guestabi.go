// Package guestabi is what a guest agent and the host running it agree on,
// whatever the runtime: where the agent binary and its sockets live inside
// the guest, the probe protocol spoken on its probe socket (probe.go), and
// which guest paths the platform mounts itself. It is a
// leaf: the control plane, the host and the guest all import it.
package guestabi

import (
	"fmt"
	"net/http"
	"path"
	"strings"
	"time"
)

// Guest paths every execution has.
const (
	// AgentPath is where the guest agent binary is mounted.
	AgentPath = "/.kibotos/guest"
	// SocketDir is the guest agent's socket directory, which the host
	// bind-mounts from a directory of its own.
	SocketDir = "/run/kibotos"
	// ProbeSocket is the name, in SocketDir, of the socket the agent
	// answers the host's probes and stop requests on.
	ProbeSocket = "agent.sock"
	// DataSocket is the name, in SocketDir, of the socket serving
	// kibotos.data.v1 (Connect over cleartext HTTP/2).
	DataSocket = "data.sock"
)

// The file bytes path: a file's bytes over plain HTTP on the data plane,
// beside FileService's messages (the gateway serves it under the same
// prefix as kibotos.data.v1). GET reads the file named by the query's
// "path" (and "user") into the response body; PUT replaces it with the
// request body, with "mode" (octal) for a new file. Without a message
// framing to copy every byte through, it is the bulk path.
const (
	FileBytesPath = "/kibotos.data.v1.files"
	// FileInfoHeader carries a GET's FileInfo, base64 of its protobuf
	// encoding.
	FileInfoHeader = "Kibotos-File-Info"
)

// DataSocketHTTP2 is the HTTP/2 configuration of both ends of the data
// socket. Frames of up to 1 MiB carry a file chunk (1 MiB) in one frame
// instead of 64 of 16 KiB, each a write on one end and a read on the other;
// the windows keep several chunks in flight on a stream and a connection.
//
// The guest agent allows MaxConcurrentStreams, enough for the streams
// (processes followed, watches, port forwards) a workspace keeps open on
// the host's one connection, and each end drops a connection on which it
// could write nothing for WriteByteTimeout (a peer that stopped reading).
// The host bounds its connections to a guest itself (agent's
// dialGuestH2), since a guest may allow fewer streams.
func DataSocketHTTP2() *http.HTTP2Config {
	return &http.HTTP2Config{
		MaxReadFrameSize:              1 << 20,
		MaxReceiveBufferPerStream:     8 << 20,
		MaxReceiveBufferPerConnection: 16 << 20,
		MaxConcurrentStreams:          1024,
		WriteByteTimeout:              30 * time.Second,
	}
}

// reservedPaths are the guest paths the platform mounts itself: /tmp and
// /run (which holds SocketDir) are the tmpfs of the NONE retention tier,
// so a Volume below them would make part of that tier PROMISED.
var reservedPaths = []string{"/proc", "/sys", "/dev", "/tmp", "/run", AgentPath, "/etc/resolv.conf", "/etc/hostname", "/etc/hosts"}

// The limits of a path Linux takes: PATH_MAX with its NUL, NAME_MAX.
const (
	maxPathBytes = 4095
	maxNameBytes = 255
)

// CheckVolumePath checks a guest path a volume can be mounted at: clean,
// absolute, not the root, a path Linux takes (no NUL byte, at most 4,095
// bytes, names of at most 255), and neither at, below nor above a path the
// platform mounts itself (so not /etc either, which holds three of them). ctrl applies it when
// a binding names the path and the runtime again before it mounts.
func CheckVolumePath(p string) error {
	if !path.IsAbs(p) || path.Clean(p) != p || p == "/" {
		return fmt.Errorf("volume path %q must be a clean, absolute path other than /", p)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return fmt.Errorf("volume path %q contains a NUL byte", p)
	}
	if len(p) > maxPathBytes {
		return fmt.Errorf("volume path of %d bytes is longer than a path may be (%d)", len(p), maxPathBytes)
	}
	for name := range strings.SplitSeq(p[1:], "/") {
		if len(name) > maxNameBytes {
			return fmt.Errorf("volume path %.40q...: a name of %d bytes is longer than a name may be (%d)", p, len(name), maxNameBytes)
		}
	}
	for _, r := range reservedPaths {
		if p == r || strings.HasPrefix(p, r+"/") || strings.HasPrefix(r, p+"/") {
			return fmt.Errorf("volume path %q overlaps %s, which the platform mounts", p, r)
		}
	}
	return nil
}

// The capabilities a host offers beyond the display's.
const (
	// CapabilityGvisor: the host runs executions in gVisor sandboxes (its
	// runtime is runsc, and runsc works there).
	CapabilityGvisor = "runtime.gvisor"
	// CapabilityStoragePool: the host keeps Volumes of a storage pool.
	CapabilityStoragePool = "volume.storage_pool"
)
