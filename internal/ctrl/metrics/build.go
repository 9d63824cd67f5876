package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kibotos/kibotos/internal/buildinfo"
)

// RegisterBuildInfo puts kibotos_build_info on reg: always 1, labelled with
// the running build's version, commit and Go version.
func RegisterBuildInfo(reg prometheus.Registerer) error {
	b := buildinfo.Get()
	return reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "kibotos_build_info",
		Help:        "The running build of Kibotos: always 1, with its version, commit and Go version as labels.",
		ConstLabels: prometheus.Labels{"version": b.Version, "commit": b.Commit, "go_version": b.GoVersion},
	}, func() float64 { return 1 }))
}
