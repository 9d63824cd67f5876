// Package buildinfo says which build of Kibotos is running: the version
// and commit set at link time (make build passes them with -ldflags -X),
// else what the Go toolchain recorded in the binary.
package buildinfo

import (
	"runtime"
	"runtime/debug"
	"sync"
)

// Set at link time:
//
//	-ldflags "-X github.com/kibotos/kibotos/internal/buildinfo.version=v1.2.3
//	          -X github.com/kibotos/kibotos/internal/buildinfo.commit=abc123"
var (
	version string
	commit  string
)

// Info describes the running build.
type Info struct {
	// Version is the release (v1.2.3), the module version `go install`
	// recorded, or "devel".
	Version string `json:"version"`
	// Commit is the VCS revision the binary was built from, or "unknown";
	// "-dirty" is appended when the tree had changes.
	Commit string `json:"commit"`
	// GoVersion is the toolchain that built the binary.
	GoVersion string `json:"goVersion"` // lowerCamelCase, as every -o json of the CLI
}

var (
	once sync.Once
	info Info
)

// Get returns the running build's Info.
func Get() Info {
	once.Do(func() { info = read() })
	return info
}

// Version is Get().Version.
func Version() string { return Get().Version }

func read() Info {
	out := Info{Version: version, Commit: commit, GoVersion: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if ok {
		if out.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			out.Version = bi.Main.Version
		}
		if out.Commit == "" {
			var rev, dirty string
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					rev = s.Value
				case "vcs.modified":
					if s.Value == "true" {
						dirty = "-dirty"
					}
				}
			}
			if rev != "" {
				out.Commit = rev + dirty
			}
		}
	}
	if out.Version == "" {
		out.Version = "devel"
	}
	if out.Commit == "" {
		out.Commit = "unknown"
	}
	return out
}
