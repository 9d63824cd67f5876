package agent

import (
	"log/slog"

	"github.com/kibotos/kibotos/internal/host/hostpaths"
)

// publicMessage is err's message as a failure the API shows its tenant:
// the host's paths in it replaced by what they are (its layer directory,
// storage pools, network namespaces, cgroups, loop devices). The host's
// log has err whole.
func (a *Agent) publicMessage(err error) string {
	names := map[string]string{a.cfg.LayerDir: "<layers>", a.cfg.Network.Dir: "<network namespaces>"}
	for _, p := range a.vols.pools {
		names[p.Dir] = "<storage pool " + p.Name + ">"
	}
	msg := hostpaths.Replace(err.Error(), names)
	if msg != err.Error() {
		slog.Warn("host agent: a failure with host paths", "err", err)
	}
	return msg
}
