package agent

import (
	"log/slog"

	"github.com/kibotos/kibotos/internal/host/hostpaths"
)

// publicMessage is err's message as a failure the API shows its tenant:
// the host's paths in it replaced by what they are (its layer directory,
// template store, storage pools, network namespaces, cgroups, loop
// devices). The host's
// log has err whole.
func (a *Agent) publicMessage(err error) string {
	names := map[string]string{a.cfg.LayerDir: "<layers>", a.cfg.Network.Dir: "<network namespaces>"}
	if a.cfg.Template != nil {
		names[a.cfg.Template.Dir()] = "<template store>"
	}
	for _, p := range a.vols.pools {
		names[p.Dir] = "<storage pool " + p.Name + ">"
	}
	msg := hostpaths.Replace(err.Error(), names)
	if msg != err.Error() {
		slog.Warn("host agent: a failure with host paths", "err", err)
	}
	return msg
}
