package agent

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/enumlabel"
	"github.com/kibotos/kibotos/internal/host/netslot"
)

// counters are what the host counts as it works; a scrape reads them.
type counters struct {
	// slots is shared by every network slot of the host.
	slots netslot.Counters
	// deliveredBytes are the bytes of template layers unpacked for starts.
	deliveredBytes atomic.Uint64
}

// The host's metrics; the registerer the agent is given adds the host label.
var (
	deliveredBytesDesc = prometheus.NewDesc("kibotos_host_template_delivery_bytes_total",
		"Bytes of template layer blobs the host unpacked to start executions (what the delivery progress of starting workspaces counts).", nil, nil)
	slotConnectionsDesc = prometheus.NewDesc("kibotos_host_slot_connections_total",
		"Guest TCP connections the network slots carried, by path: direct, egress (through an Egress), dns (to the link DNS address).", []string{"path"}, nil)
	slotDNSQueriesDesc = prometheus.NewDesc("kibotos_host_slot_dns_queries_total",
		"Guest queries to the link DNS address, by how each was answered: cache (the slot's cache), upstream (through the Resolver or deployment resolver, SERVFAIL when it failed), slot (by the slot alone: REFUSED under DENY_ALL, SERVFAIL without a resolver, FORMERR), dropped (none: too many of the slot's, or the host's, were waiting for their upstream).", []string{"answer"}, nil)
	slotRefusalsDesc = prometheus.NewDesc("kibotos_host_slot_refusals_total",
		"Guest TCP connections the network slots reset, by cause: policy (the network policy refused it), unreachable (the outbound connection failed), limit (the slot carried its most connections at once; one to the link DNS address is closed at once).", []string{"cause"}, nil)
	egressFaultsDesc = prometheus.NewDesc("kibotos_host_egress_faults_total",
		"Uses of Egresses that failed by the Egress's fault, by kind (as in EgressObservation).", []string{"kind"}, nil)
	resolverFaultsDesc = prometheus.NewDesc("kibotos_host_resolver_faults_total",
		"Queries to policy Resolvers that failed, by kind (as in ResolverObservation).", []string{"kind"}, nil)
	warmPoolReadyDesc = prometheus.NewDesc("kibotos_host_warm_pool_ready",
		"Workspaces the host's warm pool holds started, their guest agents answering, ready to be handed out.", nil, nil)
)

// collector serves the host's counters and its warm pool's size to a
// scrape.
type collector struct {
	c    *counters
	pool *warmPool
}

// Describe implements prometheus.Collector.
func (collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{deliveredBytesDesc, slotConnectionsDesc, slotDNSQueriesDesc, slotRefusalsDesc, egressFaultsDesc, resolverFaultsDesc, warmPoolReadyDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (col collector) Collect(ch chan<- prometheus.Metric) {
	c := col.c
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	counter(deliveredBytesDesc, c.deliveredBytes.Load())
	ch <- prometheus.MustNewConstMetric(warmPoolReadyDesc, prometheus.GaugeValue, float64(col.pool.readyCount()))
	counter(slotConnectionsDesc, c.slots.Direct.Load(), "direct")
	counter(slotConnectionsDesc, c.slots.Egress.Load(), "egress")
	counter(slotConnectionsDesc, c.slots.DNS.Load(), "dns")
	counter(slotDNSQueriesDesc, c.slots.DNSCached.Load(), "cache")
	counter(slotDNSQueriesDesc, c.slots.DNSForwarded.Load(), "upstream")
	counter(slotDNSQueriesDesc, c.slots.DNSLocal.Load(), "slot")
	counter(slotDNSQueriesDesc, c.slots.DNSDropped.Load(), "dropped")
	counter(slotRefusalsDesc, c.slots.Refused.Load(), "policy")
	counter(slotRefusalsDesc, c.slots.Unreachable.Load(), "unreachable")
	counter(slotRefusalsDesc, c.slots.Limited.Load(), "limit")
	egress := ctrlv1.EgressObservationKind(0).Descriptor()
	for _, n := range enumlabel.Known(egress) {
		counter(egressFaultsDesc, c.slots.EgressFaults.Load(ctrlv1.EgressObservationKind(n)), enumlabel.Name(egress, n))
	}
	resolver := ctrlv1.ResolverObservationKind(0).Descriptor()
	for _, n := range enumlabel.Known(resolver) {
		counter(resolverFaultsDesc, c.slots.ResolverFaults.Load(ctrlv1.ResolverObservationKind(n)), enumlabel.Name(resolver, n))
	}
}

// registerMetrics puts the host's counters on reg, each labeled with the
// host's ID.
func (a *Agent) registerMetrics(reg prometheus.Registerer) error {
	return prometheus.WrapRegistererWith(prometheus.Labels{"host": a.cfg.HostID}, reg).Register(collector{c: &a.counters, pool: a.pool})
}
